"""Pictures of plans: the predicted memory timeline and the memory/time Pareto frontier.

Both draw with matplotlib's object API (`matplotlib.figure.Figure`, no `pyplot`), so they
neither need a display nor change the user's backend.  matplotlib is an optional
dependency (`pip install autoremat[plot]`) imported only when a picture is drawn.

The timeline is the chain model's stage-by-stage memory (docs/FACTS.md section 3,
`solver._chain.evaluate`): while region `m` runs forward, live memory is
`base + stored(regions 0..m)`; while region `k` runs backward it is
`base + stored(regions before k) + backward_bytes(k)`.  The highest step of the curve is the
predicted peak.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from autoremat._errors import AutorematError

__all__ = ["ParetoPoint", "chain_problem", "timeline_steps", "memory_timeline", "pareto_plot"]

_MIB = 2**20


@dataclass(frozen=True)
class ParetoPoint:
    """One point of a memory/time frontier.

    Attributes:
      label: what the point is (a budget such as `"0.6"`, or a baseline such as `"none"`).
      peak_bytes: peak device memory (compiled when validated, else predicted).
      y: what the plot's y axis shows (`Y_AXES`): seconds of measured step time, FLOPs
        recomputed in the compiled step, or seconds of estimated extra step time.
    """

    label: str
    peak_bytes: int
    y: float


# The frontier's y axes: label, and the factor from the point's `y` to the plotted unit.
Y_AXES = {
    "measured": ("measured step time (ms, median)", 1e3),
    "flops": ("recomputed GFLOP per step (counted in the compiled step)", 1e-9),
    "estimated": ("estimated extra step time (ms, autoremat's cost model)", 1e3),
}


def _figure(**kw):
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - exercised only without matplotlib
        raise AutorematError(
            "autoremat's plots need matplotlib, which is not installed: pip install autoremat[plot]") from e
    return Figure(**kw)


def _save(fig, path) -> str:
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        raise AutorematError(f"cannot write {path!r}: folder {folder!r} does not exist")
    fig.savefig(path, dpi=120)
    return path


def timeline_steps(problem, segments) -> tuple[list[float], list[int]]:
    """The stage-by-stage memory of a plan as a step curve over block positions.

    The x axis runs over the forward pass in block positions `0..n` and then over the
    backward pass from `n` to `2n` (block `j`'s backward sits at `2n - j`).  Returns the
    step edges `xs` (length `len(ys) + 1`) and the live bytes `ys` on each step;
    `max(ys)` equals `evaluate(problem, segments)[0]`.

    >>> from autoremat.solver._chain import ChainProblem, Option, Segment
    >>> a = Option("save", stored_bytes=100, backward_bytes=50, extra_time=0.0)
    >>> p = ChainProblem(2, base_bytes=10, options={(0, 1): (a,), (1, 2): (a,)})
    >>> timeline_steps(p, [Segment(0, 1, a), Segment(1, 2, a)])
    ([0, 1, 2, 3, 4], [110, 210, 160, 60])
    """
    from autoremat.solver._chain import evaluate

    segments = tuple(segments)
    evaluate(problem, segments)  # validates the partition
    n, base = problem.n_blocks, problem.base_bytes
    xs: list[float] = [0]
    ys: list[int] = []
    prefix = [0]
    for seg in segments:
        prefix.append(prefix[-1] + seg.option.stored_bytes)
        xs.append(seg.stop)
        ys.append(base + prefix[-1])
    for k in range(len(segments) - 1, -1, -1):
        seg = segments[k]
        xs.append(2 * n - seg.start)
        ys.append(base + prefix[k] + seg.option.backward_bytes)
    return xs, ys


def chain_problem(model):
    """The problem a model's plans are evaluated on: all options before dominance pruning
    (`raw_problem`, which compile-verified fallback plans draw from) when the model has them.
    A `ChainProblem` is returned as is."""
    if getattr(model, "raw_options", None):
        return model.raw_problem
    return getattr(model, "problem", model)


def _no_remat_segments(problem):
    from autoremat.solver._chain import Segment

    segs = []
    for i in range(problem.n_blocks):
        opts = problem.options.get((i, i + 1), ())
        none = [o for o in opts if o.name == "none"]
        if not none:
            return None
        segs.append(Segment(i, i + 1, none[0]))
    return tuple(segs)


def memory_timeline(model, segments, *, budget: int | None = None, baseline_segments=None, path,
                    title: str | None = None, compiled_peak: int | None = None) -> str:
    """Draws the predicted memory over forward and backward, the plan against no remat.

    Args:
      model: a `ChainModel` (its options before pruning, if it has them), or a `ChainProblem`.
      segments: the plan's segments (regions with their options); None for a plan the chain
        model cannot express (a JAX policy per layer): only its compiled peak is drawn.
      budget: bytes; drawn as a horizontal line.
      compiled_peak: the plan's compiled peak (bytes), drawn as a horizontal line.
      baseline_segments: the curve to compare with (default: no remat, every block `none`).
      path: the PNG (or any format matplotlib writes) to create.
      title: the figure's title.

    Returns:
      `path`.
    """
    from autoremat.solver._chain import evaluate

    problem = chain_problem(model)
    if baseline_segments is None:
        baseline_segments = _no_remat_segments(problem)
    n = problem.n_blocks
    fig = _figure(figsize=(9, 4.8))
    ax = fig.add_subplot()
    curves = []
    if baseline_segments is not None:
        curves.append(("no remat", baseline_segments, "tab:gray", "--"))
    if segments is not None:
        curves.append(("plan", segments, "tab:blue", "-"))
    for label, segs, color, style in curves:
        xs, ys = timeline_steps(problem, segs)
        peak, extra = evaluate(problem, segs)
        ax.stairs([y / _MIB for y in ys], xs, baseline=None, color=color, linestyle=style, linewidth=1.8,
                  label=f"{label}: peak {peak / _MIB:.1f} MiB, +{extra * 1e3:.3g} ms")
    if budget is not None:
        ax.axhline(budget / _MIB, color="tab:red", linewidth=1.2, label=f"budget {budget / _MIB:.1f} MiB")
    if compiled_peak is not None:
        ax.axhline(compiled_peak / _MIB, color="tab:blue", linewidth=1.0, linestyle=":",
                   label=f"plan, compiled by XLA: peak {compiled_peak / _MIB:.1f} MiB")
    ax.axvline(n, color="black", linewidth=0.6, alpha=0.5)
    ax.set_xlim(0, 2 * n)
    ax.set_ylim(bottom=0)
    ticks = sorted({0, n, 2 * n, n // 2, n + (n + 1) // 2})
    ax.set_xticks(ticks, [_stage_label(t, n) for t in ticks])
    ax.set_xlabel("stage (forward blocks, then backward regions in reverse)")
    ax.set_ylabel("live device memory (MiB; curves predicted)")
    ax.set_title(title or "autoremat: predicted memory over the step")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _stage_label(x: int, n: int) -> str:
    if x == 0:
        return "fwd 0"
    if x < n:
        return f"fwd {x}"
    if x == n:
        return f"fwd {n} | bwd {n}"
    return f"bwd {2 * n - x}"


def pareto_plot(points: Sequence[ParetoPoint], baselines: Sequence[ParetoPoint], path, *, y: str = "estimated",
                compiled: bool = True, budgets: Sequence[int] = (), infeasible: Sequence[tuple] = (),
                title: str | None = None) -> str:
    """Draws peak memory against a cost: autoremat's plans and the baseline policies.

    Args:
      points: autoremat's plans, one per budget (joined into a curve, lowest peak first).
      baselines: built-in policies (no remat, per-block `nothing_saveable`, ...), as markers.
      path: the PNG to create.
      y: which cost the points' `y` is, a key of `Y_AXES` (the axis label says it).
      compiled: the peaks are compiled by XLA (else predicted by autoremat's model).
      budgets: bytes; drawn as faint vertical lines.
      infeasible: (label, budget bytes, lowest peak found) of budgets no plan reached, drawn
        as red crosses on the x axis.
      title: the figure's title.

    Returns:
      `path`.
    """
    fig = _figure(figsize=(7.5, 5))
    ax = fig.add_subplot()
    y_label, scale = Y_AXES[y]
    pts = sorted(points, key=lambda p: p.peak_bytes)
    if pts:
        ax.plot([p.peak_bytes / _MIB for p in pts], [p.y * scale for p in pts], "o-", color="tab:blue",
                label="autoremat", zorder=3)
        for p in pts:
            ax.annotate(p.label, (p.peak_bytes / _MIB, p.y * scale), textcoords="offset points",
                        xytext=(4, 5), fontsize=8, color="tab:blue")
    markers = ["s", "^", "D", "v", "P", "X"]
    for i, b in enumerate(baselines):
        ax.plot([b.peak_bytes / _MIB], [b.y * scale], markers[i % len(markers)], color=f"C{(i + 1) % 10}",
                markersize=8, label=b.label, linestyle="none", zorder=4)
    for bud in budgets:
        ax.axvline(bud / _MIB, color="tab:red", alpha=0.15, linewidth=1)
    _mark_infeasible(ax, infeasible)
    ax.set_xlabel("peak device memory (MiB, " + ("compiled by XLA)" if compiled else "predicted by autoremat)"))
    ax.set_ylabel(y_label)
    ax.set_title(title or "autoremat: memory / cost frontier")
    ax.grid(alpha=0.3)
    if pts or baselines or infeasible:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def _mark_infeasible(ax, infeasible) -> None:
    """Budgets no plan reached: a red cross on the x axis at the budget, with the lowest peak."""
    for k, (label, budget, lowest) in enumerate(infeasible):
        x = budget / _MIB
        ax.plot([x], [0], "x", color="tab:red", markersize=10, mew=2, clip_on=False, zorder=5,
                label="infeasible budget" if k == 0 else None)
        ax.annotate(f"{label}: infeasible (lowest {lowest / _MIB:.1f} MiB)", (x, 0), textcoords="offset points",
                    xytext=(4, 8), fontsize=8, color="tab:red", rotation=90)

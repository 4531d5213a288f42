"""Benchmark autoremat against JAX's built-in remat policies (issue #6).

    .venv/bin/python benchmarks/run.py                 # full CPU suite (~15 min on 2 cores)
    .venv/bin/python benchmarks/run.py --quick         # 2-3 minute smoke run
    python benchmarks/run.py --size gpu                # on an accelerator, "gpu" model sizes

Per model it compiles `jax.value_and_grad(loss)` for every method and measures the compiled
peak (argument + output + temp - alias), XLA's FLOPs and the median step time:

* baselines: no remat; each built-in JAX policy applied per block through the example's
  `policy=` knob (`nothing_saveable`, `dots_saveable`, `dots_with_no_batch_dims_saveable`,
  `offload_dot_with_no_batch_dims`); MaxText `remat_policy` presets on the tagged
  transformers; sqrt(n) checkpointing (`ceil(sqrt(n))` consecutive chain blocks per region,
  nothing saved inside, built in autoremat's chain model and applied with `autoremat.apply`);
* autoremat (`plan_for`) at a sweep of budgets: the peak of each baseline that saves memory,
  and fractions 0.9, 0.8, ... of the no-remat peak down to the first infeasible one.

Writes `<out>/<backend>.md`, `<out>/<backend>.json` and `<out>/<backend>-<model>.png`
(`<backend>-quick*` with `--quick`).  See benchmarks/README.md for the columns.
"""

from autoremat._xla import configure_cpu_flags

configure_cpu_flags()  # before JAX initializes its backend (docs/FACTS.md fact 4)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import jax  # noqa: E402
import jaxlib  # noqa: E402

import autoremat  # noqa: E402
from autoremat import _optimize, _search  # noqa: E402
from autoremat._errors import InfeasibleBudgetError  # noqa: E402
from autoremat.examples import MAXTEXT_PRESETS, SIZES, get_example  # noqa: E402
from autoremat.graph._graph import build_graph  # noqa: E402
from autoremat.runtime._validate import compiled_stats  # noqa: E402
from autoremat.solver._chain import evaluate, lowest_peak_segments  # noqa: E402
from autoremat._bridge import plan_segments, to_plan  # noqa: E402

MIB = 2**20
MODELS = ("transformer", "transformer_scan", "mlp_chain", "convnet")
TAGGED = ("transformer", "transformer_scan")  # models with MaxText checkpoint_name tags
FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)

# --quick: small models, fewer methods and budgets, 3 timed steps.
QUICK_SIZES = {
    "transformer": dict(n_layers=2, d_model=64, n_heads=2, seq=32, batch=2, vocab=128),
    "transformer_scan": dict(n_layers=2, d_model=64, n_heads=2, seq=32, batch=2, vocab=128),
    "mlp_chain": dict(n_layers=4, width=128, batch=64),
    "convnet": dict(depth=2, channels=8, image=16, batch=2),
}
QUICK_PRESETS = ("minimal",)
QUICK_FRACTIONS = (0.8,)


def jax_policies(backend: str) -> dict:
    """JAX's built-in policies, applied per block."""
    cp = jax.checkpoint_policies
    pols = {
        "nothing_saveable": cp.nothing_saveable,
        "dots_saveable": cp.dots_saveable,
        "dots_with_no_batch_dims_saveable": cp.dots_with_no_batch_dims_saveable,
    }
    if hasattr(cp, "offload_dot_with_no_batch_dims"):
        pols["offload_dot_with_no_batch_dims"] = cp.offload_dot_with_no_batch_dims("device", "pinned_host")
    return pols


from _common import git_state  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)


def machine_info() -> dict:
    dev = jax.devices()[0]
    return {
        "autoremat": f"{autoremat.__version__} ({git_state()})",
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "device": getattr(dev, "device_kind", str(dev)),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "loadavg_start": os.getloadavg()[0],
    }


# -- measuring ---------------------------------------------------------------------------

def stats_record(stats) -> dict:
    return {
        "peak_bytes": stats.peak_bytes,
        "argument_bytes": stats.argument_bytes,
        "output_bytes": stats.output_bytes,
        "temp_bytes": stats.temp_bytes,
        "alias_bytes": stats.alias_bytes,
        "host_bytes": stats.host_bytes,
        "xla_flops": stats.flops,
        "step_time": stats.step_time,
        "step_times": list(stats.step_times),
        "step_time_min": min(stats.step_times) if stats.step_times else None,
        "loadavg_1min": os.getloadavg()[0],
        "compile_time": stats.compile_time,
    }


def measure(fn, args, n_steps: int) -> dict:
    return stats_record(compiled_stats(fn, *args, n_steps=n_steps))


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class SolveTimer:
    """Wraps `_search.solve` to add up the solver time of each `plan_for` call (all rounds)."""

    def __init__(self):
        self.total = 0.0
        self.calls = 0
        self._solve = _search.solve

    def __enter__(self):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return self._solve(*a, **kw)
            finally:
                self.total += time.perf_counter() - t0
                self.calls += 1

        _search.solve = timed
        return self

    def __exit__(self, *exc):
        _search.solve = self._solve


def plan_recompute_flops(segments) -> float:
    return float(sum(s.option.recompute_flops for s in segments))


def segments_of(model, plan):
    """The chain segments behind an autoremat plan, if they can be recovered (for FLOPs)."""
    how = str(plan.meta.get("found_by", ""))
    m = re.fullmatch(r"uniform (\S+) x(\d+)", how)
    if m:  # plan_for's compile-verified fallback: model.uniform(kind, size)
        return model.uniform(m.group(1), int(m.group(2)))
    try:
        return plan_segments(model, plan)
    except Exception:  # noqa: BLE001 - a best-effort estimate only
        return None


# -- one model ---------------------------------------------------------------------------

def run_model(name: str, size: str, quick: bool, n_steps: int, offload: bool, backend: str) -> dict:
    overrides = QUICK_SIZES[name] if quick else {}
    ex = get_example(name, size=size, **overrides)
    say(f"== {name}: {ex.description}")
    fn, args = ex.fn, ex.args
    t0 = time.perf_counter()
    g = build_graph(fn, *args)
    fwd_flops = g.total_flops()
    out = {
        "model": name,
        "description": ex.description,
        "n_blocks": ex.n_blocks,
        "size": "quick" if quick else size,
        "overrides": overrides,
        "graph_forward_flops": fwd_flops,
        "graph_build_time": time.perf_counter() - t0,
        "points": [],
    }
    points = out["points"]

    def baseline(method: str, kind: str, make_fn, extra=None):
        say(f"{name}: {method}")
        rec = {"method": method, "kind": kind, "status": "ok"}
        try:
            rec.update(measure(make_fn(), args, n_steps))
        except Exception as e:  # noqa: BLE001 - record the failure, keep benchmarking
            rec.update(status="error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
            say(f"{name}: {method} FAILED: {type(e).__name__}: {e}")
        rec.update(extra or {})
        points.append(rec)
        return rec

    none = baseline("no remat", "none", lambda: fn)
    if none["status"] != "ok":
        return out
    none_peak = none["peak_bytes"]

    # JAX's built-in policies, per block.
    for pname, pol in jax_policies(backend).items():
        baseline(pname, "jax", lambda pol=pol: get_example(name, size=size, policy=pol, **overrides).fn)
    # MaxText presets on the tagged transformers ("full" is nothing_saveable, measured above).
    if name in TAGGED:
        presets = QUICK_PRESETS if quick else [k for k in MAXTEXT_PRESETS if k != "full"]
        for k in presets:
            pol = MAXTEXT_PRESETS[k]
            baseline(f"maxtext:{k}", "maxtext", lambda pol=pol: get_example(name, size=size, policy=pol, **overrides).fn)

    # The chain model (calibrated to the compiled no-remat step): budget 1.0 fits without remat.
    t0 = time.perf_counter()
    try:
        planned = _optimize.plan_for(fn, 1.0, args, offload=offload)
    except Exception as e:  # noqa: BLE001 - record autoremat's failure, then get the model another way
        out["model_error"] = {"call": "plan_for(fn, 1.0, args)", "error": f"{type(e).__name__}: {e}",
                              "traceback": traceback.format_exc()}
        say(f"{name}: plan_for(fn, 1.0) FAILED ({type(e).__name__}: {e}); retrying one byte under no remat")
        planned = _optimize.plan_for(fn, none_peak - 1, args, offload=offload)
    model = planned.model
    out["chain_blocks"] = model.problem.n_blocks
    out["chain_model_time"] = time.perf_counter() - t0
    out["predicted_no_remat_peak"] = int(evaluate(model.raw_problem, model.uniform("none"))[0])

    # Diagnostic: the chain model's lowest-peak plan, compiled (what autoremat could reach).
    try:
        low = lowest_peak_segments(model.problem)
        low_fn = autoremat.apply(fn, to_plan(model, low))
        out["lowest_plan"] = {"predicted_peak": int(evaluate(model.problem, low)[0]),
                              "compiled_peak": compiled_stats(low_fn, *args).peak_bytes}
    except Exception as e:  # noqa: BLE001
        out["lowest_plan"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}

    # sqrt(n) checkpointing in the chain model.
    nb = model.problem.n_blocks
    k = math.ceil(math.sqrt(nb))
    segs = model.uniform("ckpt:recompute", size=k)
    if segs is None:
        points.append({"method": f"sqrt(n): {k} blocks/region", "kind": "sqrt", "status": "error",
                       "error": f"model.uniform('ckpt:recompute', size={k}) is None (region not allowed)"})
    else:
        plan = to_plan(model, segs)
        pred = int(evaluate(model.raw_problem, segs)[0])
        rec = baseline(f"sqrt(n): {k} blocks/region", "sqrt", lambda: autoremat.apply(fn, plan),
                       {"predicted_peak": pred, "recompute_flops_model": plan_recompute_flops(segs)})
        if rec["status"] == "ok":
            rec["peak_error"] = (pred - rec["peak_bytes"]) / rec["peak_bytes"]

    # autoremat: budgets at every baseline's peak that saves memory, then fractions downwards.
    budgets: list[tuple[int, str]] = []

    def add_budget(b: int, label: str) -> bool:
        if b >= none_peak or any(x == b for x, _ in budgets):
            return False
        budgets.append((b, label))
        return True

    for p in sorted(points, key=lambda p: p.get("peak_bytes") or 0):
        if p["status"] == "ok" and p["kind"] != "none":
            add_budget(p["peak_bytes"], f"={p['method']}")
    by_budget: dict[int, dict] = {}

    def run_budget(b: int, label: str) -> dict:
        say(f"{name}: autoremat budget {b / MIB:.2f} MiB ({label})")
        rec = {"method": f"autoremat @ {label}", "kind": "autoremat", "budget_label": label, "budget_bytes": b}
        t0 = time.perf_counter()
        with SolveTimer() as st:
            try:
                pl = _optimize.plan_for(fn, b, args, offload=offload, verbose=True)
            except InfeasibleBudgetError as e:
                rec.update(status="infeasible", lowest_bytes=e.lowest, error=str(e))
                pl = None
            except Exception as e:  # noqa: BLE001
                rec.update(status="error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
                say(f"{name}: autoremat @ {label} FAILED: {type(e).__name__}: {e}")
                pl = None
        rec.update(plan_time=time.perf_counter() - t0, solve_time=st.total, solve_calls=st.calls)
        if pl is not None:
            plan = pl.plan
            meta = plan.meta
            rec.update(status="ok", found_by=meta.get("found_by"), solver=meta.get("solver"),
                       predicted_peak=plan.predicted_peak, compiled_peak_meta=meta.get("compiled_peak"),
                       solver_solve_time=meta.get("solve_time"), rounds=meta.get("rounds"))
            segs = segments_of(pl.model, plan)
            if segs is not None:
                rec["recompute_flops_model"] = plan_recompute_flops(segs)
            try:
                rec.update(measure(autoremat.apply(fn, plan), args, n_steps))
                rec["fits"] = rec["peak_bytes"] <= b
                if plan.predicted_peak:
                    rec["peak_error"] = (plan.predicted_peak - rec["peak_bytes"]) / rec["peak_bytes"]
            except Exception as e:  # noqa: BLE001
                rec.update(status="error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        points.append(rec)
        by_budget[b] = rec
        return rec

    for b, label in sorted(budgets, reverse=True):
        run_budget(b, label)
    for f in (QUICK_FRACTIONS if quick else FRACTIONS):
        b = int(f * none_peak)
        if add_budget(b, f"{f:g}"):
            rec = run_budget(b, f"{f:g}")
            if rec["status"] != "ok":
                break
        elif any(r["status"] == "infeasible" and r["budget_bytes"] >= b for r in by_budget.values()):
            break

    # Extra FLOPs over no remat.  XLA counts a scan body once, so for the scan model the
    # difference (all of it in the scan body for per-body policies) is scaled by the trip count.
    scale = ex.n_blocks if name.endswith("_scan") else 1
    out["xla_flops_scale"] = scale
    for p in points:
        if p.get("xla_flops") is not None and none.get("xla_flops") is not None:
            p["extra_flops_xla"] = (p["xla_flops"] - none["xla_flops"]) * scale
        if p.get("status") == "ok":
            p["fraction_of_none"] = p["peak_bytes"] / none_peak
    return out


# -- reports -----------------------------------------------------------------------------

def fmt_mib(b) -> str:
    return "" if b is None else f"{b / MIB:.1f}"


def fmt_ms(t) -> str:
    return "" if t is None else f"{t * 1e3:.1f}"


def fmt_gf(f) -> str:
    return "" if f is None else f"{f / 1e9:.2f}"


def model_table(m: dict) -> list[str]:
    none = next(p for p in m["points"] if p["kind"] == "none")
    lines = [f"### {m['model']}", "", m["description"] + ".", ""]
    extra = [f"{m['n_blocks']} blocks in the model, {m.get('chain_blocks', '?')} in autoremat's chain",
             f"graph forward FLOPs {fmt_gf(m['graph_forward_flops'])} G"]
    if m.get("model_error"):
        extra.append(f"`{m['model_error']['call']}` raised {m['model_error']['error'].splitlines()[0]} "
                     "(traceback in the JSON); the chain model came from a budget one byte under no remat")
    lp = m.get("lowest_plan") or {}
    if "compiled_peak" in lp:
        extra.append(f"the chain model's lowest-peak plan: predicted {fmt_mib(lp['predicted_peak'])} MiB, "
                     f"compiled {fmt_mib(lp['compiled_peak'])} MiB")
    if m.get("xla_flops_scale", 1) != 1:
        extra.append(f"XLA counts the scan body once: extra FLOPs (XLA) are scaled by {m['xla_flops_scale']}")
    lines += ["; ".join(extra) + ".", ""]
    lines.append("| method | budget MiB | peak MiB | / none | fits | step ms | min ms | XLA GFLOP | extra GFLOP XLA "
                 "| extra GFLOP model | solve s | plan s | pred. err | notes |")
    lines.append("|---|---:|---:|---:|:-:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for p in m["points"]:
        st = p.get("status")
        notes = []
        if st == "infeasible":
            notes.append(f"infeasible: lowest {fmt_mib(p.get('lowest_bytes'))} MiB")
        elif st == "error":
            notes.append("ERROR: " + p.get("error", "").splitlines()[0][:120].replace("|", "/"))
        if p.get("found_by"):
            notes.append(p["found_by"])
        if p.get("host_bytes"):
            notes.append(f"host {fmt_mib(p['host_bytes'])} MiB")
        fits = "" if "fits" not in p else ("yes" if p["fits"] else "**no**")
        err = "" if p.get("peak_error") is None else f"{p['peak_error']:+.1%}"
        frac = "" if p.get("fraction_of_none") is None else f"{p['fraction_of_none']:.2f}"
        lines.append("| " + " | ".join([
            p["method"], fmt_mib(p.get("budget_bytes")), fmt_mib(p.get("peak_bytes")), frac, fits,
            fmt_ms(p.get("step_time")), fmt_ms(p.get("step_time_min")), fmt_gf(p.get("xla_flops")), fmt_gf(p.get("extra_flops_xla")),
            fmt_gf(p.get("recompute_flops_model")),
            "" if p.get("solve_time") is None else f"{p['solve_time']:.2f}",
            "" if p.get("plan_time") is None else f"{p['plan_time']:.1f}",
            err, "; ".join(notes)]) + " |")
    del none
    lines.append("")
    return lines


def headline(models: list[dict]) -> list[dict]:
    """Per baseline that saves memory: it vs autoremat at the same budget (or the best autoremat
    point whose compiled peak is at most the baseline's)."""
    rows = []
    for m in models:
        pts = m["points"]
        none = next((p for p in pts if p["kind"] == "none"), None)
        if none is None or none.get("status") != "ok":
            continue
        auto = [p for p in pts if p["kind"] == "autoremat"]
        for b in pts:
            if b["kind"] in ("none", "autoremat") or b.get("status") != "ok" or b["peak_bytes"] >= none["peak_bytes"]:
                continue
            same = next((a for a in auto if a["budget_bytes"] == b["peak_bytes"]), None)
            how = "same budget"
            if same is None or same.get("status") != "ok":
                cands = [a for a in auto if a.get("status") == "ok" and a["peak_bytes"] <= b["peak_bytes"]]
                if cands:
                    same = min(cands, key=lambda a: a["step_time"])
                    how = f"best autoremat point with peak <= baseline ({same['budget_label']})"
                elif same is None:
                    # A budget at or above this peak that autoremat could not reach proves it cannot.
                    same = next((a for a in sorted(auto, key=lambda a: a["budget_bytes"])
                                 if a.get("status") == "infeasible" and a["budget_bytes"] >= b["peak_bytes"]), None)
                    how = "an infeasible budget at or above this peak"
            rows.append({"model": m["model"], "none_peak": none["peak_bytes"], "none_step_time": none["step_time"],
                         "baseline": b["method"], "baseline_peak": b["peak_bytes"],
                         "baseline_step_time": b["step_time"], "baseline_extra_flops": b.get("extra_flops_xla"),
                         "autoremat_status": None if same is None else same.get("status"),
                         "autoremat_peak": None if same is None else same.get("peak_bytes"),
                         "autoremat_lowest": None if same is None else same.get("lowest_bytes"),
                         "autoremat_step_time": None if same is None else same.get("step_time"),
                         "autoremat_extra_flops": None if same is None else same.get("extra_flops_xla"),
                         "autoremat_fits": None if same is None else same.get("fits"),
                         "matched_by": how if same is not None else "no autoremat point"})
    return rows


def headline_table(rows: list[dict]) -> list[str]:
    lines = ["| model | none MiB / ms | baseline | baseline MiB / ms / +GFLOP | autoremat at that budget "
             "MiB / ms / +GFLOP | autoremat vs baseline time |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["autoremat_status"] == "ok":
            a = (f"{fmt_mib(r['autoremat_peak'])} / {fmt_ms(r['autoremat_step_time'])} / "
                 f"{fmt_gf(r['autoremat_extra_flops'])}")
            if r["matched_by"] != "same budget":
                a += " *"
            if r["autoremat_fits"] is False:
                a += " (over budget)"
            ratio = r["autoremat_step_time"] / r["baseline_step_time"] - 1
            verdict = f"{ratio:+.0%}"
        elif r["autoremat_status"] == "infeasible":
            a = f"infeasible (lowest {fmt_mib(r['autoremat_lowest'])} MiB)"
            verdict = "**loses** (cannot reach)"
        else:
            a, verdict = r["autoremat_status"] or "none", "n/a"
        lines.append(f"| {r['model']} | {fmt_mib(r['none_peak'])} / {fmt_ms(r['none_step_time'])} | {r['baseline']} "
                     f"| {fmt_mib(r['baseline_peak'])} / {fmt_ms(r['baseline_step_time'])} / "
                     f"{fmt_gf(r['baseline_extra_flops'])} | {a} | {verdict} |")
    lines.append("")
    lines.append("`*`: no autoremat run at exactly this budget succeeded; the fastest autoremat point whose "
                 "compiled peak is at most the baseline's is shown.  Time is the median measured step time; "
                 "negative = autoremat faster.")
    return lines


def pareto_png(m: dict, path: str, backend: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5.5))
    ax = fig.add_subplot()
    auto = sorted((p for p in m["points"] if p["kind"] == "autoremat" and p.get("status") == "ok"),
                  key=lambda p: p["peak_bytes"])
    if auto:
        ax.plot([p["peak_bytes"] / MIB for p in auto], [p["step_time"] * 1e3 for p in auto], "o-",
                color="tab:blue", label="autoremat (budget sweep)", zorder=3)
    markers = {"none": ("*", "black"), "jax": ("s", "tab:red"), "maxtext": ("^", "tab:green"),
               "sqrt": ("D", "tab:purple")}
    seen = set()
    for p in m["points"]:
        if p["kind"] not in markers or p.get("status") != "ok":
            continue
        mk, color = markers[p["kind"]]
        label = {"none": "no remat", "jax": "JAX policy per block", "maxtext": "MaxText preset",
                 "sqrt": "sqrt(n)"}[p["kind"]]
        ax.plot([p["peak_bytes"] / MIB], [p["step_time"] * 1e3], mk, color=color, markersize=9 if mk == "*" else 7,
                linestyle="none", label=None if label in seen else label, zorder=4)
        seen.add(label)
        ax.annotate(p["method"].replace("maxtext:", ""), (p["peak_bytes"] / MIB, p["step_time"] * 1e3),
                    textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    ax.set_xlabel("compiled peak (MiB)")
    ax.set_ylabel("median step time (ms)")
    ax.set_title(f"{m['model']} on {backend}: peak memory vs step time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_reports(result: dict, out_dir: str, stem: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    mi = result["machine"]
    lines = [f"# autoremat benchmarks: {mi['backend']}", "",
             f"Generated by `{result['command']}` in {result['total_time'] / 60:.1f} min.", "",
             "## Machine", "",
             f"- platform: {mi['platform']} ({mi['processor']}), {mi['cpu_count']} CPUs, device {mi['device']}",
             f"- python {mi['python']}, jax {mi['jax']}, jaxlib {mi['jaxlib']}, autoremat {mi['autoremat']}",
             f"- XLA_FLAGS: `{mi['xla_flags']}`",
             f"- date: {mi['date']}",
             f"- load average (1 min) at start / end: {mi['loadavg_start']:.2f} / {result.get('loadavg_end', 0):.2f} "
             "(other processes on the machine make step times noisy)", "",
             f"Step time: median of {result['config']['n_steps']} runs after one warm-up.  Peaks are XLA's "
             "compiled argument + output + temp - alias.  See README.md for the columns.", "",
             "## Headline", ""]
    lines += headline_table(result["headline"])
    lines += ["", "## Per model", ""]
    for m in result["models"]:
        if "error" in m:
            lines += [f"### {m['model']}", "", "ERROR: " + m["error"], ""]
            continue
        lines += model_table(m)
        lines += [f"![{m['model']}]({stem}-{m['model']}.png)", ""]
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    for m in result["models"]:
        if "error" not in m:
            try:
                pareto_png(m, os.path.join(out_dir, f"{stem}-{m['model']}.png"), mi["backend"])
            except Exception as e:  # noqa: BLE001
                say(f"plot for {m['model']} failed: {type(e).__name__}: {e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="small", choices=sorted({s for v in SIZES.values() for s in v}),
                    help="model size preset of autoremat.examples.SIZES (default small)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS, help="models to run")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                    help="output folder (default benchmarks/results)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny models, few methods (2-3 min on CPU)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per method (default 5, quick 3)")
    ap.add_argument("--no-compile-cache", action="store_true",
                    help="do not share compiled programs between methods through a temporary JAX cache")
    a = ap.parse_args(argv)
    n_steps = a.steps or (3 if a.quick else 5)
    if not a.no_compile_cache:
        # The same program is compiled several times (plan_for compiles the no-remat step and
        # its plans; we compile them again to time them): a run-local persistent cache makes
        # the repeats cheap.  Memory figures are the same either way.
        cache = tempfile.mkdtemp(prefix="autoremat-bench-cache-")
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    backend = jax.default_backend()
    offload = backend != "cpu"  # on the CPU, host memory is device memory
    stem = backend + ("-quick" if a.quick else "")
    t0 = time.perf_counter()
    result = {"machine": machine_info(),
              "command": "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "config": {"size": a.size, "quick": a.quick, "n_steps": n_steps, "offload": offload,
                         "fractions": list(QUICK_FRACTIONS if a.quick else FRACTIONS)},
              "models": []}
    for name in a.models:
        try:
            result["models"].append(run_model(name, a.size, a.quick, n_steps, offload, backend))
        except Exception as e:  # noqa: BLE001
            say(f"{name} FAILED: {type(e).__name__}: {e}")
            result["models"].append({"model": name, "error": f"{type(e).__name__}: {e}",
                                     "traceback": traceback.format_exc()})
        result["total_time"] = time.perf_counter() - t0
        result["loadavg_end"] = os.getloadavg()[0]
        result["headline"] = headline([m for m in result["models"] if "error" not in m])
        write_reports(result, a.out, stem)  # after every model, so a partial run leaves results
    say(f"done in {result['total_time'] / 60:.1f} min: {os.path.join(a.out, stem)}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

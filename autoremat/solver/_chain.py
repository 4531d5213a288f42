"""The chain problem every solver works on, and its exact memory model.

The forward computation is split into a chain of ``n`` blocks (layers). A
*region* covers blocks ``[start, stop)`` and becomes one ``jax.checkpoint``
call run with one *option* (what it saves, recomputes or offloads). A plan is a
partition of ``[0, n)`` into consecutive regions, each with an option; this is
the chain view of Rotor (Beaumont, Herrmann et al., "Optimal checkpointing for
heterogeneous chains", 2019/2021).

Memory model, with regions ``0..K-1`` in forward order, ``s_m`` what region
``m`` stores from its forward until its backward and ``b_m`` what is live while
its backward runs (on top of what earlier regions store)::

    forward_peak = base + sum_m s_m
    stage_k      = base + sum_{m<k} s_m + b_k
    peak         = max(forward_peak, max_k stage_k)

Time is the sum of the regions' ``extra_time`` (seconds over the no-remat step).
"""

from __future__ import annotations

import math
import numbers
import time as _time
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoremat._errors import BudgetError
from autoremat._units import format_bytes

__all__ = [
    "Option",
    "ChainProblem",
    "Segment",
    "SolveResult",
    "evaluate",
    "lowest_peak",
    "lowest_peak_segments",
    "min_time_segments",
    "uniform_segments",
    "fixed_partition",
    "evaluate_plan",
]

# Bytes are validated below this, so sums of a few thousand of them fit in int64.
_MAX_BYTES = 2**52
_BIG = np.iinfo(np.int64).max // 4


def _check_bytes(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be an int number of bytes, got {value!r}")
    if not 0 <= value < _MAX_BYTES:
        raise ValueError(f"{owner}: {name} must be in [0, 2**52) bytes, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Option:
    """One way to run a region.

    Attributes:
      name: e.g. ``"save-all"``, ``"recompute-all"``, ``"save:dots"``, ``"ilp@40%"``.
      stored_bytes: device bytes the region keeps from its forward until its
        backward (its boundary input plus what it saves).
      backward_bytes: device bytes live while the region's backward runs, on top
        of what earlier regions store.
      extra_time: seconds over the no-remat step (recompute plus offload transfers
        not hidden behind compute).
      recompute_flops: FLOPs recomputed.
      offloaded_bytes: host bytes.
      payload: opaque data passed through (e.g. the saved-name set); ignored by
        equality and hashing.
    """

    name: str
    stored_bytes: int
    backward_bytes: int
    extra_time: float
    recompute_flops: float = 0.0
    offloaded_bytes: int = 0
    payload: object = field(default=None, compare=False)

    def __post_init__(self):
        owner = f"Option {self.name!r}"
        if not isinstance(self.name, str):
            raise TypeError(f"Option: name must be a str, got {self.name!r}")
        object.__setattr__(self, "stored_bytes", _check_bytes(owner, "stored_bytes", self.stored_bytes))
        object.__setattr__(self, "backward_bytes", _check_bytes(owner, "backward_bytes", self.backward_bytes))
        object.__setattr__(self, "offloaded_bytes", _check_bytes(owner, "offloaded_bytes", self.offloaded_bytes))
        for attr in ("extra_time", "recompute_flops"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{owner}: {attr} must be a finite number, got {value!r}")
            object.__setattr__(self, attr, float(value))


@dataclass(frozen=True)
class Segment:
    """Region ``[start, stop)`` of the chain, run with ``option``."""

    start: int
    stop: int
    option: Option


@dataclass(frozen=True)
class ChainProblem:
    """A chain of ``n_blocks`` blocks and the regions (with options) allowed on it.

    Attributes:
      n_blocks: number of blocks.
      base_bytes: bytes live during the whole step (arguments, outputs,
        gradient accumulators).
      options: allowed region ``(start, stop)`` -> its options; regions absent
        are not allowed. Stored read-only; not part of the hash.
      block_names: optional names of the blocks, for reports.

    Raises:
      ValueError: regions out of range, a region without options, duplicate
        option names in a region, or no partition of ``[0, n)`` exists.
    """

    n_blocks: int
    base_bytes: int
    options: Mapping[tuple[int, int], tuple[Option, ...]] = field(hash=False)
    block_names: tuple[str, ...] = ()

    def __post_init__(self):
        n = self.n_blocks
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"ChainProblem: n_blocks must be a positive int, got {n!r}")
        object.__setattr__(self, "n_blocks", int(n))
        object.__setattr__(self, "base_bytes", _check_bytes("ChainProblem", "base_bytes", self.base_bytes))
        options = {}
        for key, opts in self.options.items():
            start, stop = (int(k) for k in key)
            if not 0 <= start < stop <= n:
                raise ValueError(f"ChainProblem: region {key!r} is not inside [0, {n}) with start < stop")
            opts = tuple(opts)
            if not opts:
                raise ValueError(f"ChainProblem: region [{start}, {stop}) has no options; leave it out instead")
            names = [o.name for o in opts]
            if not all(isinstance(o, Option) for o in opts):
                raise TypeError(f"ChainProblem: region [{start}, {stop}) options must be Option instances")
            dup = sorted({x for x in names if names.count(x) > 1})
            if dup:
                raise ValueError(f"ChainProblem: region [{start}, {stop}) has several options named {dup}")
            options[(start, stop)] = opts
        object.__setattr__(self, "options", types.MappingProxyType(options))
        object.__setattr__(self, "block_names", tuple(self.block_names))
        if self.block_names and len(self.block_names) != n:
            raise ValueError(
                f"ChainProblem: {len(self.block_names)} block_names for n_blocks={n}; give one per block or none"
            )
        reach = [False] * (n + 1)
        reach[0] = True
        for start, stop in sorted(options):
            reach[stop] = reach[stop] or reach[start]
        if not reach[n]:
            first = next(i for i in range(n + 1) if not reach[i])
            raise ValueError(
                f"ChainProblem: no partition of blocks [0, {n}) into allowed regions exists; "
                f"no chain of allowed regions from 0 reaches position {first}"
            )

    def __reduce__(self):
        # The read-only options view does not pickle; rebuild from a dict.
        return (ChainProblem, (self.n_blocks, self.base_bytes, dict(self.options), self.block_names))

    def block_label(self, i: int) -> str:
        """The name of block ``i`` if known, else ``"block i"``."""
        return self.block_names[i] if self.block_names else f"block {i}"


@dataclass(frozen=True)
class SolveResult:
    """What a chain solver returns.

    Attributes:
      status: ``"optimal"``, ``"feasible"``, ``"infeasible"`` or ``"unknown"``.
      segments: the plan. When infeasible, the plan with the lowest peak (which
        exceeds the budget); empty when ``"unknown"`` (no plan found in time).
      objective: total ``extra_time`` of ``segments`` in seconds (inf if empty).
      peak_bytes: ``evaluate(problem, segments)[0]`` (0 if empty).
      gap: relative optimality gap proven: 0.0 when optimal, NaN when unknown.
      solve_time: seconds.
      solver: which solver produced the result.
      lowest_peak: when infeasible, the lowest peak any partition reaches.
    """

    status: str
    segments: tuple[Segment, ...]
    objective: float
    peak_bytes: int
    gap: float
    solve_time: float
    solver: str
    lowest_peak: int | None = None

    @property
    def feasible(self) -> bool:
        """Whether ``segments`` is a plan within the budget."""
        return self.status in ("optimal", "feasible")


def evaluate(problem: ChainProblem, segments: Sequence[Segment]) -> tuple[int, float]:
    """Peak bytes and extra time of a plan, by the memory model in the module docstring.

    Args:
      problem: the chain.
      segments: regions covering ``[0, n)`` in order, each allowed with one of its options.

    Returns:
      ``(peak_bytes, extra_time)``.

    Raises:
      ValueError: the segments do not cover ``[0, n)`` contiguously, or use a
        region or option the problem does not allow.

    >>> opt = Option("save-all", stored_bytes=100, backward_bytes=50, extra_time=0.5)
    >>> problem = ChainProblem(2, base_bytes=10, options={(0, 1): (opt,), (1, 2): (opt,)})
    >>> evaluate(problem, [Segment(0, 1, opt), Segment(1, 2, opt)])
    (210, 1.0)
    """
    _validate_segments(problem, segments)
    prefix = 0
    stage_max = 0
    time = 0.0
    for seg in segments:
        stage_max = max(stage_max, prefix + seg.option.backward_bytes)
        prefix += seg.option.stored_bytes
        time += seg.option.extra_time
    return problem.base_bytes + max(prefix, stage_max), time


def _validate_segments(problem: ChainProblem, segments: Sequence[Segment]) -> None:
    if not segments:
        raise ValueError(f"segments are empty; they must cover blocks [0, {problem.n_blocks})")
    position = 0
    for k, seg in enumerate(segments):
        if not isinstance(seg, Segment):
            raise TypeError(f"segments[{k}] is {seg!r}, not a Segment")
        if seg.start != position:
            raise ValueError(
                f"segments[{k}] starts at {seg.start} but the previous region ends at {position}; "
                "regions must be consecutive from 0"
            )
        opts = problem.options.get((seg.start, seg.stop))
        if opts is None:
            raise ValueError(f"segments[{k}]: region [{seg.start}, {seg.stop}) is not allowed by the problem")
        if seg.option not in opts:
            raise ValueError(
                f"segments[{k}]: option {seg.option.name!r} is not one of region "
                f"[{seg.start}, {seg.stop})'s options {[o.name for o in opts]}"
            )
        position = seg.stop
    if position != problem.n_blocks:
        raise ValueError(f"segments end at {position} but the chain has {problem.n_blocks} blocks")


# ----------------------------------------------------------------------------
# Flattened tables shared by the vectorized solvers.


@dataclass(frozen=True)
class _ByStop:
    """All (region, option) candidates ending at one position, as arrays."""

    starts: np.ndarray  # int64
    stored: np.ndarray  # int64
    backward: np.ndarray  # int64
    time: np.ndarray  # float64
    options: tuple[Option, ...]


def _tables(problem: ChainProblem) -> tuple[_ByStop, ...]:
    """Candidates grouped by stop position (index 0 is empty); cached on the problem."""
    cached = problem.__dict__.get("_by_stop")
    if cached is not None:
        return cached
    groups: list[list[tuple[int, Option]]] = [[] for _ in range(problem.n_blocks + 1)]
    for (start, stop), opts in sorted(problem.options.items()):
        groups[stop].extend((start, o) for o in opts)
    tables = tuple(
        _ByStop(
            starts=np.array([s for s, _ in g], dtype=np.int64),
            stored=np.array([o.stored_bytes for _, o in g], dtype=np.int64),
            backward=np.array([o.backward_bytes for _, o in g], dtype=np.int64),
            time=np.array([o.extra_time for _, o in g], dtype=np.float64),
            options=tuple(o for _, o in g),
        )
        for g in groups
    )
    object.__setattr__(problem, "_by_stop", tables)
    return tables


def _backtrack(problem: ChainProblem, choice: Sequence[int]) -> tuple[Segment, ...]:
    """Segments from ``choice[i]`` = index of the candidate ending at ``i`` (stateless DPs)."""
    tables = _tables(problem)
    segments = []
    i = problem.n_blocks
    while i > 0:
        c = int(choice[i])
        t = tables[i]
        start = int(t.starts[c])
        segments.append(Segment(start, i, t.options[c]))
        i = start
    return tuple(reversed(segments))


def _min_stored(problem: ChainProblem, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Least stored prefix reaching each position with every stage ``P_j + b <= limit``.

    A smaller prefix is never worse for what follows (every later constraint is
    on the prefix plus something fixed), so the DP over positions is exact.
    """
    tables = _tables(problem)
    n = problem.n_blocks
    min_prefix = np.full(n + 1, _BIG, dtype=np.int64)
    min_prefix[0] = 0
    choice = np.full(n + 1, -1, dtype=np.int64)
    for i in range(1, n + 1):
        t = tables[i]
        if t.starts.size == 0:
            continue
        prev = min_prefix[t.starts]
        ok = (prev < _BIG) & (prev + t.backward <= limit)
        cand = np.where(ok, prev + t.stored, _BIG)
        c = int(np.argmin(cand))
        min_prefix[i] = cand[c]
        choice[i] = c
    return min_prefix, choice


def lowest_peak_segments(problem: ChainProblem) -> tuple[Segment, ...]:
    """A plan reaching the lowest peak of any partition (time is not considered).

    Exact: binary search over the integer peak ``T``; for a fixed ``T`` the
    least stored prefix per position decides whether a plan with peak <= ``T``
    exists (see ``_min_stored``).
    """
    cached = problem.__dict__.get("_lowest")
    if cached is not None:
        return cached
    base = problem.base_bytes
    _, choice = _min_stored(problem, _BIG)
    best = _backtrack(problem, choice)
    hi = evaluate(problem, best)[0]  # feasible
    lo = base - 1  # infeasible: every peak is >= base, and == base only if all zero
    while hi - lo > 1:
        mid = (lo + hi) // 2
        prefix, choice = _min_stored(problem, mid - base)
        if prefix[-1] <= mid - base:
            hi = mid
            best = _backtrack(problem, choice)
        else:
            lo = mid
    object.__setattr__(problem, "_lowest", best)
    return best


def lowest_peak(problem: ChainProblem) -> int:
    """The exact minimum peak, in bytes, over all partitions and options.

    >>> a = Option("save", stored_bytes=100, backward_bytes=0, extra_time=0.0)
    >>> b = Option("remat", stored_bytes=10, backward_bytes=100, extra_time=1.0)
    >>> lowest_peak(ChainProblem(2, 0, {(0, 1): (a, b), (1, 2): (a, b)}))
    110
    """
    return evaluate(problem, lowest_peak_segments(problem))[0]


def min_time_segments(problem: ChainProblem) -> tuple[Segment, ...]:
    """The fastest plan ignoring memory; its time is a lower bound for every budget."""
    tables = _tables(problem)
    n = problem.n_blocks
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    choice = np.full(n + 1, -1, dtype=np.int64)
    for i in range(1, n + 1):
        t = tables[i]
        if t.starts.size == 0:
            continue
        cand = best[t.starts] + t.time
        c = int(np.argmin(cand))
        best[i] = cand[c]
        choice[i] = c
    return _backtrack(problem, choice)


# ----------------------------------------------------------------------------
# Baselines: fixed partitions evaluated like solver results.


def fixed_partition(problem: ChainProblem, spec: Iterable[tuple[int, int, str]]) -> tuple[Segment, ...]:
    """Segments from ``(start, stop, option_name)`` triples, validated.

    Raises:
      ValueError: a region is not allowed, has no option of that name, or the
        regions do not cover ``[0, n)`` in order.
    """
    segments = []
    for start, stop, name in spec:
        opts = problem.options.get((start, stop))
        if opts is None:
            raise ValueError(f"fixed_partition: region [{start}, {stop}) is not allowed by the problem")
        match = [o for o in opts if o.name == name]
        if not match:
            raise ValueError(
                f"fixed_partition: region [{start}, {stop}) has no option named {name!r}; "
                f"its options are {[o.name for o in opts]}"
            )
        segments.append(Segment(start, stop, match[0]))
    segments = tuple(segments)
    _validate_segments(problem, segments)
    return segments


def uniform_segments(problem: ChainProblem, size: int, option_name: str) -> tuple[Segment, ...]:
    """Regions of ``size`` blocks (the last one shorter), all with ``option_name``.

    ``size=1`` is "every block its own region"; ``size≈sqrt(n)`` is Chen et al.'s
    √n checkpointing.

    Raises:
      ValueError: ``size`` is not positive, or a region or option is missing.
    """
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise ValueError(f"uniform_segments: size must be a positive int, got {size!r}")
    n = problem.n_blocks
    spec = [(start, min(start + size, n), option_name) for start in range(0, n, size)]
    return fixed_partition(problem, spec)


def evaluate_plan(problem: ChainProblem, segments: Sequence[Segment], budget: int, *, solver: str = "fixed") -> SolveResult:
    """A ``SolveResult`` for a given plan (a baseline), feasible iff its peak fits ``budget``."""
    t0 = _time.perf_counter()
    budget = check_budget(budget)
    segments = tuple(segments)
    peak, extra = evaluate(problem, segments)
    fits = peak <= budget
    return SolveResult(
        status="feasible" if fits else "infeasible",
        segments=segments,
        objective=extra,
        peak_bytes=peak,
        gap=math.nan,
        solve_time=_time.perf_counter() - t0,
        solver=solver,
        lowest_peak=None if fits else lowest_peak(problem),
    )


# ----------------------------------------------------------------------------
# Helpers shared by the solvers.


def check_budget(budget) -> int:
    """Validates a solver's budget: an int number of bytes >= 0."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 0:
        raise BudgetError(
            f"solver budget {budget!r} must be an int number of bytes >= 0; "
            "convert '8GB'-style budgets with parse_budget first"
        )
    return int(budget)


def relative_gap(objective: float, bound: float) -> float:
    """``(objective - bound) / |objective|``, 0 when they agree (to 1e-9 relative)."""
    if math.isnan(bound) or math.isinf(bound):
        return math.nan
    diff = objective - bound
    if diff <= 1e-9 * max(abs(objective), abs(bound)) or diff <= 1e-15:
        return 0.0
    return diff / abs(objective) if objective else math.inf


def make_result(
    problem: ChainProblem,
    segments: Sequence[Segment],
    *,
    status: str,
    gap: float,
    t0: float,
    solver: str,
) -> SolveResult:
    """A feasible/optimal result, with the plan re-evaluated exactly."""
    segments = tuple(segments)
    peak, extra = evaluate(problem, segments)
    return SolveResult(status, segments, extra, peak, gap, _time.perf_counter() - t0, solver)


def infeasible_result(problem: ChainProblem, *, t0: float, solver: str) -> SolveResult:
    """The result for a budget below ``lowest_peak``: the lowest-peak plan, flagged."""
    segments = lowest_peak_segments(problem)
    peak, extra = evaluate(problem, segments)
    return SolveResult("infeasible", segments, extra, peak, math.nan, _time.perf_counter() - t0, solver, peak)


def unknown_result(*, t0: float, solver: str) -> SolveResult:
    """The result when no plan was found in the time limit."""
    return SolveResult("unknown", (), math.inf, 0, math.nan, _time.perf_counter() - t0, solver)


def infeasible_message(budget: int, lowest: int) -> str:
    """The message of ``InfeasibleBudgetError`` (shared with the public API)."""
    return (
        f"budget {format_bytes(budget)} is below the lowest reachable peak {format_bytes(lowest)}; "
        f"raise the budget to at least {format_bytes(lowest)} ({lowest} bytes) or enable offload"
    )

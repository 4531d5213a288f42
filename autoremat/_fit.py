"""`fit(factory, budget)`: the largest batch (or sequence length) whose training step fits.

The question practitioners ask first.  `factory(size)` builds the step at one size: `(fn,
args)`, `(fn, args, kwargs)`, or an object with `.fn` and `.args`; `jax.ShapeDtypeStruct`
arguments make it compile-only (nothing is allocated, so sizes far beyond this machine's
memory are measured too).  For each size probed the un-optimized step is compiled; where it
is over the budget autoremat plans it (`plan_for`: the plan's compiled peak is the judge).
A size fits "with a plan" when a plan fits the budget and, with `max_overhead`, recomputes at
most that fraction of the step's FLOPs.  Both answers come from a binary search over sizes,
doubling from `lo` while no bound is known (peaks grow with batch and sequence length).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tabulate import tabulate

from autoremat._errors import BudgetError, InfeasibleBudgetError
from autoremat._progress import working
from autoremat._units import format_bytes, parse_budget

__all__ = ["fit", "FitResult", "SizeRow"]

MAX_SIZE = 2**20  # the doubling search stops here


@dataclass(frozen=True)
class SizeRow:
    """One size probed: the un-optimized peak, and autoremat's plan where one was needed."""

    size: int
    peak: int  # the un-optimized step's compiled peak
    plan_peak: int | None = None  # None: no plan needed (fits as is) or none fits
    extra_flops: float = 0.0  # the plan's recomputed FLOPs (the step's jaxpr)
    step_flops: float = 0.0  # the un-optimized step's jaxpr FLOPs
    found_by: str = ""
    planned: bool = False  # whether autoremat planned this size

    @property
    def overhead(self) -> float:
        return self.extra_flops / self.step_flops if self.step_flops else 0.0


@dataclass
class FitResult:
    """The largest size that fits as is, and with a plan (0: not even `lo`)."""

    budget: int
    plain: int
    planned: int
    max_overhead: float | None
    rows: list[SizeRow] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"budget {format_bytes(self.budget)}"
                 + ("" if self.max_overhead is None else f", at most {self.max_overhead:.0%} extra FLOPs")]
        table = []
        for r in sorted(self.rows, key=lambda r: r.size):
            plan = ("not needed" if r.peak <= self.budget else "-" if not r.planned
                    else "none fits" if r.plan_peak is None else format_bytes(r.plan_peak))
            extra = "" if r.plan_peak is None else f"{r.overhead:+.1%}"
            table.append([r.size, format_bytes(r.peak), plan, extra, r.found_by])
        lines.append(tabulate(table, ["size", "no remat", "with plan", "extra FLOPs", "found by"],
                              colalign=("right", "right", "right", "right", "left"), disable_numparse=True))
        lines.append(f"largest size that fits as written: {self.plain or 'none'}; "
                     f"with autoremat's plan: {self.planned or 'none'}")
        return "\n".join(lines)


def fit(factory, budget, *, lo: int = 1, hi: int | None = None, max_overhead: float | None = None,
        device=None, progress=None) -> FitResult:
    """The largest size in [lo, hi] whose `value_and_grad` step fits `budget` per device, without
    and with a plan.  `budget`: bytes or a string such as "80GB" (a fraction has nothing to be a
    fraction of here); `max_overhead`: e.g. 0.1 for at most 10% extra FLOPs."""
    if isinstance(budget, float):
        raise BudgetError(f"fit needs an absolute budget such as '80GB' or a number of bytes, not the fraction "
                          f"{budget!r}: the un-optimized peak changes with the size")
    budget_bytes = parse_budget(budget)
    if lo < 1 or (hi is not None and hi < lo):
        raise ValueError(f"sizes must satisfy 1 <= lo <= hi; got lo={lo}, hi={hi}")
    probe = _Probe(factory, budget_bytes, max_overhead, device, progress or (lambda m: None))
    plain = _largest(probe.fits_plain, lo, hi)
    planned = _largest(probe.fits_planned, max(lo, plain), hi)
    return FitResult(budget_bytes, plain, planned, max_overhead, list(probe.rows.values()))


def _largest(ok, lo: int, hi: int | None) -> int:
    """The largest n in [lo, hi] with ok(n), for ok true up to some size and false beyond;
    0 when not ok(lo).  Without `hi`: doubling finds a bound first."""
    if not ok(lo):
        return 0
    if hi is None:
        good, hi = lo, lo * 2
        while hi <= MAX_SIZE and ok(hi):
            good, hi = hi, hi * 2
        if hi > MAX_SIZE:
            return good
        lo, hi = good, hi - 1
    elif ok(hi):
        return hi
    else:
        hi -= 1
    while lo < hi:  # ok(lo) holds; the answer is in [lo, hi]
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


class _Probe:
    """Compiles and plans each size at most once."""

    def __init__(self, factory, budget: int, max_overhead, device, say):
        self.factory, self.budget, self.max_overhead, self.device, self.say = factory, budget, max_overhead, device, say
        self.rows: dict[int, SizeRow] = {}

    def _model(self, size: int):
        made = self.factory(size)
        if hasattr(made, "fn") and hasattr(made, "args"):
            return made.fn, tuple(made.args), dict(getattr(made, "kwargs", None) or {})
        if isinstance(made, (tuple, list)) and len(made) in (2, 3) and callable(made[0]):
            return made[0], tuple(made[1]), dict(made[2]) if len(made) == 3 else {}
        raise TypeError(f"factory({size}) returned {type(made).__name__}; it must return (fn, args), "
                        f"(fn, args, kwargs) or an object with .fn and .args")

    def fits_plain(self, size: int) -> bool:
        if size not in self.rows:
            from autoremat.runtime._validate import compiled_stats

            fn, args, kwargs = self._model(size)
            with working(self.say, f"size {size}: compiling the step as written"):
                st = compiled_stats(fn, *args, **kwargs)
            self.rows[size] = SizeRow(size, st.peak_bytes, step_flops=st.jaxpr_flops or 0.0)
            self.say(f"size {size}: un-optimized peak {format_bytes(st.peak_bytes)}")
        return self.rows[size].peak <= self.budget

    def fits_planned(self, size: int) -> bool:
        if self.fits_plain(size):
            return True
        if not self.rows[size].planned:
            self._plan(size)
        r = self.rows[size]
        return r.plan_peak is not None and (self.max_overhead is None or r.overhead <= self.max_overhead)

    def _plan(self, size: int) -> None:
        from autoremat._optimize import plan_for

        fn, args, kwargs = self._model(size)
        r = self.rows[size] = replace(self.rows[size], planned=True)
        try:
            plan = plan_for(fn, self.budget, args, kwargs, device=self.device, progress=lambda m: None).plan
        except InfeasibleBudgetError as e:
            self.say(f"size {size}: no plan fits (lowest {format_bytes(e.lowest)})")
            return
        self.rows[size] = replace(r, plan_peak=plan.meta["compiled_peak"], found_by=plan.meta.get("found_by", ""),
                                  extra_flops=plan.meta.get("extra_flops", 0.0))
        self.say(f"size {size}: plan {format_bytes(self.rows[size].plan_peak)}, "
                 f"{self.rows[size].overhead:+.1%} FLOPs ({self.rows[size].found_by})")

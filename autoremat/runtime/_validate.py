"""Validate a plan by compiling `jax.value_and_grad` of the rewritten function with XLA.

The compiled peak is `argument + output + temp - alias` from `memory_analysis()` (on CPU,
`peak_memory_in_bytes` does not move with the plan: docs/FACTS.md fact 5); on GPU the value XLA
reports as peak is recorded beside it.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import jax

from autoremat import _compile_cache
from autoremat._xla import MEMORY_ONLY_CPU_OPTIONS, cpu_flags_active
from autoremat.graph._costs import jaxpr_cost, jaxpr_matmul_flops
from autoremat.graph._trace import gradient_sharding
from autoremat.runtime._plan import Plan

__all__ = ["CompiledStats", "StagedStep", "ValidationReport", "cached_stats", "compile_later", "compile_step",
           "compiled_stats", "gradient_layouts", "stage_step", "validate"]

_POOL: ThreadPoolExecutor | None = None  # compiles started ahead (`compile_later`)
# What the compile cache keeps of a `CompiledStats` (`compile_step`).
_KEPT = ("peak_bytes", "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "host_bytes",
         "xla_peak_bytes", "flops", "backend", "compile_time")


@dataclass(frozen=True)
class CompiledStats:
    """What XLA says about one compiled `value_and_grad` step."""

    peak_bytes: int
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    host_bytes: int
    xla_peak_bytes: int | None
    flops: float | None
    step_time: float | None = None
    step_times: tuple[float, ...] = ()
    backend: str = ""
    compile_time: float = 0.0
    # FLOPs of the step's jaxpr (`graph.jaxpr_cost`: scan bodies times their trip count,
    # recomputation included), where XLA's `flops` counts a scan body once; and of its
    # matmuls and convolutions alone (`graph.jaxpr_matmul_flops`).
    jaxpr_flops: float | None = None
    matmul_flops: float | None = None
    cached: bool = False  # read from the compile cache (`autoremat._compile_cache`), not compiled here


def _value_and_grad(f, argnums, has_aux, layouts=None):
    """`jax.value_and_grad(f)`, each gradient constrained to its argument's sharding where
    `layouts` (`gradient_layouts`) gives one."""
    step = jax.value_and_grad(f, argnums=argnums, has_aux=has_aux)
    if layouts is None:
        return step

    def laid_out(*args, **kwargs):
        value, grads = step(*args, **kwargs)
        return value, jax.tree_util.tree_map(_constrain, grads, layouts)

    return laid_out


def _constrain(grad, sharding):
    if sharding is None or not jax.numpy.issubdtype(grad.dtype, jax.numpy.inexact):
        return grad
    return jax.lax.with_sharding_constraint(grad, sharding)


def gradient_layouts(args, argnums):
    """Per differentiated argument leaf, the sharding its gradient is laid out in: the
    argument's own, as a training step lays it out (its optimizer update runs where the
    parameter lives; under JAX's explicit sharding a gradient has its argument's sharding by
    type).  Unconstrained, XLA picks the gradients' layout itself: the 1B decoder under FSDP on
    8 host devices then returned some whole on every device (0.81 GiB of gradients a device
    against 0.25 of parameters) and compiled `nothing_saveable` per layer to 5.70 GiB, against
    5.10 laid out like the parameters (docs/FINDINGS.md, thirty-fifth session).  None where no
    argument is split over more than one device, or the mesh's axes are explicit."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    layouts = tuple(jax.tree_util.tree_map(_layout_of, args[i]) for i in nums)
    if not any(s is not None for s in jax.tree_util.tree_leaves(layouts, is_leaf=lambda x: x is None)):
        return None
    return layouts[0] if isinstance(argnums, int) else layouts


def _layout_of(x):
    try:
        s = getattr(x, "sharding", None)
    except Exception:  # noqa: BLE001 - a tracer without one: nothing to lay out
        return None
    return gradient_sharding(s)


@dataclass(frozen=True)
class StagedStep:
    """`jax.jit(jax.value_and_grad(fn))` traced and lowered for some arguments, not compiled."""

    lowered: object  # jax.stages.Lowered
    jaxpr_flops: float
    matmul_flops: float
    trace_time: float

    def program_key(self) -> str:
        """A digest of the lowered program: steps with equal keys compile alike (the same
        StableHLO, compiled with the same options), however their plans were written
        (ResNet-50's nothing_saveable and dots_with_no_batch_dims_saveable per layer, whose
        layers have no matmul, lower to one program)."""
        return self._digest

    @functools.cached_property
    def _digest(self) -> str:
        return _compile_cache.program_key(self.lowered)


def stage_step(fn, *args, argnums=0, static_argnums=(), has_aux=False, **kwargs) -> StagedStep:
    """The step `compiled_stats` compiles, traced and lowered, with its jaxpr's FLOPs."""
    _warn_without_cpu_flags()
    layouts = gradient_layouts(args, argnums)
    step = jax.jit(_value_and_grad(fn, argnums, has_aux, layouts), static_argnums=static_argnums)
    t0 = time.perf_counter()
    staged = step.trace(*args, **kwargs)
    jaxpr_flops, matmul_flops = jaxpr_cost(staged.jaxpr).flops, jaxpr_matmul_flops(staged.jaxpr)
    return StagedStep(staged.lower(), jaxpr_flops, matmul_flops, time.perf_counter() - t0)


def compiled_stats(fn, *args, argnums=0, static_argnums=(), has_aux=False, n_steps: int = 0,
                   warmup: int = 1, **kwargs) -> CompiledStats:
    """Compiles `jax.value_and_grad(fn)` for `args` and reads memory, FLOPs and (optionally) time.

    Args:
      fn: the function (original or rewritten).
      *args, **kwargs: example arguments (concrete arrays when `n_steps > 0`).
      n_steps: if positive, run the compiled step this many times and report the median;
        if 0 on XLA:CPU, compiled with `MEMORY_ONLY_CPU_OPTIONS` (the code is never run).
    """
    staged = stage_step(fn, *args, argnums=argnums, static_argnums=static_argnums, has_aux=has_aux, **kwargs)
    run_args = [a for i, a in enumerate(args) if i not in set(static_argnums)]
    return compile_step(staged, n_steps, warmup, run_args, kwargs)


def cached_stats(fn, *args, argnums=0, static_argnums=(), has_aux=False, **kwargs) -> CompiledStats:
    """`compiled_stats` of a memory-only compile, read from or kept in the planner's compile
    cache (`autoremat._compile_cache`)."""
    staged = stage_step(fn, *args, argnums=argnums, static_argnums=static_argnums, has_aux=has_aux, **kwargs)
    return compile_step(staged, cache=True)


def _warn_without_cpu_flags() -> None:
    if jax.default_backend() == "cpu" and not cpu_flags_active():
        warnings.warn(
            "XLA:CPU flags for remat are not set, so compiled memory will not reflect the plan; "
            "set XLA_FLAGS before importing jax (see autoremat._xla.CPU_XLA_FLAGS), e.g. run "
            "`autoremat.configure_cpu_flags()` first thing", stacklevel=4)


def compile_step(staged: StagedStep, n_steps: int = 0, warmup: int = 1, run_args=(), run_kwargs=None,
                 cache: bool = False) -> CompiledStats:
    """`staged` compiled, and read for memory, FLOPs and (with `n_steps`, run on `run_args`) time.
    `cache`: a memory-only compile (no `n_steps`) may be read from, and goes into, the compile
    cache (`autoremat._compile_cache`: the same program compiled by an earlier process)."""
    backend = jax.default_backend()
    options = MEMORY_ONLY_CPU_OPTIONS if backend == "cpu" and n_steps <= 0 else None
    cache = cache and n_steps <= 0
    kept = _compile_cache.load("stats", staged.program_key(), options) if cache else None
    if isinstance(kept, dict) and all(k in kept for k in _KEPT):
        return CompiledStats(**{k: kept[k] for k in _KEPT}, jaxpr_flops=staged.jaxpr_flops,
                             matmul_flops=staged.matmul_flops, cached=True)
    t0 = time.perf_counter()
    compiled = staged.lowered.compile(options)
    compile_time = staged.trace_time + time.perf_counter() - t0
    m = compiled.memory_analysis()
    arg, out, temp, alias = (int(getattr(m, k, 0) or 0) for k in (
        "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes"))
    host = sum(int(getattr(m, k, 0) or 0) for k in (
        "host_temp_size_in_bytes", "host_argument_size_in_bytes", "host_output_size_in_bytes"))
    xla_peak = getattr(m, "peak_memory_in_bytes", None)
    times = _run_times(compiled, n_steps, warmup, run_args, run_kwargs or {})
    st = CompiledStats(arg + out + temp - alias, arg, out, temp, alias, host,
                       int(xla_peak) if xla_peak is not None else None, _xla_flops(compiled),
                       statistics.median(times) if times else None, tuple(times), backend, compile_time,
                       staged.jaxpr_flops, staged.matmul_flops)
    if cache:
        _compile_cache.store("stats", staged.program_key(), {k: getattr(st, k) for k in _KEPT}, options)
    return st


def _xla_flops(compiled) -> float | None:
    try:
        ca = compiled.cost_analysis()
        if isinstance(ca, (list, tuple)):
            ca = ca[0] if ca else {}
        return float(ca.get("flops")) if ca and "flops" in ca else None
    except Exception:  # pragma: no cover - backend without cost analysis
        return None


def _run_times(compiled, n_steps: int, warmup: int, args, kwargs) -> list[float]:
    times: list[float] = []
    for i in range(warmup + n_steps if n_steps > 0 else 0):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args, **kwargs))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def compile_later(compile, *args, **kwargs) -> Future:
    """`compile(*args, **kwargs)` (a compile, such as `compiled_stats`) started on a background
    thread: a Future of its result.  XLA compiles without holding Python's lock, so programs
    known in advance compile side by side, on as many threads as the machine has cores, while
    the caller goes on (JAX's tracing is thread-safe)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="autoremat-compile")
    return _POOL.submit(compile, *args, **kwargs)


@dataclass(frozen=True)
class ValidationReport:
    """The compiled truth about a plan.

    Attributes:
      compiled: the compiled step's `CompiledStats`.
      predicted_peak: the plan's predicted peak (bytes), if it has one.
      budget: the plan's budget (bytes), if it has one.
      fits: compiled peak <= budget (None without a budget).
      peak_error: (predicted - compiled) / compiled, if a prediction exists.
    """

    compiled: CompiledStats
    predicted_peak: int | None
    budget: int | None
    fits: bool | None
    peak_error: float | None
    notes: tuple[str, ...] = field(default=())

    @property
    def compiled_peak(self) -> int:
        return self.compiled.peak_bytes

    def __str__(self) -> str:
        from autoremat._units import format_bytes

        c = self.compiled
        lines = [f"compiled peak   {format_bytes(c.peak_bytes)}  (arguments {format_bytes(c.argument_bytes)}, "
                 f"outputs {format_bytes(c.output_bytes)}, temp {format_bytes(c.temp_bytes)}, "
                 f"alias {format_bytes(c.alias_bytes)}; backend {c.backend})"]
        if c.host_bytes:
            lines.append(f"host memory     {format_bytes(c.host_bytes)}")
        if c.xla_peak_bytes:
            lines.append(f"XLA peak        {format_bytes(c.xla_peak_bytes)}")
        if self.predicted_peak is not None:
            lines.append(f"predicted peak  {format_bytes(self.predicted_peak)}  (error {self.peak_error:+.1%})")
        if self.budget is not None:
            lines.append(f"budget          {format_bytes(self.budget)}  -> {'fits' if self.fits else 'DOES NOT FIT'}")
        if c.flops is not None:
            lines.append(f"compiled FLOPs  {c.flops:.4g}")
        if c.step_time is not None:
            lines.append(f"step time       {c.step_time * 1e3:.2f} ms (median of {len(c.step_times)})")
        lines.extend(self.notes)
        return "\n".join(lines)


def validate(fn, plan: Plan, *args, n_steps: int = 0, **kwargs) -> ValidationReport:
    """Compiles `jax.value_and_grad(apply(fn, plan))` and compares it with the plan.

    Returns a `ValidationReport` with the compiled peak, host memory used by offload,
    compiled FLOPs, the predicted peak and its error, and optionally the median step time.
    """
    from autoremat.runtime._apply import apply

    stats = compiled_stats(apply(fn, plan), *args, argnums=plan.argnums, static_argnums=plan.static_argnums,
                           has_aux=plan.has_aux, n_steps=n_steps, **kwargs)
    err = None
    if plan.predicted_peak:
        err = (plan.predicted_peak - stats.peak_bytes) / max(stats.peak_bytes, 1)
    fits = None if plan.budget is None else stats.peak_bytes <= plan.budget
    return ValidationReport(stats, plan.predicted_peak, plan.budget, fits, err)

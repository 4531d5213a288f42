"""What the un-optimized backward pass keeps, row by row: `inspect(fn, *args)`.

`inspect` is `jax.ad_checkpoint.print_saved_residuals` with numbers attached. Each row is
one residual of the function's linearization (from `_residuals.function_residuals`, which
asks JAX, so no primitive list is written by hand): its type, per-device bytes, the
primitive and source line that produced it, its `checkpoint_name`, the FLOPs it would
take to recompute it from the function's inputs, and the description JAX prints for it.

Two differences from JAX's own listing, both on purpose:

* Nested `jit` calls and existing `jax.checkpoint` regions are inlined before
  linearizing (as everywhere in autoremat), so a row names the primitive inside the
  `jit` (`output of exp from model.py:12`) where JAX says `output of jitted function
  'softmax'`. For the same reason the scalar `from a literal` rows JAX reports at `jit`
  boundaries (4 bytes each for f32, constants XLA folds) do not appear here.
* Like `jax.grad`, only `argnums` are differentiated; `saved_residuals` differentiates
  every argument. Pass `argnums=tuple(range(len(args)))` to compare totals.
"""

from __future__ import annotations

import inspect as _pyinspect
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tabulate import tabulate

from autoremat._units import format_bytes as _format_bytes
from autoremat.graph._costs import aval_bytes
from autoremat.graph._residuals import FunctionResidual, function_residuals
from autoremat.graph._trace import Traced, trace

__all__ = ["InspectRow", "SourceGroup", "InspectReport", "inspect"]


_SORTS = ("bytes", "flops", "order")
_LOCATION = re.compile(r"^(?P<file>.*):(?P<line>\d+):\d+ \((?P<fn>.*)\)$")


def _format_flops(n: float) -> str:
    """`0`, `950`, `1.2K`, `3.4G`: three significant digits with a decimal prefix."""
    if n == 0:
        return "0"
    exp = min(int(math.log10(abs(n)) // 3), 5)
    if exp <= 0:
        return f"{n:.0f}"
    return f"{n / 10 ** (3 * exp):.3g}{'KMGTP'[exp - 1]}"


@dataclass(frozen=True)
class InspectRow:
    """One residual the un-optimized backward pass keeps.

    Attributes:
      type: JAX's short type string, e.g. `f32[64,1024]`.
      dtype: dtype name, e.g. `float32`.
      shape: global shape.
      bytes: bytes one device holds: `global_bytes` divided by the sharding factor the
        graph estimates for the value (equal to `global_bytes` without shardings).
      global_bytes: bytes of the whole (unsharded) array.
      primitive: the producing primitive; `argument` for function inputs.
      location: `file:line:col (function)` of the producing equation; '' for arguments.
      name: its `checkpoint_name`, if any.
      recompute_flops: FLOPs of the forward slice that recomputes it from the function's
        inputs (each equation once), per device like `bytes`; 0 for arguments.
      description: the text `print_saved_residuals` prints for it
        (`output of tanh from model.py:3:11 (loss)`, `from the argument w`).
      arg_index: the flat argument index when the residual is an argument.
    """

    type: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    global_bytes: int
    primitive: str
    location: str
    name: str | None
    recompute_flops: float
    description: str
    arg_index: int | None = None

    @property
    def line(self) -> str:
        """The source line without its column: `file:line (function)`; '<arguments>' for inputs."""
        if self.primitive == "argument":
            return "<arguments>"
        m = _LOCATION.match(self.location)
        return f"{m['file']}:{m['line']} ({m['fn']})" if m else (self.location or "<unknown>")


@dataclass(frozen=True)
class SourceGroup:
    """The residuals one source line produces (see `InspectReport.by_source`).

    Attributes:
      line: `file:line (function)`, or `<arguments>` for function inputs.
      rows: the rows of that line, in JAX's order.
      bytes: their per-device bytes.
      recompute_flops: their recompute FLOPs (summed over rows).
    """

    line: str
    rows: tuple[InspectRow, ...]
    bytes: int
    recompute_flops: float


@dataclass(frozen=True)
class InspectReport:
    """The residuals of a function's un-optimized backward pass.

    Attributes:
      rows: one `InspectRow` per residual, in the order JAX lists them.
      function: the inspected function's name.
      sharded: whether any argument is sharded (then `bytes` are per device).
    """

    rows: tuple[InspectRow, ...]
    function: str = "fn"
    sharded: bool = False

    @property
    def total_bytes(self) -> int:
        """Per-device bytes of every residual, arguments included."""
        return sum(r.bytes for r in self.rows)

    @property
    def global_total_bytes(self) -> int:
        """`total_bytes` without dividing by shardings."""
        return sum(r.global_bytes for r in self.rows)

    @property
    def argument_bytes(self) -> int:
        """Per-device bytes of residuals that are function arguments (live anyway)."""
        return sum(r.bytes for r in self.rows if r.primitive == "argument")

    @property
    def total_recompute_flops(self) -> float:
        """Sum over rows of each row's recompute FLOPs.

        Slices of different rows overlap, so this bounds from above the cost of
        recomputing every residual in one go.
        """
        return sum(r.recompute_flops for r in self.rows)

    def by_source(self) -> tuple[SourceGroup, ...]:
        """Rows grouped by source line (column dropped), largest total bytes first."""
        groups: dict[str, list[InspectRow]] = {}
        for r in self.rows:
            groups.setdefault(r.line, []).append(r)
        out = [SourceGroup(line, tuple(rs), sum(r.bytes for r in rs), sum(r.recompute_flops for r in rs))
               for line, rs in groups.items()]
        return tuple(sorted(out, key=lambda g: -g.bytes))

    def table(self, max_rows: int = 30, sort: str = "bytes") -> str:
        """A fixed-width table of the rows with a totals line.

        Args:
          max_rows: rows to show; the rest are summarized in one line.
          sort: `"bytes"` (largest first), `"flops"` (most expensive to recompute
            first) or `"order"` (JAX's order).

        Raises:
          ValueError: an unknown `sort` or a negative `max_rows`.
        """
        if sort not in _SORTS:
            raise ValueError(f"sort={sort!r} is not one of {_SORTS}")
        if not isinstance(max_rows, int) or max_rows < 0:
            raise ValueError(f"max_rows must be a non-negative int, got {max_rows!r}")
        rows = list(self.rows)
        if sort == "bytes":
            rows.sort(key=lambda r: -r.bytes)
        elif sort == "flops":
            rows.sort(key=lambda r: -r.recompute_flops)
        header = ("type", "bytes", "FLOPs to recompute", "name", "source")
        body = [(r.type, _format_bytes(r.bytes), _format_flops(r.recompute_flops), r.name or "",
                 r.description) for r in rows[:max_rows]]
        where = "per device" if self.sharded else "on one device"
        lines = [f"Residuals of {self.function} ({where}), sorted by {sort}:",
                 tabulate(body, header, colalign=("left", "right", "right", "left", "left"), disable_numparse=True)]
        hidden = rows[max_rows:]
        if hidden:
            lines.append(f"... {len(hidden)} more rows, {_format_bytes(sum(r.bytes for r in hidden))}")
        lines.append(f"total: {len(self.rows)} residuals, {_format_bytes(self.total_bytes)} "
                     f"({_format_bytes(self.argument_bytes)} of arguments)")
        lines.append("FLOPs to recompute: of the forward slice that rebuilds the value from the function's "
                     "inputs, each row on its own (rows share work: they do not add up)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict:
        """Plain data: the rows (as dicts) and the totals."""
        return {
            "function": self.function,
            "sharded": self.sharded,
            "total_bytes": self.total_bytes,
            "global_total_bytes": self.global_total_bytes,
            "argument_bytes": self.argument_bytes,
            "total_recompute_flops": self.total_recompute_flops,
            "rows": [dict(asdict(r), shape=list(r.shape)) for r in self.rows],
        }

    def to_json(self, indent: int | None = None) -> str:
        """`to_dict()` as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)


def inspect(fn, *args, argnums=0, static_argnums: Sequence[int] = (), has_aux: bool = False,
            profile=None, **kwargs) -> InspectReport:
    """Lists what the un-optimized backward pass of `fn` keeps, with sizes and costs.

    Args:
      fn: a function returning a scalar floating-point loss (or `(loss, aux)` with
        `has_aux=True`).
      *args: example arguments (arrays or `jax.ShapeDtypeStruct`, pytrees). Arguments
        with a `NamedSharding` make `bytes` per device.
      argnums: differentiated positional arguments (default 0, like `jax.grad`).
      static_argnums: positional arguments treated as Python constants.
      has_aux: `fn` returns `(loss, aux)`.
      profile: device profile for the graph built to estimate per-device sizes
        (only built when an argument is sharded).
      **kwargs: keyword arguments of `fn` (never differentiated).

    Returns:
      An `InspectReport`; `print(report)` shows the largest residuals.

    Raises:
      UnsupportedFunctionError: `fn` does not return a scalar float, takes a non-array
        argument, or has side effects (prints, callbacks).

    Example:
      >>> import jax.numpy as jnp
      >>> loss = lambda w, x: jnp.sum(jnp.sin(x @ w))
      >>> report = inspect(loss, jnp.ones((8, 4)), jnp.ones((2, 8)))
      >>> [(r.type, r.primitive, r.recompute_flops) for r in report.rows]   # x, cos(x @ w)
      [('f32[2,8]', 'argument', 0.0), ('f32[2,4]', 'cos', 128.0)]
      >>> report.total_bytes, report.argument_bytes   # 2*8*4 + 2*4*4, 2*8*4
      (96, 64)
      >>> print(report)  # doctest: +ELLIPSIS
      Residuals of <lambda> (on one device), sorted by bytes:
      type        bytes    FLOPs to recompute  name    source
      --------  -------  --------------------  ------  -----...
      f32[2,8]     64 B                     0          from the argument x
      f32[2,4]     32 B                   128          output of cos from <doctest ...>:1:28 (<lambda>)
      total: 2 residuals, 96 B (64 B of arguments)
      FLOPs to recompute: of the forward slice that rebuilds the value from the function's inputs, ...
    """
    traced = trace(fn, args, kwargs, argnums=argnums, static_argnums=static_argnums, has_aux=has_aux)
    residuals = function_residuals(traced)
    divisor = _divisors(traced, residuals, profile)
    names = _signature_names(fn, len(args))
    rows = tuple(_row(r, d, traced, names) for r, d in zip(residuals, divisor))
    return InspectReport(rows, getattr(fn, "__name__", type(fn).__name__), _any_sharded(traced))


def _row(r: FunctionResidual, div: float, traced: Traced, names: dict[str, str]) -> InspectRow:
    aval = r.aval
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    dtype = str(getattr(aval, "dtype", "token"))
    description = r.source
    if r.arg_index is not None:
        description = f"from the argument {_rename(traced.arg_names[r.arg_index], names)}"
    nbytes = aval_bytes(aval)
    return InspectRow(
        type=aval.str_short(short_dtypes=True) if hasattr(aval, "str_short") else f"{dtype}{list(shape)}",
        dtype=dtype, shape=shape, bytes=int(nbytes / div) if div > 1 else nbytes, global_bytes=nbytes,
        primitive=r.primitive, location=r.location, name=r.name,
        recompute_flops=r.recompute_flops / div if div > 1 else r.recompute_flops,
        description=description, arg_index=r.arg_index)


def _signature_names(fn, nargs: int) -> dict[str, str]:
    """`args[i]` -> the parameter's name, as JAX's `debug_info.arg_names` prints it."""
    try:
        params = list(_pyinspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return {}
    out = {}
    for i, p in enumerate(params[:nargs]):
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        out[f"args[{i}]"] = p.name
    return out


def _rename(arg_name: str, names: dict[str, str]) -> str:
    m = re.match(r"^args\[\d+\]", arg_name)
    if m and m.group(0) in names:
        return names[m.group(0)] + arg_name[m.end():]
    return arg_name


def _any_sharded(traced: Traced) -> bool:
    from autoremat.graph._graph import _sharding_divisor

    return any(_sharding_divisor(a, s) > 1 for a, s in zip(traced.in_avals, traced.in_shardings or ()))


def _divisors(traced: Traced, residuals: list[FunctionResidual], profile) -> list[float]:
    """Per residual, the sharding factor the graph estimates for the matching value.

    Rows are matched to graph values by argument index, else by (source location,
    primitive, shape), then (location, shape), then location alone (values the
    linearization derives on that line, e.g. `1 - tanh(x)**2`, share its sharding).
    A row that matches nothing is counted at its global size.
    """
    if not _any_sharded(traced):
        return [1.0] * len(residuals)
    from autoremat.graph._graph import graph_from_traced

    g = graph_from_traced(traced, profile=profile)

    def div(v) -> float:  # PRNG keys, tokens: 1 (never sharded in a way that matters here)
        return v.whole_bytes / v.nbytes if v.nbytes else 1.0

    keys: dict[tuple, float] = {}
    for v in g.values.values():
        if v.producer is None:
            continue
        prim = g.ops[v.producer].primitive
        d = div(v)
        for k in ((v.source, prim, v.shape), (v.source, v.shape), (v.source,)):
            keys[k] = max(keys.get(k, 1.0), d)
    out = []
    for r in residuals:
        if r.arg_index is not None:
            out.append(div(g.values[g.inputs[r.arg_index]]))
            continue
        shape = tuple(getattr(r.aval, "shape", ()))
        for k in ((r.location, r.primitive, shape), (r.location, shape), (r.location,)):
            if k in keys:
                out.append(keys[k])
                break
        else:
            out.append(1.0)
    return out

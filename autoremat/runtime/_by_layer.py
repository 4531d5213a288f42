"""A plan per layer, in the model's words (issue 17).

A plan's decisions are per value (`e12:0` saved, `e5/body/e3:0` recomputed); people think in
layers.  `layer_rows` groups a plan's value records by the layers the planner found
(`plan.meta["layers"]`, `graph.find_layers`: `[start, stop, key]` per layer, equal keys for
identical layers) and says, per layer, where its code is (function and source lines), the
bytes it saves, offloads and recomputes, the user's `checkpoint_name` tags it keeps and drops,
and the FLOPs its recomputation re-runs (`plan.meta["recompute_flops"]`, per top-level equation,
from `autoremat._bridge.with_recompute_costs`).  Consecutive identical layers with the same
decisions are one row ("layers 2-5").  Code outside every layer (embedding, head, loss) gets a
row of its own.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["LayerRow", "layer_rows", "layer_spans_and_rows"]

_SOURCE = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::\d+)? \((?P<fn>.*)\)$")


@dataclass
class LayerRow:
    """One layer, or a run of identical layers with the same decisions."""

    first: int | None  # 1-based layer number (None: code outside the layers)
    last: int | None
    code: str  # e.g. "_transformer_block (examples.py:262-273)"
    bytes: dict = field(default_factory=lambda: {"save": 0, "offload": 0, "recompute": 0})
    recompute_flops: float | None = None  # the model's FLOPs re-run (None: the plan does not say)
    recompute_time: float | None = None  # their seconds on the plan's device profile (fusion-aware)
    names: dict = field(default_factory=lambda: {"save": set(), "offload": set(), "recompute": set()})
    trips: int = 1  # a scan's trip count (its body is one row: the whole stack)
    signature: tuple = ()
    scope: str = ""  # the layer's module path where JAX's name stack has one (flax linen)
    last_scope: str = ""  # the last merged layer's

    @property
    def where(self) -> str:
        """The module path(s), if known, and the code: `Net/Block_1 .. Net/Block_3: __call__ (model.py:12-20)`."""
        scope = self.scope if self.last_scope in ("", self.scope) else f"{self.scope} .. {self.last_scope}"
        return f"{scope}: {self.code}" if scope else self.code

    @property
    def layers(self) -> str:
        if self.first is None:
            return "outside layers"
        text = f"layer {self.first}" if self.first == self.last else f"layers {self.first}-{self.last}"
        return text + (" (one scan)" if self.trips > 1 else "")


def top_index(value_id: str) -> int | None:
    """The top-level equation a value id belongs to (`e5/body/e3:0` -> 5); None for inputs."""
    m = re.match(r"e(\d+)[:/]", value_id)
    return int(m.group(1)) if m else None


def _spans(plan) -> list[tuple[int, int, str | None]]:
    """(start, stop, key) covering all top-level equations: the layers, and the gaps between
    them (key None)."""
    layers = sorted((int(a), int(b), str(k)) for a, b, k in plan.meta.get("layers") or ())
    out, pos = [], 0
    for a, b, k in layers:
        if a > pos:
            out.append((pos, a, None))
        out.append((a, b, k))
        pos = b
    if pos < plan.n_eqns:
        out.append((pos, plan.n_eqns, None))
    return out


def _code(records) -> str:
    """The function most of a layer's bytes come from, and the source lines of its values."""
    by_fn, lines = Counter(), {}
    for r in records:
        m = _SOURCE.match(r.source or "")
        if not m:
            continue
        by_fn[m["fn"]] += r.nbytes * r.multiplicity
        lines.setdefault((os.path.basename(m["file"]), m["fn"]), []).append(int(m["line"]))
    if not by_fn:
        return "?"
    fn = by_fn.most_common(1)[0][0]
    (file, _), nums = next(((k, v) for k, v in lines.items() if k[1] == fn))
    span = str(min(nums)) if min(nums) == max(nums) else f"{min(nums)}-{max(nums)}"
    return f"{fn} ({file}:{span})"


def _scope(records) -> str:
    """The name-stack path all of a layer's values share ("" when they share none: then a
    library's own scopes, `jnp.einsum`'s spec say, are not taken for the layer's name)."""
    paths = [r.scope.split("/") if r.scope else [] for r in records]
    return "/".join(os.path.commonprefix(paths)) if paths else ""


def _row(plan, records, span: tuple) -> LayerRow:
    start, stop, key = span
    trips = max((r.multiplicity for r in records), default=1)
    flops, time = plan.meta.get("recompute_flops"), plan.meta.get("recompute_time")
    row = LayerRow(None, None, _code(records), trips=trips, scope=_scope(records),
                   recompute_flops=sum(flops.get(str(i), 0.0) for i in range(start, stop)) if flops else None,
                   recompute_time=sum(time.get(str(i), 0.0) for i in range(start, stop)) if time else None)
    sig = []
    for r in records:
        row.bytes[r.decision] += r.nbytes * r.multiplicity
        if r.name:
            row.names[r.decision].add(r.name)
        sig.append((r.id.replace(f"e{top_index(r.id)}", f"e{top_index(r.id) - start}", 1), r.decision))
    row.signature = (key, tuple(sorted(sig))) if key is not None else ()
    return row


def _span_rows(plan):
    """(start, stop, key) and its `LayerRow`, for every layer and the code between them."""
    by_eqn: dict[int, list] = {}
    for r in plan.values.values():
        i = top_index(r.id)
        if i is not None:
            by_eqn.setdefault(i, []).append(r)
    number = 0
    for start, stop, key in _spans(plan):
        records = [r for i in range(start, stop) for r in by_eqn.get(i, ())]
        if key is None and not records:
            continue
        row = _row(plan, records, (start, stop, key))
        if key is not None:
            row.first, row.last = number + 1, number + row.trips
            number += row.trips
        yield (start, stop, key), row


def layer_spans_and_rows(plan) -> list[tuple[tuple[int, int], LayerRow]]:
    """Each layer's equations `(start, stop)` and its row, in order (no merging)."""
    return [((a, b), row) for (a, b, key), row in _span_rows(plan) if key is not None]


def layer_rows(plan) -> list[LayerRow]:
    """The plan's decisions per layer; consecutive identical layers with equal decisions merged."""
    rows = []
    for _, row in _span_rows(plan):
        last = rows[-1] if rows else None
        if last is not None and row.signature and row.signature == last.signature:
            last.last, last.last_scope = row.last, row.scope
            continue
        rows.append(row)
    return rows

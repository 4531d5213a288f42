"""`Plan`: what to save, offload and recompute, and where the checkpoint regions go.

A plan refers to the flat jaxpr of the traced function (see `autoremat.graph.trace`):

* a `Region` covers top-level equations `[start, stop)` and becomes one `jax.checkpoint`
  call; inside it, only the values in `saved` stay in device memory and the values in
  `offloaded` go to pinned host memory; everything else is recomputed during the backward
  pass.  Regions may nest (`children`).  Equations outside every region run as usual (JAX
  saves what its linearization needs).
* a `ScanPlan` rewrites the body of one top-level `scan` (scan over layers) into a
  `jax.checkpoint` with its own saved/offloaded body values; the residuals it keeps are
  stacked over the trip count.

Values are named by stable ids (`e12:0`, `e5/body/e3:0`) that survive re-tracing the same
function with the same shapes; the plan also records the traced structure's fingerprint and
refuses to apply to a function whose structure changed.

Plans are saved as versioned JSON (schema below, `SCHEMA_VERSION`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autoremat._errors import PlanFormatError

__all__ = ["Region", "ScanPlan", "ValueRecord", "Plan", "SCHEMA_VERSION", "POLICY_NAMES", "checkpoint_names"]

SCHEMA_VERSION = 1
_FORMAT = "autoremat-plan"


@dataclass(frozen=True)
class Region:
    """One `jax.checkpoint` region over top-level equations `[start, stop)`."""

    start: int
    stop: int
    saved: frozenset[str] = frozenset()
    offloaded: frozenset[str] = frozenset()
    children: tuple["Region", ...] = ()
    label: str = ""
    # A `jax.checkpoint_policies` member applied to the region besides the saved names
    # ("" = names only): how a person writes a per-layer policy (`autoremat._hand`).
    policy: str = ""

    def __post_init__(self):
        if not (0 <= self.start < self.stop):
            raise PlanFormatError(f"region [{self.start}, {self.stop}) is empty or negative")
        if self.saved & self.offloaded:
            raise PlanFormatError(f"values {sorted(self.saved & self.offloaded)} are both saved and offloaded")
        prev = self.start
        for c in self.children:
            if c.start < prev or c.stop > self.stop:
                raise PlanFormatError(
                    f"child region [{c.start}, {c.stop}) is not inside [{self.start}, {self.stop}) in order")
            prev = c.stop
        _check_policy(self.policy, f"region [{self.start}, {self.stop})")

    def to_json(self) -> dict:
        return {"start": self.start, "stop": self.stop, "saved": sorted(self.saved),
                "offloaded": sorted(self.offloaded), "children": [c.to_json() for c in self.children],
                "label": self.label, "policy": self.policy}

    @classmethod
    def from_json(cls, d: Mapping) -> "Region":
        return cls(int(d["start"]), int(d["stop"]), frozenset(d.get("saved", ())),
                   frozenset(d.get("offloaded", ())), tuple(cls.from_json(c) for c in d.get("children", ())),
                   str(d.get("label", "")), str(d.get("policy", "")))


@dataclass(frozen=True)
class ScanPlan:
    """Rematerialization of one scan's body (the equation `op` at top level)."""

    op: str
    saved: frozenset[str] = frozenset()
    offloaded: frozenset[str] = frozenset()
    policy: str = ""  # as `Region.policy`
    # Optimization barriers around the body's recomputation.  JAX's default (True) is what a
    # hand-written `jax.checkpoint(body, policy=...)` gets.  The solver's body plans go without
    # (docs/FINDINGS.md "Scan bodies: no optimization barriers"): on the built-in scan
    # transformer (CPU, jax 0.10.2) the nothing-saved body compiled to 51.3 MiB with barriers,
    # 50.8 without; but a third-party layer stack compiled to 195.7 MiB with them and 786.5
    # without (issue 14).  Which is lower is model-dependent, so the plan search compiles both.
    prevent_cse: bool = False

    def __post_init__(self):
        _check_policy(self.policy, f"scan plan {self.op}")

    def to_json(self) -> dict:
        return {"op": self.op, "saved": sorted(self.saved), "offloaded": sorted(self.offloaded),
                "policy": self.policy, "prevent_cse": self.prevent_cse}

    @classmethod
    def from_json(cls, d: Mapping) -> "ScanPlan":
        return cls(str(d["op"]), frozenset(d.get("saved", ())), frozenset(d.get("offloaded", ())),
                   str(d.get("policy", "")), bool(d.get("prevent_cse", False)))


@dataclass(frozen=True)
class ValueRecord:
    """What a plan says about one candidate value (for summaries and exports)."""

    id: str
    decision: str  # "save" | "offload" | "recompute"
    type: str
    nbytes: int
    primitive: str
    source: str
    name: str | None = None
    recompute_flops: float = 0.0
    multiplicity: int = 1
    scope: str = ""  # JAX's name stack (flax linen: the module path), "" where none

    @classmethod
    def from_graph(cls, vid: str, decision: str, info, op) -> "ValueRecord":
        """The record of graph value `info` (a `graph.ValueInfo`) made by `op` (an `OpInfo`, or
        None for an input)."""
        return cls(vid, decision, info.type_str, info.nbytes, op.primitive if op else "input", info.source,
                   info.name, float(op.cost.flops) if op else 0.0, op.multiplicity if op else 1,
                   info.scope)


def checkpoint_names(values: Mapping[str, ValueRecord] | None, ids) -> dict[str, str]:
    """The `checkpoint_name` autoremat tags each value id with when it applies a plan.

    Generated names are unique per value, so saving one value never saves another that the
    user happened to give the same name (every layer's `query_proj`, say).  `to_python()`
    uses the user's own names where that is equivalent.
    """
    del values
    return {v: "autoremat:" + v for v in ids}


@dataclass(frozen=True)
class Plan:
    """A rematerialization plan for one traced function signature.

    Attributes:
      fingerprint: structure hash of the traced function (`graph.structure_fingerprint`).
      n_eqns: number of top-level equations of the traced function.
      regions: top-level checkpoint regions, in order, non-overlapping.
      scans: body plans of top-level scans.
      values: per candidate value, the decision with its size and source.
      argnums, static_argnums, has_aux: how the function is differentiated and called.
      predicted_peak: the solver's predicted peak device memory (bytes), if known.
      budget: the budget the plan was solved for (bytes), if any.
      estimated_extra_time: predicted seconds added by recomputation and offload.
      meta: free-form provenance (solver, solve time, function name, jax version, ...).
      structure: per top-level equation, a one-line description (for mismatch messages).
      as_written: the function runs as the user wrote it, its own `jax.checkpoint` calls
        included (the plan when that already fits the budget); regions and scans are empty.
      user_checkpoints: which of the user's own `jax.checkpoint` calls the plan keeps, as
        indices into the traced function's `user_regions`: each is a `jax.checkpoint` with the
        user's policy again, inside the region it lies in (how a person keeps the checkpoint
        they wrote in a layer when they put a policy around the layer).  The others are inlined:
        what their equations keep is the plan's to decide.
    """

    fingerprint: str
    n_eqns: int
    regions: tuple[Region, ...] = ()
    scans: tuple[ScanPlan, ...] = ()
    values: Mapping[str, ValueRecord] = field(default_factory=dict)
    argnums: tuple[int, ...] = (0,)
    static_argnums: tuple[int, ...] = ()
    has_aux: bool = False
    predicted_peak: int | None = None
    budget: int | None = None
    estimated_extra_time: float | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    structure: tuple[str, ...] = ()
    as_written: bool = False
    user_checkpoints: tuple[int, ...] = ()

    def __post_init__(self):
        if self.as_written and (self.regions or self.scans):
            raise PlanFormatError("a plan that runs the function as written has no regions or scan plans")
        if any(k < 0 for k in self.user_checkpoints) or len(set(self.user_checkpoints)) < len(self.user_checkpoints):
            raise PlanFormatError(f"user_checkpoints {list(self.user_checkpoints)} has a negative or repeated index")
        prev = 0
        for r in self.regions:
            if r.start < prev:
                raise PlanFormatError(f"regions overlap or are out of order at [{r.start}, {r.stop})")
            if r.stop > self.n_eqns:
                raise PlanFormatError(
                    f"region [{r.start}, {r.stop}) goes past the function's {self.n_eqns} equations")
            prev = r.stop

    # -- queries ---------------------------------------------------------------------
    def decision(self, value_id: str) -> str | None:
        rec = self.values.get(value_id)
        return rec.decision if rec else None

    def all_regions(self):
        """Every region, nested ones after their parent."""
        return _walk(self.regions)

    def scans_in_regions(self) -> bool:
        """Whether a top-level scan's body plan lies inside one of the regions (a checkpoint in a
        checkpoint: a recurrent layer and its cell)."""
        return any("/" not in s.op and any(r.start <= int(s.op[1:]) < r.stop for r in self.regions)
                   for s in self.scans)

    def leaves_alone(self, start: int, stop: int) -> bool:
        """Whether no region starts and no scan plan lies in top-level equations `[start, stop)`
        (a layer the plan leaves as written)."""
        return not any(start <= r.start < stop for r in self.regions) and not any(
            "/" not in s.op and start <= int(s.op[1:]) < stop for s in self.scans)

    def names(self) -> tuple[list[str], list[str]]:
        """(saved names, offloaded names) over all regions and scan bodies."""
        saved, off = set(), set()
        for r in self.all_regions():
            saved |= set(checkpoint_names(self.values, r.saved).values())
            off |= set(checkpoint_names(self.values, r.offloaded).values())
        for s in self.scans:
            saved |= set(checkpoint_names(self.values, s.saved).values())
            off |= set(checkpoint_names(self.values, s.offloaded).values())
        return sorted(saved), sorted(off)

    def totals(self) -> dict[str, int]:
        """Bytes by decision (times trip counts for scan bodies)."""
        out = {"save": 0, "offload": 0, "recompute": 0}
        for rec in self.values.values():
            out[rec.decision] = out.get(rec.decision, 0) + rec.nbytes * rec.multiplicity
        return out

    def summary(self, max_rows: int = 40, *, verbose: bool = False) -> str:
        """The plan per layer, in the model's words, with totals; `verbose` adds the checkpoint
        regions and the per-value table (at most `max_rows` rows)."""
        from autoremat.runtime._report import plan_summary
        return plan_summary(self, max_rows=max_rows, verbose=verbose)

    def to_python(self, framework: str = "jax") -> str:
        """Python code (no autoremat import) that realizes this plan in a training script: a
        policy per layer in `framework`'s form ("jax", "flax-nnx", "flax-linen", "equinox")
        when the plan is one, else `checkpoint_name` tags and a name-based policy."""
        from autoremat.runtime._export import plan_to_python
        return plan_to_python(self, framework)

    # -- serialization ---------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": _FORMAT,
            "version": SCHEMA_VERSION,
            "fingerprint": self.fingerprint,
            "n_eqns": self.n_eqns,
            "regions": [r.to_json() for r in self.regions],
            "scans": [s.to_json() for s in self.scans],
            "values": [asdict(v) for v in self.values.values()],
            "argnums": list(self.argnums),
            "static_argnums": list(self.static_argnums),
            "has_aux": self.has_aux,
            "predicted_peak": self.predicted_peak,
            "budget": self.budget,
            "estimated_extra_time": self.estimated_extra_time,
            "meta": _jsonable(dict(self.meta)),
            "structure": list(self.structure),
            "as_written": self.as_written,
            "user_checkpoints": list(self.user_checkpoints),
        }

    @classmethod
    def from_json(cls, d: Any, *, source: str = "plan") -> "Plan":
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise PlanFormatError(
                f"{source} is not an autoremat plan (missing \"format\": \"{_FORMAT}\"); "
                f"create one with autoremat.optimize(...).plan(...).save(path) or `autoremat search`")
        version = d.get("version")
        if version != SCHEMA_VERSION:
            raise PlanFormatError(
                f"{source} has plan schema version {version!r}; this autoremat reads version "
                f"{SCHEMA_VERSION}. Re-run the search with this version")
        try:
            values = {}
            for v in d.get("values", []):
                rec = ValueRecord(**v)
                if rec.decision not in ("save", "offload", "recompute"):
                    raise PlanFormatError(f"value {rec.id} has unknown decision {rec.decision!r}")
                values[rec.id] = rec
            return cls(
                fingerprint=str(d["fingerprint"]), n_eqns=int(d["n_eqns"]),
                regions=tuple(Region.from_json(r) for r in d.get("regions", [])),
                scans=tuple(ScanPlan.from_json(s) for s in d.get("scans", [])),
                values=values, argnums=tuple(d.get("argnums", [0])),
                static_argnums=tuple(d.get("static_argnums", [])), has_aux=bool(d.get("has_aux", False)),
                predicted_peak=d.get("predicted_peak"), budget=d.get("budget"),
                estimated_extra_time=d.get("estimated_extra_time"), meta=d.get("meta", {}),
                structure=tuple(d.get("structure", [])), as_written=bool(d.get("as_written", False)),
                user_checkpoints=tuple(int(k) for k in d.get("user_checkpoints", [])))
        except PlanFormatError as e:  # a region or value the constructors reject: say where
            raise PlanFormatError(f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise PlanFormatError(f"{source} is a corrupt autoremat plan: {type(e).__name__}: {e}") from e

    def save(self, path: str | os.PathLike) -> None:
        """Writes the plan as JSON."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        """Reads a plan written by `save`; a corrupt or foreign file raises PlanFormatError."""
        try:
            with open(path) as f:
                d = json.load(f)
        except FileNotFoundError:
            raise PlanFormatError(f"plan file {os.fspath(path)!r} does not exist") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PlanFormatError(f"plan file {os.fspath(path)!r} is not valid JSON ({e})") from e
        return cls.from_json(d, source=f"plan file {os.fspath(path)!r}")


# The `jax.checkpoint_policies` a plan may name (those taking no arguments).
POLICY_NAMES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable", "everything_saveable",
                "checkpoint_dots", "checkpoint_dots_with_no_batch_dims")


def _check_policy(policy: str, where: str) -> None:
    if policy and policy not in POLICY_NAMES:
        raise PlanFormatError(f"{where} names an unknown JAX policy {policy!r}; one of {', '.join(POLICY_NAMES)}")


def _walk(regions):
    for r in regions:
        yield r
        yield from _walk(r.children)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)

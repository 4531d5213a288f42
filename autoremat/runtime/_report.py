"""Readable text for plans: why this plan, what each layer keeps, totals (`--verbose`: the
regions and every value)."""

from __future__ import annotations

from tabulate import tabulate

from autoremat._units import format_bytes
from autoremat.runtime._by_layer import layer_rows

__all__ = ["plan_summary", "shard_map_lines", "user_checkpoint_lines"]


def plan_summary(plan, max_rows: int = 40, *, verbose: bool = False) -> str:
    """The plan in the model's words: why it was chosen, what each layer saves, offloads and
    recomputes, and totals; `verbose` adds the regions and the per-value table (internal ids)."""
    lines = _header(plan) + _why(plan) + [""] + _layer_table(plan)
    if verbose:
        lines += [""] + _regions(plan) + [""] + _value_table(plan, max_rows)
    totals = plan.totals()
    lines.append("totals: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in totals.items()))
    if not verbose:
        lines.append("(--verbose / summary(verbose=True): the checkpoint regions and every value)")
    return "\n".join(lines)


def _header(plan) -> list[str]:
    fn = plan.meta.get("function", "fn")
    lines = [f"autoremat plan for {fn}  (fingerprint {plan.fingerprint}, {plan.n_eqns} equations)"]
    if plan.budget is not None:
        lines.append(f"budget {format_bytes(plan.budget)}")
    if plan.predicted_peak is not None:
        lines.append(f"predicted peak {format_bytes(plan.predicted_peak)}")
    if "compiled_peak" in plan.meta:
        expected = plan.meta.get("expected_peak")
        lines.append(f"compiled peak {format_bytes(plan.meta['compiled_peak'])}" + (
            f" (the search expected {format_bytes(expected)} before compiling it)" if expected else ""))
    if plan.meta.get("baseline_peak"):
        lines.append(f"un-optimized compiled peak {format_bytes(plan.meta['baseline_peak'])}")
    lines += shard_map_lines(plan) + user_checkpoint_lines(plan)
    if plan.estimated_extra_time is not None:
        lines.append(f"estimated extra time {plan.estimated_extra_time * 1e3:.3f} ms per step "
                     f"(profile {plan.meta.get('profile', '?')})")
    return lines


def shard_map_lines(plan) -> list[str]:
    """Where the plan was made inside the function's shard_map (`graph.shard_map_body`)."""
    k = plan.meta.get("inside_shard_map")
    if k is None:
        return []
    return [f"planned inside the shard_map of {plan.meta.get('function', 'fn')} (its equation {k}), which holds every "
            f"matmul: the layers, equations and bytes are its body's, per device"]


def user_checkpoint_lines(plan) -> list[str]:
    """What the plan does with the function's own jax.checkpoint calls (`meta["user_checkpoints"]`):
    how many it keeps as written, and where those it replaces are."""
    info = plan.meta.get("user_checkpoints")
    if not info or plan.as_written:
        return []
    total, replaced = int(info["total"]), list(info["replaced"])
    if not replaced:
        return [f"your own jax.checkpoint calls: all {total} kept as you wrote them"]
    lines = [f"your own jax.checkpoint calls: {total - len(replaced)} of {total} kept as you wrote them; the plan "
             f"decides what the code of the other {len(replaced)} keeps (remove them where you apply it by hand):"]
    where = sorted(set(replaced))
    lines += [f"  {w}" + (f" (x{replaced.count(w)})" if replaced.count(w) > 1 else "") for w in where[:8]]
    if len(where) > 8:
        lines.append(f"  ... {len(where) - 8} more places")
    return lines


def _layer_table(plan) -> list[str]:
    """Per layer (identical neighbours merged): its code, bytes per decision, the user's
    names it keeps and recomputes, the FLOPs of the values it recomputes."""
    if plan.as_written:
        return ["the function runs as written (its own jax.checkpoint calls included): nothing to change"]
    table = []
    for row in layer_rows(plan):
        names = "; ".join(f"{verb} {', '.join(sorted(row.names[d]))}" for d, verb in
                          (("save", "keeps"), ("offload", "offloads"), ("recompute", "recomputes"))
                          if row.names[d])
        table.append([row.layers, row.where, format_bytes(row.bytes["save"]), format_bytes(row.bytes["offload"]),
                      format_bytes(row.bytes["recompute"]),
                      "?" if row.recompute_flops is None else f"{row.recompute_flops / 1e9:.3g}",
                      "?" if row.recompute_time is None else f"{row.recompute_time * 1e3:.3g}", names])
    head = ["layers", "code", "saved", "offloaded", "recomputed", "GFLOP", "ms", "your checkpoint_names"]
    profile = plan.meta.get("profile", "the device profile")
    return [f"per layer (one layer's figures; a scan's body: the whole stack; GFLOP and ms: what the backward "
            f"pass re-runs, by autoremat's cost model on {profile}):",
            tabulate(table, head, colalign=("left", "left", "right", "right", "right", "right", "right", "left"),
                     disable_numparse=True)]


def _regions(plan) -> list[str]:
    lines = [f"regions: {len(plan.regions)}  scan bodies: {len(plan.scans)}"]
    for r in plan.regions:
        what = f"jax.checkpoint(policy={r.policy})" if r.policy else f"{len(r.saved)} saved, {len(r.offloaded)} offloaded"
        lines.append(f"  checkpoint eqns [{r.start}, {r.stop}): {what}" + (f"  ({r.label})" if r.label else ""))
    for s in plan.scans:
        what = (f"jax.checkpoint(policy={s.policy}, prevent_cse={s.prevent_cse})" if s.policy
                else f"{len(s.saved)} saved, {len(s.offloaded)} offloaded")
        lines.append(f"  scan {s.op}: body checkpointed, {what}")
    return lines


def _value_table(plan, max_rows: int) -> list[str]:
    rows = sorted(plan.values.values(), key=lambda r: (-r.nbytes * r.multiplicity, r.id))
    table = [[r.id, r.decision, r.type, format_bytes(r.nbytes * r.multiplicity), r.primitive, r.name or "",
              r.source] for r in rows[:max_rows]]
    lines = [tabulate(table, ["value", "decision", "type", "bytes", "primitive", "name", "source"],
                      colalign=("left", "left", "left", "right", "left", "left", "left"))]
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more values")
    return lines


def _why(plan) -> list[str]:
    """Why this plan: how it was found, and the hand-written plans compiled beside it, each
    with its compiled peak and the FLOPs it recomputes (what the plan beat, measured)."""
    lines = []
    if plan.meta.get("found_by"):
        extra, mm = plan.meta.get("extra_flops"), plan.meta.get("extra_matmul_flops")
        lines.append(f"found by: {plan.meta['found_by']}"
                     + (f"; recomputes {extra / 1e9:.4g} GFLOP per step" if extra is not None else "")
                     + (f" ({mm / 1e9:.4g} in matmuls)" if mm is not None else ""))
    cands = plan.meta.get("hand_candidates") or []
    if cands:
        budget = plan.budget
        lines.append("hand-written plans compiled for comparison (peak, extra GFLOP in all / in matmuls):")
        for c in sorted(cands, key=lambda c: c["compiled_peak"]):
            fits = "" if budget is None else ("  fits" if c["compiled_peak"] <= budget else "  over budget")
            lines.append(f"  {c['label']}: {format_bytes(c['compiled_peak'])}, +{c['extra_flops'] / 1e9:.4g} / "
                         f"+{c.get('extra_matmul_flops', 0.0) / 1e9:.4g}{fits}")
        if budget is not None and any(c["compiled_peak"] <= budget for c in cands):
            lines.append("  (policies leaner than one that fits are not compiled: they save less, so "
                         "recompute no less)")
    return lines

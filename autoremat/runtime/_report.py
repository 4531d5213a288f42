"""Readable text for plans: why this plan, the decision table with totals."""

from __future__ import annotations

from autoremat._units import format_bytes

__all__ = ["plan_summary"]


def plan_summary(plan, max_rows: int = 40) -> str:
    """A fixed-width table of a plan's decisions (largest values first) with totals."""
    lines = []
    fn = plan.meta.get("function", "fn")
    lines.append(f"autoremat plan for {fn}  (fingerprint {plan.fingerprint}, {plan.n_eqns} equations)")
    if plan.budget is not None:
        lines.append(f"budget {format_bytes(plan.budget)}")
    if plan.predicted_peak is not None:
        lines.append(f"predicted peak {format_bytes(plan.predicted_peak)}")
    if "compiled_peak" in plan.meta:
        lines.append(f"compiled peak {format_bytes(plan.meta['compiled_peak'])}")
    if plan.meta.get("baseline_peak"):
        lines.append(f"un-optimized compiled peak {format_bytes(plan.meta['baseline_peak'])}")
    if plan.estimated_extra_time is not None:
        lines.append(f"estimated extra time {plan.estimated_extra_time * 1e3:.3f} ms per step "
                     f"(profile {plan.meta.get('profile', '?')})")
    lines.extend(_why(plan))
    lines.append(f"regions: {len(plan.regions)}  scan bodies: {len(plan.scans)}")
    for r in plan.regions[:12]:
        what = f"jax.checkpoint(policy={r.policy})" if r.policy else f"{len(r.saved)} saved, {len(r.offloaded)} offloaded"
        lines.append(f"  checkpoint eqns [{r.start}, {r.stop}): {what}" + (f"  ({r.label})" if r.label else ""))
    if len(plan.regions) > 12:
        lines.append(f"  ... {len(plan.regions) - 12} more regions")
    for s in plan.scans:
        what = (f"jax.checkpoint(policy={s.policy}, prevent_cse={s.prevent_cse})" if s.policy
                else f"{len(s.saved)} saved, {len(s.offloaded)} offloaded")
        lines.append(f"  scan {s.op}: body checkpointed, {what}")
    rows = sorted(plan.values.values(), key=lambda r: (-r.nbytes * r.multiplicity, r.id))
    header = f"{'value':<18} {'decision':<9} {'type':<22} {'bytes':>11} {'primitive':<16} {'name':<12} source"
    lines.append("")
    lines.append(header)
    lines.append("-" * len(header))
    for r in rows[:max_rows]:
        b = format_bytes(r.nbytes * r.multiplicity)
        lines.append(f"{r.id:<18} {r.decision:<9} {r.type[:22]:<22} {b:>11} {r.primitive[:16]:<16} "
                     f"{(r.name or '')[:12]:<12} {r.source}")
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more values")
    totals = plan.totals()
    lines.append("-" * len(header))
    lines.append("totals: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in totals.items()))
    return "\n".join(lines)


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
    return lines

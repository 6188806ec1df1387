"""How a fit verdict reads on screen: the badge text, its colour role and the tooltip breakdown.

Pure functions over the planner's `MemoryPlan.to_dict()` (what `QuantEntry.fit` holds), so the
quant table and the model settings page say the same thing in the same words.

    >>> badge_text({"verdict": "partial", "gpu_layers": 20, "n_layers": 33})
    'Partial 20 of 33'

Sizes are written by `runtime.units.fmt_bytes`, as everywhere else ("3.00 GiB", "1.50 MiB").
"""

from __future__ import annotations

from typing import Any

from runtime.units import fmt_bytes

BADGES = {"full_gpu": "Full GPU", "cpu_only": "CPU only", "wont_fit": "Won't fit"}
# The palette attribute (app.theme.Palette) each verdict is drawn in.
BADGE_ROLE = {"full_gpu": "ok", "partial": "warn", "cpu_only": "accent", "wont_fit": "error_text"}


def badge_text(fit: dict[str, Any] | None) -> str:
    if not fit:
        return "Unknown"
    verdict = str(fit.get("verdict"))
    if verdict == "partial":
        return f"Partial {fit.get('gpu_layers', '?')} of {fit.get('n_layers', '?')}"
    return BADGES.get(verdict, verdict)


def badge_tooltip(fit: dict[str, Any] | None, error: str | None = None) -> str:
    """The breakdown behind a badge: weights, KV cache at the context and types planned,
    compute, the rest, and each device's need against its free memory."""
    if not fit:
        return (f"The fit could not be checked: {error}" if error
                else "The fit could not be checked.")
    kv_types = ""
    if fit.get("kv_types"):
        kv_types = f", {fit['kv_types']}"
    lines = [
        f"{badge_text(fit)} — {fmt_bytes(fit.get('total'))} in all",
        f"Weights: {fmt_bytes(fit.get('weights'))}",
        f"KV cache: {fmt_bytes(fit.get('kv'))} at {int(fit.get('n_ctx') or 0):,} tokens{kv_types}",
        f"Compute buffers: {fmt_bytes(fit.get('compute'))}",
    ]
    if fit.get("overhead"):
        lines.append(f"Other (runtime, vocabulary): {fmt_bytes(fit.get('overhead'))}")
    for dev in fit.get("devices") or ():
        need = dev.get("total", 0)
        lines.append(f"{dev.get('name') or dev.get('id')}: needs {fmt_bytes(need)} of "
                     f"{fmt_bytes(dev.get('free_bytes'))} free")
    if fit.get("max_context") is not None:
        lines.append(f"Largest context that fits: {int(fit['max_context']):,} tokens")
    lines.extend(str(n) for n in fit.get("notes") or ())
    return "\n".join(lines)

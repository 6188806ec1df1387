"""What to tell a user about a K/V cache type choice: memory, flash attention, and quality.

Memory per value follows from the type (q8_0 stores 32 values in 34 bytes, q4_0 in 18). The
quality notes are deliberately qualitative: Outrider's own measurements of each pair
(`outrider eval`, KL divergence against f16) go in docs/benchmarks.md, which this text points
to rather than quoting numbers measured on other models.

    >>> kv_note("q8_0", "q8_0", "auto")
    'K and V take 53% of the f16 size. A quantized V cache needs flash attention: ...'
"""

from __future__ import annotations

from runtime.settings import KV_CACHE_TYPES

QUALITY: dict[str, str] = {
    "f32": "full precision, twice the memory of f16 with no gain for inference",
    "f16": "the default: no loss",
    "bf16": "like f16, with a wider range and fewer mantissa bits",
    "q8_0": "close to f16 in practice",
    "q5_1": "a small loss",
    "q5_0": "a small loss",
    "q4_1": "a noticeable loss on long contexts",
    "q4_0": "a noticeable loss on long contexts; keys suffer more than values",
    "iq4_nl": "about q4_0's loss, slightly better on some models",
}
UNQUANTIZED = ("f32", "f16", "bf16")


def kv_note(type_k: str, type_v: str, flash_attn: str) -> str:
    """One paragraph: size against f16, what flash attention will do, the quality to expect."""
    size = (KV_CACHE_TYPES[type_k] + KV_CACHE_TYPES[type_v]) / (2 * KV_CACHE_TYPES["f16"])
    parts = [f"K and V take {size:.0%} of the f16 size."]
    if type_v not in UNQUANTIZED:
        if flash_attn == "off":
            parts.append("A quantized V cache needs flash attention, so it will be turned on "
                         "anyway (the setting says off).")
        else:
            parts.append("A quantized V cache needs flash attention: it will be on.")
    elif flash_attn == "off":
        parts.append("Without flash attention the attention scores need more compute memory "
                     "as the context grows.")
    if type_k == type_v:
        parts.append(f"Quality: {QUALITY.get(type_k, 'not measured')}.")
    else:
        parts.append(f"Quality: K {QUALITY.get(type_k, 'not measured')}; "
                     f"V {QUALITY.get(type_v, 'not measured')}.")
    parts.append("Measured numbers for this machine's models: docs/benchmarks.md "
                 "(outrider eval).")
    return " ".join(parts)

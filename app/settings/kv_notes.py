"""What to tell a user about a K/V cache type choice: memory, flash attention, and quality.

Memory per value follows from the type (q8_0 stores 32 values in 34 bytes, q4_0 in 18). For the
K/V pairs Outrider has measured (`outrider eval --kv-k … --kv-v …`, docs/benchmarks.md, "Quality
of quant levels and KV cache types") the note quotes the numbers and names the model they were
measured on; for the other types it stays qualitative.

    >>> kv_note("f16", "f16", "auto")
    'K and V take 100% of the f16 size. Quality: no loss (the default).'
    >>> kv_note("q8_0", "q8_0", "auto")
    'K and V take 53% of the f16 size. A quantized V cache needs flash attention: ... +0.08%...'
    >>> kv_note("q8_0", "f16", "on")
    'K and V take 77% of the f16 size. Quality (not measured): K close to f16 in practice; V no...'
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.settings.load import KV_CACHE_TYPES

QUALITY: dict[str, str] = {
    "f32": "full precision, twice the memory of f16 with no gain for inference",
    "f16": "no loss (the default)",
    "bf16": "like f16, with a wider range and fewer mantissa bits",
    "q8_0": "close to f16 in practice",
    "q5_1": "a small loss",
    "q5_0": "a small loss",
    "q4_1": "a noticeable loss on long contexts",
    "q4_0": "a noticeable loss; keys suffer more than values",
    "iq4_nl": "about q4_0's loss, slightly better on some models",
}
UNQUANTIZED = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class KvQuality:
    """One measured K/V pair against an f16 K and V cache on the same model and text."""

    ppl_change_pct: float  # perplexity change, %
    kld: float  # mean KL divergence of the next-token distributions
    same_top_pct: float  # how often the most likely next token stayed the same, %


# docs/benchmarks.md: SmolLM2-135M-Instruct, runtime/data/eval.txt, ctx 256, 12 chunks
# (1,524 scored tokens), CPU, against f16 K and V (PPL 22.039).
MEASURED_ON = "SmolLM2-135M-Instruct"
MEASURED: dict[tuple[str, str], KvQuality] = {
    ("q8_0", "q8_0"): KvQuality(0.08, 0.0002, 98.62),
    ("q4_0", "q4_0"): KvQuality(5.34, 0.0360, 88.19),
    ("q8_0", "q4_0"): KvQuality(0.94, 0.0045, 95.87),
}


def quality_note(type_k: str, type_v: str) -> str:
    """The measured numbers for this pair where there are some, else the types' character.

    >>> print(quality_note("q4_0", "q4_0"))  # doctest: +NORMALIZE_WHITESPACE
    Quality measured on SmolLM2-135M-Instruct against f16: perplexity +5.34%, KL divergence
    0.0360, same top token 88.2% of the time (one small model; others differ).
    >>> quality_note("q5_0", "q5_0")
    'Quality (not measured): a small loss.'
    """
    measured = MEASURED.get((type_k, type_v))
    if measured is not None:
        return (f"Quality measured on {MEASURED_ON} against f16: perplexity "
                f"{measured.ppl_change_pct:+.2f}%, KL divergence {measured.kld:.4f}, same top "
                f"token {measured.same_top_pct:.1f}% of the time (one small model; others "
                "differ).")
    unmeasured = "" if type_k in UNQUANTIZED and type_v in UNQUANTIZED else " (not measured)"
    if type_k == type_v:
        return f"Quality{unmeasured}: {QUALITY.get(type_k, 'not known')}."
    return (f"Quality{unmeasured}: K {QUALITY.get(type_k, 'not known')}; "
            f"V {QUALITY.get(type_v, 'not known')}.")


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
    parts.append(quality_note(type_k, type_v))
    if type_k not in UNQUANTIZED or type_v not in UNQUANTIZED:
        parts.append("Measure your own model with `outrider eval --kv-k … --kv-v …`.")
    return " ".join(parts)

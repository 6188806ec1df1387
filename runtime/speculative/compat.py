"""Can this draft model speculate for that target? The checks llama.cpp makes, with reasons.

A draft proposes token *ids*; the target judges them as its own ids. So both must tokenize
alike and mean the same thing by the same id. llama.cpp (common/speculative.cpp,
`common_speculative_are_compatible`) requires: the same vocabulary type; the same add-BOS
and add-EOS flags and, where a token is added, the same id; vocabulary sizes within 128;
identical token text from id 5 on (up to the smaller size). It skips ids 0-4, where
converters put their own special tokens; so Outrider adds one check there: the target's BOS
and EOS ids must name the same token text in the draft. A draft whose specials differ
(`<s>` where the target has `<|endoftext|>`) would otherwise pass.

    >>> byte_tokens = tuple(bytes([b]) for b in range(256))
    >>> target = TokenizerFacts("bpe", bos_id=0, eos_id=0, add_bos=False, add_eos=False,
    ...                         tokens=(b"<|endoftext|>", *byte_tokens))
    >>> check_draft_compat(target, target)
    []
    >>> draft = TokenizerFacts("bpe", 0, 0, False, False, (b"<s>", *byte_tokens))
    >>> check_draft_compat(target, draft)  # doctest: +NORMALIZE_WHITESPACE
    ["the target's BOS token '<|endoftext|>' (id 0) is '<s>' in the draft",
     "the target's EOS token '<|endoftext|>' (id 0) is '<s>' in the draft"]

A model file's facts come from `runtime.gguf.vocab.read_tokenizer_facts`, the one reader of
a vocabulary; for the tiny test models and the default model (SmolLM2-135M):

    facts = read_tokenizer_facts
    check_draft_compat(facts(tiny_target), facts(tiny_draft))
    # []
    check_draft_compat(facts(smollm2_135m), facts(tiny_target))
    # ['vocabulary sizes differ by 48,881 tokens (target 49,152, draft 271; at most 128)',
    #  "token 5 differs (target '<file_sep>', draft 'Ă')"]
"""

from __future__ import annotations

from runtime.gguf.vocab import TokenizerFacts

MAX_VOCAB_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_TOKEN_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID


def vocab_size_refusal(n_target: int, n_draft: int) -> str | None:
    """The reason two vocabulary sizes are too far apart to draft, or None if they are not.

    Needs only the two counts (a library scan has them), so a caller can refuse a hopeless
    pair before reading either token list:

        >>> vocab_size_refusal(49_152, 271)
        'vocabulary sizes differ by 48,881 tokens (target 49,152, draft 271; at most 128)'
    """
    diff = abs(n_target - n_draft)
    if diff <= MAX_VOCAB_SIZE_DIFFERENCE:
        return None
    return (f"vocabulary sizes differ by {diff:,} tokens (target {n_target:,}, "
            f"draft {n_draft:,}; at most {MAX_VOCAB_SIZE_DIFFERENCE})")


def check_draft_compat(target: TokenizerFacts, draft: TokenizerFacts) -> list[str]:
    """Reasons the draft cannot speculate for the target; an empty list means it can."""
    reasons: list[str] = []
    if target.vocab_type != draft.vocab_type:
        reasons.append(f"vocabulary types differ (target {target.vocab_type}, "
                       f"draft {draft.vocab_type})")
    for name, t_add, d_add, t_id, d_id in (
        ("BOS", target.add_bos, draft.add_bos, target.bos_id, draft.bos_id),
        ("EOS", target.add_eos, draft.add_eos, target.eos_id, draft.eos_id),
    ):
        if t_add != d_add:
            reasons.append(f"the target {'adds' if t_add else 'does not add'} {name} "
                           f"but the draft {'does' if d_add else 'does not'}")
        elif t_add and t_id != d_id:
            reasons.append(f"{name} ids differ (target {t_id}, draft {d_id})")
    size_refusal = vocab_size_refusal(target.n_vocab, draft.n_vocab)
    if size_refusal:
        reasons.append(size_refusal)
    common = min(target.n_vocab, draft.n_vocab)
    for i in range(CHECK_START_TOKEN_ID, common):
        if target.tokens[i] != draft.tokens[i]:
            reasons.append(f"token {i} differs (target {_show(target.tokens[i])}, "
                           f"draft {_show(draft.tokens[i])})")
            break
    for name, tid in (("BOS", target.bos_id), ("EOS", target.eos_id)):
        if tid is not None and tid < common and target.tokens[tid] != draft.tokens[tid]:
            reasons.append(f"the target's {name} token {_show(target.tokens[tid])} (id {tid}) "
                           f"is {_show(draft.tokens[tid])} in the draft")
    return reasons


def _show(token: bytes) -> str:
    return repr(token.decode("utf-8", errors="replace"))

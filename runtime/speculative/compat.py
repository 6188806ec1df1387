"""Can this draft model speculate for that target? The checks llama.cpp makes, with reasons.

A draft proposes token *ids*; the target judges them as its own ids. So both must tokenize
alike and mean the same thing by the same id. llama.cpp (common/speculative.cpp,
`common_speculative_are_compatible`) requires: the same vocabulary type; the same add-BOS
and add-EOS flags and, where a token is added, the same id; vocabulary sizes within 128;
identical token text from id 5 on (up to the smaller size). It skips ids 0-4, where
converters put their own special tokens; so Outrider adds one check there: the target's BOS
and EOS ids must name the same token text in the draft. A draft whose specials differ
(`<s>` where the target has `<|endoftext|>`) would otherwise pass.

    >>> facts = TokenizerFacts.from_gguf
    >>> check_draft_compat(facts(tiny_target), facts(tiny_draft))
    []
    >>> check_draft_compat(facts(smollm2_135m), facts(tiny_target))
    ['vocabulary sizes differ by 48,881 tokens (target 49,152, draft 271; at most 128)',
     "token 5 differs (target '<file_sep>', draft 'Ă')"]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.errors import ModelFileError, ModelNotFound, NotAGGUF

MAX_VOCAB_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_TOKEN_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID

# tokenizer.ggml.model → llama.cpp's vocabulary type and its default special tokens
# (src/llama-vocab.cpp, llama_vocab::impl::load): type, bos, eos, add_bos, add_eos.
_VOCAB_DEFAULTS: dict[str, tuple[str, int | None, int | None, bool, bool]] = {
    "no_vocab": ("none", None, None, False, False),
    "none": ("none", None, None, False, False),
    "llama": ("spm", 1, 2, True, False),
    "bert": ("wpm", 101, None, True, False),
    "gpt2": ("bpe", 11, 11, False, False),
    "hybriddna": ("bpe", 11, 11, False, False),
    "whitespace": ("bpe", 11, 11, False, False),
    "gemma4": ("bpe", 11, 11, True, False),
    "t5": ("ugm", None, 1, False, True),
    "rwkv": ("rwkv", None, None, False, False),
    "plamo2": ("plamo2", 1, 2, False, False),
}
# BPE pre-tokenizers for which llama.cpp turns add_bos on by default.
_BPE_PRE_ADD_BOS = frozenset({
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
    "jina-v5-nano", "tekken", "chameleon",
})


@dataclass(frozen=True)
class TokenizerFacts:
    """What the compatibility check needs from a model's tokenizer (its GGUF header).

    `vocab_type` is llama.cpp's ("spm", "bpe", "wpm", "ugm", ...); ids are None where the
    model has no such token; `tokens` is each token's text as stored (bytes, compared as
    llama.cpp compares them, byte for byte)."""

    vocab_type: str
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    tokens: tuple[bytes, ...]

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_gguf(cls, path: Path | str) -> TokenizerFacts:
        """Read the tokenizer facts from a GGUF file's header, with llama.cpp's defaults
        for keys the file leaves out."""
        import gguf  # the reader pulls in a lot; only pay for it when a check runs

        path = Path(path)
        if not path.is_file():
            raise ModelNotFound(f"no model file at {path}")
        try:
            reader = gguf.GGUFReader(str(path))
        except (ValueError, OSError) as exc:
            raise NotAGGUF(f"{path.name} is not a readable GGUF model ({exc})") from None

        def field(key: str) -> gguf.ReaderField | None:
            return reader.fields.get(key)

        model_field = field("tokenizer.ggml.model")
        tokens_field = field("tokenizer.ggml.tokens")
        if model_field is None or tokens_field is None:
            raise ModelFileError(f"{path.name} has no tokenizer, so it cannot draft")
        model = str(model_field.contents())
        pre_field = field("tokenizer.ggml.pre")
        pre = str(pre_field.contents()) if pre_field is not None else ""
        vocab_type, bos, eos, add_bos, add_eos = _VOCAB_DEFAULTS.get(
            model, (model, None, None, False, False))
        if vocab_type == "bpe" and pre in _BPE_PRE_ADD_BOS:
            add_bos = True
        tokens = tuple(tokens_field.parts[i].tobytes() for i in tokens_field.data)
        n = len(tokens)
        # A default id outside the vocabulary is disabled, as llama.cpp does; so is a bad key.
        bos = bos if bos is not None and bos < n else None
        eos = eos if eos is not None and eos < n else None
        for key, current in (("bos", bos), ("eos", eos)):
            f = field(f"tokenizer.ggml.{key}_token_id")
            value = int(f.contents()) if f is not None else None
            chosen = value if value is not None and 0 <= value < n else current
            if key == "bos":
                bos = chosen
            else:
                eos = chosen
        f = field("tokenizer.ggml.add_bos_token")
        add_bos = bool(f.contents()) if f is not None else add_bos
        f = field("tokenizer.ggml.add_eos_token")
        add_eos = bool(f.contents()) if f is not None else add_eos
        return cls(vocab_type=vocab_type, bos_id=bos, eos_id=eos, add_bos=add_bos,
                   add_eos=add_eos, tokens=tokens)


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
    diff = abs(target.n_vocab - draft.n_vocab)
    if diff > MAX_VOCAB_SIZE_DIFFERENCE:
        reasons.append(f"vocabulary sizes differ by {diff:,} tokens (target "
                       f"{target.n_vocab:,}, draft {draft.n_vocab:,}; at most "
                       f"{MAX_VOCAB_SIZE_DIFFERENCE})")
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

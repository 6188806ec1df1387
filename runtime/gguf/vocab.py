"""A model's vocabulary, read from its GGUF header: the one place that reads `tokenizer.ggml.*`.

Two views, for two kinds of reader:

- `Vocabulary`: what the file says, as it says it (None where a key is absent), plus where
  the token list lies and its fingerprint. Reading it costs nothing beyond the header, so
  `ModelInfo` is built from it and a library scan keeps its token count.
- `TokenizerFacts`: what llama.cpp makes of it (src/llama-vocab.cpp, `llama_vocab::impl::load`):
  the vocabulary type, the special tokens with the defaults filled in, and every token's
  bytes. The draft check (`runtime.speculative.compat`) compares these; reading them costs
  the token list, a few MB for a 150k-token vocabulary.

    vocab = header_vocabulary(read_local_header(Path("SmolLM2-135M-Instruct.Q4_1.gguf")))
    vocab.model, vocab.pre, vocab.n_tokens, vocab.bos_id, vocab.add_eos
    # ('gpt2', 'smollm', 49152, 1, None)
    facts = read_tokenizer_facts(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    facts.vocab_type, facts.add_eos, facts.tokens[5]   # "gpt2" is llama.cpp's BPE
    # ('bpe', False, b'<file_sep>')

Why not `gguf.GGUFReader` for the token list: it builds a numpy object per token (seconds
for 150k tokens) and maps the tensor data too; the header parser keeps the list as a byte
span and this module splits it once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.errors import ModelFileError
from runtime.gguf.header import GGUFHeader, LazyArray, metadata_value, read_local_header

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
# tokenizer.ggml.model values llama.cpp knows; any other is "unknown tokenizer".
KNOWN_TOKENIZERS = frozenset(_VOCAB_DEFAULTS)
# BPE pre-tokenizers for which llama.cpp turns add_bos on by default.
_BPE_PRE_ADD_BOS = frozenset({
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
    "jina-v5-nano", "tekken", "chameleon",
})


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer keys of a header as the file states them; None where it does not.

    `tokens` and `token_types` are where those arrays lie in the file (None without them):
    decode them with `read_span` when a check needs the text.
    """

    model: str | None  # tokenizer.ggml.model: "llama", "gpt2", "t5", ...
    pre: str | None  # tokenizer.ggml.pre: the BPE pre-tokenizer, "llama3", "qwen2", ...
    bos_id: int | None
    eos_id: int | None
    add_bos: bool | None  # None: llama.cpp picks per tokenizer (see TokenizerFacts)
    add_eos: bool | None
    tokens: LazyArray | None
    token_types: LazyArray | None

    @property
    def n_tokens(self) -> int:
        return self.tokens.count if self.tokens else 0

    @property
    def fingerprint(self) -> str:
        """A sha256 prefix of the raw token list: equal fingerprints, equal tokens."""
        return self.tokens.digest if self.tokens else ""


def header_vocabulary(header: GGUFHeader) -> Vocabulary:
    """The vocabulary a parsed header describes (for a split model, the first part's)."""
    kv = header.kv
    return Vocabulary(
        model=metadata_value(kv, "tokenizer.ggml.model", str),
        pre=metadata_value(kv, "tokenizer.ggml.pre", str),
        bos_id=metadata_value(kv, "tokenizer.ggml.bos_token_id", int),
        eos_id=metadata_value(kv, "tokenizer.ggml.eos_token_id", int),
        add_bos=metadata_value(kv, "tokenizer.ggml.add_bos_token", bool),
        add_eos=metadata_value(kv, "tokenizer.ggml.add_eos_token", bool),
        tokens=header.arrays.get("tokenizer.ggml.tokens"),
        token_types=header.arrays.get("tokenizer.ggml.token_type"),
    )


def read_span(path: Path | str, span: LazyArray) -> bytes:
    """The bytes of `span` from a local file (one seek and one read)."""
    try:
        with open(path, "rb") as f:
            f.seek(span.start)
            return f.read(span.end - span.start)
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class TokenizerFacts:
    """What the compatibility check needs from a model's tokenizer.

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
        """Read the tokenizer facts from a local GGUF file (see `read_tokenizer_facts`)."""
        return read_tokenizer_facts(path)


def read_tokenizer_facts(path: Path | str) -> TokenizerFacts:
    """The tokenizer facts of a local GGUF file, with llama.cpp's defaults for keys the file
    leaves out. Typed errors: `ModelNotFound`, `NotAGGUF`, `ModelFileError` (no tokenizer)."""
    path = Path(path)
    vocab = header_vocabulary(read_local_header(path))
    if vocab.model is None or vocab.tokens is None:
        raise ModelFileError(f"{path.name} has no tokenizer, so it cannot draft")
    return tokenizer_facts(vocab, vocab.tokens.raw_strings(read_span(path, vocab.tokens)))


def tokenizer_facts(vocab: Vocabulary, tokens: tuple[bytes, ...]) -> TokenizerFacts:
    """Resolve `vocab` as llama.cpp does: the type's default specials and flags where the file
    says nothing, and an id outside the vocabulary disabled (a default) or ignored (a key)."""
    model = vocab.model or "none"
    vocab_type, bos, eos, add_bos, add_eos = _VOCAB_DEFAULTS.get(
        model, (model, None, None, False, False))
    if vocab_type == "bpe" and vocab.pre in _BPE_PRE_ADD_BOS:
        add_bos = True
    n = len(tokens)
    bos = _token_id(vocab.bos_id, bos if bos is not None and bos < n else None, n)
    eos = _token_id(vocab.eos_id, eos if eos is not None and eos < n else None, n)
    return TokenizerFacts(
        vocab_type=vocab_type, bos_id=bos, eos_id=eos,
        add_bos=add_bos if vocab.add_bos is None else vocab.add_bos,
        add_eos=add_eos if vocab.add_eos is None else vocab.add_eos, tokens=tokens)


def _token_id(stated: int | None, default: int | None, n_tokens: int) -> int | None:
    return stated if stated is not None and 0 <= stated < n_tokens else default

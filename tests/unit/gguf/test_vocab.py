"""The one vocabulary reader: tokenizer keys as stated, llama.cpp's resolved view, typed errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.errors import ModelFileError, ModelNotFound, NotAGGUF
from runtime.gguf.info import read_model_info
from runtime.gguf.preflight import read_local_header
from runtime.gguf.vocab import TokenizerFacts, header_vocabulary, read_span, read_tokenizer_facts
from runtime.speculative.compat import MAX_VOCAB_SIZE_DIFFERENCE, check_draft_compat
from tests.fixtures.vocab_gguf import BASE_TOKENS, write_vocab_gguf


def test_the_header_view_says_what_the_file_says(tmp_path: Path) -> None:
    path = write_vocab_gguf(tmp_path / "v.gguf", pre="qwen2", add_eos=None)
    vocab = header_vocabulary(read_local_header(path))
    assert (vocab.model, vocab.pre, vocab.bos_id, vocab.eos_id) == ("gpt2", "qwen2", 0, 2)
    assert (vocab.add_bos, vocab.add_eos) == (False, None)  # None: the file does not say
    assert vocab.n_tokens == len(BASE_TOKENS)
    assert vocab.tokens is not None and vocab.token_types is not None
    assert vocab.tokens.decode(read_span(path, vocab.tokens)) == BASE_TOKENS


def test_the_fingerprint_tells_token_lists_apart(tmp_path: Path) -> None:
    def fingerprint(name: str, tokens: tuple[str, ...]) -> str:
        path = write_vocab_gguf(tmp_path / name, tokens=tokens, bos_id=7)  # other keys differ
        return header_vocabulary(read_local_header(path)).fingerprint

    same = fingerprint("a.gguf", BASE_TOKENS)
    assert same == fingerprint("b.gguf", BASE_TOKENS) and len(same) == 16
    assert same != fingerprint("c.gguf", (*BASE_TOKENS[:-1], "other"))
    no_tokens = write_vocab_gguf(tmp_path / "none.gguf", tokens=None)
    vocab = header_vocabulary(read_local_header(no_tokens))
    assert (vocab.n_tokens, vocab.fingerprint, vocab.tokens) == (0, "", None)


def test_model_info_is_built_from_the_same_reader(tiny_target: Path) -> None:
    info = read_model_info(tiny_target)
    vocab = header_vocabulary(read_local_header(tiny_target))
    assert (info.tokenizer_model, info.tokenizer_pre, info.bos_id, info.eos_id) == (
        vocab.model, vocab.pre, vocab.bos_id, vocab.eos_id)
    assert (info.n_tokens, info.vocab_fingerprint) == (vocab.n_tokens, vocab.fingerprint)
    assert read_tokenizer_facts(tiny_target).n_vocab == info.n_tokens


def test_llama_cpp_defaults_fill_what_the_file_leaves_out(tmp_path: Path) -> None:
    spm = read_tokenizer_facts(write_vocab_gguf(
        tmp_path / "spm.gguf", model="llama", bos_id=None, eos_id=None, add_bos=None))
    assert (spm.vocab_type, spm.bos_id, spm.eos_id, spm.add_bos, spm.add_eos) == (
        "spm", 1, 2, True, False)
    # a BPE pre-tokenizer that llama.cpp gives a BOS; the file's own flag still wins
    llama3 = write_vocab_gguf(tmp_path / "l3.gguf", pre="llama-bpe", add_bos=None)
    assert read_tokenizer_facts(llama3).add_bos is True
    stated = write_vocab_gguf(tmp_path / "st.gguf", pre="llama-bpe", add_bos=False)
    assert read_tokenizer_facts(stated).add_bos is False


def test_ids_outside_the_vocabulary_are_not_used(tmp_path: Path) -> None:
    # gpt2's default BOS/EOS is id 11: outside a 5-token vocabulary it is disabled
    small = read_tokenizer_facts(write_vocab_gguf(
        tmp_path / "small.gguf", tokens=BASE_TOKENS[:5], bos_id=None, eos_id=None))
    assert (small.bos_id, small.eos_id) == (None, None)
    # a stated id outside the vocabulary is ignored: the default stands
    bad = read_tokenizer_facts(write_vocab_gguf(tmp_path / "bad.gguf", bos_id=5000))
    assert bad.bos_id == 11


def test_token_text_is_kept_byte_for_byte(tmp_path: Path) -> None:
    # half a UTF-8 character, then "▁the"
    tokens: tuple[str | bytes, ...] = (*BASE_TOKENS[:5], b"\xe2\x96", "\u2581the")
    facts = read_tokenizer_facts(write_vocab_gguf(tmp_path / "b.gguf", tokens=tokens))
    assert facts.tokens[5:] == (b"\xe2\x96", "\u2581the".encode())


def test_the_check_over_what_the_reader_read(tmp_path: Path) -> None:
    def facts(name: str, **keys: Any) -> TokenizerFacts:
        return read_tokenizer_facts(write_vocab_gguf(tmp_path / name, **keys))

    target = facts("target.gguf")
    assert check_draft_compat(target, facts("good.gguf")) == []
    assert check_draft_compat(target, facts("spm.gguf", model="llama")) == [
        "vocabulary types differ (target bpe, draft spm)"]
    longer = (*BASE_TOKENS, *(f"x{i}" for i in range(MAX_VOCAB_SIZE_DIFFERENCE + 1)))
    assert check_draft_compat(target, facts("long.gguf", tokens=longer)) == [
        "vocabulary sizes differ by 129 tokens (target 300, draft 429; at most 128)"]
    other = list(BASE_TOKENS)
    other[42] = "changed"
    assert check_draft_compat(target, facts("text.gguf", tokens=other)) == [
        "token 42 differs (target 'tok42', draft 'changed')"]


def test_unreadable_files_raise_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound):
        read_tokenizer_facts(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(NotAGGUF):
        read_tokenizer_facts(junk)
    with pytest.raises(ModelFileError, match="has no tokenizer"):
        read_tokenizer_facts(write_vocab_gguf(tmp_path / "bare.gguf", model=None))
    with pytest.raises(ModelFileError, match="has no tokenizer"):
        read_tokenizer_facts(write_vocab_gguf(tmp_path / "no-tokens.gguf", tokens=None))

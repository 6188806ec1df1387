"""Draft compatibility: llama.cpp's checks (plus the special-token one), with reasons."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from runtime.errors import ModelFileError, ModelNotFound, NotAGGUF
from runtime.gguf.vocab import TokenizerFacts
from runtime.speculative.compat import check_draft_compat


def test_tiny_draft_is_compatible_with_tiny_target(tiny_target: Path, tiny_draft: Path) -> None:
    target = TokenizerFacts.from_gguf(tiny_target)
    draft = TokenizerFacts.from_gguf(tiny_draft)
    assert target.vocab_type == "bpe" and target.n_vocab == 271
    assert (target.bos_id, target.eos_id, target.add_bos, target.add_eos) == (0, 2, False, False)
    assert check_draft_compat(target, draft) == []


def test_alien_draft_is_refused_with_reasons(tiny_target: Path, alien_draft: Path) -> None:
    # same ids from 5 on and sizes within 128 (llama.cpp itself would accept it), but its
    # special tokens mean something else: the target's EOS id is <unk> there
    reasons = check_draft_compat(TokenizerFacts.from_gguf(tiny_target),
                                 TokenizerFacts.from_gguf(alien_draft))
    assert reasons == [
        "the target's BOS token '<|endoftext|>' (id 0) is '<s>' in the draft",
        "the target's EOS token '<|im_end|>' (id 2) is '<unk>' in the draft",
    ]


@pytest.mark.e2e
def test_real_model_and_tiny_target_are_refused(default_model: Path, tiny_target: Path) -> None:
    real = TokenizerFacts.from_gguf(default_model)
    assert real.n_vocab == 49_152 and real.vocab_type == "bpe"
    reasons = check_draft_compat(real, TokenizerFacts.from_gguf(tiny_target))
    assert reasons[0] == ("vocabulary sizes differ by 48,881 tokens (target 49,152, "
                          "draft 271; at most 128)")
    assert reasons[1].startswith("token 5 differs")
    assert check_draft_compat(real, real) == []


def _facts(**changes: object) -> TokenizerFacts:
    base = TokenizerFacts(vocab_type="spm", bos_id=1, eos_id=2, add_bos=True, add_eos=False,
                          tokens=tuple(f"t{i}".encode() for i in range(300)))
    return replace(base, **changes)  # type: ignore[arg-type]


def test_each_rule_gives_its_reason() -> None:
    target = _facts()
    assert check_draft_compat(target, _facts()) == []
    assert check_draft_compat(target, _facts(vocab_type="bpe")) == [
        "vocabulary types differ (target spm, draft bpe)"]
    assert check_draft_compat(target, _facts(add_bos=False)) == [
        "the target adds BOS but the draft does not"]
    assert check_draft_compat(target, _facts(bos_id=0)) == ["BOS ids differ (target 1, draft 0)"]
    # EOS is not added, so its id is not compared (as llama.cpp); its text still is
    assert check_draft_compat(target, _facts(eos_id=7)) == []
    # sizes within 128 pass; the extra tokens are simply never compared
    longer = _facts(tokens=target.tokens + tuple(b"x%d" % i for i in range(128)))
    assert check_draft_compat(target, longer) == []
    much_longer = _facts(tokens=target.tokens + tuple(b"x%d" % i for i in range(129)))
    assert check_draft_compat(target, much_longer) == [
        "vocabulary sizes differ by 129 tokens (target 300, draft 429; at most 128)"]
    tokens = list(target.tokens)
    tokens[4] = b"other"  # ids 0-4 are skipped ...
    assert check_draft_compat(target, _facts(tokens=tuple(tokens))) == []
    tokens[250] = b"other"  # ... from 5 on the first difference is named
    assert check_draft_compat(target, _facts(tokens=tuple(tokens))) == [
        "token 250 differs (target 't250', draft 'other')"]


def test_unreadable_files_raise_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound):
        TokenizerFacts.from_gguf(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(NotAGGUF):
        TokenizerFacts.from_gguf(junk)
    assert issubclass(NotAGGUF, ModelFileError)

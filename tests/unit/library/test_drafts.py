"""The one draft pairing: reasons per pair, cheapest checks first, each tokenizer read once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.gguf.vocab import TokenizerFacts, read_tokenizer_facts
from runtime.library import drafts
from runtime.library.drafts import (
    NOT_SMALLER,
    DraftJudge,
    compatible_drafts,
    judge_drafts,
)
from runtime.library.library import Library, LibraryModel
from tests.fixtures.vocab_gguf import BASE_TOKENS, write_vocab_gguf


def model(path: Path, size: int, n_tokens: int | None = None, error: str | None = None
          ) -> LibraryModel:
    """A library entry as a scan describes it; only the tokenizer is in the file."""
    info = None if error else {"n_tokens": n_tokens}
    return LibraryModel(path, "library", size, 0.0, (path,), None, info, error)


def counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths whose tokenizer the pairing reads from now on, in order."""
    reads: list[Path] = []

    def counting(path: Path) -> TokenizerFacts:
        reads.append(path)
        return read_tokenizer_facts(path)

    monkeypatch.setattr(drafts, "read_tokenizer_facts", counting)
    return reads


@pytest.fixture
def target(tmp_path: Path) -> LibraryModel:
    return model(write_vocab_gguf(tmp_path / "target.gguf"), 1000, len(BASE_TOKENS))


def test_a_good_pair_can_draft(tmp_path: Path, target: LibraryModel) -> None:
    draft = model(write_vocab_gguf(tmp_path / "draft.gguf"), 100, len(BASE_TOKENS))
    assert DraftJudge().refusals(target, draft) == ()
    assert compatible_drafts(target, [target, draft]) == [draft]


def test_a_different_vocabulary_type_is_refused(tmp_path: Path, target: LibraryModel) -> None:
    spm = model(write_vocab_gguf(tmp_path / "spm.gguf", model="llama"), 100, len(BASE_TOKENS))
    assert DraftJudge().refusals(target, spm) == (
        "vocabulary types differ (target bpe, draft spm)",)


def test_sizes_too_far_apart_are_refused_without_reading_a_vocabulary(
        tmp_path: Path, target: LibraryModel, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = counting_reads(monkeypatch)
    far = model(tmp_path / "never-read.gguf", 100, len(BASE_TOKENS) + 129)
    assert DraftJudge().refusals(target, far) == (
        "vocabulary sizes differ by 129 tokens (target 300, draft 429; at most 128)",)
    assert reads == []
    near = len(BASE_TOKENS) + 128  # within the limit: the full check runs (and reads)
    tokens = (*BASE_TOKENS, *(f"x{i}" for i in range(128)))
    within = model(write_vocab_gguf(tmp_path / "near.gguf", tokens=tokens), 100, near)
    assert DraftJudge().refusals(target, within) == ()
    assert reads == [target.path, within.path]


def test_different_token_text_is_refused(tmp_path: Path, target: LibraryModel) -> None:
    tokens = list(BASE_TOKENS)
    tokens[7] = "seven"
    other = model(write_vocab_gguf(tmp_path / "other.gguf", tokens=tokens), 100, len(tokens))
    assert DraftJudge().refusals(target, other) == (
        "token 7 differs (target 'tok7', draft 'seven')",)


def test_cheap_refusals_come_first(tmp_path: Path, target: LibraryModel) -> None:
    judge = DraftJudge()
    same_size = model(write_vocab_gguf(tmp_path / "same.gguf"), 1000, len(BASE_TOKENS))
    assert judge.refusals(target, same_size) == (NOT_SMALLER,)
    broken = model(tmp_path / "broken.gguf", 10, error="it ends inside its header")
    assert judge.refusals(target, broken) == ("it cannot be read (it ends inside its header)",)
    assert judge.refusals(broken, target) == (
        "the model itself cannot be read (it ends inside its header)",)
    gone = model(tmp_path / "gone.gguf", 10, len(BASE_TOKENS))  # scanned, then deleted
    (reason,) = judge.refusals(target, gone)
    assert reason.startswith("no model file at")


def test_judge_reads_each_tokenizer_once_and_orders_the_verdicts(
        tmp_path: Path, target: LibraryModel, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = counting_reads(monkeypatch)
    small = model(write_vocab_gguf(tmp_path / "small.gguf"), 100, len(BASE_TOKENS))
    tiny = model(write_vocab_gguf(tmp_path / "tiny.gguf"), 50, len(BASE_TOKENS))
    alien = model(write_vocab_gguf(tmp_path / "alien.gguf", model="llama"), 10, len(BASE_TOKENS))
    judged = judge_drafts(target, [alien, small, target, tiny], DraftJudge().refusals)
    assert [(c.model.path.name, c.compatible) for c in judged] == [
        ("tiny.gguf", True), ("small.gguf", True), ("alien.gguf", False)]
    assert sorted(reads) == sorted([target.path, alien.path, small.path, tiny.path])


def test_refusals_can_be_supplied(target: LibraryModel, tmp_path: Path) -> None:
    other = model(tmp_path / "other.gguf", 10, len(BASE_TOKENS))
    asked: list[Any] = []

    def remembered(t: LibraryModel, d: LibraryModel) -> tuple[str, ...]:
        asked.append((t.path, d.path))
        return ("remembered",)

    assert [c.reasons for c in judge_drafts(target, [other], remembered)] == [("remembered",)]
    assert asked == [(target.path, other.path)]


def test_library_models_pair_by_their_vocabulary(tmp_path: Path, tiny_target: Path,
                                                 tiny_draft: Path, alien_draft: Path) -> None:
    lib = Library(tmp_path / "models", tmp_path / "cache")
    target, draft, alien = (lib.import_file(p, "link") for p in (tiny_target, tiny_draft,
                                                                 alien_draft))
    models = lib.scan()
    assert compatible_drafts(target, models) == [draft]
    assert DraftJudge().refusals(target, alien) == (
        "the target's BOS token '<|endoftext|>' (id 0) is '<s>' in the draft",
        "the target's EOS token '<|im_end|>' (id 2) is '<unk>' in the draft")

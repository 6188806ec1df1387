"""The mutation corpus (tests/fixtures/gguf_mutations.py) through preflight, `outrider info`
and llama.cpp: every file ends in its expected typed one-line error or a load, never a crash
or a traceback.

Only mutations that preflight accepts reach llama.cpp here, and each of those was first
loaded in a child process (loaded and decoded, or refused with an error, never an abort), so
none of them can take pytest down. A file whose outcome is unknown has no place in this
process: `expect` says what every file does.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from pathlib import Path

import llama_cpp.llama_cpp as L
import pytest

from runtime.cli.main import main as outrider
from runtime.errors import ModelFileError, shown
from runtime.gguf.preflight import check_gguf
from runtime.llama.binding import llama_log
from tests.fixtures.gguf_mutations import LOADS, Mutation, corpus

FAMILIES = ("truncate", "tail", "flip", "delete", "hparams", "tokens", "tokenizer_model",
            "special", "spm", "template", "type", "layout", "file_name")


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Mutation]:
    return corpus(tmp_path_factory.mktemp("corpus"))


def test_the_corpus_has_every_family_and_300_files(tiny_corpus: list[Mutation]) -> None:
    assert len(tiny_corpus) >= 300
    families = Counter(m.name.split("/")[1] for m in tiny_corpus if m.name != "tiny/base")
    assert set(FAMILIES) <= set(families), families
    assert all(m.expect == LOADS or m.expect.startswith(("refused: ", "llama.cpp refuses: "))
               for m in tiny_corpus)
    assert sum(m.refusal is not None for m in tiny_corpus) > 250


def test_the_corpus_is_deterministic(tiny_corpus: list[Mutation], tmp_path: Path) -> None:
    again = corpus(tmp_path)
    assert [(m.name, m.expect) for m in again] == [(m.name, m.expect) for m in tiny_corpus]
    assert [_digest(m.path) for m in again] == [_digest(m.path) for m in tiny_corpus]


def _digest(path: Path) -> tuple[int, str]:
    """Size and a hash of the first MiB: the 1 TiB sparse tails are never read whole."""
    with path.open("rb") as f:
        return path.stat().st_size, hashlib.sha256(f.read(1 << 20)).hexdigest()


def test_preflight_gives_every_mutation_its_outcome(tiny_corpus: list[Mutation]) -> None:
    assert _preflight_mismatches(tiny_corpus) == []


def _preflight_mismatches(mutations: list[Mutation]) -> list[str]:
    wrong = []
    for m in mutations:
        try:
            check_gguf(m.path)
            got = None
        except ModelFileError as exc:
            got = str(exc)
        if m.refusal is None and got is not None:
            wrong.append(f"{m.name}: refused ({got}), expected {m.expect}")
        elif m.refusal is not None and (got is None or m.refusal not in got):
            wrong.append(f"{m.name}: {got!r}, expected {m.expect}")
        elif got is not None and ("\n" in got or shown(m.path.name) not in got):
            wrong.append(f"{m.name}: not one line naming the file: {got!r}")
    return wrong


def test_outrider_info_answers_every_mutation_without_a_traceback(
        tiny_corpus: list[Mutation], capsys: pytest.CaptureFixture[str]) -> None:
    assert _info_mismatches(tiny_corpus, capsys) == []


def _info_mismatches(mutations: list[Mutation], capsys: pytest.CaptureFixture[str]) -> list[str]:
    wrong = []
    for m in mutations:
        code = outrider(["info", str(m.path)])
        err = capsys.readouterr().err
        if "Traceback" in err:
            wrong.append(f"{m.name}: traceback {err[-300:]!r}")
        elif m.refusal is None and code != 0:
            wrong.append(f"{m.name}: exit {code} ({err.strip()}), expected {m.expect}")
        elif m.refusal is not None and (code != 2 or m.refusal not in err
                                        or err.count("\n") != 1 or not err.startswith("error: ")):
            wrong.append(f"{m.name}: exit {code} {err!r}, expected {m.expect}")
    return wrong


def test_what_preflight_accepts_llama_cpp_loads_or_refuses_with_an_error(
        tiny_corpus: list[Mutation]) -> None:
    accepted = [m for m in tiny_corpus if m.refusal is None]
    outcomes = {m.name: _load_and_decode(m.path) for m in accepted}
    wrong = []
    for m in accepted:
        got = outcomes[m.name]
        if m.expect == LOADS and got != "decoded":
            wrong.append(f"{m.name}: {got}")
        elif m.expect != LOADS and m.expect.removeprefix("llama.cpp refuses: ") not in got:
            wrong.append(f"{m.name}: {got}, expected {m.expect}")
    assert wrong == []
    assert sum(m.expect == LOADS for m in accepted) >= 60


def _load_and_decode(path: Path) -> str:
    """'decoded' when llama.cpp loads `path` and computes finite logits for a short prompt;
    else what llama.cpp said. Straight through the C API, so nothing else (a chat template,
    the engine) takes part."""
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    with llama_log().capture() as captured:
        model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        return "refused: " + " ".join(line.strip() for line in captured if "error" in line)
    try:
        vocab = L.llama_model_get_vocab(model)
        text = "héllo 世界\n<|im_start|> x".encode()
        tokens = (L.llama_token * 64)()
        n = L.llama_tokenize(vocab, text, len(text), tokens, 64, True, True)
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
        cp.n_threads = cp.n_threads_batch = 1
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            return "no context"
        try:
            if n <= 0 or L.llama_decode(ctx, L.llama_batch_get_one(tokens, min(n, 8))) != 0:
                return f"decode failed ({n} tokens)"
            logits = L.llama_get_logits_ith(ctx, -1)
            n_vocab = L.llama_vocab_n_tokens(vocab)
            finite = all(math.isfinite(logits[i]) for i in range(n_vocab))
            return "decoded" if finite else "NaN logits"
        finally:
            L.llama_free(ctx)
    finally:
        L.llama_model_free(model)


@pytest.mark.e2e
def test_default_model_mutations(tmp_path: Path, default_model: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The tokenizer at scale (49,152 tokens) and the 1 TiB tail, on SmolLM2's own header."""
    mutations = [m for m in corpus(tmp_path, default_model) if m.name.startswith("default/")]
    assert len(mutations) >= 20
    assert _preflight_mismatches(mutations) == []
    assert _info_mismatches(mutations, capsys) == []

"""The mutation corpus (tests/fixtures/gguf_mutations.py, ≥ 300 broken or odd GGUFs) through
`outrider run`, in this very process: every file ends in a reply (exit 0) or one `error:` line
(exit 2) — no crash, no hang, no traceback.

`outrider run` builds its engine with the one factory (runtime.engine.build), so a file that
preflight accepts is loaded first in a probe child (runtime.engine.probe): a file that would
abort llama.cpp kills only that child. That is what lets this test load unknown files in the
pytest process at all; an abort that got past both would end the run here, loudly.
"""

from __future__ import annotations

from collections import Counter

import pytest

from runtime.cli.main import main as outrider
from tests.fixtures.gguf_mutations import LOADS, Mutation, corpus


@pytest.fixture(scope="module")
def mutations(tmp_path_factory: pytest.TempPathFactory) -> list[Mutation]:
    return corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.slow
def test_every_corpus_file_runs_or_says_why_in_one_line(
        mutations: list[Mutation], capfd: pytest.CaptureFixture[str]) -> None:
    assert len(mutations) >= 300
    wrong: list[str] = []
    outcomes: Counter[str] = Counter()
    for m in mutations:
        code = outrider(["run", str(m.path), "-p", "hi", "--max-tokens", "2", "--temp", "0",
                         "--ctx", "256", "--threads", "1"])
        out, err = capfd.readouterr()
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        if "Traceback" in err or "Traceback" in out:
            wrong.append(f"{m.name}: a traceback:\n{err[-2000:]}")
        elif code == 0:
            outcomes["ran"] += 1
            if m.expect != LOADS:
                wrong.append(f"{m.name}: ran, but it should be refused ({m.expect})")
        elif code == 2 and len(errors) == 1:
            outcomes["refused"] += 1
            if m.expect == LOADS and "crashed" not in errors[0]:
                # A file that loads may still fail at its first token (e.g. a template); that
                # is a one-line error too, but say which so a regression shows.
                outcomes["loads but run refused"] += 1
        else:
            wrong.append(f"{m.name}: exit {code}, {len(errors)} error lines:\n{err[-2000:]}")
    assert wrong == [], "\n".join(wrong[:10])
    assert outcomes["ran"] >= 50 and outcomes["refused"] >= 250, outcomes

"""The engine on the real default model (SmolLM2-135M-Instruct Q4_1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.cli.main import main
from runtime.engine.engine import Engine
from runtime.events import ChatMessage, Finished, GenerationRequest, SamplingParams, TokenEvent
from runtime.settings.load import LoadSettings

pytestmark = pytest.mark.e2e

QUESTION = (ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "What is the capital of France?"))


@pytest.fixture(scope="module")
def smol(default_model: Path) -> Iterator[Engine]:
    engine = Engine()
    engine.load(LoadSettings(model_path=default_model, n_ctx=1024, n_threads=2, n_parallel=2))
    yield engine
    engine.stop()


def answer(engine: Engine, request: GenerationRequest) -> tuple[str, Finished]:
    events = list(engine.submit(request).events(timeout=120))
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    done = events[-1]
    assert isinstance(done, Finished)
    return text, done


def test_knows_the_capital_of_france(smol: Engine) -> None:
    loaded = smol.loaded
    assert loaded is not None and loaded.quant == "Q4_1" and loaded.chat_template_source == "model"
    text, done = answer(smol, GenerationRequest(
        messages=QUESTION, sampling=SamplingParams(temperature=0, max_tokens=24)))
    assert "Paris" in text
    assert done.reason == "stop"
    assert done.timings.decode_tokens_per_s > 0


def test_two_concurrent_answers_match_running_alone(smol: Engine) -> None:
    sampling = SamplingParams(temperature=0, max_tokens=16)
    other = (ChatMessage("user", "Name three colors."),)
    alone = [answer(smol, GenerationRequest(messages=m, sampling=sampling))[0] for m in (QUESTION, other)]
    handles = [smol.submit(GenerationRequest(messages=m, sampling=sampling)) for m in (QUESTION, other)]
    together = ["".join(e.text for e in h.events(timeout=120) if isinstance(e, TokenEvent))
                for h in handles]
    assert together == alone


def test_outrider_run_prints_ttft_and_speed(default_model: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(default_model), "-p", "What is the capital of France?",
                 "--temp", "0", "--max-tokens", "24", "--threads", "2", "--ctx", "512"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "Paris" in out
    assert "TTFT" in err and "decode" in err and "tok/s" in err

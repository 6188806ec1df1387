"""Whether a reply starts inside the thinking block is the engine's to say, with the
admission (`ReasoningOpen`): only it renders the prompt. It also picks the constraint that
fits (`ConstraintSpec.in_reasoning`), so a forced call of a thinking model may think first."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.engine.engine import Engine
from runtime.events import (
    ChatMessage,
    ConstraintSpec,
    Finished,
    GenerationRequest,
    ReasoningOpen,
    SamplingParams,
    TokenEvent,
)
from tests.engine.conftest import tiny_settings
from tests.engine.test_prompt import THINKING_TEMPLATE
from tests.fixtures.tiny_gguf import CHATML_TEMPLATE, TinySpec, write_tiny_gguf

# Free text, or (the prompt opened the thinking block) one fixed letter: which one the
# engine used shows in the reply.
SPEC = ConstraintSpec("gbnf", 'root ::= "a" "a"',
                      in_reasoning=ConstraintSpec("gbnf", 'root ::= "b" "b"'))


@pytest.mark.parametrize(("template", "opened"), [(THINKING_TEMPLATE, True),
                                                  (CHATML_TEMPLATE, False)])
def test_the_admission_says_whether_the_reply_starts_as_thinking(
        engine: Engine, tmp_path: Path, template: str, opened: bool) -> None:
    model = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(chat_template=template, name="m"))
    loaded = engine.load(tiny_settings(model))
    assert loaded.family.reasoning == ("think" if opened else "none")
    request = GenerationRequest(messages=(ChatMessage("user", "Hi"),), constraint=SPEC,
                                sampling=SamplingParams(temperature=0.0, max_tokens=8))
    events = list(engine.submit(request).events(timeout=60))
    assert isinstance(events[-1], Finished), events[-1]
    assert (ReasoningOpen(request.id) in events) == opened
    if opened:
        assert events[0] == ReasoningOpen(request.id)  # before the first token
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert text == ("bb" if opened else "aa")
    raw = GenerationRequest(prompt="<think>\n", sampling=SamplingParams(max_tokens=2))
    assert not any(isinstance(e, ReasoningOpen) for e in engine.submit(raw).events(timeout=60))

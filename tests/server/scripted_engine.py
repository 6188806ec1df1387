"""An engine that answers with given text, for tests of how the server reads and shapes replies
(tool calls, thinking, logprobs) without a model that would have to write them.

    engine = ScriptedEngine(replies=['<tool_call>{"name": "f", "arguments": {}}</tool_call>'])
    engine.start(); engine.load(LoadSettings(model_path=gguf))
    # every request now gets that reply, two characters per token, and
    # engine.requests holds what the server asked for

Each token carries a logprob (−0.5 × its position in the reply, so tests can tell them apart)
and `request.logprobs` top tokens when asked. `family` is the template family the test picks
(`LoadedModel.family` and `capabilities` follow from it); `prompt` is the rendered prompt's
end, from which the family decides whether the reply starts inside a thinking block (said,
as the engine says it, with the admission).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from runtime.chat.families import PLAIN, Family, capabilities
from runtime.chat.reply import starts_in_reasoning
from runtime.engine.api import LoadedModel
from runtime.events import (
    Finished,
    GenerationRequest,
    ReasoningOpen,
    Timings,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from runtime.settings.load import LoadSettings
from tests.server.fake_engine import FakeEngine, FakeHandle

TOKEN_CHARS = 2


class ScriptedEngine(FakeEngine):
    def __init__(self, replies: list[str] | None = None, *, family: Family = PLAIN,
                 prompt: str = "<|im_start|>assistant\n", reason: str = "stop") -> None:
        super().__init__()
        self.replies = list(replies or ["Hello there."])
        self.family = family
        self.prompt = prompt
        self.reason = reason
        self.requests: list[GenerationRequest] = []

    def load(self, settings: LoadSettings,
             on_progress: Callable[[float], None] | None = None) -> LoadedModel:
        model = super().load(settings, on_progress)
        self.model = dataclasses.replace(model, family=self.family,
                                         capabilities=capabilities(self.family))
        return self.model

    @property
    def family(self) -> Family:
        return self._family

    @family.setter
    def family(self, family: Family) -> None:
        """A test that picks another family after the load changes the loaded model's facts
        in place, as if the model had been loaded with that template (the router holds the
        `LoadedModel` the load returned)."""
        self._family = family
        if getattr(self, "model", None) is not None:
            object.__setattr__(self.model, "family", family)
            object.__setattr__(self.model, "capabilities", capabilities(family))

    def submit(self, request: GenerationRequest) -> FakeHandle:
        handle = FakeHandle(request)
        self.requests.append(request)
        if starts_in_reasoning(self.family, self.prompt):
            handle.queue.put(ReasoningOpen(request.id))
        for index in range(request.n):
            reply = self.replies[index % len(self.replies)]
            pieces = [reply[i:i + TOKEN_CHARS] for i in range(0, len(reply), TOKEN_CHARS)]
            for k, piece in enumerate(pieces):
                handle.queue.put(token_event(request, index, k, piece))
            handle.queue.put(Finished(request.id, index, self.reason,  # type: ignore[arg-type]
                                      Usage(10, len(pieces)), Timings(0.1, 100.0, 50.0, 0.2)))
        return handle


def token_event(request: GenerationRequest, index: int, k: int, piece: str) -> TokenEvent:
    """Token `k` of a scripted reply: id 1000 + k, logprob −0.5·k, and `request.logprobs`
    alternatives below it."""
    token_id = 1000 + k
    logprob = None
    top: tuple[TokenLogprob, ...] = ()
    if request.logprobs is not None:
        logprob = TokenLogprob(token_id, piece.encode(), -0.5 * k)
        top = tuple(TokenLogprob(token_id + 100 * j, piece.encode() if j == 0 else f"alt{j}".encode(),
                                 -0.5 * k - j)
                    for j in range(request.logprobs))
    return TokenEvent(request.id, index, token_id, piece, logprob=logprob, top_logprobs=top)

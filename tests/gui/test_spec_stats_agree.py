"""One reply, three places: its footer, the `/v1` stream's statistics and the Speculative
panel report the same acceptance, drafted and accepted counts (issue 14: a footer once said
"acceptance 92% (11/12 drafted)" while the panel said "Acceptance 88%, Accepted 4 / 4").

The panel had summed the rounds that reached it, but the server sends one chunk per burst of
events — only the burst's last round — and it showed the engine's rolling window as if it
were the reply's. Each figure now comes from `runtime.speculative.stats`, a round carries the
reply's running counts, and the panel's rolling figures have their own row."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.chat import footer as footer_module
from app.chat.footer import footer_text, speculative_footer
from app.engine.client import EngineState
from app.engine.streams import ReplyStream
from app.engine.wire import (
    MetricsSnapshot,
    ReplyFinished,
    ServedModel,
    SseEvent,
    SseParser,
    parse_chat_chunk,
)
from app.panels.dock import LivePanels
from app.theme import LIGHT
from app.window import MainWindow
from runtime.events import Event, Finished, SamplingParams, StepStats, Timings, TokenEvent, Usage
from runtime.server.dialects.openai.writer import OpenAIWriter
from runtime.server.generation import Reply
from runtime.server.sse import SSE_DONE
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.stats import ReplySpecStats, from_draft_flags
from tests.gui.conftest import ENGINE_TIMEOUT_MS, WindowFactory
from tests.gui.test_chat import send


def figures_everywhere(footer: dict[str, Any], chunks: list[dict[str, Any]],
                       live: LivePanels) -> tuple[tuple[Any, ...], ...]:
    """(acceptance text, accepted, drafted) as the footer, the stream and the panel say it."""
    rate = footer["acceptance_rate"]
    shown = footer_text(footer)
    assert f"acceptance {rate:.0%} ({footer['accepted']}/{footer['drafted']} drafted)" in shown
    steps = [c["outrider"]["step"] for c in chunks if "step" in c.get("outrider", {})]
    final = next(c["outrider"]["speculative"] for c in reversed(chunks)
                 if c["choices"] and c["choices"][0].get("finish_reason"))
    last = steps[-1]
    assert (last["reply_accepted"], last["reply_drafted"], last["acceptance_rate"]) == \
        (final["accepted"], final["drafted"], final["acceptance_rate"])
    values = live.speculative.values
    accepted, drafted = values["counts"].text().removesuffix(" drafted").split(" / ")
    return ((f"{rate:.0%}", footer["accepted"], footer["drafted"]),
            (f"{final['acceptance_rate']:.0%}", final["accepted"], final["drafted"]),
            (values["acceptance"].text(), int(accepted.replace(",", "")),
             int(drafted.replace(",", ""))))


def test_the_footer_doctest_holds() -> None:
    assert doctest.testmod(footer_module).failed == 0


# -- a scripted reply whose rounds reach the server in one burst -----------------------------

def scripted_reply() -> list[Event]:
    """Four rounds at k = 4 keeping 4, 1, 4 and 3 drafts, as the scheduler emits them."""
    spec, events, token = ReplySpecStats(), [], 100
    for accepted in (4, 1, 4, 3):
        spec.record_round(drafted=4, accepted=accepted)
        for flag in from_draft_flags(accepted, accepted + 1):
            events.append(TokenEvent("r", 0, token, f"w{token} ", flag))
            token += 1
        events.append(spec.step_stats("r", 0, drafted=4, accepted=accepted, cost_ratio=0.1,
                                      measured_speedup=2.0))
    events.append(Finished("r", 0, "stop", Usage(5, token - 100), Timings(0.1, 90.0, 40.0, 0.5),
                           spec.summary(measured_speedup=2.0)))
    return events


def test_a_burst_of_rounds_reads_the_same_in_the_footer_the_stream_and_the_panel(qtbot) -> None:
    # the server's SSE path: the whole reply is one batch of the engine's events
    writer = OpenAIWriter(chat=True, model="m")
    updates = Reply(None).feed(scripted_reply())
    wire = b"".join(chunk for update in updates for chunk in writer.update(update)) + SSE_DONE
    # the app's stream parsing, fed in uneven pieces as a socket would
    parser, events = SseParser(), []
    for i in range(0, len(wire), 37):
        events += parser.feed(wire[i:i + 37])
    assert events[-1] == SseEvent("message", "[DONE]")
    chunks = [json.loads(e.data) for e in events[:-1]]
    items = [item for chunk in chunks for item in parse_chat_chunk(chunk)]
    steps = [i for i in items if isinstance(i, StepStats)]
    assert [(s.drafted, s.accepted) for s in steps] == [(4, 3)]  # only the burst's last round
    result = next(i for i in items if isinstance(i, ReplyFinished))
    assert result.speculative is not None

    live = LivePanels(LIGHT)
    qtbot.addWidget(live)
    live.on_model(ServedModel("m", path="/m.gguf", draft="d"))
    live.on_busy(True)
    for step in steps:
        live.on_step(step)
    live.on_busy(False)  # the last round drawn now
    footer = {"tokens": 16, **speculative_footer(result.speculative)}
    while_streaming = figures_everywhere(footer, chunks, live)
    live.on_reply_finished(SimpleNamespace(stats=footer))
    assert figures_everywhere(footer, chunks, live) == while_streaming == (("75%", 12, 16),) * 3
    assert live.speculative.values["mean_len"].text() == "4.00 tokens"  # 16 tokens, 4 rounds

    # the engine's rolling window (other rounds, other clients) has a row of its own
    live.on_metrics(MetricsSnapshot(time=1.0, acceptance_rate=0.88, mean_accepted_length=8.0,
                                    draft_k=4))
    assert live.speculative.values["now"].text() == "88% accepted · 8.00 per round"
    assert figures_everywhere(footer, chunks, live)[2] == ("75%", 12, 16)


# -- a real speculative reply: the tiny model drafting for itself ----------------------------

@pytest.fixture
def drafting_window(make_window: WindowFactory, qtbot, tiny_target: Path,
                    tiny_draft: Path) -> MainWindow:
    """The real engine process with the tiny target and its tiny draft, a fixed k of 4."""
    window = make_window(None)
    window.ensure_panels()
    draft = DraftSettings(kind="model", model_path=tiny_draft, k=4, p_min=0.0)
    window.load_model(LoadSettings(model_path=tiny_target, n_ctx=512, n_threads=1, draft=draft))
    qtbot.waitUntil(lambda: window.client.state in (EngineState.READY, EngineState.CRASHED),
                    timeout=ENGINE_TIMEOUT_MS)
    assert window.client.state == EngineState.READY
    assert window.client.model is not None and window.client.model.draft is not None
    return window


def test_a_real_reply_reads_the_same_in_the_footer_the_stream_and_the_panel(
        qtbot, drafting_window: MainWindow, monkeypatch: pytest.MonkeyPatch) -> None:
    window = drafting_window
    chunks: list[dict[str, Any]] = []  # the /v1 stream's chunks, as they reached the app
    handle = ReplyStream._on_event

    def record(stream: ReplyStream, event: SseEvent) -> None:
        if event.data.strip() != "[DONE]":
            chunks.append(json.loads(event.data))
        handle(stream, event)

    monkeypatch.setattr(ReplyStream, "_on_event", record)
    window.controller.new_conversation()
    window.controller.set_sampling(SamplingParams(temperature=0.0, max_tokens=48))
    reply = send(qtbot, window, "Hello there")
    assert reply.status == "done", reply.error
    assert reply.stats.get("drafted", 0) > 0
    panels = window.panels
    assert panels is not None
    figures = figures_everywhere(reply.stats, chunks, panels)
    assert figures[0] == figures[1] == figures[2]
    assert reply.stats["acceptance_rate"] == reply.stats["accepted"] / reply.stats["drafted"]

    # the rolling metrics keep arriving; the reply's figures stay the reply's
    seen = panels.snapshots
    qtbot.waitUntil(lambda: panels.snapshots >= seen + 2, timeout=10_000)
    assert figures_everywhere(reply.stats, chunks, panels) == figures

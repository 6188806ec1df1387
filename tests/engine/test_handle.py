"""`EventQueueHandle`, the caller's end of a request: what the engine thread puts in comes out in
order, one event at a time — a native run's `TokenRun` as one TokenEvent a token."""

from __future__ import annotations

import threading

from runtime.engine.handle import EventQueueHandle
from runtime.events import Finished, Timings, TokenEvent, TokenRun, Usage


def finished(request_id: str, index: int) -> Finished:
    return Finished(request_id, index, "length", Usage(1, 3), Timings(0, 0, 0, 0))


def test_a_run_comes_out_as_one_token_event_a_token_in_order() -> None:
    handle = EventQueueHandle("req-1", 1, cancel=lambda _id: None)
    handle._put(TokenEvent("req-1", 0, 7, "a"))
    handle._put(TokenRun("req-1", 0, (8, 9, 10), ["b", "", "é"]))
    handle._put(TokenEvent("req-1", 0, 11, "c"))
    handle._put(finished("req-1", 0))
    events = list(handle.events(timeout=1))
    assert [(e.token_id, e.text) for e in events[:-1]] == [
        (7, "a"), (8, "b"), (9, ""), (10, "é"), (11, "c")]
    assert all(type(e) is TokenEvent and e.index == 0 and not e.from_draft
               for e in events[:-1])
    assert isinstance(events[-1], Finished) and handle.ended


def test_the_stream_ends_after_every_samples_finish_not_before() -> None:
    handle = EventQueueHandle("req-2", 2, cancel=lambda _id: None)
    handle._put(TokenRun("req-2", 0, (1, 2), ["x", "y"]))
    handle._put(TokenRun("req-2", 1, (3,), ["z"]))
    handle._put(finished("req-2", 0))
    got = [handle.get(timeout=1) for _ in range(4)]
    assert [(e.index, e.token_id) for e in got[:3]] == [(0, 1), (0, 2), (1, 3)]
    assert isinstance(got[3], Finished) and not handle.ended  # sample 1 is still going
    assert handle.get(timeout=0.05) is None
    handle._put(finished("req-2", 1))
    assert isinstance(handle.get(timeout=1), Finished) and handle.ended
    assert handle.get(timeout=0.05) is None


def test_a_reader_on_another_thread_gets_a_runs_tokens_as_they_are_put() -> None:
    handle = EventQueueHandle("req-3", 1, cancel=lambda _id: None)
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.extend(
        e.token_id for e in handle.events(timeout=5) if isinstance(e, TokenEvent)))
    reader.start()
    for start in range(0, 300, 100):
        handle._put(TokenRun("req-3", 0, tuple(range(start, start + 100)), ["t"] * 100))
    handle._put(finished("req-3", 0))
    reader.join(timeout=10)
    assert not reader.is_alive() and got == list(range(300))

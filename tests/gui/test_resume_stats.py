"""A resumed reply's statistics travel from the engine's Finished event through the server's
`outrider` object and the app's wire parser to the reply footer."""

from __future__ import annotations

from app.chat.footer import footer_text
from app.engine.wire import ReplyFinished, parse_chat_chunk
from runtime.events import Finished, Timings, Usage
from runtime.server.generation import finish_json


def test_resumed_tokens_and_restore_time_reach_the_footer() -> None:
    done = Finished("r", 0, "stop", Usage(4000, 9, cached_tokens=3912, resumed_tokens=3912),
                    Timings(0.4, 300.0, 40.0, 0.7, restore_s=0.2134))
    extra = finish_json(done)
    assert extra["usage"]["resumed_tokens"] == 3912 and extra["timings"]["restore_s"] == 0.2134
    (item,) = parse_chat_chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                                "outrider": extra})
    assert isinstance(item, ReplyFinished) and item.usage is not None and item.timings is not None
    assert item.usage.resumed_tokens == 3912 and item.timings.restore_s == 0.2134
    stats = {"tokens": item.usage.completion_tokens, "resumed_tokens": item.usage.resumed_tokens,
             "restore_s": item.timings.restore_s}
    assert footer_text(stats) == "9 tokens · resumed 3,912 cached tokens in 213 ms"


def test_a_reply_that_resumed_nothing_says_nothing_of_it() -> None:
    done = Finished("r", 0, "stop", Usage(40, 9, cached_tokens=30), Timings(0.4, 300.0, 40.0, 0.7))
    (item,) = parse_chat_chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                                "outrider": finish_json(done)})
    assert isinstance(item, ReplyFinished) and item.usage is not None
    assert item.usage.resumed_tokens == 0
    assert "resumed" not in footer_text({"tokens": 9, "resumed_tokens": 0})

"""Stop strings across token boundaries (runtime.engine.stops), with synthetic pieces."""

from __future__ import annotations

import pytest

from runtime.engine.stops import StopMatcher


def feed(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = []
    for piece in pieces:
        text, stopped = m.push(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    out.append(m.flush())
    return "".join(out), False


@pytest.mark.parametrize("pieces", [
    ["Hello<|end|>"],
    ["Hello<", "|end|>"],
    ["Hello<|", "en", "d", "|>"],
    ["Hel", "lo", "<", "|", "e", "n", "d", "|", ">"],
    ["Hello<|end|>tail that must not show"],
    ["Hello<|e", "nd|>more"],
])
def test_stop_split_anywhere_is_never_shown(pieces: list[str]) -> None:
    assert feed(["<|end|>"], pieces) == ("Hello", True)


def test_a_false_start_is_released_once_decided() -> None:
    m = StopMatcher(["STOP"])
    assert m.push("go ST") == ("go ", False)
    assert m.push("A") == ("STA", False)


def test_held_text_is_flushed_at_the_end() -> None:
    assert feed(["STOP"], ["abc", "ST"]) == ("abcST", False)


def test_earliest_of_several_stops_wins() -> None:
    assert feed(["world", "lo w"], ["Hello world"]) == ("Hel", True)


def test_overlapping_prefixes() -> None:
    # "aab" inside "aaab": the held "aa" must not hide the match that starts one later.
    assert feed(["aab"], ["a", "a", "a", "b", "c"]) == ("a", True)


def test_no_stops_passes_everything_through() -> None:
    m = StopMatcher([])
    assert m.push("anything") == ("anything", False)
    assert m.flush() == ""


def test_after_a_stop_nothing_more_comes_out() -> None:
    m = StopMatcher(["x"])
    assert m.push("ax") == ("a", True)
    assert m.push("more") == ("", True)
    assert m.flush() == ""


def test_unicode_stop() -> None:
    assert feed(["。"], ["你好", "。", "再见"]) == ("你好", True)

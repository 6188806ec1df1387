"""`Utf8Stream`, the one place reply bytes become text: a reply cut inside a character (at
max_tokens) ends before it, in the streamed and the plain (non-streamed) reply alike."""

from __future__ import annotations

from runtime.llama.binding import Utf8Stream


def test_a_character_cut_by_the_end_of_the_reply_is_left_out() -> None:
    stream = Utf8Stream()
    check = "✓".encode()  # three bytes: the reply stopped after two
    text = stream.push(b"done ") + stream.push(check[:1]) + stream.push(check[1:2])
    text += stream.flush()
    assert text == "done "
    assert "\ufffd" not in text


def test_the_stream_is_clean_after_the_end_of_a_reply() -> None:
    stream = Utf8Stream()
    stream.push("é".encode()[:1])
    stream.flush()
    assert stream.push(b"a") == "a"  # the dropped lead byte does not spoil the next


def test_bytes_that_are_never_utf8_are_still_replaced_as_they_come() -> None:
    stream = Utf8Stream()
    assert stream.push(b"a\xffb") == "a\ufffdb"
    assert stream.flush() == ""

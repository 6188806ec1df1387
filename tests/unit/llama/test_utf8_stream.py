"""`Utf8Stream`, the one place reply bytes become text: a reply cut inside a character (at
max_tokens) ends before it, in the streamed and the plain (non-streamed) reply alike."""

from __future__ import annotations

import codecs
import random

import pytest

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


def byte_soup(seed: int) -> list[bytes]:
    """Pieces as a byte-level vocabulary gives them: text cut at random byte offsets, with
    bytes that are never UTF-8 and lone continuation bytes mixed in."""
    rng = random.Random(seed)
    text = "".join(rng.choice(["a", "é", "✓", "日本", "🙂", " ", "\n"]) for _ in range(60))
    data = bytearray(text.encode())
    for _ in range(6):
        data.insert(rng.randrange(len(data)), rng.choice([0xFF, 0x80, 0xC3, 0xE2]))
    cuts = sorted(rng.sample(range(1, len(data)), 40))
    return [bytes(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("seed", range(20))
def test_each_piece_gives_what_pythons_incremental_decoder_gives(seed: int) -> None:
    pieces = byte_soup(seed)
    reference = codecs.getincrementaldecoder("utf-8")(errors="replace")
    expected = [reference.decode(piece) for piece in pieces]
    one_by_one = Utf8Stream()
    assert [one_by_one.push(piece) for piece in pieces] == expected
    # a run's pieces at once, split where a run could end: the same texts
    at_once, split = Utf8Stream(), seed % 7 + 1
    assert at_once.push_all(pieces[:split]) + at_once.push_all(pieces[split:]) == expected

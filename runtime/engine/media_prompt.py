"""A chat prompt with images: its tokens, where each image sits among them, and how the
scheduler evaluates those positions.

A message's images go where llama-server puts an `image_url` part that comes first: the
projector's media marker, once per image, at the start of the message's content. The chat
template renders the text; libmtmd cuts it at the markers into text chunks and image
chunks (`runtime.llama.mtmd.Projector.tokenize`). The sequence's token list holds the text
tokens and, for each image, one *placeholder id* per image token:

    text 21 tokens │ image 64 tokens (placeholders) │ text 37 tokens     → 122 positions
    [1, 120, …]    │ [−1938…, −1938…+1, …]          │ [63, 269, …]

Placeholders are negative (never a vocabulary id) and derived from the image's sha256 and
the projector's file, so the cache ledger (`runtime.engine.kv_slots`) needs no change to
share an image's cells: a second question about the same image starts with the same ids,
matches the cached prefix through the image, and reuses its cells (`cached_tokens` counts
them); another image, or the same one under another projector, matches nothing past its
first position. Saved KV caches (`runtime.engine.kv_store`) key on the same ids.

The scheduler evaluates a sequence's pending positions in order: text tokens go into the
step's batch as always; an image, when its first position is next, is encoded and decoded
into the sequence's cells by mtmd before the batch (`prefill`), all of it at once (Gemma 3's
image tokens attend to each other both ways, so an image is never split across steps), and
counted against the step's budget. The image's cells are in the ledger from then on; the
text after it follows in the same step when the budget allows. Other sequences decode in the
same step, so a vision request batches with the rest; only the image's own decode is a
separate `llama_decode` (a batch of embeddings cannot also carry tokens).

Drafting is off for a request with images: a draft model has no projector to see them, and
prompt lookup's n-grams would run over placeholder ids. The request says so once
(`StepStats.drafting_off_reason`) when drafting is configured.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from runtime.chat.reply import starts_in_reasoning
from runtime.engine.chat_template import ChatTemplate
from runtime.engine.prompt import PreparedPrompt, utf8_safe
from runtime.errors import ContextOverflow, EngineError, ImageError, shown
from runtime.events import ChatMessage, GenerationRequest
from runtime.llama.mtmd import ImagePiece, MediaChunks, Projector

DRAFTING_OFF = "drafting is off for prompts with images"
_ID_SPACE = 2**31 - 1  # placeholders are −1 … −(2³¹ − 1): int32, like token ids


def no_vision(model_name: str) -> ImageError:
    """The refusal of images by a model loaded without a projector."""
    return ImageError(f"{shown(model_name)} cannot read images: load a vision model (one with "
                      "a projector, e.g. Gemma 3 or SmolVLM) or send the message without them")


def placeholders(projector_key: str, image_id: str, n: int) -> list[int]:
    """The `n` placeholder ids of one image: consecutive, negative, from its hashes.

        >>> p = placeholders("proj", "ab12", 3)
        >>> len(p), all(t < 0 for t in p), p == placeholders("proj", "ab12", 3)
        (3, True, True)
    """
    digest = hashlib.sha256(f"{projector_key}:{image_id}".encode()).digest()
    base = int.from_bytes(digest[:4], "little") % _ID_SPACE
    return [-(1 + (base + i) % _ID_SPACE) for i in range(n)]


@dataclass(frozen=True)
class ImageSpan:
    """An image's positions in its sequence: start .. start + n_tokens − 1."""

    start: int
    n_tokens: int
    index: int  # its chunk in the prompt's MediaChunks

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


class _Seq(Protocol):
    """What `prefill` needs of a sequence (runtime.engine.sequence.Sequence)."""

    tokens: list[int]
    n_computed: int
    slot: int

    @property
    def pending(self) -> int: ...


class _Ledger(Protocol):
    def append(self, slot: int, tokens: Sequence[int]) -> None: ...

    def truncate(self, slot: int, n: int) -> int: ...


class _Vocab(Protocol):
    bos: int


class MediaPrompt:
    """The images of one request's prompt; every sample (n > 1) of it shares this object,
    which keeps libmtmd's chunks alive until the last of them is gone."""

    def __init__(self, prompt: PreparedPrompt, projector: Projector, chunks: MediaChunks,
                 spans: Sequence[ImageSpan]) -> None:
        self.prompt = prompt
        self.projector = projector
        self.chunks = chunks
        self.spans = tuple(spans)
        self._starts = [s.start for s in self.spans]

    @property
    def image_tokens(self) -> int:
        return sum(s.n_tokens for s in self.spans)

    def at(self, pos: int) -> ImageSpan | None:
        """The image whose first position is `pos`, if any."""
        i = bisect.bisect_left(self._starts, pos)
        return self.spans[i] if i < len(self.spans) and self._starts[i] == pos else None

    def text_run(self, pos: int) -> int:
        """Text positions from `pos` up to the next image (a large number after the last)."""
        i = bisect.bisect_left(self._starts, pos)
        return self._starts[i] - pos if i < len(self.spans) else _ID_SPACE

    def aligned(self, n: int) -> int:
        """`n` reused positions moved back to the start of an image they end inside: an
        image is evaluated whole or not at all.

            >>> m = MediaPrompt(PreparedPrompt((1,) * 30), None, None, [ImageSpan(10, 8, 1)])
            >>> m.aligned(14), m.aligned(18), m.aligned(9)
            (10, 18, 9)
        """
        i = bisect.bisect_right(self._starts, n) - 1
        if i >= 0 and self.spans[i].start < n < self.spans[i].end:
            return self.spans[i].start
        return n

    def prefill(self, seq: _Seq, n: int, room: int, ctx: Any, kv: _Ledger,
                n_batch: int) -> tuple[int, int]:
        """Evaluate the images whose first position is next (while `room` cells allow),
        then say how many text tokens to feed now: (image tokens evaluated, text tokens),
        the text at most `n` less the images and never past the next image."""
        evaluated = 0
        while (span := self.at(seq.n_computed)) is not None:
            if span.n_tokens > room - evaluated:
                break  # its cells are not free this step; the sequence waits
            rc = self.projector.evaluate(self.chunks, span.index, ctx, pos=span.start,
                                         seq_id=seq.slot, n_batch=n_batch)
            if rc != 0:
                kv.truncate(seq.slot, span.start)  # whatever mtmd decoded before it failed
                raise EngineError("llama.cpp could not evaluate an image of this prompt "
                                  f"(code {rc}" + (": no room in the KV cache)" if rc == 1
                                                   else ")"))
            kv.append(seq.slot, seq.tokens[span.start:span.end])
            seq.n_computed = span.end
            evaluated += span.n_tokens
        if self.at(seq.n_computed) is not None:
            return evaluated, 0
        return evaluated, min(max(n - evaluated, 0), self.text_run(seq.n_computed), seq.pending)


def prepare_media_prompt(request: GenerationRequest, vocab: Any, template: ChatTemplate,
                         n_ctx: int, projector: Projector | None,
                         model_name: str) -> MediaPrompt | None:
    """The prompt of a chat whose messages carry images, or None when none does (the plain
    `prepare_prompt` then). Raises `ImageError` (no projector, an image mtmd cannot read)
    and `ContextOverflow` (middle truncation never drops turns with images: it says so)."""
    messages = request.messages
    if messages is None or not any(m.images for m in messages):
        return None
    if projector is None:
        raise no_vision(model_name)
    images = [image for m in messages for image in m.images]
    text = utf8_safe(template.render(_marked(messages, projector.marker),
                                     add_generation_prompt=True, tools=request.tools,
                                     extra=dict(request.template_kwargs)))
    ids = [hashlib.sha256(image).hexdigest() for image in images]
    chunks = projector.tokenize(text, images, ids)
    tokens: list[int] = []
    spans: list[ImageSpan] = []
    for piece in chunks.pieces:
        if isinstance(piece, ImagePiece):
            if piece.n_pos != piece.n_tokens:
                raise ImageError("this projector gives an image fewer positions than tokens, "
                                 "which the engine does not support")
            spans.append(ImageSpan(len(tokens), piece.n_tokens, piece.index))
            tokens.extend(placeholders(projector.key, piece.id, piece.n_tokens))
        else:
            tokens.extend(piece.tokens)
    bos = getattr(vocab, "bos", -1)
    if len(tokens) >= 2 and tokens[0] == tokens[1] == bos >= 0:
        tokens = tokens[1:]  # a template that writes its own BOS text (prompt.py does the same)
        spans = [replace(s, start=s.start - 1) for s in spans]
    if not spans or spans[-1].end >= len(tokens):
        raise ImageError("a prompt cannot end with an image: the chat template put no text "
                         "after it")
    if len(tokens) > n_ctx:
        raise ContextOverflow(
            f"the prompt with its images is {len(tokens)} tokens ({sum(s.n_tokens for s in spans)} "
            f"of them for {len(spans)} image(s)) but the context holds {n_ctx}; send fewer "
            "images, shorten the chat, or load the model with a longer context")
    prepared = PreparedPrompt(tuple(tokens), in_reasoning=starts_in_reasoning(template.family, text))
    return MediaPrompt(prepared, projector, chunks, spans)


def _marked(messages: Sequence[ChatMessage], marker: str) -> tuple[ChatMessage, ...]:
    """Each message with images gets one marker per image before its text."""
    return tuple(replace(m, content=marker * len(m.images) + m.content) if m.images else m
                 for m in messages)

"""Vision projectors through llama.cpp's multimodal library (libmtmd), via llama-cpp-python's
ctypes binding `llama_cpp.mtmd_cpp`.

A projector ("mmproj" GGUF) turns an image into embeddings of the text model's width. Only
the engine thread evaluates; tokenizing (decoding and resizing the image, splitting the
prompt at its media markers) is read-only and runs on the preparation workers, like text
tokenization (`runtime.engine.engine`).

    projector = Projector.load(Path("mmproj.gguf"), model, params)
    chunks = projector.tokenize(f"<|im_start|>user\\n{projector.marker}What is this?…",
                                [png_bytes], ["<sha256>"])
    chunks.pieces   # (TextPiece(tokens=(1, 120, …)), ImagePiece(index=1, n_tokens=64, …), …)
    projector.evaluate(chunks, 1, ctx, pos=21, seq_id=0, n_batch=512)   # 0: in the cache

What this wrapper adds to the raw binding: it owns and frees every pointer (a prompt's
chunks are freed when the last sequence holding them is gone), routes mtmd's log into the
one llama.cpp log receiver (`LlamaLog`: its buffer sizes end up in `LoadedModel.allocated`),
gives each load a media marker of its own (so a user's text that happens to contain
"<__media__>" is only text), and turns failures into one-line typed errors.

Text models with M-RoPE positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL and kin: mtmd decides by
the model's rope type) give an image fewer positions than tokens; the engine's cache ledger
counts one position per cell, so such pairs are refused at load for now (`LoadError`).
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import secrets
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llama_cpp.mtmd_cpp as M

from runtime.errors import ImageError, LoadError, shown
from runtime.llama.binding import LlamaContext, LlamaModel, llama_log
from runtime.llama.params import LlamaParams

_INIT_ERROR = re.compile(r"mtmd_init_from_file: error: (?P<what>[^\n]+)")


@dataclass(frozen=True)
class TextPiece:
    """A run of text tokens of a tokenized prompt."""

    tokens: tuple[int, ...]


@dataclass(frozen=True)
class ImagePiece:
    """One image of a tokenized prompt: chunk `index` of its `MediaChunks`, `n_tokens`
    embeddings at `n_pos` positions (equal for every projector the engine accepts)."""

    index: int
    n_tokens: int
    n_pos: int
    id: str


class MediaChunks:
    """An `mtmd_input_chunks` list and what it holds, freed when this object is."""

    def __init__(self, ptr: int, pieces: tuple[TextPiece | ImagePiece, ...]) -> None:
        self.ptr = ptr
        self.pieces = pieces
        # Any thread may drop the last reference; freeing chunks touches nothing shared.
        self._free = weakref.finalize(self, M.mtmd_input_chunks_free, ptr)

    def chunk(self, index: int) -> int:
        return int(M.mtmd_input_chunks_get(self.ptr, index) or 0)

    @property
    def image_tokens(self) -> int:
        return sum(p.n_tokens for p in self.pieces if isinstance(p, ImagePiece))


@cache
def _route_log() -> None:
    """mtmd and its helpers log through their own hook: send them to llama.cpp's receiver."""
    receiver = llama_log()
    M.mtmd_helper_log_set(receiver.callback, ctypes.c_void_p(0))


class Projector:
    """A loaded projector (`mtmd_context`) for one text model."""

    def __init__(self, ptr: int, path: Path, marker: str, load_log: str) -> None:
        self._ptr: int | None = ptr
        self.path = path
        self.marker = marker
        # Which file this is, for keys of cached image cells: another projector (or this
        # one rewritten) turns the same image into other embeddings.
        stat = path.stat()
        self.key = hashlib.sha256(
            f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        self.load_log = load_log  # clip's buffer sizes ("CPU compute buffer size = …")
        # Gemma 3's image tokens attend to each other both ways (mtmd sets causal
        # attention off while it decodes them).
        self.non_causal = bool(M.mtmd_decode_use_non_causal(ptr, None))

    @classmethod
    def load(cls, path: Path, model: LlamaModel, params: LlamaParams) -> Projector:
        """Load `path` beside `model`: on the GPU when the model has layers there, with the
        model's threads and flash attention choice. A file mtmd refuses (wrong width for
        this model, unknown projector type, missing tensors) is a one-line `LoadError`."""
        _route_log()
        marker = f"<__media_{secrets.token_hex(8)}__>"
        mp = M.mtmd_context_params_default()
        mp.use_gpu = params.n_gpu_layers != 0
        mp.print_timings = False
        mp.n_threads = params.n_threads_batch
        mp.flash_attn_type = params.flash_attn
        mp.warmup = True  # reserves the compute buffer now, so its size is in the log
        encoded = marker.encode()
        mp.media_marker = encoded
        with llama_log().capture() as captured:
            ptr = M.mtmd_init_from_file(str(path).encode("utf-8"), model.ptr, mp)
        log = "".join(captured)
        if not ptr:
            found = _INIT_ERROR.search(log)
            reason = found["what"].strip() if found else "mtmd refused it (see the log)"
            raise LoadError(f"the projector {shown(path.name)} does not work with "
                            f"{shown(model.path.name)}: {shown(reason)}")
        projector = cls(ptr, path, marker, log)
        if not M.mtmd_support_vision(ptr):
            projector.close()
            raise LoadError(f"{shown(path.name)} has no vision encoder (an audio projector?); "
                            "images need a vision projector")
        if M.mtmd_decode_use_mrope(ptr):
            projector.close()
            raise LoadError(f"{shown(model.path.name)} places image tokens with M-RoPE "
                            "(Qwen2-VL style), which Outrider's engine does not support yet; "
                            "use a Gemma 3, SmolVLM, Pixtral or LLaVA-style vision model")
        return projector

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            raise LoadError("the projector was freed")
        return self._ptr

    def close(self) -> None:
        if self._ptr is not None:
            M.mtmd_free(self._ptr)
            self._ptr = None

    def tokenize(self, text: str, images: Sequence[bytes], ids: Sequence[str]) -> MediaChunks:
        """Cut `text` at this projector's `marker` (one per image, in order) into text and
        image chunks; each image is decoded and resized here. `ids` name the images (their
        sha256). Raises `ImageError` for an image mtmd cannot decode."""
        bitmaps: list[int] = []
        try:
            for i, data in enumerate(images):
                buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
                bitmap = M.mtmd_helper_bitmap_init_from_buf(M.mtmd_context_p(self.ptr), buf,
                                                            len(data), False)
                if not bitmap:
                    raise ImageError(f"image {i + 1} could not be decoded (not a PNG, JPEG, "
                                     "BMP or GIF llama.cpp can read)")
                bitmaps.append(bitmap)
                M.mtmd_bitmap_set_id(bitmap, ids[i].encode())
            chunks = M.mtmd_input_chunks_init()
            if not chunks:
                raise LoadError("mtmd could not allocate a chunk list")
            owner = MediaChunks(chunks, ())
            raw = text.encode("utf-8")
            inp = M.mtmd_input_text(raw, len(raw), True, True)
            arr = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = M.mtmd_tokenize(self.ptr, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc == 1:
                raise ImageError(f"the prompt has a different number of image places than "
                                 f"images ({len(bitmaps)})")
            if rc != 0:
                raise ImageError("an image could not be prepared for the projector "
                                 f"(mtmd_tokenize returned {rc})")
            owner.pieces = _pieces(chunks)
            return owner
        finally:
            for made in bitmaps:
                M.mtmd_bitmap_free(made)

    def evaluate(self, chunks: MediaChunks, index: int, ctx: LlamaContext, *, pos: int,
                 seq_id: int, n_batch: int) -> int:
        """Encode image chunk `index` and decode its embeddings into `seq_id` at positions
        pos .. pos + n_tokens − 1 (engine thread). 0 on success, else llama.cpp's code."""
        chunk = chunks.chunk(index)
        if not chunk:
            return -1
        new_pos = M.llama_cpp.llama_pos(0)
        return int(M.mtmd_helper_eval_chunk_single(self.ptr, ctx.ptr, chunk, pos, seq_id,
                                                   n_batch, False, ctypes.byref(new_pos)))


def _pieces(chunks: int) -> tuple[TextPiece | ImagePiece, ...]:
    out: list[TextPiece | ImagePiece] = []
    for i in range(int(M.mtmd_input_chunks_size(chunks))):
        chunk = M.mtmd_input_chunks_get(chunks, i)
        kind = int(M.mtmd_input_chunk_get_type(chunk))
        if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
            n = ctypes.c_size_t(0)
            ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            out.append(TextPiece(tuple(ptr[:n.value]) if ptr and n.value else ()))
        elif kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            raw_id = M.mtmd_input_chunk_get_id(chunk)
            out.append(ImagePiece(i, int(M.mtmd_input_chunk_get_n_tokens(chunk)),
                                  int(M.mtmd_input_chunk_get_n_pos(chunk)),
                                  raw_id.decode() if raw_id else ""))
        else:
            raise ImageError("the projector made an audio chunk of an image")
    return tuple(out)

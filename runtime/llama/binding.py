"""A thin wrapper over llama-cpp-python's low-level ctypes API (`llama_cpp.llama_cpp`).

Only the engine thread calls into this module (DESIGN.md, "Inside the engine"). It does
three things the raw binding does not: it owns and frees every pointer, it turns failures
into typed errors with llama.cpp's own reason (taken from its log), and it keeps the
per-token path free of allocations:

- `Batch` is one reusable `llama_batch` whose arrays are numpy buffers, so a prompt chunk
  is written with slice assignments and a decode step with four scalar stores;
- `LlamaContext.logits` returns a zero-copy numpy view of llama.cpp's output buffer;
- `LlamaModel.piece` caches each token's bytes, and `Utf8Stream` decodes them
  incrementally, so a character split across tokens is emitted once it is complete.

    model = LlamaModel.load(path, params, on_progress=lambda f: True)
    ctx = LlamaContext(model, params)
    batch = Batch(512)
    last = batch.add_tokens(model.tokenize("Hello"), pos0=0, seq_id=0, logits_last=True)
    ctx.decode(batch)                               # 0 = ok, 1 = no KV slot
    next_token = int(ctx.logits(batch.n_outputs)[0].argmax())
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as L
import numpy as np
from llama_cpp._ctypes_extensions import load_shared_library

from runtime.errors import (
    ConstraintError,
    LoadError,
    SettingsError,
    UnsupportedArchitecture,
    shown,
)
from runtime.llama.params import CPU_MOE_ALL, LlamaParams, expert_override_patterns
from runtime.llama.reason import first_reason
from runtime.llama.rpc import has_local_gpu, model_devices

logger = logging.getLogger("outrider.llama")

# enum llama_pooling_type: how an embedding context turns a sequence's tokens into one vector
POOLING_UNSPECIFIED = -1  # the model file's choice (none when it says nothing)
POOLING_NONE = 0  # no pooling: one vector per token
POOLING_MEAN = 1
POOLING_CLS = 2  # the first token's
POOLING_LAST = 3  # the last token's
POOLING_RANK = 4  # a reranker's classification head: scores, not an embedding

# enum ggml_log_level
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_LOG_CONT = 5


class LlamaLog:
    """Receives everything llama.cpp and ggml log (instead of their stderr spam).

    Lines go to the `outrider.llama` logger at debug level (warnings and errors at their own
    level), are kept in a short ring buffer (the reason of a failed load is usually the last
    error line), can be captured whole around a load (`capture()`), which is where
    llama.cpp reports the buffers it allocated, and followed line by line as they come
    (`listen()`: the quantizer's progress).
    """

    def __init__(self, keep: int = 200) -> None:
        self._lock = threading.Lock()
        self._recent: deque[tuple[int, str]] = deque(maxlen=keep)
        self._captures: list[list[str]] = []
        self._listeners: list[Callable[[int, str], None]] = []
        self._level = logging.DEBUG
        self._partial = ""
        # The C side keeps only a raw pointer: this object must outlive the registration.
        self._callback = L.llama_log_callback(self._on_log)
        L.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
        try:
            chunk = (text or b"").decode("utf-8", errors="replace")
            with self._lock:
                if level != _LOG_CONT:
                    self._level = _LOG_LEVELS.get(level, logging.DEBUG)
                for buf in self._captures:
                    buf.append(chunk)
                self._partial += chunk
                if "\n" not in self._partial:
                    return
                *lines, self._partial = self._partial.split("\n")
                py_level = self._level
                for line in lines:
                    self._recent.append((py_level, line))
                listeners = list(self._listeners)
            for line in lines:
                for listener in listeners:
                    with contextlib.suppress(Exception):  # it loses the line, nothing more
                        listener(py_level, line)
                if line.strip():
                    # All of it at debug level: what matters reaches the user as a typed
                    # error or a LoadedModel note, not as stderr noise.
                    logger.debug("[%s] %s", logging.getLevelName(py_level), line)
        except Exception:  # a callback must never raise into C
            pass

    @property
    def callback(self) -> Any:
        """The C callback itself, for the libraries that log through their own hook (libmtmd:
        `runtime.llama.mtmd`); it lives as long as this receiver."""
        return self._callback

    @contextmanager
    def capture(self) -> Iterator[list[str]]:
        """Collect all log text while the block runs (joined: `"".join(buf)`)."""
        buf: list[str] = []
        with self._lock:
            self._captures.append(buf)
        try:
            yield buf
        finally:
            with self._lock:
                self._captures.remove(buf)

    @contextmanager
    def listen(self, on_line: Callable[[int, str], None]) -> Iterator[None]:
        """Call `on_line(level, line)` with each whole line logged while the block runs, on
        the thread that logged it; `level` is the `logging` level llama.cpp gave the part
        that ended the line. A listener that raises loses that line (nothing may raise
        into C)."""
        with self._lock:
            self._listeners.append(on_line)
        try:
            yield
        finally:
            with self._lock:
                self._listeners.remove(on_line)

    def last_errors(self, n: int = 3) -> list[str]:
        """The most recent error/warning lines, oldest first."""
        with self._lock:
            lines = [text.strip() for level, text in self._recent
                     if level >= logging.WARNING and text.strip()]
        return lines[-n:]


@cache
def llama_log() -> LlamaLog:
    """The process-wide log receiver. llama.cpp's log callback is itself process-global, so
    one receiver per process is the honest shape; it is created on first use."""
    L.llama_backend_init()
    return LlamaLog()


# struct llama_model_tensor_buft_override {
#     const char * pattern;
#     ggml_backend_buffer_type_t buft;
# };
class TensorBuftOverride(ctypes.Structure):
    """llama-cpp-python declares `llama_model_params.tensor_buft_overrides` as a bare pointer
    but not the struct it points to: an array of these, ended by a NULL pattern."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@cache
def _cpu_buffer_type() -> int:
    """`ggml_backend_cpu_buffer_type()` from llama-cpp-python's libggml-base: the value
    llama.cpp's loader compares an override with to keep the CPU's repacked layouts."""
    lib = load_shared_library("ggml-base", Path(L.__file__).parent / "lib")
    # ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type(void);
    lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    lib.ggml_backend_cpu_buffer_type.argtypes = []
    return int(lib.ggml_backend_cpu_buffer_type())


class _PlacementArrays:
    """The C arrays `llama_model_params` borrows for experts in RAM and the GPU split. They
    live as long as the model: llama.cpp keeps pointers to them."""

    def __init__(self, params: LlamaParams) -> None:
        patterns = [p.encode() for p in expert_override_patterns(params.n_cpu_moe)]
        self._patterns = patterns
        self.overrides: ctypes.Array[TensorBuftOverride] | None = None
        if patterns:
            buft = _cpu_buffer_type()
            self.overrides = (TensorBuftOverride * (len(patterns) + 1))(
                *[TensorBuftOverride(p, buft) for p in patterns], TensorBuftOverride(None, None))
        self.split: ctypes.Array[ctypes.c_float] | None = None
        if params.tensor_split:
            n_max = int(L.llama_max_devices())
            if len(params.tensor_split) > n_max:
                raise SettingsError(f"a tensor split over {len(params.tensor_split)} GPUs, but "
                                    f"llama.cpp handles at most {n_max}")
            # llama.cpp reads llama_max_devices() entries, so the rest are zeros.
            self.split = (ctypes.c_float * n_max)(*params.tensor_split)
        self.devices = model_devices(params.workers) if params.workers else None

    def apply(self, mp: L.llama_model_params) -> None:
        if self.devices is not None:
            mp.devices = ctypes.cast(  # type: ignore[assignment]
                self.devices, ctypes.c_void_p).value
        # The binding's type hints call both fields arrays; its _fields_ (what ctypes obeys)
        # make them a void pointer and a float pointer.
        if self.overrides is not None:
            mp.tensor_buft_overrides = ctypes.cast(  # type: ignore[assignment]
                self.overrides, ctypes.c_void_p).value
        if self.split is not None:
            mp.tensor_split = ctypes.cast(  # type: ignore[assignment]
                self.split, ctypes.POINTER(ctypes.c_float))


def _first_reason(captured: list[str]) -> str:
    """The reason llama.cpp gave for a failure, from the text it logged meanwhile."""
    return first_reason("".join(captured))


class LlamaModel:
    """A loaded `llama_model` and its vocabulary."""

    def __init__(self, ptr: int, path: Path) -> None:
        self._ptr: int | None = ptr
        self.path = path
        self.vocab = L.llama_model_get_vocab(ptr)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(ptr))
        self.n_embd = int(L.llama_model_n_embd(ptr))
        self.n_layer = int(L.llama_model_n_layer(ptr))
        self.n_params = int(L.llama_model_n_params(ptr))
        self.size_bytes = int(L.llama_model_size(ptr))
        self.bos = int(L.llama_vocab_bos(self.vocab))
        self.eos = int(L.llama_vocab_eos(self.vocab))
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        # Cells can be shared and cut at any position only in an attention cache: recurrent
        # state cannot hand a prefix to another sequence. A sliding-window cache can, while
        # the window before the cut is still there (KvSlots checks `seq_pos_min`).
        self.shares_prefixes = not (L.llama_model_is_recurrent(ptr) or L.llama_model_is_hybrid(ptr))
        self.n_swa = int(L.llama_model_n_swa(ptr))  # sliding window in tokens; 0: none
        self.n_embd_out = int(L.llama_model_n_embd_out(ptr))  # the length of an embedding
        # T5-style models (and draft heads fed by a target): llama_decode needs an encoder
        # pass first, which the engine never makes.
        self.has_encoder = bool(L.llama_model_has_encoder(ptr))
        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._texts: list[str | None] = [None] * self.n_vocab  # a piece of whole characters
        self._eog = np.array([bool(L.llama_vocab_is_eog(self.vocab, t)) for t in range(self.n_vocab)])
        self._piece_buf = ctypes.create_string_buffer(256)
        self.load_log = ""  # what llama.cpp logged while loading (buffer sizes, notes)
        self._placement: _PlacementArrays | None = None  # borrowed by llama.cpp: keep

    @classmethod
    def load(cls, path: Path, params: LlamaParams,
             on_progress: Callable[[float], bool] | None = None) -> LlamaModel:
        """Load weights. `on_progress(fraction)` returning False aborts the load."""
        log = llama_log()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = params.n_gpu_layers
        mp.load_mode = params.load_mode
        mp.split_mode = params.split_mode
        mp.main_gpu = params.main_gpu
        mp.use_extra_bufts = params.repack
        placement = _PlacementArrays(params)
        placement.apply(mp)

        def progress(fraction: float, _user: ctypes.c_void_p) -> bool:
            if on_progress is None:
                return True
            try:
                return bool(on_progress(float(fraction)))
            except Exception:  # a broken listener must not abort a load (or raise into C)
                logger.exception("load progress listener failed")
                return True

        callback = L.llama_progress_callback(progress)  # kept alive until the call returns
        mp.progress_callback = callback
        with log.capture() as captured:
            ptr = L.llama_model_load_from_file(str(path).encode("utf-8"), mp)
        if not ptr:
            reason = _first_reason(captured)
            if "unknown model architecture" in reason:
                raise UnsupportedArchitecture(f"{shown(path.name)}: llama.cpp does not know this "
                                              f"architecture ({reason})")
            raise LoadError(f"llama.cpp could not load {shown(path.name)}: {shown(reason)}")
        model = cls(ptr, path)
        model._placement = placement
        model.load_log = "".join(captured)
        if params.n_cpu_moe != CPU_MOE_ALL and params.n_cpu_moe > model.n_layer:
            model.close()
            raise SettingsError(f"MoE experts on CPU: {params.n_cpu_moe} layers asked for, but "
                                f"{shown(path.name)} has {model.n_layer}")
        return model

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            raise LoadError("the model was freed")
        return self._ptr

    def close(self) -> None:
        if self._ptr is not None:
            L.llama_model_free(self._ptr)
            self._ptr = None

    # ---- metadata -------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (arrays are not available this way)."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.llama_model_meta_val_str(self.ptr, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    def chat_template(self) -> str | None:
        raw = L.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.ptr, buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    def quant(self) -> str:
        """The file type as llama.cpp names it ("Q4_1", "all F32", …)."""
        raw = L.llama_ftype_name(L.llama_model_ftype(self.ptr))
        return raw.decode("utf-8", errors="replace").removeprefix("(guessed) ") if raw else "?"

    def token_text(self, token: int) -> str:
        """The vocabulary's raw text of a token (as stored in the GGUF)."""
        raw = L.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    # ---- text ↔ tokens --------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Tokens of `text`. `add_special` adds BOS where the model asks for it (never twice
        when the text already starts with it); `parse_special` turns "<|im_start|>" into its
        control token."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        while True:
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
            if n >= 0:
                break
            if n == -(2**31):
                raise LoadError("the text is too long to tokenize")
            cap = -n
        tokens = list(buf[:n])
        if len(tokens) >= 2 and tokens[0] == tokens[1] == self.bos and add_special:
            tokens = tokens[1:]  # a template that writes its own BOS text
        return tokens

    def piece(self, token: int) -> bytes:
        """The bytes a generated token stands for (control tokens: b""). Cached."""
        cached = self._pieces[token]
        if cached is not None:
            return cached
        buf = self._piece_buf
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        out = buf.raw[:n]
        self._pieces[token] = out
        # A piece that is part of a character (byte-level vocabularies) has no text of its
        # own: it is decoded in context (Utf8Stream).
        with contextlib.suppress(UnicodeDecodeError):
            self._texts[token] = out.decode("utf-8")
        return out

    def texts(self, tokens: Sequence[int]) -> list[str] | None:
        """Each token's text where every one of them is a piece of whole characters seen
        before (`piece`); None otherwise. A native run's tokens take this, one C loop over
        a list, instead of a piece and a decode a token (`Utf8Stream.push_run`)."""
        out = list(map(self._texts.__getitem__, tokens))
        return None if None in out else out  # type: ignore[return-value]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of a whole token list (special tokens rendered when `special`)."""
        if not tokens:
            return ""
        arr = (L.llama_token * len(tokens))(*tokens)
        cap = len(tokens) * 8 + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = L.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, False, special)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            cap = -n

    # int32_t llama_token_to_piece(const struct llama_vocab * vocab, llama_token token,
    #                              char * buf, int32_t length, int32_t lstrip, bool special);
    # enum llama_token_attr llama_vocab_get_attr(const struct llama_vocab * vocab, llama_token token);
    def marked_pieces(self) -> list[bytes]:
        """Every token's bytes as a grammar engine reads the vocabulary: llguidance's
        `lltokenizer_from_vocab` on llama.cpp's current vocabulary API (that one calls the
        deprecated `llama_token_get_attr`, a warning per token). Control tokens, and
        user-defined ones that look like them ("<tool_call>"), come behind a 0xff byte:
        grammars name them as special tokens, and text never produces them."""
        size = 16 * 1024
        buf = ctypes.create_string_buffer(size + 1)
        control, user = L.LLAMA_TOKEN_ATTR_CONTROL, L.LLAMA_TOKEN_ATTR_USER_DEFINED
        pieces: list[bytes] = []
        for token in range(self.n_vocab):
            n = L.llama_token_to_piece(self.vocab, token, buf, size, 0, True)
            if n < 0:
                raise ConstraintError(f"token {token} of the vocabulary is longer than {size} "
                                      "bytes")
            piece = buf.raw[:n]
            attr = L.llama_vocab_get_attr(self.vocab, token)
            if attr & control or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + piece
            pieces.append(piece)
        return pieces

    @property
    def tokenize_address(self) -> int:
        """The address of `llama_tokenize`, for a library that tokenizes this vocabulary
        itself (llguidance, given `vocab`)."""
        return ctypes.cast(L._lib.llama_tokenize, ctypes.c_void_p).value or 0


class Utf8Stream:
    """Token bytes in, complete characters out: a character split over two tokens comes
    out whole with the second one.

        >>> s = Utf8Stream()
        >>> s.push("é".encode()[:1]), s.push("é".encode()[1:])
        ('', 'é')

    The one place a reply's bytes become text, streamed or not: the end of a reply
    (`flush`) drops a character still incomplete — a reply cut at max_tokens halfway
    through "✓" ends before it, never in "\ufffd". Bytes that can never be UTF-8 are
    still replaced as they arrive.

        >>> s.push("ok ✓".encode()[:-1]), s.flush()
        ('ok ', '')
    """

    def __init__(self) -> None:
        self._held = b""  # the start of a character whose other bytes are still to come

    def push(self, data: bytes) -> str:
        if not data:
            return ""
        if not self._held:  # nothing held back: whole characters decode at once
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                pass  # a character cut in two, or bytes that are no UTF-8
        return self._decode(data)

    def push_all(self, pieces: list[bytes]) -> list[str]:
        """`push` each of `pieces` in turn; their texts. Whole characters in every piece (the
        common case) decode in one C loop.

            >>> Utf8Stream().push_all([b"a", "é".encode()[:1], "é".encode()[1:], b"b"])
            ['a', '', 'é', 'b']
        """
        if not self._held:
            try:
                return list(map(bytes.decode, pieces))
            except UnicodeDecodeError:
                pass  # a character cut in two somewhere: piece by piece
        return list(map(self._decode, pieces))

    def push_run(self, model: LlamaModel, tokens: Sequence[int]) -> list[str]:
        """`push_all` of `tokens`' pieces: with nothing held back and every piece whole
        characters, their texts straight from `model`'s cache."""
        if not self._held:
            texts = model.texts(tokens)
            if texts is not None:
                return texts
        return self.push_all(list(map(model.piece, tokens)))

    def _decode(self, data: bytes) -> str:
        # codecs' own incremental decoder does this in Python around the same C function,
        # at ~1.5 times the cost; a split character or a byte-level vocabulary meets it a
        # token.
        data = self._held + data
        text, used = codecs.utf_8_decode(data, "replace", False)
        self._held = data[used:]
        return text

    def flush(self) -> str:
        """The end of the reply: nothing more to say, an incomplete character left out."""
        self._held = b""
        return ""


class Batch:
    """One reusable `llama_batch` backed by numpy arrays (no per-token allocation).

    Every token belongs to exactly one sequence: sharing between sequences happens in the
    cache (`seq_cp`), never by listing several seq ids on a token.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_id = np.zeros((capacity, 1), dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        base = self.seq_id.ctypes.data
        self._seq_ptrs = (i32p * capacity)(*[ctypes.cast(base + 4 * i, i32p) for i in range(capacity)])
        self.struct = L.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(i32p),
            embd=None,
            pos=self.pos.ctypes.data_as(i32p),
            n_seq_id=self.n_seq_id.ctypes.data_as(i32p),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        self.n_tokens = 0
        self.n_outputs = 0

    def clear(self) -> None:
        self.n_tokens = 0
        self.n_outputs = 0

    @property
    def free(self) -> int:
        return self.capacity - self.n_tokens

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one token; returns its output row (or -1 when no logits are asked)."""
        i = self.n_tokens
        self.token[i] = token
        self.pos[i] = pos
        self.seq_id[i, 0] = seq_id
        self.logits[i] = logits
        self.n_tokens = i + 1
        if logits:
            self.n_outputs += 1
            return self.n_outputs - 1
        return -1

    def add_tokens(self, tokens: Sequence[int] | np.ndarray, pos0: int, seq_id: int,
                   logits_last: bool) -> int:
        """Append a run of one sequence's tokens at positions pos0, pos0+1, …; returns the
        output row of the last token (or -1)."""
        n = len(tokens)
        i = self.n_tokens
        if n > self.capacity - i:
            raise ValueError(f"batch overflow: {i} + {n} > {self.capacity}")
        self.token[i:i + n] = tokens
        self.pos[i:i + n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.seq_id[i:i + n, 0] = seq_id
        self.logits[i:i + n] = 0
        self.n_tokens = i + n
        if logits_last and n:
            self.logits[i + n - 1] = 1
            self.n_outputs += 1
            return self.n_outputs - 1
        return -1

    def add_tokens_all_logits(self, tokens: Sequence[int] | np.ndarray, pos0: int,
                              seq_id: int) -> int:
        """Append a run asking logits for every token (a draft to verify); returns the
        output row of the first one (rows are consecutive)."""
        n = len(tokens)
        i = self.n_tokens
        self.token[i:i + n] = tokens
        self.pos[i:i + n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.seq_id[i:i + n, 0] = seq_id
        self.logits[i:i + n] = 1
        self.n_tokens = i + n
        first = self.n_outputs
        self.n_outputs += n
        return first


class LlamaContext:
    """A `llama_context` with its KV memory: decode, logits, and the sequence operations."""

    def __init__(self, model: LlamaModel, params: LlamaParams, *, embeddings: bool = False,
                 pooling: int = POOLING_UNSPECIFIED) -> None:
        """`embeddings` makes every token an output and keeps the pooled vector of each
        sequence (`embedding_seq`); `pooling` is a POOLING_* value (unspecified: the file's)."""
        log = llama_log()
        cp = L.llama_context_default_params()
        cp.embeddings = embeddings
        cp.pooling_type = pooling
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch
        cp.n_seq_max = params.n_seq_max
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads_batch
        cp.type_k = params.type_k
        cp.type_v = params.type_v
        cp.flash_attn_type = params.flash_attn
        cp.kv_unified = params.kv_unified
        cp.offload_kqv = params.offload_kqv
        cp.no_perf = params.no_perf
        cp.swa_full = params.swa_full
        with log.capture() as captured:
            ptr = L.llama_init_from_model(model.ptr, cp)
        self.init_log = "".join(captured)
        if not ptr:
            raise LoadError(f"llama.cpp could not create the context: {_first_reason(captured)}")
        self._ptr: int | None = ptr
        self.model = model
        self.n_vocab = model.n_vocab
        self.n_ctx = int(L.llama_n_ctx(ptr))
        self.n_batch = int(L.llama_n_batch(ptr))
        self.n_seq_max = int(L.llama_n_seq_max(ptr))
        self.n_ubatch = int(L.llama_n_ubatch(ptr))
        # Tokens a sliding-window layer sees; 0 when every layer keeps the whole context.
        self.swa_window = 0 if params.swa_full else model.n_swa
        self.memory = L.llama_get_memory(ptr)  # NULL (0) for encoders: no KV cache
        self.pooling = int(L.llama_pooling_type(ptr))  # POOLING_*, as llama.cpp resolved it
        # False for an encoder (BERT) or a diffusion model: it cannot write token by token.
        self.causal_attn = bool(L.llama_get_causal_attn(ptr))
        self._view_key: tuple[int, int] = (0, 0)
        self._view: np.ndarray = np.zeros((0, self.n_vocab), dtype=np.float32)

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            raise LoadError("the context was freed")
        return self._ptr

    def close(self) -> None:
        if self._ptr is not None:
            L.llama_free(self._ptr)
            self._ptr = None

    def flash_attn_used(self, requested: int) -> bool:
        """Whether flash attention ended up on: fixed when asked on/off, otherwise what
        llama.cpp's auto probe logged ("Flash Attention enabled" / "... disabled")."""
        if requested >= 0:
            return requested == 1
        text = self.init_log
        return "Flash Attention enabled" in text or "flash_attn = enabled" in text

    def decode(self, batch: Batch) -> int:
        """Run the batch. 0 ok; 1 no free KV cells (nothing changed); 2 aborted; <0 error."""
        batch.struct.n_tokens = batch.n_tokens
        return int(L.llama_decode(self.ptr, batch.struct))

    def logits(self, n_outputs: int) -> np.ndarray:
        """Zero-copy (n_outputs, n_vocab) float32 view of the last decode's output rows, in
        batch order. Valid until the next decode."""
        ptr = L.llama_get_logits(self.ptr)
        addr = ctypes.cast(ptr, ctypes.c_void_p).value or 0
        if (addr, n_outputs) != self._view_key:
            self._view = np.ctypeslib.as_array(ptr, shape=(n_outputs, self.n_vocab))
            self._view_key = (addr, n_outputs)
        return self._view

    def logits_ith(self, i: int) -> np.ndarray:
        """Zero-copy row for batch position `i` (llama_get_logits_ith)."""
        ptr = L.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise IndexError(f"no logits for batch position {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    # ---- embeddings (a context made with embeddings=True) ------------------------------------

    # float * llama_get_embeddings_seq(struct llama_context * ctx, llama_seq_id seq_id);
    def embedding_seq(self, seq_id: int) -> np.ndarray | None:
        """A copy of `seq_id`'s pooled vector (n_embd_out floats) from the last decode;
        None when the decode held no such sequence or the context does not pool."""
        ptr = L.llama_get_embeddings_seq(self.ptr, seq_id)
        if not ptr:
            return None
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_embd_out,)).copy()

    # float * llama_get_embeddings_ith(struct llama_context * ctx, int32_t i);
    def embedding_ith(self, i: int) -> np.ndarray:
        """A copy of the hidden state of the batch's token `i` (pooling "none")."""
        ptr = L.llama_get_embeddings_ith(self.ptr, i)
        if not ptr:
            raise IndexError(f"no embedding for batch position {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_embd_out,)).copy()

    # void llama_set_embeddings(struct llama_context * ctx, bool embeddings);
    def set_embeddings(self, on: bool) -> None:
        """Switch embedding outputs on or off for the next decodes (the pooling stays the
        one the context was made with)."""
        L.llama_set_embeddings(self.ptr, on)

    # ---- KV memory --------------------------------------------------------------------------

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Forget positions [p0, p1) of a sequence (-1: open end). Cells shared with other
        sequences stay for them."""
        return bool(L.llama_memory_seq_rm(self.memory, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Let `dst` see `src`'s cells at positions [p0, p1) (shared, not copied: unified KV)."""
        L.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        L.llama_memory_seq_keep(self.memory, seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return int(L.llama_memory_seq_pos_max(self.memory, seq_id))

    # llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id);
    def seq_pos_min(self, seq_id: int) -> int:
        """The oldest position the sequence still holds (-1: none). A sliding-window cache
        drops old cells and everything older with them, so the sequence always holds
        exactly [seq_pos_min, seq_pos_max]."""
        return int(L.llama_memory_seq_pos_min(self.memory, seq_id))

    # size_t llama_state_seq_get_size(struct llama_context * ctx, llama_seq_id seq_id);
    # size_t llama_state_seq_get_data(struct llama_context * ctx, uint8_t * dst, size_t size,
    #                                 llama_seq_id seq_id);
    def state_seq_get(self, seq_id: int) -> bytes:
        """One sequence's cells (positions, K and V rows in the cache's own types) as bytes;
        b"" when it holds none or llama.cpp could not write them (it logs why)."""
        size = int(L.llama_state_seq_get_size(self.ptr, seq_id))
        if size <= 0:
            return b""
        buf = (ctypes.c_uint8 * size)()
        written = int(L.llama_state_seq_get_data(self.ptr, buf, size, seq_id))
        return bytes(memoryview(buf)[:written]) if written > 0 else b""

    # size_t llama_state_seq_set_data(struct llama_context * ctx, const uint8_t * src,
    #                                 size_t size, llama_seq_id dest_seq_id);  0: failed
    def state_seq_set(self, seq_id: int, data: bytes) -> bool:
        """Put cells saved by `state_seq_get` into `seq_id` (whose cells are dropped first).
        False when llama.cpp refused them (wrong layer count, types, too few free cells);
        then the sequence holds nothing."""
        if not data:
            return False
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if int(L.llama_state_seq_set_data(self.ptr, buf, len(data), seq_id)) > 0:
            return True
        self.seq_rm(seq_id, -1, -1)
        return False

    def clear(self) -> None:
        L.llama_memory_clear(self.memory, True)


def supports_gpu_offload() -> bool:
    """A GPU backend here (CUDA, Metal ...). Not llama.cpp's `llama_supports_gpu_offload`,
    which also says yes for a CPU build with the RPC backend (every build of ours): layers
    go to workers only when the load names them."""
    return has_local_gpu()


def system_info() -> str:
    return bytes(L.llama_print_system_info()).decode("utf-8", errors="replace")

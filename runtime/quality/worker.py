"""The process that runs `llama_model_quantize` for `runtime.quality.quantize.quantize`.

Started as `python -m runtime.quality.worker` with the job as one JSON object on stdin
(src, dst and the fields of a `QuantPlan`). It answers on stdout, one JSON message a line,
each behind a marker so stray output of native code cannot be mistaken for one:

    @@outrider ["progress", done, total, tensor_name]   one per tensor, from llama.cpp's log
    @@outrider ["error", line]                          llama.cpp's warning and error lines
    @@outrider ["raise", "ImatrixError", message]       a typed error raised here
    @@outrider ["done", rc]                             llama_model_quantize's result (0 = ok)

A subprocess rather than multiprocessing: spawn re-imports the caller's main module, which
breaks any script without a `__main__` guard. Killing it is how a quantization is cancelled;
the parent owns the output file's fate.
"""

from __future__ import annotations

import ctypes
import json
import re
import sys
from typing import Any

from runtime.quality.quantize import MARKER, QuantPlan, plan_from_json

_TENSOR_LINE = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_WARN, _ERROR, _CONT = 3, 4, 5  # enum ggml_log_level


class _Channel:
    """Marked JSON lines on the real stdout, flushed at once."""

    def __init__(self) -> None:
        self._out = sys.stdout

    def send(self, message: tuple[Any, ...]) -> None:
        self._out.write(MARKER + json.dumps(message) + "\n")
        self._out.flush()


def main() -> int:
    """Quantize as the job on stdin says; report on stdout."""
    from runtime.errors import OutriderError

    conn = _Channel()
    src, dst, plan = plan_from_json(sys.stdin.read())
    try:
        rc = _quantize(src, dst, plan, conn)
    except OutriderError as exc:
        conn.send(("raise", type(exc).__name__, str(exc)))
        rc = 2
    conn.send(("done", rc))
    return 0


def _quantize(src: str, dst: str, plan: QuantPlan, conn: _Channel) -> int:
    import llama_cpp.llama_cpp as L

    last_level = [0]

    def on_log(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
        line = (text or b"").decode("utf-8", errors="replace")
        if level != _CONT:
            last_level[0] = level
        match = _TENSOR_LINE.match(line)
        if match:
            conn.send(("progress", int(match.group(1)), int(match.group(2)), match.group(3)))
        elif last_level[0] >= _WARN and line.strip():
            conn.send(("error", line.strip()))

    callback = L.llama_log_callback(on_log)  # kept referenced for the whole call
    L.llama_log_set(callback, ctypes.c_void_p(0))
    L.llama_backend_init()

    params = L.llama_model_quantize_default_params()
    params.nthread = plan.n_threads
    params.ftype = plan.ftype
    params.allow_requantize = plan.allow_requantize
    if plan.token_embedding_type is not None:
        params.token_embedding_type = plan.token_embedding_type
    if plan.output_tensor_type is not None:
        params.output_tensor_type = plan.output_tensor_type

    keep: list[Any] = [callback]
    if plan.tensor_types:
        overrides = (L.llama_model_tensor_override * (len(plan.tensor_types) + 1))()
        for i, (pattern, type_id) in enumerate(plan.tensor_types):
            encoded = pattern.encode()
            keep.append(encoded)
            overrides[i].pattern = encoded
            overrides[i].type = type_id
        overrides[len(plan.tensor_types)].pattern = None  # terminator
        overrides[len(plan.tensor_types)].type = L.GGML_TYPE_COUNT
        keep.append(overrides)
        params.tt_overrides = ctypes.cast(
            overrides, ctypes.POINTER(L.llama_model_tensor_override))

    if plan.imatrix is not None:
        from runtime.quality.imatrix import load_imatrix, to_llama_array

        matrix = load_imatrix(plan.imatrix)
        pointer, keep_matrix = to_llama_array(matrix)
        keep += keep_matrix
        params.imatrix = pointer
        kv = _imatrix_provenance(L, str(plan.imatrix), len(matrix.entries), matrix.chunk_count)
        keep.append(kv)
        params.kv_overrides = ctypes.cast(kv, ctypes.POINTER(L.llama_model_kv_override))

    rc = int(L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))
    del keep
    return rc


def _imatrix_provenance(L: Any, file: str, n_entries: int, n_chunks: int) -> Any:
    """The `quantize.imatrix.*` keys llama-quantize records in its output."""
    items: list[tuple[str, int, Any]] = [
        ("quantize.imatrix.file", L.LLAMA_KV_OVERRIDE_TYPE_STR, file.encode()[:127]),
        ("quantize.imatrix.entries_count", L.LLAMA_KV_OVERRIDE_TYPE_INT, n_entries),
    ]
    if n_chunks > 0:
        items.append(("quantize.imatrix.chunks_count", L.LLAMA_KV_OVERRIDE_TYPE_INT, n_chunks))
    array = (L.llama_model_kv_override * (len(items) + 1))()
    for i, (key, tag, value) in enumerate(items):
        array[i].key = key.encode()
        array[i].tag = tag
        if tag == L.LLAMA_KV_OVERRIDE_TYPE_STR:
            array[i].value.val_str = value
        else:
            array[i].value.val_i64 = value
    array[len(items)].key = b""  # terminator: empty key
    return array


if __name__ == "__main__":
    sys.exit(main())

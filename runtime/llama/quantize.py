"""llama.cpp's quantizer, `llama_model_quantize`: one call that writes a GGUF of another type,
with per-tensor types, an importance matrix and metadata keys of its own.

What to make is decided before, pure (`runtime.quality.quantize`: a recipe → a `QuantPlan`,
the ids below); this module only hands it to llama.cpp. It runs in the quantize worker
process (`runtime.quality.worker`): a cancel is a kill there, and an abort inside llama.cpp
takes only the worker. llama.cpp says how it goes in its log (`LlamaLog.listen`).

    rc = quantize_file("m.F16.gguf", "m.Q8_0.gguf", plan)           # 0: written
    rc = quantize_file(src, dst, plan, imatrix=matrix.entries,
                       metadata=(("quantize.imatrix.entries_count", 168),))
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import llama_cpp.llama_cpp as L
import numpy as np

from runtime.errors import ImatrixError
from runtime.llama.binding import llama_log


class QuantizeFields(Protocol):
    """The fields of `llama_model_quantize_params` a plan decides (`QuantPlan`)."""

    @property
    def ftype(self) -> int: ...  # llama_ftype
    @property
    def n_threads(self) -> int: ...  # 0: llama.cpp's own default, every hardware thread
    @property
    def allow_requantize(self) -> bool: ...
    @property
    def token_embedding_type(self) -> int | None: ...  # a ggml type id; None: the ftype's
    @property
    def output_tensor_type(self) -> int | None: ...
    @property
    def tensor_types(self) -> Sequence[tuple[str, int]]: ...  # (regex, type id), first wins


# uint32_t llama_model_quantize(const char * fname_inp, const char * fname_out,
#                               const llama_model_quantize_params * params);  0: written
def quantize_file(src: str, dst: str, plan: QuantizeFields, *,
                  imatrix: Mapping[str, np.ndarray] | None = None,
                  metadata: Sequence[tuple[str, str | int]] = ()) -> int:
    """Quantize `src` into `dst` as `plan` says; llama.cpp's result (0: written). `imatrix`
    is each weight's importance per input column (`runtime.quality.imatrix`); `metadata`
    are keys written into the output (strings cut to 127 bytes)."""
    llama_log()  # the backend initialised and its log taken, as for any other call
    params = L.llama_model_quantize_default_params()
    params.nthread = plan.n_threads
    params.ftype = plan.ftype
    params.allow_requantize = plan.allow_requantize
    if plan.token_embedding_type is not None:
        params.token_embedding_type = plan.token_embedding_type
    if plan.output_tensor_type is not None:
        params.output_tensor_type = plan.output_tensor_type
    keep: list[Any] = []  # what llama.cpp reads through pointers, alive until it returns
    if plan.tensor_types:
        overrides, keep_overrides = _tensor_overrides(plan.tensor_types)
        keep += keep_overrides
        params.tt_overrides = overrides
    if imatrix is not None:
        array, keep_matrix = _imatrix_array(imatrix)
        keep += keep_matrix
        params.imatrix = array
    if metadata:
        kv = _kv_overrides(metadata)
        keep.append(kv)
        params.kv_overrides = ctypes.cast(kv, ctypes.POINTER(L.llama_model_kv_override))
    rc = int(L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))
    del keep
    return rc


# struct llama_model_tensor_override { const char * pattern; enum ggml_type type; };
def _tensor_overrides(types: Sequence[tuple[str, int]]) -> tuple[Any, list[Any]]:
    """The array `tt_overrides` points to, ended by a NULL pattern and GGML_TYPE_COUNT."""
    overrides = (L.llama_model_tensor_override * (len(types) + 1))()
    keep: list[Any] = [overrides]
    for i, (pattern, type_id) in enumerate(types):
        encoded = pattern.encode()
        keep.append(encoded)
        overrides[i].pattern = encoded
        overrides[i].type = type_id
    overrides[len(types)].pattern = None
    overrides[len(types)].type = L.GGML_TYPE_COUNT
    return ctypes.cast(overrides, ctypes.POINTER(L.llama_model_tensor_override)), keep


# struct llama_model_imatrix_data { const char * name; const float * data; size_t size; };
def _imatrix_array(entries: Mapping[str, np.ndarray]) -> tuple[Any, list[Any]]:
    """The NULL-ended array `imatrix` points to. llama.cpp copies the data when quantizing
    starts, but the names and float buffers must stay alive until then: hence `keep`."""
    items = list(entries.items())
    array = (L.llama_model_imatrix_data * (len(items) + 1))()
    keep: list[Any] = [array]
    for i, (name, values) in enumerate(items):
        buf = np.ascontiguousarray(values, dtype=np.float32)
        if not np.isfinite(buf).all():
            raise ImatrixError(f"the importance matrix has non-finite values for {name}")
        cname = name.encode()
        keep += [buf, cname]
        array[i].name = cname
        array[i].data = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        array[i].size = buf.size
    array[len(items)].name = None
    return ctypes.cast(array, ctypes.POINTER(L.llama_model_imatrix_data)), keep


# struct llama_model_kv_override { enum llama_model_kv_override_type tag; char key[128];
#     union { int64_t val_i64; double val_f64; bool val_bool; char val_str[128]; }; };
def _kv_overrides(items: Sequence[tuple[str, str | int]]) -> Any:
    """The array `kv_overrides` points to, ended by an empty key."""
    array = (L.llama_model_kv_override * (len(items) + 1))()
    for i, (key, value) in enumerate(items):
        array[i].key = key.encode()
        union: Any = array[i].value  # the binding's hints call it a scalar, not the union
        if isinstance(value, str):
            array[i].tag = L.LLAMA_KV_OVERRIDE_TYPE_STR
            union.val_str = value.encode()[:127]
        else:
            array[i].tag = L.LLAMA_KV_OVERRIDE_TYPE_INT
            union.val_i64 = value
    array[len(items)].key = b""
    return array

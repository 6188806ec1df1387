"""What a GGUF model is, from its header alone: `ModelInfo`, read from a local file or a URL.

    info = read_model_info(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))   # the default model
    info.architecture, info.block_count, info.n_head_kv[0], info.key_length, info.quant
    # ('llama', 30, 3, 64, 'Q4_1')
    info.tensor_bytes, round(info.bits_per_weight, 2)
    # (96576768, 5.74)

The vocabulary can be large (150k tokens, megabytes of text), so `ModelInfo` does not hold
it: it keeps the token count, a fingerprint of the raw token list (`vocab_fingerprint`: two
files with the same fingerprint have the same tokens) and where the list lies in the file;
`token_texts()` and `token_types()` read it when someone needs it. The tokenizer facts come
from `runtime.gguf.vocab`, the one reader of a vocabulary.

This module knows local files only. A model on a web server is described by
`runtime.gguf.remote.read_remote_model_info`, which parses the header bytes it fetched with
`model_info_from_headers` here and hands in a `span_reader` that fetches the token list.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from runtime.errors import CorruptModel
from runtime.gguf.constants import FILE_TYPES, SWA_DEFAULTS
from runtime.gguf.header import GGUFHeader, LazyArray, metadata_value
from runtime.gguf.preflight import inspect_gguf
from runtime.gguf.vocab import header_vocabulary, read_span

_LAYER = re.compile(r"^blk\.(\d+)\.")
# The routed expert tensors, as llama.cpp's LLM_FFN_EXPS_REGEX (common/common.h) matches them
# for --cpu-moe: ffn_{up,down,gate,gate_up}_exps and their "chexps" variants, never the
# shared experts (ffn_*_shexp) nor the router (ffn_gate_inp).
EXPERT_TENSOR = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
_EXPERT = re.compile(EXPERT_TENSOR)
_INPUT_PREFIXES = ("token_embd", "token_types", "position_embd")
_NOT_DATA = ("tokens_span", "token_types_span", "span_reader")  # never saved or compared

# Reads one array span of the model's first part: (span, extra request headers) → its bytes.
SpanReader = Callable[[LazyArray, dict[str, str] | None], bytes]


@dataclass(frozen=True)
class ModelInfo:
    """Everything Outrider needs to know about a model before loading it.

    Per-layer tuples have `block_count` entries. Bytes are as laid out in the file (each
    tensor padded to the file's alignment, as llama.cpp allocates them).
    """

    path_or_url: str  # the first part for a split model
    architecture: str
    name: str
    n_params: int
    block_count: int
    n_embd: int
    n_ff: int
    n_head: int  # the largest per-layer query head count
    n_head_kv: tuple[int, ...]  # per layer; 0 for layers without attention (recurrent)
    key_length: int  # per head
    value_length: int
    kv_lora_rank: int | None  # MLA (DeepSeek): compressed KV width, else None
    rope_dims: int  # rotary dimensions per head (MLA stores kv_lora_rank + rope_dims)
    key_length_mla: int | None  # set in files converted for llama.cpp's MLA cache
    sliding_window: int | None
    swa_layers: tuple[bool, ...]  # per layer: True where attention is sliding-window
    n_expert: int
    n_expert_used: int
    n_ff_expert: int  # per expert; 0 for dense models
    n_ctx_train: int
    n_vocab: int
    tokenizer_model: str | None
    tokenizer_pre: str | None
    bos_id: int | None
    eos_id: int | None
    add_bos: bool | None  # None: the file does not say (llama.cpp picks per tokenizer)
    add_eos: bool | None
    chat_template: str | None
    file_type: int  # general.file_type, -1 when absent
    quant: str  # "Q4_1", "Q4_K_M", "F16"…; from the tensor types when file_type is absent
    tensor_bytes: int  # all tensor data, padding included (= the data sections' size)
    tensor_bytes_by_layer: tuple[int, ...]
    input_bytes: int  # token embeddings: llama.cpp always keeps these in RAM
    output_bytes: int  # output head and final norm: on the GPU only when all layers are
    tied_embeddings: bool  # no output.weight: llama.cpp reuses token_embd as the head
    bytes_by_type: tuple[tuple[str, int], ...]  # ggml type name → bytes, largest first
    split_index: int  # 0-based index of the part that was opened
    split_count: int  # 1 for a single file
    split_paths: tuple[str, ...]  # every part, in order
    file_size: int  # all parts together
    header_bytes: int  # bytes before the (first part's) tensor data
    n_tokens: int
    vocab_fingerprint: str  # sha256 prefix of the raw token list; "" without one
    tokens_span: LazyArray | None = field(default=None, repr=False, compare=False)
    token_types_span: LazyArray | None = field(default=None, repr=False, compare=False)
    # reads the spans; None: from the local file `path_or_url`
    span_reader: SpanReader | None = field(default=None, repr=False, compare=False)
    # Mixture of experts: per block, the bytes of the routed expert tensors (those llama.cpp's
    # --cpu-moe pattern matches, `EXPERT_TENSOR`); shared experts stay with their block.
    expert_bytes_by_layer: tuple[int, ...] = ()
    n_expert_shared: int = 0

    @property
    def bits_per_weight(self) -> float:
        """Average bits per parameter, e.g. 4.5 for Q4_0 (18 bytes per 32 values)."""
        weight_bytes = sum(n for _, n in self.bytes_by_type)
        return 8 * weight_bytes / self.n_params if self.n_params else 0.0

    @property
    def is_moe(self) -> bool:
        return any(self.expert_bytes_by_layer)

    def expert_bytes(self, layer: int) -> int:
        """Bytes of block `layer`'s routed experts (0 for a dense model or a dense block)."""
        return self.expert_bytes_by_layer[layer] if self.expert_bytes_by_layer else 0

    @property
    def n_layers_offloadable(self) -> int:
        """llama.cpp's `n_gpu_layers` scale: the blocks plus the output layer."""
        return self.block_count + 1

    @property
    def is_remote(self) -> bool:
        return self.path_or_url.startswith(("http://", "https://"))

    def token_texts(self, headers: dict[str, str] | None = None) -> tuple[str, ...]:
        """The vocabulary, read from the file (or URL) now. Empty without a token list."""
        span = self.tokens_span
        return () if span is None else span.decode(self._read_span(span, headers))

    def token_types(self, headers: dict[str, str] | None = None) -> tuple[int, ...]:
        span = self.token_types_span
        return () if span is None else span.decode(self._read_span(span, headers))

    def _read_span(self, span: LazyArray, headers: dict[str, str] | None) -> bytes:
        if self.span_reader is not None:
            return self.span_reader(span, headers)
        return read_span(self.path_or_url, span)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: everything except the token spans and their reader; the chat template included."""
        out = asdict(self)
        for name in _NOT_DATA:
            out.pop(name)
        out["bytes_by_type"] = dict(self.bytes_by_type)
        out["bits_per_weight"] = round(self.bits_per_weight, 3)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelInfo:
        """Rebuild from `to_dict()` output (e.g. a cached JSON). The vocabulary spans are
        not kept, so `token_texts()` of the result is empty; everything else round-trips."""
        names = {f.name for f in fields(cls)} - set(_NOT_DATA)
        kwargs: dict[str, Any] = {}
        for name in names:
            value = data[name]
            if name == "bytes_by_type" and isinstance(value, dict):
                value = tuple(value.items())
            elif isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            kwargs[name] = value
        return cls(**kwargs)


def read_model_info(path: Path) -> ModelInfo:
    """Preflight `path` (any part of a split set) and describe the model. Typed errors only."""
    _, parts = inspect_gguf(Path(path))
    sizes = [p.stat().st_size for p, _ in parts]
    opened = Path(path)
    index = next((i for i, (p, _) in enumerate(parts) if p == opened), 0)
    return model_info_from_headers(
        str(parts[0][0]), [h for _, h in parts], [str(p) for p, _ in parts], sum(sizes), index)


def model_info_from_headers(source: str, headers: list[GGUFHeader], part_paths: list[str],
                            file_size: int, split_index: int = 0,
                            span_reader: SpanReader | None = None) -> ModelInfo:
    """Build `ModelInfo` from the parsed header of every part (metadata from the first).

    `span_reader` reads the token list later; None reads it from the local file `source`."""
    kv = headers[0].kv
    arch = _get(kv, "general.architecture", str)
    p = arch + "."
    block_count = _get(kv, p + "block_count", int)
    if not 0 < block_count <= 10_000:
        raise CorruptModel(f"{p}block_count is {block_count}, not a plausible layer count")
    n_embd = _get(kv, p + "embedding_length", int)
    n_head_l = _per_layer(kv, p + "attention.head_count", block_count, 0)
    n_head_kv = _per_layer(kv, p + "attention.head_count_kv", block_count, None) or n_head_l
    head0 = next((h for h in n_head_l if h), 0)
    key_length = _opt(kv, p + "attention.key_length", int) or (n_embd // head0 if head0 else 0)
    value_length = _opt(kv, p + "attention.value_length", int) or (n_embd // head0 if head0 else 0)
    kv_lora_rank = _opt(kv, p + "attention.kv_lora_rank", int)
    rope_dims = _opt(kv, p + "rope.dimension_count", int) or key_length
    window, swa_layers = _sliding_window(kv, arch, block_count)

    tensors = [t for h in headers for t in h.tensors]
    alignment = headers[0].alignment
    by_layer = [0] * block_count
    experts = [0] * block_count
    input_bytes = output_bytes = 0
    type_bytes: Counter[str] = Counter()
    weight_types: Counter[str] = Counter()
    for t in tensors:
        padded = (t.n_bytes + alignment - 1) // alignment * alignment
        type_bytes[t.type_name] += t.n_bytes
        if len(t.shape) >= 2:
            weight_types[t.type_name] += t.n_elements
        match = _LAYER.match(t.name)
        if match and int(match[1]) < block_count:
            by_layer[int(match[1])] += padded
            if _EXPERT.search(t.name):
                experts[int(match[1])] += padded
        elif t.name.startswith(_INPUT_PREFIXES):
            input_bytes += padded
        else:
            output_bytes += padded

    file_type = _opt(kv, "general.file_type", int)
    if file_type is not None and file_type in FILE_TYPES:
        quant = FILE_TYPES[file_type]
    else:  # most parameters by type among the weight matrices
        quant = weight_types.most_common(1)[0][0] if weight_types else "unknown"
    vocab = header_vocabulary(headers[0])
    name = _opt(kv, "general.name", str) or Path(source.split("?")[0]).stem
    return ModelInfo(
        path_or_url=source, architecture=arch, name=name,
        n_params=sum(t.n_elements for t in tensors), block_count=block_count, n_embd=n_embd,
        n_ff=_first(kv.get(p + "feed_forward_length")), n_head=max(n_head_l),
        n_head_kv=n_head_kv, key_length=key_length, value_length=value_length,
        kv_lora_rank=kv_lora_rank, rope_dims=rope_dims,
        key_length_mla=_opt(kv, p + "attention.key_length_mla", int), sliding_window=window,
        swa_layers=swa_layers, n_expert=_opt(kv, p + "expert_count", int) or 0,
        n_expert_used=_opt(kv, p + "expert_used_count", int) or 0,
        n_ff_expert=_first(kv.get(p + "expert_feed_forward_length")),
        n_ctx_train=_opt(kv, p + "context_length", int) or 0,
        n_vocab=_opt(kv, p + "vocab_size", int) or vocab.n_tokens,
        tokenizer_model=vocab.model, tokenizer_pre=vocab.pre, bos_id=vocab.bos_id,
        eos_id=vocab.eos_id, add_bos=vocab.add_bos, add_eos=vocab.add_eos,
        chat_template=_opt(kv, "tokenizer.chat_template", str),
        file_type=-1 if file_type is None else file_type, quant=quant,
        tensor_bytes=sum(by_layer) + input_bytes + output_bytes,
        tensor_bytes_by_layer=tuple(by_layer), input_bytes=input_bytes,
        output_bytes=output_bytes,
        tied_embeddings=not any(t.name == "output.weight" for t in tensors),
        bytes_by_type=tuple(type_bytes.most_common()),
        split_index=split_index, split_count=len(headers), split_paths=tuple(part_paths),
        file_size=file_size, header_bytes=headers[0].data_offset, n_tokens=vocab.n_tokens,
        vocab_fingerprint=vocab.fingerprint, tokens_span=vocab.tokens,
        token_types_span=vocab.token_types, span_reader=span_reader,
        expert_bytes_by_layer=tuple(experts) if any(experts) else (),
        n_expert_shared=_opt(kv, p + "expert_shared_count", int) or 0,
    )


def _sliding_window(kv: dict[str, Any], arch: str, n_layer: int) -> tuple[int | None, tuple[bool, ...]]:
    """Window size and per-layer SWA flags, as llama.cpp's `load_swa_pattern` decides them.

    Only architectures that llama.cpp runs with sliding-window attention count: a Mistral
    or Qwen2 file may carry a `sliding_window` key that llama.cpp ignores.
    """
    none = (None, (False,) * n_layer)
    if arch not in SWA_DEFAULTS:
        return none
    period, dense_first, default_window = SWA_DEFAULTS[arch]
    window = _opt(kv, arch + ".attention.sliding_window", int) or default_window
    if not window:
        return none
    pattern = kv.get(arch + ".attention.sliding_window_pattern")
    if isinstance(pattern, tuple) and len(pattern) == n_layer:
        return window, tuple(bool(x) for x in pattern)
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        period = pattern
    if dense_first:
        flags = tuple(period == 0 or il % period != 0 for il in range(n_layer))
    else:
        flags = tuple(period == 0 or il % period < period - 1 for il in range(n_layer))
    return window, flags


def _get(kv: dict[str, Any], key: str, kind: type) -> Any:
    value = _opt(kv, key, kind)
    if value is None:
        raise CorruptModel(f"the model's metadata lacks {key}")
    return value


_opt = metadata_value  # short: the builder above reads some twenty keys


def _first(value: Any) -> int:
    if isinstance(value, tuple):
        return int(max(value)) if value else 0
    return int(value) if isinstance(value, int) else 0


def _per_layer(kv: dict[str, Any], key: str, n_layer: int, default: int | None) -> tuple[int, ...]:
    value = kv.get(key)
    if value is None:
        if default is None:
            return ()
        return (default,) * n_layer
    if isinstance(value, tuple):
        if len(value) != n_layer or not all(isinstance(v, int) and v >= 0 for v in value):
            raise CorruptModel(f"metadata {key} should list {n_layer} layer counts")
        return tuple(int(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CorruptModel(f"metadata {key} is {value!r}, not a head count")
    return (value,) * n_layer

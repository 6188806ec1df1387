"""What llama.cpp asserts about a model, checked from the header before llama.cpp sees the file.

A well-formed GGUF can still abort llama.cpp: its loader checks hyperparameters with
`GGML_ASSERT` (SIGABRT, the whole process gone) and its CPU kernels abort on a weight type
they have no code for. `check_model_rules` refuses each such file with a `CorruptModel`
whose one line names the key or tensor:

    >>> kv = {"general.architecture": "llama", "llama.block_count": 1,
    ...       "llama.context_length": 2048, "llama.embedding_length": 64,
    ...       "llama.expert_count": 8, "llama.expert_used_count": 0}
    >>> header = GGUFHeader(3, kv, {}, (), alignment=32, data_offset=0, data_size=0)
    >>> tensors = [TensorInfo("blk.0.ffn_up_exps.weight", (64, 128, 8), 0, 0, 65536, 262144)]
    >>> check_model_rules(header, tensors, Path("moe.gguf"))
    Traceback (most recent call last):
    runtime.errors.CorruptModel: moe.gguf has llama.expert_count 8 but llama.expert_used_count 0; llama.cpp needs 1 to 8 experts per token

The rules, with the line of llama.cpp (the version llama-cpp-python 0.3.36 vendors) that
aborts without them:

- layers: `block_count` in 1..LLAMA_MAX_LAYERS (llama-model.cpp:1328), `nextn_predict_layers`
  at most that (1330); the `blk.N.` tensors cover exactly those layers (otherwise "missing
  tensor" or "wrong number of tensors").
- experts: at most LLAMA_MAX_EXPERTS (1361); `expert_used_count` ≤ `expert_count` (1362), > 0
  when there are experts (1364), 0 when there are none (1372); expert groups (1365-1373);
  expert tensors (`ffn_*_exps`) exactly when `expert_count` > 0.
- heads: a layer with attention tensors has `head_count` > 0 and a `head_count_kv` > 0 that
  divides it (ggml_mul_mat's broadcast, ggml.c `ggml_can_mul_mat`); without `key_length`,
  `head_count` divides `embedding_length` (llama.cpp takes `n_embd / n_head`); a `llama`
  model's key and value lengths are equal (models/llama.cpp:102).
- numbers: norm epsilons finite and positive (ggml-cpu/ops.cpp:4026, 4132: `eps >= 0`, so
  NaN aborts), RoPE bases finite and positive, the scaling factor finite, the scaling type
  one llama.cpp names (llama-model.cpp:1420).
- tensor types: norms and biases F32 (the graph multiplies F32 activations by them and
  ggml-cpu/binary-ops.cpp:135 has no F32×F16 or F32×quantized case: "binary_op:
  unsupported types"); matrices a float or quantized type, never I8..I64, F64, Q8_1 or
  Q8_K (ggml-cpu/ggml-cpu.c type_traits_cpu gives them no `vec_dot`: a segfault).
- data: every tensor starts on a 32-byte boundary of the file (TENSOR_ALIGNMENT: an mmapped
  buffer asserts it, ggml-backend.cpp:2527 "buffer pointer must be aligned"; a
  `general.alignment` of 1 breaks it).
- tokenizer: a model type llama.cpp knows and a token list (`none` loads, then the first
  tokenize aborts: llama-vocab.cpp:3422, "Tokenizer not initialized"), merges for a BPE
  model, unique token strings (llama-vocab.cpp:2544: the token → id map must be as long as
  the list), every byte spellable for SentencePiece (`byte_to_token` throws out of the
  tokenizer, llama-vocab.cpp:4014: "terminate called after throwing std::out_of_range"),
  the token list within the embedding, and bos/eos present where the tokenizer adds them
  (llama-vocab.cpp:3443, 3480).
- and, refused although llama.cpp only returns an error for them, the keys every model needs
  (`block_count`, `context_length`, `embedding_length`, `tokenizer.ggml.model`): the message
  names the key instead of the loader's first log line.

A RoPE base of 0 does not abort; it makes every logit NaN, so it is refused too. The
corpus in tests/fixtures/gguf_mutations.py holds a file for each rule, and loading those
files in a child process shows the abort (SIGABRT, or SIGSEGV for a matrix in I32 or Q8_1)
each rule prevents.

Why not every special id in range: llama.cpp disables an out-of-range pad, mask or FIM id
with a warning, and real files carry them (a pad id equal to the vocabulary size); only the
ids the tokenizer asserts on, plus bos/eos/unk/sep stated out of range, are refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gguf import GGUFValueType

from runtime.errors import CorruptModel, shown
from runtime.gguf.header import GGUFHeader, TensorInfo, metadata_value
from runtime.gguf.vocab import KNOWN_TOKENIZERS, header_vocabulary, read_span, tokenizer_facts

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024
TENSOR_ALIGNMENT = 32  # ggml/src/ggml-impl.h
ROPE_SCALING_TYPES = frozenset({"none", "linear", "yarn", "longrope"})
# Types without a CPU dot product (ggml-cpu/ggml-cpu.c, type_traits_cpu: no .vec_dot), so a
# matrix stored in one has nothing to multiply it with; Q8_1 and Q8_K are activation formats.
_NO_DOT_PRODUCT = frozenset({"I8", "I16", "I32", "I64", "F64", "Q8_1", "Q8_K"})
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_EXPERTS = re.compile(r"\.ffn_[a-z_]+_exps\.")
_QUERIES = (".attn_q.weight", ".attn_qkv.weight")  # a layer with these needs query heads
_KEYS = (".attn_k.weight", ".attn_qkv.weight")  # and with these, key/value heads
_STATED_IDS = ("bos", "eos", "unknown", "seperator")  # llama.cpp's key spellings
_BPE_MODELS = frozenset({"gpt2", "hybriddna", "whitespace"})
_NO_VOCAB = frozenset({"none", "no_vocab"})


def check_model_rules(header: GGUFHeader, tensors: Sequence[TensorInfo], path: Path) -> None:
    """Refuse what llama.cpp would abort on; `header` is the first part, `tensors` all parts'."""
    name = shown(path.name)
    kv = header.kv
    arch = kv["general.architecture"]
    if not tensors:
        raise CorruptModel(f"{name} has no tensors; it holds metadata only (a vocabulary file?)")
    n_layer = _layers(kv, arch, tensors, name)
    _experts(kv, arch, n_layer, tensors, name)
    _heads(kv, arch, n_layer, tensors, name)
    _numbers(kv, arch, name)
    _tensor_types(tensors, name)
    _tokenizer(header, tensors, path)


def check_tensor_alignment(header: GGUFHeader, path: Path) -> None:
    """Every tensor of one part starts on a 32-byte boundary of the file.

    An alignment below 32 is refused even where the offsets happen to fall on a boundary:
    no writer makes one, and the next edit of the file would break it."""
    name = shown(path.name)
    if header.alignment < TENSOR_ALIGNMENT:
        raise CorruptModel(f"{name} has general.alignment {header.alignment}, below the "
                           f"{TENSOR_ALIGNMENT} bytes llama.cpp's tensor buffers need")
    if header.tensors and header.data_offset % TENSOR_ALIGNMENT:
        raise CorruptModel(f"{name} has general.alignment {header.alignment}: its tensor "
                           f"data starts at byte {header.data_offset:,}, not on the "
                           f"{TENSOR_ALIGNMENT}-byte boundary llama.cpp needs")
    for t in header.tensors:
        if t.offset % TENSOR_ALIGNMENT:
            raise CorruptModel(f"{name} has general.alignment {header.alignment}: tensor "
                               f"{shown(t.name)} is not on the {TENSOR_ALIGNMENT}-byte boundary "
                               "llama.cpp needs")


def _layers(kv: dict[str, Any], arch: str, tensors: Sequence[TensorInfo], name: str) -> int:
    key = f"{arch}.block_count"
    n_layer = _count(kv, key, name, required=True)
    if not 1 <= n_layer <= LLAMA_MAX_LAYERS:
        raise CorruptModel(f"{name} has {key} {n_layer:,}; llama.cpp runs 1 to "
                           f"{LLAMA_MAX_LAYERS} layers")
    nextn = _count(kv, f"{arch}.nextn_predict_layers", name)
    if nextn > n_layer:
        raise CorruptModel(f"{name} has {arch}.nextn_predict_layers {nextn:,}, more than its "
                           f"{key} {n_layer}")
    for required in (f"{arch}.context_length", f"{arch}.embedding_length"):
        if _count(kv, required, name, required=True) == 0:
            raise CorruptModel(f"{name} has {required} 0")
    layers = {int(m[1]) for t in tensors if (m := _BLOCK.match(t.name))}
    if layers:
        if max(layers) >= n_layer:
            raise CorruptModel(f"{name} has tensors for layer blk.{max(layers)} but {key} is "
                               f"{n_layer}")
        missing = sorted(set(range(n_layer)) - layers)
        if missing:
            raise CorruptModel(f"{name} has {key} {n_layer} but no tensors for layer "
                               f"blk.{missing[0]}")
    return n_layer


def _experts(kv: dict[str, Any], arch: str, n_layer: int, tensors: Sequence[TensorInfo],
             name: str) -> None:
    count_key, used_key = f"{arch}.expert_count", f"{arch}.expert_used_count"
    n_expert = _count(kv, count_key, name)
    used = max(_per_layer(kv, used_key, n_layer, name) or (0,))
    expert_tensor = next((t.name for t in tensors if _EXPERTS.search(t.name)), None)
    if n_expert > LLAMA_MAX_EXPERTS:
        raise CorruptModel(f"{name} has {count_key} {n_expert:,}; llama.cpp allows at most "
                           f"{LLAMA_MAX_EXPERTS}")
    if used > n_expert:
        raise CorruptModel(f"{name} has {used_key} {used:,}, more than its {count_key} {n_expert}")
    if n_expert and not used:
        raise CorruptModel(f"{name} has {count_key} {n_expert} but {used_key} 0; llama.cpp "
                           f"needs 1 to {n_expert} experts per token")
    groups_key = f"{arch}.expert_group_count"
    groups = _count(kv, groups_key, name)
    group_used = _count(kv, f"{arch}.expert_group_used_count", name)
    if groups and not (groups < n_expert and (groups == 1 or (
            n_expert % groups == 0 and 0 < group_used < groups))):
        raise CorruptModel(f"{name} has {groups_key} {groups:,}, which does not split its "
                           f"{n_expert} experts into groups llama.cpp accepts")
    if n_expert and expert_tensor is None:
        raise CorruptModel(f"{name} has {count_key} {n_expert} but no expert tensors "
                           "(ffn_*_exps)")
    if not n_expert and expert_tensor is not None:
        raise CorruptModel(f"{name} has expert tensor {shown(expert_tensor)} but no {count_key}")


def _heads(kv: dict[str, Any], arch: str, n_layer: int, tensors: Sequence[TensorInfo],
           name: str) -> None:
    head_key, kv_key = f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"
    heads = _per_layer(kv, head_key, n_layer, name) or (0,) * n_layer
    heads_kv = _per_layer(kv, kv_key, n_layer, name) or heads
    n_embd = _count(kv, f"{arch}.embedding_length", name)
    key_length = _count(kv, f"{arch}.attention.key_length", name)
    if heads[0] and not key_length and n_embd % heads[0]:
        raise CorruptModel(f"{name} has {arch}.embedding_length {n_embd:,}, not a multiple of "
                           f"its {head_key} {heads[0]:,}")
    for il in _layers_with(tensors, _QUERIES):
        if not heads[il]:
            raise CorruptModel(f"{name} has {head_key} 0 for layer blk.{il}, which has "
                               "attention tensors")
    for il in _layers_with(tensors, _KEYS):
        if not heads_kv[il] or heads[il] % heads_kv[il]:
            raise CorruptModel(f"{name} has {kv_key} {heads_kv[il]} for layer blk.{il}, which "
                               f"does not divide its {head_key} {heads[il]}")
    value_length = _count(kv, f"{arch}.attention.value_length", name)
    if arch == "llama" and heads[0] and (key_length or value_length):
        head_dim = n_embd // heads[0]
        if (key_length or head_dim) != (value_length or head_dim):
            raise CorruptModel(f"{name} has {arch}.attention.key_length "
                               f"{key_length or head_dim} and value_length "
                               f"{value_length or head_dim}; a llama model needs them equal")


def _layers_with(tensors: Sequence[TensorInfo], suffixes: tuple[str, ...]) -> list[int]:
    return sorted({int(m[1]) for t in tensors
                   if t.name.endswith(suffixes) and (m := _BLOCK.match(t.name))})


def _numbers(kv: dict[str, Any], arch: str, name: str) -> None:
    positive = (f"{arch}.attention.layer_norm_rms_epsilon", f"{arch}.attention.layer_norm_epsilon",
                f"{arch}.rope.freq_base", f"{arch}.rope.freq_base_swa")
    for key in positive:
        value = kv.get(key)
        if value is not None and not (_is_float(value) and math.isfinite(value) and value > 0):
            raise CorruptModel(f"{name} has {key} {value!r}; it must be a finite positive number")
    for key in (f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear"):
        value = kv.get(key)
        if value is not None and not (_is_float(value) and math.isfinite(value) and value >= 0):
            raise CorruptModel(f"{name} has {key} {value!r}; it must be a finite number")
    key = f"{arch}.rope.scaling.type"
    scaling = kv.get(key)
    if scaling is not None and scaling not in ROPE_SCALING_TYPES:
        raise CorruptModel(f"{name} has {key} {scaling!r}; llama.cpp knows "
                           f"{', '.join(sorted(ROPE_SCALING_TYPES))}")


def _tensor_types(tensors: Sequence[TensorInfo], name: str) -> None:
    for t in tensors:
        if t.name.endswith(("norm.weight", ".bias")):
            if t.type_name != "F32":
                raise CorruptModel(f"{name} stores tensor {shown(t.name)} as {t.type_name}; llama.cpp "
                                   "needs norms and biases in F32")
        elif len(t.shape) >= 2 and t.type_name in _NO_DOT_PRODUCT:
            raise CorruptModel(f"{name} stores tensor {shown(t.name)} as {t.type_name}; llama.cpp "
                               "multiplies by it and has no code for that type")


def _tokenizer(header: GGUFHeader, tensors: Sequence[TensorInfo], path: Path) -> None:
    name = shown(path.name)
    try:
        vocab = header_vocabulary(header)
        metadata_value(header.kv, "tokenizer.chat_template", str)
    except CorruptModel as exc:  # a key of the wrong type
        raise CorruptModel(f"{name}: {exc}") from None
    if vocab.model is None:
        raise CorruptModel(f"{name} has no tokenizer.ggml.model, so llama.cpp cannot load it")
    if vocab.model not in KNOWN_TOKENIZERS:
        raise CorruptModel(f"{name} has tokenizer.ggml.model {vocab.model!r}, a tokenizer this "
                           "llama.cpp does not know")
    if vocab.model in _NO_VOCAB:  # llama.cpp loads it, then aborts on the first tokenize
        raise CorruptModel(f"{name} has no vocabulary (tokenizer.ggml.model {vocab.model!r}), "
                           "so text cannot be turned into tokens for it")
    tokens = vocab.tokens
    if tokens is None or tokens.item_type != GGUFValueType.STRING or not tokens.count:
        raise CorruptModel(f"{name} has tokenizer.ggml.model {vocab.model!r} but no "
                           "tokenizer.ggml.tokens list")
    n = tokens.count
    for key, kinds in (("tokenizer.ggml.scores", (GGUFValueType.FLOAT32, GGUFValueType.INT32)),
                       ("tokenizer.ggml.token_type", (GGUFValueType.INT32,))):
        span = header.arrays.get(key)
        if key in header.kv and (span is None or span.item_type not in kinds or span.count < n):
            raise CorruptModel(f"{name} has a {key} that does not list one number per token")
    if vocab.model in _BPE_MODELS and vocab.pre != "kimi-k2":
        merges = header.arrays.get("tokenizer.ggml.merges")
        if merges is None or merges.item_type != GGUFValueType.STRING:
            raise CorruptModel(f"{name} has a BPE tokenizer ({vocab.model!r}) without "
                               "tokenizer.ggml.merges")
    embedding = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embedding is not None and len(embedding.shape) >= 2 and embedding.shape[1] < n:
        raise CorruptModel(f"{name} has {n:,} tokens in tokenizer.ggml.tokens but tensor "
                           f"token_embd.weight has rows for {embedding.shape[1]:,}")
    raw = tokens.raw_strings(read_span(path, tokens))
    _unique_tokens(raw, name)
    if vocab.model == "llama":
        _spellable(raw, name)
    for which in _STATED_IDS:
        key = f"tokenizer.ggml.{which}_token_id"
        stated = header.kv.get(key)
        if isinstance(stated, int) and not 0 <= stated < n:
            raise CorruptModel(f"{name} has {key} {stated:,}, outside its {n:,} tokens")
    facts = tokenizer_facts(vocab, raw)
    if facts.add_bos and facts.bos_id is None:
        raise CorruptModel(f"{name} adds a start token (tokenizer.ggml.add_bos_token) but has "
                           "no tokenizer.ggml.bos_token_id in its vocabulary")
    if facts.add_eos and facts.eos_id is None:
        raise CorruptModel(f"{name} adds an end token (tokenizer.ggml.add_eos_token) but has "
                           "no tokenizer.ggml.eos_token_id in its vocabulary")


def _unique_tokens(raw: Sequence[bytes], name: str) -> None:
    """llama.cpp renames an empty token "[EMPTY_<id>]", then needs every string unique."""
    seen: dict[bytes, int] = {}
    for i, text in enumerate(raw):
        text = text or f"[EMPTY_{i}]".encode()
        first = seen.setdefault(text, i)
        if first != i:
            piece = text[:40].decode("utf-8", errors="replace")
            raise CorruptModel(f"{name} lists token {piece!r} twice in tokenizer.ggml.tokens "
                               f"(ids {first} and {i}); llama.cpp needs every token unique")


def _spellable(raw: Sequence[bytes], name: str) -> None:
    """SentencePiece falls back to <0xXX> byte tokens for text it has no piece for."""
    present = set(raw)
    for byte in range(256):
        if f"<0x{byte:02X}>".encode() not in present and bytes([byte]) not in present:
            raise CorruptModel(f"{name} has tokenizer.ggml.model 'llama' (SentencePiece) but "
                               f"no byte token <0x{byte:02X}> in tokenizer.ggml.tokens; is it a "
                               "GPT-2 vocabulary ('gpt2')?")


def _count(kv: dict[str, Any], key: str, name: str, required: bool = False) -> int:
    value = kv.get(key)
    if value is None:
        if required:
            raise CorruptModel(f"{name} lacks {key}, which llama.cpp needs")
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CorruptModel(f"{name} has {key} {value!r}, not a count")
    return value


def _per_layer(kv: dict[str, Any], key: str, n_layer: int, name: str) -> tuple[int, ...]:
    """A per-layer count: one number for all layers, or one per layer; () when absent."""
    value = kv.get(key)
    if value is None:
        return ()
    if isinstance(value, tuple):
        if len(value) != n_layer or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise CorruptModel(f"{name} has a {key} list that does not give {n_layer} counts")
        return value
    return (_count(kv, key, name),) * n_layer


def _is_float(value: Any) -> bool:
    return isinstance(value, float)

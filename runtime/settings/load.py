"""Typed, validated settings for loading a model. Unknown keys are an error, never dropped.

`LoadSettings` is what a user chooses (context, GPU layers, K/V cache types, drafting ...).
`runtime.llama.params.to_llama_params` turns it into llama.cpp parameters (pure, tested by
asserting what it returns); `runtime.planner.plan.plan_memory` predicts its memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import reprlib
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from runtime.errors import SettingsError, shown
from runtime.gguf.constants import type_bytes

# The ggml types a K/V cache may use (llama.cpp's --cache-type-k/-v), each with its bytes per
# value from the one table of ggml types (runtime.gguf.constants).
KV_CACHE_TYPES: dict[str, float] = {
    name: type_bytes(name)
    for name in ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
}

FlashAttn = Literal["auto", "on", "off"]
DraftKind = Literal["none", "ngram", "model"]
_T = TypeVar("_T")


@dataclass(frozen=True)
class DraftSettings:
    """Speculative drafting. k None = adaptive; p_min stops a draft model's run early."""

    kind: DraftKind = "none"
    model_path: Path | None = None
    k: int | None = None
    k_max: int = 8
    p_min: float = 0.3
    ngram_min: int = 2
    ngram_max: int = 4
    verifier: Literal["leviathan", "greedy_match"] = "leviathan"

    def __post_init__(self) -> None:
        if self.kind not in ("none", "ngram", "model"):
            raise SettingsError(f"draft kind must be none, ngram or model, not {self.kind!r}")
        if self.kind == "model" and self.model_path is None:
            raise SettingsError("a draft model needs its file (draft.model_path)")
        if self.k is not None and not 1 <= self.k <= 32:
            raise SettingsError(f"draft k must be between 1 and 32, not {self.k}")
        if not 1 <= self.k_max <= 32:
            raise SettingsError(f"draft k_max must be between 1 and 32, not {self.k_max}")
        if not 0.0 <= self.p_min < 1.0:
            raise SettingsError(f"draft p_min must be in [0, 1), not {self.p_min}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise SettingsError("ngram sizes need 1 <= ngram_min <= ngram_max")
        if self.verifier not in ("leviathan", "greedy_match"):
            raise SettingsError(f"unknown verifier {self.verifier!r}")


@dataclass(frozen=True)
class LoadSettings:
    """Everything that decides how a model is loaded. gpu_layers None = auto (planner)."""

    model_path: Path
    n_ctx: int = 4096
    gpu_layers: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: FlashAttn = "auto"
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_batch: int = 512
    n_ubatch: int = 512
    n_parallel: int = 1
    # Map the file (True), read it into RAM (False), or auto (None): read into RAM on huge
    # pages where that is faster and safe (runtime.hugepages.weights_in_ram), else mapped.
    use_mmap: bool | None = None
    draft: DraftSettings = field(default_factory=DraftSettings)
    # Mixture-of-experts models: the expert FFN tensors of the first `cpu_moe` blocks stay in
    # RAM (llama.cpp's --n-cpu-moe N; "all" = --cpu-moe; "auto" = the planner's fit).
    cpu_moe: int | Literal["all", "auto"] = 0
    # Several GPUs: each GPU's share of the offloaded layers (llama.cpp's --tensor-split,
    # None = by free memory), or the whole model on one GPU (main_gpu: --split-mode none).
    tensor_split: tuple[float, ...] | None = None
    main_gpu: int | None = None
    # A vision model's projector ("mmproj" GGUF), loaded beside the model: images in chats.
    mmproj_path: Path | None = None
    # Other machines lending their devices over llama.cpp's RPC (`outrider worker`), as
    # "host:port"; the planner splits the layers across them and this machine
    # (docs/distributed.md). Normalised by `worker_endpoint`.
    workers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n_ctx < 16:
            raise SettingsError(f"context length must be at least 16 tokens, not {self.n_ctx}")
        if self.gpu_layers is not None and self.gpu_layers < 0:
            raise SettingsError(f"GPU layers must be 0 or more (or auto), not {self.gpu_layers}")
        for name, value in (("K", self.type_k), ("V", self.type_v)):
            if value not in KV_CACHE_TYPES:
                known = ", ".join(KV_CACHE_TYPES)
                raise SettingsError(f"{name} cache type {value!r} is not one of {known}")
        if self.flash_attn not in ("auto", "on", "off"):
            raise SettingsError(f"flash attention must be auto, on or off, not {self.flash_attn!r}")
        for name, threads in (("threads", self.n_threads), ("batch threads", self.n_threads_batch)):
            if threads is not None and threads < 1:
                raise SettingsError(f"{name} must be at least 1, not {threads}")
        if self.n_batch < 1 or self.n_ubatch < 1:
            raise SettingsError("batch sizes must be at least 1")
        if self.n_parallel < 1 or self.n_parallel > 256:
            raise SettingsError(f"parallel sequences must be 1..256, not {self.n_parallel}")
        if self.cpu_moe not in ("all", "auto") and (
                isinstance(self.cpu_moe, bool) or not isinstance(self.cpu_moe, int)
                or self.cpu_moe < 0):
            raise SettingsError(f"MoE experts on CPU must be all, auto or a layer count 0 or "
                                f"more, not {self.cpu_moe!r}")
        if self.tensor_split is not None:
            _check_tensor_split(self.tensor_split)
            if self.main_gpu is not None:
                raise SettingsError("give either a tensor split over several GPUs or one main "
                                    "GPU for the whole model, not both")
        if self.main_gpu is not None and self.main_gpu < 0:
            raise SettingsError(f"main GPU must be a GPU index 0 or more, not {self.main_gpu}")
        endpoints = tuple(worker_endpoint(w) for w in self.workers)
        if len(set(endpoints)) != len(endpoints):
            twice = next(e for e in endpoints if endpoints.count(e) > 1)
            raise SettingsError(f"worker {twice} is named twice")
        object.__setattr__(self, "workers", endpoints)
        if self.mmproj_path is not None and Path(self.mmproj_path) == Path(self.model_path):
            raise SettingsError("the projector (mmproj) is a file of its own, not the model file")

    def cpu_moe_layers(self, block_count: int) -> int:
        """How many blocks keep their experts in RAM, for a model of `block_count` blocks
        (auto counts as none: the planner resolves it before anything is loaded).

            >>> LoadSettings(model_path=Path("m.gguf"), cpu_moe="all").cpu_moe_layers(48)
            48
        """
        if self.cpu_moe == "all":
            return block_count
        if self.cpu_moe == "auto":
            return 0
        if self.cpu_moe > block_count:
            raise SettingsError(f"MoE experts on CPU: {self.cpu_moe} layers asked for, but the "
                                f"model has {block_count}")
        return self.cpu_moe

    @property
    def kv_quantized(self) -> bool:
        return self.type_k not in ("f16", "bf16", "f32") or self.type_v not in ("f16", "bf16", "f32")

    @classmethod
    def from_dict(cls, data: object) -> LoadSettings:
        """Build from JSON or TOML data (a `/api/load` body, a saved file): the one check of a
        load-settings dict. Unknown keys (`draft.x` inside the draft), a missing model_path and
        a value of the wrong type are each a one-line SettingsError naming the key; JSON's null
        is None where a setting may be None. The dataclasses then check the values themselves.

            >>> LoadSettings.from_dict({"model_path": "m.gguf", "tensor_split": [3, 1]}).tensor_split
            (3.0, 1.0)
            >>> LoadSettings.from_dict({"model_path": "m.gguf", "n_ctx": "big"})
            Traceback (most recent call last):
            runtime.errors.SettingsError: load setting n_ctx must be a whole number, not 'big'
        """
        if not isinstance(data, dict):
            raise SettingsError(f"load settings must be a JSON object, not {reprlib.repr(data)}")
        unknown = _unknown(data, cls, "")
        if isinstance(data.get("draft"), dict):
            unknown += _unknown(data["draft"], DraftSettings, "draft.")
        if unknown:
            raise SettingsError(f"unknown load setting(s): {', '.join(unknown)}")
        if "model_path" not in data:
            raise SettingsError("load settings need model_path")
        return _typed(cls, data, "")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model_path"] = str(self.model_path)
        if self.mmproj_path is not None:
            out["mmproj_path"] = str(self.mmproj_path)
        if self.draft.model_path is not None:
            out["draft"]["model_path"] = str(self.draft.model_path)
        return out


DEFAULT_WORKER_PORT = 50052  # rpc-server's default


def worker_endpoint(text: object) -> str:
    """A worker's address as llama.cpp's RPC client takes it, "host:port" (the port defaults to
    50052, the host is lowercased). IPv6 literals are refused: llama.cpp splits at the first
    colon.

        >>> worker_endpoint(" Box.local ")
        'box.local:50052'
        >>> worker_endpoint("10.0.0.2:7000")
        '10.0.0.2:7000'
    """
    if not isinstance(text, str) or not text.strip():
        raise SettingsError(f"a worker is host:port, e.g. 192.168.1.20:50052, not {text!r}")
    host, sep, port_text = text.strip().lower().partition(":")
    if not sep:
        port_text = str(DEFAULT_WORKER_PORT)
    if not host or ":" in port_text or any(c.isspace() or c in "/[]@" for c in host):
        raise SettingsError(f"a worker is host:port, e.g. 192.168.1.20:50052, not {text!r}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise SettingsError(f"worker {text.strip()!r}: the port must be a number 1 to 65535")
    return f"{host}:{int(port_text)}"


def _check_tensor_split(split: tuple[float, ...]) -> None:
    """A split is each GPU's share: any positive total ("3,1" is 75% / 25%), none negative."""
    if not split:
        raise SettingsError("a tensor split needs one share per GPU, e.g. 3,1")
    if any(not isinstance(x, int | float) or isinstance(x, bool) or x != x or x < 0
           for x in split):
        raise SettingsError(f"tensor split shares must be numbers 0 or more, not "
                            f"{', '.join(map(str, split))}")
    if sum(split) <= 0:
        raise SettingsError("a tensor split must give at least one GPU a share above 0")


# -- the one check of a load-settings dict (LoadSettings.from_dict) ------------------------------

def _unknown(data: dict[Any, Any], cls: type, where: str) -> list[str]:
    known = {f.name for f in dataclasses.fields(cls)}
    return sorted(where + shown(key) for key in data if key not in known)


def _typed(cls: type[_T], data: dict[str, Any], where: str) -> _T:
    """An instance of the dataclass `cls` (its keys already checked), each value of its
    field's type: "load setting NAME must be KIND, not VALUE" for one that is not."""
    hints = get_type_hints(cls)
    return cls(**{key: _value(value, hints[key], where + key) for key, value in data.items()})


def _value(value: Any, tp: Any, name: str) -> Any:
    """`value` as a `tp` (JSON's list → tuple, str → Path, int → float), or SettingsError."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if value is None and len(options) < len(get_args(tp)):
            return None
        if len(options) == 1:
            return _value(value, options[0], name)
        for option in options:  # int | Literal["all", "auto"]: the first that takes it
            with contextlib.suppress(SettingsError):
                return _value(value, option, name)
        raise _wrong(name, " or ".join(_kind(option) for option in options), value)
    if origin is Literal:
        if not any(type(value) is type(a) and value == a for a in get_args(tp)):
            raise _wrong(name, _kind(tp), value)
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _wrong(name, _kind(tp), value)
        return tuple(_value(v, get_args(tp)[0], f"{name}[{i}]") for i, v in enumerate(value))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # the draft
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise _wrong(name, _kind(tp), value)
        return _typed(tp, value, name + ".")
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
        Path: isinstance(value, Path) or (isinstance(value, str) and bool(value)),
    }[tp]
    if not ok:
        raise _wrong(name, _kind(tp), value)
    if tp is float:
        return float(value)
    return Path(value) if tp is Path else value


def _kind(tp: Any) -> str:
    """What a value of type `tp` is, in words: "a whole number", "one of auto, on, off"."""
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, get_args(tp)))
    if get_origin(tp) is tuple:
        return "a list"
    if dataclasses.is_dataclass(tp):
        return "an object"
    return {bool: "true or false", int: "a whole number", float: "a number", str: "text",
            Path: "a path"}[tp]


def _wrong(name: str, kind: str, value: Any) -> SettingsError:
    return SettingsError(f"load setting {name} must be {kind}, not {reprlib.repr(value)}")

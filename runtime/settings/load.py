"""Typed, validated settings for loading a model. Unknown keys are an error, never dropped.

`LoadSettings` is what a user chooses (context, GPU layers, K/V cache types, drafting ...).
`runtime.llama.params.to_llama_params` turns it into llama.cpp parameters (pure, tested by
asserting what it returns); `runtime.planner.plan.plan_memory` predicts its memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from runtime.errors import SettingsError

# ggml type name → bytes per value, for the KV cache types llama.cpp supports.
KV_CACHE_TYPES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}

FlashAttn = Literal["auto", "on", "off"]
DraftKind = Literal["none", "ngram", "model"]


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
    def from_dict(cls, data: dict[str, Any]) -> LoadSettings:
        """Build from JSON/TOML data, refusing unknown keys by name."""
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SettingsError(f"unknown load setting(s): {', '.join(unknown)}")
        if "model_path" not in data:
            raise SettingsError("load settings need model_path")
        data["model_path"] = Path(data["model_path"])
        if data.get("mmproj_path") is not None:
            data["mmproj_path"] = Path(data["mmproj_path"])
        if isinstance(data.get("tensor_split"), list):
            data["tensor_split"] = tuple(data["tensor_split"])
        if isinstance(data.get("workers"), list):
            data["workers"] = tuple(data["workers"])
        elif "workers" in data and not isinstance(data["workers"], tuple):
            raise SettingsError("workers must be a list of host:port strings")
        if "draft" in data and isinstance(data["draft"], dict):
            draft = dict(data["draft"])
            dknown = {f.name for f in dataclasses.fields(DraftSettings)}
            dunknown = sorted(set(draft) - dknown)
            if dunknown:
                raise SettingsError(f"unknown draft setting(s): {', '.join(dunknown)}")
            if draft.get("model_path") is not None:
                draft["model_path"] = Path(draft["model_path"])
            data["draft"] = DraftSettings(**draft)
        try:
            return cls(**data)
        except TypeError as exc:
            raise SettingsError(f"bad load settings: {exc}") from exc

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

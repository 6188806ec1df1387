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
    use_mmap: bool = True
    draft: DraftSettings = field(default_factory=DraftSettings)

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
        if self.draft.model_path is not None:
            out["draft"]["model_path"] = str(self.draft.model_path)
        return out

"""Vision projectors ("mmproj" GGUFs, `general.architecture = clip`) from their header alone.

    info = read_projector_info(Path("mmproj-gemma-3-4b-it-f16.gguf"))
    info.projector_type, info.image_size, info.patch_size, info.n_merge, info.image_tokens
    # ('gemma3', 896, 14, 4, 256)

`check_projector` is the projector's preflight (the model's is `runtime.gguf.preflight`): a
file that is not a GGUF, is cut short, is a language model rather than a projector, has no
vision encoder or names a projector type this llama.cpp does not know is a one-line typed
error before libmtmd sees it.

Image tokens per image, by projector type, as tools/mtmd/clip.cpp counts them
(`clip_n_output_tokens`) for an image at the projector's own size:

    gemma3, idefics3 (one tile), internvl, llama4   (image_size / patch_size / n_merge)²
    mlp, mlp_norm, ldp, ldpv2 (LLaVA), janus_pro     (image_size / patch_size)²
    anything else (dynamic resolution)               (image_size / patch_size / n_merge)²,
                                                     an estimate (`image_tokens_exact` False)

Gemma 3 resizes every image to 896² and pools 4×4 patches: 64² / 16 = 256 tokens, whatever
the image; the tiny test projector (64², 4×4 patches, pool 2) makes 64.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import CorruptModel, ModelFileError, UnsupportedArchitecture, shown
from runtime.gguf.header import GGUFHeader, read_local_header

# PROJECTOR_TYPE_NAMES of tools/mtmd/clip-impl.h (the vendored build), "qwen2.5o" included.
PROJECTOR_TYPES = frozenset({
    "mlp", "mlp_norm", "ldp", "ldpv2", "resampler", "adapter", "qwen2vl_merger",
    "qwen2.5vl_merger", "qwen3vl_merger", "ling3vl", "step3vl", "gemma3", "gemma3nv",
    "gemma3na", "gemma4v", "gemma4a", "gemma4uv", "gemma4ua", "phi4", "idefics3", "pixtral",
    "ultravox", "internvl", "llama4", "qwen2a", "qwen3a", "glma", "qwen2.5o", "voxtral",
    "meralion", "musicflamingo", "lfm2", "kimivl", "paddleocr", "lightonocr", "cogvlm",
    "janus_pro", "dots_ocr", "dots3note_v", "dots3note_a", "deepseekocr", "deepseekocr2",
    "deepseek4v", "lfm2a", "glm4v", "glm5v", "youtuvl", "yasa2", "kimik25", "nemotron_v2_vl",
    "hunyuanvl", "parakeet", "exaone4_5", "minicpmv4_6", "granite_speech", "mimovl",
    "minimax_m3", "granite4_vision", "mimo_audio", "qwen3tts_spkenc", "qwen3tts_gen",
    "pockettts_spkenc", "pockettts_gen", "muse_glimmer",
})
_POOLED = frozenset({"gemma3", "idefics3", "internvl", "llama4", "nemotron_v2_vl"})
_LLAVA = frozenset({"mlp", "mlp_norm", "ldp", "ldpv2", "janus_pro"})
# Gemma 3 pools 4×4 patches unless the file says otherwise (clip.cpp load_hparams).
_DEFAULT_MERGE = {"gemma3": 4, "idefics3": 1, "lfm2": 2, "kimivl": 2}


@dataclass(frozen=True)
class ProjectorInfo:
    path: Path
    projector_type: str
    image_size: int
    patch_size: int
    n_embd: int  # the vision tower's width
    n_ff: int
    n_head: int
    n_layer: int
    n_merge: int  # patches merged (pooled, shuffled) per side into one image token
    tensor_bytes: int  # the weights, as clip.cpp counts them ("model size")
    n_tensors: int

    @property
    def n_patches(self) -> int:
        """Positions of the vision tower for one image at its own size."""
        side = self.image_size // self.patch_size if self.patch_size else 0
        return side * side

    @property
    def image_tokens(self) -> int:
        """Tokens one image takes in the text model's context (see the module docstring)."""
        if self.projector_type in _LLAVA:
            return self.n_patches
        return self.n_patches // max(1, self.n_merge) ** 2

    @property
    def image_tokens_exact(self) -> bool:
        return self.projector_type in _POOLED or self.projector_type in _LLAVA

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "projector_type": self.projector_type,
                "image_size": self.image_size, "patch_size": self.patch_size,
                "n_embd": self.n_embd, "n_layer": self.n_layer, "n_merge": self.n_merge,
                "tensor_bytes": self.tensor_bytes, "image_tokens": self.image_tokens,
                "image_tokens_exact": self.image_tokens_exact}


def check_projector(path: Path) -> ProjectorInfo:
    """Preflight a projector file: its info, or a typed `ModelFileError`."""
    return read_projector_info(path)


def read_projector_info(path: Path) -> ProjectorInfo:
    """What the planner and the engine need of a projector, from its header."""
    path = Path(path)
    header = read_local_header(path)
    return projector_info(header, path)


def projector_info(header: GGUFHeader, path: Path) -> ProjectorInfo:
    name = shown(path.name)
    kv = header.kv
    arch = kv.get("general.architecture")
    if arch != "clip":
        what = f"a {arch!r} model" if isinstance(arch, str) else "not a projector"
        raise ModelFileError(f"{name} is {what}, not a vision projector (mmproj); give the "
                             "mmproj-*.gguf file that came with the model")
    if kv.get("clip.has_vision_encoder") is not True:
        raise ModelFileError(f"{name} has no vision encoder (an audio projector?); images "
                             "need a vision projector")
    kind = kv.get("clip.projector_type", kv.get("clip.vision.projector_type"))
    if not isinstance(kind, str):
        raise CorruptModel(f"{name} names no projector type (clip.projector_type)")
    if kind not in PROJECTOR_TYPES:
        raise UnsupportedArchitecture(f"{name} is a {kind!r} projector, a type this build of "
                                      "llama.cpp does not know")

    def number(key: str, default: int | None = None) -> int:
        value = kv.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CorruptModel(f"{name}: {key} is missing or not a count")
        return value

    merge = kv.get("clip.vision.projector.scale_factor",
                   kv.get("clip.vision.spatial_merge_size", _DEFAULT_MERGE.get(kind, 1)))
    return ProjectorInfo(
        path=path, projector_type=kind,
        image_size=number("clip.vision.image_size"),
        patch_size=number("clip.vision.patch_size"),
        n_embd=number("clip.vision.embedding_length"),
        n_ff=number("clip.vision.feed_forward_length", 0),
        n_head=number("clip.vision.attention.head_count", 1),
        n_layer=number("clip.vision.block_count", 0),
        n_merge=merge if isinstance(merge, int) and merge > 0 else 1,
        tensor_bytes=sum(t.n_bytes for t in header.tensors),
        n_tensors=len(header.tensors))

"""A vision projector's memory: its weights and the compute buffer libmtmd reserves for it.

    >>> from pathlib import Path
    >>> gemma3 = ProjectorInfo(          # Gemma 3's tower (read_projector_info reads it), no weights
    ...     Path("mmproj-gemma-3-4b-it-f16.gguf"), "gemma3", image_size=896, patch_size=14,
    ...     n_embd=1152, n_ff=4304, n_head=16, n_layer=27, n_merge=4, tensor_bytes=0, n_tensors=0)
    >>> projector_compute_bytes(gemma3, flash_attn=True), projector_compute_bytes(gemma3, flash_attn=False)
    (127139840, 1186988032)

That is 121 MiB with flash attention and 1.1 GiB without.

clip.cpp reserves the vision tower's graph for one image at the projector's own size
(`warmup`: image_size², `n` = (image_size / patch_size)² positions of width `d`, `ff` wide
feed-forward, `h` heads). The buffer is the peak of three phases of that graph, in floats
(4 bytes each):

    patches     4.5 · image_size²      the raw image (3 channels, f32) and its im2col (f16)
    attention   n · 5·d                with flash attention;
                n · (h·n + 6·d)        without: the h × n × n scores are materialised
    ffn         n · (ff + 3·d)

fitted to the compute buffers clip logs ("CPU compute buffer size") for 23 generated
projector shapes, image 64² to 448², n 64 to 1,024, d 32 to 256, with flash attention on and
off (tests/engine/test_vision.py checks the test projector within 5%). Gemma 3's tower
(896², 14² patches → n 4,096, d 1,152, ff 4,304, 16 heads): ffn 4,096 · 7,760 floats = 121
MiB with flash attention, and 4,096 · (16·4,096 + 6,912) floats = 1.1 GiB without.
(The 121 and 1,132 MiB are this formula's, not yet measured on the real file here.)

The weights are the header's tensor bytes (clip's "model size" is the same sum). Both live
on the first GPU when the model has layers there (mtmd's `use_gpu`), else in RAM.
"""

from __future__ import annotations

from runtime.gguf.projector import ProjectorInfo

_FLOAT = 4


def projector_compute_bytes(info: ProjectorInfo, *, flash_attn: bool) -> int:
    """The compute buffer clip reserves for `info` (see the module docstring)."""
    n, d = info.n_patches, info.n_embd
    patches = 4.5 * info.image_size ** 2
    attention = n * 5 * d if flash_attn else n * (info.n_head * n + 6 * d)
    ffn = n * (info.n_ff + 3 * d)
    return int(_FLOAT * max(patches, attention, ffn))


def projector_bytes(info: ProjectorInfo, *, flash_attn: bool) -> tuple[int, int]:
    """(weights, compute) of a loaded projector."""
    return info.tensor_bytes, projector_compute_bytes(info, flash_attn=flash_attn)

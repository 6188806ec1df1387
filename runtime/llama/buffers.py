"""Read the buffer sizes llama.cpp reports in its log: what a load really allocated.

llama.cpp does not return these numbers through its API; it logs them while loading a
model and creating a context:

    >>> log_text = '''
    ... load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
    ... llama_context:        CPU  output buffer size =     0.19 MiB
    ... llama_kv_cache:        CPU KV buffer size =    90.00 MiB
    ... sched_reserve:        CPU compute buffer size =    98.25 MiB
    ... '''
    >>> sizes = parse_buffer_sizes(log_text)
    >>> sizes
    {'CPU_Mapped model': 96573850, 'CPU output': 199229, 'CPU KV': 94371840, 'CPU compute': 103022592}
    >>> buffer_totals(sizes)
    {'weights': 96573850, 'kv': 94371840, 'compute': 103221821}

Sizes are logged in MiB with two decimals, so each is exact to about ±5 KiB. A cache made
of two parts (sliding-window models log a SWA and a non-SWA KV buffer) adds up under one key.

A vision projector (libmtmd's clip) logs its own, in other words:

    >>> clip_log = '''
    ... clip_ctx: CLIP using CPU backend
    ... load_hparams: model size:         0.36 MiB
    ... reserve_compute_meta:        CPU compute buffer size =     0.31 MiB
    ... '''
    >>> parse_projector_buffers(clip_log)
    {'mmproj.CPU model': 377487, 'mmproj.CPU compute': 325059}

The "mmproj." prefix keeps them apart from the text model's buffers of the same device;
`buffer_totals` and `device_of` read them like the others.
"""

from __future__ import annotations

import re

_BUFFER_LINE = re.compile(
    r"(?P<buffer>[A-Za-z0-9_]+)\s+(?P<kind>model|KV|RS|compute|output|LoRA)\s+buffer size\s*=\s*"
    r"(?P<mib>[0-9.]+)\s*MiB")

# What each kind of buffer counts as in a memory plan: recurrent state (RS) is cache-like;
# the small host output buffer (logits of the last batch) is counted with compute.
_KIND_TOTAL = {"model": "weights", "LoRA": "weights", "KV": "kv", "RS": "kv",
               "compute": "compute", "output": "compute"}


def parse_buffer_sizes(log_text: str) -> dict[str, int]:
    """Bytes per "<buffer> <kind>" (e.g. "CUDA0 KV", "CPU_Mapped model") in `log_text`."""
    sizes: dict[str, int] = {}
    for match in _BUFFER_LINE.finditer(log_text):
        key = f"{match['buffer']} {match['kind']}"
        sizes[key] = sizes.get(key, 0) + round(float(match["mib"]) * (1 << 20))
    return sizes


_CLIP_BACKEND = re.compile(r"CLIP using (?P<backend>[A-Za-z0-9_]+) backend")
_CLIP_WEIGHTS = re.compile(r"model size:\s*(?P<mib>[0-9.]+)\s*MiB")
_CLIP_COMPUTE = re.compile(r"(?P<buffer>[A-Za-z0-9_]+)\s+compute buffer size\s*=\s*"
                           r"(?P<mib>[0-9.]+)\s*MiB")


def parse_projector_buffers(log_text: str) -> dict[str, int]:
    """Bytes per "mmproj.<buffer> <kind>" in what clip logged while loading a projector. A
    compute buffer reserved twice (the warmup retries without flash attention) counts once,
    at its last size."""
    sizes: dict[str, int] = {}
    backends = _CLIP_BACKEND.findall(log_text)
    weights = _CLIP_WEIGHTS.search(log_text)
    if weights is not None:
        device = backends[-1] if backends else "CPU"
        sizes[f"mmproj.{device} model"] = round(float(weights["mib"]) * (1 << 20))
    for match in _CLIP_COMPUTE.finditer(log_text):
        sizes[f"mmproj.{match['buffer']} compute"] = round(float(match["mib"]) * (1 << 20))
    return sizes


def buffer_totals(sizes: dict[str, int]) -> dict[str, int]:
    """Sum `parse_buffer_sizes` output into weights / kv / compute, over all devices."""
    totals = {"weights": 0, "kv": 0, "compute": 0}
    for key, n in sizes.items():
        totals[_KIND_TOTAL[key.rsplit(" ", 1)[1]]] += n
    return totals


def device_of(buffer: str) -> str:
    """Which device a buffer lives on: "CUDA0" → "cuda:0", "MTL0" → "metal:0", host → "cpu".

    Host buffers of a GPU backend ("CUDA_Host", "CPU_Mapped", "CPU_REPACK") are RAM; a
    projector's ("mmproj.CUDA0") live where the same name says.
    """
    buffer = buffer.removeprefix("mmproj.")
    if match := re.fullmatch(r"CUDA(\d+)", buffer):
        return f"cuda:{match[1]}"
    if match := re.fullmatch(r"(?:MTL|Metal)(\d*)", buffer):
        return f"metal:{match[1] or 0}"
    return "cpu"

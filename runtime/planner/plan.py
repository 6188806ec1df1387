"""Will it fit? Memory per device for a model and its load settings, before loading anything.

    info = read_model_info(path)                     # SmolLM2-135M-Instruct Q4_1, no GPU
    plan = plan_memory(info, LoadSettings(model_path=path, n_ctx=8192), list_devices())
    plan.verdict, plan.gpu_layers, plan.n_layers, plan.max_context
    # ('cpu_only', 0, 31, 8192)
    plan.describe()
    # 'CPU only: 388 MiB (weights 92.1 MiB, KV 180 MiB, compute 98.4 MiB, other 17.4 MiB); max context 8,192'

The parts, each as llama.cpp allocates it (src/llama-model.cpp, llama-kv-cache.cpp,
llama-context.cpp of the vendored build):

- weights: the tensor bytes of each block on the device that holds the block. llama.cpp
  offloads from the top: `gpu_layers = n` puts the output layer and the last n - 1 blocks
  on the GPU(s) (split between GPUs by `tensor_split`, else by free memory; `main_gpu`
  takes them all); token embeddings always stay in RAM. MoE models: the routed expert
  tensors of the first `cpu_moe` blocks stay in RAM wherever their block goes (llama.cpp's
  --n-cpu-moe tensor overrides); "auto" picks the count as --fit does (`_fit_cpu_moe`).
- KV cache: `kv_cells` = n_ctx rounded up to 256 cells, each layer's cache on its layer's
  device. Per token and layer it holds n_head_kv × (key_length × bytes(type_k) +
  value_length × bytes(type_v)): see `kv_bytes_per_token`. Sliding-window layers hold only
  window·n_seq + ubatch cells (`swa_full` off, as the engine and llama-server load them,
  drafting or not: `decode_batch` says why drafting stays exact).
- compute: the graph's scratch buffer, peak of three phases for one ubatch of `ub` tokens
  (4 = bytes per f32):  logits 4·ub·(n_vocab + 2·n_embd);  attention mask + 4·ub·(5·n_embd +
  2·n_embd_kv), plus without flash attention the scores 4·ub·n_kv·n_head;  feed-forward
  mask + 4·ub·(3·n_ff + 4·n_embd); the mask is ub·n_kv·(2 with flash attention, else 4);
  plus the logits output buffer, 4·n_vocab per sequence. The coefficients were fitted to
  the compute buffers llama.cpp reports for SmolLM2, the two tiny test models and five
  more generated shapes (tests/engine/test_planner_calibration.py; docs/benchmarks.md).
- overhead: RAM outside those buffers (vocabulary tables), `host_overhead`, fitted to RSS.
- a vision projector (`projector`, the mmproj of `LoadSettings.mmproj_path`): its weights and
  compute buffer (`runtime.planner.projector`) on the first GPU when the model has layers
  there, else in RAM; `image_tokens` says what one image takes of the context.

GPU figures follow the same formulas plus `GPU_RUNTIME_OVERHEAD` per CUDA device (context,
cuBLAS workspace); they are not calibrated on a GPU yet.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from runtime.errors import SettingsError
from runtime.gguf.constants import type_block
from runtime.gguf.info import ModelInfo
from runtime.gguf.projector import ProjectorInfo
from runtime.planner.devices import Device, list_devices
from runtime.planner.projector import projector_bytes
from runtime.settings.load import LoadSettings
from runtime.units import fmt_bytes

Verdict = Literal["full_gpu", "partial", "cpu_only", "wont_fit"]
KV_CELL_PAD = 256  # llama_context pads n_ctx to a multiple of 256
GPU_RUNTIME_OVERHEAD = 512 << 20  # CUDA context + cuBLAS workspace, per device (estimate)
# RAM a loaded model takes beyond its buffers (vocabulary tables, token-piece cache, graph
# metadata), fitted to RSS growth: 3.4 MiB for the 271-token test models, 17.4 MiB for
# SmolLM2's 49,152 tokens (benchmarks/planner_calibration.py).
HOST_OVERHEAD_BASE = 3_500_000
HOST_OVERHEAD_PER_TOKEN = 300

_VERDICT_TEXT = {"full_gpu": "Full GPU", "partial": "Partial", "cpu_only": "CPU only",
                 "wont_fit": "Won't fit"}


@dataclass(frozen=True)
class DeviceUsage:
    """What one device would hold. `draft` is the part of the totals that is the draft model."""

    id: str
    name: str
    kind: str
    free_bytes: int
    total_bytes: int
    weights: int
    kv: int
    compute: int
    overhead: int = 0
    draft: int = 0
    projector: int = 0  # the part of weights + compute that is the vision projector

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.free_bytes


@dataclass(frozen=True)
class LinkCost:
    """What crosses the network to one worker's device per generated token (one sequence).

    A split by layers hands the hidden state (n_embd f32) to the next device at every
    boundary, and the device holding the output layer sends the logits (n_vocab f32) back:
    SmolLM2-135M (n_embd 576, n_vocab 49,152) split CPU → worker A → worker B sends 2.3 KB to A,
    2.3 KB back, 2.3 KB to B and 196.6 KB of logits back from B. A boundary between two
    workers goes through this machine (llama.cpp copies between RPC servers via the host)."""

    device: str  # the remote device's id ("rpc:host:port")
    bytes_per_token: int


@dataclass(frozen=True)
class MemoryPlan:
    verdict: Verdict
    gpu_layers: int  # of n_layers (blocks + the output layer), as llama.cpp counts them
    n_layers: int
    recommended_gpu_layers: int  # the most layers on GPU that fit (0 without a GPU)
    n_ctx: int
    kv_cells: int
    max_context: int  # the largest context that fits with gpu_layers; 0 if none does
    kv_bytes_per_token: int
    flash_attn: bool
    n_ubatch: int
    devices: tuple[DeviceUsage, ...]
    notes: tuple[str, ...] = ()
    cpu_moe_layers: int = 0  # blocks whose routed experts stay in RAM (as planned or chosen)
    swa_layers: int = 0  # sliding-window blocks holding fewer cells than the context
    swa_cells: int = 0  # cells each of them keeps (window·n_seq + ubatch, padded to 256)
    n_blocks: int = 0  # transformer blocks (n_layers counts the output layer too)
    image_tokens: int = 0  # context tokens one image takes (0: no projector)
    links: tuple[LinkCost, ...] = ()  # network traffic per token to each worker's device

    @property
    def weights(self) -> int:
        return sum(d.weights for d in self.devices)

    @property
    def kv(self) -> int:
        return sum(d.kv for d in self.devices)

    @property
    def compute(self) -> int:
        return sum(d.compute for d in self.devices)

    @property
    def overhead(self) -> int:
        return sum(d.overhead for d in self.devices)

    @property
    def total(self) -> int:
        return sum(d.total for d in self.devices)

    def describe(self) -> str:
        """One line for people: verdict, layers, totals, the largest context that fits."""
        head = _VERDICT_TEXT[self.verdict]
        workers = sum(1 for d in self.devices if d.kind == "rpc")
        if workers and self.verdict != "wont_fit":
            here = self.n_layers - self.gpu_layers
            head = (f"Split: {here} of {self.n_layers} layers here, {self.gpu_layers} on "
                    f"{workers} worker" + ("s" if workers > 1 else "")
                    + (" and this machine's GPUs" if any(d.kind in ("cuda", "metal")
                                                         for d in self.devices) else ""))
        elif self.verdict == "partial":
            head += f" ({self.gpu_layers} of {self.n_layers} layers on GPU)"
        if self.cpu_moe_layers:
            head += f", experts of {self.cpu_moe_layers} layers in RAM"
        other = f", other {fmt_bytes(self.overhead)}" if self.overhead else ""
        return (f"{head}: {fmt_bytes(self.total)} (weights {fmt_bytes(self.weights)}, "
                f"KV {fmt_bytes(self.kv)}, compute {fmt_bytes(self.compute)}{other}); "
                f"max context {self.max_context:,}")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for device, usage in zip(out["devices"], self.devices, strict=True):
            device["total"] = usage.total
            device["fits"] = usage.fits
        out.update(weights=self.weights, kv=self.kv, compute=self.compute,
                   overhead=self.overhead, total=self.total,
                   notes=list(self.notes), links=list(out["links"]), summary=self.describe())
        return out


def row_bytes(type_name: str, n_values: int) -> int:
    """Bytes of `n_values` of a ggml type, as ggml_row_size: q8_0 packs 32 values in 34 bytes."""
    try:
        block, size = type_block(type_name)
    except KeyError:
        raise SettingsError(f"unknown cache type {type_name!r}") from None
    return -(-n_values // block) * size


def kv_layer_bytes_per_token(info: ModelInfo, type_k: str = "f16",
                             type_v: str = "f16") -> tuple[int, ...]:
    """Cache bytes per token for each layer (0 for layers without attention)."""
    if info.kv_lora_rank is not None and info.key_length_mla is not None:
        # MLA: one compressed latent plus the rotary part per layer; V is a view of it.
        k = row_bytes(type_k, info.kv_lora_rank + info.rope_dims)
        return tuple(k if h else 0 for h in info.n_head_kv)
    return tuple(row_bytes(type_k, h * info.key_length) + row_bytes(type_v, h * info.value_length)
                 for h in info.n_head_kv)


def kv_bytes_per_token(info: ModelInfo, type_k: str = "f16", type_v: str = "f16") -> int:
    """KV cache bytes per token, all layers, K and V together.

    Σ over layers of n_head_kv × (key_length × bytes(type_k) + value_length × bytes(type_v)).
    Llama-2-70B (80 layers, 8 KV heads of 128) at f16: 80 × 8 × (128·2 + 128·2) = 327,680
    bytes per token (163,840 is K alone), so 8K tokens take 2.5 GiB. DeepSeek-V3's MLA cache
    holds 512 + 64 = 576 values per layer per token; SmolLM2-135M (30 layers, 3 × 64) takes
    23,040 bytes at f16. q8_0 stores 34 bytes per 32 values, q4_0 18.
    """
    return sum(kv_layer_bytes_per_token(info, type_k, type_v))


def kv_cells(n_ctx: int) -> int:
    return -(-n_ctx // KV_CELL_PAD) * KV_CELL_PAD


def decode_batch(settings: LoadSettings) -> int:
    """The batch llama.cpp is given (`n_batch`): at most the context, and while drafting at
    most the micro-batch, so that every `llama_decode` is one micro-batch.

    That one rule is what keeps speculative decoding exact in a sliding-window cache (which
    the engine always uses: `swa_full` off, as llama-server). llama.cpp places a batch's
    micro-batches one after another (llama_kv_cache::prepare), and a window cell may be
    reused once it is outside its sequence's window *as of the sequence's latest position*
    (find_slot: is_masked_swa(pos_cell, seq_pos_max + 1)). A verify batch moves a drafting
    sequence's latest position k draft tokens ahead; a later micro-batch of the same decode
    (another sequence's prompt chunk) may then take cells the sequence needs again once its
    rejected drafts are removed — the sample of probability 0 tests/engine/test_swa.py once
    drew with 4 slots, n_batch 512 and n_ubatch 64. Within one micro-batch every cell is
    chosen against the positions before it, and a sequence verifying from position p only
    gives up cells at p − window or before, which no position after p attends to again, so a
    rollback always finds its window whole. Cost: a prompt is fed in micro-batch steps
    (llama.cpp splits a larger batch into the same micro-batches anyway). At the default
    n_batch = n_ubatch = 512 nothing changes.

        >>> from pathlib import Path
        >>> from runtime.settings.load import DraftSettings
        >>> decode_batch(LoadSettings(model_path=Path("m.gguf"), n_batch=2048, n_ubatch=512,
        ...                           draft=DraftSettings(kind="ngram")))
        512
    """
    n_batch = min(settings.n_batch, settings.n_ctx)
    if settings.draft.kind != "none":
        n_batch = min(n_batch, settings.n_ubatch)
    return n_batch


def layer_kv_cells(info: ModelInfo, cells: int, n_ubatch: int, n_seq: int,
                   swa_full: bool) -> tuple[int, ...]:
    """Cells per layer: sliding-window layers keep window·n_seq + ubatch (llama_kv_cache_iswa)."""
    if swa_full or not info.sliding_window:
        return (cells,) * info.block_count
    swa = min(cells, kv_cells(info.sliding_window * n_seq + n_ubatch))
    return tuple(swa if is_swa else cells for is_swa in info.swa_layers)


def compute_bytes(info: ModelInfo, n_kv: int, n_ubatch: int, flash_attn: bool,
                  n_seq: int = 1, *, with_logits: bool = True, with_layers: bool = True) -> int:
    """Peak scratch memory of one ubatch (see the module docstring), plus the logits buffer."""
    ub = n_ubatch
    n_embd_kv = max((h * info.key_length for h in info.n_head_kv), default=0)
    if info.kv_lora_rank is not None and info.key_length_mla is not None:
        n_embd_kv = info.kv_lora_rank + info.rope_dims
    n_ff = max(info.n_ff, info.n_ff_expert * max(info.n_expert_used, 1))
    mask = ub * n_kv * (2 if flash_attn else 4)
    phases = [4 * ub * info.n_embd]  # the input embeddings, at least
    if with_layers:
        scores = 0 if flash_attn else n_kv * info.n_head
        phases.append(mask + 4 * ub * (scores + 5 * info.n_embd + 2 * n_embd_kv))
        phases.append(mask + 4 * ub * (3 * n_ff + 4 * info.n_embd))
    if with_logits:
        phases.append(4 * ub * (info.n_vocab + 2 * info.n_embd))
    return max(phases) + 4 * info.n_vocab * n_seq


def flash_attn_on(settings: LoadSettings) -> bool:
    """As the engine sets it: on for "on", for "auto" (every ggml backend here supports it),
    and whenever V is quantized (llama.cpp needs it then)."""
    return settings.flash_attn != "off" or settings.type_v not in ("f16", "bf16", "f32")


def plan_memory(info: ModelInfo, settings: LoadSettings, devices: list[Device] | None = None,
                draft: ModelInfo | None = None, *, swa_full: bool = False,
                projector: ProjectorInfo | None = None) -> MemoryPlan:
    """Plan `info` loaded with `settings` against the free memory of `devices` (pure, given
    devices; None lists this machine's now).

    `settings.gpu_layers` None means auto: as many layers on the GPU(s) as fit. A requested
    count that does not fit gives "wont_fit" with `recommended_gpu_layers` saying what would.
    `swa_full` True: sliding-window layers as llama.cpp's default would keep them, the whole
    context (the engine never loads them so: see `decode_batch`).
    """
    if devices is None:
        devices = list_devices()
    cpu, gpus = _split_devices(devices)
    check_gpu_split(settings, gpus)
    if settings.cpu_moe == "auto":
        settings = dataclasses.replace(
            settings, cpu_moe=_fit_cpu_moe(info, settings, cpu, gpus, draft, swa_full, projector))
    n_cpu_moe = settings.cpu_moe_layers(info.block_count) if info.is_moe else 0
    n_layers = info.n_layers_offloadable
    notes: list[str] = []
    if settings.gpu_layers is None:
        candidates = list(range(n_layers, -1, -1)) if gpus else [0]
        if gpus and all(g.kind == "rpc" for g in gpus):
            candidates = _by_free_memory(n_layers, cpu, gpus)
        chosen = next((n for n in candidates
                       if _fits(_usage(info, settings, n, cpu, gpus, draft, swa_full, projector))), None)
        recommended = chosen or 0
        if chosen is None:  # nothing fits: show the split that allows the longest context
            chosen = max(candidates, key=lambda n: _max_context(info, settings, n, cpu, gpus,
                                                                draft, swa_full, projector))
    else:
        chosen = min(settings.gpu_layers, n_layers)
        if chosen and not gpus:
            notes.append(f"{settings.gpu_layers} GPU layers asked for, but there is no GPU")
            chosen = 0
        recommended = next((n for n in (range(n_layers, -1, -1) if gpus else [0])
                            if _fits(_usage(info, settings, n, cpu, gpus, draft, swa_full, projector))), 0)
    usage = _usage(info, settings, chosen, cpu, gpus, draft, swa_full, projector)
    fits = _fits(usage)
    if not fits:
        verdict: Verdict = "wont_fit"
        short = [u.id for u in usage if not u.fits] or ["cpu"]
        notes.append(f"needs more memory than is free on {', '.join(short)}")
    elif chosen == 0:
        verdict = "cpu_only"
    elif chosen == n_layers:
        verdict = "full_gpu"
    else:
        verdict = "partial"
    if info.kv_lora_rank is not None and info.key_length_mla is None:
        notes.append("this file predates llama.cpp's MLA cache: its KV cache is full size; "
                     "a re-converted file needs far less")
    if settings.n_ctx > info.n_ctx_train > 0:
        notes.append(f"context {settings.n_ctx:,} is beyond the {info.n_ctx_train:,} tokens "
                     "the model was trained on")
    if projector is not None:
        notes.append(image_note(projector, settings.n_ctx))
    return MemoryPlan(
        verdict=verdict, gpu_layers=chosen, n_layers=n_layers,
        recommended_gpu_layers=recommended, n_ctx=settings.n_ctx,
        kv_cells=kv_cells(settings.n_ctx),
        max_context=_max_context(info, settings, chosen, cpu, gpus, draft, swa_full, projector),
        kv_bytes_per_token=kv_bytes_per_token(info, settings.type_k, settings.type_v),
        flash_attn=flash_attn_on(settings), n_ubatch=_ubatch(settings),
        devices=tuple(usage), notes=tuple(notes), cpu_moe_layers=n_cpu_moe,
        image_tokens=projector.image_tokens if projector is not None else 0,
        links=_links(info, _layer_devices(info, chosen, gpus, _gpu_shares(settings, gpus)), gpus),
        **_swa_shape(info, settings, swa_full))


def _by_free_memory(n_layers: int, cpu: Device, workers: list[Device]) -> list[int]:
    """GPU-layer counts to try, best first, when the only "GPUs" are workers' devices (no GPU
    here): this machine keeps the share of the layers its free RAM is of all free memory, so
    every machine holds layers in proportion to what it has free — the count nearest that
    share first. (With a GPU here, its layers stay on the GPU-first rule.)

        >>> cpu = Device("cpu", "CPU", "cpu", total_bytes=16 << 30, free_bytes=8 << 30)
        >>> worker = Device("rpc:10.0.0.2:50052", "worker 10.0.0.2:50052", "rpc",
        ...                 total_bytes=16 << 30, free_bytes=8 << 30)
        >>> _by_free_memory(31, cpu, [worker, worker])[:3]       # 2/3 of 31 layers: 21
        [21, 20, 22]
    """
    remote = sum(max(w.free_bytes, 0) for w in workers)
    share = remote / max(remote + max(cpu.free_bytes, 0), 1)
    target = round(n_layers * share)
    return sorted(range(n_layers, -1, -1), key=lambda n: (abs(n - target), n))


def _links(info: ModelInfo, placement: list[int], gpus: list[Device]) -> tuple[LinkCost, ...]:
    """Bytes per generated token between this machine and each worker's device (`LinkCost`):
    the hidden state at each change of device along the layers (input embeddings on the CPU,
    index -1), and the logits from the output layer's device back to the host."""
    if not any(g.kind == "rpc" for g in gpus):
        return ()
    hidden, logits = 4 * info.n_embd, 4 * info.n_vocab
    sent = [0] * len(gpus)

    def cross(dev: int, size: int) -> None:
        if dev >= 0 and gpus[dev].kind == "rpc":
            sent[dev] += size

    previous = -1
    for dev in placement[:-1]:  # the blocks, in order; the output layer is last
        if dev != previous:
            cross(previous, hidden)
            cross(dev, hidden)
        previous = dev
    out_dev = placement[-1]
    if out_dev != previous:
        cross(previous, hidden)
        cross(out_dev, hidden)
    cross(out_dev, logits)
    return tuple(LinkCost(g.id, n) for g, n in zip(gpus, sent, strict=True) if g.kind == "rpc")


def image_note(projector: ProjectorInfo, n_ctx: int) -> str:
    """What images cost of the context: "each image takes 256 tokens (16 fit in 4,096)"."""
    n = projector.image_tokens
    about = "" if projector.image_tokens_exact else "about "
    fit = f" ({n_ctx // n:,} fit in {n_ctx:,})" if n else ""
    return f"each image takes {about}{n:,} tokens of the context{fit}"


def _swa_shape(info: ModelInfo, settings: LoadSettings, swa_full: bool) -> dict[str, int]:
    """How many blocks keep a sliding window's cells instead of the context's, and how many."""
    cells = kv_cells(settings.n_ctx)
    per_layer = layer_kv_cells(info, cells, _ubatch(settings), settings.n_parallel, swa_full)
    short = [n for n in per_layer if n < cells]
    return {"swa_layers": len(short), "swa_cells": short[0] if short else 0,
            "n_blocks": info.block_count}


def max_context(info: ModelInfo, settings: LoadSettings, devices: list[Device] | None = None,
                draft: ModelInfo | None = None, gpu_layers: int | None = None,
                *, swa_full: bool = False, projector: ProjectorInfo | None = None) -> int:
    """The largest context (a multiple of 256, up to the training context or the asked one,
    whichever is larger) that fits with `gpu_layers` (default: the plan's); 0 if none."""
    if devices is None:
        devices = list_devices()
    cpu, gpus = _split_devices(devices)
    if gpu_layers is None or settings.cpu_moe == "auto":
        plan = plan_memory(info, settings, devices, draft, swa_full=swa_full,
                           projector=projector)
        gpu_layers = plan.gpu_layers if gpu_layers is None else gpu_layers
        settings = dataclasses.replace(settings, cpu_moe=plan.cpu_moe_layers)
    return _max_context(info, settings, min(gpu_layers, info.n_layers_offloadable) if gpus else 0,
                        cpu, gpus, draft, swa_full, projector)


def _max_context(info: ModelInfo, settings: LoadSettings, gpu_layers: int, cpu: Device,
                 gpus: list[Device], draft: ModelInfo | None, swa_full: bool,
                 projector: ProjectorInfo | None = None) -> int:
    def fits(n_ctx: int) -> bool:
        trial = dataclasses.replace(settings, n_ctx=n_ctx)
        return _fits(_usage(info, trial, gpu_layers, cpu, gpus, draft, swa_full, projector))

    lo, hi = 0, max(info.n_ctx_train, settings.n_ctx, KV_CELL_PAD) // KV_CELL_PAD
    while lo < hi:  # the largest k with fits(256·k); memory grows with the context
        mid = (lo + hi + 1) // 2
        if fits(mid * KV_CELL_PAD):
            lo = mid
        else:
            hi = mid - 1
    return lo * KV_CELL_PAD


def _fit_cpu_moe(info: ModelInfo, settings: LoadSettings, cpu: Device, gpus: list[Device],
                 draft: ModelInfo | None, swa_full: bool,
                 projector: ProjectorInfo | None = None) -> int:
    """"Auto" experts in RAM, as llama.cpp's --fit (common/fit.cpp) chooses them: every layer
    on the GPU(s) (or the layers asked for) with the experts of as few leading blocks in
    RAM as the chosen context allows; when not even all of them in RAM lets every layer
    fit, all stay there and the GPU layers are cut instead (dense-only layers back to front).

    A 48-block Qwen3-30B-A3B at Q4_K_M (~17 GiB, 16.5 of them experts) on a 12 GiB GPU at
    8K: the attention and shared weights of all 48 blocks plus the experts of the last ~14
    fit, so N ≈ 34 (llama.cpp's `--n-cpu-moe 34`). Without a GPU or experts: 0.
    """
    if not gpus or not info.is_moe:
        return 0
    layers = info.n_layers_offloadable if settings.gpu_layers is None else settings.gpu_layers
    for n in range(info.block_count + 1):  # memory falls as n grows: the first fit is the most
        trial = dataclasses.replace(settings, cpu_moe=n)
        if _fits(_usage(info, trial, layers, cpu, gpus, draft, swa_full, projector)):
            return n
    return info.block_count


def check_gpu_split(settings: LoadSettings, gpus: list[Device], *,
                    gpu_build: bool = True) -> None:
    """A tensor split or main GPU must name GPUs that exist here: one-line errors.

    A split may name fewer GPUs than there are (the rest get no layers, as in llama.cpp),
    never more: llama.cpp would quietly drop the extra shares. gpu_build=False: llama.cpp
    here runs on the CPU only, so no GPU exists for it whatever the machine holds.

        >>> from pathlib import Path
        >>> cuda0 = Device("cuda:0", "NVIDIA GeForce RTX 4090", "cuda",
        ...                total_bytes=24 << 30, free_bytes=23 << 30)
        >>> check_gpu_split(LoadSettings(model_path=Path("m.gguf"), main_gpu=1), [cuda0])
        Traceback (most recent call last):
        runtime.errors.SettingsError: main GPU 1 does not exist: this machine has GPU 0
    """
    cpu_only = "this llama.cpp build runs on the CPU only"
    split = settings.tensor_split
    n_gpus = len(gpus) if gpu_build else 0
    if split is not None and len(split) > n_gpus:
        have = f"{n_gpus} GPU" + ("" if n_gpus == 1 else "s") if n_gpus else "no GPU"
        raise SettingsError(f"the tensor split names {len(split)} GPUs, but "
                            + (f"this machine has {have}" if gpu_build else cpu_only))
    if settings.main_gpu is not None and settings.main_gpu >= n_gpus:
        have = f"GPUs 0 to {n_gpus - 1}" if n_gpus > 1 else ("GPU 0" if n_gpus else "no GPU")
        raise SettingsError(f"main GPU {settings.main_gpu} does not exist: "
                            + (f"this machine has {have}" if gpu_build else cpu_only))


def _gpu_shares(settings: LoadSettings, gpus: list[Device]) -> list[float]:
    """Each GPU's share of the offloaded layers, as llama.cpp's load_tensors takes them: the
    main GPU alone (split mode none), the tensor split (missing GPUs get 0), or, when the
    split is unset or all zeros, each GPU's free memory."""
    if settings.main_gpu is not None:
        return [float(i == settings.main_gpu) for i in range(len(gpus))]
    split = list(settings.tensor_split or ())
    if any(split):
        return [float(x) for x in split] + [0.0] * (len(gpus) - len(split))
    return [float(max(g.free_bytes, 1)) for g in gpus]


def _split_devices(devices: list[Device]) -> tuple[Device, list[Device]]:
    cpus = [d for d in devices if d.kind == "cpu"]
    if not cpus:
        raise SettingsError("a memory plan needs the CPU among the devices")
    return cpus[0], [d for d in devices if d.kind != "cpu"]


def _ubatch(settings: LoadSettings) -> int:
    return min(settings.n_ubatch, decode_batch(settings))


def _layer_devices(info: ModelInfo, gpu_layers: int, gpus: list[Device],
                   shares: list[float] | None = None) -> list[int]:
    """Device index (-1 = CPU, else into `gpus`) of blocks 0..n-1 and, last, the output layer.

    As llama.cpp's load_tensors: i_gpu_start = n_layer + 1 - gpu_layers, and layer i goes to
    the first GPU whose cumulative share exceeds (i - i_gpu_start) / gpu_layers. A 3:1 split
    of 32 blocks + output over two GPUs: 25 layers on the first, 8 (with the output) on the
    second. `shares` default to free memory (`_gpu_shares`).
    """
    n = info.block_count
    if not gpus or gpu_layers <= 0:
        return [-1] * (n + 1)
    free = shares if shares is not None else [float(max(g.free_bytes, 1)) for g in gpus]
    bounds = [sum(free[:i + 1]) / sum(free) for i in range(len(gpus))]
    start = max(n + 1 - gpu_layers, 0)
    active = min(gpu_layers, n + 1)
    out = []
    for il in range(n + 1):
        if il < start:
            out.append(-1)
        else:
            fraction = (il - start) / active
            out.append(min(next(i for i, b in enumerate(bounds) if fraction < b), len(gpus) - 1))
    return out


def _usage(info: ModelInfo, settings: LoadSettings, gpu_layers: int, cpu: Device,
           gpus: list[Device], draft: ModelInfo | None, swa_full: bool,
           projector: ProjectorInfo | None = None) -> list[DeviceUsage]:
    ub = _ubatch(settings)
    flash = flash_attn_on(settings)
    cells = kv_cells(settings.n_ctx)
    n_dev = len(gpus) + 1  # index -1 (CPU) is stored last
    weights, kv, compute, extra = [0] * n_dev, [0] * n_dev, [0] * n_dev, [0] * n_dev

    placement = _layer_devices(info, gpu_layers, gpus, _gpu_shares(settings, gpus))
    per_token = kv_layer_bytes_per_token(info, settings.type_k, settings.type_v)
    per_layer_cells = layer_kv_cells(info, cells, ub, settings.n_parallel, swa_full)
    n_cpu_moe = settings.cpu_moe_layers(info.block_count) if info.is_moe else 0
    weights[-1] += info.input_bytes
    for il, dev in enumerate(placement[:-1]):
        experts = info.expert_bytes(il) if il < n_cpu_moe else 0  # overridden into RAM
        weights[dev] += info.tensor_bytes_by_layer[il] - experts
        weights[-1] += experts
        kv[dev] += per_token[il] * per_layer_cells[il]
    out_dev = placement[-1]
    weights[out_dev] += info.output_bytes
    if info.tied_embeddings and out_dev != -1:
        weights[out_dev] += info.input_bytes  # llama.cpp copies token_embd as the output head
    for dev in {*placement, -1}:  # the CPU always computes the input embeddings
        # The CPU runs the matmuls of experts it holds for GPU blocks (not calibrated).
        has_layers = dev in placement[:-1] or (dev == -1 and n_cpu_moe > 0)
        compute[dev] = compute_bytes(info, cells, ub, flash, settings.n_parallel,
                                     with_logits=dev == out_dev, with_layers=has_layers)
    host = host_overhead(info)
    if draft is not None:
        full_gpu = bool(gpus) and gpu_layers >= info.n_layers_offloadable
        dev = 0 if full_gpu else -1  # a draft rides with the target's head
        draft_kv = kv_bytes_per_token(draft, settings.type_k, settings.type_v) * cells
        draft_compute = compute_bytes(draft, cells, ub, flash, settings.n_parallel)
        extra[dev] = draft.tensor_bytes + draft_kv + draft_compute
        extra[-1] += host_overhead(draft)
        host += host_overhead(draft)
        weights[dev] += draft.tensor_bytes
        kv[dev] += draft_kv
        compute[dev] += draft_compute

    vision = [0] * n_dev
    if projector is not None:
        dev = 0 if gpus and gpu_layers > 0 else -1  # mtmd's use_gpu: the first GPU
        proj_weights, proj_compute = projector_bytes(projector, flash_attn=flash)
        weights[dev] += proj_weights
        compute[dev] += proj_compute
        vision[dev] = proj_weights + proj_compute

    usage = []
    for i, gpu in enumerate(gpus):
        used = weights[i] or kv[i] or compute[i]
        overhead = GPU_RUNTIME_OVERHEAD if used and gpu.kind == "cuda" else 0
        usage.append(DeviceUsage(gpu.id, gpu.name, gpu.kind, gpu.free_bytes, gpu.total_bytes,
                                 weights[i], kv[i], compute[i], overhead, extra[i], vision[i]))
    usage.append(DeviceUsage(cpu.id, cpu.name, cpu.kind, cpu.free_bytes, cpu.total_bytes,
                             weights[-1], kv[-1], compute[-1], host, extra[-1], vision[-1]))
    return usage


def host_overhead(info: ModelInfo) -> int:
    """RAM a loaded model takes outside llama.cpp's buffers (see HOST_OVERHEAD_BASE)."""
    return HOST_OVERHEAD_BASE + HOST_OVERHEAD_PER_TOKEN * info.n_tokens


def _fits(usage: list[DeviceUsage]) -> bool:
    if not all(u.fits for u in usage):
        return False
    # Unified memory (Apple): GPU and CPU parts come out of the same RAM.
    cpu = usage[-1]
    unified = sum(u.total for u in usage[:-1] if u.kind == "metal")
    return cpu.total + unified <= cpu.free_bytes if unified else True


"""Load settings → the values that go into llama.cpp's model and context parameters.

One pure function, `to_llama_params`, decides every number llama.cpp is given, so what a
setting does can be read (and tested) here instead of being scattered through the loader.
It imports nothing from llama_cpp: the ggml type ids come from the one table of ggml types
(`runtime.gguf.constants`), the enum values are copied below, and both are checked against
the binding by `tests/engine/test_llama.py`.

    >>> p = to_llama_params(LoadSettings(model_path=Path("m.gguf"), type_v="q8_0"), 0,
    ...                     cpu_count=4, repack=True)
    >>> p.type_v, p.flash_attn, p.n_threads
    (8, 1, 4)
    >>> p.notes
    ('flash attention on: the quantized V cache (q8_0) needs it',)

The context always gets `n_seq_max = n_parallel` slots over one *unified* KV cache: the
scheduler batches sequences continuously and shares prefix cells between them with
`llama_memory_seq_cp`, which only shares cells (instead of copying them) when every sequence
lives in the same stream.

Sliding-window layers get a cache of their true size (`swa_full` off, as llama-server runs
them): Gemma-3-27B at 128K keeps ~11 GiB instead of ~62 GiB, drafting or not — while
drafting, each decode is one micro-batch, which keeps rolling back rejected drafts exact
(`runtime.planner.plan.decode_batch` says why). Such a cache drops cells that slid out of
the window, so reusing prefixes needs care (`runtime.engine.kv_slots`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.gguf.constants import type_id
from runtime.gguf.info import EXPERT_TENSOR
from runtime.hugepages import weights_in_ram
from runtime.openmp import physical_cores
from runtime.planner.plan import decode_batch
from runtime.settings.load import LoadSettings

_UNQUANTIZED = ("f32", "f16", "bf16")

# enum llama_flash_attn_type
FLASH_ATTN_AUTO = -1
FLASH_ATTN_OFF = 0
FLASH_ATTN_ON = 1

# enum llama_load_mode
LOAD_MODE_AUTO = -1  # llama.cpp's choice by the devices (llama_model_default_params)
LOAD_MODE_NONE = 0
LOAD_MODE_MMAP = 1

GPU_LAYERS_ALL = -1  # llama_model_params.n_gpu_layers: every layer (llama.cpp's default)

# enum llama_split_mode
SPLIT_MODE_NONE = 0  # the whole model on main_gpu
SPLIT_MODE_LAYER = 1  # blocks spread over the GPUs by tensor_split

CPU_MOE_ALL = -1  # LlamaParams.n_cpu_moe: every block's experts in RAM


@dataclass(frozen=True)
class LlamaParams:
    """Plain values for `llama_model_params` (first group) and `llama_context_params`."""

    # llama_model_params
    n_gpu_layers: int
    load_mode: int
    # llama_context_params
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_threads: int
    n_threads_batch: int
    type_k: int
    type_v: int
    flash_attn: int
    kv_unified: bool
    offload_kqv: bool
    no_perf: bool
    notes: tuple[str, ...] = ()
    # False: sliding-window layers keep window·n_seq + ubatch cells, not the whole context
    # (llama-server's default; llama_context_default_params says true).
    swa_full: bool = False
    # llama_model_params: several GPUs, and experts kept in RAM (`expert_override_patterns`)
    split_mode: int = SPLIT_MODE_LAYER
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()  # empty: by free memory
    n_cpu_moe: int = 0  # blocks whose experts stay in RAM, CPU_MOE_ALL for all
    # llama_model_params.devices: these workers' devices first, then this machine's GPUs
    # (`runtime.llama.rpc.model_devices`); empty: llama.cpp's default list
    workers: tuple[str, ...] = ()
    # llama_model_params.use_extra_bufts: weights repacked for the CPU's kernels (AMX, or
    # the interleaved AVX2/NEON layouts); off where those kernels crash (`repack_is_safe`)
    repack: bool = True


def repack_is_safe(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """False on a CPU with AMX-INT8: there llama.cpp repacks a quantized model's weights
    into its AMX buffer, and `ggml_backend_amx_mul_mat` segfaults on the first prompt of more
    than a token (llama.cpp#20824, open; ollama's and dspy's Sapphire Rapids machines alike;
    SmolLM2 Q4_1 on this project's CI machine, an Intel Xeon with amx_int8). llama.cpp can
    only turn every extra buffer type off together (`--no-repack`), so such a CPU loses the
    interleaved AVX2 layouts too: slower prompts, against a crash.

        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix="cpuinfo") as f:
        ...     _ = f.write("flags : fpu avx2 avx512f amx_bf16 amx_tile amx_int8"); f.flush()
        ...     repack_is_safe(Path(f.name))
        False
    """
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux (macOS has no AMX; Windows: llama.cpp's default)
        return True
    for line in text.splitlines():
        if line.startswith("flags"):
            return "amx_int8" not in line.split(":", 1)[-1].split()
    return True


def default_threads(cpu_count: int | None = None) -> int:
    """Threads for generation when the user chose none: one per *physical* core, at least 1.

    This is llama.cpp's own default (common's `cpu_get_num_math` → physical cores, found
    from the distinct thread-sibling sets). ggml splits each op's rows evenly between its
    threads and waits for all of them at a barrier before the next op; two threads on
    hyperthread siblings share one core's vector units, so each finishes its share late and
    every other thread waits at the barrier. An 8-core, 16-thread CPU therefore gets 8, not
    16. (On hybrid Intel CPUs llama.cpp also leaves out the efficiency cores; psutil cannot
    tell them apart, so there every core counts.)

    `cpu_count` replaces the detected number (tests). Without a physical count (psutil
    returns None on some platforms and in some containers) the logical count is used.

    >>> default_threads(cpu_count=4)
    4
    """
    if cpu_count is None:
        cpu_count = physical_cores()  # one owner: runtime.openmp sizes its spin by it
    return max(1, cpu_count)


def expert_override_patterns(n_cpu_moe: int) -> tuple[str, ...]:
    r"""The tensor-name regexes whose tensors llama.cpp must put in the CPU buffer type, as
    common/arg.cpp builds them for --cpu-moe (all) and --n-cpu-moe N (one per block).

        >>> expert_override_patterns(2)
        ('blk\\.0\\.ffn_(up|down|gate|gate_up)_(ch|)exps', 'blk\\.1\\.ffn_(up|down|gate|gate_up)_(ch|)exps')
        >>> expert_override_patterns(CPU_MOE_ALL)
        ('\\.ffn_(up|down|gate|gate_up)_(ch|)exps',)
    """
    if n_cpu_moe == CPU_MOE_ALL:
        return (EXPERT_TENSOR,)
    return tuple(f"blk\\.{il}{EXPERT_TENSOR}" for il in range(n_cpu_moe))


def auto_cpu_moe_note(n: int) -> str:
    """What "auto" MoE experts on CPU chose, for LoadedModel.notes.

        >>> auto_cpu_moe_note(34)
        'MoE experts on CPU (auto): the first 34 layers keep their experts in RAM'
    """
    if n == 0:
        return "MoE experts on CPU (auto): none, the GPU layers' experts fit on the GPU"
    layers = "layer keeps its" if n == 1 else f"{n} layers keep their"
    return f"MoE experts on CPU (auto): the first {layers} experts in RAM"


def to_llama_params(settings: LoadSettings, plan_gpu_layers: int | None = None, *,
                    cpu_count: int | None = None,
                    plan_cpu_moe: int | None = None,
                    repack: bool | None = None) -> LlamaParams:
    """The llama.cpp parameters for `settings`.

    GPU layers: the user's number wins; with "auto" (None) the memory planner's
    `plan_gpu_layers` is used, and without a plan the model stays on the CPU (said in notes).
    A quantized V cache needs flash attention, so it is switched on (and said) even where the
    user chose "auto" or "off". The batch is never larger than the context (nor, while
    drafting, than the micro-batch: `decode_batch`), the micro-batch never larger than the
    batch. MoE experts on CPU: "all" or a count as given; "auto"
    takes the planner's `plan_cpu_moe` (said in notes: `auto_cpu_moe_note`); without it, all
    experts of a model with GPU layers stay in RAM (the GPU layers were planned for at most
    that much in VRAM). `main_gpu` puts the whole model on that GPU (llama.cpp's split mode
    "none"). The file is mapped unless the user chose otherwise (`use_mmap` False) or left it
    to auto (None) and reading it is better with these GPU layers
    (`runtime.hugepages.weights_in_ram`). Weights are repacked for the CPU's kernels unless
    `repack` (None: `repack_is_safe()`, this machine) says they crash.
    """
    notes: list[str] = []
    if repack is None:
        repack = repack_is_safe()
    if not repack:
        notes.append("weight repacking off: llama.cpp's AMX kernels crash on this CPU "
                     "(llama.cpp#20824)")
    if settings.gpu_layers is not None:
        n_gpu_layers = settings.gpu_layers
    elif plan_gpu_layers is not None:
        n_gpu_layers = plan_gpu_layers
    else:
        n_gpu_layers = 0
        notes.append("GPU layers: auto without a memory plan, so the model stays on the CPU")

    flash = {"auto": FLASH_ATTN_AUTO, "on": FLASH_ATTN_ON, "off": FLASH_ATTN_OFF}[settings.flash_attn]
    if settings.type_v not in _UNQUANTIZED:
        if settings.flash_attn == "off":
            notes.append(f"flash attention on although it was set off: the quantized V cache "
                         f"({settings.type_v}) needs it")
        elif settings.flash_attn == "auto":
            notes.append(f"flash attention on: the quantized V cache ({settings.type_v}) needs it")
        flash = FLASH_ATTN_ON

    n_batch = decode_batch(settings)
    n_ubatch = min(settings.n_ubatch, n_batch)
    if n_batch < min(settings.n_batch, settings.n_ctx):
        notes.append(f"batch size {n_batch} (the micro-batch) instead of {settings.n_batch} "
                     "while drafting: it keeps rolling back drafts exact in a sliding-window "
                     "cache")
    threads = settings.n_threads if settings.n_threads is not None else default_threads(cpu_count)
    threads_batch = settings.n_threads_batch if settings.n_threads_batch is not None else threads

    if settings.cpu_moe == "all":
        n_cpu_moe = CPU_MOE_ALL
    elif settings.cpu_moe != "auto":
        n_cpu_moe = settings.cpu_moe
    elif plan_cpu_moe is not None:
        n_cpu_moe = plan_cpu_moe
        if n_gpu_layers > 0:
            notes.append(auto_cpu_moe_note(plan_cpu_moe))
    elif n_gpu_layers == 0:
        n_cpu_moe = 0  # every block is in RAM already
    else:  # GPU layers planned for some count of experts in RAM: all of them is the safe side
        n_cpu_moe = CPU_MOE_ALL
        notes.append("MoE experts on CPU: auto without the planner's count, so all stay in "
                     "RAM (a dense model is not affected)")

    return LlamaParams(
        n_gpu_layers=n_gpu_layers,
        load_mode=LOAD_MODE_MMAP if _mapped(settings, n_gpu_layers) else LOAD_MODE_NONE,
        n_ctx=settings.n_ctx,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_seq_max=settings.n_parallel,
        n_threads=threads,
        n_threads_batch=threads_batch,
        type_k=type_id(settings.type_k),
        type_v=type_id(settings.type_v),
        flash_attn=flash,
        kv_unified=True,
        offload_kqv=True,
        no_perf=True,
        notes=tuple(notes),
        split_mode=SPLIT_MODE_LAYER if settings.main_gpu is None else SPLIT_MODE_NONE,
        main_gpu=settings.main_gpu or 0,
        tensor_split=tuple(float(x) for x in settings.tensor_split or ()),
        n_cpu_moe=n_cpu_moe,
        workers=settings.workers,
        repack=repack,
    )


def _mapped(settings: LoadSettings, n_gpu_layers: int) -> bool:
    """Map the file? The user's choice, or auto's (`weights_in_ram`, which looks at the file
    and this machine only then)."""
    if settings.use_mmap is not None:
        return settings.use_mmap
    return not weights_in_ram(settings.model_path, n_gpu_layers)

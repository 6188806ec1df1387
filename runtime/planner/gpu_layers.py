"""The placement choice for "auto": how many layers the memory planner puts on the GPU(s),
and for a mixture-of-experts model with experts on CPU "auto", how many blocks keep their
experts in RAM.

    planned_gpu_layers(LoadSettings(model_path=smollm2))  # SmolLM2-135M, one 24 GiB GPU
    # 31
    planned_gpu_layers(LoadSettings(model_path=smollm2))  # the same file, no GPU
    # 0

A file that is no GGUF (or none at all) gives None:

    >>> from pathlib import Path
    >>> planned_gpu_layers(LoadSettings(model_path=Path("notes.txt"))) is None
    True

31 is every layer llama.cpp can offload (30 blocks and the output layer). Where not all fit,
it is the most that do (`plan_memory` offloads from the top); where nothing fits at all, the
split that allows the longest context, as the plan shows it.

The engine asks this on each load with `gpu_layers` None ("auto"); `runtime.engine.build`
wires it in, and the server's `/api/status` shows the whole plan (`plan_load`). Both read the
model's header, and the draft model's (its memory counts too), nothing more. A file the
planner cannot read gives None and the engine keeps the model on the CPU, saying so in its
notes: the plan is advice, so a model the planner cannot read still loads. Settings the
plan refuses (a tensor split over GPUs this machine lacks, more expert layers than the model
has) are a `SettingsError`, as they would be at load.

Both choices come from one plan (`planned_offload`), so they belong together: the GPU layers
were counted with exactly that many blocks' experts in RAM. On a 12 GiB GPU a 48-block
Qwen3-30B-A3B at 8K gets about `Offload(gpu_layers=49, cpu_moe=34)`: every layer on the GPU,
the experts of the first ~34 blocks in RAM (`runtime.planner.plan._fit_cpu_moe`). The engine
says the count in its notes ("MoE experts on CPU (auto): the first 34 layers keep their
experts in RAM").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runtime.errors import OutriderError, SettingsError
from runtime.gguf.info import ModelInfo, read_model_info
from runtime.gguf.projector import read_projector_info
from runtime.planner.devices import Device
from runtime.planner.plan import MemoryPlan, plan_memory
from runtime.planner.workers import devices_with_workers
from runtime.settings.load import LoadSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Offload:
    """What the planner chose for one load: GPU layers (of `MemoryPlan.n_layers`) and, for an
    MoE model whose experts on CPU are "auto", the blocks whose experts stay in RAM (None:
    nothing chosen — a dense model, or a count the user gave). gpu_layers None: no plan."""

    gpu_layers: int | None
    cpu_moe: int | None = None


def plan_load(settings: LoadSettings, devices: list[Device] | None = None) -> MemoryPlan | None:
    """The memory plan for loading `settings` against `devices` (None: this machine's now),
    or None when the model's (or the draft's) header cannot be read."""
    planned = _plan(settings, devices)
    return None if planned is None else planned[1]


def _plan(settings: LoadSettings,
          devices: list[Device] | None) -> tuple[ModelInfo, MemoryPlan] | None:
    if devices is None and settings.workers:
        devices = devices_with_workers(settings.workers)  # WorkerError: before any load
    try:
        info = read_model_info(settings.model_path)
        draft = read_draft_info(settings)
        projector = (read_projector_info(settings.mmproj_path)
                     if settings.mmproj_path is not None else None)
        return info, plan_memory(info, settings, devices, draft=draft, projector=projector)
    except SettingsError:
        raise  # the settings are wrong for this model or machine (a split over absent GPUs)
    except (OutriderError, OSError, ValueError) as exc:
        log.info("no memory plan for %s: %s", settings.model_path, exc)
        return None


def read_draft_info(settings: LoadSettings) -> ModelInfo | None:
    """The header of the draft model `settings` load beside the target, which the plan
    counts with it (weights, cache, compute); None when they draft with no model (no
    drafting, or prompt lookup, which has no weights). Every plan of a load reads it here."""
    draft = settings.draft
    if draft.kind == "model" and draft.model_path is not None:
        return read_model_info(draft.model_path)
    return None


def planned_offload(settings: LoadSettings,
                    devices: list[Device] | None = None) -> Offload | None:
    """GPU layers and "auto" experts in RAM from one plan (a GPU-layer count the user gave is
    kept as given); None when there is no plan."""
    planned = _plan(settings, devices)
    if planned is None:
        return None
    info, plan = planned
    gpu_layers = plan.gpu_layers if settings.gpu_layers is None else settings.gpu_layers
    cpu_moe = plan.cpu_moe_layers if settings.cpu_moe == "auto" and info.is_moe else None
    return Offload(gpu_layers, cpu_moe)


def planned_gpu_layers(settings: LoadSettings,
                       devices: list[Device] | None = None) -> int | None:
    """The GPU layers the planner picks for `settings` (`planned_offload` without the experts);
    None when there is no plan."""
    plan = plan_load(settings, devices)
    return None if plan is None else plan.gpu_layers

"""The GPU-layer choice for "auto": how many layers the memory planner puts on the GPU(s).

    >>> planned_gpu_layers(LoadSettings(model_path=smollm2))  # SmolLM2-135M, one 24 GiB GPU
    31
    >>> planned_gpu_layers(LoadSettings(model_path=smollm2))  # the same file, no GPU
    0
    >>> planned_gpu_layers(LoadSettings(model_path=Path("notes.txt"))) is None  # no GGUF
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
"""

from __future__ import annotations

import logging

from runtime.errors import OutriderError, SettingsError
from runtime.gguf.info import read_model_info
from runtime.planner.devices import Device
from runtime.planner.plan import MemoryPlan, plan_memory
from runtime.settings.load import LoadSettings

log = logging.getLogger(__name__)


def plan_load(settings: LoadSettings, devices: list[Device] | None = None) -> MemoryPlan | None:
    """The memory plan for loading `settings` against `devices` (None: this machine's now),
    or None when the model's (or the draft's) header cannot be read."""
    try:
        info = read_model_info(settings.model_path)
        draft = None
        if settings.draft.kind == "model" and settings.draft.model_path is not None:
            draft = read_model_info(settings.draft.model_path)
        return plan_memory(info, settings, devices, draft=draft)
    except SettingsError:
        raise  # the settings are wrong for this model or machine (a split over absent GPUs)
    except (OutriderError, OSError, ValueError) as exc:
        log.info("no memory plan for %s: %s", settings.model_path, exc)
        return None


def planned_gpu_layers(settings: LoadSettings,
                       devices: list[Device] | None = None) -> int | None:
    """The GPU layers the planner picks for `settings` (the engine's `plan_gpu_layers`
    collaborator for "auto"); None when there is no plan."""
    plan = plan_load(settings, devices)
    return None if plan is None else plan.gpu_layers

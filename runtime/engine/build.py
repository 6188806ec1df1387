"""The one engine factory: `outrider run`, `outrider chat`, `outrider serve` and the quality
tools all get their engine here, so they load a model the same way.

    engine = build_engine()
    engine.start()
    engine.load(LoadSettings(model_path=path))  # gpu_layers None, "auto": the planner's count

Every engine gets:

- drafting (`Speculation`): it attaches per load only when the settings ask for a draft
  model or prompt lookup, so a plain load costs nothing for it;
- the memory planner's choice for "auto" (`runtime.planner.gpu_layers`): GPU layers, and for
  an MoE model with experts on CPU "auto" how many blocks keep their experts in RAM, from
  one plan. Asked only where llama.cpp was built with a GPU backend — on a CPU build there
  is nothing to decide, and the planner, which sees an NVIDIA card through NVML whatever
  llama.cpp was built with, must not put layers on it;
- a check of the tensor split and main GPU against the GPUs llama.cpp can use here (none on
  a CPU build), on every load: llama.cpp would quietly drop shares of GPUs it lacks;
- the workers the settings name (`outrider worker` on other machines) asked what they offer
  before anything is loaded (`runtime.planner.workers`): their devices join the plan, first
  in llama.cpp's order, and a worker that cannot serve is a one-line `WorkerError`;
- the load probe (`runtime.engine.probe`): a file not yet known to be good is first loaded
  in a child process, so a llama.cpp abort (GGML_ASSERT) ends the child, not the engine.

Why one factory: the engine used to be assembled in three places that disagreed — the server
passed the planner, `outrider run` did not (so "auto" stayed on the CPU of a GPU machine), and
the bench wrapped the same modules in import guards. Tests that want a bare engine (no
drafting, no planner) construct `Engine` directly.
"""

from __future__ import annotations

from runtime.engine.engine import Engine
from runtime.engine.kv_store import KvStoreOptions
from runtime.engine.probe import LoadProbe
from runtime.llama.binding import supports_gpu_offload
from runtime.planner.devices import Device, cpu_device, list_devices
from runtime.planner.gpu_layers import Offload, planned_offload
from runtime.planner.plan import check_gpu_split
from runtime.planner.workers import probe_workers
from runtime.settings.load import LoadSettings
from runtime.speculative.speculation import Speculation


def build_engine(saved_kv: KvStoreOptions | None = None, *, profile: bool = False) -> Engine:
    """A new engine (not started) with drafting, the planner's automatic GPU layers and the
    load probe; `saved_kv` keeps idle conversations' KV caches on disk (`outrider serve`);
    `profile` times every decode step (`outrider run --profile`)."""
    return Engine(speculation=Speculation(), plan_gpu_layers=auto_gpu_layers, probe=LoadProbe(),
                  saved_kv=saved_kv, profile=profile)


def auto_gpu_layers(settings: LoadSettings) -> Offload | int | None:
    """Placement for `settings`: 0 on a CPU-only llama.cpp build, else the planner's GPU
    layers and "auto" experts in RAM (None when it cannot read the model: the engine then
    keeps it on the CPU and says so). A GPU-layer count the user gave wins over either, so
    none is planned for it unless the experts on CPU are "auto" (their count depends on the
    layers). A tensor split or main GPU naming a GPU llama.cpp does not have here is a
    one-line `SettingsError`, before anything is loaded."""
    gpu_build = supports_gpu_offload()
    devices: list[Device] | None = None
    if settings.workers:  # asked first: a worker that cannot serve is a WorkerError now
        local = list_devices() if gpu_build else [cpu_device()]
        devices = [d for info in probe_workers(settings.workers) for d in info.devices] + local
    if settings.tensor_split is not None or settings.main_gpu is not None:
        if devices is None:
            devices = list_devices() if gpu_build else []
        check_gpu_split(settings, [d for d in devices if d.is_gpu],
                        gpu_build=gpu_build or bool(settings.workers))
    if settings.gpu_layers is not None and settings.cpu_moe != "auto":
        return settings.gpu_layers
    if not gpu_build and not settings.workers:
        return 0
    return planned_offload(settings, devices or None)

"""The names of the memory figures the window shows, and what each counts — one owner, so
the chat header, the Memory panel and the status bar never call one figure by two names or
two figures by one. They once read "measured 239 MiB", "Used 263 MiB" and "Engine RAM
263 MiB" at the same moment: two different quantities, three names.

- **Engine RAM**: the engine process's resident memory now (RSS, what the OS counts as ours),
  live from the engine's metrics: the Memory panel and the status bar.
- **buffers**: what llama.cpp allocated when the model loaded (weights, KV cache, compute
  buffers), from its own log: the chat header, beside the plan. Engine RAM is larger: it also
  holds the Python runtime, the vocabulary and what the OS has paged in.
- **planned**: the memory plan's total for the load (`runtime.planner`), the same everywhere.
- **free as of load**: a worker's free memory (another machine's device, `outrider worker`)
  as it said before the load: it then serves this engine alone and cannot be asked again.
- **network … per token**: what a split across workers sends and receives per generated
  token (the plan's `links`): Settings → Model's plan and the Memory panel.

    >>> engine_ram_text(263 << 20)
    'Engine RAM 263 MiB'
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runtime.units import fmt_bytes

ENGINE_RAM = "Engine RAM"
ENGINE_RAM_TIP = ("Engine RAM: the engine process's resident memory right now (RSS), "
                  "everything it holds in RAM — model weights, KV cache, compute buffers, the "
                  "runtime and the vocabulary.")
BUFFERS = "buffers"
BUFFERS_TIP = ("buffers: what llama.cpp allocated when the model loaded (weights, KV cache, "
               "compute buffers). Engine RAM, in the Memory panel and the status bar, is "
               "larger: it also counts the runtime, the vocabulary and what the OS paged in.")
PLANNED_TIP = "planned: the memory plan's total for this load (weights, KV cache, compute, other)."
AS_OF_LOAD = "free as of load"
AS_OF_LOAD_TIP = ("A worker lends its memory to this engine alone while the model is loaded, "
                  "so it cannot be asked again: its free memory is what it said before the "
                  "load, and it has no live \"used\" figure.")


def engine_ram_text(rss_bytes: int) -> str:
    """The one way the Engine RAM figure is written."""
    return f"{ENGINE_RAM} {fmt_bytes(rss_bytes)}"


def network_text(links: Iterable[Any]) -> str:
    """The network a split costs per generated token, summed over the plan's links (the
    dicts of `/api/status`'s plan, or `runtime.planner.plan.LinkCost`s); "" without workers.

        >>> network_text([{"device": "rpc:10.0.0.2:50052", "bytes_per_token": 203_008}])
        'network 198 KiB per token'
        >>> network_text([])
        ''
    """
    total = sum(int(link["bytes_per_token"] if isinstance(link, dict) else link.bytes_per_token)
                for link in links)
    return f"network {fmt_bytes(total)} per token" if total else ""

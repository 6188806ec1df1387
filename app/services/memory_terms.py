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

    >>> engine_ram_text(263 << 20)
    'Engine RAM 263 MiB'
"""

from __future__ import annotations

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


def engine_ram_text(rss_bytes: int) -> str:
    """The one way the Engine RAM figure is written."""
    return f"{ENGINE_RAM} {fmt_bytes(rss_bytes)}"

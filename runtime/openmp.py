"""How long llama.cpp's OpenMP threads spin before they sleep, chosen before llama.cpp loads:
libgomp reads `GOMP_SPINCOUNT` once, as the library loads, so `runtime/__init__.py` calls
`spin_default()` before any module here imports llama_cpp (and children inherit it).

ggml splits every op of a decode between its threads and meets them at an OpenMP barrier
(`ggml_barrier`, ggml-cpu.c) — some 600 barriers a token for a 30-layer model. At each one
libgomp's early thread spins 300,000 rounds (a few ms) before it sleeps. That is the fastest
wait while every thread has a CPU to itself. It is the slowest when the threads take every
CPU the process may use — the default of one per physical core does, on a machine without
SMT (most VMs, small laptops): then whatever else wants to run (the engine's own pump and
HTTP threads, another resident model, any other program) preempts one of them, its partner
spins out a few ms at every barrier, and a token takes hundreds of ms. With a short spin the
early thread sleeps soon and gives the CPU to the one it waits for.

Measured, SmolLM2-135M Q4_1, 2 threads on a 2-CPU VM also running two busy processes, time
to first token / decode (each engine in its own process, requests taken in turn):

    GOMP_SPINCOUNT   busy VM             nothing else runnable (SCHED_FIFO)
    300000 (libgomp) 845 ms /  4.1 tok/s  —
    1000              87 ms / 27 tok/s    59 ms / 107 tok/s
    300               71 ms / 42 tok/s    41 ms / 111 tok/s
    0 (passive)       76 ms / 56 tok/s    52 ms /  43 tok/s

libgomp already cuts its spin (to 100) when it has more threads than CPUs; this extends that
to "as many as CPUs", where the engine's other threads have no CPU to spare either. Where a
core is left over (an SMT machine keeps the logical ones) nothing changes. A user's own
`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` always wins.

    >>> env = {}
    >>> spin_default(env, threads=2, cpus=2)
    '300'
    >>> env
    {'GOMP_SPINCOUNT': '300'}
    >>> spin_default({}, threads=8, cpus=16) is None     # a spare CPU per thread: as libgomp does
    True
    >>> spin_default({"GOMP_SPINCOUNT": "300000"}, threads=2, cpus=2) is None  # yours wins
    True
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import psutil

from runtime.hugepages import without_ours

CROWDED_SPIN = 300  # rounds: a few µs, about what a futex sleep and wake-up cost
_USER_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_set_here = False  # spin_default() set it in os.environ


def physical_cores() -> int:
    """Physical cores (llama.cpp's thread default, `runtime.llama.params.default_threads`),
    the logical count where psutil cannot tell (some containers), at least 1."""
    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: `taskset`, a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def spin_default(environ: MutableMapping[str, str] | None = None, *, threads: int | None = None,
                 cpus: int | None = None) -> str | None:
    """Set `GOMP_SPINCOUNT` to `CROWDED_SPIN` in `environ` (the process's by default) when
    the default `threads` (physical cores) take all `cpus` and the user set neither knob;
    return what was set, None when nothing was."""
    env = os.environ if environ is None else environ
    if any(knob in env for knob in _USER_KNOBS):
        return None
    threads = physical_cores() if threads is None else threads
    cpus = usable_cpus() if cpus is None else cpus
    if threads < cpus:
        return None
    env["GOMP_SPINCOUNT"] = str(CROWDED_SPIN)
    if environ is None:
        global _set_here
        _set_here = True
    return env["GOMP_SPINCOUNT"]


def reference_env() -> dict[str, str]:
    """This process's environment without what Outrider set for its own engines (the spin
    `spin_default` set, the huge-page tunable of `runtime.hugepages`): what another program
    (llama.cpp's own tools, in the benchmarks) runs with at its own defaults."""
    env = dict(os.environ)
    if _set_here and env.get("GOMP_SPINCOUNT") == str(CROWDED_SPIN):
        del env["GOMP_SPINCOUNT"]
    return without_ours(env)

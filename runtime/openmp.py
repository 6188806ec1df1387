"""How long llama.cpp's OpenMP threads spin before they sleep, chosen before llama.cpp loads:
libgomp reads `GOMP_SPINCOUNT` once, as the library loads, so a process that runs engines
calls `spin_default()` (through `prepare_engine_process`, with the huge-page tunable of
`runtime.hugepages`) as it starts, before anything in it imports llama_cpp; the engine
processes it starts inherit both. Importing `runtime` sets nothing: the app's window, which
runs no engine, keeps the environment it was given.

ggml splits every op of a decode between its threads and meets them at an OpenMP barrier
(`ggml_barrier`, ggml-cpu.c) — some 600 barriers a token for a 30-layer model. At each one
libgomp's early thread spins 300,000 rounds (a few ms) before it sleeps. That is the fastest
wait while every thread has a CPU to itself. It is the slowest when the threads take every
CPU the process may use — the default of one per physical core does, on a machine without
SMT (most VMs, small laptops): then whatever else wants to run (the engine's own pump and
HTTP threads, another resident model, any other program) preempts one of them, its partner
spins out a few ms at every barrier, and a token takes hundreds of ms. With a short spin the
early thread sleeps soon and gives the CPU to the one it waits for.

Measured, SmolLM2-135M Q4_1, 2 threads on a 2-CPU VM (an AMX host, 2026-12-07), time to
first token / decode of a 64-token reply, the machine quiet or running two busy processes
(`benchmarks/spin_counts.py`):

    GOMP_SPINCOUNT   quiet                busy
    300000 (libgomp) 12 ms / 92 tok/s     31 ms / 34 tok/s
    10000            12 ms / 94 tok/s     22 ms / 36 tok/s
    3000             12 ms / 92 tok/s     22 ms / 37 tok/s
    1000             12 ms / 88 tok/s     30 ms / 33 tok/s
    300              18 ms / 55 tok/s     56 ms / 27 tok/s
    0 (passive)      32 ms / 32 tok/s     21 ms / 48 tok/s

An earlier VM lost a token to hundreds of ms with libgomp's spin when busy (845 ms to the
first token) and kept its speed at 300 rounds; this one loses 40 % of its decode at 300 (a
futex sleep and wake-up at each barrier costs more than the wait it saves). The busy column
moves by a quarter between runs (a second one: 3,000 rounds 19 ms / 29 tok/s, 300 rounds
42 ms / 21 tok/s, 0 rounds 67 ms / 15 tok/s): 3,000 rounds is as fast as the full spin when
quiet, and when busy it is among the spins that beat 300 and 0 in both runs.

libgomp already cuts its spin (to 100) when it has more threads than CPUs; this extends that
to "as many as CPUs", where the engine's other threads have no CPU to spare either. Where a
core is left over (an SMT machine keeps the logical ones) nothing changes. A user's own
`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` always wins.

    >>> env = {}
    >>> spin_default(env, threads=2, cpus=2)
    '3000'
    >>> env
    {'GOMP_SPINCOUNT': '3000'}
    >>> spin_default({}, threads=8, cpus=16) is None     # a spare CPU per thread: as libgomp does
    True
    >>> spin_default({"GOMP_SPINCOUNT": "300000"}, threads=2, cpus=2) is None  # yours wins
    True
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import psutil

from runtime.hugepages import huge_pages_default, without_ours

CROWDED_SPIN = 3000  # rounds: tens of µs, a little more than a futex sleep and wake-up cost
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


def prepare_engine_process() -> None:
    """Give this process the environment an engine process runs in: libgomp's spin
    (`spin_default`) and glibc's huge-page tunable (`runtime.hugepages.huge_pages_default`),
    each where it helps and the user set none. Call it where such a process starts, before
    anything in it imports llama_cpp (the command line does, in `runtime/cli/__init__.py`);
    the children it starts (the server's engines, the load probe) inherit both, and
    `reference_env` leaves both out again."""
    spin_default()
    huge_pages_default()


def reference_env() -> dict[str, str]:
    """This process's environment without what Outrider set for its own engines (the spin
    `spin_default` set, the huge-page tunable of `runtime.hugepages`): what another program
    (llama.cpp's own tools, in the benchmarks) runs with at its own defaults."""
    env = dict(os.environ)
    if _set_here and env.get("GOMP_SPINCOUNT") == str(CROWDED_SPIN):
        del env["GOMP_SPINCOUNT"]
    return without_ours(env)

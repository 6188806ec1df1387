"""Model weights on 2 MiB pages (Linux): set for the engine processes before they start, and
the load-time rule that uses them.

A decode streams every weight through the CPU once a token. With 4 KiB pages a 92 MiB model
is some 23,000 pages a token, each a TLB entry to walk for; with 2 MiB pages it is 46.
Linux gives anonymous memory transparent huge pages (THP) when the program asks for them
(`madvise`, the default of most distributions) or always; it gives them to no file mapping
of an ordinary file system. So two things are needed, and llama.cpp does neither by itself:

- the weights read into anonymous memory instead of mapped from the file (llama.cpp's load
  mode "none", `--no-mmap`), and
- that memory asked for huge pages. ggml allocates its buffers with `posix_memalign`, and
  glibc asks for THP on its large allocations when the tunable `glibc.malloc.hugetlb=1` is
  set (glibc 2.35 and later). Tunables are read as a program starts, so `huge_pages_default`
  (called where an engine process starts: `runtime.openmp.prepare_engine_process`) puts it
  in the environment the engine processes inherit (`runtime.engine.isolated`); the process
  that sets it gets nothing from it, unless it starts again (`restart_as_engine_process`).

`weights_in_ram` is the rule for `LoadSettings.use_mmap = None` (auto): read the file into
RAM when this process allocates on huge pages, the model stays on the CPU, and the file
takes at most half of the memory available (reading it passes through the page cache, so
for a moment the file is in memory twice; beyond that mapping is the safer way). Anywhere
else (macOS, Windows, musl, THP off, a GPU layer, a large model) the file is mapped, as
llama.cpp does by default. Measured in docs/benchmarks.md ("Weights on huge pages").

A user's own `glibc.malloc.hugetlb` setting always wins.

    >>> env = {}
    >>> huge_pages_default(env, mode="madvise", glibc=(2, 36))
    'glibc.malloc.hugetlb=1'
    >>> env
    {'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}
    >>> env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    >>> huge_pages_default(env, mode="madvise", glibc=(2, 36))
    'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1'
    >>> huge_pages_default({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, mode="madvise",
    ...                    glibc=(2, 36)) is None                  # yours wins
    True
    >>> huge_pages_default({}, mode="madvise", glibc=(2, 31)) is None  # too old a glibc
    True
    >>> huge_pages_default({}, mode="never", glibc=(2, 36)) is None    # THP off
    True
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import psutil

_KNOB = "glibc.malloc.hugetlb"
TUNABLE = f"{_KNOB}=1"
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)
_set_here = False  # huge_pages_default() set it in os.environ: this process started without


def thp_mode(path: Path = THP_ENABLED) -> str | None:
    """The kernel's THP mode for anonymous memory ("always", "madvise" or "never": the word
    in brackets), None where there is none (not Linux, no THP).

        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        ...     _ = f.write("always [madvise] never\\n"); f.flush()
        ...     thp_mode(Path(f.name))
        'madvise'
    """
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def glibc_version() -> tuple[int, int] | None:
    """This process's glibc (major, minor), None under another C library."""
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        return None
    parts = name.split()
    if len(parts) != 2 or parts[0] != "glibc":
        return None
    try:
        major, minor = (int(x) for x in parts[1].split(".")[:2])
    except ValueError:
        return None
    return major, minor


def _tunables(environ: Mapping[str, str]) -> list[str]:
    return [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]


def huge_pages_default(environ: MutableMapping[str, str] | None = None, *,
                       mode: str | None = None,
                       glibc: tuple[int, int] | None = None) -> str | None:
    """Add `TUNABLE` to `environ`'s GLIBC_TUNABLES (the process's by default) where it does
    something: glibc 2.35 or later, THP in "madvise" mode ("always" gives anonymous memory
    huge pages anyway) and no `glibc.malloc.hugetlb` of the user's. Returns the new value,
    None when nothing was set."""
    env = os.environ if environ is None else environ
    mode = thp_mode() if mode is None else mode
    glibc = glibc_version() if glibc is None else glibc
    tunables = _tunables(env)
    if (mode != "madvise" or glibc is None or glibc < MIN_GLIBC
            or any(t.split("=")[0] == _KNOB for t in tunables)):
        return None
    env["GLIBC_TUNABLES"] = ":".join([*tunables, TUNABLE])
    if environ is None:
        global _set_here
        _set_here = True
    return env["GLIBC_TUNABLES"]


def active(environ: Mapping[str, str] | None = None, *, mode: str | None = None,
           set_here: bool | None = None) -> bool:
    """Whether this process's large allocations land on huge pages: THP "always", or
    "madvise" with `TUNABLE` in the environment this process started with (not one that
    `huge_pages_default` added after it started).

        >>> active({}, mode="always", set_here=False)
        True
        >>> active({"GLIBC_TUNABLES": TUNABLE}, mode="madvise", set_here=False)
        True
        >>> active({"GLIBC_TUNABLES": TUNABLE}, mode="madvise", set_here=True)  # set too late
        False
        >>> active({}, mode="madvise", set_here=False), active({}, mode=None, set_here=False)
        (False, False)
    """
    env = os.environ if environ is None else environ
    mode = thp_mode() if mode is None else mode
    set_here = _set_here if set_here is None else set_here
    if mode == "always":
        return True
    return mode == "madvise" and not set_here and TUNABLE in _tunables(env)


def weights_in_ram(model_path: Path, gpu_layers: int, *, huge_pages: bool | None = None,
                   available: int | None = None) -> bool:
    """The auto load mode's answer: read `model_path` into RAM (llama.cpp's load mode "none")
    rather than map it. True only when this process allocates on huge pages, no layer goes
    to a GPU (`gpu_layers` 0) and the file is at most half of `available` memory."""
    huge_pages = active() if huge_pages is None else huge_pages
    if not huge_pages or gpu_layers != 0:
        return False
    try:
        size = model_path.stat().st_size
    except OSError:
        return False  # the loader says what is wrong with the path
    available = psutil.virtual_memory().available if available is None else available
    return 2 * size <= available


def without_ours(env: dict[str, str]) -> dict[str, str]:
    """`env` without the tunable `huge_pages_default` set in this process, for programs that
    should run at their own defaults (llama.cpp's tools, in the benchmarks)."""
    if _set_here and TUNABLE in _tunables(env):
        rest = [t for t in _tunables(env) if t != TUNABLE]
        if rest:
            env["GLIBC_TUNABLES"] = ":".join(rest)
        else:
            del env["GLIBC_TUNABLES"]
    return env


def restart_as_engine_process() -> None:
    """Run this program again in the environment an engine process starts with, when
    `huge_pages_default` (called here if it was not yet) had to add the tunable after it
    started: `outrider run`, or a benchmark, that runs its engine in its own process as the
    app's engine processes run. Returns only when nothing changes (the tunable was there
    from the start, or does nothing here)."""
    huge_pages_default()
    if _set_here:
        sys.stdout.flush()
        sys.stderr.flush()
        # As it was started (`-m module`, a script, a console script), with the same options.
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])

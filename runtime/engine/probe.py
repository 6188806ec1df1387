"""A first load in a child process, so a llama.cpp abort costs a child and not the engine.

    probe = LoadProbe()                    # verdicts in <user cache>/load-verdicts.json
    probe(path, params)                    # new file: a child loads it and decodes one token
    probe(path, params)                    # known good: returns at once, no child
    probe(bad, params)                     # LoadCrashed: llama.cpp crashed while loading
                                           #   bad.gguf: llama-graph.cpp:1061: GGML_ASSERT(…) failed

llama.cpp answers many bad files with a log line and NULL, but some with `GGML_ASSERT`, which
calls `abort()`: the process dies, and with it the server, the app's engine and the user's
chat. A preflight (`runtime.gguf.preflight`) refuses what is known to abort; this catches the
rest. The first load of a file not yet known runs in a child (`python -m
runtime.engine.probe`) with the same model and context parameters, and decodes one token —
half of the aborts seen came at the first decode, not the load. The child reports on stdout
and exits; if it dies instead, its stderr holds ggml's "file:line: GGML_ASSERT(x) failed".
The verdict is remembered per file (`runtime.gguf.verdicts`), so the cost is paid once:
a known-good file loads directly, a known-bad one is refused without a child.

What the child costs: a Python start with llama_cpp imported (most of it: numpy and the
library) and one llama.cpp load of the file, read from the page cache the second time, when
the engine loads it for real. Measured on a 2-core machine: 0.3–0.8 s for the tiny test
models idle, 1.1–2.3 s under a load average of 6; 2.2–2.7 s for SmolLM2-135M Q4_1 (98 MB)
under that load, whose own load takes 0.95 s. A known file costs a hash of its first MiB
(about 1 ms). The child's context is capped at `PROBE_CTX` tokens: clearing the KV cache of
a long context takes seconds, and no assertion we know of depends on the context's length.

A refusal the child reports (a typed error, not a crash) is raised in the parent with its
own type and message and not remembered: it may depend on the settings (a K/V cache type),
and the engine would give the same error loading it itself. A child that dies before it has
imported llama.cpp (a broken install, a bundle without the probe flag) says nothing about the
file: the load goes ahead unprobed, with a warning in the log, and nothing is remembered.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from runtime import errors
from runtime.errors import LoadError, OutriderError, shown
from runtime.gguf.verdicts import LoadVerdict, VerdictStore, crashed
from runtime.llama.binding import Batch, LlamaContext, LlamaModel
from runtime.llama.params import LlamaParams

PROBE_CTX = 2048
PROBE_TIMEOUT_S = 600.0
PROBE_FLAG = "--load-probe"  # the frozen app's way to be the child (packaging/entry.py)
_REPORT = "outrider-probe:"

logger = logging.getLogger("outrider.engine")

# ggml_abort: "/src/llama.cpp/ggml/src/ggml.c:1234: GGML_ASSERT(a == b) failed",
# ".../ggml-cpu/binary-ops.cpp:135: binary_op: unsupported types: dst: f32, src0: f32, src1: i32"
_ABORT = re.compile(r"(?P<file>[^\s:]+\.(?:c|cc|cpp|cu|h|hpp|m|mm|metal)):(?P<line>\d+): "
                    r"(?P<what>.+)$")
# libstdc++: "terminate called after throwing an instance of 'std::out_of_range'", "  what():  …"
_WHAT = re.compile(r"what\(\):\s*(?P<what>.+)$")


class LoadProbe:
    """Loads each new file once in a child process before the engine loads it itself.

    Attributes:
        store: where verdicts are kept (the user cache unless given).
        children: how many child processes this probe started (tests count them).
    """

    def __init__(self, store: VerdictStore | None = None, timeout_s: float = PROBE_TIMEOUT_S,
                 command: list[str] | None = None) -> None:
        self.store = store if store is not None else VerdictStore()
        self.timeout_s = timeout_s
        self.command = command if command is not None else child_command()
        self.children = 0

    def __call__(self, path: Path, params: LlamaParams) -> None:
        """Return when `path` is known, or found, to load and decode; raise otherwise."""
        verdict = self.store.get(path)
        if verdict is not None:
            if not verdict.ok:
                raise crashed(path, verdict.reason)
            return
        verdict = self._run_child(path, params)
        if verdict is None:
            return  # the probe itself could not run: load as before there was one
        try:
            self.store.put(path, verdict)
        except OSError as exc:  # a full or read-only cache costs a probe next time, no more
            logger.warning("could not remember the load verdict of %s: %s", path.name, exc)
        if not verdict.ok:
            raise crashed(path, verdict.reason)

    def _run_child(self, path: Path, params: LlamaParams) -> LoadVerdict | None:
        """The child's verdict; None when the child never got as far as llama.cpp (it could
        not start or import), which says nothing about the file."""
        request = {"path": str(path), "params": _probe_params(params)}
        env = dict(os.environ, GGML_NO_BACKTRACE="1")  # no gdb attach on abort: seconds saved
        self.children += 1
        try:
            done = subprocess.run(self.command, input=json.dumps(request), capture_output=True,
                                  text=True, errors="replace", env=env, timeout=self.timeout_s,
                                  cwd=Path(__file__).parents[2])
        except subprocess.TimeoutExpired:
            raise LoadError(f"llama.cpp did not finish loading {shown(path.name)} within "
                            f"{self.timeout_s:.0f} s") from None
        except OSError as exc:
            logger.warning("the load probe could not start (%s); loading %s unprobed",
                           exc, path.name)
            return None
        reports = _reports(done.stdout)
        if not any(r.get("started") for r in reports):
            logger.warning("the load probe failed before loading %s (exit %s): %s", path.name,
                           done.returncode, done.stderr.strip()[-500:])
            return None
        outcome = next((r for r in reports if "ok" in r), None)
        if outcome is not None and outcome["ok"]:
            return LoadVerdict(ok=True)
        if outcome is not None:
            raise _refusal(outcome)
        return LoadVerdict(ok=False, reason=crash_reason(done.stderr, done.returncode))


def child_command() -> list[str]:
    """How to start the child: this Python, or the frozen app with its probe flag
    (packaging/entry.py; a bundle has no `python -m`)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, PROBE_FLAG]
    return [sys.executable, "-m", "runtime.engine.probe"]


def crash_reason(stderr: str, returncode: int) -> str:
    """One line saying how the child died: ggml's assertion, C++'s exception, or the signal.

    >>> crash_reason("/b/ggml/src/ggml.c:1917: GGML_ASSERT(n_dims <= ne0) failed\\n", -6)
    'ggml.c:1917: GGML_ASSERT(n_dims <= ne0) failed'
    """
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:  # ggml_abort: GGML_ASSERT, and messages like "binary_op: unsupported types"
        match = _ABORT.search(line)
        if match:
            return f"{Path(match['file']).name}:{match['line']}: {match['what']}"
    for line in lines:
        match = _WHAT.search(line)
        if match:
            return match["what"]
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        tail = f" ({lines[-1]})" if lines else ""
        return f"the process was killed by {name}{tail}"
    return lines[-1] if lines else f"the process exited with status {returncode}"


def _probe_params(params: LlamaParams) -> dict[str, Any]:
    small = dataclasses.replace(params, n_ctx=min(params.n_ctx, PROBE_CTX) or PROBE_CTX,
                                notes=())
    if params.workers:  # the file is probed here: sending its weights to workers twice tells
        small = dataclasses.replace(small, workers=(), n_gpu_layers=0)  # nothing more
    return dataclasses.asdict(small)


def _reports(stdout: str) -> list[dict[str, Any]]:
    """The child's report lines: {"started": true} once llama.cpp is imported, then the
    outcome, {"ok": true} or {"ok": false, "kind", "message"}."""
    found = []
    for line in stdout.splitlines():
        if line.startswith(_REPORT):
            try:
                data = json.loads(line[len(_REPORT):])
            except ValueError:
                continue
            if isinstance(data, dict):
                found.append(data)
    return found


def _refusal(report: dict[str, Any]) -> OutriderError:
    """The child's typed error, rebuilt in the parent (LoadError for a type it cannot name)."""
    cls = getattr(errors, str(report.get("kind")), None)
    message = str(report.get("message") or "llama.cpp refused the file")
    if isinstance(cls, type) and issubclass(cls, OutriderError):
        return cls(message)
    return LoadError(message)


# ---- the child --------------------------------------------------------------------------------


def main() -> int:
    """The child: load, make a context, decode one token, and report on stdout. A crash
    reports only that it started."""
    if sys.platform != "win32":
        import resource  # POSIX only: no core file for an abort we expect

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    request = json.loads(sys.stdin.read())
    path = Path(request["path"])
    params = LlamaParams(**{**request["params"], "notes": ()})
    print(_REPORT + json.dumps({"started": True}), flush=True)  # llama_cpp imported: above
    try:
        _load_and_decode(path, params)
    except OutriderError as exc:
        print(_REPORT + json.dumps({"ok": False, "kind": type(exc).__name__,
                                    "message": str(exc)}), flush=True)
        return 0
    print(_REPORT + json.dumps({"ok": True}), flush=True)
    return 0


def _load_and_decode(path: Path, params: LlamaParams) -> None:
    model = LlamaModel.load(path, params)
    try:
        ctx = LlamaContext(model, params)
        try:
            tokens = model.tokenize("Hello", add_special=True)[:1] or [max(model.bos, 0)]
            batch = Batch(1)
            batch.add_tokens(tokens, pos0=0, seq_id=0, logits_last=True)
            rc = ctx.decode(batch)
            if rc < 0:
                raise LoadError(f"llama.cpp could not run {shown(path.name)}'s first token "
                                f"(llama_decode returned {rc})")
        finally:
            ctx.close()
    finally:
        model.close()


if __name__ == "__main__":
    sys.exit(main())

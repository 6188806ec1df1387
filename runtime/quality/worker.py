"""The process that runs `llama_model_quantize` for `runtime.quality.quantize.quantize`.

Started as `python -m runtime.quality.worker` with the job as one JSON object on stdin
(src, dst and the fields of a `QuantPlan`). It answers on stdout, one JSON message a line,
each behind a marker so stray output of native code cannot be mistaken for one:

    @@outrider ["progress", done, total, tensor_name]   one per tensor, from llama.cpp's log
    @@outrider ["error", line]                          llama.cpp's warning and error lines
    @@outrider ["raise", "ImatrixError", message]       a typed error raised here
    @@outrider ["done", rc]                             llama_model_quantize's result (0 = ok)

A subprocess rather than multiprocessing: spawn re-imports the caller's main module, which
breaks any script without a `__main__` guard. Killing it is how a quantization is cancelled;
the parent owns the output file's fate.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

from runtime.errors import OutriderError
from runtime.llama.binding import llama_log
from runtime.llama.quantize import quantize_file
from runtime.quality.imatrix import load_imatrix
from runtime.quality.quantize import MARKER, QuantPlan, plan_from_json

_TENSOR_LINE = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


class _Channel:
    """Marked JSON lines on the real stdout, flushed at once."""

    def __init__(self) -> None:
        self._out = sys.stdout

    def send(self, message: tuple[Any, ...]) -> None:
        self._out.write(MARKER + json.dumps(message) + "\n")
        self._out.flush()


def main() -> int:
    """Quantize as the job on stdin says; report on stdout."""
    conn = _Channel()
    src, dst, plan = plan_from_json(sys.stdin.read())
    try:
        rc = _quantize(src, dst, plan, conn)
    except OutriderError as exc:
        conn.send(("raise", type(exc).__name__, str(exc)))
        rc = 2
    conn.send(("done", rc))
    return 0


def _quantize(src: str, dst: str, plan: QuantPlan, conn: _Channel) -> int:
    def on_line(level: int, line: str) -> None:
        match = _TENSOR_LINE.match(line)
        if match:
            conn.send(("progress", int(match.group(1)), int(match.group(2)), match.group(3)))
        elif level >= logging.WARNING and line.strip():
            conn.send(("error", line.strip()))

    entries = None
    metadata: list[tuple[str, str | int]] = []
    if plan.imatrix is not None:
        matrix = load_imatrix(plan.imatrix)
        entries = matrix.entries
        metadata = _imatrix_provenance(str(plan.imatrix), len(matrix.entries),
                                       matrix.chunk_count)
    with llama_log().listen(on_line):
        return quantize_file(src, dst, plan, imatrix=entries, metadata=metadata)


def _imatrix_provenance(file: str, n_entries: int, n_chunks: int) -> list[tuple[str, str | int]]:
    """The `quantize.imatrix.*` keys llama-quantize records in its output."""
    items: list[tuple[str, str | int]] = [
        ("quantize.imatrix.file", file),
        ("quantize.imatrix.entries_count", n_entries),
    ]
    if n_chunks > 0:
        items.append(("quantize.imatrix.chunks_count", n_chunks))
    return items


if __name__ == "__main__":
    sys.exit(main())

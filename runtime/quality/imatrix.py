"""Importance matrices for quantization: read a `llama-imatrix` file, hand it to llama.cpp.

An importance matrix holds, per weight tensor, the mean squared activation seen by each of
its input columns over a calibration text. Quantizers spend their precision where those
values are large; the very low-bit IQ types refuse to run without one.

Two file formats exist, read here as `tools/quantize/quantize.cpp` reads them:

- GGUF (current): tensors `<name>.in_sum2` (sums of squared activations, F32) and
  `<name>.counts` (F32, one count per expert); the value handed over is sums / count per
  expert, or 1 where an expert saw nothing. Keys `imatrix.datasets`, `imatrix.chunk_count`,
  `imatrix.chunk_size` are required (a file without them is refused, as llama.cpp does).
- legacy `.dat`: int32 n_entries, then per entry int32 name length, name, int32 ncall,
  int32 nval, nval float32 (already means × ncall); optional trailer int32 chunk count,
  int32 length + dataset name. The value handed over is values / ncall.

    matrix = load_imatrix(Path("imatrix.gguf"))
    matrix.entries["blk.0.attn_q.weight"].shape      # (n_embd,)  float32
    quantize_file(src, dst, plan, imatrix=matrix.entries)   # runtime.llama.quantize
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from runtime.errors import ImatrixError


@dataclass(frozen=True)
class ImportanceMatrix:
    """Per tensor, the float32 importance of each input column (× experts, flattened)."""

    entries: dict[str, np.ndarray]
    datasets: tuple[str, ...]
    chunk_count: int
    legacy: bool


def load_imatrix(path: Path) -> ImportanceMatrix:
    """Read an importance matrix file (GGUF or legacy .dat), normalised as llama.cpp does."""
    path = Path(path)
    if not path.is_file():
        raise ImatrixError(f"No importance matrix file at {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _load_gguf(path)
    return _load_legacy(path)


def _load_gguf(path: Path) -> ImportanceMatrix:
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as exc:  # the gguf package raises bare errors on damaged files
        raise ImatrixError(f"{path.name} is not a readable importance matrix: {exc}") from exc
    fields = reader.fields
    missing = [k for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
               if k not in fields]
    if missing:
        raise ImatrixError(f"{path.name} lacks imatrix metadata ({', '.join(missing)}); "
                           "is it an importance matrix from llama-imatrix?")
    datasets = tuple(str(v) for v in fields["imatrix.datasets"].contents())
    chunk_count = int(fields["imatrix.chunk_count"].contents())

    sums: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ImatrixError(f"{path.name}: {tensor.name} must be F32")
        data = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
        if tensor.name.endswith(".in_sum2"):
            sums[tensor.name.removesuffix(".in_sum2")] = data
        elif tensor.name.endswith(".counts"):
            counts[tensor.name.removesuffix(".counts")] = data
    if not sums:
        raise ImatrixError(f"{path.name} holds no importance data")
    entries: dict[str, np.ndarray] = {}
    for name in sorted(set(sums) | set(counts)):
        if name not in sums or name not in counts:
            raise ImatrixError(f"{path.name}: sums and counts do not pair up for {name}")
        entries[name] = normalise(sums[name], counts[name])
    return ImportanceMatrix(entries, datasets, chunk_count, legacy=False)


def normalise(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """sums / count per expert; 1 where an expert saw no tokens (quantize.cpp's rule).

    >>> normalise(np.array([4., 8., 1., 1.], np.float32), np.array([2., 0.], np.float32))
    array([2., 4., 1., 1.], dtype=float32)
    """
    n_expert = counts.size
    if n_expert == 0 or sums.size % n_expert:
        raise ImatrixError(f"{sums.size} sums cannot be split over {n_expert} expert counts")
    per = sums.reshape(n_expert, -1).astype(np.float32)
    rounded = np.rint(counts).astype(np.float32)  # llama.cpp stores counts as lround(...)
    out = np.ones_like(per)
    seen = rounded > 0
    out[seen] = per[seen] / rounded[seen, None]
    return out.reshape(-1)


def _load_legacy(path: Path) -> ImportanceMatrix:
    raw = path.read_bytes()
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(raw):
            raise ImatrixError(f"{path.name} is neither a GGUF nor a complete legacy imatrix")
        (value,) = struct.unpack_from(fmt, raw, pos)
        pos += size
        return value

    n_entries = take("<i")
    if n_entries < 1 or n_entries > 1_000_000:
        raise ImatrixError(f"{path.name} is not an importance matrix file")
    entries: dict[str, np.ndarray] = {}
    for _ in range(n_entries):
        length = take("<i")
        if length < 1 or pos + length > len(raw):
            raise ImatrixError(f"{path.name} is not an importance matrix file")
        name = raw[pos:pos + length].decode("utf-8", errors="replace")
        pos += length
        ncall, nval = take("<i"), take("<i")
        if nval < 1 or pos + 4 * nval > len(raw):
            raise ImatrixError(f"{path.name}: entry {name} is truncated")
        values = np.frombuffer(raw, np.float32, nval, pos).copy()
        pos += 4 * nval
        entries[name] = values / ncall if ncall > 0 else values
    chunk_count = 0
    datasets: tuple[str, ...] = ()
    if pos + 4 <= len(raw):
        chunk_count = take("<i")
        if pos + 4 <= len(raw):
            length = take("<i")
            if length > 0:
                datasets = (raw[pos:pos + length].decode("utf-8", errors="replace"),)
    return ImportanceMatrix(entries, datasets, chunk_count, legacy=True)


def write_imatrix(path: Path, entries: dict[str, np.ndarray], *, counts: float = 1.0,
                  dataset: str = "outrider", chunk_count: int = 1, chunk_size: int = 512) -> Path:
    """Write a GGUF importance matrix as llama-imatrix does (for tests and synthetic ones)."""
    writer = gguf.GGUFWriter(str(path), arch="imatrix")
    writer.add_type("imatrix")
    writer.add_array("imatrix.datasets", [dataset])
    writer.add_uint32("imatrix.chunk_count", chunk_count)
    writer.add_uint32("imatrix.chunk_size", chunk_size)
    for name, values in entries.items():
        writer.add_tensor(f"{name}.in_sum2", np.asarray(values, np.float32) * counts)
        writer.add_tensor(f"{name}.counts", np.array([counts], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

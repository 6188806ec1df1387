"""`outrider bench`: speed and memory of one model on this machine, across load settings.

Each point of the sweep loads the model through the engine (exactly as the app would), runs
one greedy generation from a fixed text, and records what the engine reports: prefill and
decode tokens per second, time to first token, llama.cpp's buffers (weights / KV / compute),
the process's resident memory and, when drafting, the acceptance rate.

The default sweep varies one thing at a time around a baseline (the first value of each
dimension), so five dimensions of three values cost 11 loads rather than 243:

    >>> points = sweep_points(SweepSpec(kv=(("f16", "f16"), ("q8_0", "q8_0")), contexts=(2048, 8192)))
    >>> [(p.type_k, p.n_ctx) for p in points]
    [('f16', 2048), ('q8_0', 2048), ('f16', 8192)]

`grid="full"` takes the Cartesian product instead. Results are saved as CSV and JSON under
`user_dirs().data / "bench"` so the app can show them later.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from runtime.engine.api import EngineAPI
from runtime.errors import OutriderError, SettingsError
from runtime.events import ErrorEvent, Finished, GenerationRequest, SamplingParams, StepStats
from runtime.settings.load import DraftKind, DraftSettings, LoadSettings
from runtime.speculative.stats import acceptance_rate


@dataclass(frozen=True)
class BenchPoint:
    type_k: str = "f16"
    type_v: str = "f16"
    n_ctx: int = 2048
    gpu_layers: int | None = None  # None = the engine's automatic choice
    n_threads: int | None = None  # None = the engine's default
    draft: DraftKind = "none"


@dataclass(frozen=True)
class SweepSpec:
    """The values to try per dimension; the first of each is the baseline."""

    kv: tuple[tuple[str, str], ...] = (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"))
    contexts: tuple[int, ...] = (2048,)
    gpu_layers: tuple[int | None, ...] = (None,)
    threads: tuple[int | None, ...] = (None,)
    drafts: tuple[DraftKind, ...] = ("none",)
    grid: Literal["one-at-a-time", "full"] = "one-at-a-time"

    def __post_init__(self) -> None:
        for name in ("kv", "contexts", "gpu_layers", "threads", "drafts"):
            if not getattr(self, name):
                raise SettingsError(f"the sweep needs at least one value for {name}")


def sweep_points(spec: SweepSpec) -> list[BenchPoint]:
    """The configurations to measure, baseline first, without duplicates."""
    dims: list[tuple[str, Sequence[Any]]] = [
        ("kv", spec.kv), ("n_ctx", spec.contexts), ("gpu_layers", spec.gpu_layers),
        ("n_threads", spec.threads), ("draft", spec.drafts)]
    base = {name: values[0] for name, values in dims}
    combos: list[dict[str, Any]] = []
    if spec.grid == "full":
        for values in itertools.product(*(v for _, v in dims)):
            combos.append(dict(zip((n for n, _ in dims), values, strict=True)))
    else:
        combos.append(dict(base))
        for name, options in dims:
            for value in options[1:]:
                combos.append({**base, name: value})
    points: list[BenchPoint] = []
    for chosen in combos:
        kv = chosen.pop("kv")
        point = BenchPoint(type_k=kv[0], type_v=kv[1], **chosen)
        if point not in points:
            points.append(point)
    return points


@dataclass(frozen=True)
class BenchRow:
    """One measured point. Speeds in tokens/s, memory in bytes; error set when it failed."""

    type_k: str
    type_v: str
    n_ctx: int
    gpu_layers: str
    n_threads: str
    draft: str
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    ttft_s: float = 0.0
    weights_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    rss_bytes: int = 0
    acceptance_rate: float | None = None
    notes: str = ""
    error: str = ""


def _kind_totals(allocated: dict[str, int]) -> tuple[int, int, int]:
    """llama.cpp's buffers ("CPU model", "CUDA0 KV", "CPU compute") summed by kind."""
    totals = {"model": 0, "kv": 0, "compute": 0}
    for key, n in allocated.items():
        kind = key.rsplit(" ", 1)[-1].lower()
        if kind in totals:
            totals[kind] += n
    return totals["model"], totals["kv"], totals["compute"]


def _rss() -> int:
    try:
        return int(psutil.Process(os.getpid()).memory_info().rss)
    except (psutil.Error, OSError):  # the platform refuses: memory is optional here
        return 0


def measure_point(engine: EngineAPI, model: Path, point: BenchPoint, prompt: str,
                  n_gen: int, draft_model: Path | None = None) -> BenchRow:
    """Load `model` with `point`'s settings, generate once, report what happened."""
    row = BenchRow(point.type_k, point.type_v, point.n_ctx,
                   "auto" if point.gpu_layers is None else str(point.gpu_layers),
                   "default" if point.n_threads is None else str(point.n_threads), point.draft)
    try:
        draft = DraftSettings(kind=point.draft,
                              model_path=draft_model if point.draft == "model" else None)
        settings = LoadSettings(model_path=model, n_ctx=point.n_ctx, gpu_layers=point.gpu_layers,
                                type_k=point.type_k, type_v=point.type_v,
                                n_threads=point.n_threads, n_threads_batch=point.n_threads,
                                draft=draft)
        loaded = engine.load(settings)
        # One tiny request first, so graph allocation and cold caches are not measured; its
        # prompt shares no prefix with the measured one (prefix reuse would inflate prefill).
        for _ in engine.submit(GenerationRequest(
                prompt="Warm-up.", sampling=SamplingParams(temperature=0.0, max_tokens=2))).events():
            pass
        handle = engine.submit(GenerationRequest(
            prompt=prompt, sampling=SamplingParams(temperature=0.0, max_tokens=n_gen, seed=0)))
        finished: Finished | None = None
        accepted = drafted = 0
        for event in handle.events():
            if isinstance(event, ErrorEvent):
                return dataclasses.replace(row, error=event.message)
            if isinstance(event, StepStats):
                accepted, drafted = accepted + event.accepted, drafted + event.drafted
            if isinstance(event, Finished):
                finished = event
    except OutriderError as exc:
        return dataclasses.replace(row, error=str(exc))
    if finished is None:
        return dataclasses.replace(row, error="the generation ended without a result")
    weights, kv, compute = _kind_totals(loaded.allocated)
    notes = list(loaded.notes)
    if point.draft != "none" and loaded.draft is None:
        notes.append(f"drafting {point.draft} not used" + (
            f": {loaded.draft_refused}" if loaded.draft_refused else ""))
    return dataclasses.replace(
        row, prompt_tokens=finished.usage.prompt_tokens,
        generated_tokens=finished.usage.completion_tokens,
        prefill_tok_s=finished.timings.prefill_tokens_per_s,
        decode_tok_s=finished.timings.decode_tokens_per_s, ttft_s=finished.timings.ttft_s,
        weights_bytes=weights, kv_bytes=kv, compute_bytes=compute, rss_bytes=_rss(),
        acceptance_rate=acceptance_rate(accepted, drafted) if drafted else None, notes="; ".join(notes))


def run_sweep(make_engine: Callable[[], EngineAPI], model: Path, points: Sequence[BenchPoint],
              prompt: str, n_gen: int = 64, draft_model: Path | None = None,
              on_row: Callable[[BenchRow], None] | None = None) -> list[BenchRow]:
    """Measure every point with one engine (each point is a fresh load). `make_engine` is
    `runtime.engine.build.build_engine` for `outrider bench`, so the sweep loads as the app
    does (drafting, automatic GPU layers); tests pass a fake."""
    engine = make_engine()
    engine.start()
    rows: list[BenchRow] = []
    try:
        for point in points:
            row = measure_point(engine, model, point, prompt, n_gen, draft_model)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    finally:
        engine.stop()
    return rows


MIB = 1 << 20
COLUMNS = ("K", "V", "ctx", "gpu", "threads", "draft", "prefill t/s", "decode t/s",
           "TTFT s", "weights MiB", "KV MiB", "compute MiB", "RSS MiB", "accept", "notes")


def format_row(row: BenchRow) -> list[str]:
    if row.error:
        return [row.type_k, row.type_v, str(row.n_ctx), row.gpu_layers, row.n_threads,
                row.draft, "error: " + row.error, "", "", "", "", "", "", "", ""]
    return [row.type_k, row.type_v, str(row.n_ctx), row.gpu_layers, row.n_threads, row.draft,
            f"{row.prefill_tok_s:.1f}", f"{row.decode_tok_s:.1f}", f"{row.ttft_s:.3f}",
            f"{row.weights_bytes / MIB:.1f}", f"{row.kv_bytes / MIB:.1f}",
            f"{row.compute_bytes / MIB:.1f}", f"{row.rss_bytes / MIB:.0f}",
            "" if row.acceptance_rate is None else f"{row.acceptance_rate:.2f}", row.notes]


def format_table(rows: Sequence[BenchRow]) -> str:
    """A Markdown table of the rows."""
    body = [format_row(r) for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
              for i, c in enumerate(COLUMNS)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) + " |"
              for b in body]
    return "\n".join(lines)


def save_results(rows: Sequence[BenchRow], model: Path, folder: Path,
                 extra: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write `<model>-<time>.csv` and `.json` into `folder`; return both paths."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{model.name.removesuffix('.gguf')}-{time.strftime('%Y%m%d-%H%M%S')}"
    csv_path, json_path = folder / f"{stem}.csv", folder / f"{stem}.json"
    fields = [f.name for f in dataclasses.fields(BenchRow)]
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(dataclasses.asdict(row))
    meta = {"model": str(model), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": platform.machine(), "system": platform.platform(),
            "cpu_count": os.cpu_count(), **(extra or {})}
    json_path.write_text(json.dumps({"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]},
                                    indent=2), encoding="utf-8")
    return csv_path, json_path

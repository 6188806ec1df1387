"""`outrider bench`'s sweep: which settings it measures, what it records, what it saves —
against a fake engine that reports fixed timings (speed itself belongs in benchmarks/)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.engine.api import LoadedModel
from runtime.errors import LoadError, SettingsError
from runtime.events import (
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    StepStats,
    Timings,
    TokenEvent,
    Usage,
)
from runtime.quality.bench import (
    BenchPoint,
    SweepSpec,
    format_table,
    run_sweep,
    save_results,
    sweep_points,
)
from runtime.settings.load import LoadSettings


def test_one_at_a_time_varies_each_dimension_around_the_baseline() -> None:
    spec = SweepSpec(kv=(("f16", "f16"), ("q8_0", "q4_0")), contexts=(512, 4096),
                     threads=(None, 2), drafts=("none", "ngram"))
    points = sweep_points(spec)
    assert points == [
        BenchPoint("f16", "f16", 512, None, None, "none"),
        BenchPoint("q8_0", "q4_0", 512, None, None, "none"),
        BenchPoint("f16", "f16", 4096, None, None, "none"),
        BenchPoint("f16", "f16", 512, None, 2, "none"),
        BenchPoint("f16", "f16", 512, None, None, "ngram"),
    ]


def test_full_grid_is_the_product() -> None:
    spec = SweepSpec(kv=(("f16", "f16"), ("q8_0", "q8_0")), contexts=(512, 1024),
                     gpu_layers=(0, 99), grid="full")
    points = sweep_points(spec)
    assert len(points) == 8 and len(set(points)) == 8


def test_an_empty_dimension_is_refused() -> None:
    with pytest.raises(SettingsError, match="contexts"):
        SweepSpec(contexts=())


class FakeHandle:
    def __init__(self, events: list[Event]) -> None:
        self.id = "req-1"
        self._events = events

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        yield from self._events

    def get(self, timeout: float | None = None) -> Event | None:
        return self._events.pop(0) if self._events else None

    def cancel(self) -> None:
        pass


class FakeEngine:
    """Decodes at 100 tok/s with f16 K and 80 with anything else; refuses q4_0 V."""

    def __init__(self) -> None:
        self.loads: list[LoadSettings] = []
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def load(self, settings: LoadSettings, on_progress: Any = None) -> LoadedModel:
        if settings.type_v == "q4_0":
            raise LoadError("this backend has no q4_0 V cache")
        self.loads.append(settings)
        self._settings = settings
        return LoadedModel(
            path=settings.model_path, name="m", architecture="llama", n_params=1, size_bytes=1,
            quant="Q8_0", n_ctx=settings.n_ctx, n_ctx_train=8192, n_vocab=10, settings=settings,
            chat_template_source="model", flash_attn=False,
            allocated={"CPU model": 100 << 20, "CPU KV": settings.n_ctx * 1024,
                       "CPU compute": 5 << 20},
            draft="ngram" if settings.draft.kind == "ngram" else None)

    def submit(self, request: GenerationRequest) -> FakeHandle:
        decode = 100.0 if self._settings.type_k == "f16" else 80.0
        events: list[Event] = [TokenEvent("req-1", 0, 5, "x")]
        if self._settings.draft.kind == "ngram":
            events.append(StepStats("req-1", 0, drafted=4, accepted=3, reply_drafted=4,
                                    reply_accepted=3, k=4, acceptance_rate=0.75,
                                    mean_accepted_length=4, predicted_speedup=2,
                                    measured_speedup=2))
        events.append(Finished("req-1", 0, "length", Usage(120, 16),
                               Timings(0.2, 600.0, decode, 0.4)))
        return FakeHandle(events)

    def unload(self) -> None:
        pass


def test_sweep_records_what_the_engine_reports(tmp_path: Path) -> None:
    engine = FakeEngine()
    points = sweep_points(SweepSpec(kv=(("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0")),
                                    contexts=(1024, 2048), drafts=("none", "ngram")))
    rows = run_sweep(lambda: engine, tmp_path / "m.gguf", points, "prompt", n_gen=16)
    assert engine.started and engine.stopped
    by = {(r.type_k, r.type_v, r.n_ctx, r.draft): r for r in rows}
    base = by["f16", "f16", 1024, "none"]
    assert (base.prefill_tok_s, base.decode_tok_s, base.ttft_s) == (600.0, 100.0, 0.2)
    assert (base.prompt_tokens, base.generated_tokens) == (120, 16)
    assert (base.weights_bytes, base.kv_bytes, base.compute_bytes) == (100 << 20, 1 << 20, 5 << 20)
    assert by["q8_0", "q8_0", 1024, "none"].decode_tok_s == 80.0
    assert by["f16", "f16", 2048, "none"].kv_bytes == 2 << 20
    assert by["f16", "f16", 1024, "ngram"].acceptance_rate == 0.75
    refused = by["q8_0", "q4_0", 1024, "none"]
    assert refused.error == "this backend has no q4_0 V cache" and refused.decode_tok_s == 0.0
    assert [s.draft.kind for s in engine.loads].count("ngram") == 1


def test_a_request_error_is_a_row_error(tmp_path: Path) -> None:
    class Failing(FakeEngine):
        def submit(self, request: GenerationRequest) -> FakeHandle:
            return FakeHandle([ErrorEvent("req-1", "ContextOverflow", "prompt too long")])

    rows = run_sweep(Failing, tmp_path / "m.gguf", [BenchPoint()], "p")
    assert rows[0].error == "prompt too long"


def test_results_are_saved_as_csv_and_json(tmp_path: Path) -> None:
    rows = run_sweep(FakeEngine, tmp_path / "m.gguf", sweep_points(SweepSpec()), "p")
    csv_path, json_path = save_results(rows, Path("m.Q4_0.gguf"), tmp_path / "bench",
                                       {"gen_tokens": 16})
    assert csv_path.name.startswith("m.Q4_0-") and csv_path.suffix == ".csv"
    with csv_path.open() as f:
        table = list(csv.DictReader(f))
    assert [r["type_k"] for r in table] == ["f16", "q8_0", "q4_0"]
    assert table[2]["error"]  # q4_0 V refused by the fake
    data = json.loads(json_path.read_text())
    assert data["meta"]["gen_tokens"] == 16 and len(data["rows"]) == 3
    text = format_table(rows)
    assert text.splitlines()[0].startswith("| K ") and "error:" in text

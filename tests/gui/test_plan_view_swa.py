"""The Settings page's memory plan says what sliding-window layers keep."""

from __future__ import annotations

from pathlib import Path

from app.settings.plan_view import PlanView, sliding_window_text
from runtime.gguf.info import read_model_info
from runtime.planner.devices import Device
from runtime.planner.plan import plan_memory
from runtime.settings.load import DraftSettings, LoadSettings
from tests.conftest import tiny_model_path
from tests.fixtures.tiny_gguf import SWA_TARGET

CPU = [Device("cpu", "test CPU", "cpu", 64 << 30, 64 << 30)]


def test_the_plan_notes_say_how_many_layers_keep_a_window(qtbot) -> None:
    path = tiny_model_path(SWA_TARGET)
    info = read_model_info(path)
    plan = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096), CPU)
    # window 32 · 1 slot + micro-batch 512, padded to 256
    assert sliding_window_text(plan) == "sliding window: 5 of 6 layers keep 768 tokens"
    view = PlanView()
    qtbot.addWidget(view)
    view.show_plan(plan)
    assert "sliding window: 5 of 6 layers keep 768 tokens" in view.notes.text()
    drafting = plan_memory(info, LoadSettings(model_path=path, n_ctx=4096,
                                              draft=DraftSettings(kind="ngram")), CPU)
    assert sliding_window_text(drafting) == sliding_window_text(plan)  # drafting: the same


def test_no_window_no_line(tiny_target: Path) -> None:
    plan = plan_memory(read_model_info(tiny_target), LoadSettings(model_path=tiny_target), CPU)
    assert sliding_window_text(plan) == ""

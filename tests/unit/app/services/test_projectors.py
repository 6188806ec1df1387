"""The model picker's plan (`app.services.projectors.plan_model`) counts what the engine's plan
of the same load counts (`runtime.planner.gpu_layers`): the draft model the settings name, as
well as the target; prompt lookup adds no weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.services.projectors import plan_model
from runtime.gguf.info import read_model_info
from runtime.planner.devices import Device
from runtime.planner.gpu_layers import plan_load
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.units import GIB

CPU = [Device("cpu", "test CPU", "cpu", 64 * GIB, 48 * GIB)]


def test_the_plan_grows_by_the_draft_models_weights(tiny_target: Path, tiny_draft: Path) -> None:
    alone = LoadSettings(model_path=tiny_target)
    drafted = dataclasses.replace(alone, draft=DraftSettings(kind="model", model_path=tiny_draft))
    without, with_draft = plan_model(alone, CPU), plan_model(drafted, CPU)
    draft_weights = read_model_info(tiny_draft).tensor_bytes
    assert draft_weights > 0
    assert with_draft["weights"] - without["weights"] == draft_weights
    # Its cache and compute buffer come with it.
    assert with_draft["total"] - without["total"] > draft_weights
    # The same figures as the engine's plan of the load.
    engine_plan = plan_load(drafted, CPU)
    assert engine_plan is not None
    assert (with_draft["weights"], with_draft["total"]) == (engine_plan.weights, engine_plan.total)


def test_prompt_lookup_adds_no_weights(tiny_target: Path) -> None:
    alone = LoadSettings(model_path=tiny_target)
    ngram = dataclasses.replace(alone, draft=DraftSettings(kind="ngram"))
    assert plan_model(ngram, CPU)["weights"] == plan_model(alone, CPU)["weights"]

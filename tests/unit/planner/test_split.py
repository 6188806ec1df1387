"""Several GPUs: the layer split by `tensor_split` (as llama.cpp's load_tensors cuts it), the
whole model on `main_gpu`, and one-line errors for splits and GPUs that do not exist."""

from __future__ import annotations

import pytest

from runtime.errors import SettingsError
from runtime.llama.params import SPLIT_MODE_LAYER, SPLIT_MODE_NONE, to_llama_params
from runtime.planner.plan import plan_memory
from tests.unit.planner.test_planner import LLAMA2_70B, PATH, cpu, cuda, settings

LAYER = 500 * 10**6  # LLAMA2_70B's bytes per block


def by_id(plan: object) -> dict[str, object]:
    return {d.id: d for d in plan.devices}  # type: ignore[attr-defined]


def test_a_3_to_1_split_cuts_the_layers_as_llama_cpp_does() -> None:
    # 81 layers (80 blocks + output) from layer 0: layer i goes to GPU 0 while i/81 < 0.75.
    plan = plan_memory(LLAMA2_70B, settings(gpu_layers=81, tensor_split=(3, 1), n_ctx=4096),
                       [cuda(0, 80), cuda(1, 80), cpu(64)])
    gpu0, gpu1 = by_id(plan)["cuda:0"], by_id(plan)["cuda:1"]
    assert gpu0.weights == 61 * LAYER  # type: ignore[attr-defined]
    assert gpu1.weights == 19 * LAYER + 140 * 10**6  # type: ignore[attr-defined]  # + output
    per_layer_kv = 8 * (128 * 2 + 128 * 2) * 4096
    assert (gpu0.kv, gpu1.kv) == (61 * per_layer_kv, 19 * per_layer_kv)  # type: ignore[attr-defined]
    assert gpu0.compute and gpu1.compute  # type: ignore[attr-defined]


def test_without_a_split_the_layers_follow_free_memory() -> None:
    even = plan_memory(LLAMA2_70B, settings(gpu_layers=81), [cuda(0, 40), cuda(1, 40), cpu(64)])
    assert by_id(even)["cuda:0"].weights == 41 * LAYER  # type: ignore[attr-defined]
    lopsided = plan_memory(LLAMA2_70B, settings(gpu_layers=81),
                           [cuda(0, 60), cuda(1, 20), cpu(64)])
    assert by_id(lopsided)["cuda:0"].weights == 61 * LAYER  # type: ignore[attr-defined]


def test_a_split_naming_fewer_gpus_gives_the_rest_nothing() -> None:
    plan = plan_memory(LLAMA2_70B, settings(gpu_layers=81, tensor_split=(1,)),
                       [cuda(0, 80), cuda(1, 80), cpu(64)])
    assert by_id(plan)["cuda:1"].total == 0  # type: ignore[attr-defined]


def test_main_gpu_takes_the_whole_model_alone() -> None:
    plan = plan_memory(LLAMA2_70B, settings(gpu_layers=81, main_gpu=1),
                       [cuda(0, 80), cuda(1, 80), cpu(64)])
    assert by_id(plan)["cuda:0"].total == 0  # type: ignore[attr-defined]
    assert by_id(plan)["cuda:1"].weights == 80 * LAYER + 140 * 10**6  # type: ignore[attr-defined]
    assert plan.verdict == "full_gpu"


@pytest.mark.parametrize(("kw", "devices", "message"), [
    ({"tensor_split": (1, 1, 1)}, [cuda(0, 80), cuda(1, 80), cpu(64)],
     "the tensor split names 3 GPUs, but this machine has 2 GPUs"),
    ({"tensor_split": (1, 1)}, [cpu(64)], "the tensor split names 2 GPUs, but this machine has no GPU"),
    ({"main_gpu": 2}, [cuda(0, 80), cuda(1, 80), cpu(64)],
     "main GPU 2 does not exist: this machine has GPUs 0 to 1"),
    ({"main_gpu": 1}, [cuda(0, 80), cpu(64)], "main GPU 1 does not exist: this machine has GPU 0"),
])
def test_gpus_that_do_not_exist_are_one_line_errors(kw: dict[str, object], devices: list[object],
                                                    message: str) -> None:
    with pytest.raises(SettingsError, match=f"^{message}$"):
        plan_memory(LLAMA2_70B, settings(**kw), devices)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "message"), [
    ({"tensor_split": (1, -1)}, "tensor split shares must be numbers 0 or more, not 1, -1"),
    ({"tensor_split": (0, 0.0)}, "a tensor split must give at least one GPU a share above 0"),
    ({"tensor_split": ()}, "a tensor split needs one share per GPU, e.g. 3,1"),
    ({"tensor_split": (3, 1), "main_gpu": 0}, "give either a tensor split over several GPUs or "
                                               "one main GPU for the whole model, not both"),
    ({"main_gpu": -1}, "main GPU must be a GPU index 0 or more, not -1"),
])
def test_bad_splits_are_refused_by_the_settings(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=f"^{message}$"):
        settings(**kw)


def test_the_settings_become_llama_params() -> None:
    split = to_llama_params(settings(tensor_split=(3, 1)), cpu_count=2)
    assert (split.split_mode, split.main_gpu, split.tensor_split) == (SPLIT_MODE_LAYER, 0, (3.0, 1.0))
    alone = to_llama_params(settings(main_gpu=1), cpu_count=2)
    assert (alone.split_mode, alone.main_gpu, alone.tensor_split) == (SPLIT_MODE_NONE, 1, ())
    assert to_llama_params(settings(), cpu_count=2).split_mode == SPLIT_MODE_LAYER


def test_from_dict_reads_a_json_split() -> None:
    from runtime.settings.load import LoadSettings

    loaded = LoadSettings.from_dict({"model_path": str(PATH), "tensor_split": [2, 1]})
    assert loaded.tensor_split == (2, 1)
    assert LoadSettings.from_dict(loaded.to_dict()) == loaded

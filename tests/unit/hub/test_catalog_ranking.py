"""What runs well here comes first: on 2 cores without a GPU the small models lead and Qwen2.5
14B comes last; with a GPU the largest model that fits leads."""

from __future__ import annotations

from runtime.hub.catalog import USABLE_TOK_S, expected_tok_s, load_catalog, machine_bandwidth_gbs

FREE = int(22.59 * (1 << 30))


def test_two_cores_without_a_gpu_put_the_fast_small_models_first() -> None:
    rated = load_catalog().for_machine(FREE, cores=2, gpu=False, role="chat")
    ids = [m.id for m, _ in rated]
    assert ids[-1] == "qwen2.5-14b-instruct"
    assert all(tok_s >= USABLE_TOK_S for _, tok_s in rated[:2])
    first, _ = rated[0]
    assert first.params_b < 3


def test_a_gpu_puts_the_largest_model_that_fits_first() -> None:
    rated = load_catalog().for_machine(FREE, cores=2, gpu=True, role="chat")
    assert rated[0][0].id == "qwen2.5-14b-instruct"


def test_expected_speed_is_bandwidth_over_weight_bytes() -> None:
    model = load_catalog().model("qwen2.5-14b-instruct")
    bandwidth = machine_bandwidth_gbs(cores=2, gpu=False)
    assert bandwidth == 12.0
    assert expected_tok_s(model, bandwidth) == 12.0 / (model.params_b * 4.85 / 8)

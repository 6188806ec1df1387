"""Other machines' devices in the plan: workers first (llama.cpp's order), layers split by
free memory across this machine and the workers when there is no GPU here, each worker's
weights / KV / compute, and the bytes per token crossing each link."""

from __future__ import annotations

from runtime.planner.devices import Device
from runtime.planner.plan import plan_memory
from tests.unit.planner.test_planner import GIB, LLAMA2_70B, SMOLLM2_SHAPE, cpu, cuda, settings

LAYER = 500 * 10**6  # LLAMA2_70B's bytes per block


def worker(port: int, free_gib: float, total_gib: float = 64) -> Device:
    endpoint = f"10.0.0.{port % 250}:{port}"
    return Device(f"rpc:{endpoint}", f"worker {endpoint}", "rpc", int(total_gib * GIB),
                  int(free_gib * GIB))


def test_without_a_gpu_here_the_layers_follow_each_machines_free_memory() -> None:
    # 81 layers; this machine and two workers with 32 GiB free each: a third each.
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096),
                       [worker(1, 32), worker(2, 32), cpu(32)])
    assert plan.gpu_layers == 54  # round(81 * 64 / 96): the workers' two thirds
    weights = {d.id: d.weights for d in plan.devices}
    # Layers 27..80 offloaded (the output layer is 80): 27..53 on worker 1, 54..80 on worker 2.
    assert weights["rpc:10.0.0.1:1"] == 27 * LAYER
    assert weights["rpc:10.0.0.2:2"] == 26 * LAYER + 140 * 10**6  # + the output layer
    assert weights["cpu"] == 27 * LAYER + 140 * 10**6  # + the token embeddings
    assert plan.describe().startswith("Split: 27 of 81 layers here, 54 on 2 workers: ")
    assert plan.verdict == "partial"


def test_a_lopsided_worker_takes_a_bigger_share() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [worker(1, 48), cpu(16)])
    assert plan.gpu_layers == 61  # round(81 * 48 / 64)


def test_a_worker_with_nothing_free_gets_no_layers() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [worker(1, 0), cpu(64)])
    assert plan.gpu_layers == 0
    assert plan.devices[0].total == 0


def test_a_gpu_here_keeps_the_gpu_first_rule() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096), [worker(1, 30), cuda(0, 30), cpu(64)])
    assert plan.gpu_layers == 81  # workers and the GPU take everything that fits
    assert "and this machine's GPUs" in plan.describe()


def test_a_given_gpu_layer_count_and_split_are_kept() -> None:
    plan = plan_memory(LLAMA2_70B, settings(n_ctx=4096, gpu_layers=41, tensor_split=(3, 1)),
                       [worker(1, 40), worker(2, 40), cpu(40)])
    weights = {d.id: d.weights for d in plan.devices}
    assert plan.gpu_layers == 41
    # Layers 40..80 offloaded; layer il goes to worker 1 while (il - 40) / 41 < 3/4.
    assert weights["rpc:10.0.0.1:1"] == 31 * LAYER
    assert weights["rpc:10.0.0.2:2"] == 9 * LAYER + 140 * 10**6


def test_the_links_carry_hidden_states_and_the_logits() -> None:
    # SmolLM2's shape, split here → worker 1 → worker 2: worker 1 receives and returns one
    # hidden state (576 f32), worker 2 receives one and returns the logits (49,152 f32).
    plan = plan_memory(SMOLLM2_SHAPE, settings(n_ctx=2048, gpu_layers=21, tensor_split=(1, 1)),
                       [worker(1, 8), worker(2, 8), cpu(8)])
    links = {link.device: link.bytes_per_token for link in plan.links}
    assert links == {"rpc:10.0.0.1:1": 2 * 576 * 4, "rpc:10.0.0.2:2": 576 * 4 + 49152 * 4}


def test_a_local_plan_has_no_links() -> None:
    assert plan_memory(SMOLLM2_SHAPE, settings(n_ctx=2048), [cuda(0, 8), cpu(8)]).links == ()
    assert plan_memory(SMOLLM2_SHAPE, settings(n_ctx=2048), [cpu(8)]).links == ()


def test_the_plan_json_carries_the_links() -> None:
    plan = plan_memory(SMOLLM2_SHAPE, settings(n_ctx=2048), [worker(1, 8), cpu(8)])
    out = plan.to_dict()
    assert out["links"] == [{"device": "rpc:10.0.0.1:1", "bytes_per_token": 576 * 4 + 49152 * 4}]
    assert out["devices"][0]["kind"] == "rpc"

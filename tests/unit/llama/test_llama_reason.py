"""Which line of llama.cpp's log is the reason for a refusal (`runtime.llama.reason`).

The logs in `refusal_logs.json` are what llama.cpp 0.3.36 really logged refusing mutated
copies of the tiny fixture model (captured through `LlamaLog.capture`; paths shortened), each
with the reason a person should read. `load:no_eps` is the case that was misreported as the
metadata dump line "- kv 22: tokenizer.ggml.unknown_token_id u32 = 0".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.llama.reason import first_reason

CASES = json.loads((Path(__file__).parent / "refusal_logs.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reason_is_llamas_error_not_a_dump_line(name: str) -> None:
    assert first_reason(CASES[name]["log"]) == CASES[name]["reason"]


def test_the_misreported_log_holds_the_decoy_the_old_rule_picked() -> None:
    log = CASES["load:no_eps"]["log"]
    decoy = next(line for line in log.splitlines() if "unknown_token_id" in line)
    assert decoy.startswith("llama_model_loader: - kv ")  # a dump line, skipped
    assert log.index(decoy) < log.index("key not found")


@pytest.mark.parametrize(("log", "reason"), [
    ("", "no reason given"),
    ("llama_model_load_from_file_impl: failed to load model\n", "failed to load model"),
    ("print_info: rope_finetuned        = unknown\nsomething odd happened\n",
     "something odd happened"),
    ("llama_init_from_model: failed to initialize the context: failed to allocate buffer\n",
     "failed to allocate buffer"),
])
def test_without_a_wrapper_the_first_failure_line_then_the_last_line(log: str, reason: str) -> None:
    assert first_reason(log) == reason

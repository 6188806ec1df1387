"""Template families (runtime.chat.families): each family Outrider supports is detected in
llama.cpp's real templates from their text, every one of the 70 is detected without a
crash, and docs/tool_families.md is what benchmarks/template_coverage.py prints."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks.template_coverage import coverage_markdown
from runtime.chat.families import (
    PLAIN,
    TOOL_FAMILIES,
    Family,
    capabilities,
    detect_family,
    wants_object_arguments,
)
from runtime.errors import ChatTemplateError

DOC = Path(__file__).resolve().parents[3] / "docs" / "tool_families.md"

# The family each real template must get. The file name only labels the case: detection
# reads nothing but the text (test_detection_reads_the_text_not_the_name).
EXPECTED = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "Qwen-QwQ-32B": "hermes",
    "Qwen3-Coder": "qwen3_coder",
    "Qwen3.5-4B": "qwen3_coder",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral_nemo",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "unsloth-mistral-Devstral-Small-2507": "mistral",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "deepseek_r1",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek_r1",
    "deepseek-ai-DeepSeek-V3.1": "deepseek_v3_1",
    "openai-gpt-oss-120b": "gpt_oss",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command_r7b",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "ibm-granite-granite-4.0": "hermes",  # Granite 4 writes Hermes' calls
    "ibm-granite-granite-4.1": "hermes",
    "google-gemma-4-31B-it": "gemma4",
    "google-gemma-4-31B-it-interleaved": "gemma4",
    "GLM-4.6": "glm45",
    "GLM-4.7-Flash": "glm45",
    "Kimi-K2-Instruct": "kimi_k2",
    "Kimi-K2-Thinking": "kimi_k2",
    "moonshotai-Kimi-K2": "kimi_k2",
}

# (reasoning, think_start, think_end) where it matters.
REASONING = {
    "Qwen-Qwen3-0.6B": ("think", "<think>", "</think>"),
    "Qwen-Qwen2.5-7B-Instruct": ("none", "<think>", "</think>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("none", "<think>", "</think>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("think", "<think>", "</think>"),
    "openai-gpt-oss-120b": ("harmony", "<|channel|>analysis<|message|>", "<|end|>"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use":
        ("think", "<|START_THINKING|>", "<|END_THINKING|>"),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("think", "[THINK]", "[/THINK]"),
    "google-gemma-4-31B-it": ("think", "<|channel>thought", "<channel|>"),
    "Kimi-K2-Thinking": ("think", "<think>", "</think>"),
    "Kimi-K2-Instruct": ("none", "<think>", "</think>"),
}


def _text(directory: Path, stem: str) -> str:
    return (directory / f"{stem}.jinja").read_text(encoding="utf-8")


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_each_supported_family_is_detected_in_its_real_templates(llama_templates: Path,
                                                                 stem: str) -> None:
    family = detect_family(_text(llama_templates, stem))
    assert family.name == EXPECTED[stem]
    assert family.tools


@pytest.mark.parametrize("stem", sorted(REASONING))
def test_reasoning_markers_come_from_the_template(llama_templates: Path, stem: str) -> None:
    family = detect_family(_text(llama_templates, stem))
    assert (family.reasoning, family.think_start, family.think_end) == REASONING[stem]


def test_every_family_outrider_supports_has_a_real_template() -> None:
    assert set(EXPECTED.values()) == TOOL_FAMILIES


def test_all_70_templates_are_detected_and_the_doc_is_current(llama_templates: Path) -> None:
    paths = sorted(llama_templates.glob("*.jinja"))
    assert len(paths) == 70
    families = {p.stem: detect_family(p.read_text(encoding="utf-8")) for p in paths}
    assert all(isinstance(f, Family) for f in families.values())
    assert sum(f.tools for f in families.values()) >= len(EXPECTED)
    table = coverage_markdown(llama_templates)
    for stem, family in families.items():  # the table's family is the text's family
        assert f"| {stem} | `{family.name}` | {'yes' if family.tools else 'no'} |" in table
    assert table in DOC.read_text(encoding="utf-8"), (
        "docs/tool_families.md is out of date: paste in the output of "
        "`.venv/bin/python benchmarks/template_coverage.py`")


def test_detection_reads_the_text_not_the_name(llama_templates: Path, tmp_path: Path) -> None:
    text = _text(llama_templates, "Qwen3-Coder")
    renamed = tmp_path / "llama-3.1-totally-not-qwen.jinja"
    renamed.write_text(text, encoding="utf-8")
    assert detect_family(renamed.read_text(encoding="utf-8")).name == "qwen3_coder"


def test_no_template_is_plain() -> None:
    assert detect_family(None) == PLAIN
    assert detect_family("") == PLAIN
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
              "{% endfor %}")
    assert detect_family(chatml) == PLAIN


@pytest.mark.parametrize(("snippet", "name"), [
    ("[SYSTEM_PROMPT]…[TOOL_CALLS]…[ARGS]", "mistral"),  # before Nemo's bare [TOOL_CALLS]
    ("[INST]…[TOOL_CALLS]", "mistral_nemo"),
    ("<|start|>assistant<|channel|>…<tool_call>", "gpt_oss"),  # harmony before Hermes
    ("<seed:tool_call><function=x><parameter=k>", "seed_oss"),  # before Qwen3-Coder
    ("<tool_call><function=x><parameter=k>", "qwen3_coder"),
    ("<tool_call>{{ name }}<arg_key>k</arg_key><arg_value>v</arg_value>", "glm45"),
    ("<|start_of_role|>assistant<|end_of_role|><|tool_call|>", "granite"),  # Granite 3.x
    ("<tool_call>\n{{ call | tojson }}\n</tool_call>", "hermes"),
    ("<｜tool▁calls▁begin｜>function<｜tool▁sep｜>x\n```json", "deepseek_r1"),
    ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>x<｜tool▁sep｜>{}", "deepseek_v3_1"),
    ("<|START_ACTION|>[…]<|END_ACTION|>", "command_r7b"),
    ("<|tool_calls_section_begin|><|tool_call_begin|>functions.x:0", "kimi_k2"),
    ("{{ '<|tool_call>call:' + name }}", "gemma4"),
])
def test_precedence_of_markers(snippet: str, name: str) -> None:
    assert detect_family(snippet).name == name


def test_capabilities_follow_the_family() -> None:
    assert capabilities(PLAIN) == ("chat", "structured_output")
    assert capabilities(Family("hermes", tools=True, reasoning="think")) == (
        "chat", "tools", "reasoning", "structured_output")
    assert capabilities(Family("apertus", tools=False, reasoning="think"), embeddings=True) == (
        "chat", "reasoning", "structured_output", "embeddings")


def test_a_model_that_does_not_write_can_only_embed() -> None:
    hermes = Family("hermes", tools=True, reasoning="think")
    assert capabilities(hermes, chat=False, embeddings=True) == ("embeddings",)
    assert capabilities(PLAIN, chat=False) == ()  # a reranker: it scores, it neither writes nor embeds


def _renders(shape: str) -> Any:
    """A stand-in template: how it writes the probe call's arguments."""

    def render(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> str:
        arguments = messages[1]["tool_calls"][0]["function"]["arguments"]
        if shape == "tojson":  # Hermes / Qwen2.5: `arguments | tojson`
            return json.dumps(arguments)
        if shape == "items":  # Qwen3-Coder: `arguments | items`, a string fails
            if isinstance(arguments, str):
                raise ChatTemplateError("the chat template failed: TypeError")
            return "".join(f"<parameter={k}>{v}</parameter>" for k, v in arguments.items())
        if shape == "as is":  # Functionary v3.2: `'…' + arguments`, a dict fails
            if not isinstance(arguments, str):
                raise ChatTemplateError("the chat template failed: TypeError")
            return arguments
        return str(arguments)  # a dict comes out as a Python repr

    return render


@pytest.mark.parametrize(("shape", "as_object"), [
    ("tojson", True), ("items", True), ("as is", False), ("repr", False)])
def test_arguments_as_object_is_probed_by_rendering(shape: str, as_object: bool) -> None:
    assert wants_object_arguments(_renders(shape)) is as_object
    family = detect_family("<tool_call>\n…\n</tool_call>", render=_renders(shape))
    assert family.arguments_as_object is as_object

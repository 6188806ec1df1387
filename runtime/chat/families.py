"""Chat template families: how a model writes tool calls and marks its thinking, read from
the text of its chat template (never from a file name: GGUFs are renamed freely).

    >>> detect_family(None)
    Family(name='plain', tools=False, reasoning='none', think_start='<think>', think_end='</think>', arguments_as_object=False)
    >>> f = detect_family("...<tool_call>\\n{{ tool_call | tojson }}\\n</tool_call>...<think>...")
    >>> f.name, f.tools, f.reasoning
    ('hermes', True, 'think')

The markers and their order follow llama.cpp (common/chat.cpp
`common_chat_try_specialized_template`, then its autoparser's patches): the most specific
template wins first — Ministral before Mistral, `<|channel|>` (harmony) before anything that
also writes `<tool_call>`, Seed-OSS's `<seed:tool_call>` before Qwen3-Coder's `<function=`,
GLM's `<arg_key>` before Hermes' bare `<tool_call>`.

    Hermes 2 Pro / Qwen2.5 / Qwen3    <tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>
    Qwen3-Coder / Qwen3.5             <tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>…
    Llama 3.1–3.3                     {"name": …, "parameters": {…}}   (or <|python_tag|>)
    GLM 4.5–4.7                       <tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>…
    gpt-oss (harmony)                 <|start|>assistant to=functions.NAME<|channel|>commentary …

`tools` is True for the families Outrider both renders and parses (runtime.chat.reply);
the others are named, so `/v1/models` can say what a model is, but refuse `tools`.

`arguments_as_object` comes from rendering, as llama.cpp's capability probe does
(common/jinja/caps.cpp): given a `render` (the engine's sandboxed template), an assistant
call is rendered once with `arguments` a dict and once as JSON text. A template that writes
the dict (with `tojson`, or key by key) and mangles or refuses the text wants objects; one
that writes the text as it is wants strings. Without `render`, the family's usual answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from runtime.errors import ChatTemplateError

Reasoning = Literal["none", "think", "harmony"]
ProbeRender = Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]], str]


@dataclass(frozen=True)
class Family:
    """One tool-call / reasoning format. `tools`: Outrider can render AND parse its calls.
    `reasoning`: "think" (text between `think_start` and `think_end`), "harmony" (gpt-oss's
    analysis channel) or "none"."""

    name: str
    tools: bool
    reasoning: Reasoning
    think_start: str = "<think>"
    think_end: str = "</think>"
    arguments_as_object: bool = False


PLAIN = Family("plain", tools=False, reasoning="none")

# Families whose calls Outrider renders and parses; the rest are named, with tools=False.
TOOL_FAMILIES = frozenset({
    "hermes", "qwen3_coder", "llama3", "mistral_nemo", "mistral", "deepseek_r1",
    "deepseek_v3_1", "gpt_oss", "command_r7b", "granite", "gemma4", "glm45", "kimi_k2",
})


@dataclass(frozen=True)
class _Rule:
    """A family's markers: all of `needs` in the template and none of `unless`."""

    name: str
    needs: tuple[str, ...]
    unless: tuple[str, ...] = ()
    arguments_as_object: bool = True  # the answer without a probe render

    def matches(self, text: str) -> bool:
        return all(m in text for m in self.needs) and not any(m in text for m in self.unless)


# First match wins (module docstring).
_RULES: tuple[_Rule, ...] = (
    _Rule("mistral", ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"), arguments_as_object=False),
    _Rule("mistral_nemo", ("[TOOL_CALLS]",)),
    _Rule("gpt_oss", ("<|channel|>",), arguments_as_object=False),
    _Rule("muse_glimmer", ("<atem:function_calls>", "<|eom|>")),
    _Rule("functionary_v3_2", (">>>all",), arguments_as_object=False),
    _Rule("kimi_k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
          arguments_as_object=False),
    _Rule("kimi_k3", ("<|open|>", "<|close|>", "<|end_of_msg|>")),
    _Rule("glm45", ("<role>ASSISTANT</role>", "<arg_key>")),  # Ling 3.0: GLM's call syntax
    _Rule("cohere2moe", ("<|START_TEXT|>", "<|START_ACTION|>")),
    _Rule("command_r7b", ("<|START_ACTION|>",), arguments_as_object=False),
    _Rule("command_r_plus", ("<|START_OF_TURN_TOKEN|>", "Action:")),
    _Rule("lfm2", ("<|tool_list_start|>",)),
    _Rule("lfm2", ("List of tools: [",)),
    _Rule("gigachat3", ("<|role_sep|>", "<|message_sep|>")),
    _Rule("minimax_m3", ("]<]minimax[>[", "<invoke name=")),
    _Rule("minimax_m2", ("<minimax:tool_call>",)),
    _Rule("minimax_m1", ("<tool_calls>", "<beginning_of_sentence>")),
    _Rule("deepseek_v3_2", ("dsml_token", "DSML")),
    _Rule("gemma4", ("'<|tool_call>call:'",)),
    _Rule("minicpm5", ("Tool usage guidelines:", '<function name="', '<param name="')),
    _Rule("seed_oss", ("<seed:tool_call>",)),
    _Rule("hy3", ("':opensource'", "'<tool_call{}>'")),  # Hunyuan 3 formats its tokens
    _Rule("qwen3_coder", ("<tool_call>", "<function=", "<parameter=")),
    _Rule("glm45", ("<tool_call>", "<arg_key>", "<arg_value>")),
    _Rule("deepseek_r1", ("<｜tool▁calls▁begin｜>", "```json"), arguments_as_object=False),
    _Rule("deepseek_v3_1", ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>")),
    _Rule("functionary_v3_1", ("<|python_tag|>", "<function=")),
    _Rule("firefunction_v2", ("functools[",)),
    _Rule("llama3", ("<|start_header_id|>", "ipython", '"parameters": ')),
    _Rule("granite", ("<|tool_call|>", "<|start_of_role|>"), arguments_as_object=False),
    # Granite 4 writes Hermes' calls (<tool_call>{json}</tool_call>): parsed, rendered and
    # forced as Hermes, so its grammar and `auto` trigger are the ones it really writes.
    _Rule("hermes", ("<tool_call>", "<|start_of_role|>")),
    _Rule("apriel", ("<tool_calls>[",)),
    _Rule("nemotron_v2", ("<TOOLCALL>",)),
    _Rule("apertus", ("<|tools_prefix|>",)),
    _Rule("solar_open", ("<|tool_call:begin|>",)),
    _Rule("hermes", ("<tool_call>",)),
)

# How thinking is marked, most specific first: (start, end, what must be in the template).
_THINK_MARKERS: tuple[tuple[str, str, str], ...] = (
    ("<|START_THINKING|>", "<|END_THINKING|>", "<|START_THINKING|>"),
    ("[THINK]", "[/THINK]", "[THINK]"),
    ("<seed:think>", "</seed:think>", "<seed:think>"),
    ("<mm:think>", "</mm:think>", "</mm:think>"),
    ("<think:opensource>", "</think:opensource>", "'<think{}>'.format(HYTK)"),
    ("<|channel>thought", "<channel|>", "<|channel>thought"),
    ("<|inner_prefix|>", "<|inner_suffix|>", "<|inner_prefix|>"),
    ("<think>", "</think>", "</think>"),
    ("<think>", "</think>", "<think>"),
)


def detect_family(template: str | None, *, render: ProbeRender | None = None) -> Family:
    """The family of a chat template, from its text (never its file name); `render(messages,
    tools)` — the template itself, sandboxed — decides `arguments_as_object` when given.

        >>> detect_family("{{ '<|start|>assistant<|channel|>analysis<|message|>' }}").reasoning
        'harmony'
        >>> detect_family("[SYSTEM_PROMPT]...[TOOL_CALLS]...[ARGS]...[THINK]").think_end
        '[/THINK]'
    """
    if not template:
        return PLAIN
    rule = next((r for r in _RULES if r.matches(template)), None)
    family = Family("plain", tools=False, reasoning="none") if rule is None else Family(
        rule.name, tools=rule.name in TOOL_FAMILIES, reasoning="none",
        arguments_as_object=rule.arguments_as_object)
    if family.name == "gpt_oss":
        family = replace(family, reasoning="harmony",
                         think_start="<|channel|>analysis<|message|>", think_end="<|end|>")
    else:
        for start, end, marker in _THINK_MARKERS:
            if marker in template:
                family = replace(family, reasoning="think", think_start=start, think_end=end)
                break
    if render is not None and rule is not None:
        family = replace(family, arguments_as_object=wants_object_arguments(render))
    return family


_PROBE_VALUE = "probe_value_7f3a"
_PROBE_TOOLS: tuple[dict[str, Any], ...] = ({
    "type": "function",
    "function": {
        "name": "tool1", "description": "Tool description",
        "parameters": {"type": "object", "required": ["arg"],
                       "properties": {"arg": {"type": "string", "description": "Arg description"}}},
    },
},)


def _probe_messages(arguments: Any) -> list[dict[str, Any]]:
    """llama.cpp's probe conversation (common/jinja/caps.cpp), with a value to look for."""
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call00001", "type": "function",
            "function": {"name": "tool1", "arguments": arguments}}]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


def wants_object_arguments(render: ProbeRender) -> bool:
    """Whether the template renders a call's `arguments` given as a dict, and not (or
    differently: Gemma 4 writes a dict key by key, a string as it is) given as JSON text."""
    as_dict = _try(render, {"arg": _PROBE_VALUE})
    as_text = _try(render, json.dumps({"arg": _PROBE_VALUE}))
    if not _written(as_dict):
        return False
    return not _written(as_text) or as_dict != as_text


def writes_calls(render: ProbeRender, *, arguments_as_object: bool,
                 content: str | None = "") -> bool:
    """Whether the template writes an assistant's call into the prompt when the message's
    `content` is `content`: Granite 3.3's never does, DeepSeek-R1-Distill-Llama's only when
    it is None (what llama.cpp sends, "", hides the call there)."""
    arguments: Any = {"arg": _PROBE_VALUE}
    if not arguments_as_object:
        arguments = json.dumps(arguments)
    return _written(_try(render, arguments, content))


def _try(render: ProbeRender, arguments: Any, content: str | None = "") -> str | None:
    messages = _probe_messages(arguments)
    messages[1]["content"] = content
    try:
        return render(messages, _PROBE_TOOLS)
    except ChatTemplateError:
        return None


def _written(output: str | None) -> bool:
    """The arguments are in the output, and neither as a Python repr ({'arg': '…'}) nor
    JSON-encoded twice ("{\\"arg\\": …")."""
    return (output is not None and _PROBE_VALUE in output
            and f"'{_PROBE_VALUE}'" not in output and f'\\"{_PROBE_VALUE}' not in output)


def capabilities(family: Family, *, chat: bool = True,
                 embeddings: bool = False) -> tuple[str, ...]:
    """What a model of this family can be asked for (`/v1/models`' `outrider.capabilities`):
    "chat" (it writes text: a decoder), its family's "tools" and "reasoning",
    "structured_output" (any model that writes), "embeddings" (it can embed: not a reranker,
    not T5). An encoder-only model (BERT) writes nothing, so it has only "embeddings":

        >>> capabilities(PLAIN), capabilities(detect_family("<tool_call>...</think>"))
        (('chat', 'structured_output'), ('chat', 'tools', 'reasoning', 'structured_output'))
        >>> capabilities(PLAIN, embeddings=True), capabilities(PLAIN, chat=False, embeddings=True)
        (('chat', 'structured_output', 'embeddings'), ('embeddings',))
    """
    writes = ("chat", *(("tools",) if family.tools else ()),
              *(("reasoning",) if family.reasoning != "none" else ()),
              "structured_output") if chat else ()
    return (*writes, *(("embeddings",) if embeddings else ()))

"""Golden model replies, written by hand in each family's own format, with what they parse
to. Shared by test_reply.py (parsing, streaming) and test_tool_grammar.py (the grammars
accept the calls among them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.chat.families import Family

THINK_MARKERS = {
    "mistral": ("[THINK]", "[/THINK]"),
    "command_r7b": ("<|START_THINKING|>", "<|END_THINKING|>"),
    "gemma4": ("<|channel>thought", "<channel|>"),
    "seed_oss": ("<seed:think>", "</seed:think>"),
    "apertus": ("<|inner_prefix|>", "<|inner_suffix|>"),
}
NO_THINKING = {"llama3", "mistral_nemo", "functionary_v3_1", "firefunction_v2", "phi4"}


def family(name: str) -> Family:
    """The family as runtime.chat.families describes it (markers as its detector sets)."""
    if name == "gpt_oss":
        return Family(name, tools=True, reasoning="harmony",
                      think_start="<|channel|>analysis<|message|>", think_end="<|end|>")
    if name in NO_THINKING:
        return Family(name, tools=True, reasoning="none")
    start, end = THINK_MARKERS.get(name, ("<think>", "</think>"))
    return Family(name, tools=True, reasoning="think", think_start=start, think_end=end)


WEATHER = ("get_weather", {"city": "Paris"})
TIME = ("get_time", {"zone": "CET"})

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather now in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                       "required": ["zone"]}}},
]


@dataclass(frozen=True)
class Golden:
    family: str
    case: str  # content / single / parallel / reasoning / malformed / ...
    text: str
    content: str = ""
    reasoning: str | None = None
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    ids: tuple[str | None, ...] = ()  # the model's own ids, where its format has them
    malformed: bool = False
    in_reasoning: bool = False
    grammar: bool = field(default=False)  # a call-only reply a "required" grammar accepts

    @property
    def id(self) -> str:
        return f"{self.family}-{self.case}"


def _bad(family_: str, text: str, case: str = "malformed") -> Golden:
    return Golden(family_, case, text, content=text, malformed=True)


HERMES_W = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HERMES_T = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
QWEN_W = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
          "</function>\n</tool_call>")
QWEN_T = ("<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n"
          "</function>\n</tool_call>")
R1 = ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```"
      "<｜tool▁call▁end｜>")
R1_W = R1.format(name="get_weather", args='{"city": "Paris"}')
R1_T = R1.format(name="get_time", args='{"zone": "CET"}')
V3_W = '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
V3_T = '<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "CET"}<｜tool▁call▁end｜>'
DS_OPEN, DS_CLOSE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
OSS_W = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
         '{"city":"Paris"}<|call|>')
OSS_ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather in Paris.<|end|>"
KIMI = ("<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}"
        "<|tool_call_end|>")
KIMI_W = KIMI.format(name="get_weather", i=0, args='{"city": "Paris"}')
KIMI_T = KIMI.format(name="get_time", i=1, args='{"zone": "CET"}')
K_OPEN, K_CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
GLM_W = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
GLM_T = "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>"
GEMMA_W = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
GEMMA_T = '<|tool_call>call:get_time{zone:<|"|>CET<|"|>}<tool_call|>'
CMD = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
       '"parameters": {"city": "Paris"}}MORE\n]<|END_ACTION|>')
CMD_MORE = ',\n    {"tool_call_id": "1", "tool_name": "get_time", "parameters": {"zone": "CET"}}'

GOLDENS: tuple[Golden, ...] = (
    # --- hermes (Hermes 2 Pro / 3, Qwen2.5, Qwen3, QwQ) ---
    Golden("hermes", "content", "The capital of France is Paris.\n\nAnything else?",
           content="The capital of France is Paris.\n\nAnything else?"),
    Golden("hermes", "single", HERMES_W, calls=(WEATHER,), grammar=True),
    Golden("hermes", "parallel", HERMES_W + "\n" + HERMES_T, calls=(WEATHER, TIME), grammar=True),
    Golden("hermes", "reasoning",
           "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n" + HERMES_W,
           content="Let me check.", reasoning="The user wants the weather.", calls=(WEATHER,)),
    Golden("hermes", "reasoning-only-call",
           "<think>\nThe user wants the weather.\n</think>\n\n" + HERMES_W,
           reasoning="The user wants the weather.", calls=(WEATHER,), grammar=True),
    Golden("hermes", "prompt-opened-think", "Weather, so a call.\n</think>\n\n" + HERMES_W,
           reasoning="Weather, so a call.", calls=(WEATHER,), in_reasoning=True, grammar=True),
    _bad("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'),
    Golden("hermes", "unclosed-at-eos",
           '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
           calls=(WEATHER,)),
    _bad("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"ci', "truncated"),
    Golden("hermes", "marker-text-in-argument",
           '<tool_call>\n{"name": "get_weather", "arguments": {"city": "</tool_call>"}}\n'
           "</tool_call>", calls=(("get_weather", {"city": "</tool_call>"}),)),
    Golden("hermes", "partial-marker-text", "Use a < b, then <tool", content="Use a < b, then <tool"),
    # --- qwen3_coder (Qwen3-Coder, Qwen3.5) ---
    Golden("qwen3_coder", "single", QWEN_W, calls=(WEATHER,), grammar=True),
    Golden("qwen3_coder", "parallel", QWEN_W + "\n" + QWEN_T, calls=(WEATHER, TIME), grammar=True),
    Golden("qwen3_coder", "reasoning", "The user wants the weather.\n</think>\n\nChecking.\n" + QWEN_W,
           content="Checking.", reasoning="The user wants the weather.", calls=(WEATHER,),
           in_reasoning=True),
    Golden("qwen3_coder", "call-closes-thinking", "The user wants the weather.\n\n" + QWEN_W,
           reasoning="The user wants the weather.", calls=(WEATHER,), in_reasoning=True),
    Golden("qwen3_coder", "typed-values",
           "<tool_call>\n<function=forecast>\n<parameter=city>\nParis\n</parameter>\n"
           "<parameter=days>\n3\n</parameter>\n<parameter=hourly>\ntrue\n</parameter>\n"
           "</function>\n</tool_call>",
           calls=(("forecast", {"city": "Paris", "days": 3, "hourly": True}),)),
    _bad("qwen3_coder", '<tool_call>\n<get_weather city="Paris">\n</tool_call>'),
    # --- llama3 (Llama 3.1-3.3) ---
    Golden("llama3", "content", "Paris is the capital of France.",
           content="Paris is the capital of France."),
    Golden("llama3", "single", '{"name": "get_weather", "parameters": {"city": "Paris"}}',
           calls=(WEATHER,), grammar=True),
    Golden("llama3", "builtin", '<|python_tag|>brave_search.call(query="weather in Paris")',
           calls=(("brave_search", {"query": "weather in Paris"}),)),
    Golden("llama3", "python-tag-json",
           '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
           calls=(WEATHER,)),
    Golden("llama3", "json-answer", '{"capital": "Paris"} is the JSON you asked for.',
           content='{"capital": "Paris"} is the JSON you asked for.'),
    _bad("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}'),
    # --- mistral_nemo ---
    Golden("mistral_nemo", "single",
           '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]',
           calls=(WEATHER,), ids=("a1b2c3d4e",), grammar=True),
    Golden("mistral_nemo", "parallel",
           '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, '
           '{"name": "get_time", "arguments": {"zone": "CET"}, "id": "f5g6h7i8j"}]',
           calls=(WEATHER, TIME), ids=("a1b2c3d4e", "f5g6h7i8j"), grammar=True),
    Golden("mistral_nemo", "content", "Paris.", content="Paris."),
    _bad("mistral_nemo", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"]'),
    # --- mistral (Mistral Small 3.2, Devstral, Ministral 3 / Magistral) ---
    Golden("mistral", "single", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
           calls=(WEATHER,), grammar=True),
    Golden("mistral", "parallel",
           '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}'
           '[TOOL_CALLS]get_time[CALL_ID]f5g6h7i8j[ARGS]{"zone": "CET"}',
           calls=(WEATHER, TIME), ids=("a1b2c3d4e", "f5g6h7i8j"), grammar=True),
    Golden("mistral", "reasoning",
           '[THINK]Weather needs the tool.[/THINK]I will check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
           content="I will check.", reasoning="Weather needs the tool.", calls=(WEATHER,)),
    _bad("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris",}'),
    # --- deepseek_r1 ---
    Golden("deepseek_r1", "single", DS_OPEN + R1_W + DS_CLOSE, calls=(WEATHER,), grammar=True),
    Golden("deepseek_r1", "parallel", DS_OPEN + R1_W + "\n" + R1_T + DS_CLOSE,
           calls=(WEATHER, TIME), grammar=True),
    Golden("deepseek_r1", "reasoning",
           "The user asks about the weather.\n</think>\n\n" + DS_OPEN + R1_W + DS_CLOSE,
           reasoning="The user asks about the weather.", calls=(WEATHER,), in_reasoning=True,
           grammar=True),
    Golden("deepseek_r1", "think-then-answer", "<think>\nEasy.\n</think>\n\nParis.",
           content="Paris.", reasoning="Easy."),
    Golden("deepseek_r1", "think-opened-twice", "<think>\nHmm.\n</think>\n\nParis.",
           content="Paris.", reasoning="Hmm.", in_reasoning=True),
    Golden("deepseek_r1", "unclosed-thinking", "Still thinking about", reasoning="Still thinking about",
           in_reasoning=True),
    _bad("deepseek_r1", DS_OPEN + R1.format(name="get_weather", args='{"city": "Paris"') + DS_CLOSE),
    # --- deepseek_v3_1 (V3.1, V3.2-Exp style) ---
    Golden("deepseek_v3_1", "single", DS_OPEN + V3_W + DS_CLOSE, calls=(WEATHER,), grammar=True),
    Golden("deepseek_v3_1", "parallel", DS_OPEN + V3_W + V3_T + DS_CLOSE, calls=(WEATHER, TIME),
           grammar=True),
    Golden("deepseek_v3_1", "reasoning", "Weather: call.</think>Sure." + DS_OPEN + V3_W + DS_CLOSE,
           content="Sure.", reasoning="Weather: call.", calls=(WEATHER,), in_reasoning=True),
    _bad("deepseek_v3_1", DS_OPEN + "I cannot call that.", "section-without-call"),
    Golden("deepseek_v3_1", "no-section", "Sure." + V3_W, content="Sure.", calls=(WEATHER,)),
    _bad("deepseek_v3_1", DS_OPEN + '<｜tool▁call▁begin｜>get_weather{"city": "Paris"}'
         "<｜tool▁call▁end｜>" + DS_CLOSE),
    # --- gpt_oss (harmony) ---
    Golden("gpt_oss", "content", "<|channel|>final<|message|>Paris is the capital.<|return|>",
           content="Paris is the capital."),
    Golden("gpt_oss", "reasoning-content",
           "<|channel|>analysis<|message|>Easy one.<|end|><|start|>assistant<|channel|>final"
           "<|message|>Paris.", content="Paris.", reasoning="Easy one."),
    Golden("gpt_oss", "single", OSS_W, calls=(WEATHER,), grammar=True),
    Golden("gpt_oss", "reasoning", OSS_ANALYSIS + "<|start|>assistant" + OSS_W,
           reasoning="The user wants the weather in Paris.", calls=(WEATHER,), grammar=True),
    Golden("gpt_oss", "recipient-in-role",
           ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
           calls=(WEATHER,)),
    Golden("gpt_oss", "preamble-parallel",
           "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant" + OSS_W
           + '<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json'
           '<|message|>{"zone":"CET"}<|call|>', content="Checking both.", calls=(WEATHER, TIME)),
    Golden("gpt_oss", "prompt-opened-analysis",
           "Easy.<|end|><|start|>assistant<|channel|>final<|message|>Paris.", content="Paris.",
           reasoning="Easy.", in_reasoning=True),
    Golden("gpt_oss", "not-harmony", "Paris is the capital.", content="Paris is the capital."),
    _bad("gpt_oss", '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
         '{"city": Paris}<|call|>'),
    # --- command_r7b ---
    Golden("command_r7b", "content", "<|START_RESPONSE|>Paris is the capital.<|END_RESPONSE|>",
           content="Paris is the capital."),
    Golden("command_r7b", "reasoning",
           "<|START_THINKING|>I will look up the weather.<|END_THINKING|>" + CMD.replace("MORE", ""),
           reasoning="I will look up the weather.", calls=(WEATHER,), ids=("0",), grammar=True),
    Golden("command_r7b", "parallel", CMD.replace("MORE", CMD_MORE), calls=(WEATHER, TIME),
           ids=("0", "1"), grammar=True),
    _bad("command_r7b", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", '
         '"parameters": {"city": "Paris"}]<|END_ACTION|>'),
    # --- granite (3.3: <|tool_call|>[...]; 4: Hermes' <tool_call>) ---
    Golden("granite", "single", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
           calls=(WEATHER,), grammar=True),
    Golden("granite", "parallel",
           '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
           '{"name": "get_time", "arguments": {"zone": "CET"}}]', calls=(WEATHER, TIME),
           grammar=True),
    Golden("granite", "granite4", HERMES_W, calls=(WEATHER,)),
    Golden("granite", "reasoning",
           "<think>The user greets me.</think><response>Hello! How can I help?</response>",
           content="Hello! How can I help?", reasoning="The user greets me."),
    _bad("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}]'),
    # --- gemma4 ---
    Golden("gemma4", "content", "Paris is the capital of France.",
           content="Paris is the capital of France."),
    Golden("gemma4", "single", GEMMA_W, calls=(WEATHER,), grammar=True),
    Golden("gemma4", "parallel", GEMMA_W + GEMMA_T, calls=(WEATHER, TIME), grammar=True),
    Golden("gemma4", "reasoning", "<|channel>thought\nThe user wants the weather.<channel|>" + GEMMA_W,
           reasoning="The user wants the weather.", calls=(WEATHER,), grammar=True),
    Golden("gemma4", "typed-values",
           '<|tool_call>call:forecast{city:<|"|>Paris<|"|>,days:3,hourly:true,'
           'hours:[6,12],extra:{unit:<|"|>C<|"|>}}<tool_call|>',
           calls=(("forecast", {"city": "Paris", "days": 3, "hourly": True, "hours": [6, 12],
                                "extra": {"unit": "C"}}),)),
    _bad("gemma4", "<|tool_call>call:get_weather{city:Paris}<tool_call|>"),
    # --- glm45 (GLM 4.5/4.6 with newlines, 4.7 without) ---
    Golden("glm45", "single", GLM_W, calls=(WEATHER,), grammar=True),
    Golden("glm45", "single-4.7",
           "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
           calls=(WEATHER,), grammar=True),
    Golden("glm45", "parallel", GLM_W + "\n" + GLM_T, calls=(WEATHER, TIME), grammar=True),
    Golden("glm45", "reasoning", "The user wants the weather.</think>\n" + GLM_W,
           reasoning="The user wants the weather.", calls=(WEATHER,), in_reasoning=True,
           grammar=True),
    Golden("glm45", "think-then-answer", "\n<think>Greeting.</think>\nHello!", content="Hello!",
           reasoning="Greeting."),
    _bad("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\nParis\n</tool_call>"),
    # --- kimi_k2 ---
    Golden("kimi_k2", "single", K_OPEN + KIMI_W + K_CLOSE, calls=(WEATHER,),
           ids=("functions.get_weather:0",), grammar=True),
    Golden("kimi_k2", "parallel", K_OPEN + KIMI_W + KIMI_T + K_CLOSE, calls=(WEATHER, TIME),
           ids=("functions.get_weather:0", "functions.get_time:1"), grammar=True),
    Golden("kimi_k2", "reasoning", "<think>Weather.</think>Checking." + K_OPEN + KIMI_W + K_CLOSE,
           content="Checking.", reasoning="Weather.", calls=(WEATHER,),
           ids=("functions.get_weather:0",)),
    _bad("kimi_k2", K_OPEN + KIMI.format(name="get_weather", i=0, args='{"city": }') + K_CLOSE),
    # --- other families whose calls are parsed (named by runtime.chat.families) ---
    Golden("functionary_v3_1", "single", '<function=get_weather>{"city": "Paris"}</function>',
           calls=(WEATHER,), grammar=True),
    _bad("functionary_v3_1", '<function=get_weather>{"city": "Paris"</function>'),
    Golden("firefunction_v2", "single",
           ' functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
           calls=(WEATHER,)),
    Golden("firefunction_v2", "just-the-word", "I used functools.partial here.",
           content="I used functools.partial here."),
    Golden("nemotron_v2", "single",
           '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>',
           calls=(WEATHER,), grammar=True),
    Golden("apertus", "single", '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>',
           calls=(WEATHER,), grammar=True),
    Golden("phi4", "single",
           '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>',
           calls=(WEATHER,), grammar=True),
    Golden("lfm2", "parallel",
           '<|tool_call_start|>[get_weather(city="Paris"), get_time(zone="CET")]<|tool_call_end|>',
           calls=(WEATHER, TIME), grammar=True),
    _bad("lfm2", '<|tool_call_start|>[get_weather(city="Paris"]<|tool_call_end|>'),
    Golden("seed_oss", "reasoning",
           "<seed:think>Weather.</seed:think>\n<seed:tool_call>\n<function=get_weather>\n"
           "<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>",
           reasoning="Weather.", calls=(WEATHER,), grammar=True),
    Golden("minimax_m2", "single",
           '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
           "</invoke>\n</minimax:tool_call>", calls=(WEATHER,), grammar=True),
    Golden("deepseek_v3_2", "single",
           '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
           '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
           "</｜DSML｜invoke>\n</｜DSML｜function_calls>", calls=(WEATHER,), grammar=True),
)

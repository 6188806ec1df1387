"""Request bodies of OpenAI's Responses API, and their translation onto the chat request the
engine's request is made from (`runtime.server.dialect`).

    >>> body = ResponsesRequest.model_validate({"model": "m", "instructions": "Be brief.",
    ...     "input": "Hi", "max_output_tokens": 32})
    >>> fields = body.openai_fields()
    >>> [m["role"] for m in fields["messages"]], fields["max_tokens"]
    (['system', 'user'], 32)

`input` is text (one user message) or a list of items: messages (`role` user, system,
developer or assistant; content text or `input_text` / `output_text` parts), `function_call`
items (an assistant's calls: consecutive ones form one assistant turn), `function_call_output`
items (the results, one tool message each, named after their call) and `reasoning` items (an
assistant's thinking, kept for the next assistant turn). Images, files, `item_reference`
and tools other than `function` are refused.

Nothing is stored (`store: false` only): `store: true`, `previous_response_id`,
`conversation` and `background` are 400s that say so (a missing `store` means not stored).
`text.format` is the reply's form (json_object / json_schema, by constrained decoding),
`reasoning.effort` goes to the template (gpt-oss reads it), `truncation: "auto"` drops older
turns instead of failing. `include: ["message.output_text.logprobs"]` asks for the tokens'
log-probabilities (with `top_logprobs` alternatives each, 0-20), as OpenAI's API does:

    >>> fields = ResponsesRequest.model_validate({"model": "m", "input": "Hi",
    ...     "include": ["message.output_text.logprobs"], "top_logprobs": 2}).openai_fields()
    >>> fields["logprobs"], fields["top_logprobs"]
    (True, 2)

Other `include` values name output this server never makes (web search results, encrypted
reasoning, …) and are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.server.openai_schema import Count, Text, TopLogprobs
from runtime.server.reply_format import refuse

_STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

# OpenAI chat field → the Responses field a 400 names.
RENAME = {"max_tokens": "max_output_tokens", "response_format": "text.format",
          "reasoning_effort": "reasoning.effort", "messages": "input", "logprobs": "include"}
NOT_STORED = ("responses are not stored on this server (store: false only): send the whole "
              "conversation in input")
LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for them


class Part(BaseModel):
    model_config = _STRICT
    type: str
    text: Text | None = None
    image_url: str | None = None  # input_image: a data: URI (or a URL, if the server fetches)
    detail: str | None = None


class InputItem(BaseModel):
    """A message, a function call, a call's output or a reasoning item (by `type`)."""

    model_config = _STRICT
    type: str | None = None
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: Text | list[Part] | None = None
    call_id: Text | None = None
    name: Text | None = None
    arguments: Text | None = None
    output: Text | list[Part] | None = None
    summary: list[Part] | None = None


class FunctionTool(BaseModel):
    model_config = _STRICT
    type: str
    name: Text | None = None
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def openai(self, where: str) -> dict[str, Any]:
        if self.type != "function" or not self.name:
            refuse(where, f"tools of type {self.type!r} are not supported: only function tools")
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}


class NamedTool(BaseModel):
    model_config = _STRICT
    type: str
    name: Text | None = None


class TextFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    name: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = _STRICT
    format: TextFormat | None = None


class ReasoningConfig(BaseModel):
    model_config = _STRICT
    effort: Text | None = None
    summary: Text | None = None


class ResponsesRequest(BaseModel):
    model_config = _STRICT
    model: Annotated[str, Field(min_length=1)]
    input: Text | list[InputItem]
    instructions: Text | None = None
    max_output_tokens: Count | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    metadata: dict[str, Any] | None = None
    include: list[Text] | None = None
    top_logprobs: TopLogprobs | None = None

    @property
    def logprobs(self) -> bool:
        """Whether the reply carries its tokens' log-probabilities."""
        return LOGPROBS in (self.include or ())

    def check_not_stored(self) -> None:
        if self.store:
            refuse("store", NOT_STORED)
        if self.previous_response_id is not None:
            refuse("previous_response_id", "responses are not stored on this server (store: "
                   "false only), so previous_response_id names none: send the earlier turns "
                   "in input")
        if self.conversation is not None:
            refuse("conversation", NOT_STORED)
        if self.background:
            refuse("background", "background responses need storing them, which this server "
                   "does not do: leave background out")

    def openai_fields(self) -> dict[str, Any]:
        self.check_not_stored()
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            messages += _messages(self.input)
        fields: dict[str, Any] = {"model": self.model, "messages": messages}
        for name, value in (("max_tokens", self.max_output_tokens),
                            ("temperature", self.temperature), ("top_p", self.top_p),
                            ("parallel_tool_calls", self.parallel_tool_calls)):
            if value is not None:
                fields[name] = value
        if self.tools:
            fields["tools"] = [t.openai(f"tools.{i}") for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            fields["tool_choice"] = _tool_choice(self.tool_choice)
        form = self.text.format if self.text is not None else None
        if form is not None and form.type == "json_object":
            fields["response_format"] = {"type": "json_object"}
        elif form is not None and form.type == "json_schema":
            fields["response_format"] = {"type": "json_schema", "json_schema": {
                "name": form.name or "format", "schema": form.schema_ or {}}}
        if self.reasoning is not None and self.reasoning.effort is not None:
            fields["reasoning_effort"] = self.reasoning.effort
        if self.logprobs:
            fields["logprobs"] = True
            fields["top_logprobs"] = self.top_logprobs or 0
        elif self.top_logprobs:
            refuse("top_logprobs", f"top_logprobs needs include: [\"{LOGPROBS}\"] (the "
                   "log-probabilities are sent only when asked for)")
        if self.truncation == "auto":
            fields["truncate_middle"] = True
        return fields


def _tool_choice(choice: str | NamedTool) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.type != "function" or not choice.name:
        refuse("tool_choice", f"tool_choice of type {choice.type!r} is not supported: "
               "auto, none, required or a function by name")
    return {"type": "function", "function": {"name": choice.name}}


def _text(content: str | list[Part] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text", "summary_text",
                             "reasoning_text") or part.text is None:
            refuse(f"{where}.{j}", f"content of type {part.type!r} is not supported: only text")
        parts.append(part.text)
    return "".join(parts)


def _content(content: str | list[Part] | None, where: str) -> str | list[dict[str, Any]]:
    """A message's content: its text, or OpenAI content parts when it has `input_image`s."""
    if not isinstance(content, list) or not any(p.type == "input_image" for p in content):
        return _text(content, where)
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if part.type == "input_image":
            if not part.image_url:
                refuse(f"{where}.{j}", "an input_image needs an image_url (a data: URI); "
                       "file_id is not supported")
            out.append({"type": "image_url", "image_url": {"url": part.image_url},
                        "where": f"{where}.{j}"})
        else:
            out.append({"type": "text", "text": _text([part], f"{where}.{j}")})
    return out


def _messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """The chat messages of an input item list (module doc)."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id → function name
    reasoning: list[str] = []
    open_calls = False  # the last message is an assistant turn that function calls may join
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.type or "message"
        if kind == "message":
            if item.role is None:
                refuse(f"{where}.role", "Field required")
            message: dict[str, Any] = {"role": item.role,
                                       "content": _content(item.content, f"{where}.content")}
            if item.role == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning = []
            out.append(message)
            open_calls = item.role == "assistant"
        elif kind == "function_call":
            if not item.call_id or not item.name:
                refuse(where, "a function_call item needs a call_id and a name")
            names[item.call_id] = item.name
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments or "{}"}}
            if not open_calls:
                out.append({"role": "assistant", "content": ""})
                if reasoning:
                    out[-1]["reasoning_content"] = "".join(reasoning)
                    reasoning = []
                open_calls = True
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not item.call_id:
                refuse(where, "a function_call_output item needs the call_id it answers")
            result: dict[str, Any] = {"role": "tool", "tool_call_id": item.call_id,
                                      "content": _text(item.output, f"{where}.output")}
            if item.call_id in names:
                result["name"] = names[item.call_id]
            out.append(result)
            open_calls = False
        elif kind == "reasoning":
            reasoning.append(_text(item.content, f"{where}.content")
                             or _text(item.summary, f"{where}.summary"))
        elif kind == "item_reference":
            refuse(where, NOT_STORED)
        else:
            refuse(where, f"input items of type {kind!r} are not supported")
    return out

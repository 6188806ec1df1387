"""The shape a request asks its reply to take: OpenAI's `response_format`, llama-server's
`grammar` / `json_schema` (and each dialect's own: Ollama's `format`, Anthropic's
`output_config.format`, the Responses API's `text.format`), and the tools with their choice —
read into the engine's `ConstraintSpec`, the tools the template renders, and whether calls
are parsed back.

Everything is checked here, before the engine sees it: a schema or grammar the constraint
compiler would refuse (`runtime.sampling.constraint.check_spec`) is a 400 naming the keyword
and its path, never a 500 and never silently unconstrained output:

    >>> format_constraint(ResponseFormat.model_validate({"type": "json_object"}), None, None)
    ConstraintSpec(kind='json_object', source='', trigger=None, armed_after=None, in_reasoning=None)
    >>> format_constraint(None, "root ::= [0-9]+", None).source
    'root ::= [0-9]+'
    >>> from fastapi.exceptions import RequestValidationError
    >>> try:
    ...     format_constraint(None, None, {"type": "array", "uniqueItems": True})
    ... except RequestValidationError as exc:
    ...     print(exc.errors()[0]["loc"], exc.errors()[0]["msg"])
    ('body', 'json_schema') unsupported keyword 'uniqueItems' at the top level

Tools (`ToolPlan`): `auto` lets the model talk and forces a well-formed call once it starts
one (a lazy grammar on the family's call marker), `required` forces a call to any listed
function, a named choice a call to that one, `none` renders the tools but neither constrains
nor parses calls. A model whose template has no known call format refuses tools. For a
family that thinks, the grammar comes in two forms — the prompt may or may not have opened
the thinking block — and the engine, which renders the prompt, picks one
(`ConstraintSpec.in_reasoning`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints

from runtime.chat.families import Family
from runtime.chat.tool_grammar import tool_constraint
from runtime.errors import ConstraintError, ToolsError
from runtime.events import ConstraintSpec
from runtime.sampling.constraint import check_spec
from runtime.server.request.fields import STRICT, refuse

_STRICT = STRICT
# OpenAI's rule for function names; they also end up inside grammars and call markup.
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`. `strict` is accepted either way: the schema is always
    enforced by the grammar."""

    model_config = _STRICT
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # llama-server's json_object


def format_constraint(response_format: ResponseFormat | None, grammar: str | None,
                      json_schema: dict[str, Any] | bool | None) -> ConstraintSpec | None:
    """The constraint of `response_format`, `grammar` or `json_schema` (at most one of them),
    checked; None for free text."""
    given = [name for name, value in (("response_format", response_format), ("grammar", grammar),
                                      ("json_schema", json_schema)) if value is not None]
    if response_format is not None and response_format.type == "text":
        given.remove("response_format")
    if len(given) > 1:
        refuse(given[1], f"give one of {' or '.join(given)}, not both: each sets the reply's form")
    spec: ConstraintSpec | None = None
    param = given[0] if given else ""
    if response_format is not None and param == "response_format":
        spec = _response_format_spec(response_format)
    elif grammar is not None:
        if not grammar.strip():
            refuse("grammar", "the grammar is empty")
        spec = ConstraintSpec("gbnf", grammar)
    elif json_schema is not None:
        spec = _schema_spec("json_schema", json_schema)
    if spec is not None:
        try:
            check_spec(spec)
        except ConstraintError as exc:
            refuse(param, str(exc))
    return spec


def _response_format_spec(fmt: ResponseFormat) -> ConstraintSpec | None:
    if fmt.type == "json_object":
        if fmt.schema_ is not None:
            return _schema_spec("response_format.schema", fmt.schema_)
        return ConstraintSpec("json_object")
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            refuse("response_format.json_schema",
                   "response_format of type json_schema needs a json_schema object")
        schema = fmt.json_schema.schema_
        return _schema_spec("response_format.json_schema.schema", {} if schema is None else schema)
    return None


def _schema_spec(param: str, schema: dict[str, Any] | bool) -> ConstraintSpec:
    if not isinstance(schema, dict | bool):
        refuse(param, "a JSON schema is an object (or true / false)")
    return ConstraintSpec("json_schema", json.dumps(schema, ensure_ascii=False))


def schema_constraint(param: str, schema: dict[str, Any] | bool | None) -> ConstraintSpec:
    """A reply held to a JSON schema (None: any JSON object), checked; a 400 names `param`."""
    spec = ConstraintSpec("json_object") if schema is None else _schema_spec(param, schema)
    try:
        check_spec(spec)
    except ConstraintError as exc:
        refuse(param, str(exc))
    return spec


class FunctionDef(BaseModel):
    model_config = _STRICT
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDef

    def to_json(self) -> dict[str, Any]:
        return function_json(self.function.name, self.function.description,
                             self.function.parameters)


def function_json(name: str, description: str | None,
                  parameters: dict[str, Any] | None) -> dict[str, Any]:
    """OpenAI's JSON of a function tool, as templates and the grammar read it (every
    dialect's tools become this)."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = (parameters if parameters is not None
                              else {"type": "object", "properties": {}})
    return {"type": "function", "function": function}


class NamedFunction(BaseModel):
    model_config = _STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


def choice_name(choice: ToolChoice | None) -> str:
    """"auto", "none", "required" or the function's name."""
    if choice is None:
        return "auto"
    if isinstance(choice, NamedToolChoice):
        return choice.function.name
    return choice


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools become: the tools the template renders, the constraint on the
    reply (None: free), and whether the reply's calls are parsed back."""

    tools: tuple[dict[str, Any], ...] = ()
    constraint: ConstraintSpec | None = None
    parse_calls: bool = False
    forced: bool = False  # required / named: the reply must be a call


def tool_plan(tools: Sequence[dict[str, Any]], how: str, parallel: bool | None,
              family: Family, *, special_tokens: Mapping[str, int] | None = None,
              at: tuple[str, str] = ("tools", "tool_choice")) -> ToolPlan:
    """The `ToolPlan` of a request's tools (`function_json`s) and choice (`choice_name`),
    checked: a family without a call format, a duplicate function name, a parameters schema
    the compiler refuses, a choice naming no listed function are 400s naming `at` (the
    dialect's tools and tool-choice fields). `special_tokens`: the call markers the
    vocabulary holds as single special tokens (the grammar asks for those)."""
    tools_at, choice_at = at
    if not tools:
        if how != "auto" and how != "none":
            refuse(choice_at, "tool_choice asks for a call, but the request lists no tools")
        return ToolPlan()
    if not family.tools:
        refuse(tools_at, f"this model's chat template ({family.name}) has no tool-call format "
               "Outrider can parse; send the request without tools")
    names = [tool["function"]["name"] for tool in tools]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        refuse(tools_at, f"two tools are named {duplicate!r}; function names must be unique")
    if how not in ("auto", "none", "required") and how not in names:
        refuse(choice_at, f"it names the function {how!r}, which is not among the tools "
               f"({', '.join(names)})")
    for tool in tools:
        _check_parameters(tool, tools_at)
    rendered = tuple(tools)
    if how == "none":
        return ToolPlan(rendered)
    parallel = True if parallel is None else parallel
    try:
        constraint = _checked(tool_constraint(family, rendered, how, parallel,
                                              special_tokens=special_tokens))
        if constraint is not None and family.reasoning != "none":
            thinking = _checked(tool_constraint(family, rendered, how, parallel, in_reasoning=True,
                                                special_tokens=special_tokens))
            constraint = dataclasses.replace(constraint, in_reasoning=thinking)
    except (ToolsError, ConstraintError) as exc:
        refuse(tools_at, f"the tools cannot be made into a call grammar: {exc}")
    return ToolPlan(rendered, constraint, parse_calls=True, forced=how != "auto")


def _checked(spec: ConstraintSpec | None) -> ConstraintSpec | None:
    if spec is not None:
        check_spec(spec)
    return spec


def _check_parameters(tool: dict[str, Any], at: str) -> None:
    """Each parameters schema on its own, so the 400 names the tool (and `none`, which
    builds no grammar, refuses what the others would)."""
    function = tool["function"]
    try:
        check_spec(ConstraintSpec("json_schema", json.dumps(function["parameters"])))
    except ConstraintError as exc:
        refuse(at, f"the parameters of tool {function['name']!r} are not a usable JSON "
               f"schema: {exc}")

"""Chat templates: the GGUF's `tokenizer.chat_template`, rendered the way Hugging Face does.

Same environment as transformers' `apply_chat_template`: an immutable jinja2 sandbox with
`trim_blocks`, `lstrip_blocks` and loop controls, a `tojson` that keeps non-ASCII text, and
the globals `raise_exception` and `strftime_now`. What llama.cpp's own jinja adds and real
templates use works too: `{% generation %}` blocks, the `from_json` filter, `tojson` of a
`map(...)`, `list.append` / `list.pop` (Kimi K2).

The variables, as llama.cpp's `--jinja` sets them: `messages` (the dicts of
`runtime.chat.messages`: tool calls in OpenAI's shape, tool results with `tool_call_id` and
`name`, `reasoning_content`), `add_generation_prompt`, `bos_token`, `eos_token`, `tools`
(only when there are tools: Hermes 2 Pro's tool-use template loops over it unguarded),
`enable_thinking` (True unless the request says otherwise), `datetime`, `date_string`, and
the request's template kwargs (`enable_thinking`, `reasoning_effort`, ...).

`family` is the template's tool-call and reasoning format (`runtime.chat.families`),
detected once at load from the text and a few test renders.

A model without a template (or with one jinja cannot compile) gets ChatML, and says so:
`source` is "fallback" and `note` explains why.

A template is code from a model file, so rendering is bounded: a template that loops, recurses
or builds a huge string ends with a one-line `ChatTemplateError` instead of holding a thread:

    {% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}
    → ChatTemplateError("the chat template ran longer than 3 s ...")

How: the sandbox's own hooks check a per-render budget (time, size, call depth). Every loop a
template can write gets its iterable from a call (`range`), an attribute or an item (hooked),
or an operator (`+`, `*`, `**`, intercepted), so the clock is read at least once per ~100,000
iterations (`range` is capped at that by the sandbox); the output is consumed chunk by chunk
(`Template.generate`) and cut at `max_chars`; filters refuse numbers and results beyond it
(`center(10**9)` would allocate a gigabyte in one call); nested macro calls stop at
`_MAX_DEPTH`. Why not render in a thread and abandon it at a deadline: Python cannot stop a
thread, so an abandoned render keeps burning a core (and the GIL) for as long as it likes, one
more per hostile request.

    >>> t = ChatTemplate.from_model(None, bos_token="<s>", eos_token="</s>")
    >>> t.source, t.render([ChatMessage("user", "Hi")])
    ('fallback', '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n')
"""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runtime.chat.families import PLAIN, Family, detect_family, writes_calls
from runtime.chat.messages import CallContent, template_context, template_messages
from runtime.errors import ChatTemplateError
from runtime.events import ChatMessage

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_json_default)


def _json_default(value: Any) -> Any:
    """`tools | map(attribute='function') | tojson`: jinja's `map` is a generator, which
    llama.cpp's jinja (a list there) and templates written for it take for a list."""
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _from_json(text: str) -> Any:
    """llama.cpp's `from_json` filter (DeepSeek V3.2's template parses string arguments)."""
    return json.loads(text)


class _GenerationTag(jinja2.ext.Extension):
    """transformers' `{% generation %}…{% endgeneration %}` (it marks the assistant's tokens
    for training masks): rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja declares it so

    def parse(self, parser: Any) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        body: list[jinja2.nodes.Node] = parser.parse_statements(
            ("name:endgeneration",), drop_needle=True)
        return body


_MAX_DEPTH = 64  # nested template calls (a recursive macro); real templates use 2 or 3
_MAX_CHARS = 8 * 1024 * 1024  # rendered characters: twice the server's 4 MB body limit
_TIME_LIMIT_S = 3.0  # real templates render 10,000 messages in about 50 ms
_PROBE_TIME_LIMIT_S = 0.5  # each of the two renders `detect_family` makes at load


class _RenderBudget:
    """What one render may still spend; one per render, on the rendering thread."""

    def __init__(self, time_limit_s: float, max_chars: int) -> None:
        self.time_limit_s = time_limit_s
        self.deadline = time.monotonic() + time_limit_s
        self.max_chars = max_chars
        self.depth = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _TemplateTooCostly(
                f"it ran longer than {self.time_limit_s:g} s (a loop that never ends?)")

    def check_size(self, value: Any) -> Any:
        if isinstance(value, str | list | tuple) and len(value) > self.max_chars:
            raise _TemplateTooCostly(f"it built a value over {self.max_chars:,} items long")
        return value


class _TemplateTooCostly(Exception):
    """Raised inside a render that went over its budget."""


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with every hook it offers checking the current render's `_RenderBudget`.

    The budget lives in a thread-local: one compiled template may render on several worker
    threads at once."""

    intercepted_binops = frozenset({"+", "*", "**"})
    # Kimi K2's templates queue ids with `list.append` / `list.pop`, as llama.cpp's jinja
    # allows. Harmless here: every render gets its own copies of the messages and tools, and
    # each call is budgeted like any other.
    _ALLOWED_MUTATIONS = frozenset({"append", "pop"})

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in self._ALLOWED_MUTATIONS:
            return jinja2.sandbox.SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._local = threading.local()

    def start(self, budget: _RenderBudget) -> None:
        self._local.budget = budget

    def finish(self) -> None:
        self._local.budget = None

    def budget(self) -> _RenderBudget | None:
        return getattr(self._local, "budget", None)

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget = self.budget()
        if budget is not None:
            budget.tick()
            return budget.check_size(super().getattr(obj, attribute))
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = self.budget()
        if budget is not None:
            budget.tick()
            return budget.check_size(super().getitem(obj, argument))
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = __self.budget()
        if budget is None:
            return super().call(__context, __obj, *args, **kwargs)
        budget.tick()
        if budget.depth >= _MAX_DEPTH:
            raise _TemplateTooCostly(f"it nested calls more than {_MAX_DEPTH} deep (recursion?)")
        budget.depth += 1
        try:
            return budget.check_size(super().call(__context, __obj, *args, **kwargs))
        finally:
            budget.depth -= 1

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        budget = self.budget()
        if budget is not None:
            budget.tick()
            if operator_ == "*":
                _check_repeat(budget, left, right)
            elif operator_ == "**" and isinstance(left, int) and isinstance(right, int) \
                    and abs(left) > 1 and right > 64:
                raise _TemplateTooCostly(f"it raised a number to the power {right}")
            return budget.check_size(super().call_binop(context, operator_, left, right))
        return super().call_binop(context, operator_, left, right)


def _check_repeat(budget: _RenderBudget, left: Any, right: Any) -> None:
    """`"x" * 10**9` is refused before it allocates a gigabyte."""
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, str | list | tuple) and isinstance(times, int) \
                and len(seq) * times > budget.max_chars:
            raise _TemplateTooCostly(f"it built a value over {budget.max_chars:,} items long")


def _bounded_filter(env: _BoundedSandbox, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that refuses numeric arguments and results larger than the size budget.
    Also outside a render: jinja folds constant filter calls (`'x'|center(10**9)`) while it
    compiles the template, at load time."""
    first_arg = 2 if hasattr(fn, "jinja_pass_arg") else 1  # after (context,) value

    @functools.wraps(fn)  # copies jinja's pass_context / pass_environment marker too
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = env.budget()
        limit = budget.max_chars if budget is not None else _MAX_CHARS
        if budget is not None:
            budget.tick()
        if any(isinstance(a, int) and a > limit for a in (*args[first_arg:], *kwargs.values())):
            raise _TemplateTooCostly(f"a filter was given a number over {limit:,}")
        result = fn(*args, **kwargs)
        if isinstance(result, str | list | tuple) and len(result) > limit:
            raise _TemplateTooCostly(f"a filter built a value over {limit:,} items long")
        return result

    return bounded


def _environment() -> _BoundedSandbox:
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True,
                          extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.filters["from_json"] = _from_json
    env.filters = {name: _bounded_filter(env, fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and the special-token texts it is rendered with."""

    text: str
    source: Literal["model", "fallback"]
    bos_token: str
    eos_token: str
    note: str | None = None
    time_limit_s: float = _TIME_LIMIT_S
    max_chars: int = _MAX_CHARS
    _env: _BoundedSandbox = field(init=False, repr=False, compare=False)
    _compiled: jinja2.Template = field(init=False, repr=False, compare=False)
    _family: Family = field(init=False, repr=False, compare=False)
    _call_content: CallContent = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Compile once per model (milliseconds), not per request.
        env = _environment()
        object.__setattr__(self, "_env", env)
        object.__setattr__(self, "_compiled", env.from_string(self.text))
        object.__setattr__(self, "_family", PLAIN)
        object.__setattr__(self, "_call_content", "empty")
        if self.source == "model":
            family = detect_family(self.text, render=self._probe)
            object.__setattr__(self, "_family", family)
            if family.tools:
                object.__setattr__(self, "_call_content", self._how_calls_show(family))

    def _how_calls_show(self, family: Family) -> CallContent:
        as_object = family.arguments_as_object
        if writes_calls(self._probe, arguments_as_object=as_object):
            return "empty"
        if writes_calls(self._probe, arguments_as_object=as_object, content=None):
            return "null"
        return "text"

    @property
    def family(self) -> Family:
        """How this template marks tool calls and thinking ("plain" for the ChatML fallback)."""
        return self._family

    def _probe(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> str:
        """One of `detect_family`'s test renders, on a shorter leash than a request's."""
        return self._render(copy.deepcopy([dict(m) for m in messages]), True,
                            copy.deepcopy([dict(t) for t in tools]), {}, _PROBE_TIME_LIMIT_S)

    @classmethod
    def from_model(cls, template: str | None, *, bos_token: str, eos_token: str) -> ChatTemplate:
        """The model's template, or ChatML with a note when it has none or it is broken."""
        if template and template.strip():
            try:
                _environment().from_string(template)
            except (jinja2.exceptions.TemplateError, _TemplateTooCostly) as exc:
                return cls(CHATML, "fallback", bos_token, eos_token,
                           note=f"the model's chat template does not compile ({exc}); using ChatML")
            return cls(template, "model", bos_token, eos_token)
        return cls(CHATML, "fallback", bos_token, eos_token,
                   note="the model has no chat template; using ChatML")

    def render(self, messages: Sequence[ChatMessage | Mapping[str, Any]], *,
               add_generation_prompt: bool = True, tools: Sequence[Mapping[str, Any]] = (),
               extra: Mapping[str, Any] | None = None) -> str:
        """The prompt text for `messages`, with `tools` (OpenAI function definitions) as the
        template's `tools` and `extra` (template kwargs such as `enable_thinking`) as more
        variables. A template's own `raise_exception` (e.g. "roles must alternate") becomes
        a ChatTemplateError with its message; so does any other failure of the template (a
        sandbox refusal, a loop past `time_limit_s`, output past `max_chars`, runaway
        recursion) — never a bare exception or a hang."""
        return self._render(template_messages(messages, self._family, self._call_content),
                            add_generation_prompt,
                            copy.deepcopy([dict(t) for t in tools]), dict(extra or {}),
                            self.time_limit_s)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]], extra: dict[str, Any], time_limit_s: float) -> str:
        # Without tools `tools` stays undefined, as in llama.cpp: templates made for tool use
        # (Hermes 2 Pro's, Command R+'s) loop over it unguarded, and over None that fails.
        variables = {**template_context(tools), **extra, "messages": messages,
                     "add_generation_prompt": add_generation_prompt,
                     "bos_token": self.bos_token, "eos_token": self.eos_token}
        if tools:
            variables["tools"] = tools
        budget = _RenderBudget(time_limit_s, self.max_chars)
        self._env.start(budget)
        try:
            chunks: list[str] = []
            size = 0
            for chunk in self._compiled.generate(**variables):
                size += len(chunk)
                if size > self.max_chars:
                    raise _TemplateTooCostly(f"its output passed {self.max_chars:,} characters")
                budget.tick()
                chunks.append(chunk)
            return "".join(chunks)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(
                f"the chat template refused these messages: {_one_line(exc)}") from exc
        except _TemplateTooCostly as exc:
            raise ChatTemplateError(f"the chat template was stopped: {exc}") from None
        except RecursionError:
            raise ChatTemplateError("the chat template was stopped: it recursed too deeply") from None
        except Exception as exc:  # OverflowError (range too big), TypeError, ...: the template's fault
            raise ChatTemplateError(
                f"the chat template failed: {type(exc).__name__}: {_one_line(exc)}") from None
        finally:
            self._env.finish()

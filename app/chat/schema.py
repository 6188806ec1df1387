"""The chat's "Structured output" setting: a JSON schema typed by hand, checked as it is typed,
and the OpenAI `response_format` it becomes.

`check(text)` says in one line what is wrong ("" when nothing is: valid, or empty = off);
`response_format(text)` is what a request carries (None when off or invalid: an invalid
schema blocks Send rather than letting the reply come out unconstrained). Validation is the
`jsonschema` package's `check_schema` for the dialect the schema's `$schema` names (Draft
2020-12 when it names none); the engine may still refuse a keyword it cannot enforce, and
then the reply fails with the engine's own one-line reason.

    >>> check('{"type": "object", "properties": {"name": {"type": "string"}}}')
    ''
    >>> check('{"type": object}')
    'Not valid JSON (line 1, column 10): Expecting value'
    >>> check('{"type": "strin"}')
    "Not a valid JSON Schema at $.type: 'strin' is not valid under any of the given schemas"
    >>> check('[1, 2]')
    'A JSON schema is an object, like {"type": "object", ...}'
    >>> response_format('{"title": "Person record", "type": "object"}')["json_schema"]["name"]
    'Person_record'
    >>> response_format("   ") is None
    True
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

MAX_PROBLEM = 200  # characters: the field's error is one line
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
DEFAULT_NAME = "reply"


@functools.lru_cache(maxsize=16)
def _parse(text: str) -> tuple[str, str]:
    """(problem, canonical JSON of the schema): one of them is "". Cached: the settings
    field, Send and the request body all ask about the same text."""
    if not text.strip():
        return "", ""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        return _one_line(f"Not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"), ""
    if not isinstance(schema, dict):
        return 'A JSON schema is an object, like {"type": "object", ...}', ""
    # Imported here: jsonschema (with referencing and its dialects) costs ~0.1 s to import,
    # paid only by someone who types a schema, not by every start of the app.
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        return _one_line(f"Not a valid JSON Schema at {exc.json_path}: {exc.message}"), ""
    return "", json.dumps(schema)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_PROBLEM else line[:MAX_PROBLEM - 1] + "…"


def check(text: str) -> str:
    """Why `text` cannot be used as a response schema, in one line; "" when it can (or is
    empty, which turns structured output off)."""
    return _parse(text)[0]


def response_format(text: str) -> dict[str, Any] | None:
    """OpenAI's `response_format` for the schema in `text` (strict), or None when it is empty
    or invalid. The name is the schema's title made into an identifier, else "reply"."""
    problem, canonical = _parse(text)
    if problem or not canonical:
        return None
    schema = json.loads(canonical)  # a fresh copy: the caller may change it
    title = schema.get("title")
    name = _NAME_CHARS.sub("_", title).strip("_")[:64] if isinstance(title, str) else ""
    return {"type": "json_schema",
            "json_schema": {"name": name or DEFAULT_NAME, "schema": schema, "strict": True}}

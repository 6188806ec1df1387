"""Parse server-sent events in tests: `parse_sse(text)` → [(event name or None, data)]."""

from __future__ import annotations

import json
from typing import Any


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    """    >>> parse_sse('event: plan\\ndata: {"a": 1}\\n\\ndata: [DONE]\\n\\n')
    [('plan', {'a': 1}), (None, '[DONE]')]
    """
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        event = None
        data_lines = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                data_lines.append(line[len("data: "):])
        data = "\n".join(data_lines)
        out.append((event, data if data == "[DONE]" else json.loads(data)))
    return out


def chunks(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of an OpenAI stream, checking it ends with [DONE]."""
    events = parse_sse(text)
    assert events[-1] == (None, "[DONE]"), events[-3:]
    return [data for _, data in events[:-1]]

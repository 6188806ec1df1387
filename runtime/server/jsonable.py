"""Turn the engine's frozen dataclasses (and whatever the planner returns) into JSON values.

    >>> from pathlib import Path
    >>> to_jsonable({"path": Path("/m/a.gguf"), "stats": (1, 2.5, float("nan"))})
    {'path': '/m/a.gguf', 'stats': [1, 2.5, None]}
"""

from __future__ import annotations

import dataclasses
import enum
import math
from pathlib import PurePath
from typing import Any


def to_jsonable(value: Any) -> Any:
    """A JSON-ready copy: dataclasses and mappings become dicts, paths strings, enums their
    values, and NaN / infinity `None` (JSON has no spelling for them)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, type):  # the type's own JSON form wins
        return to_jsonable(to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(item) for item in value]
    return str(value)

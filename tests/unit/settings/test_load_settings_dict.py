"""`LoadSettings.from_dict`: the one check of a load-settings dict (a `/api/load` body, a saved
file). Unknown keys, a missing model_path and wrong types are one-line errors naming the key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import SettingsError
from runtime.settings.load import DraftSettings, LoadSettings


@pytest.mark.parametrize(("data", "message"), [
    ([1, 2], "load settings must be a JSON object, not [1, 2]"),
    ({"n_ctx": 512}, "load settings need model_path"),
    ({"model_path": "m.gguf", "turbo": True}, "unknown load setting(s): turbo"),
    ({"model_path": "m.gguf", "turbo": 1, "draft": {"kind": "model", "k": 4, "x": 1}},
     "unknown load setting(s): turbo, draft.x"),
    ({"model_path": "m.gguf", "x\x1b[31m": 1}, "unknown load setting(s): x\\x1b[31m"),
    ({"model_path": 5}, "load setting model_path must be a path, not 5"),
    ({"model_path": ""}, "load setting model_path must be a path, not ''"),
    ({"model_path": "m.gguf", "n_ctx": "big"}, "load setting n_ctx must be a whole number, "
                                               "not 'big'"),
    ({"model_path": "m.gguf", "n_ctx": "4096"}, "n_ctx must be a whole number, not '4096'"),
    ({"model_path": "m.gguf", "gpu_layers": True}, "gpu_layers must be a whole number, not True"),
    ({"model_path": "m.gguf", "gpu_layers": 2.5}, "gpu_layers must be a whole number, not 2.5"),
    ({"model_path": "m.gguf", "use_mmap": "yes"}, "use_mmap must be true or false, not 'yes'"),
    ({"model_path": "m.gguf", "flash_attn": True}, "flash_attn must be one of auto, on, off, "
                                                   "not True"),
    ({"model_path": "m.gguf", "cpu_moe": "most"}, "cpu_moe must be a whole number or one of "
                                                  "all, auto, not 'most'"),
    ({"model_path": "m.gguf", "tensor_split": [1, "a"]}, "tensor_split[1] must be a number"),
    ({"model_path": "m.gguf", "workers": "box:1"}, "workers must be a list, not 'box:1'"),
    ({"model_path": "m.gguf", "draft": "ngram"}, "draft must be an object, not 'ngram'"),
    ({"model_path": "m.gguf", "draft": None}, "draft must be an object, not None"),
    ({"model_path": "m.gguf", "draft": {"k": "4"}}, "load setting draft.k must be a whole "
                                                    "number, not '4'"),
    ({"model_path": "m.gguf", "draft": {"kind": "x"}}, "draft.kind must be one of none, ngram, "
                                                       "model, not 'x'"),
    # Then the values, by the dataclasses' own checks.
    ({"model_path": "m.gguf", "n_ctx": 4}, "context length must be at least 16 tokens, not 4"),
    ({"model_path": "m.gguf", "type_k": "q9"}, "K cache type 'q9' is not one of"),
    ({"model_path": "m.gguf", "draft": {"kind": "model"}}, "a draft model needs its file"),
])
def test_a_bad_dict_is_a_one_line_error_naming_the_key(data: Any, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        LoadSettings.from_dict(data)
    text = str(caught.value)
    assert message in text and text.isprintable()


def test_every_field_is_checked_by_type() -> None:
    """A value no field takes (a list of an object) is refused for each, naming it: no field
    of a type the check does not know, and no TypeError from the dataclass."""
    for cls, prefix in ((LoadSettings, ""), (DraftSettings, "draft.")):
        for f in dataclasses.fields(cls):
            data: dict[str, Any] = {"model_path": "m.gguf"}
            if prefix:
                data["draft"] = {f.name: [{}]}
            else:
                data[f.name] = [{}]
            with pytest.raises(SettingsError, match=rf"^load setting {prefix}{f.name}\b"):
                LoadSettings.from_dict(data)


def test_json_null_is_none_where_a_setting_may_be_none() -> None:
    settings = LoadSettings.from_dict({"model_path": "m.gguf", "gpu_layers": None,
                                       "use_mmap": None, "tensor_split": None,
                                       "draft": {"kind": "ngram", "k": None}})
    assert settings == LoadSettings(model_path=Path("m.gguf"), draft=DraftSettings(kind="ngram"))


def test_what_to_dict_writes_reads_back_through_json() -> None:
    settings = LoadSettings(
        model_path=Path("m.gguf"), n_ctx=8192, gpu_layers=12, type_k="q8_0", type_v="q4_0",
        flash_attn="on", n_threads=4, n_threads_batch=8, n_batch=1024, n_ubatch=256,
        n_parallel=3, use_mmap=False, cpu_moe="all", tensor_split=(3.0, 1.0),
        mmproj_path=Path("mmproj.gguf"), workers=("box:7000",),
        draft=DraftSettings(kind="model", model_path=Path("d.gguf"), k=4, k_max=6, p_min=0.5,
                            verifier="greedy_match"))
    assert LoadSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
    assert LoadSettings.from_dict(settings.to_dict()) == settings  # tuples and all


def test_numbers_are_read_as_their_field_wants() -> None:
    settings = LoadSettings.from_dict({"model_path": "m.gguf", "tensor_split": [3, 1],
                                       "draft": {"kind": "ngram", "p_min": 0}})
    assert settings.tensor_split == (3.0, 1.0) and isinstance(settings.tensor_split[0], float)
    assert settings.draft.p_min == 0.0 and isinstance(settings.draft.p_min, float)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8)
fields = st.sampled_from([f.name for f in dataclasses.fields(LoadSettings)] + ["draft"] * 3)
draft_fields = st.sampled_from([f.name for f in dataclasses.fields(DraftSettings)])
load_dicts = st.one_of(json_values, st.fixed_dictionaries(
    {"model_path": st.one_of(st.just("m.gguf"), json_values)},
    optional={"fields": st.dictionaries(fields, json_values, max_size=4),
              "draft": st.dictionaries(draft_fields, json_values, max_size=4)},
).map(lambda d: {**d.pop("fields", {}), **d}))


@settings(max_examples=400, deadline=None, database=None)
@given(data=load_dicts)
def test_any_json_is_settings_or_a_one_line_settings_error(data: Any) -> None:
    try:
        LoadSettings.from_dict(data)
    except SettingsError as exc:
        assert str(exc).isprintable()

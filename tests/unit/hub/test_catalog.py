"""The curated catalogue: it loads, it is consistent, and a malformed one is refused by name."""

from __future__ import annotations

import copy
import tomllib
from typing import Any

import pytest

from runtime.errors import CatalogError
from runtime.hub.catalog import default_catalog_path, load_catalog, parse_catalog
from runtime.hub.quants import quant_from_name


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return tomllib.loads(default_catalog_path().read_text())


def test_catalogue_loads_with_the_known_good_pairs() -> None:
    cat = load_catalog()
    pairs = {(p.target.repo, p.draft.repo) for p in cat.pairs}
    assert ("bartowski/Qwen2.5-7B-Instruct-GGUF", "Qwen/Qwen2.5-0.5B-Instruct-GGUF") in pairs
    assert ("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", "bartowski/Llama-3.2-1B-Instruct-GGUF") in pairs
    assert ("bartowski/SmolLM2-1.7B-Instruct-GGUF", "bartowski/SmolLM2-135M-Instruct-GGUF") in pairs
    assert cat.reviewed


def test_every_entry_is_complete_and_consistent() -> None:
    cat = load_catalog()
    for m in cat.models:
        assert m.license and m.source and m.name
        assert m.repo.count("/") == 1 and m.repo.endswith("GGUF")
        for quant, filename in m.files.items():
            assert quant_from_name(filename) == quant, (m.id, filename)  # the key is the file's quant
        assert m.pull_spec == f"{m.repo}:{m.default_quant}"
    for p in cat.pairs:
        assert p.draft.params_b < p.target.params_b and p.basis and p.source


def test_memory_tiers() -> None:
    cat = load_catalog()
    small = cat.for_memory(4 << 30, role="chat")
    assert small and all(m.tier_gb <= 4 for m in small)
    big = cat.for_memory(64 << 30, role="chat")
    assert big[0].id == "llama-3.3-70b-instruct"
    assert [m.tier_gb for m in big] == sorted((m.tier_gb for m in big), reverse=True)
    assert cat.for_memory(256 << 20) == []
    assert [d.id for d in cat.drafts_for("llama-3.1-8b-instruct")] == ["llama-3.2-1b-instruct"]
    assert cat.model("Qwen/Qwen2.5-0.5B-Instruct-GGUF").id == "qwen2.5-0.5b-instruct"
    with pytest.raises(CatalogError):
        cat.model("nope")


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["model"][0].update(colour="red"), "unknown key"),
    (lambda d: d["model"][0].pop("license"), "lacks license"),
    (lambda d: d["model"][0].update(default_quant="Q2_K"), "has no file"),
    (lambda d: d["model"][0].update(role="judge"), "role"),
    (lambda d: d["model"][0].update(repo="no-owner"), "owner/name"),
    (lambda d: d["pair"][0].update(draft="ghost"), "unknown model"),
    (lambda d: d["pair"].append({"target": "qwen2.5-0.5b-instruct", "draft": "qwen2.5-7b-instruct"}),
     "smaller"),
    (lambda d: d.update(schema=2), "schema"),
    (lambda d: d["model"].append(dict(d["model"][0])), "twice"),
])
def test_malformed_catalogue_is_refused_by_name(raw: dict[str, Any], mutate: Any, message: str) -> None:
    data = copy.deepcopy(raw)
    mutate(data)
    with pytest.raises(CatalogError, match=message):
        parse_catalog(data)

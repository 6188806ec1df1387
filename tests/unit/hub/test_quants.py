"""Quant listing: grouping, the quant read from the header (not the name), fit verdicts from
the planner, the recommendation, and the header cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.errors import OutriderError
from runtime.hub.client import Hub, RepoFile
from runtime.hub.quants import (
    QuantEntry,
    group_gguf_files,
    list_quants,
    quant_from_name,
    recommend,
)
from runtime.planner.devices import Device
from runtime.settings.load import LoadSettings
from tests.hubserver import TINY_REPO, FakeHub
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)

PLENTY = [Device("cpu", "test cpu", "cpu", 64 << 30, 32 << 30)]
NOTHING_FREE = [Device("cpu", "test cpu", "cpu", 64 << 30, 1 << 20)]


@pytest.mark.parametrize(("name", "quant"), [
    ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
    ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    ("gemma-2-9b-it-IQ2_XXS.gguf", "IQ2_XXS"),
    ("model-IQ4_XS-00001-of-00002.gguf", "IQ4_XS"),
    ("Qwen2.5-7B-Instruct-f16.gguf", "F16"),
    ("Qwen2.5-7B-Instruct.gguf", None),
])
def test_quant_from_name(name: str, quant: str | None) -> None:
    assert quant_from_name(name) == quant


def test_split_files_group_into_one_model_in_part_order() -> None:
    files = [RepoFile("m-Q8_0-00002-of-00002.gguf", 5), RepoFile("README.md", 1),
             RepoFile("m-Q4_K_M.gguf", 3), RepoFile("m-Q8_0-00001-of-00002.gguf", 7),
             RepoFile("big-Q2_K-00001-of-00003.gguf", 2)]
    groups = group_gguf_files(files)
    assert [[f.name for f in g] for g in groups] == [
        ["big-Q2_K-00001-of-00003.gguf"],  # incomplete: still one entry, flagged later
        ["m-Q4_K_M.gguf"],
        ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"],
    ]


def test_listing_reads_each_quant_from_its_header(fake_hub: FakeHub) -> None:  # noqa: F811
    listing = list_quants(Hub(), TINY_REPO, devices=PLENTY)
    by_name = {e.name: e for e in listing.entries}
    assert sorted(by_name) == ["tiny-F32.gguf", "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"]
    # The file named Q4_K_M is really F16: the header says so, the listing believes the header.
    lying = by_name["tiny-Q4_K_M.gguf"]
    assert (lying.quant, lying.quant_source) == ("F16", "header")
    assert lying.bits_per_weight is not None and 15.9 < lying.bits_per_weight < 16.5
    split = by_name["tiny-Q8_0.gguf"]
    assert [f.name for f in split.files] == ["tiny-Q8_0-00001-of-00002.gguf",
                                             "tiny-Q8_0-00002-of-00002.gguf"]
    assert split.size == sum(f.size or 0 for f in split.files)
    assert split.quant == "F32" and split.complete
    assert split.n_params == by_name["tiny-F32.gguf"].n_params  # all parts were read
    assert split.bits_per_weight == pytest.approx(32.0, abs=0.1)


def test_fit_verdict_and_breakdown_come_from_the_planner(fake_hub: FakeHub) -> None:  # noqa: F811
    listing = list_quants(Hub(), TINY_REPO, devices=PLENTY,
                          settings=LoadSettings(model_path=Path("x.gguf"), n_ctx=2048))
    for e in listing.entries:
        assert e.verdict == "cpu_only" and e.fits is True
        assert e.fit is not None and e.fit["n_ctx"] == 2048
        assert e.fit["weights"] > 0 and e.fit["kv"] > 0 and e.fit["compute"] > 0
        assert e.summary and e.summary.startswith("CPU only")
    smaller_kv = list_quants(Hub(), TINY_REPO, devices=PLENTY, settings=LoadSettings(
        model_path=Path("x.gguf"), n_ctx=2048, type_k="q8_0", type_v="q8_0"))
    assert smaller_kv.entries[0].fit["kv"] < listing.entries[0].fit["kv"]  # type: ignore[index]


def test_nothing_fits_means_no_recommendation(fake_hub: FakeHub) -> None:  # noqa: F811
    listing = list_quants(Hub(), TINY_REPO, devices=NOTHING_FREE)
    assert {e.verdict for e in listing.entries} == {"wont_fit"}
    assert listing.recommended is None
    assert "fits" in listing.recommended_reason


def test_headers_are_cached_by_revision(fake_hub: FakeHub, tmp_path: Path) -> None:  # noqa: F811
    list_quants(Hub(), TINY_REPO, devices=PLENTY, cache_dir=tmp_path)
    gets_before = fake_hub.stats(TINY_REPO, "tiny-F32.gguf").gets
    assert gets_before >= 1
    again = list_quants(Hub(), TINY_REPO, devices=PLENTY, cache_dir=tmp_path)
    assert fake_hub.stats(TINY_REPO, "tiny-F32.gguf").gets == gets_before
    assert {e.quant for e in again.entries} == {"F32", "F16"}
    # A new commit is a new cache key: the changed file's header is read again.
    fake_hub.update_file(TINY_REPO, "tiny-F32.gguf",
                         fake_hub.repo(TINY_REPO).files("main")["tiny-Q4_K_M.gguf"].data)  # type: ignore[index]
    after = list_quants(Hub(), TINY_REPO, devices=PLENTY, cache_dir=tmp_path)
    assert {e.name: e.quant for e in after.entries}["tiny-F32.gguf"] == "F16"


def test_unreadable_header_falls_back_to_the_name_and_says_so(fake_hub: FakeHub) -> None:  # noqa: F811
    fake_hub.add_repo("odd/Broken-GGUF", {"broken-Q5_K_M.gguf": b"this is not a gguf file"})
    [entry] = list_quants(Hub(), "odd/Broken-GGUF", devices=PLENTY).entries
    assert (entry.quant, entry.quant_source) == ("Q5_K_M", "name")
    assert entry.error and entry.fits is None


def test_listing_entry_lookup(fake_hub: FakeHub) -> None:  # noqa: F811
    listing = list_quants(Hub(), TINY_REPO, devices=PLENTY)
    assert listing.entry("F16").name == "tiny-Q4_K_M.gguf"
    assert listing.entry("Q8_0").name == "tiny-Q8_0.gguf"  # what the name claims, as a fallback
    assert listing.entry("tiny-Q8_0-00002-of-00002.gguf").name == "tiny-Q8_0.gguf"
    with pytest.raises(OutriderError, match="no Q5_K_M"):
        listing.entry("Q5_K_M")


def _e(quant: str, fits: bool | None, size: int = 1, name: str | None = None,
       parts: int = 1) -> QuantEntry:
    files = tuple(RepoFile(f"{name or quant}-{i}.gguf", size) for i in range(parts))
    return QuantEntry("o/r", "sha", name or f"m-{quant}.gguf", files, quant, "header",
                      size * parts, verdict=None if fits is None else ("cpu_only" if fits else "wont_fit"),
                      fits=fits)


def test_recommendation_walks_down_from_the_preferred_level_then_up() -> None:
    entries = [_e("Q8_0", True, 8), _e("Q4_K_M", True, 4), _e("Q3_K_M", True, 3)]
    assert recommend(entries, "Q4_K_M")[0].quant == "Q4_K_M"  # type: ignore[union-attr]
    assert recommend(entries, "Q6_K")[0].quant == "Q4_K_M"  # type: ignore[union-attr]  # absent → smaller
    assert recommend(entries, "Q8_0")[0].quant == "Q8_0"  # type: ignore[union-attr]
    tight = [_e("Q8_0", False, 8), _e("Q4_K_M", False, 4), _e("Q3_K_M", True, 3)]
    best, why = recommend(tight, "Q8_0")
    assert best is not None and best.quant == "Q3_K_M" and "nearest" in why
    only_bigger = [_e("Q8_0", True, 8), _e("Q2_K", False, 2)]
    assert recommend(only_bigger, "Q3_K_M")[0].quant == "Q8_0"  # type: ignore[union-attr]


def test_recommendation_skips_projectors_and_incomplete_splits() -> None:
    entries = [_e("Q4_K_M", True, 1, name="mmproj-Q4_K_M.gguf"),
               dataclass_replace(_e("Q4_K_M", True, 4, name="m-Q4_K_M.gguf", parts=1), n_parts_expected=2),
               _e("Q8_0", True, 8)]
    best, _ = recommend(entries, "Q4_K_M")
    assert best is not None and best.quant == "Q8_0"
    with pytest.raises(OutriderError):
        recommend(entries, "Q7_X")


def dataclass_replace(entry: QuantEntry, **changes: object) -> QuantEntry:
    import dataclasses

    return dataclasses.replace(entry, **changes)  # type: ignore[arg-type]

"""Vision models, Hub to load: the quant table pairs a repository's projectors with its models
(the fit counts the chosen one), `outrider pull` and Ollama's `/api/pull` fetch it with the
model through the download manager, the library keeps the pair, loads pick the projector up
without being told, and a vision model without its projector says so."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.cli.main import build_parser, main
from runtime.gguf.info import read_model_info
from runtime.gguf.projector import read_projector_info
from runtime.hub.client import Hub
from runtime.hub.quants import entry_by_name, list_quants
from runtime.library.library import Library
from runtime.library.projectors import (
    preferred_projector,
    projector_for,
    vision_capable,
    with_projector,
)
from runtime.paths import user_dirs
from runtime.planner.devices import Device
from runtime.planner.plan import plan_memory
from runtime.server.dialects.ollama.pull import plan_pull, pull_lines
from runtime.server.serve import remembered_settings
from runtime.settings.load import LoadSettings
from runtime.units import fmt_bytes
from tests.hubserver import (
    TINY_REPO,
    VISION_MODEL,
    VISION_PROJECTOR,
    VISION_REPO,
    FakeHub,
    add_vision_repo,
)
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)

PLENTY = [Device("cpu", "test cpu", "cpu", 64 << 30, 32 << 30)]


@pytest.fixture
def vision_hub(fake_hub: FakeHub) -> FakeHub:  # noqa: F811
    add_vision_repo(fake_hub)
    return fake_hub


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def library_pair(root: Path, target: Path, mmproj: Path | None) -> Path:
    folder = root / VISION_REPO
    folder.mkdir(parents=True, exist_ok=True)
    (folder / VISION_MODEL).write_bytes(target.read_bytes())
    if mmproj is not None:
        (folder / VISION_PROJECTOR).write_bytes(mmproj.read_bytes())
    return folder / VISION_MODEL


# -- the quant table ----------------------------------------------------------------------------


def test_quant_table_pairs_the_f16_projector_and_counts_it(vision_hub: FakeHub, tiny_target: Path,
                                                           tiny_mmproj: Path) -> None:
    settings = LoadSettings(model_path=Path("x.gguf"), n_ctx=2048)
    listing = list_quants(Hub(), VISION_REPO, devices=PLENTY, settings=settings)
    assert [e.name for e in listing.entries] == [VISION_MODEL]  # projectors are no entries
    [entry] = listing.entries
    assert listing.projector is not None and entry.projector is not None
    assert entry.projector.name == VISION_PROJECTOR  # F16 of the two, though not the smallest
    assert entry.projector.n_available == 2
    assert entry.projector.label == f"vision: projector F16, {fmt_bytes(tiny_mmproj.stat().st_size)}"
    assert [f.name for f in entry.download_files] == [VISION_MODEL, VISION_PROJECTOR]
    # The fit is the planner's with the projector: its weights, compute and image tokens.
    projector = read_projector_info(tiny_mmproj)
    expected = plan_memory(read_model_info(tiny_target), settings, PLENTY, projector=projector)
    assert entry.fit is not None
    assert entry.fit["total"] == expected.total
    assert entry.fit["image_tokens"] == projector.image_tokens == 64
    without = plan_memory(read_model_info(tiny_target), settings, PLENTY)
    assert entry.fit["weights"] - without.weights == projector.tensor_bytes
    assert any("each image takes 64 tokens" in n for n in entry.fit["notes"])
    # A repository without projectors: no vision, no change.
    plain = list_quants(Hub(), TINY_REPO, devices=PLENTY)
    assert plain.projector is None and all(e.projector is None for e in plain.entries)


def test_projector_headers_are_cached_like_the_models(vision_hub: FakeHub, tmp_path: Path) -> None:
    list_quants(Hub(), VISION_REPO, devices=PLENTY, cache_dir=tmp_path)
    gets = vision_hub.stats(VISION_REPO, VISION_PROJECTOR).gets
    assert gets >= 1
    again = list_quants(Hub(), VISION_REPO, devices=PLENTY, cache_dir=tmp_path)
    assert vision_hub.stats(VISION_REPO, VISION_PROJECTOR).gets == gets  # read from the cache
    assert again.projector is not None and again.projector.info is not None
    assert again.projector.info.image_tokens == 64


def test_show_prints_the_projector_and_its_image_tokens(vision_hub: FakeHub,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", VISION_REPO, "--ctx", "1024")
    assert code == 0
    table = [ln for ln in out.splitlines() if ln.endswith(".gguf")]
    assert len(table) == 1 and table[0].endswith(VISION_MODEL)  # no row for a projector
    assert "vision: projector F16" in out and f"{VISION_PROJECTOR}, 1 of 2" in out
    assert "each image takes 64 tokens" in out
    code, out, _ = run(capsys, "show", VISION_REPO, "--json")
    data = json.loads(out)
    assert data["projector"]["file"] == VISION_PROJECTOR and data["projector"]["image_tokens"] == 64
    assert data["entries"][0]["projector"] == VISION_PROJECTOR


def test_a_name_picks_a_model_with_its_projector_or_a_projector_alone(vision_hub: FakeHub) -> None:
    details = Hub().repo_details(VISION_REPO)
    by_quant = entry_by_name(details, "f32")
    assert by_quant is not None and by_quant.name == VISION_MODEL  # never mmproj-…-F32 by quant
    assert [f.name for f in by_quant.download_files] == [VISION_MODEL, VISION_PROJECTOR]
    alone = entry_by_name(details, "mmproj-tiny-vision-F32.gguf")
    assert alone is not None and [f.name for f in alone.download_files] == [alone.name]


# -- downloading ------------------------------------------------------------------------------


def test_pull_fetches_the_projector_too_and_the_library_keeps_the_pair(
        vision_hub: FakeHub, capsys: pytest.CaptureFixture[str], tiny_mmproj: Path) -> None:
    code, out, err = run(capsys, "pull", f"{VISION_REPO}:F32")
    assert code == 0, err
    folder = user_dirs().models / VISION_REPO
    assert out.split() == [str(folder / VISION_MODEL), str(folder / VISION_PROJECTOR)]
    assert err.count("verified (sha256)") == 2
    assert (folder / VISION_PROJECTOR).read_bytes() == tiny_mmproj.read_bytes()
    assert vision_hub.stats(VISION_REPO, "mmproj-tiny-vision-F32.gguf").gets == 0

    [model] = Library().scan()  # the projector is no model of its own
    assert model.path == folder / VISION_MODEL
    assert model.projector == folder / VISION_PROJECTOR
    assert model.capabilities == ("vision",) and not model.projector_missing
    code, out, _ = run(capsys, "ls")
    assert code == 0 and out.splitlines()[1].rstrip().endswith("vision")
    code, out, _ = run(capsys, "ls", "--json")
    [listed] = json.loads(out)
    assert listed["projector"] == str(folder / VISION_PROJECTOR)
    assert listed["capabilities"] == ["vision"] and listed["projector_missing"] is False

    # The projector deleted: the next pull fetches it alone, not the model again.
    (folder / VISION_PROJECTOR).unlink()
    model_gets = vision_hub.stats(VISION_REPO, VISION_MODEL).gets
    code, out, err = run(capsys, "pull", f"{VISION_REPO}:F32")
    assert code == 0, err
    assert (folder / VISION_PROJECTOR).is_file()
    assert vision_hub.stats(VISION_REPO, VISION_MODEL).gets == model_gets
    code, _, err = run(capsys, "pull", f"{VISION_REPO}:F32")
    assert code == 0 and "already in the library" in err


def test_ollama_pull_streams_both_files(vision_hub: FakeHub, tmp_path: Path) -> None:
    models = tmp_path / "models"

    async def lines() -> list[dict[str, Any]]:
        plan = plan_pull(f"hf.co/{VISION_REPO}:F32", models)
        return [line async for line in pull_lines(plan)]

    got = asyncio.run(lines())
    assert got[0] == {"status": "pulling manifest"} and got[-1] == {"status": "success"}
    assert (models / VISION_REPO / VISION_MODEL).is_file()
    assert (models / VISION_REPO / VISION_PROJECTOR).is_file()
    digests = {line["digest"] for line in got if "digest" in line}
    assert len(digests) == 2  # one "pulling <digest>" series per file


def test_deleting_the_last_model_takes_its_projector(tiny_target: Path, tiny_mmproj: Path) -> None:
    library = Library()
    path = library_pair(library.models_dir, tiny_target, tiny_mmproj)
    removed = library.delete(library.find(VISION_MODEL))
    assert set(removed) == {path, path.with_name(VISION_PROJECTOR)}
    assert not path.parent.exists()


# -- loading ----------------------------------------------------------------------------------


def test_loads_set_the_projector_when_none_is_given(tiny_target: Path, tiny_mmproj: Path,
                                                    tmp_path: Path) -> None:
    path = library_pair(Library().models_dir, tiny_target, tiny_mmproj)
    paired = path.with_name(VISION_PROJECTOR)
    assert projector_for(path) == paired
    assert projector_for(paired) is None  # a projector pairs with nothing
    assert with_projector(LoadSettings(model_path=path)).mmproj_path == paired
    chosen = tmp_path / "mmproj-other.gguf"
    assert with_projector(LoadSettings(model_path=path, mmproj_path=chosen)).mmproj_path == chosen
    assert remembered_settings(path).mmproj_path == paired  # the server's just-in-time load
    # `outrider run MODEL` without --mmproj, and `outrider serve MODEL`.
    from runtime.cli.run import _settings as run_settings
    from runtime.cli.serve import load_settings_from_args

    args = build_parser().parse_args(["run", str(path), "-p", "hi"])
    assert run_settings(args).mmproj_path == paired
    served = load_settings_from_args(build_parser().parse_args(["serve", str(path)]))
    assert served is not None and served.mmproj_path == paired
    # A file outside the library loads as given, whatever lies beside it (the test models'
    # folder holds projectors for other models too): --mmproj names its projector.
    assert with_projector(LoadSettings(model_path=tiny_target)).mmproj_path is None
    args = build_parser().parse_args(["run", str(tiny_target), "-p", "hi"])
    assert run_settings(args).mmproj_path is None


def test_info_and_plan_count_the_projector_beside_the_model(
        tiny_target: Path, tiny_mmproj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = library_pair(Library().models_dir, tiny_target, tiny_mmproj)
    code, out, _ = run(capsys, "plan", str(path), "--ctx", "1024", "--json")
    assert json.loads(out)["image_tokens"] == 64
    code, out, _ = run(capsys, "plan", str(path), "--ctx", "1024", "--json", "--no-mmproj")
    assert json.loads(out)["image_tokens"] == 0
    code, out, _ = run(capsys, "info", str(path))
    assert code == 0 and "vision" in out and "64 tokens per image" in out
    assert "the vision projector takes" in out


# -- a missing projector ----------------------------------------------------------------------


def fake_info(architecture: str, n_params: int) -> Any:
    return lambda _path: SimpleNamespace(
        architecture=architecture, name="x", quant="Q4_K_M", n_params=n_params, n_ctx_train=8192,
        n_vocab=262_144, n_tokens=262_144, vocab_fingerprint="f", tensor_bytes=1, split_count=1)


def test_a_vision_architecture_without_its_projector_says_so(
        tiny_target: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    library = Library(read_info=fake_info("gemma3", 3_880_000_000))
    library_pair(library.models_dir, tiny_target, None)
    [model] = library.scan()
    assert model.vision and model.projector is None and model.projector_missing
    assert model.capabilities == ()
    small = Library(cache_dir=user_dirs().cache / "other", read_info=fake_info("gemma3", 10**9))
    assert not small.scan()[0].projector_missing  # Gemma 3 1B reads text only

    import runtime.cli.hub as cli_hub

    monkeypatch.setattr(cli_hub, "Library", lambda _d=None: library)
    code, out, _ = run(capsys, "ls")
    assert code == 0
    assert out.splitlines()[1].rstrip().endswith("vision: no projector")
    assert "outrider pull OWNER/REPO:mmproj-" in out


def test_the_pairing_rule() -> None:
    files = [("mmproj-F32.gguf", 1600), ("mmproj-BF16.gguf", 800), ("mmproj-model-f16.gguf", 810)]
    assert preferred_projector(files, name=lambda f: f[0], size=lambda f: f[1]) == files[2]
    no_f16 = files[:2]
    assert preferred_projector(no_f16, name=lambda f: f[0], size=lambda f: f[1]) == files[1]
    assert preferred_projector([], name=str, size=len) is None
    assert vision_capable("qwen2vl") and vision_capable("gemma3", 4 * 10**9)
    assert not vision_capable("gemma3", 10**9) and not vision_capable("llama", 8 * 10**9)

"""`outrider search | show | pull | ls | rm` through runtime.cli.main.main, against the fake hub."""

from __future__ import annotations

import json

import pytest

from runtime.cli.main import main
from runtime.downloads.manager import DownloadManager
from runtime.hub.client import Hub
from runtime.paths import user_dirs
from tests.hubserver import GATED_REPO, GATED_TOKEN, TINY_REPO, FakeHub, Fault
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_search(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, out, _ = run(capsys, "search", "tiny", "--sort", "likes")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["REPOSITORY", "DOWNLOADS", "LIKES", "UPDATED"]
    assert [ln.split()[0] for ln in lines[1:]] == ["tiny/Tiny-Draft-GGUF", TINY_REPO, GATED_REPO]
    assert lines[-1].endswith("gated")
    code, out, _ = run(capsys, "search", "--author", "gated")
    assert [ln.split()[0] for ln in out.splitlines()[1:]] == [GATED_REPO]


def test_show_prints_the_quant_table_with_fit(fake_hub: FakeHub,  # noqa: F811
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", TINY_REPO, "--ctx", "1024")
    assert code == 0
    assert "license apache-2.0" in out and fake_hub.repo(TINY_REPO).head[:12] in out
    rows = {ln.split()[-1] if "parts" not in ln else "tiny-Q8_0.gguf": ln
            for ln in out.splitlines() if ".gguf" in ln and "recommended" not in ln}
    assert " F16 " in rows["tiny-Q4_K_M.gguf"]  # the header's quant, not the name's
    assert "CPU only" in rows["tiny-F32.gguf"] or "Won't fit" in rows["tiny-F32.gguf"]
    assert "(2 parts)" in out
    assert "recommended:" in out


def test_pull_downloads_with_progress_and_verifies(fake_hub: FakeHub,  # noqa: F811
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fake_hub.set_fault(TINY_REPO, "tiny-F32.gguf", Fault(drop_at=300_000))
    code, out, err = run(capsys, "pull", f"{TINY_REPO}:F32")
    assert code == 0, err
    path = user_dirs().models / "tiny/Tiny-GGUF/tiny-F32.gguf"
    assert out.strip() == str(path) and path.is_file()
    assert "retrying" in err and "verified" in err
    assert fake_hub.stats(TINY_REPO, "tiny-F32.gguf").bytes_sent == path.stat().st_size
    code, out, err = run(capsys, "pull", f"{TINY_REPO}:tiny-F32.gguf")
    assert code == 0 and "already in the library" in err
    assert fake_hub.stats(TINY_REPO, "tiny-F32.gguf").gets == 2  # nothing fetched again


def test_pull_fetches_only_its_own_files(fake_hub: FakeHub,  # noqa: F811
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The app queued another file and is not running: pull of F32 fetches F32 alone, and
    leaves the app's job queued on file, as it was, for the app."""
    queue = user_dirs().downloads / "queue.json"
    app = DownloadManager(Hub())  # never started
    theirs = app.enqueue(TINY_REPO, "tiny-Q4_K_M.gguf")
    app.shutdown()
    [before] = json.loads(queue.read_text())["jobs"]
    code, out, err = run(capsys, "pull", f"{TINY_REPO}:F32")
    assert code == 0, err
    assert out.strip() == str(user_dirs().models / "tiny/Tiny-GGUF/tiny-F32.gguf")
    other = fake_hub.stats(TINY_REPO, "tiny-Q4_K_M.gguf")
    assert (other.heads, other.gets, other.bytes_sent) == (0, 0, 0)  # not a request for it
    after = {j["id"]: j for j in json.loads(queue.read_text())["jobs"]}
    assert after[theirs.id] == before and before["state"] == "queued"
    assert [j["state"] for i, j in after.items() if i != theirs.id] == ["done"]


def test_pull_a_split_model_by_quant(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, out, _ = run(capsys, "pull", f"{TINY_REPO}:Q8_0")
    assert code == 0
    assert [p.rsplit("/", 1)[1] for p in out.split()] == [
        "tiny-Q8_0-00001-of-00002.gguf", "tiny-Q8_0-00002-of-00002.gguf"]


def test_pull_gated_needs_a_token(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, _, err = run(capsys, "pull", f"{GATED_REPO}:F32")
    assert code == 2 and "gated" in err and "token" in err
    code, out, err = run(capsys, "pull", f"{GATED_REPO}:F32", "--token", GATED_TOKEN)
    assert code == 0, err
    assert GATED_TOKEN not in out + err


def test_pull_unknown_quant_and_repo(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, _, err = run(capsys, "pull", f"{TINY_REPO}:Q5_K_M")
    assert code == 2 and "no Q5_K_M" in err
    code, _, err = run(capsys, "pull", "nobody/Nothing-GGUF")
    assert code == 2 and "not found" in err
    code, _, err = run(capsys, "pull", "not-a-repo")
    assert code == 2 and "owner/name" in err


def test_ls_and_rm(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, out, _ = run(capsys, "ls")
    assert code == 0 and "no models" in out
    run(capsys, "pull", f"{TINY_REPO}:F32")
    code, out, _ = run(capsys, "ls")
    assert "tiny/Tiny-GGUF/tiny-F32.gguf" in out and "F32" in out
    code, _, err = run(capsys, "rm", "tiny-F32")
    assert code == 2 and "--yes" in err  # not interactive: refuses without --yes
    code, out, _ = run(capsys, "rm", "tiny-F32", "--yes")
    assert code == 0 and "deleted" in out
    assert not (user_dirs().models / "tiny/Tiny-GGUF/tiny-F32.gguf").exists()
    code, _, err = run(capsys, "rm", "tiny-F32", "--yes")
    assert code == 2 and "no model" in err


def test_defaults_come_from_the_app_settings(fake_hub: FakeHub,  # noqa: F811
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.settings.user import AppSettings, FitDefaults, Secret, SettingsStore

    SettingsStore().save(AppSettings(hf_token=Secret(GATED_TOKEN),
                                     fit=FitDefaults(n_ctx=2048, type_k="q8_0", type_v="q8_0")))
    code, out, _ = run(capsys, "show", TINY_REPO)
    assert code == 0 and "fit for context 2,048, K cache q8_0, V cache q8_0" in out
    code, out, err = run(capsys, "pull", f"{GATED_REPO}:F32")  # the saved token, no --token
    assert code == 0, err
    assert GATED_TOKEN not in out + err

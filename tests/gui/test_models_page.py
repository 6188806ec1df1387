"""The Models page against the fake hub: search, a repository's quants with fit badges, a
download with live progress paused and resumed, the library, Load; a gated repository asks
for a token; the queue survives a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.fit_badge import badge_text, badge_tooltip
from app.models.models_page import DOWNLOADS, LIBRARY, REPOSITORY, ModelsPage
from app.qt import QtCore, QtGui
from app.services.models import ModelServices
from app.services.settings import SettingsController
from runtime.hub.client import Hub
from runtime.library.library import LibraryModel
from runtime.paths import user_dirs
from runtime.settings.load import LoadSettings
from tests.gui.model_helpers import Devices, GiB, cpu, gpu, make_services
from tests.hubserver import GATED_REPO, GATED_TOKEN, TINY_REPO, FakeHub, Fault

FILE = "tiny-F32.gguf"
pytest_plugins = ["tests.gui.model_fixtures"]  # its fixtures: hub, services, settings_ctl ...
WAIT = 20_000


@pytest.fixture
def page(qtbot, services: ModelServices) -> ModelsPage:
    asked: list[str] = []
    p = ModelsPage(services, ask_token=lambda _parent, repo: asked.append(repo) or None,
                   debounce_ms=30)
    p.asked = asked  # type: ignore[attr-defined]
    qtbot.addWidget(p)
    return p


def open_tiny_repo(qtbot, page: ModelsPage, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    search = Hub.search

    def counting(self: Hub, text: str = "", *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(text)
        return search(self, text, *args, **kwargs)

    monkeypatch.setattr(Hub, "search", counting)
    qtbot.keyClicks(page.discover.search, "tiny")
    qtbot.waitUntil(lambda: TINY_REPO in page.discover.hit_ids(), timeout=WAIT)
    assert calls == ["tiny"]  # typed quickly: one search after the pause, not four
    assert page.discover.hit_ids()[0] == TINY_REPO  # most downloaded first
    row = page.discover.hit_ids().index(TINY_REPO)
    page.discover.results.cellActivated.emit(row, 0)
    assert page.currentIndex() == REPOSITORY
    qtbot.waitUntil(lambda: page.repo.listing is not None, timeout=WAIT)


def test_search_open_download_pause_resume_library_load(
        qtbot, page: ModelsPage, services: ModelServices, hub: FakeHub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    open_tiny_repo(qtbot, page, monkeypatch)
    rows = {r["file"].split(" ")[0]: r for r in page.repo.rows()}
    assert set(rows) == {"tiny-F32.gguf", "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"}
    assert rows["tiny-Q8_0.gguf"]["file"].endswith("(2 parts)")
    assert all(r["fit"] == "CPU only" for r in rows.values())
    # The header, not the name, says what a file is; the recommendation is marked.
    assert rows["tiny-Q4_K_M.gguf"]["quant"] == "★ F16"
    assert [r["quant"].startswith("★") for r in rows.values()].count(True) == 1
    tip = rows[FILE]["tooltip"]
    assert "Weights:" in tip and "at 4,096 tokens, K f16 / V f16" in tip and "Test CPU" in tip

    hub.set_fault(TINY_REPO, FILE, Fault(stall_at=400_000, stall_seconds=60))
    hub.reset_stats()  # the listing read the header; count the download alone
    qtbot.mouseClick(page.repo.button_for(FILE), QtCore.Qt.MouseButton.LeftButton)
    downloads = page.downloads
    qtbot.waitUntil(lambda: len(downloads.jobs) == 1, timeout=WAIT)
    job_id = next(iter(downloads.jobs))
    # Live progress: the bar moves before the file is complete.
    qtbot.waitUntil(lambda: downloads.progress_of(job_id)[0] > 0, timeout=WAIT)
    assert downloads.state_of(job_id) == "running"
    assert page.tabText(DOWNLOADS) == "Downloads (1)"
    assert page.repo.button_for(FILE).text() == "Queued"

    qtbot.mouseClick(downloads.button(job_id, "pause"), QtCore.Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: downloads.state_of(job_id) == "paused", timeout=WAIT)
    assert downloads.button(job_id, "resume") is not None
    hub.release_stalls()
    qtbot.mouseClick(downloads.button(job_id, "resume"), QtCore.Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(downloads.finished, timeout=WAIT) as done:
        pass
    assert done.args[0].id == job_id
    value, maximum = downloads.progress_of(job_id)
    assert value == maximum > 0
    # The resume asked only for what the partial file lacked (bytes still in flight when
    # the pause came were dropped, not written); the manager verified the sha256.
    first, resumed = hub.stats(TINY_REPO, FILE).ranges
    assert first is None and resumed is not None
    assert 0 < int(resumed.removeprefix("bytes=").rstrip("-")) <= 400_000

    library = page.library
    path = user_dirs().models / TINY_REPO / FILE
    qtbot.waitUntil(lambda: any(m.path == path for m in library.models), timeout=WAIT)
    qtbot.waitUntil(lambda: page.repo.button_for(FILE).text() == "In library", timeout=WAIT)
    page.setCurrentIndex(LIBRARY)
    library.select(path)
    row = [m.path for m in library.models].index(path)
    assert library.table.item(row, 2).text() == "llama"
    assert library.table.item(row, 4).text() == "F32"
    with qtbot.waitSignal(page.load_requested, timeout=WAIT) as loaded:
        qtbot.mouseClick(library.buttons["load"], QtCore.Qt.MouseButton.LeftButton)
    assert loaded.args[0] == LoadSettings(model_path=path, n_ctx=4096)


def test_fit_badges_follow_the_devices(qtbot, page: ModelsPage, devices: Devices,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    devices.now = [gpu(24 * GiB), cpu()]
    open_tiny_repo(qtbot, page, monkeypatch)
    assert {r["fit"] for r in page.repo.rows()} == {"Full GPU"}
    assert "Test GPU: needs" in page.repo.rows()[0]["tooltip"]
    devices.now = [cpu(free=1 << 20)]
    page.repo.open_repo(TINY_REPO)
    qtbot.waitUntil(lambda: page.repo.listing is not None, timeout=WAIT)
    assert {r["fit"] for r in page.repo.rows()} == {"Won't fit"}


def test_partial_badge_and_tooltip_text() -> None:
    fit = {"verdict": "partial", "gpu_layers": 20, "n_layers": 33, "weights": 4 * GiB,
           "kv": 512 << 20, "compute": 300 << 20, "overhead": 0, "total": 5 * GiB, "n_ctx": 8192,
           "kv_types": "K q8_0 / V q8_0", "max_context": 16384,
           "devices": [{"name": "RTX", "total": 3 * GiB, "free_bytes": 4 * GiB}]}
    assert badge_text(fit) == "Partial 20 of 33"
    tip = badge_tooltip(fit)
    assert "KV cache: 512 MiB at 8,192 tokens, K q8_0 / V q8_0" in tip
    assert "RTX: needs 3.00 GiB of 4.00 GiB free" in tip
    assert "Largest context that fits: 16,384 tokens" in tip
    assert badge_text(None) == "Unknown"
    assert "could not be checked: boom" in badge_tooltip(None, "boom")


def test_gated_repo_asks_for_a_token_and_keeps_it(
        qtbot, services: ModelServices, settings_ctl: SettingsController, hub: FakeHub) -> None:
    asked: list[str] = []

    def answer(_parent, repo_id: str) -> str:
        asked.append(repo_id)
        return GATED_TOKEN

    page = ModelsPage(services, ask_token=answer)
    qtbot.addWidget(page)
    page.open_repo(GATED_REPO)
    qtbot.waitUntil(lambda: page.repo.listing is not None, timeout=WAIT)
    assert asked == [GATED_REPO]
    assert settings_ctl.settings.token() == GATED_TOKEN
    assert services.hub.has_token
    [row] = page.repo.rows()
    assert row["fit"] == "CPU only"  # the header was readable with the token
    assert "Access: gated (token set)" in page.repo.facts.text()
    qtbot.waitUntil(lambda: not settings_ctl.pending, timeout=WAIT)
    secrets = settings_ctl.store.secrets_path
    assert GATED_TOKEN in secrets.read_text()
    assert GATED_TOKEN not in settings_ctl.store.path.read_text()

    page.repo.button_for("tiny-gated-F32.gguf").click()
    with qtbot.waitSignal(page.downloads.finished, timeout=WAIT):
        pass
    assert (user_dirs().models / GATED_REPO / "tiny-gated-F32.gguf").is_file()


def test_gated_repo_without_an_answer_says_what_is_needed(qtbot, page: ModelsPage) -> None:
    page.open_repo(GATED_REPO)
    qtbot.waitUntil(lambda: page.asked == [GATED_REPO], timeout=WAIT)  # type: ignore[attr-defined]
    assert "is gated" in page.repo.status.text()
    assert not page.repo.token_button.isHidden()
    assert page.repo.rows() == []


def test_failed_gated_download_explains_and_retries_with_a_token(
        qtbot, services: ModelServices, settings_ctl: SettingsController) -> None:
    page = ModelsPage(services, ask_token=lambda _p, _r: GATED_TOKEN)
    qtbot.addWidget(page)
    downloads = page.downloads
    services.on_disk(services.downloads.enqueue, GATED_REPO, "tiny-gated-F32.gguf")
    qtbot.waitUntil(lambda: any(j.state == "failed" for j in downloads.jobs.values()),
                    timeout=WAIT)
    job_id = next(iter(downloads.jobs))
    assert "Accept its terms" in downloads.details.text()
    button = downloads.button(job_id, "token")
    assert button is not None
    with qtbot.waitSignal(downloads.finished, timeout=WAIT):
        button.click()
    assert settings_ctl.settings.token() == GATED_TOKEN


def test_the_queue_survives_a_restart(qtbot, hub: FakeHub, settings_ctl: SettingsController,
                                      devices: Devices) -> None:
    made: list[ModelServices] = []
    try:
        first = make_services(settings_ctl, devices, made)
        hub.set_fault(TINY_REPO, FILE, Fault(stall_at=300_000, stall_seconds=60))
        job = first.downloads.enqueue(TINY_REPO, FILE)
        page = ModelsPage(first)
        qtbot.addWidget(page)
        qtbot.waitUntil(lambda: page.downloads.progress_of(job.id)[0] > 0, timeout=WAIT)
        page.downloads.act("pause", job.id)
        qtbot.waitUntil(lambda: page.downloads.state_of(job.id) == "paused", timeout=WAIT)
        hub.release_stalls()
        first.shutdown()
        made.remove(first)
        page.close()

        second = make_services(settings_ctl, devices, made)
        again = ModelsPage(second)
        qtbot.addWidget(again)
        qtbot.waitUntil(lambda: job.id in again.downloads.jobs, timeout=WAIT)
        assert again.downloads.state_of(job.id) == "paused"
        assert again.downloads.progress_of(job.id)[0] > 0  # the partial file is still there
        again.downloads.act("resume", job.id)
        with qtbot.waitSignal(again.downloads.finished, timeout=WAIT):
            pass
    finally:
        for s in made:
            s.shutdown()


def test_library_import_drafts_reveal_delete(qtbot, services: ModelServices, tiny_target: Path,
                                             tiny_draft: Path, alien_draft: Path) -> None:
    opened: list[QtCore.QUrl] = []
    confirmations: list[str] = []
    page = ModelsPage(services, library_options={
        "choose_files": lambda _p: [tiny_target, tiny_draft, alien_draft],
        "confirm": lambda _p, _t, text: confirmations.append(text) or True,
        "open_url": opened.append,
    })
    qtbot.addWidget(page)
    library = page.library
    library.buttons["import"].click()
    qtbot.waitUntil(lambda: len(library.models) == 3, timeout=WAIT)
    qtbot.waitUntil(lambda: bool(library.drafts), timeout=WAIT)
    by_name = {m.path.name: m for m in library.models}
    target = by_name[tiny_target.name]
    assert [d.path.name for d in library.drafts[target.path]] == [tiny_draft.name]
    row = library.models.index(target)
    assert library.table.item(row, 7).text() == by_name[tiny_draft.name].name

    library.select(target.path)
    library.buttons["reveal"].click()
    assert opened == [QtCore.QUrl.fromLocalFile(str(target.path.parent))]

    library.buttons["delete"].click()
    qtbot.waitUntil(lambda: len(library.models) == 2, timeout=WAIT)
    assert "Delete " + target.path.name in confirmations[0]
    assert not target.path.exists() and tiny_target.exists()  # the original stays


def test_drop_imports_gguf_files(qtbot, services: ModelServices, tiny_draft: Path,
                                 tmp_path: Path) -> None:
    page = ModelsPage(services)
    qtbot.addWidget(page)
    other = tmp_path / "notes.txt"
    other.write_text("x")
    mime = QtCore.QMimeData()
    mime.setUrls([QtCore.QUrl.fromLocalFile(str(tiny_draft)), QtCore.QUrl.fromLocalFile(str(other))])
    event = QtGui.QDropEvent(QtCore.QPointF(5, 5), QtCore.Qt.DropAction.CopyAction, mime,
                             QtCore.Qt.MouseButton.LeftButton, QtCore.Qt.KeyboardModifier.NoModifier)
    page.library.dropEvent(event)
    qtbot.waitUntil(lambda: [m.path.name for m in page.library.models] == [tiny_draft.name],
                    timeout=WAIT)


@pytest.mark.slow
def test_make_a_draft_quantizes_beside_the_model(qtbot, services: ModelServices,
                                                 tiny_target: Path) -> None:
    pytest.importorskip("llama_cpp")
    page = ModelsPage(services, library_options={
        "choose_files": lambda _p: [tiny_target],
        "choose_draft_type": lambda _p, _m: "Q4_0"})
    qtbot.addWidget(page)
    library = page.library
    library.buttons["import"].click()
    qtbot.waitUntil(lambda: len(library.models) == 1, timeout=WAIT)
    model: LibraryModel = library.models[0]
    library.select(model.path)
    assert library.buttons["draft"].isEnabled()
    library.buttons["draft"].click()
    qtbot.waitUntil(lambda: len(library.models) == 2, timeout=60_000)
    made = next(m for m in library.models if m.path != model.path)
    assert made.quant == "Q4_0"
    assert "Made " in library.status.text()
    qtbot.waitUntil(lambda: [d.path for d in library.drafts.get(model.path, [])] == [made.path],
                    timeout=WAIT)


def test_picks_before_any_search_then_sort_and_filters(qtbot, page: ModelsPage) -> None:
    discover = page.discover
    assert discover.stack.currentWidget() is discover.picks
    qtbot.waitUntil(lambda: discover.picks.rowCount() > 0, timeout=WAIT)
    assert "16.0 GiB free" in discover.status.text()
    from runtime.hub.catalog import load_catalog

    fitting = [m.repo for m in load_catalog().for_memory(16 * GiB) if m.role in ("chat", "code")]
    assert discover.pick_repos() == fitting

    discover.sort.setCurrentIndex(discover.sort.findData("likes"))
    discover.author.setText("tiny")
    qtbot.waitUntil(lambda: discover.hit_ids() == ["tiny/Tiny-Draft-GGUF", TINY_REPO],
                    timeout=WAIT)  # 30 likes before 7
    assert discover.results.item(0, 2).text() == "30"
    assert discover.results.item(0, 3).text() == "2024-09-19"

    discover.author.clear()
    discover.search.setText("gguf")
    qtbot.waitUntil(lambda: GATED_REPO in discover.hit_ids(), timeout=WAIT)
    row = discover.hit_ids().index(GATED_REPO)
    assert discover.results.item(row, 4).text() == "Gated: needs a token"
    discover.hide_gated.setChecked(True)
    assert GATED_REPO not in discover.hit_ids()
    assert "1 gated hidden" in discover.status.text()

    discover.search.clear()
    discover.run_search()
    assert discover.stack.currentWidget() is discover.picks


def test_search_failure_is_said_in_words(qtbot, page: ModelsPage,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # and this search never ran: nothing cached
    page.discover.search.setText("never searched")
    page.discover.run_search()
    notice = page.discover.notice
    qtbot.waitUntil(lambda: notice.text.text().startswith("Search failed"), timeout=WAIT)
    assert "offline mode" in notice.text.text() and not notice.isHidden()


def test_cancel_retry_remove(qtbot, page: ModelsPage, services: ModelServices,
                             hub: FakeHub) -> None:
    hub.set_fault(TINY_REPO, FILE, Fault(stall_at=200_000, stall_seconds=60))
    services.on_disk(services.downloads.enqueue, TINY_REPO, FILE)
    downloads = page.downloads
    qtbot.waitUntil(lambda: len(downloads.jobs) == 1, timeout=WAIT)
    job_id = next(iter(downloads.jobs))
    qtbot.waitUntil(lambda: downloads.progress_of(job_id)[0] > 0, timeout=WAIT)
    downloads.button(job_id, "cancel").click()
    qtbot.waitUntil(lambda: downloads.state_of(job_id) == "cancelled", timeout=WAIT)
    assert downloads.button(job_id, "retry") is not None
    hub.release_stalls()
    with qtbot.waitSignal(downloads.finished, timeout=WAIT):
        downloads.button(job_id, "retry").click()
    downloads.button(job_id, "remove").click()
    qtbot.waitUntil(lambda: not downloads.jobs, timeout=WAIT)
    assert downloads.table.rowCount() == 0 and not downloads.empty.isHidden()


def test_settings_reach_the_services(qtbot, services: ModelServices,
                                     settings_ctl: SettingsController, tmp_path: Path) -> None:
    import dataclasses

    from runtime.settings.user import HubSettings

    old_hub = services.hub
    settings_ctl.update(dataclasses.replace(
        settings_ctl.settings, models_dir=tmp_path / "elsewhere",
        hub=HubSettings(endpoint="https://mirror.example", parallel_downloads=4)))
    assert services.hub is not old_hub and services.hub.endpoint == "https://mirror.example"
    assert services.downloads.max_concurrent == 4
    assert services.library.models_dir == tmp_path / "elsewhere"
    assert services.downloads.models_dir == tmp_path / "elsewhere"
    qtbot.waitUntil(lambda: not settings_ctl.pending, timeout=WAIT)


def test_draft_verdicts_are_kept_per_pair(tiny_target: Path, tiny_draft: Path,
                                          alien_draft: Path) -> None:
    from app.services.drafts import DraftVerdicts, judge_drafts
    from runtime.library.drafts import NOT_SMALLER
    from runtime.library.library import Library

    library = Library(user_dirs().models)
    models = [library.import_file(p, mode="link") for p in (tiny_target, tiny_draft, alien_draft)]
    target, draft, alien = models
    verdicts = DraftVerdicts()
    judged = judge_drafts(target, models, verdicts)
    assert [(c.model.path, c.compatible) for c in judged] == [(draft.path, True),
                                                              (alien.path, False)]
    assert verdicts.get(target, alien) == judged[1].reasons
    # Kept: a second look does not read the vocabularies again.
    verdicts.put(target, draft, ("remembered",))
    again = {c.model.path: c.reasons for c in judge_drafts(target, models, verdicts)}
    assert again[draft.path] == ("remembered",)
    assert judge_drafts(draft, models, verdicts)[-1].reasons == (NOT_SMALLER,)


def test_a_download_owned_by_another_process_is_shown_not_offered(
        qtbot, page: ModelsPage) -> None:
    from runtime.downloads.manager import DownloadJob, DownloadStateChanged

    downloads = page.downloads
    job = DownloadJob(id="j1", repo_id=TINY_REPO, filename=FILE, state="running", size=1000,
                      received=400, elsewhere=True)
    downloads.on_event(DownloadStateChanged(job))
    row = downloads._rows["j1"]
    assert downloads.table.item(row, 5).text() == "Downloading in another Outrider process"
    assert downloads.button("j1", "pause") is None and downloads.button("j1", "cancel") is None
    downloads.on_event(DownloadStateChanged(DownloadJob(
        id="j1", repo_id=TINY_REPO, filename=FILE, state="running", size=1000, received=500)))
    assert downloads.button("j1", "pause") is not None  # taken over here: ours to pause

"""Settings → Model → Workers: entries validated as typed (a one-line error; nothing saved and
Load waiting while one is refused), saved with the model's load settings, probed only on
Check and off the GUI thread (each worker's free memory or its error), and the live plan
counting the devices of the workers that answered. Fake RPC workers on loopback; offscreen."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from app.qt import Qt
from app.services.models import ModelServices
from app.services.settings import SettingsController
from app.settings import model_settings_page
from app.settings.plan_view import split_text
from app.settings.workers_field import check_workers
from runtime.gguf.info import read_model_info
from runtime.planner.plan import plan_memory
from runtime.planner.workers import probe_worker
from runtime.settings.load import LoadSettings
from runtime.settings.user import SettingsStore
from runtime.units import fmt_bytes
from tests.conftest import tiny_model_path
from tests.fixtures.fake_rpc_worker import GIB, FakeRpcWorker, refused_endpoint
from tests.fixtures.tiny_gguf import TARGET
from tests.gui.model_helpers import Devices, cpu
from tests.gui.test_settings_page import WAIT, open_page, put_in_library, wait_plan

pytest_plugins = ["tests.gui.model_fixtures"]


def type_workers(qtbot, page: model_settings_page.ModelSettingsPage, text: str) -> None:
    """Replace the entries as a user pasting them would (one edit, `textEdited` included)."""
    line = page.form.workers.line
    line.selectAll()
    line.insert(text)


@pytest.fixture
def worker() -> Iterator[FakeRpcWorker]:
    with FakeRpcWorker(free=6 * GIB, total=8 * GIB) as fake:
        yield fake


def test_a_refused_entry_says_why_in_one_line_and_nothing_is_saved(
        qtbot, settings_ctl: SettingsController, services: ModelServices) -> None:
    path = put_in_library(tiny_model_path(TARGET))
    page = open_page(qtbot, settings_ctl, services, path)
    field = page.form.workers
    assert page.load_button.isEnabled() and field.error.isHidden()

    type_workers(qtbot, page, "10.0.0.2:99999")
    assert field.error.text() == "worker '10.0.0.2:99999': the port must be a number 1 to 65535"
    assert "\n" not in field.error.text() and not field.error.isHidden()
    assert not page.load_button.isEnabled() and not field.check_button.isEnabled()
    assert page.plan_view.verdict.text().startswith("Not a valid setting: worker '10.0.0.2:")
    assert page._pending is None and not page._save_timer.isActive()  # no save on its way
    assert not settings_ctl.pending
    assert settings_ctl.settings.model_prefs(path).load.workers == ()

    type_workers(qtbot, page, "10.0.0.2, 10.0.0.2:50052")  # one machine named twice
    assert field.error.text() == "worker 10.0.0.2:50052 is named twice"
    assert not page.load_button.isEnabled()

    type_workers(qtbot, page, "Box.local, 10.0.0.2:7000")
    assert field.error.isHidden() and page.load_button.isEnabled()
    qtbot.waitUntil(lambda: settings_ctl.settings.model_prefs(path).load.workers
                    == ("box.local:50052", "10.0.0.2:7000"), timeout=WAIT)
    qtbot.waitUntil(lambda: not settings_ctl.pending, timeout=WAIT)
    on_disk = SettingsStore(settings_ctl.store.path).load().model_prefs(path)
    assert on_disk.load.workers == ("box.local:50052", "10.0.0.2:7000")
    # Unchecked workers are not planned with, and the plan says so.
    assert "Not planned with box.local:50052, 10.0.0.2:7000: Check the workers" in \
        page.plan_view.notes.text()


def test_check_probes_off_the_gui_thread_and_the_plan_counts_the_worker(
        qtbot, settings_ctl: SettingsController, services: ModelServices, devices: Devices,
        worker: FakeRpcWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    devices.now = [cpu(free=2 * GIB)]
    path = put_in_library(tiny_model_path(TARGET))
    page = open_page(qtbot, settings_ctl, services, path)
    probed_on: list[threading.Thread] = []

    def recording(endpoints: tuple[str, ...]) -> object:
        probed_on.append(threading.current_thread())
        return check_workers(endpoints, timeout_s=2.0)

    monkeypatch.setattr(model_settings_page, "check_workers", recording)
    down = refused_endpoint()
    type_workers(qtbot, page, f"{worker.endpoint}, {down}")
    field = page.form.workers
    assert field.results.text().splitlines() == [
        f"worker {worker.endpoint}: not checked yet (Check plans with it)",
        f"worker {down}: not checked yet (Check plans with it)"]
    # Typing never probes: a job behind any the typing queued on the network thread finds
    # none ran (that thread runs its jobs in order).
    with qtbot.waitSignal(services.on_net(lambda: None).done, timeout=WAIT):
        pass
    assert worker.connections == 0 and probed_on == []

    with qtbot.waitSignal(field.check_requested, timeout=WAIT) as asked:
        qtbot.mouseClick(field.check_button, Qt.MouseButton.LeftButton)
    assert asked.args == [(worker.endpoint, down)]
    assert field.check_button.text() == "Checking…" and not field.check_button.isEnabled()
    qtbot.waitUntil(lambda: field.check_of(down) is not None, timeout=WAIT)
    assert probed_on and probed_on[0] is not threading.main_thread()
    assert worker.connections == 1
    lines = field.results.text().splitlines()
    assert lines[0] == f"worker {worker.endpoint}: 6.00 GiB free of 8.00 GiB"
    assert lines[1].startswith(f"worker {down} cannot be reached (")
    assert field.check_button.text() == "Check" and field.check_button.isEnabled()

    # The plan: the worker's device first (llama.cpp's order), then this machine's, split by
    # free memory (no GPU here; the worker lends one "rpc" device).
    remote = probe_worker(worker.endpoint).devices[0]  # what the page was told, asked again
    asked_so_far = worker.connections
    settings = LoadSettings(model_path=path, n_ctx=settings_ctl.settings.fit.n_ctx,
                            type_k=settings_ctl.settings.fit.type_k,
                            type_v=settings_ctl.settings.fit.type_v,
                            workers=(worker.endpoint, down))
    expected = plan_memory(read_model_info(path), settings, [remote, *devices()])
    wait_plan(qtbot, page, expected)
    assert [d.id for d in page.plan_view.plan.devices] == [f"rpc:{worker.endpoint}", "cpu"]
    assert expected.gpu_layers > 0 and expected.links  # some layers, and their traffic
    assert page.plan_view.verdict.text() == split_text(expected)
    assert page.plan_view.verdict.text().startswith("Split: ")
    notes = page.plan_view.notes.text()
    assert f"Not planned with {down}: Check the workers" in notes
    total = sum(link.bytes_per_token for link in expected.links)
    assert f"network {fmt_bytes(total)} per token" in notes.splitlines()
    assert f"worker {worker.endpoint}: " in page.plan_view.devices.text()
    assert page.form.gpu_auto.isEnabled()  # the worker's device takes layers off this CPU

    # Removing the worker plans with this machine alone again, with no probe.
    type_workers(qtbot, page, down)
    alone = plan_memory(read_model_info(path), LoadSettings(
        model_path=path, n_ctx=settings.n_ctx, type_k=settings.type_k, type_v=settings.type_v,
        workers=(down,)), devices())
    wait_plan(qtbot, page, alone)
    assert worker.connections == asked_so_far


def test_saved_workers_come_back_with_the_model(
        qtbot, settings_ctl: SettingsController, services: ModelServices) -> None:
    path = put_in_library(tiny_model_path(TARGET))
    prefs = settings_ctl.settings.model_prefs(path)
    settings_ctl.update_model(path, type(prefs)(LoadSettings(
        model_path=path, n_ctx=prefs.load.n_ctx, workers=("10.0.0.2:50052",)), prefs.sampling))
    page = open_page(qtbot, settings_ctl, services, path)
    assert page.form.workers.line.text() == "10.0.0.2:50052"
    assert page.form.prefs(path).load.workers == ("10.0.0.2:50052",)
    # Another page drops the worker from the saved settings: the field follows.
    settings_ctl.update_model(path, type(prefs)(LoadSettings(model_path=path,
                                                             n_ctx=prefs.load.n_ctx)))
    assert page.form.workers.line.text() == ""

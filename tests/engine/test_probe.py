"""The load probe (runtime.engine.probe): a llama.cpp abort ends a child process, not the engine
or `outrider run`, and the verdict is remembered per file.

The crashing file really aborts llama.cpp (checked first, with llama.cpp alone in a
subprocess) and passes the preflight (tests/fixtures/crash_gguf.py): it is the kind of file
only the probe can stop.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.engine.engine import Engine
from runtime.engine.probe import PROBE_FLAG, LoadProbe, crash_reason
from runtime.errors import LoadCrashed, LoadError
from runtime.gguf.verdicts import FILE_NAME, LoadVerdict, VerdictStore, file_key
from runtime.library.library import Library
from runtime.llama.params import LlamaParams, to_llama_params
from runtime.paths import user_dirs
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.speculation import Speculation
from tests.fixtures.crash_gguf import aborts_llama_cpp, crashing_gguf, rewrite_gguf

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def crashing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = crashing_gguf(tmp_path_factory.mktemp("crash"))
    assert path is not None, "the preflight refuses every crash file tests/fixtures knows"
    assert aborts_llama_cpp(path), f"{path.name} no longer aborts llama.cpp"
    return path


def params(path: Path) -> LlamaParams:
    return to_llama_params(LoadSettings(model_path=path, n_ctx=256, n_threads=1), 0)


def test_a_crash_is_one_line_with_the_assertion_and_remembered(crashing: Path,
                                                               tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / FILE_NAME)
    probe = LoadProbe(store)
    with pytest.raises(LoadCrashed) as first:
        probe(crashing, params(crashing))
    message = str(first.value)
    assert message.startswith(f"llama.cpp crashed while loading {crashing.name}: ")
    assert "GGML_ASSERT(" in message and "\n" not in message
    assert probe.children == 1
    assert store.get(crashing) == LoadVerdict(ok=False, reason=message.split(": ", 1)[1])

    again = LoadProbe(store)  # a later process: the store, not the probe, remembers
    with pytest.raises(LoadCrashed) as second:
        again(crashing, params(crashing))
    assert str(second.value) == message
    assert again.children == 0


def test_a_good_file_is_probed_once(tiny_target: Path, tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / FILE_NAME)
    probe = LoadProbe(store)
    probe(tiny_target, params(tiny_target))
    probe(tiny_target, params(tiny_target))
    assert probe.children == 1
    assert store.get(tiny_target) == LoadVerdict(ok=True)


def test_a_refusal_in_the_child_keeps_its_type_and_is_not_remembered(tiny_target: Path,
                                                                     tmp_path: Path) -> None:
    from gguf import GGUFValueType

    refused = rewrite_gguf(tiny_target, tmp_path / "rope.gguf",
                           {"llama.rope.dimension_count": (64, GGUFValueType.UINT32)})
    store = VerdictStore(tmp_path / FILE_NAME)
    with pytest.raises(LoadError, match=r"^llama.cpp could not load rope.gguf: "
                                        r"invalid n_rot: 64, expected 32$") as caught:
        LoadProbe(store)(refused, params(refused))
    assert not isinstance(caught.value, LoadCrashed)
    assert store.get(refused) is None


def test_the_engine_survives_a_crash_and_loads_the_next_file(crashing: Path,
                                                             tiny_target: Path) -> None:
    probe = LoadProbe()
    engine = Engine(probe=probe)
    engine.start()
    try:
        with pytest.raises(LoadCrashed):
            engine.load(LoadSettings(model_path=crashing, n_ctx=256, n_threads=1))
        assert engine.status().state == "empty"
        loaded = engine.load(LoadSettings(model_path=tiny_target, n_ctx=256, n_threads=1))
        assert loaded.name == tiny_target.stem
        assert probe.children == 2
    finally:
        engine.stop()


def test_a_draft_model_that_crashes_turns_drafting_off(crashing: Path, tiny_target: Path) -> None:
    probe = LoadProbe()
    engine = Engine(probe=probe, speculation=Speculation())
    engine.start()
    try:
        draft = DraftSettings(kind="model", model_path=crashing)
        loaded = engine.load(LoadSettings(model_path=tiny_target, n_ctx=256, n_threads=1,
                                          draft=draft))
        assert loaded.draft is None
        assert loaded.draft_refused is not None
        assert loaded.draft_refused.startswith(f"llama.cpp crashed while loading {crashing.name}")
    finally:
        engine.stop()


def test_a_child_that_cannot_start_says_nothing_about_the_file(tiny_target: Path,
                                                               tmp_path: Path) -> None:
    """A broken install (or a bundle without the probe flag): load unprobed, remember nothing."""
    store = VerdictStore(tmp_path / FILE_NAME)
    for command in ([sys.executable, "-c", "import sys; sys.exit(3)"],
                    [str(tmp_path / "no-such-python")]):
        probe = LoadProbe(store, command=command)
        probe(tiny_target, params(tiny_target))
        assert store.get(tiny_target) is None


def test_a_cache_that_cannot_be_written_costs_only_the_memory(crashing: Path, tiny_target: Path,
                                                              tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    probe = LoadProbe(VerdictStore(tmp_path / "file" / FILE_NAME))  # its folder is a file
    probe(tiny_target, params(tiny_target))
    with pytest.raises(LoadCrashed):
        probe(crashing, params(crashing))
    assert probe.children == 2


def test_the_frozen_app_knows_the_probe_flag() -> None:
    spec = importlib.util.spec_from_file_location("outrider_frozen_entry",
                                                  ROOT / "packaging" / "entry.py")
    assert spec is not None and spec.loader is not None
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    assert entry.LOAD_PROBE_FLAG == PROBE_FLAG


def test_the_library_marks_a_crashing_file(crashing: Path, tiny_target: Path,
                                           tmp_path: Path) -> None:
    models = tmp_path / "models" / "o" / "r"
    models.mkdir(parents=True)
    bad, good = models / crashing.name, models / "good.gguf"
    bad.write_bytes(crashing.read_bytes())
    good.write_bytes(tiny_target.read_bytes())
    with pytest.raises(LoadCrashed) as crash:
        LoadProbe()(bad, params(bad))
    found = {m.path.name: m for m in Library(tmp_path / "models").scan()}
    assert found[bad.name].failing == str(crash.value).split(": ", 1)[1]
    assert found["good.gguf"].failing is None


def test_the_key_changes_with_the_file_and_reads_only_its_start(tiny_target: Path,
                                                                tmp_path: Path) -> None:
    copy = tmp_path / "m.gguf"
    copy.write_bytes(tiny_target.read_bytes())
    key = file_key(copy)
    assert file_key(copy) == key
    os.utime(copy, ns=(1, 1))
    touched = file_key(copy)
    assert touched != key
    # a change past the first MiB (with size and mtime kept) is not read: never hash it all
    assert copy.stat().st_size > 2 << 20
    with copy.open("r+b") as f:
        f.seek(2 << 20)
        f.write(b"\x7f")
    os.utime(copy, ns=(1, 1))
    assert file_key(copy) == touched
    with copy.open("r+b") as f:  # a change inside it is
        f.seek(100)
        f.write(b"\x7f")
    os.utime(copy, ns=(1, 1))
    assert file_key(copy) != touched


@pytest.mark.parametrize(("stderr", "rc", "reason"), [
    ("/b/vendor/llama.cpp/ggml/src/ggml-cpu/ops.cpp:4132: GGML_ASSERT(eps >= 0.0f) failed\n", -6,
     "ops.cpp:4132: GGML_ASSERT(eps >= 0.0f) failed"),
    ("/b/ggml/src/ggml-cpu/binary-ops.cpp:135: binary_op: unsupported types: dst: f32, "
     "src0: f32, src1: i32\n", -6,
     "binary-ops.cpp:135: binary_op: unsupported types: dst: f32, src0: f32, src1: i32"),
    ("terminate called after throwing an instance of 'std::out_of_range'\n  what():  "
     "vector::_M_range_check\n", -6, "vector::_M_range_check"),
    ("", -11, "the process was killed by SIGSEGV"),
    ("", 1, "the process exited with status 1"),
])
def test_how_the_child_died_in_one_line(stderr: str, rc: int, reason: str) -> None:
    assert crash_reason(stderr, rc) == reason


def test_outrider_run_on_a_crashing_file_exits_with_one_line(crashing: Path,
                                                             tmp_path: Path) -> None:
    """No core dump, no traceback; the second run refuses it from the store, no child."""
    env = dict(os.environ, PYTHONFAULTHANDLER="")
    command = [sys.executable, "-m", "runtime.cli.main", "run", str(crashing), "-p", "hi",
               "--ctx", "256", "--max-tokens", "4"]
    verdicts = user_dirs().cache / FILE_NAME
    results = []
    for _ in range(2):
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=120)
        results.append(done)
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        lines = done.stderr.splitlines()
        assert lines == [f"error: llama.cpp crashed while loading {crashing.name}: "
                         f"{VerdictStore().failing(crashing)}"], done.stderr
        assert "GGML_ASSERT" in lines[0]
        if _ == 0:
            first_written = verdicts.stat().st_mtime_ns
    assert verdicts.stat().st_mtime_ns == first_written  # the second run only read it
    assert len(json.loads(verdicts.read_text())["files"]) == 1
    assert list(tmp_path.iterdir()) == []  # no core file

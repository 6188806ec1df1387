"""Saved KV caches (runtime.engine.kv_store): a conversation resumes from disk after the
engine restarts, token-identical to a cold run at T = 0 and prefilling only the new tokens;
files of another model, other settings or damaged ones are never used; the budget evicts
the least recently used; a full disk costs the saving, never the chat."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.engine import kv_store
from runtime.engine.engine import Engine
from runtime.engine.kv_slots import KvSlots
from runtime.engine.kv_store import KvStore, KvStoreOptions
from runtime.events import Finished, GenerationRequest, SamplingParams, TokenEvent
from tests.engine.conftest import tiny_settings

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
FIRST = "the cat went to the sea and then it saw a boat, and the boat was red " * 4
FOLLOW = FIRST + " so the cat asked the boat where it was going"


@contextmanager
def running(saved: KvStoreOptions | None, path: Path, **kw: object) -> Iterator[Engine]:
    engine = Engine(saved_kv=saved)
    engine.start()
    try:
        engine.load(tiny_settings(path, **kw))
        yield engine
    finally:
        engine.stop()  # unloading saves the idle slots


def reply(engine: Engine, prompt: str) -> tuple[list[int], Finished, int]:
    """Tokens, the Finished event and how many tokens the engine prefilled for it."""
    steps_before = len(engine._steps)
    handle = engine.submit(GenerationRequest(prompt=prompt, sampling=GREEDY))
    events = list(handle.events(timeout=60))
    prefilled = sum(r.prefilled for _, r, _ in list(engine._steps)[steps_before:])
    done = [e for e in events if isinstance(e, Finished)]
    return [e.token_id for e in events if isinstance(e, TokenEvent)], done[0], prefilled


def options(tmp_path: Path, budget: int = kv_store.DEFAULT_BUDGET_BYTES) -> KvStoreOptions:
    return KvStoreOptions(tmp_path / "kv", budget_bytes=budget, min_tokens=8)


# Finished files only: one being written is a hidden `.partial-*.kv` beside them
# (runtime.atomic_file) until it is renamed into place.
SAVED = "[!.]*.kv"


def saved_files(opts: KvStoreOptions) -> list[Path]:
    return sorted(opts.folder.glob(SAVED))


@pytest.fixture
def cold(tiny_target: Path) -> list[int]:
    with running(None, tiny_target) as engine:
        return reply(engine, FOLLOW)[0]


def test_a_conversation_resumes_after_a_restart(tmp_path: Path, tiny_target: Path,
                                                cold: list[int]) -> None:
    opts = options(tmp_path)
    with running(opts, tiny_target) as engine:
        reply(engine, FIRST)
    assert len(saved_files(opts)) == 1

    with running(opts, tiny_target) as engine:
        tokens, done, prefilled = reply(engine, FOLLOW)
    assert tokens == cold
    usage = done.usage
    assert usage.resumed_tokens == usage.cached_tokens > len(FIRST) // 2
    assert prefilled == usage.prompt_tokens - usage.resumed_tokens  # only the new tokens
    assert done.timings.restore_s > 0


def wait_for_files(opts: KvStoreOptions, n: int, timeout: float = 60.0) -> list[Path]:
    """The saved files once there are `n` (the engine writes them when it falls idle)."""
    deadline = time.monotonic() + timeout
    while len(files := saved_files(opts)) != n:
        assert time.monotonic() < deadline, f"{len(files)} saved files, not {n}"
        time.sleep(0.01)
    return files


def test_a_finished_conversation_is_saved_while_the_engine_idles(
        tmp_path: Path, tiny_target: Path, cold: list[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No unload, no eviction: the file is written because the reply finished and nothing
    else ran. The engine is then stopped without its unload-time save — a window closed, an
    app killed — and the next engine still resumes the conversation."""
    opts = options(tmp_path)
    with monkeypatch.context() as killed:
        killed.setattr(KvSlots, "save_idle", lambda self: None)
        with running(opts, tiny_target) as engine:
            reply(engine, FIRST)
            (saved,) = wait_for_files(opts, 1)
    with running(opts, tiny_target) as engine:
        tokens, done, prefilled = reply(engine, FOLLOW)
    assert tokens == cold
    assert done.usage.resumed_tokens > len(FIRST) // 2
    assert prefilled == done.usage.prompt_tokens - done.usage.resumed_tokens
    # The new turn is saved too (its prompt is not FIRST's reply, so both files stay).
    assert saved in wait_for_files(opts, 2)


def test_a_live_slot_is_preferred_to_the_file(tmp_path: Path, tiny_target: Path) -> None:
    opts = options(tmp_path)
    with running(opts, tiny_target) as engine:
        reply(engine, FIRST)
        _, done, _ = reply(engine, FOLLOW)  # the idle slot still holds FIRST
    assert done.usage.cached_tokens > 0 and done.usage.resumed_tokens == 0


@pytest.mark.parametrize("change", ["type_k", "model"])
def test_a_file_of_other_settings_or_another_model_is_not_used(
        tmp_path: Path, tiny_target: Path, tiny_draft: Path, change: str) -> None:
    opts = options(tmp_path)
    with running(opts, tiny_target) as engine:
        reply(engine, FIRST)
    other = {"type_k": (tiny_target, {"type_k": "q8_0"}), "model": (tiny_draft, {})}[change]
    with running(None, other[0], **other[1]) as engine:
        cold_other = reply(engine, FOLLOW)[0]
    with running(opts, other[0], **other[1]) as engine:
        tokens, done, prefilled = reply(engine, FOLLOW)
    assert done.usage.resumed_tokens == 0 and done.usage.cached_tokens == 0
    assert prefilled == done.usage.prompt_tokens
    assert tokens == cold_other
    assert len(saved_files(opts)) == 2  # the first file stays, valid for its own model


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "other prefix"])
def test_a_damaged_file_is_discarded_and_the_prompt_recomputed(
        tmp_path: Path, tiny_target: Path, cold: list[int], damage: str) -> None:
    opts = options(tmp_path)
    with running(opts, tiny_target) as engine:
        reply(engine, FIRST)
    (path,) = saved_files(opts)
    data = bytearray(path.read_bytes())
    if damage == "flipped byte":
        data[-100] ^= 0x40  # inside llama.cpp's K/V rows: only the checksum sees it
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(bytes(data[:len(data) // 2]))
    else:  # a whole, valid file under the name of another prefix
        path.rename(path.with_name(path.name[:17] + "0" * 32 + ".kv"))

    with running(opts, tiny_target) as engine:
        tokens, done, prefilled = reply(engine, FOLLOW)
    assert tokens == cold
    assert done.usage.resumed_tokens == 0
    assert prefilled == done.usage.prompt_tokens
    assert not any(p.name.startswith(path.name[:17] + "0" * 32) for p in saved_files(opts))


def test_a_full_disk_costs_the_saving_not_the_chat(tmp_path: Path, tiny_target: Path,
                                                   cold: list[int],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    def no_space(*_args: object, **_kw: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(kv_store, "atomic_output", no_space)
    opts = options(tmp_path)
    with caplog.at_level(logging.WARNING, logger="outrider.kv_store"), \
            running(opts, tiny_target, n_parallel=1) as engine:
        reply(engine, FIRST)
        reply(engine, "a different conversation about a dog and a hill, " * 3)  # saves FIRST
        tokens, done, _ = reply(engine, FOLLOW)  # saves the dog's
    assert tokens == cold and done.reason in ("stop", "length")
    warnings = [r for r in caplog.records if r.name == "outrider.kv_store"]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()
    assert saved_files(opts) == []


class _FillsUp:
    """A file whose disk is full after its first write (the header goes, the tokens do not)."""

    def __init__(self, f: Any) -> None:
        self.f, self.writes = f, 0

    def __enter__(self) -> _FillsUp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()

    def write(self, data: bytes) -> int:
        self.writes += 1
        if self.writes > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(self.f.write(data))


def test_a_disk_filling_up_mid_file_leaves_nothing_and_is_said_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    state = FakeState()
    store = KvStore(KvStoreOptions(tmp_path, min_tokens=4), b"k" * 32, state)
    monkeypatch.setattr(kv_store, "open", lambda path, mode: _FillsUp(
        open(path, mode)), raising=False)  # noqa: SIM115 (closed by _FillsUp)
    with caplog.at_level(logging.INFO, logger="outrider.kv_store"):
        store.save(0, state.hold(0, list(range(10, 30))))  # never raises
        store.save(1, state.hold(1, list(range(40, 60))))
    assert list(tmp_path.iterdir()) == []  # no half file, no temporary left behind
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "No space left on device" in caplog.records[0].getMessage()
    assert store.find([*range(10, 30), 9], live=0, whole=False) is None
    # Room again: the next save works and is found.
    monkeypatch.delattr(kv_store, "open")
    store.save(0, state.hold(0, list(range(10, 30))))
    assert store.find([*range(10, 30), 9], live=0, whole=False) is not None


# ---- the store alone (a fake llama.cpp state) ---------------------------------------------------


class FakeState:
    """Sequence state as bytes derived from the slot's tokens; records what was restored."""

    def __init__(self, n_bytes: int = 1000) -> None:
        self.n_bytes = n_bytes
        self.held: dict[int, bytes] = {}
        self.restored: list[tuple[int, bytes]] = []

    def state_seq_get(self, seq_id: int) -> bytes:
        return self.held.get(seq_id, b"")

    def state_seq_set(self, seq_id: int, data: bytes) -> bool:
        self.restored.append((seq_id, data))
        return True

    def hold(self, seq_id: int, tokens: Sequence[int]) -> list[int]:
        self.held[seq_id] = bytes(tokens[:1]) * self.n_bytes
        return list(tokens)


def test_the_budget_evicts_the_least_recently_used(tmp_path: Path) -> None:
    state = FakeState(n_bytes=1000)
    one_file = kv_store._HEADER.size + 4 * 10 + 1000
    store = KvStore(KvStoreOptions(tmp_path, budget_bytes=2 * one_file + 10, min_tokens=4),
                    b"k" * 32, state)
    a, b, c = ([n] * 10 for n in (1, 2, 3))
    for when, seq in enumerate((a, b), start=1):
        store.save(0, state.hold(0, seq))
        (newest,) = set(saved_files_in(tmp_path)) - set(saved_files_in(tmp_path)[:when - 1])
        os.utime(newest, ns=(when * 10**9, when * 10**9))  # a older than b
    match = store.find([*a, 9], live=0, whole=False)
    assert match is not None and store.restore(match, 1) is not None  # a: used last now
    store.save(0, state.hold(0, c))  # over budget: b goes
    assert len(saved_files_in(tmp_path)) == 2
    assert store.find([*b, 9], live=0, whole=False) is None
    assert store.find([*a, 9], live=0, whole=False) is not None
    assert store.find([*c, 9], live=0, whole=False) is not None


def test_a_longer_prefix_supersedes_the_shorter_files_where_cells_can_be_cut(
        tmp_path: Path) -> None:
    state = FakeState()
    store = KvStore(KvStoreOptions(tmp_path, min_tokens=4), b"k" * 32, state)
    turn1, other = list(range(10, 30)), list(range(10, 20)) + [99] * 10
    store.save(0, state.hold(0, turn1))
    store.save(1, state.hold(1, other))  # shares 10 tokens, is no prefix of turn 2
    store.save(0, state.hold(0, [*turn1, *range(40, 50)]), supersede=True)  # turn 2
    assert len(saved_files_in(tmp_path)) == 2  # turn 1's file is gone, the other stays
    match = store.find([*turn1, 7], live=0, whole=False)
    assert match is not None and match.n_tokens == 30 and match.usable == 20
    # A window cache restores only whole files: there the shorter one is kept.
    store.save(0, state.hold(0, [*turn1, *range(40, 60)]))
    assert len(saved_files_in(tmp_path)) == 3


def test_a_file_is_used_only_when_it_gains_enough_over_the_live_cache(tmp_path: Path) -> None:
    state = FakeState()
    store = KvStore(KvStoreOptions(tmp_path, min_tokens=4), b"k" * 32, state)
    store.save(0, state.hold(0, list(range(10, 30))))
    prompt = [*range(10, 30), 99]
    assert store.find(prompt, live=16, whole=False) is not None  # 20 usable ≥ 16 + 4
    assert store.find(prompt, live=17, whole=False) is None
    assert store.find(list(range(10, 20)), live=0, whole=False).usable == 9  # type: ignore[union-attr]
    # A window cache cannot be cut: only a file that is wholly a prefix will do.
    assert store.find(list(range(10, 20)), live=0, whole=True) is None
    assert store.find(prompt, live=0, whole=True).usable == 20  # type: ignore[union-attr]


def test_a_second_store_with_another_key_sees_nothing(tmp_path: Path) -> None:
    state = FakeState()
    KvStore(KvStoreOptions(tmp_path, min_tokens=4), b"k" * 32, state).save(
        0, state.hold(0, list(range(10, 30))))
    other = KvStore(KvStoreOptions(tmp_path, min_tokens=4), b"j" * 32, state)
    assert other.find([*range(10, 30), 99], live=0, whole=False) is None
    assert len(saved_files_in(tmp_path)) == 1


def saved_files_in(folder: Path) -> list[Path]:
    return sorted(folder.glob(SAVED), key=lambda p: p.stat().st_mtime_ns)

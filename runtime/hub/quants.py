"""The quants of a GGUF repository: what each file is, what it costs, and whether it fits here.

    listing = list_quants(hub, "bartowski/Qwen2.5-7B-Instruct-GGUF")     # asks the Hub
    [(e.quant, e.size >> 20, round(e.bits_per_weight or 0, 2), e.verdict) for e in listing.entries][:2]
    # [('Q2_K', 2876, 3.17, 'full_gpu'), ('Q3_K_M', 3631, 4.0, 'full_gpu')]
    listing.recommended.quant, listing.recommended_reason
    # ('Q4_K_M', 'your preferred level Q4_K_M fits (full_gpu)')

- Every `.gguf` in the repository is listed; the parts of a split model
  (`…-00001-of-00003.gguf`) form one entry.
- The quant type comes from the file's own header, read remotely with HTTP range requests
  (`runtime.gguf.remote.read_remote_model_info`, a few MiB of a multi-GB file), never from the
  name alone; the name is the fallback only when the header cannot be read, and the entry
  says so (`quant_source = "name"`). Headers are cached by (repo, commit, file) in the user
  cache, so a second look costs nothing and works offline.
- The fit verdict comes from the memory planner (`runtime.planner.plan.plan_memory`) with the
  user's context and KV cache types against the memory free now, with its breakdown.
- The recommendation walks `PREFERRED_QUANTS` from the user's preferred level down (smaller)
  and then up, and takes the first that fits.
- A vision model's projectors (`mmproj-*.gguf`) are no entries of their own: the repository's
  preferred one (`runtime.library.projectors.preferred_projector`: F16, else the smallest) is
  every entry's `projector`, downloaded with it (`download_files`), its weights and compute
  buffer counted in the fit and its image tokens in the plan's notes:

    e = list_quants(hub, "ggml-org/gemma-3-4b-it-GGUF").entry("Q4_K_M")
    e.projector.label, [f.name for f in e.download_files]
    # ('vision: projector F16, 812 MiB', ['gemma-3-4b-it-Q4_K_M.gguf', 'mmproj-model-f16.gguf'])
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from runtime.atomic_file import write_text
from runtime.errors import OutriderError
from runtime.gguf.info import ModelInfo
from runtime.gguf.projector import ProjectorInfo
from runtime.gguf.remote import read_remote_model_info
from runtime.hub.client import Hub, RepoDetails, RepoFile
from runtime.hub.remote_projector import ReadProjector, cached_projector_info
from runtime.library.projectors import is_projector_name, preferred_projector
from runtime.paths import user_dirs
from runtime.planner.devices import list_devices
from runtime.planner.plan import plan_memory
from runtime.settings.load import LoadSettings
from runtime.units import fmt_bytes

# Quality order, best first: what a user may prefer, and where the recommendation walks.
PREFERRED_QUANTS: tuple[str, ...] = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "Q2_K")
DEFAULT_PREFERRED = "Q4_K_M"  # the community's usual default (Ollama's, LM Studio's)

_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT_IN_NAME = re.compile(
    r"(?i)(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]{1,3}){0,2}|BF16|F16|F32|MXFP4|TQ[12]_0)(?=[-_.])")
_NOT_A_CHAT_MODEL = re.compile(r"(?i)mmproj|imatrix")

ReadInfo = Callable[[str, dict[str, str]], Any]


def quant_from_name(filename: str) -> str | None:
    """The quant a file name claims (the last one in it), upper-cased; None if none.

    >>> quant_from_name("qwen2.5-0.5b-instruct-q8_0.gguf"), quant_from_name("X.Q4_K_M.gguf")
    ('Q8_0', 'Q4_K_M')
    >>> quant_from_name("model-IQ4_XS-00001-of-00002.gguf"), quant_from_name("model.gguf")
    ('IQ4_XS', None)
    """
    found = _QUANT_IN_NAME.findall(filename)
    return found[-1].upper() if found else None


def group_gguf_files(files: Sequence[RepoFile]) -> list[tuple[RepoFile, ...]]:
    """GGUF files grouped into models: a single file alone, split parts together in order.

    A split set missing parts still forms a group (of the parts present): `QuantEntry.error`
    then says which are missing.
    """
    singles: list[tuple[RepoFile, ...]] = []
    splits: dict[tuple[str, int], list[tuple[int, RepoFile]]] = {}
    for f in files:
        if not f.is_gguf:
            continue
        m = _SPLIT.match(f.name)
        if m is None:
            singles.append((f,))
        else:
            splits.setdefault((m["prefix"], int(m["count"])), []).append((int(m["no"]), f))
    groups = singles + [tuple(f for _, f in sorted(parts, key=lambda p: p[0]))
                        for parts in splits.values()]
    return sorted(groups, key=lambda g: g[0].name.lower())


@dataclass(frozen=True)
class ProjectorChoice:
    """The projector a vision model's download brings: the repository's preferred mmproj file."""

    file: RepoFile
    info: ProjectorInfo | None = None  # from its header; None: unread (a fit without it)
    error: str | None = None  # why the header could not be read
    n_available: int = 1  # projectors in the repository

    @property
    def name(self) -> str:
        return self.file.name

    @property
    def size(self) -> int:
        return self.file.size or 0

    @property
    def quant(self) -> str | None:
        return quant_from_name(self.file.name)

    @property
    def label(self) -> str:
        """"vision: projector F16, 812 MiB"."""
        kind = f" {self.quant}" if self.quant else ""
        return f"vision: projector{kind}, {fmt_bytes(self.size)}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.name, "size": self.size, "sha256": self.file.sha256,
                "quant": self.quant, "image_tokens": self.info.image_tokens if self.info else None,
                "projector_type": self.info.projector_type if self.info else None,
                "error": self.error, "n_available": self.n_available}


def choose_projector(details: RepoDetails) -> ProjectorChoice | None:
    """The repository's preferred projector (F16, else the smallest), header unread; None for
    a repository without one."""
    found = [f for f in details.gguf_files if is_projector_name(f.name)]
    chosen = preferred_projector(found, name=lambda f: f.name, size=lambda f: f.size)
    return None if chosen is None else ProjectorChoice(chosen, n_available=len(found))


@dataclass(frozen=True)
class QuantEntry:
    """One downloadable model of a repository (one file, or all parts of a split model)."""

    repo_id: str
    revision: str
    name: str  # the file name, or the split set's prefix + ".gguf"
    files: tuple[RepoFile, ...]
    quant: str  # from the header ("Q4_K_M"); from the name only if the header was unreadable
    quant_source: Literal["header", "name"]
    size: int  # bytes, all parts together
    n_params: int | None = None
    bits_per_weight: float | None = None
    architecture: str | None = None
    verdict: str | None = None  # the planner's verdict; None when it could not run
    fits: bool | None = None  # None: unknown (no planner, unreadable header)
    fit: dict[str, Any] | None = None  # the planner's full MemoryPlan.to_dict() (the breakdown)
    error: str | None = None  # why the header, or the plan, is missing
    n_parts_expected: int = 1
    projector: ProjectorChoice | None = None  # a vision model's, downloaded with it

    @property
    def complete(self) -> bool:
        return len(self.files) == self.n_parts_expected

    @property
    def download_files(self) -> tuple[RepoFile, ...]:
        """What downloading this entry fetches: its files, then its projector's."""
        return self.files + ((self.projector.file,) if self.projector is not None else ())

    def missing_in(self, folder: Path) -> tuple[RepoFile, ...]:
        """The download files not in `folder` (the library's `<owner>/<repo>`) at their
        published size: what a download still fetches (a model already in, its projector not)."""
        def present(f: RepoFile) -> bool:
            path = folder / f.name
            return path.is_file() and (f.size is None or path.stat().st_size == f.size)

        return tuple(f for f in self.download_files if not present(f))

    @property
    def summary(self) -> str | None:
        """The planner's one line ("Partial (20 of 33 layers on GPU): 6.10 GiB (weights …)")."""
        return None if self.fit is None else self.fit.get("summary")

    @property
    def is_chat_model(self) -> bool:
        return _NOT_A_CHAT_MODEL.search(self.name) is None and self.architecture != "clip"


@dataclass(frozen=True)
class QuantListing:
    repo: RepoDetails
    entries: tuple[QuantEntry, ...]
    recommended: QuantEntry | None
    recommended_reason: str
    projector: ProjectorChoice | None = None  # what each entry of a vision model brings

    def entry(self, quant: str) -> QuantEntry:
        """The entry for a quant name ("Q4_K_M", case-insensitive) or a file name."""
        wanted = quant.upper()
        for e in self.entries:
            if e.quant.upper() == wanted or e.name == quant or any(f.name == quant for f in e.files):
                return e
        for e in self.entries:  # the name's claim, when the header says otherwise
            if (quant_from_name(e.name) or "").upper() == wanted:
                return e
        have = ", ".join(e.quant for e in self.entries) or "none"
        raise OutriderError(f"{self.repo.repo_id} has no {quant} quant (it has: {have})")


def list_quants(hub: Hub, repo_id: str, revision: str | None = None, *,
                settings: LoadSettings | None = None, devices: Sequence[Any] | None = None,
                preferred: str = DEFAULT_PREFERRED, cache_dir: Path | None = None,
                read_info: ReadInfo | None = None, workers: int = 8,
                details: RepoDetails | None = None, draft: Any = None,
                read_projector: ReadProjector | None = None) -> QuantListing:
    """List, read and judge every GGUF model of `repo_id` (see the module docstring).

    `draft` (a ModelInfo) is planned alongside each entry, as it would be loaded with it.
    `read_info` / `read_projector` (url, headers) read a model's / a projector's header
    (default: remotely, with range requests)."""
    details = details or hub.repo_details(repo_id, revision)
    if cache_dir is None:
        cache_dir = user_dirs().cache
    groups = [g for g in group_gguf_files(details.gguf_files) if not is_projector_name(g[0].name)]
    reader = read_info or read_remote_model_info
    headers = hub.headers()
    projector = choose_projector(details)

    def read(group: tuple[RepoFile, ...]) -> tuple[Any, str | None]:
        return _cached_info(hub, details, group[0].name, headers, reader, cache_dir)

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(groups) or 1))) as pool:
        read_proj = None if projector is None else pool.submit(
            cached_projector_info, hub, details, projector.name, headers, read_projector,
            cache_dir)
        infos = list(pool.map(read, groups))
        if projector is not None and read_proj is not None:
            proj_info, proj_error = read_proj.result()
            projector = dataclasses.replace(projector, info=proj_info, error=proj_error)
    if devices is None:
        devices = list(list_devices())
    entries = tuple(
        _entry(details, group, info, error, settings, devices, draft, projector)
        for group, (info, error) in zip(groups, infos, strict=True)
    )
    recommended, reason = recommend(entries, preferred)
    return QuantListing(details, entries, recommended, reason, projector)


def entry_by_name(details: RepoDetails, wanted: str) -> QuantEntry | None:
    """The entry `wanted` names without reading any header: a file (a projector asked for by
    its name comes alone), or the quant a model's file name claims ("Q4_K_M", any case), with
    the repository's projector; None when no name matches (`list_quants` then reads headers).

    >>> names = ["gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-4b-it-Q8_0.gguf", "mmproj-model-f16.gguf"]
    >>> details = RepoDetails("ggml-org/gemma-3-4b-it-GGUF", "main", license=None, gated=False,
    ...                       last_modified=None, files=tuple(RepoFile(n, None) for n in names))
    >>> [f.name for f in entry_by_name(details, "q8_0").download_files]
    ['gemma-3-4b-it-Q8_0.gguf', 'mmproj-model-f16.gguf']
    >>> entry_by_name(details, "Q6_K") is None
    True
    """
    projector = choose_projector(details)
    for group in group_gguf_files(details.gguf_files):
        names = [f.name for f in group]
        is_projector = is_projector_name(group[0].name)
        claimed = quant_from_name(group[0].name) or ""
        if wanted in names or (not is_projector and claimed.upper() == wanted.upper()):
            return QuantEntry(details.repo_id, details.revision, group[0].name, group,
                              claimed or wanted, "name", sum(f.size or 0 for f in group),
                              projector=None if is_projector else projector)
    return None


def recommend(entries: Sequence[QuantEntry], preferred: str = DEFAULT_PREFERRED
              ) -> tuple[QuantEntry | None, str]:
    """The entry to offer first, and why.

    >>> def entry(quant, fits):
    ...     f = RepoFile(f"x-{quant}.gguf", 1 << 30)
    ...     return QuantEntry("o/x-GGUF", "main", f.name, (f,), quant, "header", 1 << 30,
    ...                       verdict="full_gpu" if fits else "wont_fit", fits=fits)
    >>> entries = [entry("Q3_K_M", True), entry("Q4_K_M", True), entry("Q8_0", False)]
    >>> recommend(entries, "Q6_K")[0].quant                   # Q6_K absent: next smaller
    'Q4_K_M'
    >>> recommend(entries, "Q8_0")[1]                         # Q8_0 does not fit
    'Q4_K_M is the nearest level to Q8_0 that fits (full_gpu)'
    """
    pref = preferred.upper()
    if pref not in PREFERRED_QUANTS:
        raise OutriderError(f"preferred quant must be one of {', '.join(PREFERRED_QUANTS)}, not {preferred}")
    usable = [e for e in entries if e.is_chat_model and e.complete]
    by_level: dict[str, QuantEntry] = {}
    for e in usable:
        by_level.setdefault(e.quant.upper(), e)
    i = PREFERRED_QUANTS.index(pref)
    order = PREFERRED_QUANTS[i:] + tuple(reversed(PREFERRED_QUANTS[:i]))
    for level in order:
        hit = by_level.get(level)
        if hit is not None and hit.fits is not False:
            how = hit.verdict or "fit not checked"
            if level == pref:
                return hit, f"your preferred level {pref} fits ({how})"
            return hit, f"{level} is the nearest level to {pref} that fits ({how})"
    fitting = [e for e in usable if e.fits is not False]
    if fitting:
        e = min(fitting, key=lambda x: x.size)
        if not by_level.keys() & set(PREFERRED_QUANTS):  # absent, not too big: say that
            return e, (f"this repository has none of the usual levels "
                       f"({', '.join(PREFERRED_QUANTS)}); {e.quant} is the smallest that fits")
        return e, f"none of the usual levels fits; {e.quant} is the smallest that does"
    return None, "no quant of this model fits in this machine's free memory"


# -- internals --------------------------------------------------------------------------------


def _cached_info(hub: Hub, details: RepoDetails, filename: str, headers: dict[str, str],
                 reader: ReadInfo, cache_dir: Path) -> tuple[Any, str | None]:
    """The first part's ModelInfo (the reader follows the other parts), cached per commit."""
    key = f"{hub.endpoint}|{details.repo_id}|{details.revision}|{filename}"
    path = cache_dir / "remote-gguf" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    if path.is_file():
        try:
            return _info_from_dict(json.loads(path.read_text())), None
        except (OSError, ValueError, TypeError, KeyError):
            pass  # an old or broken cache entry: read the header again
    url = hub.file_url(details.repo_id, filename, details.revision)
    try:
        info = reader(url, headers)
    except OutriderError as exc:
        return None, str(exc)
    with contextlib.suppress(OSError, TypeError, ValueError, AttributeError):
        write_text(path, json.dumps(_info_to_dict(info)))  # no cache is a slower second look
    return info, None


def _info_to_dict(info: Any) -> dict[str, Any]:
    data: dict[str, Any] = info.to_dict()
    data.pop("bits_per_weight", None)  # a property, not a field
    return data


def _info_from_dict(data: dict[str, Any]) -> ModelInfo:
    """Rebuild a ModelInfo from its cached `to_dict()` (an old entry missing a field is a
    KeyError: the caller reads the header again)."""
    return ModelInfo.from_dict(data)


def _entry(details: RepoDetails, group: tuple[RepoFile, ...], info: Any, error: str | None,
           settings: LoadSettings | None, devices: Sequence[Any], draft: Any,
           projector: ProjectorChoice | None = None) -> QuantEntry:
    first = group[0]
    if _NOT_A_CHAT_MODEL.search(first.name):
        projector = None  # an imatrix file brings no projector
    m = _SPLIT.match(first.name)
    expected = int(m["count"]) if m else 1
    name = f"{m['prefix']}.gguf" if m else first.name
    size = sum(f.size or 0 for f in group)
    if len(group) != expected:
        missing = expected - len(group)
        error = f"{missing} of {expected} parts are missing from the repository"
    if info is None:
        return QuantEntry(details.repo_id, details.revision, name, group,
                          quant_from_name(first.name) or "unknown", "name", size,
                          error=error or "the header could not be read", n_parts_expected=expected,
                          projector=projector)
    entry = QuantEntry(
        details.repo_id, details.revision, name, group, str(info.quant), "header", size,
        n_params=int(info.n_params), bits_per_weight=float(info.bits_per_weight),
        architecture=str(info.architecture), error=error, n_parts_expected=expected,
        projector=projector)
    return _judge(entry, info, settings, devices, draft)


def _judge(entry: QuantEntry, info: Any, settings: LoadSettings | None,
           devices: Sequence[Any], draft: Any) -> QuantEntry:
    """Run the planner for this entry (with its projector, when its header was read); its
    failure leaves the fit unknown."""
    load = settings or LoadSettings(model_path=Path(entry.files[0].name))
    load = dataclasses.replace(load, model_path=Path(entry.files[0].name), mmproj_path=None)
    projector = entry.projector.info if entry.projector is not None else None
    try:
        plan = plan_memory(info, load, list(devices), draft, projector=projector)
    except OutriderError as exc:
        return dataclasses.replace(entry, error=str(exc))
    verdict = plan_verdict(plan)
    fit = plan.to_dict() if hasattr(plan, "to_dict") else None
    return dataclasses.replace(entry, verdict=verdict, fits=plan_fits(plan), fit=fit)


def plan_verdict(plan: Any) -> str:
    """The planner's verdict as text ("full_gpu", "partial", "cpu_only", "wont_fit", …)."""
    verdict = getattr(plan, "verdict", None)
    return str(getattr(verdict, "value", verdict))


def plan_fits(plan: Any) -> bool:
    """Whether the plan says the model can be loaded at all (any verdict but won't fit)."""
    fits = getattr(plan, "fits", None)
    if isinstance(fits, bool):
        return fits
    text = plan_verdict(plan).lower().replace("'", "").replace(" ", "_")
    return not ("wont" in text or "not_fit" in text or "no_fit" in text)

"""`outrider search | show | pull | ls | rm`: find models on the Hub, fetch them, manage the library.

    $ outrider search "qwen2.5 7b instruct" --sort likes
    $ outrider show bartowski/Qwen2.5-7B-Instruct-GGUF --ctx 8192 --kv-k q8_0 --kv-v q8_0
    $ outrider pull bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M     # progress on stderr
    $ outrider ls --all                                            # + HF cache, LM Studio
    $ outrider rm Qwen2.5-7B-Instruct-Q4_K_M --yes

Defaults come from the app's settings (runtime.settings.user): the Hub mirror, the token
for gated repositories, the preferred quant level, the context and KV cache types the fit
assumes, parallel downloads and the models folder. Without a mirror set there, the Hub is the
one in HF_ENDPOINT (default huggingface.co); a token may also come from `--token`, HF_TOKEN or
`hf auth login`. An interrupted pull resumes on the next pull. Pull fetches only the files it
names: other downloads queued in the app stay queued, for the app. A file another Outrider
process (the app, another pull) is downloading is not fetched twice: pull says so, follows that
download's progress, and continues it itself if that process stops before the end.

A vision model's pull brings its projector too (`QuantEntry.download_files`: the repository's
mmproj file, F16 if there is one), and `ls` marks the models that read images ("vision") and
those whose projector is missing ("vision: no projector"; `outrider pull OWNER/REPO:mmproj-….gguf`
fetches it).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from runtime.cli.load_args import FIT, add_load_flags, load_settings
from runtime.downloads.manager import (
    DownloadEvent,
    DownloadManager,
    DownloadNotice,
    DownloadProgress,
    DownloadStateChanged,
    QueueSaveChanged,
)
from runtime.errors import DownloadError, GatedRepo, OutriderError
from runtime.hub.client import Hub
from runtime.hub.quants import (
    DEFAULT_PREFERRED,
    PREFERRED_QUANTS,
    ProjectorChoice,
    QuantEntry,
    QuantListing,
    entry_by_name,
    list_quants,
)
from runtime.library.library import Library, LibraryModel
from runtime.paths import user_dirs
from runtime.settings.load import LoadSettings
from runtime.settings.user import SettingsStore
from runtime.units import fmt_bytes, fmt_duration

_VERDICTS = {"full_gpu": "Full GPU", "partial": "Partial", "cpu_only": "CPU only",
             "wont_fit": "Won't fit"}


def register(subparsers: Any) -> None:
    search = subparsers.add_parser("search", help="search GGUF models on the Hugging Face Hub")
    search.add_argument("text", nargs="?", default="", help="words in the repository name")
    search.add_argument("--sort", default="downloads", choices=["downloads", "likes", "recent"])
    search.add_argument("--author", default=None, help="only this user or organisation")
    search.add_argument("--limit", type=int, default=20)
    search.add_argument("--json", action="store_true", help="print JSON")
    search.set_defaults(handler=run_search)

    show = subparsers.add_parser("show", help="a repository's quants, with will-it-fit verdicts")
    show.add_argument("repo", help="owner/name")
    show.add_argument("--revision", default=None)
    _add_fit_options(show)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=run_show)

    pull = subparsers.add_parser("pull", help="download a model into the library")
    pull.add_argument("spec", help="owner/name[:QUANT or :file.gguf] (default: the recommended quant)")
    pull.add_argument("--revision", default="main")
    pull.add_argument("--token", default=None, help="Hugging Face token (gated repositories)")
    pull.add_argument("--jobs", type=int, default=None,
                      help="parts fetched at once (default: the settings' parallel downloads)")
    _add_fit_options(pull)
    pull.set_defaults(handler=run_pull)

    ls = subparsers.add_parser("ls", help="list the models in the library")
    ls.add_argument("--all", action="store_true",
                    help="also models found in the Hugging Face cache and LM Studio's folders")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(handler=run_ls)

    rm = subparsers.add_parser("rm", help="delete a model from the library")
    rm.add_argument("model", help="id (owner/repo/file), file name or stem; see `outrider ls`")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask")
    rm.set_defaults(handler=run_rm)


def _add_fit_options(p: argparse.ArgumentParser) -> None:
    add_load_flags(p, *FIT, defaults={"--ctx": "the settings', 4096",
                                      "--kv-k": "the settings', f16",
                                      "--kv-v": "the settings', f16"})
    p.add_argument("--prefer", default=None, choices=list(PREFERRED_QUANTS),
                   help=f"preferred quant level (default: the settings', {DEFAULT_PREFERRED})")


@dataclass(frozen=True)
class _Defaults:
    """What the app's settings say, for options the command line leaves out."""

    endpoint: str | None = None
    token: str | None = None
    preferred: str = DEFAULT_PREFERRED
    parallel: int = 2
    n_ctx: int = 4096
    type_k: str = "f16"
    type_v: str = "f16"
    models_dir: Path | None = None


def _defaults() -> _Defaults:
    s = SettingsStore().load()  # a broken settings file is a SettingsError, said as such
    return _Defaults(endpoint=s.hub.endpoint, token=s.hf_token.reveal() if s.hf_token else None,
                     preferred=s.hub.preferred_quant, parallel=s.hub.parallel_downloads,
                     n_ctx=s.fit.n_ctx, type_k=s.fit.type_k, type_v=s.fit.type_v,
                     models_dir=s.models_dir)


def _hub(d: _Defaults, token: str | None = None) -> Hub:
    return Hub(token=token or d.token, endpoint=d.endpoint, cache_dir=user_dirs().cache)


def _settings(args: argparse.Namespace, d: _Defaults) -> LoadSettings:
    return load_settings(args, LoadSettings(model_path=Path("model.gguf"), n_ctx=d.n_ctx,
                                            type_k=d.type_k, type_v=d.type_v))


# -- search / show ----------------------------------------------------------------------------


def run_search(args: argparse.Namespace) -> int:
    hits = _hub(_defaults()).search(args.text, sort=args.sort, author=args.author, limit=args.limit)
    if args.json:
        print(json.dumps([{"repo": h.repo_id, "downloads": h.downloads, "likes": h.likes,
                           "last_modified": h.last_modified.isoformat() if h.last_modified else None,
                           "gated": h.gated} for h in hits], indent=2))
        return 0
    if not hits:
        print("no GGUF repositories found")
        return 0
    rows = [("REPOSITORY", "DOWNLOADS", "LIKES", "UPDATED", "")]
    for h in hits:
        updated = h.last_modified.strftime("%Y-%m-%d") if h.last_modified else "-"
        rows.append((h.repo_id, f"{h.downloads:,}", f"{h.likes:,}", updated, "gated" if h.gated else ""))
    _table(rows, sys.stdout)
    return 0


def run_show(args: argparse.Namespace) -> int:
    d = _defaults()
    settings = _settings(args, d)
    listing = list_quants(_hub(d), args.repo, args.revision, settings=settings,
                          preferred=args.prefer or d.preferred)
    if args.json:
        print(json.dumps(_listing_json(listing), indent=2, default=str))
        return 0
    repo = listing.repo
    modified = repo.last_modified.strftime("%Y-%m-%d") if repo.last_modified else "unknown"
    print(f"{repo.repo_id} @ {repo.revision[:12]}  ·  license {repo.license or 'not stated'}"
          f"  ·  {'gated (needs a token)' if repo.gated else 'open'}  ·  updated {modified}")
    print(f"fit for context {settings.n_ctx:,}, K cache {settings.type_k}, "
          f"V cache {settings.type_v}, on this machine now")
    print()
    rows = [("", "QUANT", "SIZE", "BITS/W", "FIT", "MEMORY", "FILE")]
    for e in listing.entries:
        mark = "*" if listing.recommended is not None and e.name == listing.recommended.name else ""
        bpw = f"{e.bits_per_weight:.2f}" if e.bits_per_weight else "?"
        quant = e.quant if e.quant_source == "header" else f"{e.quant}?"
        files = e.name if len(e.files) == 1 else f"{e.name} ({len(e.files)} parts)"
        rows.append((mark, quant, fmt_bytes(e.size), bpw, _verdict(e), _memory(e), files))
    _table(rows, sys.stdout)
    for e in listing.entries:
        if e.error:
            print(f"  note: {e.name}: {e.error}")
    if listing.projector is not None:
        print(_projector_line(listing.projector))
    print()
    if listing.recommended is not None:
        print(f"recommended: {listing.recommended.quant} — {listing.recommended_reason}")
        if listing.recommended.summary:
            print(f"  {listing.recommended.summary}")
    else:
        print(f"recommended: none — {listing.recommended_reason}")
    return 0


def _projector_line(p: ProjectorChoice) -> str:
    """"vision: projector F16, 812 MiB (mmproj-F16.gguf, 1 of 3), downloaded with each quant
    and counted in its fit; each image takes 256 tokens of the context"."""
    which = f"{p.name}, 1 of {p.n_available}" if p.n_available > 1 else p.name
    if p.info is None:
        return (f"{p.label} ({which}), downloaded with each quant; not counted in the fit: "
                f"{p.error or 'its header was not read'}")
    about = "" if p.info.image_tokens_exact else "about "
    return (f"{p.label} ({which}), downloaded with each quant and counted in its fit; each "
            f"image takes {about}{p.info.image_tokens:,} tokens of the context")


def _verdict(e: QuantEntry) -> str:
    if e.verdict is None:
        return "?"
    text = _VERDICTS.get(e.verdict, e.verdict)
    if e.verdict == "partial" and e.fit:
        text += f" ({e.fit.get('gpu_layers')}/{e.fit.get('n_layers')} layers)"
    return text


def _memory(e: QuantEntry) -> str:
    if not e.fit:
        return "?"
    return (f"{fmt_bytes(e.fit.get('total', 0))} (w {fmt_bytes(e.fit.get('weights', 0))}, "
            f"kv {fmt_bytes(e.fit.get('kv', 0))}, c {fmt_bytes(e.fit.get('compute', 0))})")


def _listing_json(listing: QuantListing) -> dict[str, Any]:
    return {
        "repo": listing.repo.to_dict(),
        "recommended": listing.recommended.name if listing.recommended else None,
        "recommended_reason": listing.recommended_reason,
        "entries": [{"name": e.name, "quant": e.quant, "quant_source": e.quant_source,
                     "files": [f.name for f in e.files], "size": e.size, "n_params": e.n_params,
                     "bits_per_weight": e.bits_per_weight, "verdict": e.verdict, "fits": e.fits,
                     "fit": e.fit, "error": e.error,
                     "projector": e.projector.name if e.projector else None}
                    for e in listing.entries],
        "projector": listing.projector.to_dict() if listing.projector else None,
    }


# -- pull -------------------------------------------------------------------------------------


def run_pull(args: argparse.Namespace) -> int:
    repo_id, _, wanted = args.spec.partition(":")
    if repo_id.count("/") != 1:
        raise OutriderError(f"give the repository as owner/name[:QUANT], not {args.spec!r}")
    d = _defaults()
    hub = _hub(d, args.token)
    entry = _choose(hub, repo_id, args.revision, wanted, args, d)
    models_dir = Library(d.models_dir).models_dir
    folder = models_dir / repo_id
    missing = entry.missing_in(folder)  # a vision model's projector too
    if not missing:
        print(f"{entry.name} is already in the library", file=sys.stderr)
        for f in entry.download_files:
            print(folder / f.name)
        return 0
    progress = _Progress(sys.stderr)
    manager = DownloadManager(hub, models_dir=models_dir, max_concurrent=max(1, args.jobs or d.parallel),
                              on_event=progress)
    # The parts of a split model must come from one commit: pin them to the one listed. A
    # single file follows the branch, so an upstream change is noticed (and restarts it).
    revision = entry.revision if len(entry.files) > 1 else args.revision
    jobs = [manager.enqueue(repo_id, f.name, revision, size=f.size, sha256=f.sha256,
                            group=f"{repo_id}:{entry.quant}") for f in missing]
    manager.start(only=[j.id for j in jobs])  # not the app's other queued jobs
    try:
        finals = manager.wait([j.id for j in jobs])
    except KeyboardInterrupt:
        print("\ninterrupted; the partial download is kept and resumes on the next pull",
              file=sys.stderr)
        raise
    finally:
        manager.shutdown(timeout=10)
    failed = [j for j in finals if j.state != "done"]
    if failed:
        j = failed[0]
        if j.error_kind == GatedRepo.__name__:
            raise GatedRepo(j.error or f"{repo_id} is gated; pass --token or set HF_TOKEN")
        if j.id in progress.elsewhere and j.state in ("paused", "cancelled"):
            raise DownloadError(f"{j.filename} was {j.state} in another Outrider process "
                                "before it finished")
        message = j.error or f"{j.filename} did not finish ({j.state})"
        left = manager.job(j.id).leftover  # a partial file, a copy that failed its check
        if left:
            message += (f"; {fmt_bytes(left)} is kept in {manager.downloads_dir} for the next "
                        "pull (Delete files in the app's Downloads page frees it)")
        raise DownloadError(message)
    fetched = {j.filename: j.path for j in finals}
    for f in entry.download_files:  # in order, those already in the library too
        print(fetched.get(f.name) or folder / f.name)
    return 0


def _choose(hub: Hub, repo_id: str, revision: str, wanted: str,
            args: argparse.Namespace, d: _Defaults) -> QuantEntry:
    """The entry to pull: by file name or the quant in the names, else read the headers."""
    details = hub.repo_details(repo_id, None if revision == "main" else revision)
    if wanted:
        named = entry_by_name(details, wanted)
        if named is not None:
            return named
    listing = list_quants(hub, repo_id, settings=_settings(args, d),
                          preferred=args.prefer or d.preferred, details=details)
    if wanted:
        return listing.entry(wanted)
    if listing.recommended is None:
        raise OutriderError(f"{repo_id}: {listing.recommended_reason}; name a quant "
                            "(owner/name:Q4_K_M) to pull one anyway")
    print(f"pulling {listing.recommended.quant}: {listing.recommended_reason}", file=sys.stderr)
    return listing.recommended


class _Progress:
    """A one-line progress bar per file on stderr (plain lines when it is not a terminal).
    A file another Outrider process is downloading gets a line saying so, then its progress."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._lock = threading.Lock()
        self._last = 0.0
        self.elsewhere: set[str] = set()  # jobs seen running in another process

    def __call__(self, event: DownloadEvent) -> None:
        with self._lock:
            if isinstance(event, DownloadProgress):
                now = time.monotonic()
                if self.tty and (now - self._last > 0.1 or event.received == event.total):
                    self._last = now
                    self.stream.write("\r" + _bar(event) + "\x1b[K")
                    self.stream.flush()
            elif isinstance(event, DownloadNotice):
                self._line(event.message)
            elif isinstance(event, QueueSaveChanged) and event.problem is not None:
                self._line(event.problem)  # once: the download goes on
            elif isinstance(event, DownloadStateChanged):
                job = event.job
                if job.elsewhere and job.id not in self.elsewhere:
                    self.elsewhere.add(job.id)
                    self._line(f"{job.filename}: already being downloaded by another Outrider "
                               "process; waiting for it to finish")
                elif job.state == "queued" and job.id in self.elsewhere:
                    self._line(f"{job.filename}: the other Outrider process stopped before the "
                               "end; continuing here from its partial file")
                elif job.state == "done":
                    self._line(f"{job.filename}: done, verified (sha256)")
                elif job.state == "failed":
                    self._line(f"{job.filename}: failed: {job.error}")
                elif job.state == "running" and not self.tty:
                    self._line(f"{job.filename}: downloading")

    def _line(self, text: str) -> None:
        self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        self.stream.flush()


def _bar(p: DownloadProgress, width: int = 24) -> str:
    total = p.total or 0
    frac = p.received / total if total else 0.0
    filled = int(frac * width)
    eta = fmt_duration(p.eta_s) if p.eta_s is not None else "?"
    return (f"{p.filename[:40]:40} [{'#' * filled}{'.' * (width - filled)}] {frac * 100:5.1f}% "
            f"{fmt_bytes(p.received)}/{fmt_bytes(total)} {fmt_bytes(p.rate)}/s ETA {eta}")


# -- ls / rm ----------------------------------------------------------------------------------


def run_ls(args: argparse.Namespace) -> int:
    library = Library(_defaults().models_dir)
    models = library.scan() + (library.discover() if args.all else [])
    if args.json:
        print(json.dumps([{"id": m.id, "path": str(m.path), "source": m.source, "size": m.size,
                           "quant": m.quant, "architecture": m.architecture,
                           "parts": [str(p) for p in m.parts], "error": m.error,
                           "projector": str(m.projector) if m.projector else None,
                           "capabilities": list(m.capabilities),
                           "projector_missing": m.projector_missing} for m in models],
                         indent=2))
        return 0
    if not models:
        print(f"no models in {library.models_dir}; try `outrider pull OWNER/REPO`")
        return 0
    rows = [("MODEL", "QUANT", "SIZE", "WHERE", "")]
    for m in models:
        where = "library" if m.source == "library" else m.source
        rows.append((m.id, m.quant or ("?" if m.error is None else "unreadable"),
                     fmt_bytes(m.size), where, _vision_mark(m)))
    _table(rows, sys.stdout)
    if any(m.projector_missing for m in models):
        print("\nvision: no projector — the model reads text only until its mmproj file is "
              "beside it: `outrider pull OWNER/REPO:mmproj-FILE.gguf`")
    return 0


def _vision_mark(m: LibraryModel) -> str:
    if m.projector is not None:
        return "vision"
    return "vision: no projector" if m.projector_missing else ""


def run_rm(args: argparse.Namespace) -> int:
    library = Library(_defaults().models_dir)
    model = library.find(args.model)
    if not args.yes:
        if not sys.stdin.isatty():
            raise OutriderError(f"not deleting {model.id} without --yes")
        answer = input(f"delete {model.id} ({fmt_bytes(model.size)})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept")
            return 1
    for path in library.delete(model):
        print(f"deleted {path}")
    return 0


# -- formatting -------------------------------------------------------------------------------


def _table(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")

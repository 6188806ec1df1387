"""A Hub projector's header, read remotely and cached per commit, as the quant table reads a
model's (`runtime.hub.quants`): a few hundred KiB of range requests, once per revision.

    info, error = cached_projector_info(hub, details, "mmproj-model-f16.gguf", hub.headers())
    info.projector_type, info.image_tokens, error      # ggml-org/gemma-3-4b-it-GGUF's
    # ('gemma3', 256, None)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from runtime.atomic_file import write_text
from runtime.errors import OutriderError
from runtime.gguf.projector import ProjectorInfo, projector_info
from runtime.gguf.remote import read_remote_header
from runtime.hub.client import Hub, RepoDetails
from runtime.paths import user_dirs

ReadProjector = Callable[[str, dict[str, str]], ProjectorInfo]


def read_remote_projector(url: str, headers: dict[str, str]) -> ProjectorInfo:
    """A remote projector's facts, from its header."""
    name = url.rsplit("/", 1)[-1].split("?", 1)[0]
    return projector_info(read_remote_header(url, headers).header, Path(name))


def cached_projector_info(hub: Hub, details: RepoDetails, filename: str,
                          headers: dict[str, str], reader: ReadProjector | None = None,
                          cache_dir: Path | None = None) -> tuple[ProjectorInfo | None, str | None]:
    """(the header's facts, None), or (None, why it could not be read); cached by (endpoint,
    repository, commit, file) under `cache_dir/remote-gguf` (default: the user cache)."""
    if cache_dir is None:
        cache_dir = user_dirs().cache
    key = f"projector|{hub.endpoint}|{details.repo_id}|{details.revision}|{filename}"
    path = cache_dir / "remote-gguf" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            return ProjectorInfo(**{**data, "path": Path(data["path"])}), None
        except (OSError, ValueError, TypeError, KeyError):
            pass  # an old or broken cache entry: read the header again
    try:
        info = (reader or read_remote_projector)(
            hub.file_url(details.repo_id, filename, details.revision), headers)
    except OutriderError as exc:
        return None, str(exc)
    with contextlib.suppress(OSError, TypeError, ValueError):  # no cache: a slower second look
        write_text(path, json.dumps({**dataclasses.asdict(info), "path": str(info.path)}))
    return info, None

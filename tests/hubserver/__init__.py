"""The fake Hugging Face Hub for tests: a real HTTP server on 127.0.0.1 (see server.py) and the
repositories of tiny GGUF models it serves (see repos.py)."""

from tests.hubserver.repos import (
    GATED_REPO,
    GATED_TOKEN,
    TINY_DRAFT_REPO,
    TINY_REPO,
    VISION_MODEL,
    VISION_PROJECTOR,
    VISION_REPO,
    add_tiny_repos,
    add_vision_repo,
)
from tests.hubserver.server import FakeHub, Fault, FileStats

__all__ = ["GATED_REPO", "GATED_TOKEN", "TINY_DRAFT_REPO", "TINY_REPO", "VISION_MODEL",
           "VISION_PROJECTOR", "VISION_REPO", "FakeHub", "Fault", "FileStats", "add_tiny_repos",
           "add_vision_repo"]

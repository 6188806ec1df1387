"""Outrider's HTTP server: the OpenAI-compatible API plus `/api/` for the desktop app.

    app = create_app(engine, api_key="k", models_dir=Path("~/models"), limits=ServerLimits())

The wire format is fixed in docs/api.md.
"""

from runtime.server.app import create_app
from runtime.server.state import ServerLimits

__all__ = ["ServerLimits", "create_app"]

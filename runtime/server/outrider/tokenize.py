"""`POST /tokenize`: a text's token ids for a model, as llama-server answers it.

    POST /tokenize {"content": "Hello", "model": "SmolLM2-135M-Instruct.Q4_1"}
    → {"tokens": [19556], "count": 1, "model": "SmolLM2-135M-Instruct.Q4_1"}

The desktop app counts an attached document with it before sending (whether it goes in
whole or as retrieved passages). `add_special` adds the model's BOS as a prompt would get
it. The model is found (and loaded if need be) as for any request (`runtime.server.models.router`).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from runtime.server.generation import lease_for
from runtime.server.request.fields import Text
from runtime.server.state import ServerState

MAX_TOKENIZE_CHARS = 8 * 1024 * 1024


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    content: Annotated[Text, Field(max_length=MAX_TOKENIZE_CHARS)]
    model: str | None = None
    add_special: bool = False


def tokenize_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        lease = await lease_for(state, request, body.model)
        ids = await anyio.to_thread.run_sync(
            partial(lease.engine.tokenize, body.content, add_special=body.add_special))
        return {"tokens": list(ids), "count": len(ids), "model": lease.model.name}

    return router

"""`POST /v1/embeddings`: OpenAI's embeddings API over `EngineAPI.embed`.

    POST /v1/embeddings {"model": "SmolLM2-135M-Instruct.Q4_1", "input": ["a cat", "a kitten"]}
    → {"object": "list", "model": "...", "usage": {"prompt_tokens": 4, "total_tokens": 4},
       "data": [{"object": "embedding", "index": 0, "embedding": [0.0123, ...]}, ...]}

`input` is a string, a list of strings, a list of token ids (one input) or a list of token
id lists, as OpenAI takes it. Vectors have unit L2 length; `encoding_format: "base64"` sends
each as the base64 of its little-endian float32 bytes (what the `openai` client asks for by
default, and decodes itself). `dimensions` is refused: Outrider's models have one fixed size
and it does not cut vectors down. Errors are OpenAI's shape, one line each: 400 for a wrong
type, no input, an empty input, a token id outside the vocabulary, an input over the
embedding limit (`context_length_exceeded`, naming it) or a model that cannot embed; 404 for
a `model` that is not the served one (listing the names it answers to,
`runtime.server.models.names`); 503 while no model is loaded.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import anyio.to_thread
import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from runtime.engine.api import EmbeddingInput, Embeddings
from runtime.events import INT32_MAX
from runtime.server.generation import lease_for
from runtime.server.request.fields import Text, refuse
from runtime.server.state import ServerState

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class EmbeddingRequest(BaseModel):
    """The body OpenAI's `embeddings.create` sends. Unknown fields are ignored (`user`)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    input: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None

    def inputs(self) -> list[EmbeddingInput]:
        """One entry per input: texts, or token id lists.

            >>> EmbeddingRequest(input=[1, 2, 3]).inputs()
            [[1, 2, 3]]
        """
        raw = self.input
        if isinstance(raw, str):
            return [raw]
        if raw and all(isinstance(x, int) for x in raw):
            return [list(raw)]  # type: ignore[arg-type]
        return list(raw)  # type: ignore[arg-type]


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage


def embeddings_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/embeddings", response_model=EmbeddingResponse)
    async def embeddings(body: EmbeddingRequest, request: Request) -> JSONResponse:
        # The names every dialect answers to (loaded just in time); else a 404 listing them.
        lease = await lease_for(state, request, body.model)
        model = lease.model
        if body.dimensions is not None:
            refuse("dimensions", f"{model.name} makes embeddings of one fixed size and Outrider "
                   "does not shorten them; leave dimensions out")
        inputs = body.inputs()
        if not inputs:
            refuse("input", "give at least one text to embed (the list is empty)")
        result = await anyio.to_thread.run_sync(lease.engine.embed, inputs)
        return JSONResponse(embedding_reply(result, model.name, body.encoding_format))

    return router


def embedding_reply(result: Embeddings, model: str,
                    encoding_format: Literal["float", "base64"]) -> dict[str, Any]:
    """The response body for `result`.

        >>> r = Embeddings((np.array([0.6, 0.8], dtype=np.float32),), (3,), "mean")
        >>> embedding_reply(r, "m", "base64")["data"][0]["embedding"]
        'mpkZP83MTD8='
    """
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
            for i, v in enumerate(result.vectors)]
    tokens = result.prompt_tokens
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as JSON numbers, or as base64 of little-endian float32 (OpenAI's base64)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    values: list[float] = np.asarray(vector, dtype=np.float32).tolist()
    return values

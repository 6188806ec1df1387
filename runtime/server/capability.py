"""Whether the model a request names can do what the request asks (`LoadedModel.capabilities`,
`runtime.chat.families.capabilities`), said before anything reaches the engine.

A generation (OpenAI chat and completions, Responses, Anthropic messages, Ollama chat and
generate) needs a model that writes ("chat"). An encoder-only model — a BERT-style embedder,
a reranker — does not: its attention sees the whole input at once, so it has no next token to
give, and llama.cpp would answer noise. Such a request is a 400 in the dialect's own shape:

    >>> require_generation(bert)    # capabilities ("embeddings",)
    Traceback (most recent call last):
    runtime.errors.GenerationUnsupported: tiny-bert is an embedding model (bert): it makes
    embeddings (POST /v1/embeddings, /api/embed) but cannot write text; ask a chat model

(one line in the real message). Embeddings need no check here: the engine refuses a model
that cannot pool (`runtime.engine.embeddings.pooling_for`), with the reason.
"""

from __future__ import annotations

from runtime.engine.api import LoadedModel
from runtime.errors import GenerationUnsupported, shown


def require_generation(model: LoadedModel) -> None:
    """`GenerationUnsupported` (400) unless `model` writes text."""
    if "chat" in model.capabilities:
        return
    name, arch = shown(model.name), shown(model.architecture)
    if "embeddings" in model.capabilities:
        raise GenerationUnsupported(
            f"{name} is an embedding model ({arch}): it makes embeddings (POST /v1/embeddings, "
            "/api/embed) but cannot write text; ask a chat model")
    raise GenerationUnsupported(
        f"{name} ({arch}) cannot write text: it is not a decoder (a reranker or an encoder); "
        "ask a chat model")

"""One `POST /v1/embeddings` call, answered asynchronously: the vectors of a few texts.

    call = client.embed(["a cat", "a kitten"])
    call.done.connect(on_vectors)        # list[list[float]], in input order
    call.failed.connect(on_error)        # ReplyError (the server's one line, or the network's)
"""

from __future__ import annotations

from app.engine.json_call import JsonCall
from app.engine.wire import parse_embeddings
from app.qt import QtCore


class EmbeddingsCall(JsonCall):
    """Signals:
        done(list[list[float]]): one vector per input text.
        failed(ReplyError): the engine refused (no model, a model that cannot embed …) or
            could not be reached. Exactly one of the two is emitted, once; then the call
            deletes itself (keep no reference past it).
    """

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parse_embeddings, parent)

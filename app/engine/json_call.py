"""One request to the engine answered with one JSON body, asynchronously: the `done` signal
carries the body as `parse` reads it, `failed` the reason it did not come.

    call = JsonCall(parse_token_count, parent)
    call.attach(nam.post(request, body))   # or call.fail_soon(error): no request was made
    call.done.connect(on_answer)           # parse(body): a TokenCount, vectors …
    call.failed.connect(on_error)          # ReplyError (the server's one line, or the network's)

`EngineClient.embed` and `EngineClient.tokenize` answer with one; a call ends exactly once and
then deletes itself, so its owner keeps no reference past it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.engine.wire import ReplyError, WireError, parse_error_body
from app.qt import QtCore, QtNetwork, Signal

_Req = QtNetwork.QNetworkRequest
_NetErr = QtNetwork.QNetworkReply.NetworkError


class JsonCall(QtCore.QObject):
    """Signals:
        done(object): the answer, as `parse` made it from the JSON body.
        failed(ReplyError): the engine refused (no model, a model that cannot do it …), could
            not be reached, or answered something `parse` cannot read. Exactly one of the
            two is emitted, once; then the call deletes itself.
    """

    done = Signal(object)
    failed = Signal(object)

    def __init__(self, parse: Callable[[Any], Any], parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._parse = parse
        self._reply: QtNetwork.QNetworkReply | None = None
        self._ended = False

    def attach(self, reply: QtNetwork.QNetworkReply) -> None:
        self._reply = reply
        reply.finished.connect(self._on_finished)

    def fail_soon(self, error: ReplyError) -> None:
        """End with `error` on the next turn of the event loop (no request was made)."""
        QtCore.QTimer.singleShot(0, self, lambda: self._end(None, error))

    def cancel(self) -> None:
        """Stop waiting: neither signal comes, and the call deletes itself."""
        if self._ended:
            return
        self._ended = True
        if self._reply is not None and not self._reply.isFinished():
            self._reply.abort()
        self.deleteLater()

    def _on_finished(self) -> None:
        reply, self._reply = self._reply, None
        if reply is None:
            return
        reply.deleteLater()
        status = reply.attribute(_Req.Attribute.HttpStatusCodeAttribute)
        body = bytes(reply.readAll().data())
        if status is not None and int(status) >= 400:
            self._end(None, parse_error_body(body, int(status)))
        elif reply.error() != _NetErr.NoError:
            self._end(None, ReplyError("NetworkError", reply.errorString()))
        else:
            try:
                self._end(self._parse(json.loads(body)), None)
            except (WireError, ValueError) as exc:
                self._end(None, ReplyError("ProtocolError",
                                           f"The engine sent something unreadable: {exc}"))

    def _end(self, answer: object, error: ReplyError | None) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None:
            self.failed.emit(error)
        else:
            self.done.emit(answer)
        self.deleteLater()  # one answer each: nothing is left to hear from it

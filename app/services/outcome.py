"""A background job's result, delivered to a page only while the page exists.

    job = services.on_disk(library.scan)
    on_result(job, self, self.show_models, lambda exc: self.status.setText(str(exc)))

A lambda connected straight to `job.done` would still run after its page was deleted (and
touch dead widgets); `on_result` checks that the page still exists first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.qt import QtCore, isValid
from app.services.background import Job


def on_result(job: Job, owner: QtCore.QObject, done: Callable[[Any], Any] | None = None,
              failed: Callable[[Any], Any] | None = None) -> None:
    """Call `done(result)` or `failed(exception)` on the GUI thread when `job` ends, unless
    `owner` is gone by then (a late answer for a closed page is dropped, not a crash). The job
    lets go of both callbacks once it has settled."""

    def deliver(callback: Callable[[Any], Any] | None, value: object) -> None:
        if callback is not None and isValid(owner):
            callback(value)

    job.done.connect(lambda value: deliver(done, value))
    job.failed.connect(lambda exc: deliver(failed, exc))

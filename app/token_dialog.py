"""Asking for a Hugging Face token: a small dialog with the text hidden as it is typed.

`TokenPrompt` is the type pages take, so tests can answer in place of a person:

    page = RepoPage(..., ask_token=lambda parent, repo_id: "hf_test_token")
"""

from __future__ import annotations

from collections.abc import Callable

from app.qt import QtWidgets

TokenPrompt = Callable[[QtWidgets.QWidget, str], "str | None"]


def ask_token(parent: QtWidgets.QWidget, repo_id: str) -> str | None:
    """The token the user typed, or None if they cancelled (or left it blank)."""
    text, ok = QtWidgets.QInputDialog.getText(
        parent, "Hugging Face token",
        f"{repo_id} is gated: accept its terms on huggingface.co, then paste an access token "
        "(huggingface.co → Settings → Access Tokens, read access).\n"
        "It is kept in your settings folder, readable by you alone.",
        QtWidgets.QLineEdit.EchoMode.Password)
    token = text.strip()
    return token if ok and token else None

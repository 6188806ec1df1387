"""Export a conversation: Markdown (the visible path, for reading) or JSON (every branch,
for tools). Pure functions over the plain conversation objects.

Images go with the export: `export_conversation` copies each into a `<name>_files/` folder
beside the exported file (by the sha256 name it has in the chat store), and both formats
refer to them there (`![photo.png](Chat_files/3f2a….png)`, `"file"` in JSON). Documents are
named with their size; a reply given passages of a long one says which.

    >>> conv = Conversation(1, "Hi", 0.0, 0.0, system_prompt="Be brief.")
    >>> tree = MessageTree([Message(1, 1, None, "user", "Hello", 0.0),
    ...                     Message(2, 1, 1, "assistant", "Hi!", 0.0)])
    >>> print(to_markdown(conv, tree.path(2)))
    # Hi
    <BLANKLINE>
    > **System:** Be brief.
    <BLANKLINE>
    ## You
    <BLANKLINE>
    Hello
    <BLANKLINE>
    ## Assistant
    <BLANKLINE>
    Hi!
    <BLANKLINE>
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from app.chat.attachments import Attachment, used_passages
from app.chat.conversation import Conversation, Message, MessageTree
from app.chat.footer import footer_text
from app.chat.media_files import MediaFiles, file_name
from runtime.atomic_file import write_text

FORMAT_VERSION = 1


def to_markdown(conv: Conversation, path: list[Message], files: str = "") -> str:
    """`files`: the folder (relative to the export) holding the images; "" names them only."""
    lines = [f"# {conv.title}", ""]
    if conv.system_prompt.strip():
        quoted = "\n> ".join(conv.system_prompt.strip().splitlines())
        lines += [f"> **System:** {quoted}", ""]
    question: list[Attachment] = []
    for message in path:
        lines += ["## You" if message.role == "user" else "## Assistant", ""]
        if message.role == "user":
            question = message.attachments
            lines += _attachment_lines(message.attachments, files)
        elif used_passages(question):
            lines += [f"*{used_passages(question)}*", ""]
        if message.reasoning.strip():  # folded, as in the app (GitHub and most viewers fold it)
            lines += ["<details>", f"<summary>{thought_for(message.stats)}</summary>", "",
                      message.reasoning.strip(), "", "</details>", ""]
        lines += [message.content.rstrip(), ""]
        if message.error:
            lines += [f"*Error: {message.error}*", ""]
        footer = footer_text(message.stats)
        if footer:
            lines += [f"*{footer}*", ""]
    return "\n".join(lines)


def _attachment_lines(attachments: list[Attachment], files: str) -> list[str]:
    lines: list[str] = []
    for a in attachments:
        if a.kind == "image":
            lines.append(f"![{a.name}]({_file(a, files)})" if files else f"*[image: {a.name}]*")
        else:
            lines.append(f"*Attached: {a.describe()}*")
    return [*lines, ""] if lines else []


def _file(attachment: Attachment, files: str) -> str:
    return f"{files}/{file_name(attachment.sha256, attachment.mime)}"


def _attachment_json(attachment: Attachment, files: str) -> dict[str, Any]:
    data = attachment.to_dict()
    if attachment.kind == "image" and files:
        data["file"] = _file(attachment, files)
    return data


def to_json(conv: Conversation, tree: MessageTree, files: str = "") -> dict[str, Any]:
    """Every message (all branches) with its parent, plus the path shown when exported;
    `files` as in `to_markdown`."""
    return {
        "format": "outrider-chat", "version": FORMAT_VERSION,
        "title": conv.title, "created": conv.created, "updated": conv.updated,
        "system_prompt": conv.system_prompt, "model": conv.model,
        "sampling": conv.sampling_dict(), "response_schema": conv.response_schema,
        "current_path": [m.id for m in tree.path(conv.current_leaf)],
        "messages": [
            {"id": m.id, "parent_id": m.parent_id, "role": m.role, "content": m.content,
             "reasoning": m.reasoning, "created": m.created, "status": m.status,
             "error": m.error, "stats": m.stats, "draft_spans": m.draft_spans,
             "attachments": [_attachment_json(a, files) for a in m.attachments]}
            for m in tree.all()
        ],
    }


def thought_for(stats: dict[str, Any]) -> str:
    """The title of a reply's thinking block, from the time between its first and last
    reasoning text (`stats["thinking_s"]`).

    >>> thought_for({"thinking_s": 4.23}), thought_for({"thinking_s": 75.0}), thought_for({})
    ('Thought for 4.2 s', 'Thought for 1 min 15 s', 'Thought')
    """
    seconds = stats.get("thinking_s")
    if not isinstance(seconds, int | float):
        return "Thought"
    if seconds < 60:
        return f"Thought for {seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"Thought for {minutes} min {rest} s"


def export_conversation(conv: Conversation, tree: MessageTree, path: Path,
                        media: MediaFiles | None = None) -> None:
    """Write `path` as JSON when it ends in .json, else as Markdown; with `media`, the
    images of the exported messages are copied into `<stem>_files/` beside it."""
    as_json = path.suffix.lower() == ".json"
    messages = tree.all() if as_json else tree.path(conv.current_leaf)
    images = {(a.sha256, a.mime) for m in messages for a in m.attachments if a.kind == "image"}
    files = ""
    if media is not None and images:
        files = f"{path.stem}_files"
        folder = path.with_name(files)
        folder.mkdir(exist_ok=True)
        for sha, mime in sorted(images):
            source = media.path(sha, mime)
            if source.is_file():
                shutil.copyfile(source, folder / source.name)
    if as_json:
        text = json.dumps(to_json(conv, tree, files), indent=2, ensure_ascii=False) + "\n"
    else:
        text = to_markdown(conv, tree.path(conv.current_leaf), files)
    # A failed export leaves no half file, and the export gets the user's normal file mode.
    write_text(path, text, prefix=".export-")

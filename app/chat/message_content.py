"""A message's attachments between the composer, the chat store and the engine: stored when
sent (`keep_attachments`), turned into the API's `content` for each request (`api_content`),
and counted against the context (`tokens_used`: documents by their tokenizer count when there
is one, images by what the model's projector makes of each). Functions over the store, no Qt.

    attachments = keep_attachments(store, composer.attachments, budget=1800)
    body["messages"].append({"role": "user", "content": api_content(store, message)})
"""

from __future__ import annotations

from typing import Any

from app.chat.attachments import (
    Attachment,
    Mode,
    Pending,
    PendingDocument,
    PendingImage,
    data_url,
    estimate_tokens,
    user_content,
)
from app.chat.conversation import Message
from app.chat.store import ChatStore


def keep_attachments(store: ChatStore, pending: list[Pending], budget: int) -> list[Attachment]:
    """Store the composer's attachments (image files, document texts) and describe them;
    the documents go whole when all of them fit in `budget` tokens (the context left once
    the conversation, the reply and the message's images have theirs), else as passages."""
    documents = [p for p in pending if isinstance(p, PendingDocument)]
    mode: Mode = "whole" if sum(d.tokens for d in documents) <= budget else "passages"
    out: list[Attachment] = []
    for item in pending:
        if isinstance(item, PendingImage):
            sha = store.media.put(item.data, item.mime)
            out.append(Attachment("image", item.name, sha, mime=item.mime))
        else:
            store.save_document(item.sha256, item.document)
            out.append(item.attachment(mode))
    return out


def api_content(store: ChatStore, message: Message) -> str | list[dict[str, Any]]:
    """A message's `content` as the API takes it: its text, its documents (whole, or the
    passages picked), its images as data: URLs in `image_url` parts."""
    if message.role != "user" or not message.attachments:
        return message.content
    documents: list[tuple[Attachment, str]] = []
    images: list[str] = []
    for a in message.attachments:
        if a.kind == "image":
            try:
                images.append(data_url(store.media.read(a.sha256, a.mime), a.mime))
            except OSError:  # the file was removed by hand: the text still goes
                continue
        else:
            doc = store.document(a.sha256) if a.mode == "whole" else None
            documents.append((a, doc.text if doc is not None else ""))
    return user_content(message.content, documents, images)


def tokens_used(path: list[Message], system_prompt: str, text: str,
                image_tokens: int = 0) -> int:
    """Tokens of a conversation path with its documents and images, the system prompt and
    the text being typed. Texts are estimated; a whole document counts its `tokens` (the
    tokenizer's count when it was had); each image counts `image_tokens`, what the served
    model's projector makes of one (`ServedModel.image_tokens`).

    >>> from app.chat.conversation import Message
    >>> photo = Attachment("image", "cat.png", "ab", mime="image/png")
    >>> doc = Attachment("document", "a.md", "cd", tokens=120, exact=True)
    >>> question = Message(1, 1, None, "user", "Compare them", 0.0, attachments=[photo, doc])
    >>> tokens_used([question], "", "", image_tokens=256)  # 3 (the text) + 256 + 120
    379
    """
    used = estimate_tokens(system_prompt) + estimate_tokens(text)
    for message in path:
        used += estimate_tokens(message.content)
        for a in message.attachments:
            if a.kind == "image":
                used += image_tokens
            else:
                used += a.tokens if a.mode == "whole" else \
                    sum(estimate_tokens(p.text) for p in a.passages)
    return used

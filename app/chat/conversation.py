"""Conversations as plain Python: messages form a tree, the transcript is one path through it.

Edit & resend and Regenerate never overwrite: they add a sibling (a new user message under
the same parent, or a new reply under the same user message), so every earlier version stays
reachable by switching branches.

    user1 ── reply1                          path(leaf=reply1b) = [user1, reply1b]
        └─── reply1b   (Regenerate)          siblings(reply1b) = [reply1, reply1b]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from app.chat.attachments import Attachment
from runtime.errors import SettingsError
from runtime.events import SamplingParams

Role = Literal["user", "assistant"]
Status = Literal["done", "streaming", "waiting", "stopped", "error"]

# A chat's sampling before anything is remembered: the runtime's own defaults, the ones
# Settings → Model shows for a model never configured. One owner (`SamplingParams`), so the
# Chat settings and Settings → Model never disagree (they once said 0.70 / 1024 and 0.80 / 512).
DEFAULT_SAMPLING = SamplingParams()
TITLE_LENGTH = 40


def title_for(text: str, length: int = TITLE_LENGTH) -> str:
    """A conversation's title from its first message: the first line, cut at a word
    boundary with "…" when longer than `length` characters.

    >>> title_for("How do I reverse a list in Python without copying it?\\nThanks")
    'How do I reverse a list in Python…'
    >>> title_for("Short question\\nsecond line")
    'Short question'
    >>> title_for("Supercalifragilisticexpialidociousness-and-more-of-it", 20)
    'Supercalifragilisti…'
    >>> title_for("  \\n  ")
    'New chat'
    """
    lines = [line for line in (" ".join(ln.split()) for ln in text.splitlines()) if line]
    if not lines:
        return "New chat"
    first = lines[0]
    if len(first) <= length:
        return first
    cut = first[:length - 1]
    if first[length - 1] != " " and " " in cut:  # mid-word: back to the word's start
        cut = cut[:cut.rindex(" ")]
    return cut.rstrip(" ,;:.-") + "…"


@dataclass
class Message:
    """One message. `draft_spans` are [start, end) character ranges of reply text that came
    from accepted draft tokens; `stats` is the reply footer (tokens, tok/s, TTFT …);
    `reasoning` is the model's thinking before its answer (the server's `reasoning_content`),
    shown as a collapsed block above the answer and never sent back to the model;
    `attachments` are a user message's images and documents (`app.chat.attachments`)."""

    id: int
    conversation_id: int
    parent_id: int | None
    role: Role
    content: str
    created: float
    status: Status = "done"
    error: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    draft_spans: list[list[int]] = field(default_factory=list)
    reasoning: str = ""
    attachments: list[Attachment] = field(default_factory=list)

    def add_text(self, text: str, drafted: bool) -> None:
        """Append streamed text, extending the draft spans when it came from the draft.

        >>> m = Message(1, 1, None, "assistant", "", 0.0)
        >>> m.add_text("a", False); m.add_text("bc", True); m.add_text("d", True)
        >>> m.content, m.draft_spans
        ('abcd', [[1, 4]])
        """
        start = len(self.content)
        self.content += text
        if drafted and text:
            if self.draft_spans and self.draft_spans[-1][1] == start:
                self.draft_spans[-1][1] = len(self.content)
            else:
                self.draft_spans.append([start, len(self.content)])


@dataclass
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    system_prompt: str = ""
    model: str = ""  # path of the model this chat was last used with
    sampling: SamplingParams = DEFAULT_SAMPLING
    current_leaf: int | None = None
    # The "Structured output" JSON schema as the user typed it ("" = off); sent as
    # response_format json_schema when it is valid (app.chat.schema).
    response_schema: str = ""

    def sampling_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self.sampling)
        out["stop"] = list(self.sampling.stop)
        return out


def sampling_from_dict(data: dict[str, Any]) -> SamplingParams:
    """Validated sampling settings from stored JSON; unknown keys are an error."""
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SettingsError(f"unknown sampling setting(s): {', '.join(unknown)}")
    values = dict(data)
    if "stop" in values:
        values["stop"] = tuple(values["stop"])
    return SamplingParams(**values)


class MessageTree:
    """All messages of one conversation, indexed by id and by parent."""

    def __init__(self, messages: list[Message] | None = None) -> None:
        self._by_id: dict[int, Message] = {}
        self._children: dict[int | None, list[Message]] = {}
        for message in sorted(messages or (), key=lambda m: m.id):
            self.add(message)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._by_id

    def get(self, message_id: int) -> Message:
        return self._by_id[message_id]

    def all(self) -> list[Message]:
        return sorted(self._by_id.values(), key=lambda m: m.id)

    def add(self, message: Message) -> None:
        self._by_id[message.id] = message
        self._children.setdefault(message.parent_id, []).append(message)

    def children(self, parent_id: int | None) -> list[Message]:
        return list(self._children.get(parent_id, ()))

    def siblings(self, message_id: int) -> list[Message]:
        return self.children(self.get(message_id).parent_id)

    def path(self, leaf_id: int | None) -> list[Message]:
        """Root → leaf. A missing leaf gives the newest branch from the root."""
        if leaf_id is None or leaf_id not in self._by_id:
            roots = self.children(None)
            if not roots:
                return []
            leaf_id = self.newest_leaf(roots[-1].id)
        out: list[Message] = []
        node: Message | None = self._by_id[leaf_id]
        while node is not None:
            out.append(node)
            node = self._by_id.get(node.parent_id) if node.parent_id is not None else None
        return out[::-1]

    def newest_leaf(self, message_id: int) -> int:
        """Follow the newest child down to a leaf (where switching to a branch lands)."""
        current = message_id
        while children := self._children.get(current):
            current = children[-1].id
        return current

    def branch_position(self, message_id: int) -> tuple[int, int]:
        """(1-based index among its siblings, number of siblings)."""
        siblings = self.siblings(message_id)
        return [m.id for m in siblings].index(message_id) + 1, len(siblings)

    def switch(self, message_id: int, step: int) -> int | None:
        """The leaf after moving `step` siblings from `message_id` (None at the ends).

        >>> tree = MessageTree([Message(1, 1, None, "user", "q", 0), Message(2, 1, 1, "assistant",
        ...     "a", 0), Message(3, 1, 1, "assistant", "b", 0)])
        >>> tree.switch(3, -1), tree.switch(3, +1)
        (2, None)
        """
        siblings = self.siblings(message_id)
        index = [m.id for m in siblings].index(message_id) + step
        if not 0 <= index < len(siblings):
            return None
        return self.newest_leaf(siblings[index].id)

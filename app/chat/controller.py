"""The chat's state and actions, without widgets: Send, Stop, Regenerate, Edit & resend,
branches, per-conversation settings, saving as replies stream.

Views call the actions and redraw on the signals; the controller talks to the engine through
`EngineClient` and to disk through `ChatStore`. A reply's text is committed at least once a
second while it streams (`SAVE_INTERVAL_MS`), so a crash of anything loses at most that.
If the engine is not running when the user sends (it crashed, or was stopped), the controller
asks the client to start it — which reloads the model the user wanted — and sends once it is
ready; a failure on the way is shown on the reply, never inserted into its text.

A reasoning model's thinking (the server's `reasoning_content`) is kept on the reply beside
its answer, saved as it streams like the answer, and never sent back: the next request
carries earlier replies' answers only. The footer counts thinking and answer tokens apart
from the token ids each streamed chunk carries (`Generation.count`). A chat's structured
output schema (`app.chat.schema`) is sent as `response_format`; while it is invalid, Send
is blocked and says why, so no reply comes out unconstrained by mistake.

Attachments (`app.chat.attachments`): a user message's images are stored content-addressed
beside the chat store and sent as OpenAI `image_url` content parts (data: URLs); a model
without the "vision" capability refuses them before anything is sent. Its documents go in
whole when they fit the context left (`context_budget`: a document by the served model's
tokenizer count, `count_tokens`, once the composer has it; each image by the model's
`image_tokens`), else as the passages a `PassageFinder` picks with the served model's
embeddings, just before the request.

What is pure lives beside it: the request's body (`app.chat.request_body`) and the reply's
footer (`app.chat.footer`); this object keeps the state, the engine's signals and the saving.

A worker that fails the model (`worker_lost` mid-reply, `worker_unavailable` at a load) is
named in `worker_problem`, so the page can offer to reload without it (`settings_without`):
the reply keeps its text so far and its error, the message it answers stays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from app.chat import schema
from app.chat.attachments import NOT_VISION, Attachment, Pending, PendingImage
from app.chat.conversation import (
    DEFAULT_SAMPLING,
    Conversation,
    Message,
    MessageTree,
    title_for,
)
from app.chat.footer import footer_stats
from app.chat.generation import Generation
from app.chat.lost_worker import lost_worker, without_worker
from app.chat.message_content import keep_attachments, tokens_used
from app.chat.request_body import request_body
from app.chat.retrieval import PassageFinder
from app.chat.store import ChatStore
from app.engine.client import EngineClient, EngineState
from app.engine.json_call import JsonCall
from app.engine.wire import ReplyError, ReplyFinished, TextDelta
from app.qt import QtCore, Signal
from runtime.events import SamplingParams
from runtime.settings.load import LoadSettings

SAVE_INTERVAL_MS = 500
# The sampling defaults remembered for a model file (Settings → Model), or None.
SamplingDefaults = Callable[[str], "SamplingParams | None"]
INTERRUPTED = "Outrider closed while this reply was being written."
NO_MODEL = "No model is loaded: pick one above."
DEFAULT_CONTEXT = 4096  # tokens, when the engine has not said (no model loaded yet)
CONTEXT_MARGIN = 64  # tokens kept free for the chat template's own markers


class ChatController(QtCore.QObject):
    """One open conversation and the reply being generated for it.

    Signals:
        conversation_opened(Conversation | None): another conversation is shown (or none).
        transcript_changed(): the visible path changed (a message added, a branch switched).
        message_changed(int): a message's text, status or footer changed (streaming).
        busy_changed(bool): a reply is being generated (or waits for the engine).
        conversations_changed(): titles/order/membership of the list changed.
        step_received(StepStats): speculative statistics of the current reply.
        first_token(float): the reply's first text arrived, this many seconds after it was
            sent (the Speed panel's "Last TTFT" while the reply is still being written; the
            engine's own figure replaces it when the reply ends).
        reply_finished(Message): a reply ended (done, stopped or failed).
        send_blocked(str): why Send cannot work now ("" when it can): no model is loaded
            and none is wanted, so a message would only fail.
        worker_problem(str, str): a worker failed the model (the worker "host:port", the
            server's one-line message): a reply or a load ended with `worker_lost` or
            `worker_unavailable`.
    """

    conversation_opened = Signal(object)
    transcript_changed = Signal()
    message_changed = Signal(int)
    busy_changed = Signal(bool)
    conversations_changed = Signal()
    step_received = Signal(object)
    reply_finished = Signal(object)
    first_token = Signal(float)
    send_blocked = Signal(str)
    worker_problem = Signal(str, str)

    def __init__(self, store: ChatStore, client: EngineClient,
                 parent: QtCore.QObject | None = None, *,
                 sampling_defaults: SamplingDefaults | None = None) -> None:
        super().__init__(parent)
        self.store = store  # the page's conversation list reads the same store
        self._client = client
        self._sampling_defaults = sampling_defaults
        self.conversation: Conversation | None = None
        self.tree = MessageTree()
        self._generation: Generation | None = None
        self._save_timer = QtCore.QTimer(self, interval=SAVE_INTERVAL_MS)
        self._save_timer.timeout.connect(self._save_progress)
        client.state_changed.connect(self._on_engine_state)
        client.problem.connect(self._on_engine_problem)
        client.model_changed.connect(self._on_engine_model)

    # -- queries -----------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._generation is not None

    @property
    def generating_id(self) -> int | None:
        return self._generation.message.id if self._generation else None

    def send_blocked_reason(self) -> str:
        """Why Send would fail now, or "": nothing loaded and nothing wanted (after Unload,
        or before the first load), or the chat's structured output schema is invalid. A
        crashed or stopped engine with a wanted model is no reason — sending restarts it."""
        if self._client.wanted is None and self._client.model is None:
            return NO_MODEL
        problem = self.schema_problem()
        if problem:
            return f"Structured output: {problem}"
        return ""

    def schema_problem(self) -> str:
        """What is wrong with this chat's structured output schema ("" when nothing is)."""
        return schema.check(self.conversation.response_schema) if self.conversation else ""

    def path(self) -> list[Message]:
        if self.conversation is None:
            return []
        return self.tree.path(self.conversation.current_leaf)

    def settings_without(self, worker: str) -> LoadSettings | None:
        """The load settings of the model last asked for, without `worker` (None when no
        load asked for it): what "Reload without host:port" loads."""
        asked = self._client.asked
        if asked is None or worker not in asked.workers:
            return None
        return without_worker(asked, worker)

    def attachment_problem(self, pending: list[Pending]) -> str:
        """Why these attachments cannot be sent to the loaded model ("" when they can):
        images to a model without a projector. With no model known yet, the engine decides."""
        model = self._client.model
        if model is not None and "vision" not in model.capabilities and \
                any(isinstance(p, PendingImage) for p in pending):
            return NOT_VISION.format(model=model.name)
        return ""

    def context_budget(self, text: str = "",
                       attachments: Sequence[Pending | Attachment] = ()) -> int:
        """Tokens left for documents in the next message: the context, less the reply's
        `max_tokens`, the system prompt, the conversation so far (its images included),
        `text` and the images among `attachments` (those going with the next message). Texts
        are estimated; documents count their tokenizer count when they have one; an image
        counts the served model's `image_tokens`."""
        conv = self.conversation
        model = self._client.model
        n_ctx = (model.n_ctx if model else 0) or DEFAULT_CONTEXT
        reply = (conv.sampling if conv else DEFAULT_SAMPLING).max_tokens
        per_image = (model.image_tokens if model else None) or 0
        images = sum(isinstance(a, PendingImage) or (isinstance(a, Attachment) and a.kind == "image")
                     for a in attachments)
        used = tokens_used(self.path(), conv.system_prompt if conv else "", text, per_image)
        return n_ctx - reply - used - images * per_image - CONTEXT_MARGIN

    def count_tokens(self, text: str) -> JsonCall:
        """How many tokens `text` is for the served model (done: `TokenCount`; failed when
        no model is ready or the engine cannot say)."""
        return self._client.tokenize(text)

    def tokenizer(self) -> str:
        """The model that `count_tokens` counts with now ("" when none is ready)."""
        model = self._client.model
        return model.name if model is not None and self._client.state == EngineState.READY \
            else ""

    # -- conversations -----------------------------------------------------------------

    def new_conversation(self, response_schema: str = "") -> Conversation:
        """A new chat: the sampling remembered for the model, the system prompt of the chat
        before; a structured output schema only when given (a new chat is free text)."""
        self.stop()
        model = str(self._client.wanted.model_path) if self._client.wanted else ""
        previous = self.conversation
        # A new chat has no sampling of its own: the model's remembered defaults, else the
        # chat before's, else the app's.
        remembered = self._sampling_defaults(model) if model and self._sampling_defaults else None
        conv = self.store.create_conversation(
            model=model,
            system_prompt=previous.system_prompt if previous else "",
            sampling=remembered or (previous.sampling if previous else DEFAULT_SAMPLING),
            response_schema=response_schema)
        self._show(conv, MessageTree())
        self.conversations_changed.emit()
        return conv

    def open_latest(self) -> Conversation | None:
        """Open the conversation used last (the app starts where the user left off)."""
        latest = self.store.list_conversations(limit=1)
        if latest and self.conversation is None:
            self.open(latest[0].id)
        return self.conversation

    def open(self, conversation_id: int) -> None:
        if self.conversation is not None and self.conversation.id == conversation_id:
            return
        self.stop()
        conv = self.store.conversation(conversation_id)
        messages = self.store.messages(conversation_id)
        for message in messages:
            if message.status in ("streaming", "waiting"):
                message.status, message.error = "error", INTERRUPTED
                self.store.save_message(message)
        self._show(conv, MessageTree(messages))

    def close_conversation(self) -> None:
        self.stop()
        self._show(None, MessageTree())

    def rename(self, conversation_id: int, title: str) -> None:
        title = " ".join(title.split())[:200] or "Untitled"
        conv = self._conv(conversation_id)
        conv.title = title
        self.store.save_conversation(conv)
        if self.conversation is not None and conv.id == self.conversation.id:
            self.conversation.title = title
        self.conversations_changed.emit()

    def delete(self, conversation_id: int) -> None:
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.close_conversation()
        self.store.delete_conversation(conversation_id)
        self.conversations_changed.emit()

    def set_system_prompt(self, text: str) -> None:
        self._update_settings(system_prompt=text)

    def set_sampling(self, sampling: SamplingParams) -> None:
        self._update_settings(sampling=sampling)

    def set_model(self, model_path: str) -> None:
        self._update_settings(model=model_path)

    def set_response_schema(self, text: str) -> None:
        """The chat's structured output schema, as typed ("" turns it off). Kept even while
        invalid (the user is still typing it); Send waits until it is valid. Typed with no
        chat open, it starts one, so the first message is sent under it."""
        if self.conversation is None:
            if text:
                self.new_conversation(response_schema=text)
            return
        if text == self.conversation.response_schema:
            return
        self._update_settings(response_schema=text)
        self.send_blocked.emit(self.send_blocked_reason())

    def _update_settings(self, **changes: Any) -> None:
        if self.conversation is None:
            return
        for key, value in changes.items():
            setattr(self.conversation, key, value)
        self.store.save_conversation(self.conversation)

    def _conv(self, conversation_id: int) -> Conversation:
        if self.conversation is not None and self.conversation.id == conversation_id:
            return self.conversation
        return self.store.conversation(conversation_id)

    def _show(self, conv: Conversation | None, tree: MessageTree) -> None:
        self.conversation, self.tree = conv, tree
        self.conversation_opened.emit(conv)
        self.transcript_changed.emit()
        self.send_blocked.emit(self.send_blocked_reason())  # each chat has its own schema

    def _refused(self) -> bool:
        """True (and says so) when this chat's schema blocks sending."""
        if self.schema_problem():
            self.send_blocked.emit(self.send_blocked_reason())
            return True
        return False

    # -- actions -----------------------------------------------------------------------

    def send(self, text: str, pending: list[Pending] | tuple[()] = ()) -> Message | None:
        """Add the user's message (and its attachments) at the end of the current path and
        start a reply. None when nothing was sent (see `attachment_problem`)."""
        text = text.strip()
        pending = list(pending)
        if (not text and not pending) or self.busy or self._refused() or \
                self.attachment_problem(pending):
            return None
        conv = self.conversation or self.new_conversation()
        path = self.path()
        parent = path[-1].id if path else None
        attachments = keep_attachments(self.store, pending, self.context_budget(text, pending))
        user = self.store.add_message(conv.id, parent, "user", text, attachments=attachments)
        self.tree.add(user)
        if not any(m.role == "user" for m in path):
            conv.title = title_for(text or attachments[0].name)
        self._start_reply(user)
        return user

    def edit_and_resend(self, user_message_id: int, text: str,
                        pending: list[Pending] | tuple[()] = ()) -> Message | None:
        """A new version of a user message (a sibling branch) and a reply to it; it keeps
        the old version's attachments (its documents' passages are picked again) and adds
        `pending`."""
        text = text.strip()
        pending = list(pending)
        if self.conversation is None or self._refused() or self.attachment_problem(pending):
            return None
        old = self.tree.get(user_message_id)
        if not text and not pending and not old.attachments:
            return None
        self.stop()
        kept = [replace(a, passages=()) for a in old.attachments]
        attachments = kept + keep_attachments(self.store, pending,
                                              self.context_budget(text, [*kept, *pending]))
        user = self.store.add_message(self.conversation.id, old.parent_id, "user", text,
                                      attachments=attachments)
        self.tree.add(user)
        # The first message's new version renames a chat titled after it (not one the user
        # renamed).
        if old.parent_id is None and self.conversation.title == title_for(old.content):
            self.conversation.title = title_for(text)
        self._start_reply(user)
        return user

    def regenerate(self, assistant_message_id: int | None = None) -> None:
        """Another reply to the same user message, kept beside the earlier ones."""
        if self.conversation is None or self._refused():
            return
        self.stop()
        path = self.path()
        if assistant_message_id is None:
            replies = [m for m in path if m.role == "assistant"]
            if not replies:
                return
            assistant_message_id = replies[-1].id
        parent_id = self.tree.get(assistant_message_id).parent_id
        if parent_id is None:
            return
        self._start_reply(self.tree.get(parent_id))

    def switch_branch(self, message_id: int, step: int) -> None:
        if self.conversation is None or self.busy:
            return
        leaf = self.tree.switch(message_id, step)
        if leaf is not None:
            self.conversation.current_leaf = leaf
            self.store.save_conversation(self.conversation)
            self.transcript_changed.emit()

    def stop(self) -> None:
        """Stop the reply being written; its text so far is kept."""
        gen = self._generation
        if gen is None:
            return
        if gen.stream is not None:
            gen.stream.cancel()  # → finished(cancelled) → _finish
        else:
            self._drop_finder(gen)
            self._finish(gen, "stopped", None)

    # -- generation --------------------------------------------------------------------

    def _start_reply(self, user: Message) -> None:
        conv = self.conversation
        if conv is None:
            return
        reply = self.store.add_message(conv.id, user.id, "assistant", "", status="waiting")
        self.tree.add(reply)
        conv.current_leaf = reply.id
        if self._client.wanted is not None:
            conv.model = str(self._client.wanted.model_path)
        self.store.save_conversation(conv)
        self._generation = Generation(reply)
        self.transcript_changed.emit()
        self.conversations_changed.emit()
        self.busy_changed.emit(True)
        self._save_timer.start()
        self._dispatch()

    def _dispatch(self) -> None:
        """Send the waiting request, or get the engine ready for it."""
        gen = self._generation
        if gen is None or gen.stream is not None or gen.finder is not None:
            return
        state = self._client.state
        if state == EngineState.READY:
            self._request(gen)
        elif state in (EngineState.STOPPED, EngineState.CRASHED):
            if self._client.wanted is None:
                self._fail(gen, ReplyError("NoModelLoaded", NO_MODEL))
            else:
                self._client.start()
        elif state == EngineState.NO_MODEL and self._client.wanted is None:
            self._fail(gen, ReplyError("NoModelLoaded", NO_MODEL))
        # STARTING / LOADING: _on_engine_state calls back when it changes.

    def _request(self, gen: Generation) -> None:
        if self._find_passages(gen):
            return
        gen.message.status = "streaming"
        gen.sent_at = time.perf_counter()
        model = self._client.model
        stream = self._client.chat(request_body(
            self.store, self.conversation, self.tree.path(gen.message.id)[:-1],
            model.name if model is not None else None))
        stream.delta.connect(self._on_delta)
        stream.step.connect(self.step_received)
        stream.finished.connect(self._on_finished)
        stream.errored.connect(self._on_errored)
        gen.stream = stream
        self.message_changed.emit(gen.message.id)

    def _find_passages(self, gen: Generation) -> bool:
        """Start picking passages for the reply's question when a document of it needs
        them; True while they are being picked (`_request` is called again when done)."""
        user = self.tree.get(gen.message.parent_id) if gen.message.parent_id else None
        wanted = [a for a in user.attachments if a.mode == "passages" and not a.passages] \
            if user is not None else []
        if not wanted or user is None or gen.passages_picked:
            return False  # picked once per reply, even when a document gave none
        if gen.finder is not None:
            return True
        # What is left once the path (the question included; passages not yet picked count
        # nothing) and the reply have their share.
        finder = PassageFinder(self.store, self._client, wanted, user.content,
                               self.context_budget(), self)
        finder.progress.connect(lambda text: self._on_finder_progress(gen, text))
        finder.done.connect(lambda found: self._on_passages(gen, user, found))
        finder.failed.connect(lambda why: self._on_finder_failed(gen, why))
        gen.finder = finder
        finder.start()
        return True

    def _on_finder_progress(self, gen: Generation, text: str) -> None:
        if gen is self._generation:
            gen.message.stats["note"] = text
            self.message_changed.emit(gen.message.id)

    def _on_passages(self, gen: Generation, user: Message, found: list[Attachment]) -> None:
        by_sha = {a.sha256: a for a in found}
        user.attachments = [by_sha.get(a.sha256, a) if a.mode == "passages" else a
                            for a in user.attachments]
        self.store.save_message(user)
        self._drop_finder(gen)
        gen.passages_picked = True
        gen.message.stats.pop("note", None)
        if gen is self._generation:
            self.message_changed.emit(user.id)
            self.message_changed.emit(gen.message.id)
            self._dispatch()

    def _on_finder_failed(self, gen: Generation, why: str) -> None:
        self._drop_finder(gen)
        if gen is self._generation:
            self._fail(gen, ReplyError("PassagesFailed", why))

    def _drop_finder(self, gen: Generation) -> None:
        finder, gen.finder = gen.finder, None
        if finder is not None:
            finder.cancel()
            finder.deleteLater()

    def _on_delta(self, delta: TextDelta) -> None:
        gen = self._generation
        if gen is None:
            return
        now = time.perf_counter()
        if gen.first_token_at is None:
            gen.first_token_at = now
            self.first_token.emit(gen.first_token_at - gen.sent_at)
        gen.tokens += max(1, len(delta.token_ids))
        gen.count(delta)
        if delta.reasoning:
            if gen.thinking_first_at is None:
                gen.thinking_first_at = now
            gen.message.reasoning += delta.reasoning
            # Kept in the stats as it grows, so a reply saved mid-thought has its duration.
            gen.message.stats["thinking_s"] = now - gen.thinking_first_at
        gen.message.add_text(delta.text, delta.drafted)
        gen.dirty = True
        self.message_changed.emit(gen.message.id)

    def _on_finished(self, result: ReplyFinished) -> None:
        gen = self._generation
        if gen is not None:
            self._finish(gen, "stopped" if result.reason == "cancelled" else "done", result)

    def _on_errored(self, error: ReplyError) -> None:
        if self._generation is not None:
            self._fail(self._generation, error)

    def _fail(self, gen: Generation, error: ReplyError) -> None:
        message = error.message
        if error.kind == "ConnectionLost":
            message = "The engine stopped while replying. Send again to restart it."
        gen.message.error = message
        self._finish(gen, "error", None)
        self._report_worker(error)

    def _report_worker(self, error: ReplyError) -> None:
        worker = lost_worker(error)
        if worker is not None:
            self.worker_problem.emit(worker, error.message)

    def _finish(self, gen: Generation, status: str, result: ReplyFinished | None) -> None:
        self._generation = None
        self._save_timer.stop()
        message = gen.message
        message.status = status  # type: ignore[assignment]
        message.stats = footer_stats(gen.streamed(), result, now=time.perf_counter())
        self.store.save_message(message)
        if self.conversation is not None and self.conversation.id == message.conversation_id:
            self.store.save_conversation(self.conversation)
        self.message_changed.emit(message.id)
        self.busy_changed.emit(False)
        self.reply_finished.emit(message)

    def _save_progress(self) -> None:
        gen = self._generation
        if gen is not None and gen.dirty:
            gen.dirty = False
            self.store.save_message(gen.message)

    # -- engine events -----------------------------------------------------------------

    def _on_engine_state(self, state: EngineState) -> None:
        self.send_blocked.emit(self.send_blocked_reason())
        gen = self._generation
        if gen is None or gen.stream is not None or gen.finder is not None:
            return
        if state == EngineState.READY:
            self._request(gen)
        elif state == EngineState.NO_MODEL and self._client.wanted is None:
            self._fail(gen, ReplyError("NoModelLoaded", NO_MODEL))

    def _on_engine_model(self, _model: object) -> None:
        self.send_blocked.emit(self.send_blocked_reason())

    def _on_engine_problem(self, error: ReplyError) -> None:
        gen = self._generation
        if gen is not None and gen.stream is None:
            self._drop_finder(gen)
            self._fail(gen, error)  # says which worker, if one failed the load
        else:
            self._report_worker(error)


def copy_sampling(sampling: SamplingParams, **changes: Any) -> SamplingParams:
    """A validated copy with some fields changed (raises SettingsError on bad values)."""
    return replace(sampling, **changes)

"""The self-test's checks, each through the path the product itself takes (module docstring of
`app.self_test` lists them). Each is `check(test, result)`; see `app.self_test.runner`."""

from __future__ import annotations

import json
import math
import shutil
import socket
from pathlib import Path
from typing import Any

from jsonschema import ValidationError, validate

from app.chat.attachments import PendingDocument, PendingImage
from app.chat.conversation import Message
from app.chat.message_content import api_content
from app.self_test import fixtures
from app.self_test.pdf import one_page_pdf
from app.self_test.runner import CheckFailed, CheckSpec, Result, SelfTest
from app.server.worker_card import WorkerState
from runtime.gguf.info import read_model_info
from runtime.gguf.verdicts import VerdictStore
from runtime.planner.workers import WorkerInfo, probe_worker
from runtime.quality.quantize import (
    QuantProgress,
    QuantRecipe,
    default_output_path,
    quantize,
    read_tensor_types,
    worker_command,
)
from runtime.units import fmt_bytes

CHAT_PROMPT = "Say hello in five words."
PERSON_SCHEMA = {
    "title": "Person", "type": "object", "additionalProperties": False,
    "required": ["name", "age"],
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
}
EMBED_TEXTS = ["Outrider runs language models on this computer.", "A cat sleeps in the sun."]
DOC_NAME = "self-test-notes.pdf"
DOC_CODE = "The code word is pelican-42."
DOC_LINES = ["Outrider self-test notes.", DOC_CODE, "Keep this page for the record."]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather", "description": "The weather in a city today",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}},
    },
}
LIBRARY_FOLDER = "self-test"  # models/self-test/<repo>/<file>.gguf in the temporary library


def _need(condition: object, reason: str) -> None:
    if not condition:
        raise CheckFailed(reason)


def _quote(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit - 1] + "…")


def _in_library(test: SelfTest, repo: str, *sources: Path) -> list[Path]:
    """Copy fixture files into `models/self-test/<repo>/` of the temporary library, where the
    server (a model named in a request) and the app (a projector beside its model) find them."""
    folder = test.library / LIBRARY_FOLDER / repo
    folder.mkdir(parents=True, exist_ok=True)
    placed = []
    for source in sources:
        target = folder / source.name
        if not target.is_file():
            shutil.copyfile(source, target)
        placed.append(target)
    return placed


# -- 1. the first load, through the load probe ------------------------------------------------


def check_load(test: SelfTest, result: Result) -> None:
    store = VerdictStore()  # <user cache>/load-verdicts.json: the self-test's own home
    _need(store.path.is_relative_to(test.home.cache),
          f"the verdict cache {store.path} is not the self-test's own ({test.home.cache})")
    _need(store.get(test.model) is None,
          f"{store.path} already holds a verdict for {test.model.name}: the probe would not run")

    def loaded() -> None:
        model = test.client.model
        verdict = store.get(test.model)
        _need(verdict is not None,
              f"{test.model.name} loaded, but no load verdict was written to {store.path}: the "
              "probe child (--load-probe / runtime.engine.probe) did not run or died before "
              f"loading{test.engine_log()}")
        assert verdict is not None and model is not None
        _need(verdict.ok, f"the load probe recorded a crash: {verdict.reason}")
        result.ok(f"{model.name} ({model.quant}, context {model.n_ctx}) loaded by the engine "
                  f"process; no verdict was cached, so the load probe loaded it in a child "
                  f"first and recorded 'ok' in {store.path}")

    test.ensure_ready(result, test.model, loaded)


# -- 2. a chat reply ------------------------------------------------------------------------


def check_chat(test: SelfTest, result: Result) -> None:
    def ready() -> None:
        conversation = test.new_chat(max_tokens=8)
        test.expect_reply(result, conversation, replied)
        _need(test.window.controller.send(CHAT_PROMPT) is not None, "the chat refused to send")

    def replied(message: Message) -> None:
        _need(message.status == "done" and message.content.strip(),
              f"the reply ended as {message.status}: {message.error or 'no text'}")
        result.ok(f"{message.stats.get('tokens', 0)} tokens: {_quote(message.content)}")

    test.ensure_ready(result, test.model, ready)


# -- 3. structured output -------------------------------------------------------------------


def check_structured(test: SelfTest, result: Result) -> None:
    schema_text = json.dumps(PERSON_SCHEMA)

    def ready() -> None:
        conversation = test.new_chat(max_tokens=96, response_schema=schema_text)
        problem = test.window.controller.schema_problem()
        _need(not problem, f"the chat refused the schema: {problem}")
        test.expect_reply(result, conversation, replied)
        _need(test.window.controller.send("Make up a person: a name and an age.") is not None,
              "the chat refused to send")

    def replied(message: Message) -> None:
        _need(message.status == "done",
              f"the reply ended as {message.status}: {message.error or 'no text'}")
        try:
            value = json.loads(message.content)
        except ValueError as exc:
            raise CheckFailed(f"the reply is not JSON ({exc}): {_quote(message.content)}") from None
        try:
            validate(value, PERSON_SCHEMA)
        except ValidationError as exc:
            raise CheckFailed(f"the reply breaks the schema ({exc.message}): "
                              f"{_quote(message.content)}") from None
        result.ok(f"response_format json_schema (strict): {json.dumps(value)} is valid")

    test.ensure_ready(result, test.model, ready)


# -- 4. a forced tool call --------------------------------------------------------------------


def check_tool_call(test: SelfTest, result: Result) -> None:
    (source,) = fixtures.fixture(test.fixtures, fixtures.TOOLS_MODEL)
    (placed,) = _in_library(test, "tiny-tools", source)
    parameters = WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
    body = {"model": placed.stem, "temperature": 0, "max_tokens": 400,
            "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
            "tools": [WEATHER_TOOL], "parallel_tool_calls": False,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}

    def ready() -> None:
        test.http(result, "POST", "/v1/chat/completions", body, answered)

    def answered(reply: dict[str, Any]) -> None:
        choice = reply["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        _need(calls, f"no tool call (finish {choice.get('finish_reason')}): "
                     f"{_quote(str(choice['message'].get('content')))}")
        function = calls[0]["function"]
        _need(function["name"] == "get_weather", f"it called {function['name']!r}")
        try:
            arguments = json.loads(function["arguments"])
            validate(arguments, parameters)
        except (ValueError, ValidationError) as exc:
            raise CheckFailed(f"its arguments {function['arguments']!r} do not fit the "
                              f"function's parameters: {exc}") from None
        _need(choice.get("finish_reason") == "tool_calls",
              f"finish_reason {choice.get('finish_reason')!r}, not 'tool_calls'")
        result.ok(f"{placed.stem} (Hermes template) called get_weather({json.dumps(arguments)}) "
                  "as tool_choice asked; finish_reason tool_calls")

    test.ensure_ready(result, test.model, ready)


# -- 5. an embedding --------------------------------------------------------------------------


def check_embedding(test: SelfTest, result: Result) -> None:
    n_embd = read_model_info(test.model).n_embd

    def ready() -> None:
        call = test.client.embed(EMBED_TEXTS)
        call.done.connect(result.guard(embedded))
        call.failed.connect(result.guard(lambda error: result.fail(error.message)))

    def embedded(vectors: list[list[float]]) -> None:
        _need(len(vectors) == len(EMBED_TEXTS),
              f"{len(vectors)} vectors for {len(EMBED_TEXTS)} texts")
        for vector in vectors:
            _need(len(vector) == n_embd, f"a vector of {len(vector)} floats, the model's "
                                         f"n_embd is {n_embd}")
            _need(all(math.isfinite(x) for x in vector), "a vector holds NaN or infinity")
        norms = [math.sqrt(sum(x * x for x in v)) for v in vectors]
        _need(all(abs(n - 1.0) < 1e-3 for n in norms), f"not unit length: {norms}")
        cosine = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
        _need(cosine < 0.9999, "two different texts got the same vector")
        result.ok(f"{len(vectors)} vectors of {n_embd} floats (the model's n_embd), finite, "
                  f"unit length; cosine of the two texts {cosine:.3f}")

    test.ensure_ready(result, test.model, ready)


# -- 6. a document attached to the chat -------------------------------------------------------


def check_document(test: SelfTest, result: Result) -> None:
    pdf = test.scratch / DOC_NAME
    pdf.write_bytes(one_page_pdf(DOC_LINES))
    composer = test.window.chat.composer
    sent: list[bool] = []

    def ready() -> None:
        conversation = test.new_chat(max_tokens=8)
        test.expect_reply(result, conversation, replied)
        composer.clear_attachments()
        composer.pending.changed.connect(result.guard(changed))
        composer.add_files([pdf])  # read by pypdf on the window's background runner

    def changed(problems: list[str]) -> None:
        _need(not problems, f"the composer refused {pdf.name}: {problems[0] if problems else ''}")
        if sent or composer.pending.reading:
            return
        if not any(isinstance(p, PendingDocument) for p in composer.pending.items):
            return
        sent.append(True)
        composer.set_text("What is the code word in the notes?")
        composer.submit()  # the Send button: the page sends the text with its attachments
        _need(not composer.attachments,
              f"Send did not take the document: {composer.problem_label.text() or 'no reason'}")

    def replied(message: Message) -> None:
        _need(message.status == "done",
              f"the reply ended as {message.status}: {message.error or 'no text'}")
        controller = test.window.controller
        assert message.parent_id is not None
        question = controller.tree.get(message.parent_id)
        documents = [a for a in question.attachments if a.kind == "document"]
        _need(documents, "the message went without its document")
        content = api_content(controller.store, question)
        sent_text = content if isinstance(content, str) else json.dumps(content)
        _need(DOC_CODE in sent_text, "the request did not carry the PDF's text")
        result.ok(f"{documents[0].describe()}: read by pypdf, sent {documents[0].mode} with the "
                  f"question; reply {_quote(message.content)}")

    test.ensure_ready(result, test.model, ready)


# -- 7. the router loads a second model by name -----------------------------------------------


def check_router(test: SelfTest, result: Result) -> None:
    (source,) = fixtures.fixture(test.fixtures, fixtures.TOOLS_MODEL)
    (placed,) = _in_library(test, "tiny-tools", source)
    name = placed.stem

    def ready() -> None:
        body = {"model": name, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": "Hello"}]}
        test.http(result, "POST", "/v1/chat/completions", body, answered)

    def answered(reply: dict[str, Any]) -> None:
        _need(reply.get("model") == name, f"the reply came from {reply.get('model')!r}")
        test.http(result, "GET", "/api/status", None,
                  lambda status: resident(status, reply["usage"]["completion_tokens"]))

    def resident(status: dict[str, Any], tokens: int) -> None:
        models = status.get("resident") or []
        mine = next((m for m in models if m.get("name") == name), None)
        chat = next((m for m in models if m.get("default")), None)
        _need(mine is not None, f"{name} is not resident after the request "
                                f"(resident: {[m.get('name') for m in models]})")
        assert mine is not None
        pids = {chat.get("pid") if chat else None, test.client.address.pid
                if test.client.address else None}
        _need(not mine.get("default") and mine.get("pid") and mine.get("pid") not in pids,
              f"{name} is not in an engine process of its own (pid {mine.get('pid')})")
        result.ok(f"a request naming {name} loaded {mine.get('library_name')} from the library "
                  f"in an engine process of its own (pid {mine['pid']}; the chat's model in "
                  f"pid {chat.get('pid') if chat else '?'}); it answered {tokens} tokens")

    test.ensure_ready(result, test.model, ready)


# -- 8. an image, on the tiny vision pair -----------------------------------------------------


def check_vision(test: SelfTest, result: Result) -> None:
    model_src, projector_src, image = fixtures.fixture(
        test.fixtures, fixtures.VISION_MODEL, fixtures.VISION_PROJECTOR, fixtures.IMAGE)
    model_path, _ = _in_library(test, "tiny-vision", model_src, projector_src)
    composer = test.window.chat.composer

    def ready() -> None:
        model = test.client.model
        assert model is not None
        _need("vision" in model.capabilities and model.projector == projector_src.name,
              f"{model.name} loaded without its projector (capabilities "
              f"{', '.join(model.capabilities)}): the app did not pair {projector_src.name}")
        conversation = test.new_chat(max_tokens=8)
        test.expect_reply(result, conversation, lambda message: replied(message, model.image_tokens))
        composer.clear_attachments()
        composer.add_files([image])
        _need(any(isinstance(p, PendingImage) for p in composer.pending.items),
              f"the composer refused {image.name}: {composer.problem_label.text()}")
        composer.set_text("What is in this picture?")
        composer.submit()
        _need(not composer.attachments,
              f"Send did not take the image: {composer.problem_label.text() or 'no reason'}")

    def replied(message: Message, image_tokens: int | None) -> None:
        _need(message.status == "done",
              f"the reply ended as {message.status}: {message.error or 'no text'}")
        prompt = int(message.stats.get("prompt_tokens", 0))
        _need(image_tokens and prompt >= image_tokens,
              f"the prompt was {prompt} tokens: the image ({image_tokens} tokens) was not in it")
        result.ok(f"{model_path.name} with {projector_src.name} (paired by the app): {image.name} "
                  f"sent from the composer, a prompt of {prompt} tokens ({image_tokens} for the "
                  f"image), a reply of {message.stats.get('tokens', 0)} tokens")

    test.ensure_ready(result, model_path, ready,
                      load=lambda: test.window.load_model_file(model_path))


# -- 9. the quantize worker -------------------------------------------------------------------


def check_quantize(test: SelfTest, result: Result) -> None:
    (source,) = fixtures.fixture(test.fixtures, fixtures.QUANTIZE_SOURCE)
    target = test.scratch / "quantized" / default_output_path(source, "Q8_0").name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    progress: list[QuantProgress] = []
    how = " ".join(worker_command()[1:])

    def work() -> dict[str, str]:
        quantize(source, target, QuantRecipe("Q8_0"), on_progress=progress.append)
        return read_tensor_types(target)

    def done(types: dict[str, str]) -> None:
        q8 = sum(1 for kind in types.values() if kind == "Q8_0")
        _need(q8, f"{target.name} holds no Q8_0 tensor ({sorted(set(types.values()))})")
        _need(progress, "the worker reported no progress")
        result.ok(f"{source.name} ({fmt_bytes(source.stat().st_size)}) → {target.name} "
                  f"({fmt_bytes(target.stat().st_size)}) by the quantize worker (`{how}`): "
                  f"{q8} of {len(types)} tensors Q8_0")

    test.in_thread(result, work, done)


# -- 10. the RPC worker answers its handshake -------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def check_worker(test: SelfTest, result: Result) -> None:
    card = test.window.server.worker_card  # Server → "Lend this machine"
    endpoint = f"127.0.0.1:{_free_port()}"
    answered: list[WorkerInfo] = []
    card.host.setText("127.0.0.1")
    card.port.setValue(int(endpoint.rsplit(":", 1)[1]))

    def state(state: WorkerState) -> None:
        if state == WorkerState.SERVING:
            test.in_thread(result, lambda: probe_worker(endpoint, timeout_s=10.0), probed)
        elif state == WorkerState.FAILED:
            raise CheckFailed(f"the worker failed: {card.error.text()}")
        elif state == WorkerState.STOPPED:
            _need(answered, "the worker stopped before it answered")
            info = answered[0]
            devices = ", ".join(f"{d.name} {fmt_bytes(d.free_bytes)} free" for d in info.devices)
            result.ok(f"`{' '.join(card.command.args)}` served on {endpoint}, answered the RPC "
                      f"handshake (llama.cpp RPC {'.'.join(map(str, info.version))}; {devices}), "
                      "stopped when asked")

    def probed(info: WorkerInfo) -> None:
        _need(info.devices, "the worker lends no device")
        answered.append(info)
        card.stop()

    card.state_changed.connect(result.guard(state))
    card.start()


# -- 11. the window opens and closes ----------------------------------------------------------


def check_window(test: SelfTest, result: Result) -> None:
    window = test.window
    size = f"{window.width()}x{window.height()}"
    window.close()  # stops the engine and any worker, writes the settings
    problems = []
    if not test.opened:
        problems.append("the window did not show")
    if window.isVisible():
        problems.append("it is still visible after close()")
    if test.client.process.running:
        problems.append("the engine process still runs")
    if window.server.worker_card.running:
        problems.append("the worker still runs")
    _need(not problems, "; ".join(problems))
    result.ok(f"opened ({size}, {test.app.platformName()}) and closed: the engine and any "
              "worker stopped")


CHECKS = (
    CheckSpec("load", check_load, 150),
    CheckSpec("chat", check_chat, 90),
    CheckSpec("structured output", check_structured, 90),
    CheckSpec("embedding", check_embedding, 60),
    CheckSpec("document", check_document, 90),
    CheckSpec("router", check_router, 120),
    CheckSpec("tool call", check_tool_call, 90),
    CheckSpec("vision", check_vision, 120),
    CheckSpec("quantize", check_quantize, 90),
    CheckSpec("worker", check_worker, 60),
    CheckSpec("window", check_window, 30),
)

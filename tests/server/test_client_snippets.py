"""The Server page's snippets (`app.server.snippets`) run as a user would paste them: each one,
with a key and without, against a real server on the fake engine, through the real client
library (openai, ollama, anthropic), curl, and the environment variables the openai client
reads. What they print is the model's reply."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator

import openai
import pytest
from fastapi import FastAPI

from app.server.snippets import CLIENTS, Endpoint, snippet
from tests.server.conftest import API_KEY, ServerThread
from tests.server.fake_engine import FakeEngine

MODEL = "fake"  # the fake engine's model (fake.gguf): its OpenAI id
CLIENT_ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
              "ANTHROPIC_BASE_URL", "OLLAMA_API_KEY", "OLLAMA_HOST")


@pytest.fixture(params=[API_KEY, ""], ids=["key", "no-key"])
def endpoint(request: pytest.FixtureRequest, fake_engine: FakeEngine,
             make_app: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[Endpoint]:
    """A real server on the fake engine, with the key or none; no client reads the key or
    address from the environment here."""
    for name in CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)
    with ServerThread(make_app(fake_engine, api_key=request.param or None)) as server:
        yield Endpoint(server.url, MODEL, request.param)


def printed_by(code: str) -> list[str]:
    """What `code` prints, run as a script."""
    out: list[str] = []
    exec(compile(code, "<snippet>", "exec"), {"__name__": "__main__",
                                               "print": lambda *a: out.append(" ".join(map(str, a)))})
    return out


def test_every_client_has_a_snippet() -> None:
    assert [c.id for c in CLIENTS] == ["curl", "openai", "ollama", "anthropic", "env"]


@pytest.mark.parametrize("client", ["openai", "ollama", "anthropic"])
def test_the_python_snippets_get_a_reply(client: str, endpoint: Endpoint) -> None:
    code = snippet(client, endpoint)
    assert endpoint.url in code and MODEL in code and endpoint.api_key in code
    (reply,) = printed_by(code)
    assert reply.strip()


def test_a_wrong_key_is_refused(fake_engine: FakeEngine,
                                make_app: Callable[..., FastAPI]) -> None:
    """The snippets' key is the one that counts: the same code with another key fails."""
    with ServerThread(make_app(fake_engine)) as server:
        code = snippet("openai", Endpoint(server.url, MODEL, "wrong-key"))
        with pytest.raises(openai.AuthenticationError):
            printed_by(code)


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("sh") is None,
                    reason="needs curl and a shell")
def test_the_curl_snippet_gets_a_reply(endpoint: Endpoint) -> None:
    env = {**os.environ, "NO_PROXY": "*", "no_proxy": "*"}
    done = subprocess.run(["sh", "-c", snippet("curl", endpoint) + " --silent --show-error"],
                          capture_output=True, text=True, timeout=60, env=env, check=True)
    answer = json.loads(done.stdout)
    assert answer["model"] == MODEL and answer["choices"][0]["message"]["content"]


def test_the_environment_line_is_what_the_openai_client_reads(
        endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    line = snippet("env", endpoint)
    words = shlex.split(line, comments=True)
    assert words[0] == "export" and f"# model: {MODEL}" in line
    for word in words[1:]:
        name, _, value = word.partition("=")
        monkeypatch.setenv(name, value)
    reply = openai.OpenAI(max_retries=0).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello!"}])
    assert reply.choices[0].message.content

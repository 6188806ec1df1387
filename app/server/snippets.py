"""Code that reaches the running local server, one snippet per client, ready to paste.

Pure text, no Qt: the Server page shows these (the key masked) and copies them (the key in
clear). Every snippet is filled with where the server really listens, the id of the model it
serves and the key it wants. One server speaks all four dialects on one port: OpenAI's
`/v1/chat/completions`, Ollama's `/api/chat` and Anthropic's `/v1/messages`.

    >>> to = Endpoint("http://127.0.0.1:1234", "SmolLM2-135M-Instruct.Q4_1", "sk-123")
    >>> print(snippet("openai", to))
    from openai import OpenAI
    <BLANKLINE>
    client = OpenAI(base_url="http://127.0.0.1:1234/v1", api_key="sk-123")
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=[{"role": "user", "content": "Hello!"}],
    )
    print(reply.choices[0].message.content)
    >>> print(snippet("env", to, masked=True))
    export OPENAI_BASE_URL=http://127.0.0.1:1234/v1 OPENAI_API_KEY='••••••••'  # model: SmolLM2-135M-Instruct.Q4_1

Without a key (the default on this computer) the server takes any. The openai and anthropic
clients still refuse to start without one, so their snippets pass a placeholder; curl and
ollama send none:

    >>> print(snippet("ollama", Endpoint("http://127.0.0.1:1234", "tiny", "")))
    from ollama import Client
    <BLANKLINE>
    client = Client(host="http://127.0.0.1:1234")
    reply = client.chat(model="tiny", messages=[{"role": "user", "content": "Hello!"}])
    print(reply.message.content)
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass

MASK = "•" * 8  # what the page shows in place of the key
PLACEHOLDER_KEY = "not-needed"  # for clients that insist on a key the server does not want
NO_MODEL = "MODEL"  # the model id when none is loaded yet
PROMPT = "Hello!"


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens (`http://host:port`, no trailing slash), the model id it
    serves (the OpenAI id: `/v1/models`) and its API key ("" when it wants none)."""

    url: str
    model: str
    api_key: str


@dataclass(frozen=True)
class Client:
    """One way to reach the server: `id` for code, `title` for a tab, `language` of the text."""

    id: str
    title: str
    language: str  # "shell" or "python"


CLIENTS = (
    Client("curl", "curl", "shell"),
    Client("openai", "Python openai", "python"),
    Client("ollama", "Python ollama", "python"),
    Client("anthropic", "Python anthropic", "python"),
    Client("env", "Environment (tools)", "shell"),
)


def snippet(client: str, to: Endpoint, *, masked: bool = False) -> str:
    """The snippet for `client` (a `CLIENTS` id); `masked` shows the key as bullets.

    >>> print(snippet("curl", Endpoint("http://127.0.0.1:8080", "tiny", "k")))
    curl http://127.0.0.1:8080/v1/chat/completions \\
      -H 'Content-Type: application/json' \\
      -H 'Authorization: Bearer k' \\
      -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}]}'
    >>> snippet("telnet", Endpoint("http://h:1", "m", ""))
    Traceback (most recent call last):
    ValueError: no snippet for 'telnet': one of curl, openai, ollama, anthropic, env
    """
    write = _WRITERS.get(client)
    if write is None:
        raise ValueError(f"no snippet for {client!r}: one of "
                         + ", ".join(c.id for c in CLIENTS))
    key = MASK if masked and to.api_key else to.api_key
    return write(Endpoint(to.url.rstrip("/"), to.model or NO_MODEL, key))


def key_note(to: Endpoint) -> str:
    """One line under the snippets on the key they carry.

    >>> key_note(Endpoint("http://127.0.0.1:1234", "m", ""))[:40]
    'This server needs no API key: curl and o'
    """
    if to.api_key:
        return ("The key shows as dots here; Copy puts the real one on the clipboard. Anyone "
                "with it can use this server: keep it out of shared code.")
    return (f"This server needs no API key: curl and ollama send none, and the openai and "
            f"anthropic clients, which refuse to start without one, get \"{PLACEHOLDER_KEY}\" "
            "(any text will do).")


def _py(text: str) -> str:
    """A Python string literal: JSON's escapes are Python's, and no quote style to pick."""
    return json.dumps(text, ensure_ascii=False)


def _message() -> str:
    return f'[{{"role": "user", "content": {_py(PROMPT)}}}]'


def _curl(to: Endpoint) -> str:
    body = json.dumps({"model": to.model, "messages": [{"role": "user", "content": PROMPT}]},
                      ensure_ascii=False)
    lines = [f"curl {shlex.quote(to.url + '/v1/chat/completions')}",
             "  -H 'Content-Type: application/json'"]
    if to.api_key:
        lines.append(f"  -H {shlex.quote('Authorization: Bearer ' + to.api_key)}")
    lines.append(f"  -d {shlex.quote(body)}")
    return " \\\n".join(lines)


def _openai(to: Endpoint) -> str:
    return "\n".join([
        "from openai import OpenAI",
        "",
        f"client = OpenAI(base_url={_py(to.url + '/v1')}, "
        f"api_key={_py(to.api_key or PLACEHOLDER_KEY)})",
        "reply = client.chat.completions.create(",
        f"    model={_py(to.model)},",
        f"    messages={_message()},",
        ")",
        "print(reply.choices[0].message.content)",
    ])


def _ollama(to: Endpoint) -> str:
    headers = (f", headers={{\"Authorization\": {_py('Bearer ' + to.api_key)}}}"
               if to.api_key else "")
    return "\n".join([
        "from ollama import Client",
        "",
        f"client = Client(host={_py(to.url)}{headers})",
        f"reply = client.chat(model={_py(to.model)}, messages={_message()})",
        "print(reply.message.content)",
    ])


def _anthropic(to: Endpoint) -> str:
    return "\n".join([
        "from anthropic import Anthropic",
        "",
        f"client = Anthropic(base_url={_py(to.url)}, "
        f"api_key={_py(to.api_key or PLACEHOLDER_KEY)})",
        "message = client.messages.create(",
        f"    model={_py(to.model)},",
        "    max_tokens=256,",
        f"    messages={_message()},",
        ")",
        "print(message.content[0].text)",
    ])


def _env(to: Endpoint) -> str:
    return (f"export OPENAI_BASE_URL={shlex.quote(to.url + '/v1')} "
            f"OPENAI_API_KEY={shlex.quote(to.api_key or PLACEHOLDER_KEY)}  # model: {to.model}")


_WRITERS: dict[str, Callable[[Endpoint], str]] = {
    "curl": _curl, "openai": _openai, "ollama": _ollama, "anthropic": _anthropic, "env": _env,
}

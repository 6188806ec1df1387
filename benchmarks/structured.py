"""JSONSchemaBench end to end: Outrider's `response_format: json_schema` against llama-server's
`json_schema` field, on the same schemas, model and prompts, side by side in one run.

For each schema (or the first `--per-category N` of each category, by id) both servers get the
same chat request at T = 0: "Generate a JSON document that adheres to the following schema:
<schema>" (the paper's prompt; a schema longer than `--prompt-chars` is cut in the prompt, the
constraint always gets all of it), `max_tokens` 256. Per category and server:

- coverage: requests accepted (anything but a 4xx/5xx answer: a schema the server cannot
  compile is a refusal);
- compliance: documents that parse and validate with `jsonschema` (the schema's own draft,
  format checks on), among the accepted ones that finished with "stop";
- valid / all: valid documents over all schemas, the paper's "empirical coverage".

    .venv/bin/python benchmarks/structured.py --llama-server /tmp/llama-build/bin/llama-server \\
        --per-category 3

Outrider runs as `outrider serve`; llama-server with `--jinja` (the GGUF's own chat template,
as Outrider renders it) and one slot per `--parallel`. Without `--llama-server` only Outrider
is asked; `--skip-outrider` asks only llama-server.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.openmp import reference_env  # noqa: E402 - after the path

sys.path.insert(0, str(ROOT / "benchmarks"))

from constraint_engines import PAPER_BEST, SCHEMAS, Schema, load_schemas, valid  # noqa: E402
from server_vs_llamaserver import free_port, ours, wait_healthy  # noqa: E402

PROMPT = "Generate a JSON document that adheres to the following schema: {schema}"


@dataclass(frozen=True)
class Answer:
    id: str
    status: int              # HTTP status; 0 = no answer (timeout, connection)
    finish: str | None       # "stop", "length", ...
    content: str
    valid: bool
    tokens: int
    seconds: float
    error: str = ""

    @property
    def accepted(self) -> bool:
        return self.status == 200


def request_body(server: str, schema: Schema, max_tokens: int, prompt_chars: int) -> dict[str, Any]:
    shown = schema.text if len(schema.text) <= prompt_chars else schema.text[:prompt_chars] + " …"
    body: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPT.format(schema=shown)}],
                            "temperature": 0, "max_tokens": max_tokens}
    doc = json.loads(schema.text)
    if server == "outrider":
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "doc", "schema": doc, "strict": True}}
    else:
        body["json_schema"] = doc
    return body


def ask(url: str, key: str, server: str, schema: Schema, max_tokens: int, prompt_chars: int,
        timeout: float) -> Answer:
    sid = f"{schema.category}/{schema.name}"
    start = time.perf_counter()
    try:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=timeout,
                       headers={"Authorization": f"Bearer {key}"},
                       json=request_body(server, schema, max_tokens, prompt_chars))
    except httpx.HTTPError as e:
        return Answer(sid, 0, None, "", False, 0, time.perf_counter() - start, repr(e)[:300])
    seconds = time.perf_counter() - start
    if r.status_code != 200:
        try:
            message = str(r.json().get("error", {}).get("message", r.text))
        except (ValueError, AttributeError):
            message = r.text
        return Answer(sid, r.status_code, None, "", False, 0, seconds, message[:300])
    data = r.json()
    choice = data["choices"][0]
    content = choice["message"].get("content") or ""
    finish = choice.get("finish_reason")
    ok = finish == "stop" and valid(schema.text, content)
    return Answer(sid, 200, finish, content, ok, int(data.get("usage", {}).get(
        "completion_tokens", 0)), seconds)


@contextmanager
def llama_server(binary: Path, model: Path, threads: int, slots: int, ctx: int,
                 key: str, log: Path | None) -> Iterator[str]:
    port = free_port()
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-np", str(slots), "-c", str(ctx),
           "--kv-unified", "--jinja", "--host", "127.0.0.1", "--port", str(port),
           "--api-key", key, "--no-webui"]
    sink = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True,
                               env=reference_env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        if log:
            sink.close()  # type: ignore[union-attr]


def run_all(url: str, key: str, server: str, schemas: list[Schema], args: argparse.Namespace
            ) -> list[Answer]:
    def one(s: Schema) -> Answer:
        return ask(url, key, server, s, args.max_tokens, args.prompt_chars, args.timeout)

    ask(url, key, server, Schema("warm", "up", '{"type": "object"}'), 8, 100, args.timeout)
    with ThreadPoolExecutor(args.parallel) as pool:
        return list(pool.map(one, schemas))


def cell_coverage(answers: list[Answer]) -> str:
    ok = sum(a.accepted for a in answers)
    return f"{ok}/{len(answers)}"


def cell_compliance(answers: list[Answer]) -> str:
    stopped = [a for a in answers if a.accepted and a.finish == "stop"]
    if not stopped:
        return "—"
    good = sum(a.valid for a in stopped)
    return f"{good}/{len(stopped)} ({100 * good / len(stopped):.0f}%)"


def cell_valid(answers: list[Answer]) -> str:
    good = sum(a.valid for a in answers)
    return f"{100 * good / len(answers):.0f}%"


def table(schemas: list[Schema], results: dict[str, list[Answer]]) -> str:
    names = list(results)
    head = "| category | schemas |" + "".join(
        f" {n} coverage | compliance (stop) | valid / all |" for n in names) + \
        " paper's best (README) |"
    rows = [head, "|---|---|" + "---|---|---|" * len(names) + "---|"]
    cats = sorted({s.category for s in schemas})
    for cat in [*cats, "overall"]:
        idx = [i for i, s in enumerate(schemas) if cat in ("overall", s.category)]
        row = f"| {cat} | {len(idx)} |"
        for n in names:
            group = [results[n][i] for i in idx]
            row += f" {cell_coverage(group)} | {cell_compliance(group)} | {cell_valid(group)} |"
        rows.append(row + f" {PAPER_BEST.get(cat, '—')} |")
    return "\n".join(rows)


def summary(name: str, answers: list[Answer]) -> str:
    finishes: dict[str, int] = {}
    for a in answers:
        key = a.finish or (f"HTTP {a.status}" if a.status else "no answer")
        finishes[key] = finishes.get(key, 0) + 1
    done = [a for a in answers if a.accepted]
    rate = (sum(a.tokens for a in done) / sum(a.seconds for a in done)) if done else 0.0
    med = statistics.median(a.seconds for a in done) if done else float("nan")
    parts = ", ".join(f"{k} {v}" for k, v in sorted(finishes.items()))
    return f"- {name}: {parts}; {rate:.1f} tok/s per request, median {med:.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    parser.add_argument("--skip-outrider", action="store_true")
    parser.add_argument("--model", type=Path, help="GGUF (default: the default model)")
    parser.add_argument("--schemas", type=Path, default=SCHEMAS)
    parser.add_argument("--per-category", type=int, default=None,
                        help="the first N schemas (by id) of each category; default: all")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt-chars", type=int, default=6000,
                        help="a schema longer than this is cut in the prompt (not the constraint)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--parallel", type=int, default=2, help="slots and concurrent requests")
    parser.add_argument("--ctx", type=int, default=8192, help="total KV cells, shared by slots")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per request")
    parser.add_argument("--json", type=Path, help="write every answer here")
    parser.add_argument("--log-dir", type=Path, help="keep the servers' logs here")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from runtime.library.default_model import fetch_default_model
        from runtime.paths import user_dirs

        dirs = user_dirs()
        model = fetch_default_model(dirs.models, dirs.cache)
    schemas = load_schemas(args.schemas)
    if args.per_category is not None:
        schemas = [s for cat in sorted({s.category for s in schemas})
                   for s in [x for x in schemas if x.category == cat][:args.per_category]]
    key = secrets.token_hex(16)
    results: dict[str, list[Answer]] = {}
    walls: dict[str, float] = {}
    if not args.skip_outrider:
        with ours(model, args.threads, args.parallel, args.ctx, key) as url:
            t0 = time.perf_counter()
            results["Outrider"] = run_all(url, key, "outrider", schemas, args)
            walls["Outrider"] = time.perf_counter() - t0
    if args.llama_server is not None:
        log = args.log_dir / "llama-server.log" if args.log_dir else None
        with llama_server(args.llama_server, model, args.threads, args.parallel, args.ctx,
                          key, log) as url:
            t0 = time.perf_counter()
            results["llama-server"] = run_all(url, key, "llama-server", schemas, args)
            walls["llama-server"] = time.perf_counter() - t0
    print(f"model {model.name}, {len(schemas)} schemas, T=0, max_tokens {args.max_tokens}, "
          f"{args.parallel} slots, {args.threads} threads; "
          + ", ".join(f"{n} {w:.0f} s" for n, w in walls.items()))
    print(table(schemas, results))
    for name, answers in results.items():
        print(summary(name, answers))
    if args.json:
        args.json.write_text(json.dumps({n: [asdict(a) for a in rs] for n, rs in results.items()},
                                        indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

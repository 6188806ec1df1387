"""Resuming a conversation from its saved KV cache (runtime.engine.kv_store) against a cold
prefill, on the default model, in one run.

A ~3,000-token chat (a system prompt and turns of canned text) gets a reply at T = 0 from
engine A, which keeps the conversation's KV cache in a fresh folder and saves it when it
stops (as the app's engine does when it quits). The follow-up — the chat, that reply and one
more question — is then asked, per repetition:

- cold: a new `Engine` without saved caches computes the whole prompt;
- resumed: a new `Engine` (a restarted app) over a copy of A's folder restores the saved
  prefix and computes only the new tokens (a copy each time, so no repetition resumes from
  the previous one's longer file).

The time to the first new token (TTFT, from submitting the request) of each, the ratio
resumed / cold (best of the repetitions: other jobs on a shared machine only slow a run
down; the median beside it), and whether the two replies are token-identical at T = 0.

    nice python benchmarks/resume.py --threads 2 --reps 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine.engine import Engine
from runtime.engine.kv_store import KvStoreOptions
from runtime.events import (
    ChatMessage,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from runtime.library.default_model import default_model_path
from runtime.settings.load import LoadSettings

GREEDY = SamplingParams(temperature=0.0, max_tokens=32)
TOPICS = ["tides", "bread", "volcanoes", "bicycles", "bees", "glaciers", "libraries", "comets",
          "rivers", "lighthouses", "forests", "markets", "bridges", "owls", "deserts", "ships"]


def conversation(engine: Engine, target_tokens: int) -> list[ChatMessage]:
    """System prompt and canned turns until the rendered chat is about `target_tokens` long."""
    messages = [ChatMessage("system", "You are a patient teacher who answers in plain words.")]
    model = engine._loaded.model  # type: ignore[union-attr]
    for i in range(1000):
        topic = TOPICS[i % len(TOPICS)]
        messages.append(ChatMessage("user", f"Tell me something about {topic}, part {i + 1}."))
        messages.append(ChatMessage("assistant", (
            f"Here is part {i + 1} about {topic}. People have watched {topic} for a long time "
            f"and written down what they saw. The most surprising thing about {topic} is how "
            f"much they change from one season to the next, and how little of that we notice "
            f"from one day to the next. ") * 2))
        rendered = engine.render_chat(messages)
        if len(model.tokenize(rendered)) >= target_tokens:
            break
    messages.append(ChatMessage("user", "Now sum all of that up in two sentences."))
    return messages


def ask(engine: Engine, messages: list[ChatMessage]) -> tuple[float, list[int], Finished]:
    """TTFT (submit → first token), the reply's tokens and its Finished event."""
    t0 = time.perf_counter()
    handle = engine.submit(GenerationRequest(messages=tuple(messages), sampling=GREEDY))
    ttft, done = 0.0, None
    tokens: list[int] = []
    for event in handle.events(timeout=600):
        if isinstance(event, TokenEvent):
            if not tokens:
                ttft = time.perf_counter() - t0
            tokens.append(event.token_id)
        elif isinstance(event, Finished):
            done = event
    assert done is not None
    return ttft, tokens, done


def started(settings: LoadSettings, saved: KvStoreOptions | None) -> Engine:
    engine = Engine(saved_kv=saved)
    engine.start()
    engine.load(settings)
    return engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF (default: the default model)")
    parser.add_argument("--tokens", type=int, default=3000, help="conversation length")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    path = args.model or default_model_path()
    settings = LoadSettings(model_path=path, n_ctx=4096, n_threads=args.threads,
                            n_threads_batch=args.threads)
    work = Path(tempfile.mkdtemp(prefix="outrider-resume-"))
    try:
        saved_a = KvStoreOptions(work / "a")
        engine = started(settings, saved_a)
        messages = conversation(engine, args.tokens)
        _, reply_tokens, _ = ask(engine, messages)
        reply = engine._loaded.model.detokenize(reply_tokens)  # type: ignore[union-attr]
        engine.stop()  # saves the conversation's cells
        follow = [*messages, ChatMessage("assistant", reply),
                  ChatMessage("user", "And which of those would you visit first?")]
        saved_bytes = sum(p.stat().st_size for p in saved_a.folder.glob("*.kv"))

        cold, resumed, same, prompt, cached, restore = [], [], True, 0, 0, []
        for rep in range(args.reps):
            engine = started(settings, None)
            ttft, cold_tokens, done = ask(engine, follow)
            engine.stop()
            cold.append(ttft)
            prompt = done.usage.prompt_tokens

            folder = work / f"b{rep}"
            shutil.copytree(saved_a.folder, folder)
            engine = started(settings, KvStoreOptions(folder))
            ttft, tokens, done = ask(engine, follow)
            engine.stop()
            resumed.append(ttft)
            restore.append(done.timings.restore_s)
            cached = done.usage.resumed_tokens
            same = same and tokens == cold_tokens
    finally:
        shutil.rmtree(work, ignore_errors=True)

    best = min(resumed) / min(cold)
    med = statistics.median(resumed) / statistics.median(cold)
    print(f"model {path.name}, prompt {prompt} tokens, threads {args.threads or 'default'}, "
          f"load {os.getloadavg()[0]:.2f}, saved file {saved_bytes / 2**20:.1f} MiB")
    print("| path | TTFT best | TTFT median | note |")
    print("|---|---:|---:|---|")
    print(f"| cold prefill | {min(cold):.3f} s | {statistics.median(cold):.3f} s | "
          f"{prompt} prompt tokens computed |")
    print(f"| resumed after restart | {min(resumed):.3f} s | {statistics.median(resumed):.3f} s | "
          f"{cached} tokens restored in {min(restore):.3f} s, {prompt - cached} computed |")
    print(f"| ratio resumed / cold | {best:.1%} | {med:.1%} | goal ≤ 15% |")
    print(f"output identical at T = 0: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

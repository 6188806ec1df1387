"""The reason llama.cpp gave for a refusal, picked from what it logged meanwhile.

    >>> first_reason('''llama_model_loader: - kv  29: tokenizer.ggml.unknown_token_id u32 = 0
    ... llama_model_load: error loading model: key not found in model: llama.context_length
    ... llama_model_load_from_file_impl: failed to load model''')
    'key not found in model: llama.context_length'

llama.cpp reports a refused file in three layers: the loader throws, `llama_model_load`
logs the exception as "error loading model: <what>" (`llama_init_from_model` likewise as
"failed to initialize the context: <what>"), and the caller adds a generic "failed to load
model". Before all that it has dumped the file's metadata, one `- kv N: key type = value`
line per key, which is full of words like "unknown" (`tokenizer.ggml.unknown_token_id`),
"error" or "invalid" that say nothing about the failure. So, in order:

1. the text of an exception wrapper ("error loading model: …", "failed to initialize the
   context: …"), unless it is only the loader's own "failed to load model from <path>"
   (an unreadable GGUF: gguf's line before it says why, "invalid magic characters");
2. otherwise the first other line that sounds like a failure, never a metadata dump line
   (`- kv N:`, `- type f32:`, `llama_model_loader: - …`, `print_info: …`) and never the generic "failed to
   load model" / "failed to load model from …" summary;
3. otherwise the summary, otherwise the last line.

Why not "the last error line": the summary always comes last. Why not only the wrapper: the
context's refusals (`K cache type q4_0 … does not divide n_embd_head_k`) and gguf's
(`invalid magic characters`) are plain error lines without one. The function name in front
(`llama_init_from_model: `) is dropped; it means nothing to a user.

The one rule for every caller: the engine's binding and the quality tools' evaluation.
"""

from __future__ import annotations

import re

# "error loading model: key not found …" → "key not found …"
_WRAPPERS = re.compile(r"(?:error loading model(?: hyperparameters| vocabulary| architecture)?|"
                       r"failed to initialize the context):\s*(?P<what>.+)$")
# "llama_model_loader: - kv  29: …", "- type  f32:   25 tensors", "print_info: rope_finetuned
# = unknown" (print_info lists the hyperparameters, one "name = value" line each)
_DUMP = re.compile(r"^(?:[\w.]+:\s+)?- |^print_info: ")
# "llama_model_load_from_file_impl: failed to load model", "… from file: m.gguf"
_SUMMARY = re.compile(r"failed to load model(?: from .*)?$")
_KEYWORDS = ("error", "failed", "unknown", "not supported", "does not", "requires", "invalid",
             "cannot", "unsupported", "not found", "wrong", "exceeds", "must be", "mismatch")
# "llama_init_from_model: …": one word with underscores, then ": "
_FUNCTION = re.compile(r"^[A-Za-z_][\w:]*:\s+")


def first_reason(text: str) -> str:
    """llama.cpp's reason for a failure, one line, from everything it logged meanwhile."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not _DUMP.match(line)]
    for line in lines:
        what = _unwrap(line)
        if what is not None and not _SUMMARY.search(what):
            return _FUNCTION.sub("", what, count=1)
    failures = [line for line in lines if any(k in line.lower() for k in _KEYWORDS)]
    specific = [line for line in failures if not _SUMMARY.search(line)]
    for picked in (specific, failures, lines):
        if picked:
            return _FUNCTION.sub("", picked[0], count=1)
    return "no reason given"


def _unwrap(line: str) -> str | None:
    """The exception text inside a wrapper line, wrappers within it removed; None if none.

    "llama_model_load: error loading model: error loading model hyperparameters: key not
    found in model: llama.context_length" → "key not found in model: llama.context_length"
    """
    wrapped = _WRAPPERS.search(line)
    if wrapped is None:
        return None
    while wrapped:
        what = wrapped["what"].strip()
        wrapped = _WRAPPERS.match(what)
    return what

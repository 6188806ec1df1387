"""Constraint engines on the JSONSchemaBench sample: which schemas each compiles, and what a
token mask costs on Outrider's vocabularies.

Three engines, each in its own worker process (so one that hangs or aborts on a schema costs
that schema, not the run): llguidance (`LLMatcher`), llama.cpp's grammar sampler through the
binding (`json_schema_to_gbnf`, then `llama_sampler_init_grammar` + `llama_sampler_apply` on a
full token-data array) and xgrammar (`GrammarCompiler.compile_json_schema`, one compiler
thread, `GrammarMatcher.fill_next_token_bitmask` into a numpy bitmask).

- Coverage: a schema counts when the engine compiles it and computes the first mask within
  `--timeout` seconds, on the model's vocabulary; per category and overall. llguidance twice:
  as it is (oneOf refused) and with `coerce_one_of` (oneOf compiled as anyOf).
- Keyword probes: what "compiles" means. For each of 16 keywords a schema, a valid and an
  invalid document (checked with `jsonschema`) are walked through each engine: "enforced"
  (valid passes, invalid is refused), "ignored" (the invalid document gets through: the
  engine accepted a keyword it does not implement), "too strict" (the valid one is refused)
  or "refused" (the schema does not compile).
- Time to first mask (TTFM): compile + first mask, median over the timed schemas.
- Mask time per token: a valid document is walked token by token through each engine's
  matcher, one mask per step (the first excluded: it is in TTFM). The documents are the
  model's own greedy answers under llama.cpp's grammar (a typical document: short strings,
  declared keys in schema order), checked with `jsonschema`, re-tokenized for every
  vocabulary, the same text for every engine. For llama.cpp the table also gives what it
  really pays per token in llama-server: its sampler draws from the unmasked logits first and
  applies the grammar to that single token ("check"), the full mask only on a refusal.

    .venv/bin/python benchmarks/constraint_engines.py --model MODEL.gguf \\
        --vocab .../vendor/llama.cpp/models/ggml-vocab-qwen2.gguf \\
        --xgrammar-python /tmp/xg-venv/bin/python

`--vocab` adds vocabulary-only GGUFs (llama.cpp ships some in `models/`) for the timing;
`--reuse-docs` takes the documents from an earlier `--json` (generating them costs minutes on
a loaded CPU). xgrammar wants torch at import time (its wheel requires torch, transformers
and triton: gigabytes with the CUDA libraries) for tensor helpers this benchmark does not
use; in a venv with xgrammar, numpy and transformers but no torch, the worker puts a stub
`torch` module in place before the import, and the bitmask is a numpy array (DLPack).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT.parent / "shared" / "data" / "jsonschemabench"
ENGINES = ("llguidance", "llama.cpp", "xgrammar")
# The paper's best framework per category, where the sample's README quotes it.
PAPER_BEST = {"Github_hard": "41% (Guidance)", "Glaiveai2K": "> 86% (every framework)"}


@dataclass(frozen=True)
class Schema:
    category: str
    name: str
    text: str


def load_schemas(folder: Path) -> list[Schema]:
    """Every `<category>/<id>.json` under `folder`, sorted by category then id."""
    return [Schema(p.parent.name, p.stem, p.read_text(encoding="utf-8"))
            for p in sorted(folder.glob("*/*.json"))]


# ---- vocabularies (llama.cpp, vocabulary-only load) ---------------------------------------

def load_vocab(path: Path) -> tuple[Any, Any]:
    """(model, vocab) pointers of a GGUF loaded with `vocab_only`: no weights read."""
    import llama_cpp as L

    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        sys.exit(f"llama.cpp cannot load the vocabulary of {path}")
    return model, L.llama_model_get_vocab(model)


def vocab_pieces(vocab: Any) -> tuple[list[bytes], list[int]]:
    """Every token's bytes (control tokens: empty) and the end-of-generation ids."""
    import llama_cpp as L

    pieces, eog = [], []
    buf = ctypes.create_string_buffer(256)
    for token in range(L.llama_vocab_n_tokens(vocab)):
        n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        pieces.append(buf.raw[:max(n, 0)])
        if L.llama_vocab_is_eog(vocab, token):
            eog.append(token)
    return pieces, eog


def tokenize(vocab: Any, text: bytes) -> list[int]:
    import llama_cpp as L

    out = (L.llama_token * (len(text) + 16))()
    n = L.llama_tokenize(vocab, text, len(text), out, len(out), False, False)
    return list(out[:n])


def silence_llama() -> None:
    import llama_cpp as L

    global _QUIET
    _QUIET = L.llama_log_callback(lambda *_: None)
    L.llama_log_set(_QUIET, ctypes.c_void_p(0))


_QUIET: Any = None


# ---- the engines, inside a worker ----------------------------------------------------------

def _ns() -> int:
    return time.perf_counter_ns()


class LLGuidance:
    def __init__(self, vocab_path: str, _pieces: str) -> None:
        import llguidance
        from llguidance.llamacpp import lltokenizer_from_vocab

        silence_llama()
        self.g = llguidance
        _, self.vocab = load_vocab(Path(vocab_path))
        self.pieces, self.eog = vocab_pieces(self.vocab)
        self.n = len(self.pieces)
        self.tok = lltokenizer_from_vocab(self.vocab)
        self.mask = np.zeros((self.n + 31) // 32, dtype=np.int32)

    def start(self, schema: str) -> Any:
        grammar = self.g.LLMatcher.grammar_from_json_schema(schema)
        m = self.g.LLMatcher(self.tok, grammar, log_level=0)
        self.fill(m)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def prepare(self) -> None: ...

    def fill(self, m: Any) -> None:
        m.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)

    def allowed(self, token: int) -> bool:
        return bool((int(self.mask[token >> 5]) >> (token & 31)) & 1)

    def advance(self, m: Any, token: int) -> None:
        m.consume_token(token)

    def check(self, m: Any, token: int) -> int:
        t0 = _ns()
        m.validate_tokens([token])
        return _ns() - t0


class LLGuidanceCoerced(LLGuidance):
    """llguidance with `coerce_one_of`: oneOf compiled as anyOf (sound only when the branches
    cannot overlap)."""

    def start(self, schema: str) -> Any:
        grammar = self.g.LLMatcher.grammar_from_json_schema(
            schema, overrides={"coerce_one_of": True})
        m = self.g.LLMatcher(self.tok, grammar, log_level=0)
        self.fill(m)
        if m.is_error():
            raise ValueError(m.get_error())
        return m


class LlamaGrammar:
    def __init__(self, vocab_path: str, _pieces: str) -> None:
        import llama_cpp as L
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        silence_llama()
        self.L, self.to_gbnf, self.path = L, json_schema_to_gbnf, vocab_path
        _, self.vocab = load_vocab(Path(vocab_path))
        self.n = L.llama_vocab_n_tokens(self.vocab)
        dtype = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        self.fresh = np.zeros(self.n, dtype=dtype)
        self.fresh["id"] = np.arange(self.n)
        self.data = self.fresh.copy()
        self.array = L.llama_token_data_array(
            data=self.data.ctypes.data_as(L.llama_token_data_p), size=self.n, selected=-1,
            sorted=False)
        self.one = np.zeros(1, dtype=dtype)
        self.one_array = L.llama_token_data_array(
            data=self.one.ctypes.data_as(L.llama_token_data_p), size=1, selected=-1, sorted=False)

    def start(self, schema: str) -> Any:
        gbnf = self.to_gbnf(schema)
        smpl = self.L.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        if not smpl:
            raise ValueError("llama.cpp does not parse the grammar json_schema_to_gbnf wrote")
        self.prepare()
        self.fill(smpl)
        return smpl

    def prepare(self) -> None:
        """Fresh logits (apply overwrites refused ones with -inf): not part of the mask time."""
        self.data[:] = self.fresh
        self.array.size, self.array.selected, self.array.sorted = self.n, -1, False

    def fill(self, smpl: Any) -> None:
        self.L.llama_sampler_apply(smpl, ctypes.byref(self.array))

    def allowed(self, token: int) -> bool:
        return bool(np.isfinite(self.data["logit"][token]))

    def advance(self, smpl: Any, token: int) -> None:
        self.L.llama_sampler_accept(smpl, token)

    def generate(self, schema: str, max_tokens: int) -> str:
        """The model's own answer under this grammar, greedy: a typical document."""
        from llama_cpp import Llama
        from llama_cpp.llama_grammar import LlamaGrammar as Grammar

        if not hasattr(self, "llm"):
            self.llm = Llama(self.path, n_ctx=4096, n_threads=2, verbose=False)
        shown = schema if len(schema) < 3000 else schema[:3000] + " ..."
        reply: Any = self.llm.create_chat_completion(
            [{"role": "user", "content": f"Write a JSON document for this schema:\n{shown}"}],
            grammar=Grammar.from_json_schema(schema, verbose=False), temperature=0,
            max_tokens=max_tokens)
        return str(reply["choices"][0]["message"]["content"])

    def check(self, smpl: Any, token: int) -> int:
        self.one["id"][0], self.one["logit"][0] = token, 0.0
        self.one_array.size, self.one_array.selected, self.one_array.sorted = 1, -1, False
        t0 = _ns()
        self.L.llama_sampler_apply(smpl, ctypes.byref(self.one_array))
        return _ns() - t0


def _import_xgrammar() -> Any:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import xgrammar
        return xgrammar
    import types

    os.environ["USE_TORCH"] = "0"
    # Both probe for torch when imported: import them before the stub exists.
    import transformers.utils.import_utils  # noqa: F401
    import tvm_ffi  # noqa: F401
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast  # noqa: F401

    class Anything:
        def __init__(self, *_: Any, **__: Any) -> None: ...
        def __call__(self, *_: Any, **__: Any) -> Anything: return Anything()
        def __getattr__(self, _: str) -> Anything: return Anything()
        def __getitem__(self, _: Any) -> Anything: return Anything()
        def __or__(self, _: Any) -> Anything: return Anything()
        __ror__ = __or__

    stub = types.ModuleType("torch")
    stub.__getattr__ = lambda _name: Anything()  # type: ignore[method-assign]
    sys.modules["torch"] = stub
    import xgrammar
    return xgrammar


class XGrammar:
    def __init__(self, _vocab_path: str, pieces_path: str) -> None:
        self.xgr = _import_xgrammar()
        data = json.loads(Path(pieces_path).read_text())
        pieces = [bytes.fromhex(h) for h in data["pieces"]]
        self.n = len(pieces)
        info = self.xgr.TokenizerInfo(pieces, self.xgr.VocabType.RAW, vocab_size=self.n,
                                      stop_token_ids=data["eog"])
        self.compiler = self.xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.mask = np.full((1, (self.n + 31) // 32), -1, dtype=np.int32)

    def start(self, schema: str) -> Any:
        m = self.xgr.GrammarMatcher(self.compiler.compile_json_schema(schema))
        self.fill(m)
        return m

    def prepare(self) -> None: ...

    def fill(self, m: Any) -> None:
        m.fill_next_token_bitmask(self.mask, 0)

    def allowed(self, token: int) -> bool:
        return bool((int(self.mask[0, token >> 5]) >> (token & 31)) & 1)

    def advance(self, m: Any, token: int) -> None:
        m.accept_token(token)

    def check(self, m: Any, token: int) -> int:
        return -1


WORKERS = {"llguidance": LLGuidance, "llguidance oneOf→anyOf": LLGuidanceCoerced,
           "llama.cpp": LlamaGrammar, "xgrammar": XGrammar}


def worker(engine_name: str, job_path: str) -> None:
    """Run one engine over the job's tasks; one JSON line out per task."""
    job = json.loads(Path(job_path).read_text())
    t0 = time.perf_counter()
    engine: Any = WORKERS[engine_name](job["vocab"], job["pieces"])
    eos = int(json.loads(Path(job["pieces"]).read_text())["eos"])
    print(json.dumps({"ready": time.perf_counter() - t0}), flush=True)
    for task in job["tasks"]:
        out: dict[str, Any] = {"id": task["id"], "ok": False}
        try:
            if task.get("generate"):
                out["text"] = engine.generate(task["schema"], task["generate"])
                out["ok"] = True
                print(json.dumps(out), flush=True)
                continue
            t = _ns()
            m = engine.start(task["schema"])
            out["ttfm_ms"] = (_ns() - t) / 1e6
            out["ok"] = True
            if task.get("walk") is not None:
                out.update(walk(engine, m, task["walk"], eos))
        except Exception as e:  # any refusal is a coverage miss: say why
            out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        print(json.dumps(out), flush=True)


def walk(engine: Any, m: Any, tokens: list[int], eos: int) -> dict[str, Any]:
    """Mask, check and consume each token; then the final mask: may the text end there?"""
    masks: list[int] = []
    checks: list[int] = []
    for i, token in enumerate(tokens):
        if i:  # the first mask was computed by start()
            engine.prepare()
            t0 = _ns()
            engine.fill(m)
            masks.append(_ns() - t0)
        if not engine.allowed(token):
            return {"mask_ns": masks, "check_ns": checks, "refused_at": i}
        c = engine.check(m, token)
        if c >= 0:
            checks.append(c)
        engine.advance(m, token)
    engine.prepare()
    engine.fill(m)
    return {"mask_ns": masks, "check_ns": checks, "refused_at": None,
            "end_ok": engine.allowed(eos)}


# ---- the parent: run workers with a per-task timeout ---------------------------------------

@dataclass
class Pool:
    engine: str
    python: str
    vocab: Path
    pieces: Path
    timeout: float
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def run(self, tasks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        todo = list(tasks)
        while todo:
            done = self._run_some(todo)
            if done < 0:  # the worker cannot start: nothing to measure with this engine
                for t in todo:
                    self.results[t["id"]] = {"id": t["id"], "ok": False,
                                             "error": self._last_error}
                return self.results
            todo = [t for t in todo if t["id"] not in self.results]
            if todo and done == 0:  # the first one hung or killed the worker
                self.results[todo[0]["id"]] = {"id": todo[0]["id"], "ok": False,
                                               "error": self._last_error}
                todo = todo[1:]
        failed = sum(not self.results[t["id"]]["ok"] for t in tasks)
        print(f"  {self.engine} on {self.vocab.name}: {len(tasks)} tasks, {failed} refused",
              file=sys.stderr, flush=True)
        return self.results

    _last_error = ""

    def _run_some(self, tasks: list[dict[str, Any]]) -> int:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"vocab": str(self.vocab), "pieces": str(self.pieces), "tasks": tasks}, f)
        cmd = [self.python, str(Path(__file__).resolve()), "--worker", self.engine, f.name]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, cwd=ROOT)
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                lines.put(line)
            lines.put("")  # the worker ended

        threading.Thread(target=read, daemon=True).start()
        done = 0
        try:
            first = lines.get(timeout=600)
            if "ready" not in first:
                proc.wait()
                self._last_error = f"the worker did not start (exit {proc.returncode})"
                return -1
            while done < len(tasks):
                line = lines.get(timeout=self.timeout)
                if not line:
                    proc.wait()
                    raise queue.Empty
                result = json.loads(line)
                self.results[result["id"]] = result
                done += 1
        except queue.Empty:
            self._last_error = (f"no answer within {self.timeout:.0f} s" if proc.poll() is None
                                else f"the worker died (exit {proc.returncode})")
        finally:
            proc.kill()
            proc.wait()
            os.unlink(f.name)
        return done


def stats_us(values: list[int]) -> tuple[float, float, float]:
    if not values:
        return float("nan"), float("nan"), float("nan")
    us = sorted(v / 1000 for v in values)
    return statistics.fmean(us), statistics.median(us), us[min(len(us) - 1, int(0.95 * len(us)))]


def valid(schema: str, text: str) -> bool:
    import jsonschema

    try:
        doc, obj = json.loads(text), json.loads(schema)
        cls = jsonschema.validators.validator_for(obj)
        cls(obj, format_checker=cls.FORMAT_CHECKER).validate(doc)
        return True
    except Exception:
        return False


def coverage_table(schemas: list[Schema], cover: dict[str, dict[str, dict[str, Any]]]) -> str:
    engines = list(cover)
    rows = ["| category | schemas | " + " | ".join(engines) + " | paper's best (README) |",
            "|---|---|" + "---|" * len(engines) + "---|"]
    cats = sorted({s.category for s in schemas})
    for cat in [*cats, "overall"]:
        group = [s for s in schemas if cat in ("overall", s.category)]
        cells = []
        for e in engines:
            ok = sum(cover[e][f"{s.category}/{s.name}"]["ok"] for s in group)
            cells.append(f"{ok}/{len(group)} ({100 * ok / len(group):.0f}%)")
        rows.append(f"| {cat} | {len(group)} | " + " | ".join(cells)
                    + f" | {PAPER_BEST.get(cat, '—')} |")
    return "\n".join(rows)


# keyword → (schema, a valid document, an invalid one): does the engine enforce it, ignore it
# (the invalid document gets through) or refuse the schema?
PROBES: dict[str, tuple[dict[str, Any], str, str]] = {
    "minimum/maximum": ({"type": "integer", "minimum": 10, "maximum": 20}, "15", "25"),
    "multipleOf": ({"type": "integer", "multipleOf": 5}, "10", "7"),
    "minLength": ({"type": "string", "minLength": 3}, '"abc"', '"ab"'),
    "pattern (unanchored)": ({"type": "string", "pattern": "[0-9]{3}"}, '"a123b"', '"ab"'),
    "format: email": ({"type": "string", "format": "email"}, '"a@b.co"', '"nope"'),
    "minItems/maxItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 2,
                           "maxItems": 3}, "[1,2]", "[1]"),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
                    "[1,2]", "[1,1]"),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                     "items": False}, '[1,"a"]', "[1,2]"),
    "additionalProperties: false": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                     "additionalProperties": False}, '{"a":1}', '{"a":1,"b":2}'),
    "required": ({"type": "object", "properties": {"a": {"type": "integer"}},
                  "required": ["a"]}, '{"a":1}', "{}"),
    "oneOf (overlapping)": ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]},
                            "-1", "1"),
    "not": ({"type": "integer", "not": {"const": 3}}, "4", "3"),
    "if/then": ({"type": "object", "properties": {"a": {"type": "integer"},
                                                  "b": {"type": "string"}},
                 "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
                 "then": {"required": ["b"]}}, '{"a":1,"b":"x"}', '{"a":1}'),
    "dependencies": ({"$schema": "http://json-schema.org/draft-07/schema#",
                      "type": "object", "properties": {"a": {"type": "integer"},
                                                       "b": {"type": "integer"}},
                      "dependencies": {"a": ["b"]}}, '{"a":1,"b":2}', '{"a":1}'),
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
                      '{"ab":1}', '{"A1":1}'),
    "$ref (recursive)": ({"$defs": {"n": {"type": "object", "properties": {
        "c": {"$ref": "#/$defs/n"}}, "additionalProperties": False}}, "$ref": "#/$defs/n"},
        '{"c":{"c":{}}}', '{"c":{"c":5}}'),
}


def probe_verdict(ok_doc: dict[str, Any], bad_doc: dict[str, Any]) -> str:
    if not ok_doc.get("ok"):
        return "refused"
    def passes(r: dict[str, Any]) -> bool:
        return r.get("refused_at") is None and bool(r.get("end_ok"))
    if passes(bad_doc):
        return "**ignored**"
    return "enforced" if passes(ok_doc) else "too strict"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("ENGINE", "JOB"), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help="GGUF whose vocabulary is timed and covered")
    parser.add_argument("--schemas", type=Path, default=SCHEMAS)
    parser.add_argument("--vocab", type=Path, action="append", default=[],
                        help="another (vocabulary-only) GGUF to time on; repeatable")
    parser.add_argument("--xgrammar-python", help="python of a venv with xgrammar (else skipped)")
    parser.add_argument("--timed-per-category", type=int, default=2,
                        help="schemas per category whose documents are walked")
    parser.add_argument("--max-tokens", type=int, default=96, help="cap on a generated document")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per schema and engine")
    parser.add_argument("--json", type=Path, help="write every per-schema result here")
    parser.add_argument("--reuse-docs", type=Path,
                        help="take the documents from an earlier run's --json (no generation)")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    if args.model is None:
        sys.path.insert(0, str(ROOT))
        from runtime.library.default_model import fetch_default_model
        from runtime.paths import user_dirs

        dirs = user_dirs()
        args.model = fetch_default_model(dirs.models, dirs.cache)
    import llama_cpp

    silence_llama()
    schemas = load_schemas(args.schemas)
    pythons = {"llguidance": sys.executable, "llguidance oneOf→anyOf": sys.executable,
               "llama.cpp": sys.executable}
    if args.xgrammar_python:
        pythons["xgrammar"] = args.xgrammar_python
    timed = [e for e in pythons if e != "llguidance oneOf→anyOf"]
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="constraint-engines-"))

    vocabs: dict[Path, tuple[Any, Path]] = {}
    for path in [args.model, *args.vocab]:
        _, vocab = load_vocab(path)
        pieces, eog = vocab_pieces(vocab)
        dump = tmp / f"{path.stem}.pieces.json"
        eos = int(llama_cpp.llama_vocab_eos(vocab))
        dump.write_text(json.dumps({"pieces": [p.hex() for p in pieces], "eog": eog, "eos": eos}))
        vocabs[path] = (vocab, dump)

    def pool(engine: str, path: Path, timeout: float = args.timeout) -> Pool:
        return Pool(engine, pythons[engine], path, vocabs[path][1], timeout)

    # 1. coverage on the model's vocabulary, and the keyword probes
    by_id = {f"{s.category}/{s.name}": s for s in schemas}
    model_vocab = vocabs[args.model][0]
    tasks: list[dict[str, Any]] = [{"id": i, "schema": s.text} for i, s in by_id.items()]
    for kw, (schema, good, bad) in PROBES.items():
        for kind, doc in (("valid", good), ("invalid", bad)):
            if valid(json.dumps(schema), doc) != (kind == "valid"):
                print(f"probe {kw}: the {kind} document is not {kind}", file=sys.stderr)
            tasks.append({"id": f"probe|{kw}|{kind}", "schema": json.dumps(schema),
                          "walk": tokenize(model_vocab, doc.encode())})
    cover = {e: pool(e, args.model).run(tasks) for e in pythons}
    # 2. the documents: the model's greedy answers, for schemas every timed engine compiled
    everyone = [i for i in by_id if all(cover[e][i]["ok"] for e in timed)]
    picked: list[str] = []
    for cat in sorted({s.category for s in schemas}):
        picked += [i for i in everyone if i.startswith(cat + "/")][:args.timed_per_category]
    if args.reuse_docs:
        docs = {i: d.encode() for i, d in json.loads(args.reuse_docs.read_text())["docs"].items()}
        picked = [i for i in docs if i in by_id]
    else:
        answers = pool("llama.cpp", args.model, timeout=600).run(
            [{"id": i, "schema": by_id[i].text, "generate": args.max_tokens} for i in picked])
        docs = {i: str(answers[i].get("text", "")).encode() for i in picked}
    checked = sum(valid(by_id[i].text, docs[i].decode()) for i in picked)
    # 3. the walks, on every vocabulary
    timing: dict[tuple[str, str], dict[str, Any]] = {}
    for path, (vocab, _) in vocabs.items():
        walk_tasks = [{"id": i, "schema": by_id[i].text, "walk": tokenize(vocab, docs[i])}
                      for i in picked if docs[i]]
        for e in timed:
            timing[(path.stem, e)] = pool(e, path).run(walk_tasks)

    print(f"{len(schemas)} schemas from {args.schemas}; model {args.model.name}; "
          f"{time.perf_counter() - started:.0f} s")
    print("\nCoverage (compiles and gives a first mask within "
          f"{args.timeout:.0f} s, {Path(args.model).stem} vocabulary):\n")
    print(coverage_table(schemas, {e: {i: r for i, r in c.items() if not i.startswith("probe|")}
                                   for e, c in cover.items()}))
    print("\nKeyword probes (a valid and an invalid document walked through each engine):\n")
    print("| keyword | " + " | ".join(pythons) + " |")
    print("|---|" + "---|" * len(pythons))
    for kw in PROBES:
        print(f"| {kw} | " + " | ".join(probe_verdict(
            cover[e][f"probe|{kw}|valid"], cover[e][f"probe|{kw}|invalid"]) for e in pythons)
            + " |")
    print(f"\nMask time per token: {len(picked)} documents, the model's greedy answers under "
          f"llama.cpp's grammar ({checked} complete and valid per jsonschema, the rest cut at "
          f"{args.max_tokens} tokens), {args.timed_per_category} per category:\n")
    print("| vocabulary | tokens | engine | TTFM median (ms) | mask µs mean / median / p95 |"
          " check µs median | steps | walks refused |")
    print("|---|---|---|---|---|---|---|---|")
    for path in vocabs:
        size = len(json.loads(vocabs[path][1].read_text())["pieces"])
        for e in timed:
            rs = [r for r in timing[(path.stem, e)].values() if r.get("ok")]
            masks = [v for r in rs for v in r.get("mask_ns", [])]
            checks = [v for r in rs for v in r.get("check_ns", [])]
            mean, med, p95 = stats_us(masks)
            ttfm = statistics.median(r["ttfm_ms"] for r in rs) if rs else float("nan")
            refused = sum(r.get("refused_at") is not None for r in rs)
            failed = len(timing[(path.stem, e)]) - len(rs)
            check = f"{statistics.median(checks) / 1000:.1f}" if checks else "—"
            print(f"| {path.stem} | {size:,} | {e} | {ttfm:.1f} | {mean:.0f} / {med:.0f} /"
                  f" {p95:.0f} | {check} | {len(masks)} | {refused}"
                  f"{f' (+{failed} failed)' if failed else ''} |")
    if args.json:
        args.json.write_text(json.dumps({"coverage": cover, "docs": {
            i: docs[i].decode() for i in picked},
            "timing": {f"{v}|{e}": r for (v, e), r in timing.items()}}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`outrider quantize`, `outrider eval` and `outrider bench`: make a quant, measure its
quality, measure speed and memory on this machine.

    $ outrider quantize m.F16.gguf --type Q4_K_M --embeddings-type Q8_0 --output-type Q8_0 \\
          --edge-layers 2:Q6_K --override 'attn_v=Q6_K' -o m.Q4_K_M-mixed.gguf
    $ outrider eval m.F16.gguf --save-kld-base f16.npz --ctx 512
    $ outrider eval m.Q4_K_M-mixed.gguf --kld-base f16.npz
    PPL 17.42 ± 0.31 (+2.10% vs reference) · KLD 0.0412 · same top token 91.3%
    $ outrider bench m.Q4_K_M.gguf --kv f16/f16,q8_0/q8_0 --ctx 2048,8192 --threads 2,4
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from runtime.cli.load_args import FIT, add_load_flags, load_settings
from runtime.errors import SettingsError
from runtime.paths import user_dirs
from runtime.settings.load import KV_CACHE_TYPES, LoadSettings
from runtime.units import fmt_bytes


def register(subparsers: Any) -> None:
    # `-o/--out` is the file, `--output-type` the output tensor's type. A user who types
    # `--output out.gguf` means the file: `_Misnamed` says so, and allow_abbrev=False keeps
    # argparse from reading a prefix such as `--output-t` or `--emb` as a tensor-type flag.
    q = subparsers.add_parser("quantize", help="make a GGUF of another quant level",
                              description="Quantize a GGUF with llama.cpp, with an optional "
                              "mixed-precision recipe. The output appears only when complete.",
                              allow_abbrev=False)
    q.add_argument("model", type=Path, help="the source .gguf (F16/BF16/F32 ideally)")
    q.add_argument("--type", required=True, help="quant level: Q8_0, Q6_K, Q5_K_M, Q4_K_M, "
                   "Q4_0, Q3_K_M, Q2_K, IQ4_XS ... (IQ2/IQ1 types need --imatrix)")
    q.add_argument("--embeddings-type", metavar="TYPE",
                   help="token-embedding tensor type (e.g. Q8_0, F16)")
    q.add_argument("--output-type", metavar="TYPE",
                   help="output (lm_head) tensor type (e.g. Q8_0, F16)")
    q.add_argument("--output", action=_Misnamed, help=argparse.SUPPRESS,
                   hint="for the file use -o/--out; the output tensor type is --output-type")
    q.add_argument("--embeddings", action=_Misnamed, help=argparse.SUPPRESS,
                   hint="the token-embedding tensor type is --embeddings-type")
    q.add_argument("--edge-layers", help="N:TYPE — the first and last N blocks at TYPE")
    q.add_argument("--override", action="append", default=[], metavar="REGEX=TYPE",
                   help="tensor type by name pattern, first match wins (repeatable)")
    q.add_argument("--imatrix", type=Path, help="importance matrix (llama-imatrix output)")
    q.add_argument("--allow-requantize", action="store_true",
                   help="allow a source that is already quantized (loses quality twice)")
    q.add_argument("--threads", type=int, default=0, help="threads (default: all)")
    q.add_argument("-o", "--out", type=Path, help="output file (default: beside the source)")
    q.set_defaults(handler=run_quantize)

    e = subparsers.add_parser("eval", help="perplexity and KL divergence on a text",
                              description="Perplexity as llama-perplexity computes it; with "
                              "--kld-base, KL divergence and same-top-token %% against a "
                              "reference run saved with --save-kld-base.")
    e.add_argument("model", type=Path)
    e.add_argument("--text", type=Path, help="a UTF-8 text file (default: the shipped text)")
    e.add_argument("--batch", type=int, default=512, help="batch size (default 512)")
    e.add_argument("--chunks", type=int, default=None, help="score only the first N chunks")
    # --ctx is the chunk length; a flag left out keeps EvalOptions' default, not a load's.
    add_load_flags(e, *FIT, "--threads", "--gpu-layers",
                   defaults={"--ctx": "512",
                             "--threads": "the CPUs this process may use",
                             "--gpu-layers": "where llama.cpp's defaults put them"})
    e.add_argument("--kld-base", type=Path, help="reference file to compare against")
    e.add_argument("--save-kld-base", type=Path, help="save this run as a reference")
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    e.set_defaults(handler=run_eval)

    b = subparsers.add_parser("bench", help="speed and memory across load settings",
                              description="Loads the model once per setting and generates "
                              "greedily; prints a table and saves CSV/JSON in the data folder.")
    b.add_argument("model", type=Path)
    b.add_argument("--kv", default="f16/f16,q8_0/q8_0,q4_0/q4_0",
                   help="K/V type pairs, comma-separated (default f16/f16,q8_0/q8_0,q4_0/q4_0)")
    b.add_argument("--ctx", default="2048", help="context sizes, comma-separated")
    b.add_argument("--gpu-layers", default="auto", help="GPU layer counts or 'auto'")
    b.add_argument("--threads", default="default", help="thread counts or 'default'")
    b.add_argument("--draft", default="none", help="drafting modes: none, ngram, model")
    b.add_argument("--draft-model", type=Path, help="draft model for --draft model")
    b.add_argument("--grid", default="one-at-a-time", choices=["one-at-a-time", "full"])
    b.add_argument("--prompt-tokens", type=int, default=512, help="about this many (default 512)")
    b.add_argument("--gen-tokens", type=int, default=64)
    b.add_argument("--out", type=Path, help="folder for the CSV/JSON (default: data/bench)")
    b.set_defaults(handler=run_bench)


class _Misnamed(argparse.Action):
    """A flag's old or likely-mistaken name (`--output`, `--embeddings`): refused, naming
    the right one, instead of being read as something the user did not mean."""

    def __init__(self, option_strings: list[str], dest: str, *, hint: str,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.hint = hint

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        raise argparse.ArgumentError(self, self.hint)


def run_quantize(args: argparse.Namespace) -> int:
    # start-up time: only `quantize` loads the quantizer
    from runtime.quality.quantize import (
        QuantProgress,
        QuantRecipe,
        default_output_path,
        parse_edge_layers,
        parse_override,
        quantize,
    )

    recipe = QuantRecipe(
        ftype=args.type, embeddings=args.embeddings_type, output=args.output_type,
        edge_layers=parse_edge_layers(args.edge_layers) if args.edge_layers else None,
        overrides=tuple(parse_override(o) for o in args.override), imatrix=args.imatrix,
        allow_requantize=args.allow_requantize, n_threads=args.threads)
    out = args.out or default_output_path(args.model, recipe.ftype, recipe.mixed)
    tty = sys.stderr.isatty()

    def progress(p: QuantProgress) -> None:
        if tty:
            print(f"\r[{p.done:>4}/{p.total}] {p.tensor:<40.40}", end="", file=sys.stderr,
                  flush=True)

    cancel = threading.Event()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            path = quantize(args.model, out, recipe, on_progress=progress, cancel_event=cancel)
        finally:
            if tty:
                print(file=sys.stderr)
            for w in caught:
                print(f"warning: {w.message}", file=sys.stderr)
    print(f"{path} ({fmt_bytes(path.stat().st_size)})")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    # start-up time: only `eval` loads the evaluator
    from runtime.quality.evaluate import EvalOptions, default_text, evaluate

    if args.text is not None:
        try:
            text = args.text.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"cannot read {args.text} as UTF-8 text: {exc}") from exc
    else:
        text = default_text()
    # Read as a load's flags are (one check, one message), then handed to the evaluation.
    load = load_settings(args, LoadSettings(model_path=args.model, n_ctx=EvalOptions.n_ctx))
    opts = EvalOptions(n_ctx=load.n_ctx, n_batch=args.batch, type_k=load.type_k,
                       type_v=load.type_v, n_threads=load.n_threads, gpu_layers=load.gpu_layers,
                       max_chunks=args.chunks)
    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if tty:
            print(f"\rchunk {done}/{total}", end="", file=sys.stderr, flush=True)

    result = evaluate(args.model, text, opts, kld_base=args.kld_base,
                      save_kld_base=args.save_kld_base, on_progress=progress)
    if tty:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    line = f"PPL {result.ppl:.4f} ± {result.ppl_stderr:.4f}"
    if result.delta_ppl_pct is not None:
        line += f" ({result.delta_ppl_pct:+.2f}% vs reference {result.ppl_base:.4f})"
    if result.kld is not None:
        line += (f" · KLD {result.kld:.5f} ± {result.kld_stderr:.5f}"
                 f" · same top token {result.same_top_pct:.2f}%")
    print(line)
    print(f"{result.model}: ctx {result.n_ctx}, K {result.type_k}, V {result.type_v}, "
          f"{result.n_chunks} chunks, {result.n_scored} tokens scored, {result.seconds:.1f} s")
    if args.save_kld_base:
        print(f"reference saved to {args.save_kld_base}")
    return 0


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _ints_or_none(text: str, none_word: str) -> tuple[int | None, ...]:
    try:
        return tuple(None if v == none_word else int(v) for v in _split(text))
    except ValueError as exc:
        raise SettingsError(f"expected numbers or {none_word!r}, got {text!r}") from exc


def run_bench(args: argparse.Namespace) -> int:
    # start-up time: only `bench` loads the engine and the sweep
    from runtime.engine.build import build_engine
    from runtime.quality.bench import (
        SweepSpec,
        format_row,
        format_table,
        run_sweep,
        save_results,
        sweep_points,
    )
    from runtime.quality.evaluate import default_text

    kv: list[tuple[str, str]] = []
    for pair in _split(args.kv):
        k, _, v = pair.partition("/")
        if k not in KV_CACHE_TYPES or (v or k) not in KV_CACHE_TYPES:
            raise SettingsError(f"K/V pair {pair!r}: types are {', '.join(KV_CACHE_TYPES)}")
        kv.append((k, v or k))
    contexts = tuple(int(c) for c in _split(args.ctx)) if args.ctx else (2048,)
    drafts = tuple(_split(args.draft))
    for d in drafts:
        if d not in ("none", "ngram", "model"):
            raise SettingsError(f"drafting mode {d!r} is not none, ngram or model")
    if "model" in drafts and args.draft_model is None:
        raise SettingsError("--draft model needs --draft-model FILE")
    spec = SweepSpec(kv=tuple(kv), contexts=contexts,
                     gpu_layers=_ints_or_none(args.gpu_layers, "auto"),
                     threads=_ints_or_none(args.threads, "default"),
                     drafts=drafts, grid=args.grid)  # type: ignore[arg-type]
    points = sweep_points(spec)
    # About 4 characters per token of English prose; the engine reports the true count.
    prompt = default_text()[: 4 * args.prompt_tokens]
    print(f"{len(points)} settings to measure", file=sys.stderr)

    def on_row(row: Any) -> None:
        print("  " + " | ".join(c for c in format_row(row) if c), file=sys.stderr, flush=True)

    rows = run_sweep(build_engine, args.model, points, prompt, n_gen=args.gen_tokens,
                     draft_model=args.draft_model, on_row=on_row)
    print(format_table(rows))
    csv_path, json_path = save_results(rows, args.model, args.out or user_dirs().data / "bench",
                                       {"prompt_tokens": args.prompt_tokens,
                                        "gen_tokens": args.gen_tokens})
    print(f"saved {csv_path} and {json_path}")
    return 0 if all(not r.error for r in rows) else 1

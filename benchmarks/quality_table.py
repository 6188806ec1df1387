"""Quality of each weight quant level and KV cache type on one model, measured.

Makes an F16 reference from the model, quantizes it to each level — plain, and with the
mixed-precision recipe (token embeddings and output at Q8_0) — and evaluates every file on
the same text against the reference: PPL, ΔPPL %, mean KLD, same-top-token %. Then the
reference model again with quantized K/V caches.

    nice python benchmarks/quality_table.py --ctx 256 --chunks 16 --threads 2

The default model, SmolLM2-135M-Instruct, only exists as Q4_1 (token embeddings Q8_0): its
"F16" reference is that Q4_1 dequantized, so every row measures the loss of requantizing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.errors import QuantizeError
from runtime.quality.evaluate import EvalOptions, EvalResult, default_text, evaluate
from runtime.quality.quantize import QuantRecipe, quantize, read_tensor_types

WEIGHT_TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_1", "Q5_0", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
# Levels for which the table also shows the token embeddings at the level's own main type
# (what a "pure" quant does), to measure what keeping them at Q8_0 buys.
LOW_EMBEDDING_LEVELS = ("Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
KV_TYPES = (("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"))
# llama.cpp's tools/perplexity/README.md (Llama-3-8B, wikitext-2, vs FP16): ΔPPL %, KLD,
# same top p %. ΔPPL % = ΔPPL / 6.233 (the FP16 PPL); "same top" is listed only for these.
LLAMA3_8B = {
    "Q8_0": (0.04, 0.001355, 97.674), "Q6_K": (0.35, 0.005452, 96.031),
    "Q5_K_M": (0.91, 0.010762, None), "Q4_K_M": (2.82, 0.031273, 91.901),
    "Q4_0": (7.52, 0.071940, None), "Q3_K_M": (10.54, 0.101913, None),
    "Q2_K": (56.48, 0.445132, 71.138),
}


def composition(path: Path) -> str:
    """The 2-D weights' types, most common first: 'Q5_0×150 Q6_K×30'."""
    counts = Counter(t for t in read_tensor_types(path).values() if t != "F32")
    return " ".join(f"{t}×{n}" for t, n in counts.most_common())


def main_type(path: Path) -> str:
    """The most common type of the 2-D weights."""
    counts = Counter(t for t in read_tensor_types(path).values() if t != "F32")
    return counts.most_common(1)[0][0]


def row(label: str, r: EvalResult, size: int | None, comp: str, ref: tuple) -> str:
    mib = f"{size / (1 << 20):.1f}" if size else ""
    d, k, s = ref
    theirs = " / ".join("–" if v is None else f"{v:g}" for v in (d, k, s)) if d is not None else ""
    return (f"| {label} | {mib} | {r.ppl:.3f} | {r.delta_ppl_pct:+.2f} | {r.kld:.4f} | "
            f"{r.same_top_pct:.2f} | {comp} | {theirs} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="source GGUF (default: the default model)")
    parser.add_argument("--text", type=Path, help="text (default: runtime/data/eval.txt)")
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--work", type=Path, default=Path("/tmp/outrider-quality"))
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    if args.model is None:
        from runtime.library.default_model import default_model_path

        args.model = default_model_path()
    text = args.text.read_text(encoding="utf-8") if args.text else default_text()
    args.work.mkdir(parents=True, exist_ok=True)
    opts = EvalOptions(n_ctx=args.ctx, max_chunks=args.chunks, n_threads=args.threads)
    started = time.perf_counter()

    ref_model = args.work / "ref.F16.gguf"
    if not ref_model.exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # requantizing the only weights there are
            quantize(args.model, ref_model, QuantRecipe("F16", allow_requantize=True))
    ref_file = args.work / f"ref-{args.ctx}-{args.chunks}.npz"
    ref = evaluate(ref_model, text, opts, save_kld_base=ref_file)
    print(f"reference {ref_model.name}: PPL {ref.ppl:.4f} ± {ref.ppl_stderr:.4f}, "
          f"{ref.n_chunks} chunks × ctx {ref.n_ctx}, {ref.n_scored} tokens", file=sys.stderr)

    lines = ["| weights | MiB | PPL | ΔPPL % | KLD | same top % | 2-D tensor types "
             "| Llama-3-8B ΔPPL % / KLD / same top % |",
             "|---|---|---|---|---|---|---|---|"]
    results: dict[str, dict] = {}
    lines.append(f"| F16 (reference) | {ref_model.stat().st_size / (1 << 20):.1f} | {ref.ppl:.3f} "
                 f"| 0 | 0 | 100 | {composition(ref_model)} | |")

    def measure(label: str, recipe: QuantRecipe, theirs: tuple) -> Path:
        name = label.replace(" ", "").replace("/", "-").replace("+", "_").replace(",", "_")
        path = args.work / f"{name}.gguf"
        if not path.exists():
            quantize(ref_model, path, recipe)
        r = evaluate(path, text, opts, kld_base=ref_file)
        results[label] = {**r.to_dict(), "types": composition(path)}
        lines.append(row(label, r, path.stat().st_size, composition(path), theirs))
        print(lines[-1], file=sys.stderr, flush=True)
        return path

    for kind in WEIGHT_TYPES:
        plain = measure(kind, QuantRecipe(kind), LLAMA3_8B.get(kind, (None, None, None)))
        plain_types = read_tensor_types(plain)
        mixed = QuantRecipe(kind, embeddings="Q8_0", output="Q8_0")
        probe = args.work / f"probe-{kind}.gguf"
        if not probe.exists():
            quantize(ref_model, probe, mixed)
        if read_tensor_types(probe) == plain_types:  # llama.cpp's mixture already does it
            lines.append(f"| {kind} + emb/out Q8_0 | = {kind}: same tensor types | | | | | | |")
        else:
            measure(f"{kind} + emb/out Q8_0", mixed, (None, None, None))
        low = main_type(plain)
        if kind in LOW_EMBEDDING_LEVELS and low != plain_types["token_embd.weight"]:
            try:
                measure(f"{kind}, embeddings {low}", QuantRecipe(kind, embeddings=low),
                        (None, None, None))
            except QuantizeError as exc:  # e.g. a 256-block type for 576-wide embeddings
                print(f"{kind}, embeddings {low}: {exc}", file=sys.stderr)

    kv_lines = ["| K cache | V cache | PPL | ΔPPL % | KLD | same top % |", "|---|---|---|---|---|---|"]
    for k, v in KV_TYPES:
        r = evaluate(ref_model, text, EvalOptions(n_ctx=args.ctx, max_chunks=args.chunks,
                                                  n_threads=args.threads, type_k=k, type_v=v),
                     kld_base=ref_file)
        results[f"kv {k}/{v}"] = r.to_dict()
        kv_lines.append(f"| {k} | {v} | {r.ppl:.3f} | {r.delta_ppl_pct:+.2f} | {r.kld:.4f} | "
                        f"{r.same_top_pct:.2f} |")
        print(kv_lines[-1], file=sys.stderr, flush=True)

    print(f"model {args.model.name}, reference {ref_model.name}, text {len(text):,} chars, "
          f"ctx {ref.n_ctx}, {ref.n_chunks} chunks, {ref.n_scored} scored tokens, "
          f"{time.perf_counter() - started:.0f} s")
    print("\n".join(lines))
    print()
    print("\n".join(kv_lines))
    if args.json:
        args.json.write_text(json.dumps({"reference": ref.to_dict(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

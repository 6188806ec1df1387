"""`outrider draft make MODEL --type Q4_0`: make a draft model from the target itself.

Speculative decoding needs a draft that shares the target's vocabulary and is much cheaper
to run. When no smaller sibling exists, a low-bit copy of the target is one: llama.cpp's
`llama_model_quantize` writes it next to the target in the library (runtime.quality.quantize), and
it passes the compatibility check by construction.

    $ outrider draft make ~/models/Qwen2.5-7B-Instruct.F16.gguf --type Q4_0
    [##########] 339/339 tensors
    wrote Qwen2.5-7B-Instruct.Q4_0.gguf (4.13 GiB) next to the target
    use it: outrider run Qwen2.5-7B-Instruct.F16.gguf --draft Qwen2.5-7B-Instruct.Q4_0.gguf

A target that is already quantized (Q8_0, Q4_1 …) is refused unless `--allow-requantize`:
its quality losses would be counted twice (fine for a draft, whose only job is to guess).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from runtime.quality.quantize import QuantProgress, QuantRecipe, default_output_path, quantize
from runtime.units import fmt_bytes


def register(subparsers: Any) -> None:
    draft = subparsers.add_parser("draft", help="make a draft model for speculative decoding")
    sub = draft.add_subparsers(dest="draft_command", metavar="ACTION", required=True)
    make = sub.add_parser("make", help="write a low-bit copy of a model to draft for it",
                          description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    make.add_argument("model", help="the target .gguf (F16/BF16/F32/Q8_0 work best)")
    make.add_argument("--type", default="Q4_0", metavar="TYPE",
                      help="quant level of the draft (default Q4_0; Q2_K is smaller still)")
    make.add_argument("-o", "--output", default=None,
                      help="where to write it (default: next to the target, quant in the name)")
    make.add_argument("--allow-requantize", action="store_true",
                      help="accept an already quantized target")
    make.add_argument("--threads", type=int, default=0, help="threads (0 = all cores)")
    make.set_defaults(handler=_make)


def make_draft(model: Path, ftype: str = "Q4_0", output: Path | None = None, *,
               allow_requantize: bool = False, threads: int = 0,
               on_progress: Any = None) -> Path:
    """Write the draft and return its path (QuantizeError and friends on failure)."""
    recipe = QuantRecipe(ftype, allow_requantize=allow_requantize, n_threads=threads)
    dst = output if output is not None else default_output_path(model, recipe.ftype)
    with warnings.catch_warnings():
        # A requantized draft is the point here, not an accident: no RequantizeWarning.
        warnings.simplefilter("ignore")
        return quantize(model, dst, recipe, on_progress=on_progress)


def _make(args: argparse.Namespace) -> int:
    model = Path(args.model).expanduser()
    err = sys.stderr

    def progress(p: QuantProgress) -> None:
        bar = "#" * int(p.fraction * 20)
        err.write(f"\r[{bar:<20}] {p.done}/{p.total} tensors")
        err.flush()

    output = Path(args.output).expanduser() if args.output else None
    dst = make_draft(model, args.type, output, allow_requantize=args.allow_requantize,
                     threads=args.threads, on_progress=progress)
    err.write("\n")
    where = "next to the target" if dst.parent == model.parent else f"in {dst.parent}"
    print(f"wrote {dst.name} ({fmt_bytes(dst.stat().st_size)}) {where}")
    print(f"use it: outrider run {model} --draft {dst}")
    return 0

"""`outrider info MODEL` and `outrider plan MODEL …`: what a model is and whether it fits.

MODEL is a local .gguf (any part of a split set) or an http(s) URL, read with range
requests (only the header travels). Both print for people, or JSON with `--json`.
A vision model's projector is planned with it: `--mmproj FILE`, else the `mmproj*.gguf`
beside a local model (`runtime.library.projectors`); `--no-mmproj` plans the text model alone.

    $ outrider plan SmolLM2-135M-Instruct.Q4_1.gguf --ctx 8192 --kv-k q8_0 --kv-v q8_0
    CPU only: 304 MiB (weights 92.1 MiB, KV 95.6 MiB, compute 98.4 MiB, other 17.4 MiB); max context 8,192
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from runtime.cli.load_args import FIT, add_load_flags, load_settings
from runtime.gguf.info import ModelInfo, read_model_info
from runtime.gguf.projector import ProjectorInfo, projector_info, read_projector_info
from runtime.gguf.remote import read_remote_header, read_remote_model_info
from runtime.library.projectors import projector_for
from runtime.llama.stepper import native_step_status
from runtime.planner.devices import list_devices
from runtime.planner.plan import MemoryPlan, plan_memory
from runtime.sampling.native import native_status
from runtime.settings.load import LoadSettings
from runtime.units import MIB, fmt_bytes, fmt_count


def register(subparsers: Any) -> None:
    info = subparsers.add_parser("info", help="show a model's metadata and its memory plan")
    info.add_argument("model", help="a .gguf file or an http(s) URL")
    add_load_flags(info, "--mmproj", defaults=_PROJECTOR_DEFAULT)
    info.add_argument("--no-mmproj", action="store_true", help="plan without a projector")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(handler=run_info)

    plan = subparsers.add_parser("plan", help="plan memory for a model and load settings")
    plan.add_argument("model", help="a .gguf file or an http(s) URL")
    add_load_flags(plan, *PLAN_FLAGS, defaults=_PROJECTOR_DEFAULT)
    plan.add_argument("--no-mmproj", action="store_true", help="plan without a projector")
    plan.add_argument("--json", action="store_true", help="print JSON")
    plan.set_defaults(handler=run_plan)


# The load flags a memory plan depends on. A draft counts as a second model to hold; its
# length and acceptance rule change no memory, threads neither.
PLAN_FLAGS = (*FIT, "--flash-attn", "--ubatch", "--gpu-layers", "--parallel", "--draft",
              "--mmproj")
_PROJECTOR_DEFAULT = {"--mmproj": "the mmproj*.gguf beside a local model"}


def load_projector(args: argparse.Namespace) -> ProjectorInfo | None:
    """The projector to plan with: --mmproj, else the one beside a local model, else none."""
    if getattr(args, "no_mmproj", False):
        return None
    given = getattr(args, "mmproj", None)
    if given and given.startswith(("http://", "https://")):
        name = given.rsplit("/", 1)[-1].split("?", 1)[0]
        return projector_info(read_remote_header(given).header, Path(name))
    if given:
        return read_projector_info(Path(given).expanduser())
    if args.model.startswith(("http://", "https://")):
        return None
    paired = projector_for(Path(args.model).expanduser())
    return read_projector_info(paired) if paired is not None else None


def run_info(args: argparse.Namespace) -> int:
    info = load_info(args.model)
    projector = load_projector(args)
    settings = LoadSettings(model_path=Path(args.model), n_ctx=_default_ctx(info))
    plan = plan_memory(info, settings, list_devices(), projector=projector)
    kernels = native_status()
    step = native_step_status()
    if args.json:
        print(json.dumps({"model": info.to_dict(), "plan": plan.to_dict(),
                          "projector": projector.to_dict() if projector else None,
                          "sampling_kernels": kernels, "decode_step": step}, indent=2))
    else:
        print(format_info(info))
        if projector is not None:
            print(format_projector(projector))
        print()
        print(format_plan(plan, settings))
        print(f"  sampling and verify: {kernels}")
        print(f"  decode step: {step}")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    info = load_info(args.model)
    settings = load_settings(args, LoadSettings(model_path=Path(args.model)))
    draft = load_info(args.draft) if settings.draft.kind == "model" else None
    plan = plan_memory(info, settings, list_devices(), draft, projector=load_projector(args))
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(format_plan(plan, settings))
    return 1 if plan.verdict == "wont_fit" else 0


def load_info(model: str) -> ModelInfo:
    if model.startswith(("http://", "https://")):
        return read_remote_model_info(model)
    return read_model_info(Path(model))


def format_info(info: ModelInfo) -> str:
    kv_heads = sorted(set(info.n_head_kv))
    heads = f"{info.n_head} heads ({'/'.join(map(str, kv_heads))} KV heads of {info.key_length})"
    lines = [
        ("name", info.name),
        ("architecture", f"{info.architecture}, {info.block_count} layers, {info.n_embd} wide, "
                         f"{heads}"),
        ("parameters", f"{fmt_count(info.n_params)}, {info.quant} "
                       f"({info.bits_per_weight:.2f} bits per weight)"),
        ("tensors", fmt_bytes(info.tensor_bytes)
                    + (f" in {info.split_count} files" if info.split_count > 1 else "")),
        ("context", f"{info.n_ctx_train:,} tokens trained"),
        ("vocabulary", f"{info.n_vocab:,} tokens ({info.tokenizer_model or '?'}"
                       f"/{info.tokenizer_pre or '-'}), BOS {info.bos_id}, EOS {info.eos_id}"),
        ("chat template", f"yes ({len(info.chat_template):,} characters)"
                          if info.chat_template else "none (a fallback will be used)"),
    ]
    if info.n_expert:
        lines.append(("experts", f"{info.n_expert} ({info.n_expert_used} used per token)"))
    if info.kv_lora_rank is not None:
        lines.append(("MLA", f"kv_lora_rank {info.kv_lora_rank} + {info.rope_dims} rope dims"))
    if info.sliding_window:
        lines.append(("sliding window", f"{info.sliding_window:,} tokens on "
                                        f"{sum(info.swa_layers)} of {info.block_count} layers"))
    width = max(len(k) for k, _ in lines)
    return "\n".join([info.path_or_url] + [f"  {k:<{width}}  {v}" for k, v in lines])


def format_projector(projector: ProjectorInfo) -> str:
    """"  vision  mmproj-F16.gguf: gemma3 projector, 812 MiB, 256 tokens per image"."""
    about = "" if projector.image_tokens_exact else "about "
    return (f"  vision  {projector.path.name}: {projector.projector_type} projector, "
            f"{fmt_bytes(projector.tensor_bytes)}, {about}{projector.image_tokens:,} tokens "
            "per image")


def format_plan(plan: MemoryPlan, settings: LoadSettings) -> str:
    layers = "auto" if settings.gpu_layers is None else str(settings.gpu_layers)
    out = [f"plan: context {plan.n_ctx:,}, K {settings.type_k}, V {settings.type_v}, "
           f"GPU layers {layers}, flash attention {'on' if plan.flash_attn else 'off'}",
           f"  {plan.describe()}",
           f"  KV cache {plan.kv_bytes_per_token:,} bytes per token",
           f"  {'device':<10}{'weights':>10}{'KV':>10}{'compute':>10}{'total':>10}{'free':>11}"]
    for d in plan.devices:
        out.append(f"  {d.id:<10}{d.weights / MIB:>10,.0f}{d.kv / MIB:>10,.0f}"
                   f"{d.compute / MIB:>10,.0f}{d.total / MIB:>10,.0f}{d.free_bytes / MIB:>11,.0f}"
                   + ("" if d.fits else "  (does not fit)"))
    out.append("  (MiB)")
    vision = sum(d.projector for d in plan.devices)
    if vision:
        out.append(f"  the vision projector takes {fmt_bytes(vision)} of that (weights and "
                   "compute buffer)")
    if plan.verdict == "wont_fit" and plan.recommended_gpu_layers:
        out.append(f"  fits with --gpu-layers {plan.recommended_gpu_layers}")
    out += [f"  note: {n}" for n in plan.notes]
    return "\n".join(out)


def _default_ctx(info: ModelInfo) -> int:
    return min(4096, info.n_ctx_train) if info.n_ctx_train >= 16 else 4096


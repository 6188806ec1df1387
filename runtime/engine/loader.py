"""Loading a model for the engine: preflight, weights, context, chat template, drafting.

Runs on the engine thread. Each stage fails with a typed error and frees what the earlier
stages made, so a failed load leaves nothing behind and the engine can load again:

    preflight (runtime.gguf.preflight: the file is a sane GGUF)   → ModelFileError subclasses
    probe (runtime.engine.probe, optional: a child loads a new file) → LoadCrashed
    llama_model_load_from_file (with progress)                 → LoadError / UnsupportedArchitecture
    llama_init_from_model (K/V types, flash attention, slots)  → LoadError with llama.cpp's reason
    the projector, when there is one (runtime.gguf.projector preflight first, then
    mtmd_init_from_file: runtime.llama.mtmd)             → ModelFileError / LoadError
    chat template (the model's, or ChatML said out loud)
    speculation.attach (draft model / n-gram), optional

What llama.cpp logged while loading gives `LoadedModel.allocated` (its buffer sizes; the
projector's under "mmproj.<device> model|compute").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from runtime.chat.families import capabilities
from runtime.chat.tool_grammar import call_markers
from runtime.engine.api import LoadedModel
from runtime.engine.chat_template import ChatTemplate
from runtime.engine.embeddings import pooling_for
from runtime.errors import EmbeddingsUnsupported, LoadError, OutriderError
from runtime.gguf.preflight import check_gguf
from runtime.gguf.projector import check_projector
from runtime.llama.binding import LlamaContext, LlamaModel
from runtime.llama.buffers import parse_buffer_sizes, parse_projector_buffers
from runtime.llama.mtmd import Projector
from runtime.llama.params import LlamaParams
from runtime.settings.load import LoadSettings
from runtime.speculative.api import SpecSetup, SpeculationPolicy


@dataclass
class LoadResult:
    model: LlamaModel
    ctx: LlamaContext
    info: LoadedModel
    template: ChatTemplate
    spec: SpecSetup | None
    projector: Projector | None = None


def load_model(settings: LoadSettings, params: LlamaParams,
               on_progress: Callable[[float], None] | None,
               speculation: SpeculationPolicy | None,
               probe: Callable[[Path, LlamaParams], None] | None = None) -> LoadResult:
    """Everything the engine needs for `settings`, or a typed error with nothing left open.
    `probe(path, params)` runs after the preflight and before llama.cpp sees the file here."""
    path = settings.model_path
    check_gguf(path)
    if settings.mmproj_path is not None:
        check_projector(settings.mmproj_path)
    if probe is not None:
        probe(path, params)

    def progress(fraction: float) -> bool:
        if on_progress is not None:
            on_progress(fraction)
        return True

    model = LlamaModel.load(path, params, on_progress=progress)
    try:
        ctx = LlamaContext(model, params)
    except LoadError as exc:
        model.close()
        if settings.kv_quantized:
            raise LoadError(f"{exc} — the K/V cache pair {settings.type_k}/{settings.type_v} "
                            f"does not work with this model here; f16/f16 always does") from exc
        raise
    except BaseException:
        model.close()
        raise
    projector: Projector | None = None
    try:
        if settings.mmproj_path is not None:
            projector = Projector.load(settings.mmproj_path, model, params)
        return _finish(settings, params, model, ctx, speculation, probe, projector)
    except BaseException:
        if projector is not None:
            projector.close()
        ctx.close()
        model.close()
        raise


def _finish(settings: LoadSettings, params: LlamaParams, model: LlamaModel, ctx: LlamaContext,
            speculation: SpeculationPolicy | None,
            probe: Callable[[Path, LlamaParams], None] | None,
            projector: Projector | None = None) -> LoadResult:
    notes = list(params.notes)
    image_tokens = None
    allocated = parse_buffer_sizes(model.load_log + ctx.init_log)
    if projector is not None:
        image_tokens = check_projector(projector.path).image_tokens
        allocated.update(parse_projector_buffers(projector.load_log))
        if projector.non_causal and image_tokens > ctx.n_ubatch:
            notes.append(f"an image is {image_tokens} tokens but the micro-batch holds "
                         f"{ctx.n_ubatch}: load with n_ubatch ≥ {image_tokens}, or images "
                         "are read in pieces that do not see each other whole")
        if settings.draft.kind != "none":
            notes.append("drafting is off for prompts with images (the draft cannot see them)")
    template = ChatTemplate.from_model(
        model.chat_template(),
        bos_token=model.token_text(model.bos) if model.bos >= 0 else "",
        eos_token=model.token_text(model.eos) if model.eos >= 0 else "")
    if template.note:
        notes.append(template.note)
    if ctx.n_ctx != settings.n_ctx:
        notes.append(f"llama.cpp rounded the context from {settings.n_ctx} up to {ctx.n_ctx} "
                     f"tokens (it allocates cells in blocks of 256)")
    if ctx.n_ctx > model.n_ctx_train > 0:
        notes.append(f"the context ({ctx.n_ctx}) is longer than the model was trained for "
                     f"({model.n_ctx_train}); expect worse answers past that")

    spec: SpecSetup | None = None
    draft_refused: str | None = None
    if settings.draft.kind != "none":
        if speculation is None:
            draft_refused = "speculative decoding is not available in this engine"
        else:
            try:
                draft_path = settings.draft.model_path
                if probe is not None and settings.draft.kind == "model" and draft_path:
                    probe(draft_path, params)  # a draft that crashes llama.cpp: drafting off
                spec = speculation.attach(model, settings)
            except OutriderError as exc:
                draft_refused = str(exc)
            if spec is not None:
                draft_refused = spec.refused
                notes.extend(spec.notes)
    if draft_refused:
        notes.append(f"drafting off: {draft_refused}")

    info = LoadedModel(
        path=settings.model_path,
        name=settings.model_path.stem,
        architecture=model.meta("general.architecture") or "?",
        n_params=model.n_params,
        size_bytes=model.size_bytes,
        quant=model.quant(),
        n_ctx=ctx.n_ctx,
        n_ctx_train=model.n_ctx_train,
        n_vocab=model.n_vocab,
        settings=settings,
        chat_template_source=template.source,
        flash_attn=ctx.flash_attn_used(params.flash_attn),
        notes=tuple(notes),
        allocated=allocated,
        draft=spec.draft_name if spec is not None else None,
        draft_refused=draft_refused,
        family=template.family,
        call_tokens=single_tokens(model, call_markers(template.family)),
        capabilities=capabilities(template.family, chat=_writes(model, ctx),
                                  embeddings=_embeds(model)) + (("vision",) if projector else ()),
        projector=projector.path.name if projector is not None else None,
        image_tokens=image_tokens,
    )
    if ctx.n_seq_max < settings.n_parallel:
        raise LoadError(f"llama.cpp gave {ctx.n_seq_max} sequence slots, not {settings.n_parallel}")
    return LoadResult(model, ctx, info, template, spec, projector)


def single_tokens(model: LlamaModel, texts: Iterable[str]) -> dict[str, int]:
    """Of `texts` (a call format's markers), those the vocabulary holds as one added or
    control token: text → id, so a grammar asks for the token the model was trained to
    write rather than its spelling."""
    found: dict[str, int] = {}
    for text in texts:
        ids = model.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1 and len(model.tokenize(text, add_special=False,
                                                parse_special=False)) > 1:
            found[text] = ids[0]
    return found


def _writes(model: LlamaModel, ctx: LlamaContext) -> bool:
    """Whether the model generates text: a causal decoder. Not an encoder-only model (BERT,
    whose attention sees the whole input at once), nor one that needs an encoder pass first
    (T5), which the engine never makes."""
    return ctx.causal_attn and not model.has_encoder


def _embeds(model: LlamaModel) -> bool:
    try:
        pooling_for(model)
    except EmbeddingsUnsupported:
        return False
    return True

"""Images in the engine on the tiny pair (tests/fixtures/tiny_vision_gguf.py: a Gemma-3 style
projector of 64 tokens per image for the tiny llama target): loading, the prompt cut into
text and image chunks, generation equal to llama.cpp's own mtmd path, batching with text
requests, reuse of an image's cells, drafting off, preemption, the typed errors, the CLI,
and the planner's projector figures against clip's buffer log."""

from __future__ import annotations

import ctypes
import dataclasses
import io
from pathlib import Path

import llama_cpp.llama_cpp as L
import llama_cpp.mtmd_cpp as M
import numpy as np
import pytest

from runtime.cli.main import main
from runtime.engine.api import LoadedModel
from runtime.engine.chat_template import ChatTemplate
from runtime.engine.engine import Engine
from runtime.engine.kv_store import KvStoreOptions
from runtime.engine.media_prompt import DRAFTING_OFF, placeholders
from runtime.errors import LoadError, ModelFileError, TruncatedModel
from runtime.events import (
    ChatMessage,
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    SamplingParams,
    StepStats,
    TokenEvent,
)
from runtime.gguf.info import read_model_info
from runtime.gguf.projector import read_projector_info
from runtime.llama.binding import Batch, LlamaContext, LlamaModel
from runtime.llama.buffers import buffer_totals, parse_projector_buffers
from runtime.llama.mtmd import ImagePiece, Projector, TextPiece
from runtime.llama.params import to_llama_params
from runtime.planner.devices import Device
from runtime.planner.plan import plan_memory
from runtime.planner.projector import projector_compute_bytes
from runtime.settings.load import DraftSettings, LoadSettings
from tests.conftest import tiny_mmproj_path
from tests.engine.conftest import tiny_settings
from tests.fixtures.tiny_vision_gguf import MISMATCHED_PROJECTOR, PROJECTOR, tiny_png

N_IMAGE = PROJECTOR.image_tokens  # 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
PHOTO, OTHER = tiny_png(seed=1), tiny_png(40, 56, seed=2)


def ask(engine: Engine, messages: list[ChatMessage], sampling: SamplingParams = GREEDY,
        **kw: object) -> tuple[list[int], list[Event]]:
    request = GenerationRequest(messages=tuple(messages), sampling=sampling, **kw)  # type: ignore[arg-type]
    events = list(engine.submit(request).events(timeout=120))
    return [e.token_id for e in events if isinstance(e, TokenEvent)], events


def done(events: list[Event]) -> Finished:
    finished = [e for e in events if isinstance(e, Finished)]
    assert len(finished) == 1, events
    return finished[0]


def question(image: bytes = PHOTO, text: str = "What is in this picture?") -> ChatMessage:
    return ChatMessage("user", text, images=(image,))


def vision(engine: Engine, target: Path, mmproj: Path, **kw: object) -> LoadedModel:
    return engine.load(tiny_settings(target, mmproj_path=mmproj, **kw))


# ---- the projector through mtmd ---------------------------------------------------------------


def test_the_fixture_loads_with_mtmd_and_an_image_is_64_tokens(tiny_target: Path,
                                                              tiny_mmproj: Path) -> None:
    params = to_llama_params(tiny_settings(tiny_target), 0)
    model = LlamaModel.load(tiny_target, params)
    projector = Projector.load(tiny_mmproj, model, params)
    try:
        assert projector.non_causal  # Gemma 3's image tokens see each other both ways
        assert projector.marker.startswith("<__media_") and projector.marker != "<__media__>"
        text = f"<|im_start|>user\n{projector.marker}What is this? <__media__><|im_end|>\n"
        chunks = projector.tokenize(text, [PHOTO], ["photo"])
        kinds = [type(p) for p in chunks.pieces]
        assert kinds == [TextPiece, ImagePiece, TextPiece]
        image = chunks.pieces[1]
        assert isinstance(image, ImagePiece)
        assert image.n_tokens == image.n_pos == N_IMAGE == chunks.image_tokens
        assert image.id == "photo"
        # mtmd wraps Gemma 3's image in its own text; the default marker is only text here
        assert model.tokenize("<end_of_image>", add_special=False)[:3] == list(
            chunks.pieces[2].tokens[:3])  # type: ignore[union-attr]
        assert "<__media__>" in model.detokenize(list(chunks.pieces[2].tokens))  # type: ignore[union-attr]
    finally:
        projector.close()
        model.close()


def test_a_load_with_a_projector_says_vision_and_its_buffers(engine: Engine, tiny_target: Path,
                                                           tiny_mmproj: Path) -> None:
    info = vision(engine, tiny_target, tiny_mmproj)
    assert "vision" in info.capabilities
    assert info.projector == tiny_mmproj.name and info.image_tokens == N_IMAGE
    assert {"mmproj.CPU model", "mmproj.CPU compute"} <= set(info.allocated)
    assert buffer_totals(info.allocated)["weights"] > info.allocated["mmproj.CPU model"]
    engine.load(tiny_settings(tiny_target))
    assert "vision" not in engine.status().model.capabilities  # type: ignore[union-attr]


# ---- generation -------------------------------------------------------------------------------


def llama_cpp_reference(target: Path, mmproj: Path, image: bytes, n: int) -> list[int]:
    """Greedy tokens by llama.cpp's own path: mtmd_helper_eval_chunks over the whole prompt
    (text and image chunks into sequence 0), then one token per decode."""
    params = to_llama_params(tiny_settings(target), 0)
    model = LlamaModel.load(target, params)
    ctx = LlamaContext(model, params)
    projector = Projector.load(mmproj, model, params)
    try:
        template = ChatTemplate.from_model(model.chat_template(), bos_token="", eos_token="")
        text = template.render([ChatMessage("user", projector.marker + "What is in this picture?")])
        chunks = projector.tokenize(text, [image], ["x"])
        n_past = L.llama_pos(0)
        assert M.mtmd_helper_eval_chunks(projector.ptr, ctx.ptr, chunks.ptr, 0, 0, 512, True,
                                         ctypes.byref(n_past)) == 0
        pos = n_past.value
        row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx.ptr, -1), shape=(model.n_vocab,))
        out, batch = [], Batch(4)
        for _ in range(n):
            out.append(int(row.argmax()))
            batch.clear()
            batch.add(out[-1], pos, 0, True)
            pos += 1
            assert ctx.decode(batch) == 0
            row = ctx.logits(1)[0]
        return out
    finally:
        projector.close()
        ctx.close()
        model.close()


def test_generation_with_an_image_is_llama_cpps_own(engine: Engine, tiny_target: Path,
                                                     tiny_mmproj: Path) -> None:
    reference = llama_cpp_reference(tiny_target, tiny_mmproj, PHOTO, GREEDY.max_tokens)
    vision(engine, tiny_target, tiny_mmproj)
    tokens, events = ask(engine, [question()])
    assert tokens == reference
    usage = done(events).usage
    assert usage.prompt_tokens > N_IMAGE and usage.cached_tokens == 0


def test_the_image_is_what_the_model_reads(engine: Engine, tiny_target: Path,
                                           tiny_mmproj: Path) -> None:
    vision(engine, tiny_target, tiny_mmproj)
    first = [ask(engine, [question(image)], logprobs=5)[1] for image in (PHOTO, OTHER, PHOTO)]
    tops = [next(e for e in ev if isinstance(e, TokenEvent)).top_logprobs for ev in first]
    values = [np.array([t.logprob for t in top]) for top in tops]
    # the same image: the same distribution (its cells reused the second time)
    assert [t.token_id for t in tops[0]] == [t.token_id for t in tops[2]]
    assert np.allclose(values[0], values[2], atol=1e-4)
    assert np.abs(values[0] - values[1]).max() > 1e-3  # another image: another one


def test_a_vision_request_batches_with_a_text_request(engine: Engine, tiny_target: Path,
                                                      tiny_mmproj: Path) -> None:
    text_only = [ChatMessage("user", "Tell me a story about the sea.")]
    story = dataclasses.replace(GREEDY, max_tokens=150)  # still decoding when the image comes
    vision(engine, tiny_target, tiny_mmproj, n_parallel=2)
    alone = [ask(engine, [question()])[0], ask(engine, text_only, story)[0]]
    vision(engine, tiny_target, tiny_mmproj, n_parallel=2)  # a fresh cache: nothing reused
    handles = [engine.submit(GenerationRequest(messages=(question(),), sampling=GREEDY)),
               engine.submit(GenerationRequest(messages=tuple(text_only), sampling=story))]
    together = [[e.token_id for e in h.events(timeout=120) if isinstance(e, TokenEvent)]
                for h in handles]
    assert together == alone
    assert max(r.width for _, r, _ in engine._steps) == 2  # both decoded in one step


def test_a_second_question_about_the_same_image_reuses_its_cells(engine: Engine,
                                                                tiny_target: Path,
                                                                tiny_mmproj: Path) -> None:
    vision(engine, tiny_target, tiny_mmproj, n_parallel=2)
    _, events = ask(engine, [question()])
    reply = "".join(e.text for e in events if isinstance(e, TokenEvent))
    steps_before = len(engine._steps)
    _, events = ask(engine, [question(), ChatMessage("assistant", reply),
                             ChatMessage("user", "And what colour is it?")])
    usage = done(events).usage
    assert usage.cached_tokens >= N_IMAGE
    prefilled = sum(r.prefilled for _, r, _ in list(engine._steps)[steps_before:])
    assert prefilled == usage.prompt_tokens - usage.cached_tokens  # the image was not re-read
    # Another image at the same place shares only the text before it.
    _, events = ask(engine, [question(OTHER)])
    assert done(events).usage.cached_tokens < 30
    # The ledger's positions are llama.cpp's: an image's cells are where it says.
    loaded = engine._loaded
    assert loaded is not None
    for slot, held in enumerate(loaded.scheduler.kv.tokens):
        assert loaded.ctx.seq_pos_max(slot) == len(held) - 1


def test_a_conversation_with_an_image_resumes_from_its_saved_cells(tmp_path: Path,
                                                                    tiny_target: Path,
                                                                    tiny_mmproj: Path) -> None:
    follow = [question(), ChatMessage("assistant", "a picture"),
              ChatMessage("user", "And what colour is it?")]
    cold_engine = Engine()
    cold_engine.start()
    try:
        vision(cold_engine, tiny_target, tiny_mmproj)
        cold = ask(cold_engine, follow)[0]
    finally:
        cold_engine.stop()
    opts = KvStoreOptions(tmp_path / "kv", min_tokens=8)
    for turn in range(2):
        engine = Engine(saved_kv=opts)
        engine.start()
        try:
            vision(engine, tiny_target, tiny_mmproj)
            if turn == 0:
                ask(engine, [question()])
            else:
                tokens, events = ask(engine, follow)
        finally:
            engine.stop()  # unloading saves the finished conversation
    assert tokens == cold
    assert done(events).usage.resumed_tokens >= N_IMAGE


def test_images_in_a_tiny_context_survive_preemption(engine: Engine, tiny_target: Path,
                                                     tiny_mmproj: Path) -> None:
    sampling = dataclasses.replace(GREEDY, max_tokens=40)
    images = [tiny_png(seed=s) for s in range(10, 14)]
    vision(engine, tiny_target, tiny_mmproj)
    alone = [ask(engine, [question(image)], sampling)[0] for image in images]
    vision(engine, tiny_target, tiny_mmproj, n_ctx=256, n_parallel=4, n_batch=64, n_ubatch=64)
    handles = [engine.submit(GenerationRequest(messages=(question(image),), sampling=sampling))
               for image in images]
    together = [[e.token_id for e in h.events(timeout=120) if isinstance(e, TokenEvent)]
                for h in handles]
    assert engine._loaded.scheduler.n_preemptions > 0  # type: ignore[union-attr]
    assert together == alone


def test_drafting_is_off_for_a_request_with_images_and_says_so(tiny_target: Path,
                                                              tiny_mmproj: Path) -> None:
    from runtime.engine.build import build_engine

    engine = build_engine()
    engine.start()
    try:
        info = engine.load(tiny_settings(tiny_target, mmproj_path=tiny_mmproj, gpu_layers=0,
                                         draft=DraftSettings(kind="ngram", k=4, ngram_min=1)))
        assert any("drafting is off for prompts with images" in n for n in info.notes)
        _, events = ask(engine, [question()])
        stats = [e for e in events if isinstance(e, StepStats)]
        assert stats and stats[0].drafting_off_reason == DRAFTING_OFF
        assert all(e.drafted == 0 for e in stats) and done(events).speculative is None
        long = dataclasses.replace(GREEDY, max_tokens=48)  # its replies repeat: lookups hit
        _, events = ask(engine, [question()], long)
        assert done(events).speculative is None
        _, events = ask(engine, [ChatMessage("user", "What is in this picture?")], long)
        assert done(events).speculative is not None  # text-only requests still draft
    finally:
        engine.stop()


# ---- errors ----------------------------------------------------------------------------------


def test_a_model_without_a_projector_refuses_images(engine: Engine, tiny_target: Path) -> None:
    engine.load(tiny_settings(tiny_target))
    _, events = ask(engine, [question()])
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert events[0].kind == "ImageError"
    assert "cannot read images: load a vision model" in events[0].message
    assert "\n" not in events[0].message
    assert ask(engine, [ChatMessage("user", "still here?")])[0]  # the engine keeps serving


def test_an_image_mtmd_cannot_decode_is_an_image_error(engine: Engine, tiny_target: Path,
                                                       tiny_mmproj: Path) -> None:
    vision(engine, tiny_target, tiny_mmproj)
    _, events = ask(engine, [question(b"this is text in a file called photo.png")])
    assert isinstance(events[-1], ErrorEvent) and events[-1].kind == "ImageError"
    assert ask(engine, [question()])[0]


def test_bad_projectors_are_one_line_typed_errors(engine: Engine, tiny_target: Path,
                                                  tiny_mmproj: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut-mmproj.gguf"
    cut.write_bytes(tiny_mmproj.read_bytes()[:200_000])
    wrong_width = tiny_mmproj_path(MISMATCHED_PROJECTOR)
    language_model = tmp_path / "mmproj-but-a-model.gguf"
    language_model.write_bytes(tiny_target.read_bytes())
    cases: list[tuple[Path, type[Exception], str]] = [
        (cut, TruncatedModel, "cut short"),
        (language_model, ModelFileError, "is a 'llama' model, not a vision projector"),
        (wrong_width, LoadError, "n_embd"),
    ]
    for path, kind, words in cases:
        settings = dataclasses.replace(tiny_settings(tiny_target), mmproj_path=path)
        with pytest.raises(kind) as caught:
            engine.load(settings)
        assert words in str(caught.value) and "\n" not in str(caught.value), caught.value
    assert "vision" in vision(engine, tiny_target, tiny_mmproj).capabilities


def test_the_placeholders_are_negative_int32_keyed_by_image_and_projector() -> None:
    ids = placeholders("projector-a", "image-1", N_IMAGE)
    assert all(-(2**31) < t < 0 for t in ids) and ids == placeholders("projector-a", "image-1", N_IMAGE)
    assert placeholders("projector-a", "image-2", 1) != ids[:1]
    assert placeholders("projector-b", "image-1", 1) != ids[:1]


def test_load_settings_keep_the_projector() -> None:
    settings = LoadSettings(model_path=Path("m.gguf"), mmproj_path=Path("mmproj-m.gguf"))
    data = settings.to_dict()
    assert data["mmproj_path"] == "mmproj-m.gguf"
    assert LoadSettings.from_dict(data) == settings
    assert LoadSettings.from_dict({"model_path": "m.gguf"}).mmproj_path is None


# ---- the CLI -----------------------------------------------------------------------------------


def test_outrider_run_answers_with_an_image(tiny_target: Path, tiny_mmproj: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    photo = tmp_path / "photo.png"
    photo.write_bytes(PHOTO)
    code = main(["run", str(tiny_target), "--mmproj", str(tiny_mmproj), "--image", str(photo),
                 "-p", "What is in this picture?", "--temp", "0", "--max-tokens", "6",
                 "--ctx", "512", "--threads", "1", "--gpu-layers", "0"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip()
    prompt = int(err.split("prompt ")[1].split(" tokens")[0])
    assert prompt > N_IMAGE
    bad = tmp_path / "photo.jpg"
    bad.write_text("not a picture")
    code = main(["run", str(tiny_target), "--mmproj", str(tiny_mmproj), "--image", str(bad),
                 "-p", "x"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: photo.jpg: not an image") and err.count("\n") == 1


def test_outrider_chat_attaches_an_image_and_later_turns_reuse_it(
        tiny_target: Path, tiny_mmproj: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    photo = tmp_path / "photo.png"
    photo.write_bytes(PHOTO)
    lines = f"/image {tmp_path / 'missing.png'}\n/image {photo}\nwhat is it?\nand now?\n/exit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    code = main(["chat", str(tiny_target), "--mmproj", str(tiny_mmproj), "--temp", "0",
                 "--max-tokens", "4", "--ctx", "512", "--threads", "1", "--gpu-layers", "0"])
    _, err = capsys.readouterr()
    assert code == 0
    assert "error: cannot read the image" in err and "(image attached" in err
    stats = [line for line in err.splitlines() if line.startswith("TTFT")]
    assert len(stats) == 2
    assert int(stats[1].split(", ")[-1].split(" cached")[0]) >= N_IMAGE


# ---- the planner -------------------------------------------------------------------------------


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_the_planner_counts_the_projector_as_clip_reports_it(engine: Engine, tiny_target: Path,
                                                            tiny_mmproj: Path,
                                                            flash_attn: str) -> None:
    info = vision(engine, tiny_target, tiny_mmproj, flash_attn=flash_attn)
    measured = {k: v for k, v in info.allocated.items() if k.startswith("mmproj.")}
    projector = read_projector_info(tiny_mmproj)
    assert projector.projector_type == "gemma3" and projector.image_tokens == info.image_tokens
    compute = projector_compute_bytes(projector, flash_attn=flash_attn == "on")
    assert abs(compute - measured["mmproj.CPU compute"]) <= 0.05 * measured["mmproj.CPU compute"]
    # clip logs its weights in MiB with two decimals: ±5 KiB
    assert abs(projector.tensor_bytes - measured["mmproj.CPU model"]) <= 5243

    cpu = Device("cpu", "CPU", "cpu", free_bytes=64 << 30, total_bytes=64 << 30)
    settings = tiny_settings(tiny_target, flash_attn=flash_attn, mmproj_path=tiny_mmproj)
    model = read_model_info(tiny_target)
    with_it = plan_memory(model, settings, [cpu], projector=projector)
    without = plan_memory(model, settings, [cpu])
    assert with_it.devices[-1].projector == projector.tensor_bytes + compute
    assert with_it.total - without.total == projector.tensor_bytes + compute
    assert with_it.image_tokens == N_IMAGE
    assert "each image takes 64 tokens of the context (8 fit in 512)" in with_it.notes


def test_the_planner_reads_the_projector_of_the_settings(tiny_target: Path,
                                                         tiny_mmproj: Path) -> None:
    from runtime.planner.gpu_layers import plan_load

    cpu = Device("cpu", "CPU", "cpu", free_bytes=64 << 30, total_bytes=64 << 30)
    plan = plan_load(tiny_settings(tiny_target, mmproj_path=tiny_mmproj), [cpu])
    assert plan is not None and plan.image_tokens == N_IMAGE and plan.devices[-1].projector


def test_clip_buffer_lines_are_read_apart_from_the_models() -> None:
    log = ("clip_ctx: CLIP using CUDA0 backend\nload_hparams: model size:         812.50 MiB\n"
           "reserve_compute_meta:      CUDA0 compute buffer size =   121.25 MiB\n"
           "reserve_compute_meta:  CUDA_Host compute buffer size =     9.20 MiB\n")
    sizes = parse_projector_buffers(log)
    assert sizes == {"mmproj.CUDA0 model": 851968000, "mmproj.CUDA0 compute": 127139840,
                     "mmproj.CUDA_Host compute": 9646899}
    assert buffer_totals(sizes) == {"weights": 851968000, "kv": 0,
                                    "compute": 127139840 + 9646899}


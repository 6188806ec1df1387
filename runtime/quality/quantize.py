"""Make a GGUF of another quant level from a higher-precision one, with mixed-precision recipes.

A `QuantRecipe` says what to make; `plan_quantization` turns it (and the source's tensor
names) into the exact fields of llama.cpp's `llama_model_quantize_params` — pure, tested by
asserting what it returns; `quantize` runs llama.cpp's `llama_model_quantize` in a worker
process, so a cancel is a kill and an abort inside llama.cpp cannot take the caller with it.

    recipe = QuantRecipe("Q4_K_M", embeddings="Q8_0", output="Q8_0",
                         edge_layers=(2, "Q6_K"), overrides=(("attn_v", "Q6_K"),))
    recipe_to_tensor_types(recipe, names_of_a_30_block_model)
    # {'attn_v': 'Q6_K', '^blk\\.(0|1|28|29)\\.': 'Q6_K'}   first match wins, as in llama.cpp
    quantize(Path("m.F16.gguf"), Path("m.Q4_K_M.gguf"), recipe, on_progress=print)

The output is written under a temporary name in the destination folder and renamed into
place only when llama.cpp reports success (`runtime.atomic_file`); a cancelled or failed run
leaves nothing behind, and the result has the user's normal file mode (0o666 & ~umask).
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import gguf

from runtime import errors
from runtime.atomic_file import atomic_output
from runtime.errors import (
    CorruptModel,
    ImatrixError,
    ModelNotFound,
    NotAGGUF,
    QuantizeCancelled,
    QuantizeError,
    RequantizeRefused,
)
from runtime.gguf.constants import FILE_TYPES, GGML_TYPE_IDS, GGML_TYPES, type_block

# Quant level name (as `llama-quantize` spells it) -> llama_ftype. Aliases as in
# tools/quantize/quantize.cpp (Q4_K means Q4_K_M ...).
FTYPES: dict[str, int] = {name: ftype for ftype, name in FILE_TYPES.items()}
FTYPES.update({"Q3_K": FTYPES["Q3_K_M"], "Q4_K": FTYPES["Q4_K_M"], "Q5_K": FTYPES["Q5_K_M"]})

# Tensor storage types a user may ask for (no integer, Q8_1/Q8_K scratch or F64 types).
_NOT_STORAGE = {"Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"}
STORAGE_TYPE_IDS: dict[str, int] = {
    name: tid for name, tid in GGML_TYPE_IDS.items() if name not in _NOT_STORAGE
}
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _canon_type(name: str, what: str) -> str:
    canon = name.strip().upper()
    if canon not in STORAGE_TYPE_IDS:
        raise QuantizeError(f"{what} type {name!r} is not a ggml tensor type (e.g. Q8_0, Q6_K, F16)")
    return canon


def _canon_ftype(name: str) -> str:
    canon = name.strip().upper()
    if canon not in FTYPES:
        raise QuantizeError(f"{name!r} is not a quant level llama.cpp can make (e.g. Q4_K_M, Q8_0)")
    return canon


@dataclass(frozen=True)
class QuantRecipe:
    """What to make. Names are case-insensitive and stored upper-case.

    ftype: the quant level (llama.cpp's mixture: Q4_K_M keeps some attn_v/ffn_down at Q6_K).
    embeddings / output: the token-embedding and output tensors' type (None = the mixture's).
    edge_layers: (n, type) — the first and the last n blocks at `type`.
    overrides: (regex, type) pairs searched in each tensor name, first match wins.
    imatrix: an importance-matrix file (GGUF from llama-imatrix, or the legacy .dat).
    """

    ftype: str = "Q4_K_M"
    embeddings: str | None = None
    output: str | None = None
    edge_layers: tuple[int, str] | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    imatrix: Path | None = None
    allow_requantize: bool = False
    n_threads: int = 0  # 0 = all hardware threads

    def __post_init__(self) -> None:
        object.__setattr__(self, "ftype", _canon_ftype(self.ftype))
        if self.embeddings is not None:
            object.__setattr__(self, "embeddings", _canon_type(self.embeddings, "embeddings"))
        if self.output is not None:
            object.__setattr__(self, "output", _canon_type(self.output, "output"))
        if self.edge_layers is not None:
            n, kind = self.edge_layers
            if n < 1:
                raise QuantizeError(f"edge layers must be 1 or more, not {n}")
            object.__setattr__(self, "edge_layers", (int(n), _canon_type(kind, "edge layer")))
        canon: list[tuple[str, str]] = []
        for pattern, kind in self.overrides:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise QuantizeError(f"override pattern {pattern!r} is not a regex: {exc}") from exc
            canon.append((pattern, _canon_type(kind, f"override {pattern!r}")))
        object.__setattr__(self, "overrides", tuple(canon))
        if self.n_threads < 0:
            raise QuantizeError(f"threads must be 0 (all) or more, not {self.n_threads}")
        if self.ftype in FLOAT_TYPES and (self.overrides or self.edge_layers):
            # llama.cpp consults per-tensor types only when the default type is quantized.
            raise QuantizeError(f"per-tensor types need a quantized --type; {self.ftype} "
                                "keeps every weight at that type")

    @property
    def mixed(self) -> bool:
        return bool(self.embeddings or self.output or self.edge_layers or self.overrides)


def parse_override(text: str) -> tuple[str, str]:
    """'attn_v=Q6_K' -> ('attn_v', 'Q6_K'), as llama-quantize's --tensor-type reads it.

    >>> parse_override(r"blk\\.1[0-5]\\.ffn_down=q8_0")
    ('blk\\\\.1[0-5]\\\\.ffn_down', 'Q8_0')
    """
    pattern, sep, kind = text.rpartition("=")
    if not sep or not pattern or not kind:
        raise QuantizeError(f"override {text!r} should read PATTERN=TYPE, e.g. attn_v=Q6_K")
    return pattern, _canon_type(kind, f"override {pattern!r}")


def parse_edge_layers(text: str) -> tuple[int, str]:
    """'2:Q6_K' -> (2, 'Q6_K')."""
    count, sep, kind = text.partition(":")
    if not sep or not count.strip().isdigit():
        raise QuantizeError(f"edge layers {text!r} should read N:TYPE, e.g. 2:Q6_K")
    return int(count), _canon_type(kind, "edge layer")


def block_count(tensor_names: Iterable[str]) -> int:
    """1 + the highest `blk.N.` index among the names (0 when there are no blocks)."""
    indices = [int(m.group(1)) for name in tensor_names if (m := _BLOCK.match(name))]
    return max(indices) + 1 if indices else 0


def recipe_to_tensor_types(recipe: QuantRecipe, tensor_names: Iterable[str]) -> dict[str, str]:
    """The per-tensor type patterns (`tt_overrides`), in the order llama.cpp tries them.

    The user's own overrides come first (the most specific wish wins), then one pattern for
    the edge blocks. Embeddings and output are not patterns: they travel in their own fields
    (`token_embedding_type`, `output_tensor_type`), which llama.cpp checks before any pattern.

    >>> names = [f"blk.{i}.attn_v.weight" for i in range(30)]
    >>> recipe_to_tensor_types(QuantRecipe("Q4_K_M", edge_layers=(2, "Q6_K")), names)
    {'^blk\\\\.(0|1|28|29)\\\\.': 'Q6_K'}
    """
    types = dict(recipe.overrides)
    if recipe.edge_layers is not None:
        n, kind = recipe.edge_layers
        n_layer = block_count(tensor_names)
        if n_layer == 0:
            raise QuantizeError("edge layers asked for, but the model has no blk.N tensors")
        blocks = sorted(set(range(min(n, n_layer))) | set(range(max(0, n_layer - n), n_layer)))
        types.setdefault(r"^blk\.(" + "|".join(map(str, blocks)) + r")\.", kind)
    return types


@dataclass(frozen=True)
class QuantPlan:
    """The fields of `llama_model_quantize_params`, decided (ids, not names)."""

    ftype: int
    token_embedding_type: int | None
    output_tensor_type: int | None
    tensor_types: tuple[tuple[str, int], ...]
    allow_requantize: bool
    n_threads: int
    imatrix: Path | None


def plan_quantization(recipe: QuantRecipe, tensor_names: Iterable[str]) -> QuantPlan:
    """Pure: the recipe as llama.cpp parameters for a model with these tensors."""
    patterns = recipe_to_tensor_types(recipe, tensor_names)
    return QuantPlan(
        ftype=FTYPES[recipe.ftype],
        token_embedding_type=STORAGE_TYPE_IDS[recipe.embeddings] if recipe.embeddings else None,
        output_tensor_type=STORAGE_TYPE_IDS[recipe.output] if recipe.output else None,
        tensor_types=tuple((p, STORAGE_TYPE_IDS[t]) for p, t in patterns.items()),
        allow_requantize=recipe.allow_requantize,
        n_threads=recipe.n_threads,
        imatrix=recipe.imatrix,
    )


def read_tensor_types(path: Path) -> dict[str, str]:
    """Tensor name -> type name of a GGUF file (header only, through the `gguf` package)."""
    return {name: kind for name, (kind, _) in read_tensors(path).items()}


def read_tensors(path: Path) -> dict[str, tuple[str, int]]:
    """Tensor name -> (type name, row length ne[0]) of a GGUF file."""
    if not path.is_file():
        raise ModelNotFound(f"No model file at {path}")
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except ValueError as exc:
        raise NotAGGUF(f"{path.name} is not a GGUF model: {exc}") from exc
    except Exception as exc:  # gguf raises bare errors on damaged headers
        raise CorruptModel(f"{path.name} has a damaged GGUF header: {exc}") from exc
    return {t.name: (GGML_TYPES.get(int(t.tensor_type), (str(t.tensor_type), 0, 0))[0],
                     int(t.shape[0]))
            for t in reader.tensors}


def check_row_sizes(recipe: QuantRecipe, rows: Mapping[str, int]) -> None:
    """Refuse embeddings/output types whose block does not divide the tensor's rows.

    llama.cpp applies these two types as given (no fallback, unlike the mixture and the
    patterns), and a 256-value k-quant block cannot hold a 576-wide row (SmolLM2-135M).

    >>> check_row_sizes(QuantRecipe("Q4_0", embeddings="Q4_K"), {"token_embd.weight": 576})
    Traceback (most recent call last):
    runtime.errors.QuantizeError: embeddings type Q4_K packs 256 values per block; ...
    """
    wanted = (("embeddings", recipe.embeddings, ("token_embd.weight", "per_layer_token_embd.weight")),
              ("output", recipe.output, ("output.weight",)))
    for what, kind, names in wanted:
        if kind is None:
            continue
        block, _ = type_block(kind)
        for name in names:
            if name in rows and rows[name] % block:
                raise QuantizeError(
                    f"{what} type {kind} packs {block} values per block; {name} has rows of "
                    f"{rows[name]} — choose a 32-block type such as Q8_0, Q5_0 or Q4_0, or F16")


def quantized_weights(types: Mapping[str, str]) -> dict[str, str]:
    """The tensors already stored in a quantized type (what a requantize would degrade)."""
    return {name: t for name, t in types.items() if t not in FLOAT_TYPES}


@dataclass(frozen=True)
class QuantProgress:
    """One tensor done: `done` of `total`, the tensor's name."""

    done: int
    total: int
    tensor: str

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


class RequantizeWarning(UserWarning):
    """Quality is lost twice: the source was itself quantized."""


def quantize(
    src: Path,
    dst: Path,
    recipe: QuantRecipe,
    on_progress: Callable[[QuantProgress], None] | None = None,
    cancel_event: threading.Event | None = None,
) -> Path:
    """Make `dst` from `src` as `recipe` says, in a worker process, and return `dst`.

    Raises `RequantizeRefused` before starting when `src` is already quantized and the recipe
    does not allow it (with allow_requantize it warns, `RequantizeWarning`); `QuantizeCancelled`
    when `cancel_event` is set before the result is in place; `QuantizeError` (or
    `ImatrixError`) with llama.cpp's reason when it fails. Never leaves a partial file.
    """
    src, dst = Path(src), Path(dst)
    tensors = read_tensors(src)
    types = {name: kind for name, (kind, _) in tensors.items()}
    check_row_sizes(recipe, {name: ne0 for name, (_, ne0) in tensors.items()})
    already = quantized_weights(types)
    if already:
        kinds = ", ".join(sorted(set(already.values())))
        if not recipe.allow_requantize:
            raise RequantizeRefused(
                f"{src.name} is already quantized ({kinds}); quantizing it again loses quality "
                "twice — start from an F16/BF16/F32 file, or pass --allow-requantize")
        warnings.warn(f"{src.name} is already quantized ({kinds}): the result carries the "
                      "losses of both quantizations", RequantizeWarning, stacklevel=2)
    if dst.exists():
        raise QuantizeError(f"{dst} already exists; choose another output name")
    if recipe.imatrix is not None and not Path(recipe.imatrix).is_file():
        raise ImatrixError(f"No importance matrix file at {recipe.imatrix}")
    plan = plan_quantization(recipe, types)

    # llama.cpp rewrites the placeholder in place (std::ofstream truncates, keeping its mode),
    # so the result gets the user's normal file mode, not a temporary file's 0o600.
    with atomic_output(dst, prefix=".partial-", suffix=".gguf") as tmp:
        _run_worker(src, tmp, plan, on_progress, cancel_event)
        if cancel_event is not None and cancel_event.is_set():
            raise QuantizeCancelled("Quantization cancelled; nothing was written")
    return dst


@dataclass
class _Outcome:
    rc: int | None = None
    errors: list[str] = field(default_factory=list)
    raised: tuple[str, str] | None = None  # (error class name, message) from the worker


# The worker's protocol (runtime.quality.worker): the job as JSON on its stdin, messages as
# marked JSON lines on its stdout. Kept here so this module never imports the worker, which
# reaches llama_cpp through runtime.llama (the app may import this module; it must never
# reach llama_cpp).
MARKER = "@@outrider "


def plan_to_json(src: Path, dst: Path, plan: QuantPlan) -> str:
    return json.dumps({
        "src": str(src), "dst": str(dst), "ftype": plan.ftype,
        "token_embedding_type": plan.token_embedding_type,
        "output_tensor_type": plan.output_tensor_type,
        "tensor_types": [list(t) for t in plan.tensor_types],
        "allow_requantize": plan.allow_requantize, "n_threads": plan.n_threads,
        "imatrix": str(Path(plan.imatrix).resolve()) if plan.imatrix is not None else None,
    })


def plan_from_json(text: str) -> tuple[str, str, QuantPlan]:
    job = json.loads(text)
    plan = QuantPlan(
        ftype=int(job["ftype"]), token_embedding_type=job["token_embedding_type"],
        output_tensor_type=job["output_tensor_type"],
        tensor_types=tuple((str(p), int(t)) for p, t in job["tensor_types"]),
        allow_requantize=bool(job["allow_requantize"]), n_threads=int(job["n_threads"]),
        imatrix=Path(job["imatrix"]) if job["imatrix"] else None,
    )
    return job["src"], job["dst"], plan


def worker_command() -> list[str]:
    """How to start the worker: this Python, or the frozen app with its worker flag."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--quantize-worker"]
    return [sys.executable, "-m", "runtime.quality.worker"]


def _run_worker(src: Path, tmp: Path, plan: QuantPlan,
                on_progress: Callable[[QuantProgress], None] | None,
                cancel_event: threading.Event | None) -> None:
    # The worker must import this very `runtime`, installed or not.
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, env=env)
    if proc.stdin is None or proc.stdout is None:  # never: both are PIPE (narrows the type)
        raise QuantizeError("could not talk to the quantize worker")
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    outcome = _Outcome()
    try:
        proc.stdin.write(plan_to_json(src.resolve(), tmp.resolve(), plan))
        proc.stdin.close()
        while outcome.rc is None:
            if cancel_event is not None and cancel_event.is_set():
                break
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:  # the worker's stdout closed: it ended or died
                break
            if line.startswith(MARKER):
                _handle(json.loads(line[len(MARKER):]), outcome, on_progress)
    except BrokenPipeError:
        pass  # the worker died at start; its exit code tells the rest
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        proc.stdout.close()
    if cancel_event is not None and cancel_event.is_set():
        raise QuantizeCancelled("Quantization cancelled; nothing was written")
    if outcome.rc != 0:
        _raise_failure(outcome, proc.returncode)


def _read_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _handle(msg: list[Any], outcome: _Outcome,
            on_progress: Callable[[QuantProgress], None] | None) -> None:
    kind = msg[0]
    if kind == "progress" and on_progress is not None:
        on_progress(QuantProgress(int(msg[1]), int(msg[2]), str(msg[3])))
    elif kind == "error":
        outcome.errors.append(str(msg[1]))
    elif kind == "raise":
        outcome.raised = (str(msg[1]), str(msg[2]))
    elif kind == "done":
        outcome.rc = int(msg[1])


def _raise_failure(outcome: _Outcome, exitcode: int | None) -> None:
    if outcome.raised is not None:
        cls = getattr(errors, outcome.raised[0], QuantizeError)
        raise (cls if issubclass(cls, QuantizeError) else QuantizeError)(outcome.raised[1])
    reason = next((e for e in reversed(outcome.errors) if "failed to quantize" in e),
                  outcome.errors[-1] if outcome.errors else "")
    reason = reason.split("failed to quantize:", 1)[-1].strip()
    if outcome.rc is None:
        raise QuantizeError(f"The quantize worker died (exit code {exitcode}) {reason}".strip())
    if "imatrix" in reason or "importance matrix" in reason:
        raise ImatrixError(f"llama.cpp refused: {reason}")
    raise QuantizeError(f"llama.cpp could not quantize: {reason or 'no reason given'}")


def default_output_path(src: Path, ftype: str, mixed: bool = False) -> Path:
    """Beside the source, the quant name swapped: 'SmolLM2.Q4_1.gguf' -> 'SmolLM2.Q8_0.gguf'.

    A mixed-precision recipe adds '-mixed' so it never takes the plain level's name.
    """
    stem = src.name.removesuffix(".gguf")
    known = sorted(set(FTYPES) | set(STORAGE_TYPE_IDS), key=len, reverse=True)
    for name in known:
        for sep in (".", "-", "_"):
            if stem.upper().endswith(sep + name):
                stem = stem[: -len(name) - 1]
                break
        else:
            continue
        break
    return src.with_name(f"{stem}.{ftype}{'-mixed' if mixed else ''}.gguf")

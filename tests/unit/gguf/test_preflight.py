"""Preflight: every bad file is a typed error with a one-line message, never a crash.

Headers are crafted byte by byte (`RawGGUF`) so each test breaks exactly one thing.
"""

from __future__ import annotations

import contextlib
import re
import struct
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.errors import (
    CorruptModel,
    IncompleteSplit,
    ModelFileError,
    ModelNotFound,
    NotAGGUF,
    TruncatedModel,
    UnsupportedArchitecture,
)
from runtime.gguf.constants import GGML_TYPES
from runtime.gguf.header import HeaderBeyondFile, HeaderIncomplete, parse_header
from runtime.gguf.preflight import check_gguf, inspect_gguf

F32, Q8_0, STRING, UINT32, ARRAY = 0, 8, 8, 4, 9


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


@dataclass
class RawGGUF:
    """A minimal GGUF: metadata, tensor infos, aligned data. Fields can be set to lies."""

    arch: str | None = "llama"
    extra_kv: list[bytes] = field(default_factory=list)
    block_count: int = 1  # with `arch`, the least llama.cpp needs: layers, widths, a vocabulary
    tensors: list[tuple[str, tuple[int, ...], int]] = field(
        default_factory=lambda: [("token_embd.weight", (8, 4), F32), ("output.weight", (8, 4), F32)])
    version: int = 3
    n_kv: int | None = None  # None: the true count
    n_tensors: int | None = None
    offsets: list[int] | None = None  # None: back to back, 32-aligned
    magic: bytes = b"GGUF"

    def kv_entries(self) -> list[bytes]:
        out = []
        if self.arch is not None:
            out.append(s("general.architecture") + struct.pack("<I", STRING) + s(self.arch))
            for key, value in (("block_count", self.block_count), ("context_length", 64),
                               ("embedding_length", 8)):
                out.append(s(f"{self.arch}.{key}") + struct.pack("<II", UINT32, value))
            out.append(s("tokenizer.ggml.model") + struct.pack("<I", STRING) + s("gpt2"))
            out.append(s("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 4)
                       + b"".join(s(t) for t in "abcd"))  # as many as token_embd has rows
            out.append(s("tokenizer.ggml.merges") + struct.pack("<IIQ", ARRAY, STRING, 1) + s("a b"))
        return out[:1] + self.extra_kv + out[1:]  # a test's own lies come before the defaults

    def build(self) -> bytes:
        kv = self.kv_entries()
        sizes = [_nbytes(shape, t) for _, shape, t in self.tensors]
        offsets = self.offsets
        if offsets is None:
            offsets, pos = [], 0
            for n in sizes:
                offsets.append(pos)
                pos += -(-n // 32) * 32
        head = self.magic + struct.pack("<IQQ", self.version,
                                        len(self.tensors) if self.n_tensors is None else self.n_tensors,
                                        len(kv) if self.n_kv is None else self.n_kv)
        body = b"".join(kv)
        for (name, shape, ggml_type), offset in zip(self.tensors, offsets, strict=True):
            body += s(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}q", *shape)
            body += struct.pack("<IQ", ggml_type, offset)
        raw = head + body
        raw += b"\0" * (-len(raw) % 32)
        for n in sizes:
            raw += b"\x11" * n + b"\0" * (-n % 32)
        return raw

    def write(self, path: Path) -> Path:
        path.write_bytes(self.build())
        return path


def _nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    n = 1
    for d in shape:
        n *= d
    _, block, block_bytes = GGML_TYPES.get(ggml_type, ("?", 32, 34))  # unknown types: as Q8_0
    return n // block * block_bytes


def test_a_well_formed_crafted_file_passes(tmp_path: Path) -> None:
    check_gguf(RawGGUF().write(tmp_path / "ok.gguf"))


def test_the_tiny_models_pass(tiny_target: Path, tiny_draft: Path) -> None:
    check_gguf(tiny_target)
    header, parts = inspect_gguf(tiny_draft)
    assert parts == ((tiny_draft, header),)
    assert header.data_end == tiny_draft.stat().st_size


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="no model file at"):
        check_gguf(tmp_path / "nope.gguf")


def test_directory_instead_of_file_names_what_is_inside(tmp_path: Path) -> None:
    RawGGUF().write(tmp_path / "inside.gguf")
    with pytest.raises(ModelNotFound, match=r"is a folder, not a model file \(it holds inside.gguf\)"):
        check_gguf(tmp_path)


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty"),
    (b"GGU", "too short"),
    (b"<!DOCTYPE html><html>Not found</html>", "error page"),
    (b"PK\x03\x04" + b"\0" * 60, "zip archive"),
    (b"ggjt" + b"\0" * 60, "old GGML"),
    (b"\x7fELF" + b"\0" * 60, "not a GGUF model"),
])
def test_not_a_gguf(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(NotAGGUF, match=message):
        check_gguf(path)


@pytest.mark.parametrize(("version", "message"), [
    (1, "version 1"), (99, "version 99 is newer"), (3 << 24, "big-endian")])
def test_unsupported_versions(tmp_path: Path, version: int, message: str) -> None:
    with pytest.raises(NotAGGUF, match=message):
        check_gguf(RawGGUF(version=version).write(tmp_path / "v.gguf"))


def test_truncated_in_the_data_says_how_much_is_there(tiny_target: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    data = tiny_target.read_bytes()
    cut.write_bytes(data[: len(data) * 6 // 10])
    with pytest.raises(TruncatedModel) as caught:
        check_gguf(cut)
    message = str(caught.value)
    assert f"{len(data) * 6 // 10:,} of {len(data):,} bytes (59%)" in message
    assert "\n" not in message


def test_truncated_inside_the_header(tiny_target: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_target.read_bytes()[:3000])  # in the middle of the vocabulary
    with pytest.raises(TruncatedModel, match="ends inside its header"):
        check_gguf(cut)


def test_one_byte_short(tiny_draft: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_draft.read_bytes()[:-1])
    with pytest.raises(TruncatedModel):
        check_gguf(cut)


@pytest.mark.parametrize(("raw", "message"), [
    (RawGGUF(n_tensors=1 << 40), "claims 1,099,511,627,776 tensors"),
    (RawGGUF(n_kv=(1 << 63) - 1), "metadata keys"),
    (RawGGUF(n_tensors=-5 & ((1 << 64) - 1)), "tensors"),
    (RawGGUF(extra_kv=[s("general.name") + struct.pack("<I", STRING) + struct.pack("<Q", 1 << 60)]),
     "claims a length of"),
    (RawGGUF(extra_kv=[s("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 1 << 50)]),
     "claims 1,125,899,906,842,624 items"),
    (RawGGUF(extra_kv=[s("x") + struct.pack("<I", 77) + b"\0" * 8]), "unknown value type 77"),
    (RawGGUF(extra_kv=[s("x") + struct.pack("<IIQ", ARRAY, ARRAY, 1)]), "unsupported item type"),
    (RawGGUF(extra_kv=[s("general.alignment") + struct.pack("<II", UINT32, 48)]), "power of two"),
    (RawGGUF(offsets=[0, 1 << 40]), "starts at data offset 1,099,511,627,776, expected 128"),
    (RawGGUF(offsets=[0, 100]), "expected 128"),
    (RawGGUF(tensors=[("a.weight", (8,), 99)]), "unknown ggml type 99"),
    (RawGGUF(tensors=[("a.weight", (8, 4), Q8_0)]), "not a multiple of Q8_0's block of 32"),
    (RawGGUF(tensors=[("a.weight", (1, 1, 1, 1, 1), F32)]), "5 dimensions"),
    (RawGGUF(tensors=[("a", (4,), F32), ("a", (4,), F32)]), "appears twice"),
    (RawGGUF(tensors=[("n" * 64, (4,), F32)]), "longer than llama.cpp allows"),
    (RawGGUF(arch=None), "no general.architecture"),
])
def test_corrupt_headers(tmp_path: Path, raw: RawGGUF, message: str) -> None:
    with pytest.raises(CorruptModel, match=message) as caught:
        check_gguf(raw.write(tmp_path / "bad.gguf"))
    assert "\n" not in str(caught.value)


def test_tensor_data_beyond_the_end_is_truncation(tmp_path: Path) -> None:
    path = RawGGUF().write(tmp_path / "t.gguf")
    raw = path.read_bytes()
    # Claim a larger second tensor than the file holds: its data would run off the end.
    big = raw.replace(s("output.weight") + struct.pack("<I2q", 2, 8, 4),
                      s("output.weight") + struct.pack("<I2q", 2, 8, 4096))
    path.write_bytes(big)
    with pytest.raises(TruncatedModel, match="is cut short"):
        check_gguf(path)


def test_absurd_but_plausible_counts_allocate_nothing(tmp_path: Path) -> None:
    """A 200-byte file claiming 100 million vocabulary strings fails before any loop runs."""
    raw = RawGGUF(extra_kv=[s("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 10**8)])
    path = raw.write(tmp_path / "liar.gguf")
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError):
            check_gguf(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_unknown_architecture(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedArchitecture, match="'flux-lm' model, an architecture this build"):
        check_gguf(RawGGUF(arch="flux-lm").write(tmp_path / "f.gguf"))


def test_a_projector_file_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedArchitecture, match=r"multimodal projector \(mmproj\)"):
        check_gguf(RawGGUF(arch="clip").write(tmp_path / "mmproj.gguf"))


def split_kv(no: int, count: int, n_tensors: int) -> list[bytes]:
    return [s("split.no") + struct.pack("<IH", 2, no),  # UINT16
            s("split.count") + struct.pack("<IH", 2, count),
            s("split.tensors.count") + struct.pack("<Ii", 5, n_tensors)]


def write_split(folder: Path, count: int = 3, skip: tuple[int, ...] = ()) -> list[Path]:
    paths = []
    for i in range(count):
        raw = RawGGUF(arch="llama" if i == 0 else None, extra_kv=split_kv(i, count, 2 * count),
                      block_count=count,
                      tensors=[(f"blk.{i}.a.weight", (8, 4), F32), (f"blk.{i}.b.weight", (8, 4), F32)])
        path = folder / f"model-{i + 1:05d}-of-{count:05d}.gguf"
        if i not in skip:
            raw.write(path)
        paths.append(path)
    return paths


def test_complete_split_set_from_any_part(tmp_path: Path) -> None:
    paths = write_split(tmp_path)
    first, parts = inspect_gguf(paths[1])
    assert [p for p, _ in parts] == paths
    assert first.kv["general.architecture"] == "llama"


def test_incomplete_split_names_the_missing_parts(tmp_path: Path) -> None:
    paths = write_split(tmp_path, count=4, skip=(1, 3))
    with pytest.raises(IncompleteSplit, match=r"one of 4 parts; part\(s\) 2, 4 are missing"):
        check_gguf(paths[0])


def test_split_part_renamed_cannot_find_its_siblings(tmp_path: Path) -> None:
    paths = write_split(tmp_path)
    renamed = paths[0].rename(tmp_path / "model.gguf")
    with pytest.raises(IncompleteSplit, match="not named like one"):
        check_gguf(renamed)


def test_split_part_from_another_set(tmp_path: Path) -> None:
    paths = write_split(tmp_path)
    RawGGUF(arch=None, extra_kv=split_kv(2, 5, 6)).write(paths[2])  # claims 5 parts
    with pytest.raises(IncompleteSplit, match="does not belong"):
        check_gguf(paths[0])


def test_split_with_a_missing_tensor_count(tmp_path: Path) -> None:
    paths = write_split(tmp_path, count=2)
    RawGGUF(arch="llama", extra_kv=split_kv(0, 2, 99), block_count=2,
            tensors=[("blk.0.a.weight", (8, 4), F32)]).write(paths[0])
    with pytest.raises(IncompleteSplit, match="hold 3 tensors, the first part says 99"):
        check_gguf(paths[0])


def test_prefix_parsing_asks_for_more_bytes(tiny_target: Path) -> None:
    data = tiny_target.read_bytes()
    with pytest.raises(HeaderIncomplete) as caught:
        parse_header(data[:1000], total_size=len(data))
    assert 1000 < caught.value.needed < 8000
    header = parse_header(data[:8000], total_size=len(data))
    assert header.data_end == len(data)


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_corruption_is_always_a_typed_error(tiny_draft_header: bytes, data: st.DataObject) -> None:
    """Flip bytes anywhere in a real header: the parser answers or refuses, never crashes."""
    raw = bytearray(tiny_draft_header)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(NotAGGUF, CorruptModel, HeaderBeyondFile, HeaderIncomplete):
        parse_header(bytes(raw), total_size=len(raw) + 500_000)


@pytest.fixture(scope="module")
def tiny_draft_header(tiny_draft: Path) -> bytes:
    data = tiny_draft.read_bytes()
    return data[: parse_header(data).data_offset]


def test_generated_constants_match_the_vendored_llama_cpp() -> None:
    """runtime/gguf/constants.py is generated; regenerating from the sources changes nothing."""
    from runtime.gguf import constants as g

    source = Path("/tmp/deps/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")
    if not (source / "src" / "llama-arch.cpp").is_file():
        pytest.skip("the vendored llama.cpp sources are not on this machine")
    tables: dict[str, Any] = {}
    exec(g.generate(source), tables)
    assert set(tables["ARCHITECTURES"]) == g.ARCHITECTURES
    assert tables["GGML_TYPES"] == g.GGML_TYPES
    assert tables["FILE_TYPES"] == g.FILE_TYPES


def test_split_architecture_is_checked_from_the_first_part(tmp_path: Path) -> None:
    paths = write_split(tmp_path)
    RawGGUF(arch="flux-lm", extra_kv=split_kv(0, 3, 6), block_count=3,
            tensors=[("blk.0.a.weight", (8, 4), F32), ("blk.0.b.weight", (8, 4), F32)]).write(paths[0])
    with pytest.raises(UnsupportedArchitecture, match="flux-lm"):
        check_gguf(paths[2])


def u32(key: str, value: int) -> bytes:
    return s(key) + struct.pack("<II", UINT32, value)


def f32(key: str, value: float) -> bytes:
    return s(key) + struct.pack("<If", 6, value)  # FLOAT32


ATTENTION: list[tuple[str, tuple[int, ...], int]] = [
    ("token_embd.weight", (8, 4), F32), ("blk.0.attn_q.weight", (8, 8), F32),
    ("blk.0.attn_k.weight", (8, 8), F32)]


@pytest.mark.parametrize(("raw", "message"), [
    (RawGGUF(block_count=0), "llama.block_count 0; llama.cpp runs 1 to 512 layers"),
    (RawGGUF(block_count=513), "llama.block_count 513"),
    (RawGGUF(block_count=2, tensors=ATTENTION), "no tensors for layer blk.1"),
    (RawGGUF(extra_kv=[u32("llama.expert_count", 8)]), "llama.expert_used_count 0"),
    (RawGGUF(extra_kv=[u32("llama.expert_count", 4), u32("llama.expert_used_count", 2)]),
     "no expert tensors"),
    (RawGGUF(extra_kv=[f32("llama.attention.layer_norm_rms_epsilon", float("nan"))]),
     "layer_norm_rms_epsilon nan; it must be a finite positive number"),
    (RawGGUF(extra_kv=[f32("llama.rope.freq_base", 0.0)]), "llama.rope.freq_base 0.0"),
    (RawGGUF(tensors=ATTENTION, extra_kv=[u32("llama.attention.head_count", 2),
                                          u32("llama.attention.head_count_kv", 3)]),
     "head_count_kv 3 for layer blk.0, which does not divide"),
    (RawGGUF(extra_kv=[u32("general.alignment", 16)]), "general.alignment 16, below the 32"),
    (RawGGUF(tensors=[("token_embd.weight", (8, 4), F32), ("output_norm.weight", (8,), 1)]),
     "output_norm.weight as F16"),
    (RawGGUF(tensors=[("token_embd.weight", (8, 4), 26)]), "token_embd.weight as I32"),
    (RawGGUF(tensors=[("token_embd.weight", (8, 3), F32)]), "4 tokens in tokenizer.ggml.tokens"),
])
def test_what_llama_cpp_would_abort_on_is_refused(tmp_path: Path, raw: RawGGUF, message: str) -> None:
    """A few of tests/fixtures/gguf_mutations.py's cases, one rule each; the corpus has all."""
    with pytest.raises(CorruptModel, match=re.escape(message)) as caught:
        check_gguf(raw.write(tmp_path / "bad.gguf"))
    assert str(caught.value).startswith("bad.gguf ") and "\n" not in str(caught.value)


def test_a_file_much_larger_than_its_header_says_is_refused(tmp_path: Path) -> None:
    path = RawGGUF().write(tmp_path / "sparse.gguf")
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size + (1 << 40))  # a sparse 1 TiB tail: nothing is written
    with pytest.raises(CorruptModel, match=f"but its header accounts for only {size:,}"):
        check_gguf(path)


def test_a_small_tail_is_tolerated(tmp_path: Path) -> None:
    path = RawGGUF().write(tmp_path / "tail.gguf")
    with path.open("ab") as f:
        f.write(b"\0" * 4096)
    check_gguf(path)


def test_header_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(CorruptModel, match=r"^odd\.gguf: the header claims"):
        check_gguf(RawGGUF(n_tensors=1 << 40).write(tmp_path / "odd.gguf"))


def test_a_model_without_a_vocabulary_is_refused(tmp_path: Path) -> None:
    """llama.cpp loads tokenizer.ggml.model 'none', then aborts on the first tokenize."""
    raw = RawGGUF()
    raw.write(tmp_path / "novocab.gguf")
    data = (tmp_path / "novocab.gguf").read_bytes().replace(s("gpt2"), s("none"))
    (tmp_path / "novocab.gguf").write_bytes(data)
    with pytest.raises(CorruptModel, match="has no vocabulary"):
        check_gguf(tmp_path / "novocab.gguf")

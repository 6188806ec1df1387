"""ModelInfo from local files (the tiny fixtures, crafted headers, SmolLM2) and over HTTP
range requests from a local server, checking that only the header's bytes travel."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf
import numpy as np
import pytest

from runtime.errors import IncompleteSplit, ModelFileError, ModelNotFound, TruncatedModel
from runtime.gguf import remote as remote_gguf
from runtime.gguf.info import ModelInfo, read_model_info
from runtime.gguf.remote import read_remote_model_info
from tests.fixtures.tiny_gguf import ALIEN_DRAFT, DRAFT, TARGET, TinySpec, vocabulary


def expected_params(spec: TinySpec) -> int:
    n_vocab = len(vocabulary(spec)[0])
    kv = spec.n_head_kv * (spec.n_embd // spec.n_head)
    per_layer = 2 * spec.n_embd + 2 * spec.n_embd**2 + 2 * kv * spec.n_embd + 3 * spec.n_ff * spec.n_embd
    return 2 * n_vocab * spec.n_embd + spec.n_layer * per_layer + spec.n_embd


def test_tiny_target_facts(tiny_target: Path) -> None:
    info = read_model_info(tiny_target)
    tokens, _ = vocabulary(TARGET)
    assert (info.architecture, info.name, info.block_count, info.n_embd) == ("llama", "tiny-target", 4, 128)
    assert (info.n_head, info.n_head_kv, info.key_length, info.value_length) == (4, (2, 2, 2, 2), 32, 32)
    assert (info.n_ff, info.n_ctx_train, info.n_vocab, info.n_tokens) == (256, 2048, len(tokens), len(tokens))
    assert (info.tokenizer_model, info.tokenizer_pre) == ("gpt2", "default")
    assert (info.bos_id, info.eos_id, info.add_bos, info.add_eos) == (0, 2, False, None)
    assert info.chat_template is not None and "<|im_start|>" in info.chat_template
    assert (info.file_type, info.quant, info.bits_per_weight) == (0, "F32", 32.0)
    assert info.n_params == expected_params(TARGET)
    assert info.kv_lora_rank is None and info.sliding_window is None
    assert info.swa_layers == (False,) * 4
    assert not info.tied_embeddings
    # Bytes: every tensor is f32 and 32-byte aligned, so layer bytes are 4 × parameters.
    assert info.tensor_bytes == sum(info.tensor_bytes_by_layer) + info.input_bytes + info.output_bytes
    assert info.tensor_bytes == tiny_target.stat().st_size - info.header_bytes
    assert info.input_bytes == 4 * len(tokens) * 128
    assert info.output_bytes == 4 * (len(tokens) * 128 + 128)
    assert dict(info.bytes_by_type) == {"F32": 4 * info.n_params}
    assert (info.split_index, info.split_count, info.split_paths) == (0, 1, (str(tiny_target),))
    assert info.file_size == tiny_target.stat().st_size


def test_vocabulary_is_read_on_demand(tiny_target: Path) -> None:
    info = read_model_info(tiny_target)
    tokens, types = vocabulary(TARGET)
    assert info.token_texts() == tuple(tokens)
    assert info.token_types() == tuple(types)
    assert "ġthe" not in json.dumps(info.to_dict()).lower()  # the list itself never travels


def test_vocab_fingerprint_tells_shared_vocabularies_apart(
        tiny_target: Path, tiny_draft: Path, alien_draft: Path) -> None:
    target, draft, alien = (read_model_info(p) for p in (tiny_target, tiny_draft, alien_draft))
    assert target.vocab_fingerprint == draft.vocab_fingerprint
    assert alien.vocab_fingerprint != target.vocab_fingerprint
    assert len(target.vocab_fingerprint) == 16
    assert alien.n_tokens == target.n_tokens + len(ALIEN_DRAFT.extra_tokens)
    assert draft.block_count == DRAFT.n_layer


def test_to_dict_is_json_and_round_trips(tiny_draft: Path) -> None:
    info = read_model_info(tiny_draft)
    data = json.loads(json.dumps(info.to_dict()))
    assert data["quant"] == "F32" and data["bytes_by_type"] == {"F32": data["n_params"] * 4}
    assert "tokens_span" not in data
    assert ModelInfo.from_dict(data) == info  # spans are not compared
    assert ModelInfo.from_dict(data).token_texts() == ()


def add_small_vocabulary(w: gguf.GGUFWriter) -> None:
    """The least tokenizer preflight accepts: a BPE model, two tokens, one merge."""
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_token_merges(["a b"])


def write_header_model(path: Path, arch: str, *, block_count: int = 12, file_type: int | None = None,
                       dtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F16,
                       extra: dict[str, object] | None = None, tensors: int | None = None) -> Path:
    """A small GGUF of any architecture: just enough metadata and a few 2-D tensors."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(block_count)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_context_length(4096)
    add_small_vocabulary(w)
    if file_type is not None:
        w.add_file_type(file_type)
    for key, value in (extra or {}).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
    rng = np.random.default_rng(0)
    for i in range(block_count if tensors is None else tensors):
        data = rng.standard_normal((64, 64)).astype(np.float32)
        if dtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(f"blk.{i}.attn_q.weight", data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, dtype)
            w.add_tensor(f"blk.{i}.attn_q.weight", q, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(("dtype", "quant"), [(gguf.GGMLQuantizationType.F16, "F16"),
                                              (gguf.GGMLQuantizationType.Q8_0, "Q8_0")])
def test_quant_from_tensor_types_when_file_type_is_missing(
        tmp_path: Path, dtype: gguf.GGMLQuantizationType, quant: str) -> None:
    info = read_model_info(write_header_model(tmp_path / "m.gguf", "llama", dtype=dtype))
    assert (info.file_type, info.quant) == (-1, quant)
    assert info.bits_per_weight == pytest.approx(16.0 if quant == "F16" else 8.5)


def test_file_type_names_the_quant(tmp_path: Path) -> None:
    info = read_model_info(write_header_model(tmp_path / "m.gguf", "llama", file_type=15))
    assert info.quant == "Q4_K_M"


def test_gemma3_sliding_window_pattern(tmp_path: Path) -> None:
    info = read_model_info(write_header_model(
        tmp_path / "g.gguf", "gemma3", extra={"gemma3.attention.sliding_window": 1024}))
    assert info.sliding_window == 1024
    # llama.cpp's gemma3 default: five sliding-window layers, then one global.
    assert info.swa_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,)


def test_explicit_pattern_and_per_layer_kv_heads(tmp_path: Path) -> None:
    pattern = [True, False, True, True]
    info = read_model_info(write_header_model(tmp_path / "g.gguf", "gemma2", block_count=4, extra={
        "gemma2.attention.sliding_window_pattern": pattern,
        "gemma2.attention.head_count_kv": [1, 2, 0, 4]}))
    assert info.sliding_window == 4096  # gemma2's built-in window
    assert info.swa_layers == tuple(pattern)
    assert info.n_head_kv == (1, 2, 0, 4)


def test_a_sliding_window_key_on_a_non_swa_architecture_is_ignored(tmp_path: Path) -> None:
    info = read_model_info(write_header_model(
        tmp_path / "m.gguf", "qwen2", extra={"qwen2.attention.sliding_window": 4096}))
    assert info.sliding_window is None and not any(info.swa_layers)


def test_split_model_totals_all_parts(tmp_path: Path) -> None:
    single = read_model_info(write_header_model(tmp_path / "whole.gguf", "llama", block_count=6))
    paths = write_split(tmp_path, n_parts=3, block_count=6)
    info = read_model_info(paths[2])
    assert (info.split_index, info.split_count) == (2, 3)
    assert info.split_paths == tuple(map(str, paths))
    assert info.path_or_url == str(paths[0])
    assert info.tensor_bytes == single.tensor_bytes
    assert info.tensor_bytes_by_layer == single.tensor_bytes_by_layer
    assert info.n_params == single.n_params
    paths[1].unlink()
    with pytest.raises(IncompleteSplit):
        read_model_info(paths[0])


def write_split(folder: Path, n_parts: int, block_count: int) -> list[Path]:
    """As gguf-split lays a model out: metadata in part 1, tensors spread over all parts."""
    paths = []
    rng = np.random.default_rng(0)
    per_part = block_count // n_parts
    for part in range(n_parts):
        path = folder / f"split-{part + 1:05d}-of-{n_parts:05d}.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        if part > 0:  # gguf-split writes only the split keys after the first part
            w.kv_data[0].pop("general.architecture")
        else:
            w.add_block_count(block_count)
            w.add_embedding_length(64)
            w.add_head_count(4)
            w.add_context_length(4096)
            add_small_vocabulary(w)
        w.add_uint16("split.no", part)
        w.add_uint16("split.count", n_parts)
        w.add_int32("split.tensors.count", block_count)
        for i in range(part * per_part, (part + 1) * per_part):
            w.add_tensor(f"blk.{i}.attn_q.weight",
                         rng.standard_normal((64, 64)).astype(np.float32).astype(np.float16))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(path)
    return paths


@pytest.mark.e2e
def test_smollm2_facts(default_model: Path) -> None:
    info = read_model_info(default_model)
    assert (info.architecture, info.block_count, info.n_embd, info.n_head) == ("llama", 30, 576, 9)
    assert (info.n_head_kv[0], info.key_length, info.n_ctx_train, info.n_vocab) == (3, 64, 8192, 49152)
    assert (info.quant, info.file_type, info.tied_embeddings) == ("Q4_1", 3, True)
    assert info.n_params == 134_515_008
    assert info.tensor_bytes == 96_576_768  # llama.cpp: "CPU_Mapped model buffer size = 92.10 MiB"
    assert info.chat_template and info.bos_id == 1 and info.eos_id == 2
    texts = info.token_texts()
    assert len(texts) == 49152 and texts[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


# --- remote ------------------------------------------------------------------------------


@dataclass
class FileServer:
    """A tiny HTTP server on 127.0.0.1 that serves byte strings with Range support."""

    files: dict[str, bytes] = field(default_factory=dict)
    honour_range: bool = True
    sent: list[int] = field(default_factory=list)  # body bytes per response
    ranges: list[str | None] = field(default_factory=list)
    url: str = ""
    done: threading.Condition = field(default_factory=threading.Condition)

    def sent_total(self, timeout: float = 10.0) -> int:
        """Bytes written in all responses, once every request seen has finished writing (the
        client can have read a whole body before the server thread records it)."""
        with self.done:
            if not self.done.wait_for(lambda: len(self.sent) == len(self.ranges), timeout):
                raise TimeoutError(f"{len(self.ranges) - len(self.sent)} responses never finished")
            return sum(self.sent)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("/org/repo/resolve/main/"):  # like the Hub: to the CDN
                    self.send_response(302)
                    self.send_header("Location", "/cdn/" + self.path.rsplit("/", 1)[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path.startswith("/gated/"):
                    self.send_error(403)
                    return
                data = server.files.get(self.path.rsplit("/", 1)[1])
                if data is None:
                    self.send_error(404)
                    return
                wanted = self.headers.get("Range")
                server.ranges.append(wanted)
                match = re.fullmatch(r"bytes=(\d+)-(\d+)", wanted or "")
                if match and server.honour_range:
                    start, end = int(match[1]), min(int(match[2]), len(data) - 1)
                    body = data[start:end + 1]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                else:
                    body = data
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                written = 0
                try:
                    for i in range(0, len(body), 65536):
                        self.wfile.write(body[i:i + 65536])
                        written += len(body[i:i + 65536])
                except (BrokenPipeError, ConnectionResetError):
                    pass
                with server.done:
                    server.sent.append(written)
                    server.done.notify_all()

        return Handler


@pytest.fixture
def file_server() -> Iterator[FileServer]:
    state = FileServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), state.handler())
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def same_model(remote: ModelInfo, local: ModelInfo) -> None:
    assert replace(remote, path_or_url=local.path_or_url, split_paths=local.split_paths) == local


def test_remote_info_reads_only_the_header(file_server: FileServer, tiny_target: Path) -> None:
    data = tiny_target.read_bytes()
    file_server.files["t.gguf"] = data
    info = read_remote_model_info(f"{file_server.url}/files/t.gguf")
    same_model(info, read_model_info(tiny_target))
    assert info.path_or_url == f"{file_server.url}/files/t.gguf"
    assert file_server.ranges == [f"bytes=0-{remote_gguf.FIRST_CHUNK - 1}"]
    assert file_server.sent_total() == remote_gguf.FIRST_CHUNK < len(data)


def test_remote_range_grows_until_the_header_parses(
        file_server: FileServer, tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_gguf, "FIRST_CHUNK", 512)
    data = tiny_target.read_bytes()
    file_server.files["t.gguf"] = data
    got = remote_gguf.read_remote_header(f"{file_server.url}/files/t.gguf")
    header_size = got.header.data_offset
    assert got.requests >= 3 and got.total_size == len(data)
    # Each request asks for the missing bytes only (doubling), never for the tensor data.
    assert got.bytes_fetched == file_server.sent_total() < 2 * header_size
    assert file_server.ranges[:2] == ["bytes=0-511", "bytes=512-1023"]


def test_remote_follows_hub_redirects_and_reads_the_vocabulary(
        file_server: FileServer, tiny_draft: Path) -> None:
    file_server.files["d.gguf"] = tiny_draft.read_bytes()
    info = read_remote_model_info(f"{file_server.url}/org/repo/resolve/main/d.gguf")
    local = read_model_info(tiny_draft)
    same_model(info, local)
    assert info.token_texts() == local.token_texts()  # one more range request
    assert file_server.ranges[-1] == (f"bytes={local.tokens_span.start}-"  # type: ignore[union-attr]
                                      f"{local.tokens_span.end - 1}")  # type: ignore[union-attr]


def test_remote_server_without_range_support(file_server: FileServer, tiny_draft: Path) -> None:
    file_server.honour_range = False
    file_server.files["d.gguf"] = tiny_draft.read_bytes()
    same_model(read_remote_model_info(f"{file_server.url}/files/d.gguf"), read_model_info(tiny_draft))


def test_remote_split_set(file_server: FileServer, tmp_path: Path) -> None:
    paths = write_split(tmp_path, n_parts=3, block_count=6)
    for p in paths:
        file_server.files[p.name] = p.read_bytes()
    info = read_remote_model_info(f"{file_server.url}/files/{paths[1].name}")
    assert (info.split_index, info.split_count) == (1, 3)
    assert info.split_paths == tuple(f"{file_server.url}/files/{p.name}" for p in paths)
    assert info.tensor_bytes == read_model_info(paths[0]).tensor_bytes


def test_remote_errors(file_server: FileServer, tiny_draft: Path) -> None:
    data = tiny_draft.read_bytes()
    file_server.files["cut.gguf"] = data[: len(data) // 2]
    file_server.files["text.gguf"] = b"<html>rate limited</html>"
    with pytest.raises(ModelNotFound, match="HTTP 404"):
        read_remote_model_info(f"{file_server.url}/files/missing.gguf")
    with pytest.raises(ModelFileError, match="HTTP 403"):
        read_remote_model_info(f"{file_server.url}/gated/x.gguf")
    with pytest.raises(TruncatedModel, match="cut short on the server"):
        read_remote_model_info(f"{file_server.url}/files/cut.gguf")
    with pytest.raises(ModelFileError, match="error page"):
        read_remote_model_info(f"{file_server.url}/files/text.gguf")
    with pytest.raises(ModelFileError, match="cannot read"):
        read_remote_model_info("http://127.0.0.1:9/nothing-listens-here.gguf")

"""Constants of the llama.cpp build Outrider ships with, generated from its sources.

Source: llama-cpp-python 0.3.36's vendored llama.cpp (commit 0c1e570, llama 0.5.0):
- `ARCHITECTURES`: the names in `LLM_ARCH_NAMES`, src/llama-arch.cpp, without "clip" (a
  multimodal projector, "mmproj", not a model llama.cpp can run) and "(unknown)".
- `GGML_TYPES`: `GGML_QUANT_SIZES` in gguf-py/gguf/constants.py, which mirrors ggml's
  `type_traits` table. The installed `gguf` package (0.19) predates Q2_0 (id 42), so its
  table would call a valid file corrupt.
- `FILE_TYPES`: `LlamaFileType` in the same file.
- `SWA_DEFAULTS`: what the `load_swa_pattern(ml, n, dense_first)` calls in src/models/*.cpp
  assume when a file has no `sliding_window_pattern` key.

`GGML_TYPE_IDS`, `type_id`, `type_block` and `type_bytes` read `GGML_TYPES` by name: the one
table of ggml types' ids and sizes (the planner's KV bytes, the settings' cache types, the
ids llama.cpp is given, the quantizer's types all come from it).

Regenerate after upgrading llama-cpp-python (and review the diff):

    python -m runtime.gguf.constants /path/to/vendor/llama.cpp > /tmp/new.txt
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ARCHITECTURES = frozenset({
    "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
    "starcoder", "refact", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert",
    "jina-bert-v2", "jina-bert-v3", "eurobert", "bloom", "stablelm", "qwen", "qwen2",
    "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35",
    "qwen35moe", "qwen4exp", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3", "codeshell",
    "orion", "internlm2", "minicpm", "minicpm3", "gemma", "gemma2", "gemma3", "gemma3n",
    "gemma4", "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba", "mamba2", "maple",
    "jamba", "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo",
    "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2",
    "deepseek2-ocr", "deepseek32", "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa",
    "bitnet", "t5", "t5encoder", "jais", "jais2", "nemotron", "nemotron_h", "nemotron_h_moe",
    "exaone", "exaone4", "exaone-moe", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "granite",
    "granitemoe", "granitehybrid", "graniteswitch", "granite_swa", "chameleon",
    "wavtokenizer-dec", "plm", "bailingmoe", "bailingmoe2", "bailingmoe3", "dots1", "dots3note",
    "arcee", "afmoe", "laguna", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense",
    "hunyuan_vl", "hy_v3", "hy_v4", "smollm3", "gpt-oss", "lfm2", "lfm2moe", "dream",
    "smallthinker", "llada", "llada-moe", "seed_oss", "grovemoe", "apertus", "minimax-01",
    "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1", "pangu-embedded", "mistral3",
    "eagle3", "dflash", "mistral4", "paddleocr", "mimo2", "step35", "spark2_5", "llama-embed",
    "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie", "mellum", "nanbeige",
    "qwen3tts", "pockettts",
})

# ggml type id -> (name, values per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}

# ggml type name (upper case, as GGML_TYPES spells it) -> id: GGML_TYPES read the other way
GGML_TYPE_IDS: dict[str, int] = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}


def type_id(name: str) -> int:
    """The ggml type id of `name`, in any case; KeyError for a type ggml does not have.

        >>> type_id("q8_0"), type_id("BF16")
        (8, 30)
    """
    return GGML_TYPE_IDS[name.upper()]


def type_block(name: str) -> tuple[int, int]:
    """(values per block, bytes per block) of the ggml type `name`, in any case.

        >>> type_block("q8_0")     # 32 int8 values and one f16 scale
        (32, 34)
    """
    _, block, size = GGML_TYPES[type_id(name)]
    return block, size


def type_bytes(name: str) -> float:
    """Bytes per value of the ggml type `name`, in any case.

        >>> type_bytes("q8_0"), type_bytes("f16")
        (1.0625, 2.0)
    """
    block, size = type_block(name)
    return size / block


# general.file_type id -> quant name (LlamaFileType without its MOSTLY_/ALL_ prefix)
FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}

# architecture -> (layers per period, dense_first, default window if the file has none).
# is_swa(il) = il % n != 0 when dense_first, else il % n < n - 1 (llama_hparams::set_swa_pattern).
SWA_DEFAULTS: dict[str, tuple[int, bool, int | None]] = {
    "gemma2": (2, False, 4096),
    "gemma3": (6, False, None),
    "gemma3n": (5, False, None),
    "gemma-embedding": (6, False, None),
    "cohere2": (4, False, None),
    "cohere2moe": (4, True, None),
    "exaone4": (4, False, 4096),
    "exaone-moe": (4, False, 128),
    "afmoe": (4, False, None),
    "llama4": (4, False, 8192),
    "mellum": (4, False, None),
    "olmo2": (4, False, None),
    "gpt-oss": (2, False, None),
    "plamo3": (8, False, None),
    "smallthinker": (4, True, 4096),
    "muse-glimmer": (4, False, None),
    "laguna": (4, True, None),
}


def generate(llama_cpp_dir: Path) -> str:
    """The three generated tables above, as Python source, from a llama.cpp checkout."""
    arch_src = (llama_cpp_dir / "src" / "llama-arch.cpp").read_text()
    match = re.search(r"LLM_ARCH_NAMES = \{(.*?)\n\};", arch_src, re.S)
    if match is None:
        raise ValueError("LLM_ARCH_NAMES not found in src/llama-arch.cpp")
    names = [n for n in re.findall(r'\{\s*LLM_ARCH_\w+,\s*"([^"]+)"\s*\}', match.group(1))
             if n not in ("clip", "(unknown)")]
    spec = importlib.util.spec_from_file_location(
        "_vendored_gguf_constants", llama_cpp_dir / "gguf-py" / "gguf" / "constants.py")
    if spec is None or spec.loader is None:
        raise ValueError("gguf-py/gguf/constants.py not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = ["ARCHITECTURES = " + repr(sorted(names))]
    lines.append("GGML_TYPES = {")
    for key, (block, size) in sorted(module.GGML_QUANT_SIZES.items(), key=lambda kv: int(kv[0])):
        lines.append(f'    {int(key)}: ("{key.name}", {block}, {size}),')
    lines.append("}")
    lines.append("FILE_TYPES = {")
    for ft in sorted(module.LlamaFileType, key=int):
        if ft.name != "GUESSED":
            lines.append(f'    {int(ft)}: "{ft.name.removeprefix("MOSTLY_").removeprefix("ALL_")}",')
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(generate(Path(sys.argv[1])), end="")

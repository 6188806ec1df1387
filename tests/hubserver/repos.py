"""The repositories the fake hub serves in tests: real (tiny, random-weight) GGUF files.

    tiny/Tiny-GGUF          tiny-F32.gguf                  the target at F32
                            tiny-Q4_K_M.gguf               the target at F16: the name lies,
                                                           the header tells the truth
                            tiny-Q8_0-00001-of-00002.gguf  a split model (llama.cpp's
                            tiny-Q8_0-00002-of-00002.gguf  gguf-split layout), F32 inside
                            README.md, config.json         not models: never listed as quants
    tiny/Tiny-Draft-GGUF    tiny-draft-F32.gguf            the draft (same vocabulary)
    gated/Tiny-Gated-GGUF   tiny-gated-F32.gguf            401 unless the token is given

and, added by the tests that want it (`add_vision_repo`), a vision model:

    vision/Tiny-Vision-GGUF tiny-vision-F32.gguf           the target
                            mmproj-tiny-vision-F16.gguf    its projector (tiny Gemma 3, F32
                            mmproj-tiny-vision-F32.gguf    inside; the F32 one 4 KiB longer)
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import gguf

from tests.hubserver.server import FakeHub

TINY_REPO = "tiny/Tiny-GGUF"
TINY_DRAFT_REPO = "tiny/Tiny-Draft-GGUF"
GATED_REPO = "gated/Tiny-Gated-GGUF"
GATED_TOKEN = "hf_fake_gated_token_0123456789"
VISION_REPO = "vision/Tiny-Vision-GGUF"
VISION_MODEL = "tiny-vision-F32.gguf"
VISION_PROJECTOR = "mmproj-tiny-vision-F16.gguf"  # the one chosen of the two


def write_split_gguf(source: Path, dest: Path, max_tensors: int) -> list[Path]:
    """Re-write `source` as a split model (`dest` stem + -0000i-of-0000n.gguf), as gguf-split does."""
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dest), arch, split_max_tensors=max_tensors)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        main = f.types[0]
        sub = f.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, f.contents(), main, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data.copy(), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(dest.parent.glob(f"{dest.stem}-*-of-*.gguf"))


def tiny_files(cache: Path) -> dict[str, Path]:
    """The GGUF variants, written once into `cache` (reused across runs)."""
    from tests.conftest import tiny_model_path
    from tests.fixtures.tiny_gguf import DRAFT, TARGET

    target = tiny_model_path(TARGET)
    f16 = tiny_model_path(replace(TARGET, dtype="f16", name="tiny-target-f16"))
    draft = tiny_model_path(DRAFT)
    split_dir = cache / f"split-{target.stem}"
    parts = sorted(split_dir.glob("tiny-Q8_0-*-of-*.gguf"))
    if len(parts) != 2:
        # Written aside and renamed in, so test runs in parallel never see half a file.
        tmp = split_dir / f".tmp-{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        n_tensors = len(gguf.GGUFReader(str(target)).tensors)
        for part in write_split_gguf(target, tmp / "tiny-Q8_0.gguf", (n_tensors + 1) // 2):
            os.replace(part, split_dir / part.name)
        tmp.rmdir()
        parts = sorted(split_dir.glob("tiny-Q8_0-*-of-*.gguf"))
    if len(parts) != 2:
        raise RuntimeError(f"could not write the split test model into {split_dir}")
    return {"target": target, "f16": f16, "draft": draft, "split1": parts[0], "split2": parts[1]}


def add_tiny_repos(hub: FakeHub, cache: Path) -> dict[str, Path]:
    """Add the three repositories above to `hub`; returns the local files they serve."""
    files = tiny_files(cache)
    hub.add_repo(TINY_REPO, {
        "tiny-F32.gguf": files["target"],
        "tiny-Q4_K_M.gguf": files["f16"],
        files["split1"].name: files["split1"],
        files["split2"].name: files["split2"],
        "README.md": b"# Tiny\nA tiny random model for tests.\n",
        "config.json": b"{}",
    }, downloads=500, likes=7, tags=("gguf", "llama", "text-generation"))
    hub.add_repo(TINY_DRAFT_REPO, {"tiny-draft-F32.gguf": files["draft"]},
                 downloads=50, likes=30, tags=("gguf", "llama"))
    hub.add_repo(GATED_REPO, {"tiny-gated-F32.gguf": files["draft"]}, gated=True,
                 token=GATED_TOKEN, license="llama3.1", downloads=5, likes=1)
    return files


def add_vision_repo(hub: FakeHub) -> dict[str, Path]:
    """Add VISION_REPO (above) to `hub`; returns the local model and projector it serves."""
    from tests.conftest import tiny_mmproj_path, tiny_model_path
    from tests.fixtures.tiny_gguf import TARGET

    target, mmproj = tiny_model_path(TARGET), tiny_mmproj_path()
    hub.add_repo(VISION_REPO, {
        VISION_MODEL: target,
        VISION_PROJECTOR: mmproj,
        "mmproj-tiny-vision-F32.gguf": mmproj.read_bytes() + bytes(4096),
        "README.md": b"# Tiny vision\nA tiny random vision model for tests.\n",
    }, downloads=20, likes=2, tags=("gguf", "gemma3", "image-text-to-text"))
    return {"target": target, "mmproj": mmproj}

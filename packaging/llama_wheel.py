"""Build and install llama-cpp-python with llama.cpp's RPC backend, once per set of flags.

llama-cpp-python ships as source only; its build takes ~11 minutes on 2 cores. Outrider wants
it built with `-DGGML_RPC=ON` (split a model across machines, docs/distributed.md) plus whatever
the user adds in CMAKE_ARGS (`-DGGML_CUDA=on`, ...). pip's own wheel cache keys on the source
archive alone, not on CMAKE_ARGS, so it would hand back a wheel built with other flags; the
wheel is therefore built into a folder of our own, named after the flags, kept inside pip's
cache folder so that whatever keeps pip's cache (a CI cache, a developer's home) keeps it too.

Usage: python packaging/llama_wheel.py [--force] [--extra "-DGGML_CUDA=on"]
  (the version is the one pinned in pyproject.toml; --force rebuilds the wheel)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "llama-cpp-python"
ALWAYS = "-DGGML_RPC=ON"


def pinned_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"llama-cpp-python==([^"]+)"', text)
    if match is None:
        raise SystemExit("pyproject.toml pins no llama-cpp-python version")
    return match.group(1)


def cmake_args(extra: str) -> str:
    return " ".join(part for part in (ALWAYS, extra.strip()) if part)


def wheel_dir(version: str, args: str) -> Path:
    """The folder for this version, these flags, this interpreter and this machine."""
    key = "|".join((version, args, sys.implementation.cache_tag, platform.machine(), sys.platform))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return pip_cache_dir() / "outrider-llama-wheels" / f"{version}-{digest}"


def pip_cache_dir() -> Path:
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, check=False
    )
    path = probe.stdout.strip()
    if probe.returncode == 0 and path:
        return Path(path)
    return Path.home() / ".cache" / "outrider"  # pip's cache is off (PIP_NO_CACHE_DIR)


def built_wheel(folder: Path) -> Path | None:
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    return wheels[-1] if wheels else None


def build(version: str, args: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    print(f"Building {PACKAGE} {version} with CMAKE_ARGS=\"{args}\" (about 11 min on 2 cores)")
    env = dict(os.environ, CMAKE_ARGS=args)
    # --no-cache-dir: pip's cache would return a wheel built with other flags.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-cache-dir",
         "--no-binary", PACKAGE, "--wheel-dir", str(folder), f"{PACKAGE}=={version}"],
        env=env, check=True,
    )
    wheel = built_wheel(folder)
    if wheel is None:
        raise SystemExit(f"pip wheel left no wheel in {folder}")
    return wheel


def installed_has_rpc() -> bool:
    """Whether the installed binding carries the RPC backend's library."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return False
    lib = Path(spec.origin).parent / "lib"
    return any(lib.glob("*ggml-rpc*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", default=os.environ.get("CMAKE_ARGS", ""),
                        help="more CMake flags (default: $CMAKE_ARGS)")
    parser.add_argument("--force", action="store_true", help="rebuild the wheel")
    opts = parser.parse_args()
    version = pinned_version()
    args = cmake_args(opts.extra)
    folder = wheel_dir(version, args)
    wheel = None if opts.force else built_wheel(folder)
    fresh = wheel is None
    if wheel is None:
        wheel = build(version, args, folder)
    if fresh or opts.force or not installed_has_rpc() or opts.extra:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
             str(wheel)],
            check=True,
        )
    print(f"{PACKAGE} {version}: {wheel}")


if __name__ == "__main__":
    main()

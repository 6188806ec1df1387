"""The command line is where engine processes start: it sets their environment (libgomp's
spin) before any command module loads llama.cpp, which reads it once, as it loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import runtime
from runtime.openmp import CROWDED_SPIN


def test_the_command_line_sets_the_engine_environment_before_llama_cpp_loads() -> None:
    code = """
import json, os, sys
if hasattr(os, "sched_setaffinity"):  # one CPU: ggml's threads fill it, the spin is set
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import runtime.cli
early = "llama_cpp" in sys.modules
spin = os.environ.get("GOMP_SPINCOUNT")
import runtime.cli.main
print(json.dumps({"early": early, "spin": spin, "loaded": "llama_cpp" in sys.modules}))
"""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(runtime.__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"early": False, "spin": str(CROWDED_SPIN), "loaded": True}

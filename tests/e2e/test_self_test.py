"""`outrider --self-test` against the real default model, as a user (or CI) runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_self_test_exits_zero(default_model: Path, isolated_user_dirs: Path) -> None:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen",
               OUTRIDER_MODELS_DIR=str(default_model.parents[2]))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-m", "runtime.cli.main", "--self-test"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "self-test: generated" in result.stdout
    assert "self-test: ok" in result.stdout

"""runtime.openmp: libgomp's spin is cut short where the default threads take every CPU, and
it is decided where an engine process starts, before llama.cpp (and libgomp) load."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys

import pytest

import runtime.openmp as openmp
from runtime.openmp import CROWDED_SPIN, spin_default


def test_doctests() -> None:
    assert doctest.testmod(openmp).failed == 0


@pytest.mark.parametrize(("threads", "cpus", "expected"), [
    (2, 2, str(CROWDED_SPIN)),  # a 2-CPU VM: the threads take every CPU
    (4, 2, str(CROWDED_SPIN)),  # a cpuset smaller than the physical count
    (8, 16, None),              # SMT: a spare logical CPU per thread, libgomp's own default
])
def test_spin_is_cut_only_where_the_threads_fill_the_cpus(threads: int, cpus: int,
                                                          expected: str | None) -> None:
    env: dict[str, str] = {}
    assert spin_default(env, threads=threads, cpus=cpus) == expected
    assert env.get("GOMP_SPINCOUNT") == expected


@pytest.mark.parametrize("knob", ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT"])
def test_the_users_setting_wins(knob: str) -> None:
    env = {knob: "active" if knob == "OMP_WAIT_POLICY" else "300000"}
    assert spin_default(env, threads=2, cpus=2) is None
    assert env == {knob: env[knob]}


def test_an_engine_process_sets_it_before_llama_cpp_loads() -> None:
    """What a fresh interpreter that starts as an engine process (`prepare_engine_process`,
    as the command line does) has in its environment once it has imported the binding: this
    machine's decision, made before llama_cpp loaded."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = ("import sys; from runtime.openmp import prepare_engine_process; "
            "prepare_engine_process(); early = 'llama_cpp' in sys.modules; "
            "import os, runtime.llama.binding; "
            "print(early, os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out == ["False", str(spin_default({}))]


def test_reference_env_leaves_out_only_the_spin_outrider_set(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from runtime import openmp

    monkeypatch.setattr(openmp, "_set_here", True)
    monkeypatch.setenv("GOMP_SPINCOUNT", str(openmp.CROWDED_SPIN))
    assert "GOMP_SPINCOUNT" not in openmp.reference_env()
    monkeypatch.setenv("GOMP_SPINCOUNT", "5000")  # the user's own: kept
    assert openmp.reference_env()["GOMP_SPINCOUNT"] == "5000"
    monkeypatch.setattr(openmp, "_set_here", False)
    monkeypatch.setenv("GOMP_SPINCOUNT", str(openmp.CROWDED_SPIN))
    assert openmp.reference_env()["GOMP_SPINCOUNT"] == str(openmp.CROWDED_SPIN)

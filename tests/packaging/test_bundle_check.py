"""The bundle check (`Outrider --check-bundle`, packaging/check_bundle.py), which `make package`
runs right after PyInstaller: a bundle missing a dependency's metadata fails it, naming the
dependency; the bundle as built passes it.

The bundle tests need dist/Outrider (`make package`) and are skipped without it; `make
package-test` runs this folder after building. The tests of the lists the spec builds from run
anywhere (they read the venv, nothing is built).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dist" / "Outrider" / ("Outrider.exe" if sys.platform == "win32" else "Outrider")
needs_bundle = pytest.mark.skipif(
    not APP.is_file(), reason="no bundle at dist/Outrider: `make package` builds it "
                              "(`make package-test` builds it and runs these tests)")


def _check_bundle() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_bundle", ROOT / "packaging" / "check_bundle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_check(app: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    return subprocess.run([str(app), "--check-bundle"], capture_output=True, text=True,
                          timeout=300, env=env, check=False)


def copy_bundle(dest: Path) -> Path:
    """A copy of dist/Outrider under `dest`, its files hard links where the file system allows
    (deleting one in the copy leaves the original alone), else copies. The copy's executable."""
    target = dest / APP.parent.name
    try:
        shutil.copytree(APP.parent, target, symlinks=True, copy_function=os.link)
    except (OSError, shutil.Error):
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(APP.parent, target, symlinks=True)
    return target / APP.name


@needs_bundle
def test_the_bundle_as_built_passes_the_check() -> None:
    result = run_check(APP)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check-bundle: ok" in result.stdout


@needs_bundle
def test_a_bundle_without_llguidance_metadata_fails_the_check(tmp_path: Path) -> None:
    app = copy_bundle(tmp_path)
    internal = app.parent / "_internal"
    metadata = sorted(internal.glob("llguidance-*.dist-info"))
    assert metadata, f"no llguidance-*.dist-info in {internal} to remove"
    for folder in metadata:
        shutil.rmtree(folder)
    assert (APP.parent / "_internal" / metadata[0].name).is_dir()  # the original keeps it

    result = run_check(app)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    lines = result.stdout.splitlines()
    assert any(line.startswith("check-bundle: distribution llguidance: no metadata")
               for line in lines), output
    # …and what that breaks: llguidance asks for its own version as it is imported.
    assert any("import llguidance" in line and "PackageNotFoundError" in line
               for line in lines), output
    assert lines[-1].startswith("check-bundle: FAILED"), output


def test_the_distribution_list_is_outriders_requirements_without_dev() -> None:
    dists = _check_bundle().runtime_distributions()
    # Direct and transitive requirements, each once, at the installed version.
    assert {"outrider", "llguidance", "huggingface-hub", "hf-xet", "jsonschema-specifications",
            "pyside6-essentials", "certifi"} <= dists.keys()
    assert all(isinstance(version, str) and version for version in dists.values())
    # The dev extra and what only it needs stay out.
    assert not {"pytest", "mypy", "ruff", "hypothesis", "openai", "schemathesis"} & dists.keys()


def test_every_runtime_and_app_module_is_listed_but_the_screenshots_tool() -> None:
    modules = _check_bundle().source_modules(ROOT)
    assert {"runtime", "runtime.cli.main", "runtime.sampling.constraint", "app",
            "app.main", "app.window"} <= set(modules)
    assert "app.screenshots" not in modules
    assert len(modules) == len(set(modules))


def test_import_names_skip_what_is_not_a_module() -> None:
    check_bundle = _check_bundle()
    names = check_bundle.import_names(["llguidance", "nvidia-ml-py", "PyYAML", "pytest"],
                                      excluded=["pytest"])
    assert names["llguidance"] == ["llguidance"]
    assert names["nvidia-ml-py"] == ["pynvml"]  # not its sample script, example.py
    assert "yaml" in names["PyYAML"]
    assert "pytest" not in names["pytest"]

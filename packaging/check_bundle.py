"""Does the frozen app carry everything Outrider needs? Run inside the bundle after each build:

    dist/Outrider/Outrider --check-bundle       (`make package` runs it right after PyInstaller)

It prints one line per problem and exits 1 if there is any, 0 otherwise. It checks:

- every module of runtime/ and app/ imports (app.screenshots stays out on purpose);
- every distribution the app depends on (the transitive closure of outrider's requirements,
  no dev extra, as the build's venv had it: written into the bundle as bundle-manifest.json)
  has its metadata, at the version built with, and its top-level modules import;
- the metadata of every other distribution the build bundled code of is there too;
- the data files: each distribution's files (its RECORD) that are neither code nor on
  `NOT_NEEDED` are in the bundle, the spec's own data files are, and the run-time reads we
  know of work (certifi's CA file, the JSON Schema metaschemas, pyqtgraph's colour maps and
  icons, huggingface_hub seeing hf_xet, Qt's platform plugins, the model catalogue).

outrider.spec imports this file at build time for `runtime_distributions()`,
`import_names()` and `distributions_of()`, so the build and the check agree on the list.
Only the standard library is imported at the top: the bundle must be able to run it even when
half of it is broken.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata as metadata
import importlib.util
import json
import os
import pkgutil
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MANIFEST = "packaging/bundle-manifest.json"  # inside the bundle (sys._MEIPASS)
ROOT_DISTRIBUTION = "outrider"
PACKAGES = ("runtime", "app")
SKIP_MODULES = {"app.screenshots"}  # a development tool, excluded by the spec on purpose

# Top-level modules a distribution installs that are not part of what it offers.
NOT_IMPORTED = {"example": "nvidia-ml-py installs its sample script as `example.py`"}

# Files in a distribution's RECORD that are neither code nor needed at run time (why, found by
# listing them: see packaging/README.md, "Metadata and data files"). Patterns are fnmatch'ed
# against the RECORD path; `*` crosses folders.
NOT_NEEDED: dict[str, dict[str, str]] = {
    "fastapi": {"fastapi/.agents/*": "guidance for coding agents"},
    "huggingface-hub": {"huggingface_hub/templates/*":
                        "model/dataset card templates for publishing; Outrider only downloads"},
    "markdown-it-py": {"markdown_it/port.yaml": "notes on the JavaScript port"},
    "numpy": {"numpy/f2py/*": "f2py builds Fortran wrappers, a build tool",
              "numpy/_core/lib/*": "pkg-config files for building against numpy",
              "numpy/ma/API_CHANGES.txt": "documentation",
              "numpy/random/_examples/*": "Cython/Numba examples"},
    "tqdm": {"tqdm/completion.sh": "shell completion for tqdm's own command",
             "tqdm/tqdm.1": "man page of tqdm's own command"},
    "urllib3": {"urllib3/contrib/emscripten/*": "runs only in a browser (Pyodide)"},
}
# Not audited file by file: the spec chooses PySide6's files itself (Qt modules, plugins and
# translations left out on purpose); what the app needs of Qt is checked in `_check_qt`.
NOT_AUDITED = {"pyside6-essentials", "shiboken6", ROOT_DISTRIBUTION}
_NOT_DATA = re.compile(
    r"(^|/)(__pycache__|tests?|testing|examples?|include)/"
    r"|\.(dist|egg)-info/"
    r"|(^|/)(py\.typed|(LICEN[CS]E|COPYING|AUTHORS|README)[^/]*)$"
    r"|\.(py|pyc|pyi|pyd|so|dll|dylib|lib|a|exp|h|hpp|hh|c|cc|cpp|pxd|pyx|pxi|pyf|f|f90"
    r"|cmake|pc)$"
    r"|\.so(\.\d+)+$", re.IGNORECASE)

Problem = str


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them: `Jinja2` and `jinja2` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- what the app depends on (build time, in the venv) -------------------------------------

def runtime_distributions(root: str = ROOT_DISTRIBUTION) -> dict[str, str]:
    """{canonical name: version} of `root` and everything it requires, transitively, as
    installed here. Markers are evaluated for this interpreter and platform; extras are
    followed only where a requirement names them, so outrider's own `dev` extra stays out.
    A requirement that is not installed raises: the bundle would miss it."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    stack: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while stack:
        name, extras = stack.pop()
        key = canonical(name)
        if key in found and extras <= extras_seen[key]:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"check_bundle: {name} is required but not installed") from None
        found[key] = dist.version
        extras_seen.setdefault(key, set()).update(extras)
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is not None and not any(
                    req.marker.evaluate({"extra": extra}) for extra in ("", *extras)):
                continue
            stack.append((req.name, frozenset(req.extras)))
    return dict(sorted(found.items()))


def _top_level_index() -> dict[str, list[str]]:
    """{canonical distribution: [top-level module names it installs]}"""
    index: dict[str, list[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            index.setdefault(canonical(dist), []).append(module)
    return index


def import_names(dists: Iterable[str], excluded: Iterable[str] = ()) -> dict[str, list[str]]:
    """{distribution: the top-level modules of it that import here} (less `excluded`, the
    spec's excludes, and `NOT_IMPORTED`)."""
    index = _top_level_index()
    skip = set(excluded) | set(NOT_IMPORTED)
    names: dict[str, list[str]] = {}
    for dist in dists:
        names[dist] = sorted(
            module for module in set(index.get(canonical(dist), ()))
            if module.isidentifier() and module not in skip
            and importlib.util.find_spec(module) is not None)
    return names


def distributions_of(modules: Iterable[str]) -> set[str]:
    """The canonical names of the distributions that installed these top-level modules."""
    owners = metadata.packages_distributions()
    return {canonical(dist) for module in modules for dist in owners.get(module, ())}


def source_modules(root: Path) -> list[str]:
    """Every module under runtime/ and app/ of the checkout, by file (nothing imported)."""
    names = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py":
                parts = path.relative_to(root).with_suffix("").parts
            elif path.suffix in (".so", ".pyd") and "." in path.name:
                parts = (*path.relative_to(root).parent.parts, path.name.split(".")[0])
            else:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts[-1] == "__main__" or not all(p.isidentifier() for p in parts):
                continue
            name = ".".join(parts)
            if not any(name == s or name.startswith(s + ".") for s in SKIP_MODULES):
                names.append(name)
    return names


# --- the checks (run time, in the bundle) ---------------------------------------------------

def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _import(name: str) -> str | None:
    try:
        importlib.import_module(name)
    except BaseException as exc:  # SystemExit from a module is a problem too
        return _error(exc)
    return None


def _walk(packages: Iterable[str]) -> list[str]:
    """The modules the bundle itself lists under `packages` (pkgutil.walk_packages)."""
    found: list[str] = []
    for package in packages:
        try:
            module = importlib.import_module(package)
        except BaseException:
            continue  # reported by the import check
        found.append(package)
        for info in pkgutil.walk_packages(module.__path__, package + ".", onerror=lambda _: None):
            if not any(info.name == s or info.name.startswith(s + ".") for s in SKIP_MODULES):
                found.append(info.name)
    return found


def check_modules(manifest: dict[str, Any]) -> list[Problem]:
    wanted = dict.fromkeys([*manifest.get("modules", ()), *_walk(PACKAGES)])
    problems = []
    for name in wanted:
        error = _import(name)
        if error:
            problems.append(f"module {name} does not import: {error}")
    return problems


def check_distributions(manifest: dict[str, Any]) -> list[Problem]:
    problems = []
    for dist, info in manifest["distributions"].items():
        try:
            version = metadata.version(dist)
        except Exception as exc:
            problems.append(f"distribution {dist}: no metadata ({_error(exc)}); "
                            f"copy_metadata({dist!r}) in outrider.spec")
        else:
            if version != info["version"]:
                problems.append(f"distribution {dist}: metadata says {version}, "
                                f"the build had {info['version']}")
        for module in info["imports"]:
            error = _import(module)
            if error:
                problems.append(f"distribution {dist}: `import {module}` fails: {error}")
    for dist in manifest.get("metadata", ()):
        if dist in manifest["distributions"]:
            continue
        try:
            metadata.version(dist)
        except Exception as exc:
            problems.append(f"distribution {dist} (bundled code): no metadata ({_error(exc)})")
    return problems


def check_record_files(manifest: dict[str, Any], bundle: Path) -> list[Problem]:
    """Each distribution's non-code files (its RECORD) are in the bundle or on NOT_NEEDED."""
    problems = []
    for dist in manifest["distributions"]:
        if dist in NOT_AUDITED:
            continue
        try:
            files = metadata.files(dist)
        except metadata.PackageNotFoundError:
            continue  # reported by check_distributions
        if files is None:
            problems.append(f"distribution {dist}: its metadata has no RECORD to audit")
            continue
        skip = NOT_NEEDED.get(dist, {})
        missing = [str(f) for f in files
                   if not str(f).startswith("..") and not _NOT_DATA.search(str(f))
                   and not any(fnmatch.fnmatch(str(f), pattern) for pattern in skip)
                   and not (bundle / str(f)).exists()]
        for path in missing:
            problems.append(f"distribution {dist}: data file {path} is not in the bundle "
                            "(collect_data_files in outrider.spec, or NOT_NEEDED in "
                            "check_bundle.py with the reason)")
    return problems


def _check_certifi() -> str | None:
    import certifi

    path = Path(certifi.where())
    return None if path.is_file() and path.stat().st_size > 0 else f"no CA file at {path}"


def _check_json_schema() -> str | None:
    import jsonschema
    from jsonschema_specifications import REGISTRY

    for uri in ("https://json-schema.org/draft/2020-12/schema",
                "http://json-schema.org/draft-07/schema#"):
        REGISTRY.contents(uri)  # raises if the metaschema file was not bundled
    jsonschema.Draft202012Validator.check_schema({"type": "object"})
    return None


def _check_pyqtgraph() -> str | None:
    import pyqtgraph
    from pyqtgraph import colormap

    if not colormap.listMaps():
        return "no colour maps (pyqtgraph/colors/maps)"
    icons = Path(pyqtgraph.__file__).parent / "icons"
    missing = [name for name in ("auto.png", "ctrl.png", "default.png", "lock.png")
               if not (icons / name).is_file()]
    return f"missing icons {missing} in {icons}" if missing else None


def _check_xet() -> str | None:
    if os.environ.get("HF_HUB_DISABLE_XET"):
        return None
    from huggingface_hub.utils._runtime import is_xet_available

    # huggingface_hub finds hf_xet by its metadata: without it, Xet downloads are off.
    return None if is_xet_available() else "huggingface_hub does not see hf_xet"


def _check_qt() -> str | None:
    from PySide6 import QtCore

    plugins = Path(QtCore.QLibraryInfo.path(QtCore.QLibraryInfo.LibraryPath.PluginsPath))
    native = {"linux": "xcb", "darwin": "cocoa", "win32": "windows"}.get(sys.platform)
    needed = [("platforms", "offscreen"), ("platforms", native), ("iconengines", "svgicon"),
              ("imageformats", "svg")]
    missing = [f"{folder}/{name}" for folder, name in needed
               if name and not any(name in p.name for p in (plugins / folder).glob("*"))]
    return f"Qt plugins missing under {plugins}: {missing}" if missing else None


def _check_catalog() -> str | None:
    from runtime.hub.catalog import default_catalog_path, load_catalog

    load_catalog(default_catalog_path())
    return None


def _check_llama() -> str | None:
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    return None if any(p.name.startswith(("libllama", "llama")) for p in lib.iterdir()) \
        else f"no llama library in {lib}"


KNOWN_READS: dict[str, Callable[[], str | None]] = {
    "certifi (HTTPS to the Hub)": _check_certifi,
    "jsonschema metaschemas (jsonschema_specifications)": _check_json_schema,
    "pyqtgraph colour maps and icons": _check_pyqtgraph,
    "huggingface_hub + hf_xet": _check_xet,
    "Qt plugins": _check_qt,
    "the model catalogue": _check_catalog,
    "llama.cpp libraries": _check_llama,
}


def check_data(manifest: dict[str, Any], bundle: Path | None) -> list[Problem]:
    problems = []
    for label, check in KNOWN_READS.items():
        try:
            result = check()
        except BaseException as exc:
            result = _error(exc)
        if result:
            problems.append(f"data: {label}: {result}")
    if bundle is not None:
        for path in manifest.get("datas", ()):
            if not (bundle / path).exists():
                problems.append(f"data: {path} (outrider.spec's data_files) is not in the bundle")
        if manifest.get("native") and (error := _import("runtime._native")):
            problems.append(f"data: runtime._native was built but does not import: {error}")
        problems += check_record_files(manifest, bundle)
    return problems


def source_manifest() -> dict[str, Any]:
    """The manifest of the checkout and venv, for running the checks outside a bundle."""
    root = Path(__file__).resolve().parents[1]
    dists = runtime_distributions()
    imports = import_names(dists)
    return {"modules": source_modules(root),
            "distributions": {d: {"version": v, "imports": imports[d]} for d, v in dists.items()},
            "metadata": [], "datas": [], "native": False}


def run(manifest: dict[str, Any], bundle: Path | None) -> list[Problem]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # nothing is shown
    # Distributions first: a missing one's lines come before those of the modules it breaks.
    return [*check_distributions(manifest), *check_data(manifest, bundle),
            *check_modules(manifest)]


def main(argv: Iterable[str] = ()) -> int:
    del argv  # no options
    if getattr(sys, "frozen", False):
        bundle: Path | None = Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent))
        assert bundle is not None
        try:
            manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
        except OSError as exc:
            print(f"check-bundle: no manifest: {_error(exc)}", flush=True)
            return 1
    else:
        bundle, manifest = None, source_manifest()
    problems = run(manifest, bundle)
    for problem in problems:
        print(f"check-bundle: {problem}", flush=True)
    counts = (f"{len(manifest.get('modules', ()))} modules, "
              f"{len(manifest['distributions'])} distributions, "
              f"{len(manifest.get('metadata', ()))} metadata, {len(KNOWN_READS)} data reads")
    if problems:
        print(f"check-bundle: FAILED with {len(problems)} problem(s) ({counts})", flush=True)
        return 1
    print(f"check-bundle: ok ({counts})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

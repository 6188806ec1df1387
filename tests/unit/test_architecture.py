"""The shape of the code: no import circles in runtime/ or app/, a small top level, imports
at the top of their modules, and no side effect in importing `runtime`.

import-linter's contracts (pyproject.toml) say which package may import which; they do not
see a circle inside one package (`runtime.gguf.info` ↔ `runtime.gguf.remote` once was one).
This test does, over grimp's graph, which counts imports inside functions too: a circle
hidden in a function body is still a circle to a reader and to the import system.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

import runtime

MAX_TOP_LEVEL_MODULES = 12  # errors, events, paths, atomic_file, units, ...: shared pieces only


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("runtime", "app", cache_dir=None)


def strongly_connected(graph: grimp.ImportGraph) -> Iterator[list[str]]:
    """Tarjan's strongly connected components of the import graph, iteratively (the graph
    is deep enough to make recursion a worry). A component of two or more modules, or one
    module importing itself, is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []  # Tarjan's stack of modules whose component is still open
    on_stack: set[str] = set()
    work: list[tuple[str, Iterator[str]]] = []  # the depth-first path, each with what is left

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        work.append((module, iter(sorted(graph.find_modules_directly_imported_by(module)))))

    for root in sorted(graph.modules):
        if root in index:
            continue
        visit(root)
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    visit(other)
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    yield sorted(component)


def test_no_import_circles_in_runtime_or_app(graph: grimp.ImportGraph) -> None:
    circles = [c for c in strongly_connected(graph)
               if len(c) > 1 or c[0] in graph.find_modules_directly_imported_by(c[0])]
    shown = []
    for circle in circles:
        first = circle[0]
        if len(circle) == 1:
            shown.append(f"{first} imports itself")
            continue
        second = next(m for m in graph.find_modules_directly_imported_by(first) if m in circle)
        back = graph.find_shortest_chain(importer=second, imported=first) or ()
        shown.append(f"{' → '.join((first, *back))}  (circle of {len(circle)}: {circle})")
    assert not circles, "import circles:\n" + "\n".join(shown)


def test_a_circle_through_a_function_body_is_found(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The test above is worth as much as the graph it walks: an import inside a function
    # (the way the info ↔ remote circle hid) must count.
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "info.py").write_text("def remote_info():\n    from circled import remote\n")
    (package / "remote.py").write_text("from circled import info\n")
    (package / "alone.py").write_text("from circled import info\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circled", cache_dir=None)
    assert [c for c in strongly_connected(graph) if len(c) > 1] == [
        ["circled.info", "circled.remote"]]


# runtime/server/ before issue 36 rebuilt it around one generation path (31 flat modules).
SERVER_LINES_BEFORE_ONE_PATH = 6186


def test_the_server_stays_smaller_than_before_its_one_generation_path() -> None:
    server = Path(runtime.__file__).parent / "server"
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in server.rglob("*.py"))
    assert lines < SERVER_LINES_BEFORE_ONE_PATH, (
        f"runtime/server/ has {lines} lines, no fewer than the {SERVER_LINES_BEFORE_ONE_PATH} "
        "it had with a copy of the request's path per dialect")


def test_runtime_keeps_a_small_top_level() -> None:
    top = sorted(p.stem for p in Path(runtime.__file__).parent.glob("*.py")
                 if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"runtime/ has {len(top)} top-level modules ({', '.join(top)}); a feature belongs in "
        "its package")


_DIRECTIVE = re.compile(r"\b(noqa|type:\s*ignore|pragma)\b.*", re.IGNORECASE)


def _why_comments(source: str) -> tuple[dict[int, str], set[int]]:
    """The comments of `source` that say something (not only a noqa or type: ignore), by
    line; and the lines that hold nothing but a comment."""
    said: dict[int, str] = {}
    alone: set[int] = set()
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        text = _DIRECTIVE.sub("", tok.string.lstrip("#")).strip()
        if re.search(r"[A-Za-z]{2}", text):
            said[tok.start[0]] = text
            if lines[tok.start[0] - 1].strip().startswith("#"):
                alone.add(tok.start[0])
    return said, alone


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError")
               for n in names)


def hidden_imports(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) of each import in a function body of `source` that is neither optional
    (in the body of a `try` that catches ImportError) nor explained by a comment on its
    line or on a comment line just above it (or above the run of imports it belongs to)."""
    said, alone = _why_comments(source)
    explained_to: set[int] = set()  # last lines of explained imports: the next one shares it

    def visit(node: ast.AST, in_function: bool, optional: bool) -> Iterator[tuple[int, str]]:
        if isinstance(node, ast.Import | ast.ImportFrom) and in_function and not optional:
            line = node.lineno
            if line in said or (line - 1) in alone or (line - 1) in explained_to:
                explained_to.add(node.end_lineno or line)
            else:
                module = (node.names[0].name if isinstance(node, ast.Import)
                          else "." * node.level + (node.module or ""))
                yield line, module
        in_function = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for child in node.body:
                yield from visit(child, in_function, True)
            for part in (node.handlers, node.orelse, node.finalbody):
                for child in part:
                    yield from visit(child, in_function, optional)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, in_function, optional)

    yield from visit(ast.parse(source), False, False)


def test_what_always_ships_is_imported_at_the_top() -> None:
    """STYLE.md, practice 14: an import inside a function hides the design from the reader
    and from the import graph. Allowed where the package is optional (`try: import ...
    except ImportError`) or a comment says why (start-up time, a child process, a circle
    that must stay)."""
    root = Path(runtime.__file__).parents[1]
    found = []
    for package in ("runtime", "app"):
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            found += [f"{name}:{line}: import {module}"
                      for line, module in hidden_imports(path.read_text(encoding="utf-8"))]
    assert not found, ("imports inside functions, with no comment saying why:\n"
                       + "\n".join(found))


def test_a_hidden_import_is_found_unless_optional_or_explained() -> None:
    source = """
import os

def plain():
    import json

def optional():
    try:
        import pynvml
    except ImportError:
        return None

def said():
    import this  # start-up time: the module costs 200 ms and only --help needs it

def said_above():
    # child process: llama.cpp loads here, after the environment is set
    from runtime.llama import binding

def only_a_directive():
    import csv  # noqa: PLC0415

def a_run_under_one_comment():
    # start-up time: only `serve` needs the web stack
    from fastapi import FastAPI
    from uvicorn import run

    import decimal
"""
    assert list(hidden_imports(source)) == [(5, "json"), (21, "csv"), (28, "decimal")]


def test_importing_runtime_leaves_the_environment_as_it_was() -> None:
    """The app's window imports `runtime` too: what an engine process needs in its
    environment (runtime.openmp.prepare_engine_process) is set where one starts, never on
    import. One CPU for the child makes libgomp's spin one that would be set."""
    code = """
import json, os
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
before = dict(os.environ)
import runtime, runtime.engine.api, runtime.server.app
print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))
"""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(runtime.__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []

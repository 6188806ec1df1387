"""The shape of the code: no import circles in runtime/ or app/, and a small top level.

import-linter's contracts (pyproject.toml) say which package may import which; they do not
see a circle inside one package (`runtime.gguf.info` ↔ `runtime.gguf.remote` once was one).
This test does, over grimp's graph, which counts imports inside functions too: a circle
hidden in a function body is still a circle to a reader and to the import system.
"""

from __future__ import annotations

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


def test_runtime_keeps_a_small_top_level() -> None:
    top = sorted(p.stem for p in Path(runtime.__file__).parent.glob("*.py")
                 if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"runtime/ has {len(top)} top-level modules ({', '.join(top)}); a feature belongs in "
        "its package")

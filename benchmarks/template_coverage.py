"""Which tool-call family each of llama.cpp's real chat templates is, as Outrider detects it.

Walks llama.cpp's `models/templates/*.jinja` (70 in llama-cpp-python 0.3.36, taken out of
the pinned sdist into the user cache on first use, like the tests do) and prints Markdown:
templates per family, then one row per template — family, whether Outrider renders and
parses its tool calls, how it marks thinking, whether it wants call arguments as an object.
`docs/tool_families.md` holds the output, and a test checks it is still what this prints:

    .venv/bin/python benchmarks/template_coverage.py

The family comes from the template's text alone (`runtime.chat.families.detect_family`);
`arguments` from rendering it (`ChatTemplate.family`, the same probe the engine runs at load).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine.chat_template import ChatTemplate
from runtime.paths import user_dirs
from tests.fixtures.llama_templates import llama_templates_dir


def _reasoning(template: ChatTemplate) -> str:
    family = template.family
    if family.reasoning == "none":
        return "none"
    return f"{family.reasoning} (`{_cell(family.think_start)}` … `{_cell(family.think_end)}`)"


def _cell(text: str) -> str:
    """A table cell's text: `|` (in `<|channel|>`, …) would end the cell."""
    return text.replace("|", "\\|")


def coverage_markdown(directory: Path) -> str:
    """The two tables for the templates in `directory`."""
    paths = sorted(directory.glob("*.jinja"))
    templates = {p.name: ChatTemplate.from_model(p.read_text(encoding="utf-8"),
                                                 bos_token="<s>", eos_token="</s>")
                 for p in paths}
    per_family = Counter(t.family.name for t in templates.values())
    tools = sum(t.family.tools for t in templates.values())
    lines = [
        f"{len(templates)} templates; {tools} with tools (Outrider renders and parses their "
        f"calls), {len(templates) - tools} without.",
        "",
        "| family | templates | tools |",
        "|---|---|---|",
    ]
    by_tools = sorted(per_family, key=lambda n: (not _tools_of(templates, n), n))
    for name in by_tools:
        lines.append(f"| `{name}` | {per_family[name]} | "
                     f"{'yes' if _tools_of(templates, name) else 'no'} |")
    lines += ["", "| template | family | tools | reasoning | arguments |", "|---|---|---|---|---|"]
    for file, template in templates.items():
        family = template.family
        lines.append(
            f"| {file.removesuffix('.jinja')} | `{family.name}` | "
            f"{'yes' if family.tools else 'no'} | {_reasoning(template)} | "
            f"{'object' if family.arguments_as_object else 'JSON text'} |")
    return "\n".join(lines) + "\n"


def _tools_of(templates: dict[str, ChatTemplate], name: str) -> bool:
    return any(t.family.tools for t in templates.values() if t.family.name == name)


def main() -> None:
    print(coverage_markdown(llama_templates_dir(user_dirs().cache)), end="")


if __name__ == "__main__":
    main()

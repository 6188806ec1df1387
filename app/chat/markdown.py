"""Reply text → the HTML subset Qt's rich text engine draws (markdown-it-py + pygments).

Raw HTML in the text is escaped (the model's output is data, not markup). Fenced code blocks
become a tinted box with the language, a `copy:N` link (the view copies `code_blocks[N]`) and
pygments colours as inline styles, since Qt's rich text has no style sheets for classes.

Accepted draft tokens can be tinted: their character ranges are marked with two private-use
characters before parsing and replaced by `<span>`s after, so Markdown still renders around
them. Marks never cross a line, and a mark at a line's start moves past block syntax
(`# `, `- `, `> `) so headings and lists stay headings and lists.

    >>> r = MarkdownRenderer(LIGHT).render("Use `x`:\\n\\n```py\\nx = 1\\n```")
    >>> r.code_blocks
    ['x = 1\\n']
    >>> "copy:0" in r.html
    True
    >>> MarkdownRenderer(LIGHT).render("line one\\nline two").html
    '<p>line one<br />\\nline two</p>\\n'
"""

from __future__ import annotations

import contextlib
import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

from app.theme import LIGHT, Palette

DRAFT_START = "\ue000"
DRAFT_END = "\ue001"
_BLOCK_SYNTAX = re.compile(r"[ \t]*(?:#{1,6} |[-*+] |\d+[.)] |> |```\w*|\|)*")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
SEGMENT_CHARS = 1500
__all__ = ["LIGHT", "MarkdownRenderer", "Rendered", "json_block", "mark_drafts", "segment_bounds"]


def segment_bounds(text: str, size: int = SEGMENT_CHARS) -> list[int]:
    """Where to cut `text` into separately rendered segments: at blank lines outside fenced
    code, once a segment has `size` characters. A cut depends only on the text before it, so
    as a reply grows its earlier segments never change and only the last is re-rendered.

    >>> text = "a" * 10 + "\\n\\n```\\nx\\n\\ny\\n```\\n\\nb"
    >>> segment_bounds(text, size=5)
    [0, 12, 26, 27]
    """
    bounds = [0]
    fence: str | None = None
    pos = 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        match = _FENCE.match(line)
        if match:
            marker = match.group(1)
            if fence is None:
                fence = marker[0] * len(marker)
            elif marker.startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
        elif fence is None and not line.strip() and pos - bounds[-1] >= size:
            bounds.append(pos)
    if bounds[-1] != len(text) or len(bounds) == 1:
        bounds.append(len(text))
    return bounds


def json_block(text: str) -> str | None:
    """A reply that is JSON as a whole (an object or an array, as structured output gives)
    as a fenced `json` block, pretty-printed; None for any other text. The fence is longer
    than any run of backticks inside, so a string value holding one cannot close it.

    >>> print(json_block('{"name": "Ada", "tags": ["x"]}'))
    ```json
    {
      "name": "Ada",
      "tags": [
        "x"
      ]
    }
    ```
    >>> json_block('"just a string"') is None, json_block('{"half": ') is None
    (True, True)
    """
    stripped = text.strip()
    if not stripped or (stripped[0], stripped[-1]) not in (("{", "}"), ("[", "]")):
        return None  # cheap refusal: a streaming reply is asked about at every repaint
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    if not isinstance(value, dict | list):
        return None
    pretty = json.dumps(value, indent=2, ensure_ascii=False)
    longest = max((len(run) for run in re.findall(r"`+", pretty)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}json\n{pretty}\n{fence}"


@dataclass(frozen=True)
class Rendered:
    html: str
    code_blocks: list[str]


def mark_drafts(text: str, spans: Sequence[Sequence[int]]) -> str:
    """Wrap each [start, end) span in draft marks, line by line.

    >>> mark_drafts("ab\\ncd", [[1, 4]]).replace(DRAFT_START, "<").replace(DRAFT_END, ">")
    'a<b>\\n<c>d'
    >>> mark_drafts("# Title", [[0, 7]]).replace(DRAFT_START, "<").replace(DRAFT_END, ">")
    '# <Title>'
    """
    out: list[str] = []
    pos = 0
    for start, end in sorted((max(0, s), min(len(text), e)) for s, e in spans):
        if start >= end or start < pos:
            continue
        out.append(text[pos:start])
        for i, line in enumerate(text[start:end].split("\n")):
            if i:
                out.append("\n")
            at_line_start = i > 0 or start == 0 or text[start - 1] == "\n"
            skip = _BLOCK_SYNTAX.match(line).end() if at_line_start else 0  # type: ignore[union-attr]
            if skip < len(line):
                out.append(line[:skip] + DRAFT_START + line[skip:] + DRAFT_END)
            else:
                out.append(line)
        pos = end
    out.append(text[pos:])
    return "".join(out)


COMMON_LANGUAGES = ("python", "bash", "javascript", "typescript", "json", "c", "cpp", "rust",
                    "go", "java", "sql", "html", "yaml", "toml")


def warm_up() -> None:
    """Import the lexers of common languages (pygments loads each on first use, tens of ms
    apiece). Run on the background thread at start-up, so the first code block of a reply
    does not stall the window."""
    for language in COMMON_LANGUAGES:
        with contextlib.suppress(ClassNotFound):
            get_lexer_by_name(language)


class MarkdownRenderer:
    """Renders Markdown for one palette; make a new one when the theme changes."""

    def __init__(self, palette: Palette) -> None:
        self.palette = palette
        # breaks: a line break the user typed (Shift+Enter) or the model wrote stays one, as
        # in every chat app; CommonMark alone would join the lines into one paragraph.
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True})
        self._md.enable(["table", "strikethrough"])
        # markdown-it binds rules to its renderer (first argument), so pass a plain function.
        def fence(_renderer: object, tokens: list, idx: int, _options: object, _env: object) -> str:
            return self._render_fence(tokens[idx])

        self._md.add_render_rule("fence", fence)
        self._md.add_render_rule("code_block", fence)
        self._formatter = HtmlFormatter(noclasses=True, nowrap=True, style=palette.code_style)
        self._blocks: list[str] = []
        self._first_block = 0
        p = palette
        self._inline_code = (f'<code style="background-color:{p.code_bg}; '
                             f'font-family:monospace;">')
        self._draft_open = f'<span style="background-color:{p.draft_bg};">'

    def render(self, text: str, draft_spans: Sequence[Sequence[int]] | None = None,
               first_block: int = 0) -> Rendered:
        """HTML for `text`; code blocks link as `copy:N` counting from `first_block`."""
        self._blocks = []
        self._first_block = first_block
        source = mark_drafts(text, draft_spans) if draft_spans else text
        body = self._md.render(source)
        body = body.replace("<code>", self._inline_code)
        body = body.replace(DRAFT_START, self._draft_open).replace(DRAFT_END, "</span>")
        blocks, self._blocks = self._blocks, []
        return Rendered(body, blocks)

    def _render_fence(self, token: Token) -> str:
        raw = token.content
        code = raw.replace(DRAFT_START, "").replace(DRAFT_END, "")
        language = (token.info or "").strip().split(" ")[0].replace(DRAFT_START, "")
        language = language.replace(DRAFT_END, "")
        index = self._first_block + len(self._blocks)
        self._blocks.append(code)
        if raw != code:  # draft tint wins over syntax colours inside the block
            inner = html.escape(raw).replace(DRAFT_START, self._draft_open)
            inner = inner.replace(DRAFT_END, "</span>")
        else:
            inner = highlight(code, self._lexer(language), self._formatter)
        p = self.palette
        label = html.escape(language or "code")
        return (
            f'<table width="100%" cellspacing="0" cellpadding="8" '
            f'style="background-color:{p.code_bg}; margin-top:6px; margin-bottom:6px;">'
            f'<tr><td style="background-color:{p.code_header}; color:{p.muted};">{label}</td>'
            f'<td align="right" style="background-color:{p.code_header};">'
            f'<a href="copy:{index}" style="color:{p.accent}; text-decoration:none;">Copy</a>'
            f'</td></tr><tr><td colspan="2"><pre style="white-space:pre-wrap; '
            f'font-family:monospace; margin:0;">{inner.rstrip()}</pre></td></tr></table>\n'
        )

    @staticmethod
    def _lexer(language: str) -> TextLexer:
        if not language:
            return TextLexer()
        try:
            return get_lexer_by_name(language)
        except ClassNotFound:
            return TextLexer()

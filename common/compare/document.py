"""The report as a document: sections of a few kinds of blocks, written once and rendered twice, as report.md (for a
terminal or a code host) and as report.html (one self-contained page, its figures inline), in the same order.

A folded section is reference (the method, the reproduce commands, the tables behind the summary): HTML folds it in
`<details>`, markdown shows it as any other section.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Union


@dataclass(frozen=True)
class Paragraph:
    """Text with markdown's inline marks (**bold**, `code`, [links](url))."""

    text: str


@dataclass(frozen=True)
class Bullets:
    """A list; each item with inline marks, and maybe an indented second line (`notes`, same length or empty)."""

    items: List[str]
    notes: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Table:
    """A table of text cells; `kinds` gives a cell a class (same, differs, ...) that the page colours."""

    header: List[str]
    rows: List[List[str]]
    kinds: Optional[List[List[str]]] = None
    css_class: str = ""


@dataclass(frozen=True)
class Figure:
    """A figure file of the report's folder."""

    file: str
    alt: str


@dataclass(frozen=True)
class Code:
    """Preformatted text (commands, JSON)."""

    text: str
    language: str = ""


@dataclass(frozen=True)
class Quote:
    """A note set apart."""

    text: str


Block = Union[Paragraph, Bullets, Table, Figure, Code, Quote]


@dataclass(frozen=True)
class Section:
    """A titled part of the report; `folded` when it is reference; `level` 2 or 3."""

    title: str
    blocks: List[Block]
    folded: bool = False
    level: int = 2
    anchor: str = ""


# --- markdown ---------------------------------------------------------------------------------------------------
def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _md_block(block: Block) -> List[str]:
    if isinstance(block, Paragraph):
        return [block.text, ""]
    if isinstance(block, Bullets):
        out = []
        for i, item in enumerate(block.items):
            out.append(f"- {item}")
            if i < len(block.notes) and block.notes[i]:
                out.append(f"  {block.notes[i]}")
        return out + [""]
    if isinstance(block, Table):
        out = ["| " + " | ".join(_md_cell(h) for h in block.header) + " |",
               "|" + "|".join("---" for _ in block.header) + "|"]
        out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
        return out + [""]
    if isinstance(block, Figure):
        return [f"![{block.alt}]({block.file})", ""]
    if isinstance(block, Code):
        return [f"```{block.language}", block.text, "```", ""]
    return [f"> {block.text}", ""]


def markdown(title: str, sections: Sequence[Section]) -> str:
    """report.md."""
    out = [f"# {title}", ""]
    for section in sections:
        out += [f"{'#' * section.level} {section.title}", ""]
        for block in section.blocks:
            out += _md_block(block)
    return "\n".join(out).rstrip() + "\n"


# --- HTML -------------------------------------------------------------------------------------------------------
INLINE = [(re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"), (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
          (re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)"), r'<a href="\2">\1</a>'), (re.compile(r"<br>"), "<br>")]


def inline(text: str) -> str:
    """Markdown's inline marks as HTML, everything else escaped."""
    out = html.escape(text, quote=False).replace("&lt;br&gt;", "<br>")
    for pattern, replacement in INLINE:
        out = pattern.sub(replacement, out)
    return out


def _image(folder: Path, file: str) -> str:
    """A figure as a data: URL (the page stands alone); its file's name when it is missing."""
    path = folder / file
    if not path.is_file():
        return html.escape(file)
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _html_block(block: Block, folder: Path) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{inline(block.text)}</p>"
    if isinstance(block, Bullets):
        items = []
        for i, item in enumerate(block.items):
            note = block.notes[i] if i < len(block.notes) else ""
            items.append(f"<li>{inline(item)}" + (f"<br><span class=\"note\">{inline(note)}</span>" if note else "")
                         + "</li>")
        return "<ul>" + "".join(items) + "</ul>"
    if isinstance(block, Table):
        head = "".join(f"<th>{inline(h)}</th>" for h in block.header)
        body = []
        for r, row in enumerate(block.rows):
            cells = []
            for c, text in enumerate(row):
                kind = block.kinds[r][c] if block.kinds and block.kinds[r][c] else ""
                cls = f' class="{html.escape(kind.replace(" ", "-"))}"' if kind else ""
                tag = "th" if c == 0 and block.css_class == "summary" else "td"
                cells.append(f"<{tag}{cls}>{inline(text)}</{tag}>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        cls = f' class="{block.css_class}"' if block.css_class else ""
        return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    if isinstance(block, Figure):
        return (f'<figure><img src="{_image(folder, block.file)}" alt="{html.escape(block.alt)}">'
                f"<figcaption>{html.escape(block.alt)} ({html.escape(block.file)})</figcaption></figure>")
    if isinstance(block, Code):
        return f"<pre><code>{html.escape(block.text)}</code></pre>"
    return f"<blockquote>{inline(block.text)}</blockquote>"


STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 24px; color: #1b1f24;
       max-width: 1360px; }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 17px; margin: 18px 0 6px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
thead th { background: #f6f8fa; }
table.summary td, table.summary th { font-size: 14px; }
td.same { background: #e6f4ea; } td.differs { background: #fde7e4; } td.apart { background: #fff4d6; }
td.cannot-judge { background: #ececec; } td.announced { background: #e8f0fe; }
p.line { margin: 4px 0; }
figure { margin: 8px 0; } figure img { max-width: 100%; } figcaption { font-size: 12px; color: #57606a; }
details { margin: 6px 0; } details > summary { cursor: pointer; font-weight: 600; font-size: 15px; }
code, pre { font: 12px ui-monospace, monospace; } pre { background: #f6f8fa; padding: 8px; overflow-x: auto; }
.note { color: #57606a; font-size: 13px; } blockquote { color: #57606a; margin: 6px 0 6px 12px; }
"""


def render_html(title: str, sections: Sequence[Section], folder: Path) -> str:
    """report.html: one page, its figures inline, reference sections folded."""
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    for section in sections:
        anchor = f' id="{section.anchor}"' if section.anchor else ""
        body = "".join(_html_block(block, folder) for block in section.blocks)
        if section.folded:
            parts.append(f"<details{anchor}><summary>{html.escape(section.title)}</summary>{body}</details>")
        else:
            parts.append(f"<section{anchor}><h{section.level}>{html.escape(section.title)}</h{section.level}>"
                         f"{body}</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def from_markdown(lines: Sequence[str]) -> List[Section]:
    """Sections of blocks from markdown lines of the few kinds the report's parts write (## headings, tables, figure
    lines, bullets, paragraphs): the benchmark section, written as markdown by common.compare.benchmarks."""
    sections: List[Section] = []
    title = ""
    blocks: List[Block] = []
    table_lines: List[str] = []

    def flush_table() -> None:
        if table_lines:
            cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table_lines]
            blocks.append(Table(cells[0], [row for row in cells[2:]]))
            table_lines.clear()

    for line in "\n".join(lines).splitlines() + ["## "]:
        if line.startswith("|"):
            table_lines.append(line)
            continue
        flush_table()
        if line.startswith("#"):
            if title or blocks:
                sections.append(Section(title, list(blocks), level=3 if title.startswith("#") else 2))
            title, blocks = line.lstrip("#").strip(), []
        elif line.startswith("!["):
            found = re.match(r"!\[([^\]]*)\]\(([^)]+)\)", line)
            if found:
                blocks.append(Figure(found.group(2), found.group(1)))
        elif line.startswith("- "):
            blocks.append(Bullets([line[2:]]))
        elif line.strip():
            blocks.append(Paragraph(line))
    return [s for s in sections if s.title or s.blocks]

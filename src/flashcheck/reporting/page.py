"""A report as a page description, rendered once as Markdown and once as self-contained HTML (figures inlined
as base64), written atomically beside summary.json."""

from __future__ import annotations

import base64
import html
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from flashcheck.core.fileio import make_folder, read_plain, write_atomic

VERDICT_WORDS = {True: "holds", False: "does not hold", None: "not measured", "inconclusive": "inconclusive"}
_VERDICT_CLASS = {
    True: "holds",
    False: "fails",
    None: "none",
    "inconclusive": "none",
    "holds": "holds",
    "does not hold": "fails",
    "structural": "structural",
}


def verdict_word(holds: bool | str | None) -> str:
    """holds / does not hold / inconclusive / not measured."""
    return VERDICT_WORDS.get(holds, str(holds))


@dataclass(frozen=True, slots=True)
class Heading:
    """anchor: an id other blocks link to (Sentences)."""

    text: str
    level: int = 2
    anchor: str = ""


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Bullets:
    """Items (bold label, verdict or None for a plain bullet, text)."""

    items: list[tuple[str, bool | str | None, str]]
    with_verdict: bool = True


@dataclass(frozen=True, slots=True)
class Sentences:
    """Plain sentences, each linking to the section (a Heading's anchor) that holds its evidence."""

    items: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Table:
    """Rows of cells: text, or a value shown through `cell` (yes / no / -, never Python's True / False / None)."""

    header: list[str]
    rows: list[list[str]]


def cell(value: object) -> str:
    """A table cell as a person reads it: yes / no for a flag, - for nothing, else its text."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@dataclass(frozen=True, slots=True)
class Figure:
    path: Path
    alt: str


@dataclass(slots=True)
class Page:
    """What a report says, in order; `title` is the H1; `banner`, when given, the line above it (a report of
    unfinished work says so first)."""

    title: str
    blocks: list = field(default_factory=list)
    banner: str | None = None

    def add(self, *blocks) -> Page:
        self.blocks.extend(blocks)
        return self


def _resolve(path: Path, folder: Path) -> Path:
    """A figure's absolute path: as given when absolute or found from the working folder, else inside `folder`."""
    path = Path(path)
    if path.is_absolute():
        return path
    return path.resolve() if path.exists() else (folder / path).resolve()


def _figure_file(path: Path, folder: Path) -> Path:
    """The figure's file as _resolve finds it, its own last component not resolved: a figure that is a link is
    refused by the reader (read_plain), not followed to its target."""
    path = Path(path)
    if path.is_absolute():
        return path
    return path if os.path.lexists(path) else Path(folder).resolve() / path


def _md_block(b, folder: Path) -> list[str]:
    if isinstance(b, Heading):
        anchor = [f'<a id="{b.anchor}"></a>', ""] if b.anchor else []
        return [*anchor, "#" * b.level + " " + b.text, ""]
    if isinstance(b, Sentences):
        return [*(f"- {text} ([{anchor}](#{anchor}))" for text, anchor in b.items), ""]
    if isinstance(b, Text):
        return [b.text, ""]
    if isinstance(b, Bullets):
        lines = []
        for label, verdict, text in b.items:
            mark = f" — {verdict_word(verdict)}" if b.with_verdict else ""
            lines.append(f"- **{label}**{mark}: {text}" if label else f"- {text}")
        return [*lines, ""]
    if isinstance(b, Table):
        rows = ["| " + " | ".join(b.header) + " |", "|" + "---|" * len(b.header)]
        cells = ("| " + " | ".join(cell(c).replace("|", "\\|") for c in r) + " |" for r in b.rows)
        return [*rows, *cells, ""]
    if isinstance(b, Figure):
        path = _resolve(b.path, folder)
        rel = path.relative_to(folder) if path.is_relative_to(folder) else path
        return [f"![{b.alt}]({rel})", ""]
    raise TypeError(f"unknown block {b!r}")


def render_markdown(page: Page, folder: Path) -> str:
    folder = Path(folder).resolve()
    lines = ([f"**{page.banner}**", ""] if page.banner else []) + [f"# {page.title}", ""]
    for b in page.blocks:
        lines += _md_block(b, folder)
    return "\n".join(lines)


# The Markdown the reports' texts use inline, rendered in the HTML (they were shown raw: `flashcheck study`):
# `code`, **bold**, [text](link); everything else is escaped text.
_INLINE = re.compile(r"`([^`]+)`|\*\*(.+?)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")


def inline_html(text: str) -> str:
    """`text` as HTML: escaped, with inline code, bold and links of its Markdown rendered."""
    text, out, at = str(text), [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[at : m.start()]))
        code, bold, label, href = m.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<b>{inline_html(bold)}</b>")
        else:
            out.append(f"<a href='{html.escape(href)}'>{inline_html(label)}</a>")
        at = m.end()
    return "".join(out) + html.escape(text[at:])


def _html_block(b, folder: Path) -> str:
    esc = inline_html
    if isinstance(b, Heading):
        anchor = f" id='{html.escape(b.anchor)}'" if b.anchor else ""
        return f"<h{b.level}{anchor}>{esc(b.text)}</h{b.level}>"
    if isinstance(b, Sentences):
        items = (f"<li>{esc(t)} (<a href='#{html.escape(a)}'>{html.escape(a)}</a>)</li>" for t, a in b.items)
        return "<ul class='conclusion'>" + "".join(items) + "</ul>"
    if isinstance(b, Text):
        return f"<p>{esc(b.text)}</p>"
    if isinstance(b, Bullets):
        items = []
        for label, verdict, text in b.items:
            mark = (
                f" — <span class='{_VERDICT_CLASS.get(verdict, 'none')}'>{esc(verdict_word(verdict))}</span>"
                if b.with_verdict
                else ""
            )
            head = f"<b>{esc(label)}</b>{mark}: " if label else ""
            items.append(f"<li>{head}{esc(text)}</li>")
        return "<ul>" + "".join(items) + "</ul>"
    if isinstance(b, Table):
        head = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in b.header) + "</tr>"
        rows = "".join("<tr>" + "".join(f"<td>{esc(cell(c))}</td>" for c in r) + "</tr>" for r in b.rows)
        return f"<table>{head}{rows}</table>"
    if isinstance(b, Figure):
        data = base64.b64encode(read_plain(_figure_file(b.path, folder), "a figure the report embeds")).decode()
        return f"<img alt='{esc(b.alt)}' src='data:image/png;base64,{data}'>"
    raise TypeError(f"unknown block {b!r}")


_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
    "code{background:#f3f3f3;padding:0 .2em}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px}"
    ".partial{background:#fff3cd;border:1px solid #e0b000;padding:.5em 1em;font-weight:bold}"
    ".holds{color:#070}.fails{color:#b00}.none{color:#777}.structural{color:#05a}img{max-width:100%}"
)


def render_html(page: Page, folder: Path) -> str:
    folder = Path(folder).resolve()
    body = "\n".join(_html_block(b, folder) for b in page.blocks)
    banner = f"<p class='partial'>{inline_html(page.banner)}</p>" if page.banner else ""
    title = f"{page.banner} — {page.title}" if page.banner else page.title
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title.replace('`', ''))}</title>"
        f"<style>{_STYLE}</style></head><body>{banner}<h1>{inline_html(page.title)}</h1>\n{body}\n</body></html>"
    )


def write_report(folder: str | Path, page: Page, summary: dict | None = None) -> None:
    """Write report.md, report.html and (when given) summary.json into `folder`, each atomically."""
    folder = make_folder(folder)
    if summary is not None:
        write_atomic(folder / "summary.json", json.dumps(summary, indent=2))
    write_atomic(folder / "report.md", render_markdown(page, folder))
    write_atomic(folder / "report.html", render_html(page, folder))

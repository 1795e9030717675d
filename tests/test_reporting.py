"""reporting/: one page rendered as Markdown and self-contained HTML, from absolute or relative folders."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from flashcheck.reporting import Bullets, Figure, Heading, Page, Styler, Table, Text, write_report
from flashcheck.reporting.page import Sentences

PNG = b"\x89PNG\r\n\x1a\nfake"


@pytest.mark.parametrize("relative", [False, True])
def test_page_with_figures_from_a_relative_or_absolute_folder(tmp_path, monkeypatch, relative):
    """Regression: a relative --out (the default `flashcheck-study`) doubled the folder in figure paths."""
    monkeypatch.chdir(tmp_path)
    folder = Path("out") if relative else tmp_path / "out"
    (folder / "figures").mkdir(parents=True)
    (folder / "figures" / "a.png").write_bytes(PNG)
    page = Page("title").add(
        Heading("Verdicts"),
        Bullets([("claim_1", True, "measured 1.5x"), ("claim_2", "inconclusive", "n=2")]),
        Text("a | b"),
        Table(["x", "y"], [["1 | 2", "3"]]),
        Figure(folder / "figures" / "a.png", "a"),
    )
    write_report(folder, page, {"ok": True})
    md = (folder / "report.md").read_text()
    html = (folder / "report.html").read_text()
    assert "![a](figures/a.png)" in md and "| 1 \\| 2 | 3 |" in md
    assert "**claim_1** — holds" in md and "**claim_2** — inconclusive" in md
    assert base64.b64encode(PNG).decode() in html and "<span class='holds'>holds</span>" in html
    assert json.loads((folder / "summary.json").read_text()) == {"ok": True}
    assert oct((folder / "report.html").stat().st_mode & 0o777) == "0o644"


def test_styler_never_reuses_a_colour_within_one_axes():
    style = Styler()
    colours = [style(f"s{i}")["color"] for i in range(12)]
    assert len(set(colours)) == 12 and style("s0") == style("s0")


def test_sentences_link_to_heading_anchors(tmp_path):
    from flashcheck.reporting.page import Sentences

    page = Page("t").add(
        Heading("Conclusion"),
        Sentences([("Flash is within 5% & fine.", "seq_len")]),
        Bullets([("br", "structural", "fixed"), ("g", "does not hold", "no")]),
        Heading("seq_len", anchor="seq_len"),
    )
    write_report(tmp_path, page)
    md, html = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert "- Flash is within 5% & fine. ([seq_len](#seq_len))" in md and '<a id="seq_len"></a>\n\n## seq_len' in md
    assert "<li>Flash is within 5% &amp; fine. (<a href='#seq_len'>seq_len</a>)</li>" in html
    assert "<h2 id='seq_len'>seq_len</h2>" in html
    assert "<span class='structural'>structural</span>" in html and "<span class='fails'>does not hold</span>" in html


def test_the_html_renders_the_texts_inline_markdown(tmp_path):
    """Backticks showed literally in report.html: inline code, bold and links of every block are rendered (and
    the rest escaped), the Markdown keeps them as written."""
    said = "run `flashcheck study --preset modern` on <2 GPUs> for **all** of them ([how](#cost))"
    page = Page("t `x`").add(
        Heading("`study`"), Text(said), Bullets([("id", "holds", said)]), Table(["`a`"], [[said]]),
        Sentences([(said, "cost")]),
    )  # fmt: skip
    write_report(tmp_path, page)
    md, html = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert md.count(said) == 4 and md.count("`study`") == 1  # as written in each block
    shown = (
        "run <code>flashcheck study --preset modern</code> on &lt;2 GPUs&gt; for <b>all</b> of them "
        "(<a href='#cost'>how</a>)"
    )
    assert html.count(shown) == 4 and "<h2><code>study</code></h2>" in html and "<th><code>a</code></th>" in html
    assert "`" not in html and "<h1>t <code>x</code></h1>" in html


def test_table_cells_never_show_python_literals(tmp_path):
    """A flag is yes / no and nothing is '-' in both renderings (serving's tables printed True / False / None)."""
    write_report(tmp_path, Page("t").add(Table(["a", "b", "c", "d"], [[True, False, None, 3]])))
    md, html = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert "| yes | no | - | 3 |" in md and "<td>yes</td><td>no</td><td>-</td><td>3</td>" in html

"""Reports for every capability: a page description (headings, text, verdicts, tables, figures) written as
Markdown and self-contained HTML beside summary.json, and figure helpers with one colour/marker scheme."""

from flashcheck.reporting.figures import Styler, figure, label_axes, matplotlib_available
from flashcheck.reporting.page import Bullets, Figure, Heading, Page, Table, Text, verdict_word, write_report

__all__ = [
    "Bullets",
    "Figure",
    "Heading",
    "Page",
    "Styler",
    "Table",
    "Text",
    "figure",
    "label_axes",
    "matplotlib_available",
    "verdict_word",
    "write_report",
]

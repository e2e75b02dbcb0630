"""The registry as a Markdown table, the form ``docs/deprecations.md`` embeds."""

from __future__ import annotations

import re

from .records import RECORDS, DeprecationRecord, format_platforms

__all__ = ["markdown_table"]


_MD_CODE_RE = re.compile(r"(?<![\w`])(?:__\w+|BNNS[\w.]*\w\*?)")


def _md_text(text: str) -> str:
    """Escape a table cell and set BNNS identifiers and attributes in code spans."""
    return _MD_CODE_RE.sub(lambda match: f"`{match.group()}`", text.replace("|", "\\|"))


def _md_row(record: DeprecationRecord) -> str:
    """Render one record as a Markdown table row."""
    status = f"{record.status} (inferred)" if record.inferred else record.status
    cells = [
        f"`{record.name}`",
        record.kind,
        status,
        format_platforms(record.introduced),
        format_platforms(record.deprecated),
        _md_text(record.apple_replacement),
        f"`{record.bnnsfw_replacement}`" if record.bnnsfw_replacement else "",
        _md_text(record.note),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown_table() -> str:
    """Render the whole registry as a Markdown table, in table order.

    ``docs/deprecations.md`` embeds this output between the markers
    ``<!-- registry-table:start -->`` and ``<!-- registry-table:end -->``; a test keeps the
    two identical.
    """
    columns = [
        "Name",
        "Kind",
        "Status",
        "Introduced",
        "Deprecated",
        "Apple replacement",
        "bnnsfw replacement",
        "Note",
    ]
    header = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(header + [_md_row(record) for record in RECORDS])

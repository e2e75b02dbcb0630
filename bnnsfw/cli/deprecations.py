"""``bnnsfw deprecations``: query Apple's BNNS deprecations and scan sources for deprecated names.

The registry itself is :mod:`bnnsfw.deprecation`; this module only reads arguments, calls
:func:`~bnnsfw.deprecation.lookup`, :func:`~bnnsfw.deprecation.entries` and
:func:`~bnnsfw.deprecation.scan`, and prints their answers as text or JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..deprecation import (
    KINDS,
    MAX_FILE_BYTES,
    SKIPPED_DIRECTORIES,
    STATUSES,
    DeprecationRecord,
    Finding,
    entries,
    lookup,
    printable,
    scan,
)
from ..deprecation.records import MIGRATION
from ..errors import UnknownNameError

__all__ = ["main"]


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-align columns of text; the last column is not padded."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[-1]]).rstrip()
        for row in rows
    ]


def _findings_report(findings: Sequence[Finding]) -> list[str]:
    """Return the text table of findings and its summary line."""
    if not findings:
        return ["No deprecated or renamed BNNS names found."]
    lines = _aligned([(f.location, f.name, f.replacement) for f in findings])
    files = len({f.path for f in findings})  # locations are printed with printable() paths
    by_status = ", ".join(
        f"{sum(f.status == status for f in findings)} {status}"
        for status in STATUSES
        if any(f.status == status for f in findings)
    )
    noun = "finding" if len(findings) == 1 else "findings"
    file_noun = "file" if files == 1 else "files"
    migration = [f"Where Apple points to BNNSGraph: {MIGRATION}."] if any(
        "BNNSGraph" in f.replacement for f in findings) else []
    return [*lines, "", *migration, f"{len(findings)} {noun} ({by_status}) in {files} {file_noun}."]


def _list_report(records: Sequence[DeprecationRecord]) -> list[str]:
    """Return one aligned line per record: name, kind, status, deprecation, replacement."""
    return _aligned(
        [
            (
                record.name,
                record.kind,
                record.status,
                record.since().removeprefix("since ") or "-",
                record.replacement_text() if record.status != "available" else "",
            )
            for record in records
        ]
    )


def _parser() -> argparse.ArgumentParser:
    """Build the ``bnnsfw deprecations`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="bnnsfw deprecations",
        description="Query Apple's BNNS deprecations and scan sources for deprecated names.",
        epilog="Exit status: 0 success, 1 findings with --check, 2 usage error or unknown name.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="BNNS names to describe")
    parser.add_argument("--scan", nargs="+", metavar="PATH", help="files or directories to scan")
    parser.add_argument(
        "--check", action="store_true", help="with --scan: exit 1 when anything is found"
    )
    parser.add_argument(
        "--all-dirs", action="store_true",
        help="with --scan: also walk " + ", ".join(sorted(SKIPPED_DIRECTORIES)) + " and virtual environments",
    )
    parser.add_argument(
        "--max-bytes", type=int, default=MAX_FILE_BYTES, metavar="N",
        help=f"with --scan: skip files larger than N bytes (default {MAX_FILE_BYTES})",
    )
    parser.add_argument(
        "--list", action="store_true", help="list every registry entry, one per line"
    )
    parser.add_argument("--status", choices=STATUSES, help="with --list: keep only this status")
    parser.add_argument("--kind", choices=KINDS, help="with --list: keep only this kind")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse option combinations that have no meaning (argparse exits with status 2)."""
    modes = [bool(args.names), args.scan is not None, args.list]
    if sum(modes) != 1:
        parser.error("give exactly one of: NAME..., --scan PATH..., --list")
    if (args.check or args.all_dirs or args.max_bytes != MAX_FILE_BYTES) and args.scan is None:
        parser.error("--check, --all-dirs and --max-bytes need --scan")
    if args.max_bytes < 0:
        parser.error("--max-bytes must be an integer >= 0")
    if (args.status or args.kind) and not args.list:
        parser.error("--status and --kind need --list")


def _print_json(data: object) -> None:
    """Print ``data`` as indented JSON on stdout."""
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _run_describe(names: Sequence[str], as_json: bool) -> int:
    """Describe each name; unknown names are reported on stderr and give status 2."""
    records: list[DeprecationRecord] = []
    status = 0
    for name in names:
        try:
            records.append(lookup(name))
        except UnknownNameError as error:
            print(f"bnnsfw deprecations: {error}", file=sys.stderr)
            status = 2
    if as_json:
        _print_json([record.to_dict() for record in records])
    else:
        print("\n\n".join(record.describe() for record in records))
    return status


def _run_scan(paths: Sequence[str], as_json: bool, check: bool, all_dirs: bool = False,
              max_bytes: int = MAX_FILE_BYTES) -> int:
    """Scan ``paths`` and print the findings; each file skipped is reported on stderr.

    Paths are printed with control characters escaped (:func:`printable`); the JSON output
    is ASCII, so that a file name cannot reach the terminal as control codes either way.
    """
    def skipped(path: str, reason: str) -> None:
        print(f"bnnsfw deprecations: skipped {printable(path)}: {reason}", file=sys.stderr)

    try:
        findings = scan(paths, max_bytes=max_bytes, skip_dirs=() if all_dirs else SKIPPED_DIRECTORIES,
                        on_skip=skipped)
    except FileNotFoundError as error:
        print(f"bnnsfw deprecations: {printable(str(error))}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps([finding.to_dict() for finding in findings], indent=2, ensure_ascii=True))
    else:
        print("\n".join(_findings_report(findings)))
    return 1 if check and findings else 0


def _run_list(status: str | None, kind: str | None, as_json: bool) -> int:
    """Print every entry (optionally filtered)."""
    records = entries(status=status, kind=kind)
    if as_json:
        _print_json([record.to_dict() for record in records])
    else:
        print("\n".join(_list_report(records)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bnnsfw deprecations`` and return its exit status.

    ``NAME...`` describes names; ``--scan PATH...`` reports deprecated names in sources
    (``--check`` turns findings into exit status 1); ``--list`` prints every entry,
    filtered by ``--status`` / ``--kind``. ``--json`` switches any of them to JSON.
    Usage errors and unknown names give exit status 2.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        _check_arguments(parser, args)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.scan is not None:
        return _run_scan(args.scan, args.json, args.check, args.all_dirs, args.max_bytes)
    if args.list:
        return _run_list(args.status, args.kind, args.json)
    return _run_describe(args.names, args.json)

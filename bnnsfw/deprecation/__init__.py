"""The BNNS deprecation registry: what Apple deprecated, when, and what replaces it.

Apple deprecated the BNNS layer ("filter") API in two waves: the classic creation functions
and structures in macOS 11 / iOS 14, and everything filter-based in macOS 15 / iOS 18 in
favour of the BNNSGraph API. This package holds those facts as one registry, read by every
part of bnnsfw that needs them, one job per module:

- :mod:`~bnnsfw.deprecation.records`: :class:`DeprecationRecord` and the registry's data
  (one line per name in :mod:`bnnsfw.deprecation._table`), parsed into records at import;
- :mod:`~bnnsfw.deprecation.queries`: :func:`lookup`, :func:`entries` and
  :func:`is_deprecated` query it; :func:`warn_deprecated` emits the
  :class:`DeprecationWarning` that bnnsfw's BNNS-named functions raise, pointing at the
  caller's line;
- :mod:`~bnnsfw.deprecation.scanner`: :func:`scan` finds deprecated BNNS names in C,
  Objective-C, C++, Swift and Python sources;
- :mod:`~bnnsfw.deprecation.rendering`: :func:`markdown_table` renders the registry for
  ``docs/deprecations.md``.

Every name below is importable from ``bnnsfw.deprecation`` itself. The ``bnnsfw
deprecations`` command is :mod:`bnnsfw.cli.deprecations`.
"""

from __future__ import annotations

from .queries import entries, is_deprecated, lookup, warn_deprecated
from .records import KINDS, PLATFORMS, STATUSES, DeprecationRecord
from .rendering import markdown_table
from .scanner import MAX_FILE_BYTES, SKIPPED_DIRECTORIES, SOURCE_SUFFIXES, Finding, printable, scan

__all__ = [
    "PLATFORMS",
    "KINDS",
    "STATUSES",
    "SOURCE_SUFFIXES",
    "MAX_FILE_BYTES",
    "SKIPPED_DIRECTORIES",
    "DeprecationRecord",
    "Finding",
    "lookup",
    "entries",
    "is_deprecated",
    "warn_deprecated",
    "scan",
    "printable",
    "markdown_table",
]


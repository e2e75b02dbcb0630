"""The source scanner: uses of deprecated and renamed BNNS names in C, Objective-C, C++,
Swift and Python files.

:func:`scan` walks files and directories and returns one :class:`Finding` per use, matching
names as whole tokens with :func:`bnnsfw.deprecation.records.names_pattern`.
"""

from __future__ import annotations

import bisect
import errno
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Union

import attrs

from .records import BY_NAME, names_pattern

__all__ = ["SOURCE_SUFFIXES", "Finding", "scan"]

#: File suffixes :func:`scan` reads when it walks a directory.
SOURCE_SUFFIXES: frozenset[str] = frozenset(
    {".c", ".h", ".m", ".mm", ".swift", ".py", ".cpp", ".hpp", ".cc"}
)

#: ``renamed`` records are Swift renamings of C spellings, so they are reported in these only.
_RENAMED_SCOPE_SUFFIXES = frozenset({".swift"})

_PathArg = Union[str, "os.PathLike[str]"]


@attrs.frozen(kw_only=True)
class Finding:
    """One use of a deprecated or renamed BNNS name in a source file.

    Parameters
    ----------
    path : str
        The file, as reached from the path given to :func:`scan`.
    line, column : int
        1-based position of the name's first character (columns count characters).
    name : str
        The registry name found.
    status : str
        ``"deprecated"`` or ``"renamed"``.
    replacement : str
        Apple's replacement and bnnsfw's, as in :meth:`DeprecationRecord.replacement_text`.
    """

    path: str
    line: int
    column: int
    name: str
    status: str
    replacement: str

    @property
    def location(self) -> str:
        """Return ``path:line:column``, the form editors and compilers use."""
        return f"{self.path}:{self.line}:{self.column}"

    def to_dict(self) -> dict[str, Any]:
        """Return the finding as plain JSON-ready data."""
        return attrs.asdict(self)


def _as_path_list(paths: _PathArg | Iterable[_PathArg]) -> list[Path]:
    """Accept one path or many; a lone string is one path, not a sequence of characters."""
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(path) for path in paths]


def _source_files(root: Path) -> Iterator[Path]:
    """Yield ``root`` if it is a file, else its source files, recursively, sorted."""
    if not root.is_dir():
        yield root
        return
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        for file_name in sorted(files):
            if os.path.splitext(file_name)[1].lower() in SOURCE_SUFFIXES:
                yield Path(directory, file_name)


def _read_text(path: Path) -> str | None:
    """Return a file's text, or None for files that cannot be read or look binary."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8-sig", errors="replace")


def _scan_text(text: str, path: str, is_swift: bool) -> Iterator[Finding]:
    """Yield the findings in one file's text, in order."""
    hits = [(match.start(), BY_NAME[match.group()]) for match in names_pattern().finditer(text)]
    hits = [(start, record) for start, record in hits if is_swift or record.status != "renamed"]
    if not hits:
        return
    line_starts = [0] + [newline.end() for newline in re.finditer("\n", text)]
    for start, record in hits:
        line_index = bisect.bisect_right(line_starts, start) - 1
        yield Finding(
            path=path,
            line=line_index + 1,
            column=start - line_starts[line_index] + 1,
            name=record.name,
            status=record.status,
            replacement=record.replacement_text(),
        )


def scan(paths: _PathArg | Iterable[_PathArg]) -> list[Finding]:
    """Find uses of deprecated and renamed BNNS names in source files.

    Parameters
    ----------
    paths : path or iterable of paths
        Files and directories. Directories are walked recursively for files whose suffix
        is in :data:`SOURCE_SUFFIXES`; a file named explicitly is read whatever its suffix.

    Returns
    -------
    list of Finding
        In the order of ``paths``, files sorted within each directory, then by position.
        Names are matched as whole tokens, comments and strings included. ``renamed``
        names are Swift renamings of C spellings and are reported in ``.swift`` files only.
        Files that cannot be read or contain NUL bytes are skipped.

    Raises
    ------
    FileNotFoundError
        One of ``paths`` does not exist (checked before anything is read).
    """
    roots = _as_path_list(paths)
    for root in roots:
        if not root.exists():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(root))
    findings: list[Finding] = []
    for root in roots:
        for path in _source_files(root):
            text = _read_text(path)
            if text is not None:
                is_swift = path.suffix.lower() in _RENAMED_SCOPE_SUFFIXES
                findings.extend(_scan_text(text, str(path), is_swift))
    return findings

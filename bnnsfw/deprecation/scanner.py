"""The source scanner: uses of deprecated and renamed BNNS names in C, Objective-C, C++,
Swift and Python files.

:func:`scan` walks files and directories and returns one :class:`Finding` per use, matching
names as whole tokens with :func:`bnnsfw.deprecation.records.names_pattern`.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Union

import attrs

from ..errors import InvalidParameterError, must_be
from .records import BY_NAME, names_pattern

__all__ = ["SOURCE_SUFFIXES", "MAX_FILE_BYTES", "SKIPPED_DIRECTORIES", "Finding", "scan", "printable"]

_log = logging.getLogger("bnnsfw")

#: Files larger than this many bytes (8 MiB) are skipped: source files are far smaller, and
#: a scan must not read a disk image or a log the size of memory.
MAX_FILE_BYTES = 8 * 1024 * 1024

#: Directory names :func:`scan` does not walk into by default: version control, Python and
#: build caches, build output (a leftover ``build/lib`` would report every file twice).
SKIPPED_DIRECTORIES: frozenset[str] = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis",
    ".tox", ".nox", ".eggs", "*.egg-info", "build", "dist", "_build", "DerivedData", ".build",
    "node_modules", ".venv", "venv",
})

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
        """Return ``path:line:column``, the form editors and compilers use (non-printable
        characters of the path escaped, see :func:`printable`)."""
        return f"{printable(self.path)}:{self.line}:{self.column}"

    def to_dict(self) -> dict[str, Any]:
        """Return the finding as plain JSON-ready data."""
        return attrs.asdict(self)


def _as_path_list(paths: _PathArg | Iterable[_PathArg]) -> list[Path]:
    """Accept one path or many; a lone string is one path, not a sequence of characters."""
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(path) for path in paths]


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``, ``\\udcff``).

    File names may hold control characters (a terminal would obey them) and, when they are
    not valid UTF-8, lone surrogates (which cannot be printed at all); the scanner's reports
    show them escaped, as ``repr`` would, so the name stays readable and unambiguous enough to
    find the file.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _skipped_directory(directory: Path, name: str, skip_dirs: frozenset[str]) -> bool:
    """True for the directories :func:`scan` leaves out: ``skip_dirs`` by name, and virtual
    environments (recognised by their ``pyvenv.cfg``)."""
    if name in skip_dirs or (name.endswith(".egg-info") and "*.egg-info" in skip_dirs):
        return True
    return bool(skip_dirs) and os.path.isfile(os.path.join(directory, name, "pyvenv.cfg"))


def _inside(path: Path, root: Path) -> bool:
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(root))
    except ValueError:
        return False
    return True


def _source_files(root: Path, skip_dirs: frozenset[str], skipped: Callable[[Path, str], None],
                  ) -> Iterator[Path]:
    """Yield ``root`` if it is not a directory, else its source files, recursively, sorted.

    Directory symlinks are not followed; a file symlink is read only when its target lies
    inside ``root``.
    """
    if not root.is_dir():
        yield root
        return
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories
                                   if not _skipped_directory(Path(directory), d, skip_dirs))
        for file_name in sorted(files):
            if os.path.splitext(file_name)[1].lower() not in SOURCE_SUFFIXES:
                continue
            path = Path(directory, file_name)
            if path.is_symlink() and not _inside(path, root):
                skipped(path, "a symbolic link to a file outside the scanned directory")
                continue
            yield path


def _read_text(path: Path, max_bytes: int, skipped: Callable[[Path, str], None]) -> str | None:
    """A regular file's text, or None (reported through ``skipped``) for anything else: a
    device, a FIFO or a socket (never opened for reading, so nothing blocks or streams
    forever), a file larger than ``max_bytes``, one that cannot be read, or one with NUL bytes."""
    try:
        info = os.stat(path)
    except OSError as error:
        skipped(path, f"cannot be read ({error.strerror})")
        return None
    if not stat.S_ISREG(info.st_mode):
        skipped(path, "not a regular file")
        return None
    if info.st_size > max_bytes:
        skipped(path, f"larger than the {max_bytes}-byte limit ({info.st_size} bytes)")
        return None
    try:  # O_NONBLOCK: if the file was swapped for a FIFO since the check, opening cannot block
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as error:
        skipped(path, f"cannot be read ({error.strerror})")
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            skipped(path, "not a regular file")
            return None
        try:
            data = handle.read(max_bytes + 1)
        except OSError as error:
            skipped(path, f"cannot be read ({error.strerror})")
            return None
    if len(data) > max_bytes:
        skipped(path, f"larger than the {max_bytes}-byte limit")
        return None
    if b"\0" in data:
        skipped(path, "binary (contains NUL bytes)")
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


def _log_skip(path: Path, reason: str) -> None:
    _log.info("deprecation scan: skipped %s: %s", printable(str(path)), reason)


def scan(paths: _PathArg | Iterable[_PathArg], *, max_bytes: int = MAX_FILE_BYTES,
         skip_dirs: Iterable[str] = SKIPPED_DIRECTORIES,
         on_skip: Callable[[str, str], None] | None = None) -> list[Finding]:
    """Find uses of deprecated and renamed BNNS names in source files.

    Parameters
    ----------
    paths : path or iterable of paths
        Files and directories. Directories are walked recursively for files whose suffix
        is in :data:`SOURCE_SUFFIXES`; a file named explicitly is read whatever its suffix.
    max_bytes : int
        Files larger than this are skipped (:data:`MAX_FILE_BYTES`, 8 MiB, by default).
    skip_dirs : iterable of str
        Directory names not walked into (:data:`SKIPPED_DIRECTORIES` by default: version
        control, build output, caches); virtual environments (directories holding a
        ``pyvenv.cfg``) are skipped too unless ``skip_dirs`` is empty.
    on_skip : callable(path, reason), optional
        Called for every file skipped, with the path and the reason; by default the skip is
        logged on the ``bnnsfw`` logger (level INFO).

    Returns
    -------
    list of Finding
        In the order of ``paths``, files sorted within each directory, then by position.
        Names are matched as whole tokens, comments and strings included. ``renamed``
        names are Swift renamings of C spellings and are reported in ``.swift`` files only.

    Notes
    -----
    Only regular files are read: devices, FIFOs and sockets are skipped without being opened
    for reading (``/dev/zero`` would never end, a FIFO would block), and so are files above
    ``max_bytes``, files that cannot be read and files with NUL bytes. Directory symlinks are
    not followed, and a file symlink inside a walked directory is read only when its target
    lies inside that directory.

    Raises
    ------
    FileNotFoundError
        One of ``paths`` does not exist (checked before anything is read).
    InvalidParameterError
        ``max_bytes`` is not an integer >= 0.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise InvalidParameterError(must_be("scan(max_bytes)", "an integer >= 0", max_bytes))
    roots = _as_path_list(paths)
    for root in roots:
        if not os.path.lexists(root):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(root))
    report = _log_skip if on_skip is None else (lambda path, reason: on_skip(str(path), reason))
    excluded = frozenset(skip_dirs)
    findings: list[Finding] = []
    for root in roots:
        for path in _source_files(root, excluded, report):
            text = _read_text(path, max_bytes, report)
            if text is not None:
                is_swift = path.suffix.lower() in _RENAMED_SCOPE_SUFFIXES
                findings.extend(_scan_text(text, str(path), is_swift))
    return findings

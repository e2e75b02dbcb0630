"""The BNNS deprecation registry: what Apple deprecated, when, and what replaces it.

Apple deprecated the BNNS layer ("filter") API in two waves: the classic creation functions
and structures in macOS 11 / iOS 14, and everything filter-based in macOS 15 / iOS 18 in
favour of the BNNSGraph API. This module holds those facts as one registry, read by every
part of bnnsfw that needs them:

- :func:`lookup`, :func:`entries` and :func:`is_deprecated` query it;
- :func:`warn_deprecated` emits the :class:`DeprecationWarning` that bnnsfw's BNNS-named
  functions raise, pointing at the caller's line;
- :func:`scan` finds deprecated BNNS names in C, Objective-C, C++, Swift and Python sources;
- :func:`markdown_table` renders the registry for ``docs/deprecations.md``.

The data itself lives in :mod:`bnnsfw._deprecation_data`, one line per name.
"""

from __future__ import annotations

import bisect
import difflib
import errno
import functools
import os
import re
import types
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import attrs

from . import _deprecation_data
from .errors import InvalidParameterError, UnknownNameError, must_be

__all__ = [
    "PLATFORMS",
    "KINDS",
    "STATUSES",
    "SOURCE_SUFFIXES",
    "DeprecationRecord",
    "Finding",
    "lookup",
    "entries",
    "is_deprecated",
    "warn_deprecated",
    "scan",
    "markdown_table",
]

#: Platforms the registry knows, in the order versions are listed.
PLATFORMS: tuple[str, ...] = (
    "macOS",
    "iOS",
    "iPadOS",
    "Mac Catalyst",
    "tvOS",
    "watchOS",
    "visionOS",
)

#: What a registry name denotes.
KINDS: tuple[str, ...] = (
    "function",
    "struct",
    "typedef",
    "enum-value",
    "constant",
    "swift-class",
    "swift-enum",
    "swift-function",
    "swift-member",
    "swift-initializer",
    "swift-type",
)

#: The statuses a record can have: ``deprecated`` (marked for removal), ``renamed`` (Swift
#: spells the C name differently) and ``available`` (not deprecated).
STATUSES: tuple[str, ...] = ("deprecated", "renamed", "available")

#: File suffixes :func:`scan` reads when it walks a directory.
SOURCE_SUFFIXES: frozenset[str] = frozenset(
    {".c", ".h", ".m", ".mm", ".swift", ".py", ".cpp", ".hpp", ".cc"}
)

#: ``renamed`` records are Swift renamings of C spellings, so they are reported in these only.
_RENAMED_SCOPE_SUFFIXES = frozenset({".swift"})

_NAME_RE = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*")
_VERSION_RE = re.compile(r"\d+\.\d+(?:\.\d+)?")
_BNNSFW_PATH_RE = re.compile(r"bnnsfw(?:\.[A-Za-z_]\w*)+")

_PathArg = Union[str, "os.PathLike[str]"]


# --------------------------------------------------------------------------- records


def _platform_map(value: Mapping[str, str]) -> Mapping[str, str]:
    """Copy a platform→version mapping into a read-only one, keeping its order."""
    return types.MappingProxyType(dict(value))


def _check_platform_map(
    instance: object, attribute: attrs.Attribute, value: Mapping[str, str]
) -> None:
    """Reject unknown platforms and malformed versions."""
    where = f"DeprecationRecord.{attribute.name}"
    for platform, version in value.items():
        if platform not in PLATFORMS:
            rule = f"one of {PLATFORMS}"
            raise InvalidParameterError(must_be(f"{where} platform", rule, platform))
        if not isinstance(version, str) or not _VERSION_RE.fullmatch(version):
            rule = "a version like '15.0'"
            raise InvalidParameterError(must_be(f"{where}[{platform!r}]", rule, version))


def _check_one_of(choices: tuple[str, ...]) -> Any:
    """Build a validator accepting only ``choices``."""

    def check(instance: object, attribute: attrs.Attribute, value: object) -> None:
        if value not in choices:
            where = f"DeprecationRecord.{attribute.name}"
            raise InvalidParameterError(must_be(where, f"one of {choices}", value))

    return check


def _check_name(instance: object, attribute: attrs.Attribute, value: object) -> None:
    """Accept identifiers and dotted Swift names."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        rule = "an identifier or a dotted Swift name"
        raise InvalidParameterError(must_be("DeprecationRecord.name", rule, value))


def _check_bnnsfw_path(instance: object, attribute: attrs.Attribute, value: object) -> None:
    """Accept ``None`` or a dotted path inside the bnnsfw package."""
    if value is not None and not (isinstance(value, str) and _BNNSFW_PATH_RE.fullmatch(value)):
        rule = "None or a dotted path starting with 'bnnsfw.'"
        raise InvalidParameterError(must_be("DeprecationRecord.bnnsfw_replacement", rule, value))


def _format_platforms(versions: Mapping[str, str]) -> str:
    """Render ``{'macOS': '15.0', 'iOS': '18.0'}`` as ``'macOS 15.0, iOS 18.0'``."""
    return ", ".join(f"{platform} {version}" for platform, version in versions.items())


@attrs.frozen(kw_only=True)
class DeprecationRecord:
    """What the registry knows about one BNNS name.

    Parameters
    ----------
    name : str
        The C or Swift spelling, e.g. ``"BNNSFilterApply"`` or ``"BNNS.NormalizationLayer"``.
    kind : str
        One of :data:`KINDS`.
    introduced : Mapping[str, str]
        Platform → version the name first appeared in; empty when the facts do not say.
    deprecated : Mapping[str, str]
        Platform → version the deprecation (or Swift renaming) takes effect in, exactly for
        the platforms the facts give; empty for available names.
    apple_replacement : str
        What Apple says to use instead: a name (``"BNNSMatMul"``) or a sentence
        (``"Use BNNSGraph* APIs"``); empty when Apple names nothing.
    bnnsfw_replacement : str or None
        Dotted path of the bnnsfw API that does the same job, e.g. ``"bnnsfw.LSTMLayer.apply"``.
    status : str
        One of :data:`STATUSES`.
    inferred : bool
        True when some of these facts are inferred rather than stated by Apple.
    note : str
        Anything else worth knowing (documentation errors, attribute used, ...).
    """

    name: str = attrs.field(validator=_check_name)
    kind: str = attrs.field(validator=_check_one_of(KINDS))
    introduced: Mapping[str, str] = attrs.field(
        factory=dict, converter=_platform_map, validator=_check_platform_map, hash=False
    )
    deprecated: Mapping[str, str] = attrs.field(
        factory=dict, converter=_platform_map, validator=_check_platform_map, hash=False
    )
    apple_replacement: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    bnnsfw_replacement: str | None = attrs.field(default=None, validator=_check_bnnsfw_path)
    status: str = attrs.field(default="deprecated", validator=_check_one_of(STATUSES))
    inferred: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    note: str = attrs.field(default="", validator=attrs.validators.instance_of(str))

    def __attrs_post_init__(self) -> None:
        """Check the rules that tie the status to the other fields."""
        where = f"DeprecationRecord.deprecated of {self.name}"
        if self.status == "deprecated" and not self.deprecated:
            rule = "non-empty for a deprecated name"
            raise InvalidParameterError(must_be(where, rule, {}))
        if self.status == "available" and self.deprecated:
            rule = "empty for an available name"
            raise InvalidParameterError(must_be(where, rule, dict(self.deprecated)))
        if self.status == "renamed" and not self.apple_replacement:
            where = f"DeprecationRecord.apple_replacement of {self.name}"
            raise InvalidParameterError(must_be(where, "the new Swift name", ""))

    def replacement_text(self) -> str:
        """Return Apple's replacement and bnnsfw's, as one short line."""
        parts = [self.apple_replacement] if self.apple_replacement else []
        if self.bnnsfw_replacement:
            parts.append(f"bnnsfw: {self.bnnsfw_replacement}")
        return "; ".join(parts) if parts else "no replacement named"

    def since(self) -> str:
        """Return when the deprecation took effect, on the platforms users ask about first.

        Examples
        --------
        >>> lookup("BNNSFilterApply").since()
        'since macOS 15.0 and iOS 18.0'
        >>> lookup("BNNSCopy").since()
        ''
        """
        versions = self.deprecated
        first = [f"{p} {versions[p]}" for p in ("macOS", "iOS") if p in versions]
        others = [f"{p} {v}" for p, v in versions.items() if p not in ("macOS", "iOS")]
        if not versions:
            return ""
        return f"since {' and '.join(first or others)}" + (" (inferred)" if self.inferred else "")

    def describe(self) -> str:
        """Return a readable multi-line description of the record."""
        label = "renamed in Swift" if self.status == "renamed" else self.status
        lines = [f"{self.name} ({self.kind}): {label}"]

        def add(field: str, value: str) -> None:
            lines.append(f"  {field + ':':<20}{value}")

        add("introduced", _format_platforms(self.introduced) or "unknown")
        if self.status == "deprecated":
            add("deprecated", _format_platforms(self.deprecated))
        if self.status == "renamed":
            add("Swift name", self.apple_replacement)
        else:
            add("Apple replacement", self.apple_replacement or "none named")
        add("bnnsfw replacement", self.bnnsfw_replacement or "none")
        for successor in _deprecated_names_in(self.apple_replacement):
            if successor.name != self.name:
                add("caution", f"{successor.name} is itself deprecated {successor.since()}.")
        if self.note:
            add("note", self.note)
        if self.inferred:
            add("inferred", "yes: some of these facts are inferred, not stated by Apple.")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Return the record as plain JSON-ready data."""
        return {
            "name": self.name,
            "kind": self.kind,
            "introduced": dict(self.introduced),
            "deprecated": dict(self.deprecated),
            "apple_replacement": self.apple_replacement,
            "bnnsfw_replacement": self.bnnsfw_replacement,
            "status": self.status,
            "inferred": self.inferred,
            "note": self.note,
        }


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


# --------------------------------------------------------------------------- the table


def _expand(cell: str) -> str:
    """Return a table cell with ``-`` read as empty and aliases spelled out."""
    cell = _deprecation_data.ALIASES.get(cell, cell)
    return "" if cell == "-" else cell


def _parse_platforms(cell: str, where: str) -> dict[str, str]:
    """Parse ``'macOS 10.13, iOS 11.0'`` into ``{'macOS': '10.13', 'iOS': '11.0'}``."""
    versions: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in _expand(cell).split(","))):
        platform, _, version = item.rpartition(" ")
        if not platform:
            raise InvalidParameterError(must_be(where, "'<platform> <version>' pairs", item))
        versions[platform] = version
    return versions


_YES_NO = {"yes": True, "-": False}


def _parse_row(cells: list[str], note: str, where: str) -> DeprecationRecord:
    """Build one record from the eight cells of a table line and its note."""
    name, kind, status, inferred, introduced, deprecated, apple, bnnsfw_path = cells
    if inferred not in _YES_NO:
        raise InvalidParameterError(must_be(f"{where} inferred cell", "'yes' or '-'", inferred))
    return DeprecationRecord(
        name=name,
        kind=kind,
        status=status,
        inferred=_YES_NO[inferred],
        introduced=_parse_platforms(introduced, f"{where} introduced cell"),
        deprecated=_parse_platforms(deprecated, f"{where} deprecated cell"),
        apple_replacement=_expand(apple),
        bnnsfw_replacement=_expand(bnnsfw_path) or None,
        note=note,
    )


def _parse_table(text: str) -> tuple[DeprecationRecord, ...]:
    """Parse :data:`bnnsfw._deprecation_data.TABLE` (format in that module's docstring)."""
    rows: list[tuple[list[str], list[str], str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        where = f"_deprecation_data.TABLE line {number}"
        if not line or line.startswith("#"):
            continue
        if line.startswith("+"):
            if not rows:
                raise InvalidParameterError(must_be(where, "a note after a row", line))
            rows[-1][1].append(line[1:].strip())
            continue
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) != 8:
            raise InvalidParameterError(must_be(where, "8 cells separated by '|'", line))
        rows.append((cells, [], where))
    return tuple(_parse_row(cells, " ".join(note), where) for cells, note, where in rows)


_Index = dict[str, DeprecationRecord]


def _index(records: Sequence[DeprecationRecord]) -> tuple[_Index, _Index]:
    """Index records by exact and by case-folded name, refusing duplicates of either."""
    exact: _Index = {}
    folded: _Index = {}
    for record in records:
        key = record.name.casefold()
        if key in folded:
            clash = f"{folded[key].name} and {record.name}"
            raise InvalidParameterError(must_be("registry names", "unique, ignoring case", clash))
        exact[record.name] = folded[key] = record
    return exact, folded


_RECORDS: tuple[DeprecationRecord, ...] = _parse_table(_deprecation_data.TABLE)
_BY_NAME, _BY_FOLDED = _index(_RECORDS)


# --------------------------------------------------------------------------- queries


def lookup(name: str) -> DeprecationRecord:
    """Return the registry record for a BNNS name.

    Parameters
    ----------
    name : str
        A C or Swift spelling. An exact match wins; otherwise a match ignoring case is
        returned (``"bnnsfilterapply"`` finds ``BNNSFilterApply``).

    Returns
    -------
    DeprecationRecord

    Raises
    ------
    UnknownNameError
        The name is not in the registry; the message suggests close names.

    Examples
    --------
    >>> lookup("BNNSDirectApplyBroadcastMatMul").apple_replacement
    'BNNSMatMul (with BNNSMatMulWorkspaceSize)'
    >>> lookup("bnnscopy").status
    'available'
    """
    if not isinstance(name, str):
        raise UnknownNameError(must_be("name", "a str naming a BNNS API", name))
    record = _BY_NAME.get(name) or _BY_FOLDED.get(name.casefold())
    if record is None:
        message = must_be("name", "a BNNS name in the deprecation registry", name)
        raise UnknownNameError(message + _suggestion(name))
    return record


def _suggestion(name: str) -> str:
    """Return ' Did you mean ...?' for names close to ``name``, or a pointer to the list."""
    close = difflib.get_close_matches(name.casefold(), list(_BY_FOLDED), n=3, cutoff=0.6)
    if not close:
        return " Run `bnnsfw deprecations --list` to see every known name."
    names = [repr(_BY_FOLDED[key].name) for key in close]
    choices = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f" Did you mean {choices}?"


def entries(
    *, status: str | None = None, kind: str | None = None
) -> tuple[DeprecationRecord, ...]:
    """Return the registry's records in table order, optionally filtered.

    Parameters
    ----------
    status : str, optional
        Keep only records with this status (one of :data:`STATUSES`).
    kind : str, optional
        Keep only records of this kind (one of :data:`KINDS`).

    Examples
    --------
    >>> [record.name for record in entries(status="renamed")]
    ['BNNSActivationFunctionSigmoid', 'BNNSFlagsUseClientPtr']
    """
    if status is not None and status not in STATUSES:
        raise InvalidParameterError(must_be("status", f"None or one of {STATUSES}", status))
    if kind is not None and kind not in KINDS:
        raise InvalidParameterError(must_be("kind", f"None or one of {KINDS}", kind))
    return tuple(
        record
        for record in _RECORDS
        if (status is None or record.status == status) and (kind is None or record.kind == kind)
    )


def is_deprecated(name: str) -> bool:
    """Return True when Apple deprecated ``name`` (renamed and available names give False).

    Raises :class:`~bnnsfw.errors.UnknownNameError` for names the registry does not know.

    Examples
    --------
    >>> is_deprecated("BNNSFilterApply"), is_deprecated("BNNSCopy")
    (True, False)
    """
    return lookup(name).status == "deprecated"


# --------------------------------------------------------------------------- warnings


def _replacement_sentence(text: str) -> str:
    """Turn Apple's replacement into a sentence ("Use X instead." or Apple's own words)."""
    return f"{text}." if text.startswith("Use ") else f"Use {text} instead."


def _warning_message(record: DeprecationRecord) -> str:
    """Compose the DeprecationWarning text for a deprecated or renamed record."""
    if record.status == "renamed":
        message = f"{record.name} is renamed in Swift: use {record.apple_replacement}."
    else:
        message = f"{record.name} is deprecated {record.since()}."
        if record.apple_replacement:
            message += f" Apple: {_replacement_sentence(record.apple_replacement)}"
    if record.bnnsfw_replacement:
        message += f" bnnsfw: use {record.bnnsfw_replacement} instead."
    return message


def warn_deprecated(name: str, *, stacklevel: int = 2) -> None:
    """Emit the registry's :class:`DeprecationWarning` for a deprecated or renamed name.

    Parameters
    ----------
    name : str
        A registry name whose status is ``deprecated`` or ``renamed``.
    stacklevel : int, default 2
        As for :func:`warnings.warn`, counted from the caller of this function: 1 blames the
        line calling ``warn_deprecated``, 2 (the default) that function's caller. A BNNS-named
        function that calls this directly keeps the default, so the warning points at the
        user's line.

    Raises
    ------
    UnknownNameError
        ``name`` is not in the registry.
    InvalidParameterError
        ``name`` is available (not deprecated), or ``stacklevel`` is below 1.
    """
    record = lookup(name)
    if record.status == "available":
        raise InvalidParameterError(must_be("name", "a deprecated or renamed BNNS name", name))
    if not isinstance(stacklevel, int) or stacklevel < 1:
        raise InvalidParameterError(must_be("stacklevel", "an int >= 1", stacklevel))
    warnings.warn(_warning_message(record), DeprecationWarning, stacklevel=stacklevel + 1)


# --------------------------------------------------------------------------- scanning


@functools.cache
def _scan_pattern() -> re.Pattern[str]:
    """Compile one regex matching every deprecated or renamed name as a whole token.

    Longest names come first so that ``BNNSImageStackDescriptor.init`` wins over
    ``BNNSImageStackDescriptor``; the look-arounds keep ``BNNSFilterApply`` from matching
    inside ``BNNSFilterApplyBatch`` or ``MyBNNSFilterApply``. The prefix the names share
    (``BNNS``) leads the pattern as a literal, which lets the regex engine skip quickly to
    candidate positions; the look-behind after it checks the character before the name.
    """
    names = sorted(
        (record.name for record in _RECORDS if record.status != "available"),
        key=lambda name: (-len(name), name),
    )
    shared = os.path.commonprefix(names)
    prefix = re.escape(shared)
    alternatives = "|".join(re.escape(name[len(shared) :]) for name in names)
    return re.compile(rf"{prefix}(?<!\w{prefix})(?:{alternatives})(?!\w)")


def _deprecated_names_in(text: str) -> list[DeprecationRecord]:
    """Return the deprecated records named in a piece of text (e.g. a replacement)."""
    found = (_BY_NAME[match.group()] for match in _scan_pattern().finditer(text))
    return [record for record in found if record.status == "deprecated"]


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
    hits = [(match.start(), _BY_NAME[match.group()]) for match in _scan_pattern().finditer(text)]
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


# --------------------------------------------------------------------------- rendering


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
        _format_platforms(record.introduced),
        _format_platforms(record.deprecated),
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
    return "\n".join(header + [_md_row(record) for record in _RECORDS])


def __getattr__(name: str) -> Any:
    """``bnnsfw.deprecation.main``, the command line's old home, still runs the command.

    The command line lives in :mod:`bnnsfw.cli.deprecations`; it is imported only when this
    name is asked for, so the registry never loads the command line.
    """
    if name == "main":
        from .cli.deprecations import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

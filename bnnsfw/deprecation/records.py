"""Records of the deprecation registry, and the registry's data parsed into them.

:class:`DeprecationRecord` is what the registry knows about one BNNS name. The facts are
the table in :mod:`bnnsfw.deprecation._table`, parsed and validated once, at import, into
:data:`RECORDS` (table order) and the indexes :data:`BY_NAME` and :data:`BY_FOLDED_NAME`.
:func:`names_pattern` matches every deprecated or renamed name in a text; the scanner and
:meth:`DeprecationRecord.describe` use it.
"""

from __future__ import annotations

import functools
import os
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..errors import InvalidParameterError, must_be
from . import _table

__all__ = [
    "PLATFORMS",
    "KINDS",
    "STATUSES",
    "DeprecationRecord",
    "RECORDS",
    "BY_NAME",
    "BY_FOLDED_NAME",
    "format_platforms",
    "names_pattern",
    "deprecated_names_in",
]

#: Where a model goes when Apple's replacement is BNNSGraph, which runs compiled Core ML models.
MIGRATION = ("train in bnnsfw, then bnnsfw.coreml.export(layers, path) writes the Core ML ML Program "
             "that BNNSGraph compiles (bnnsfw.onnx.export for ONNX); see docs/migration.md")

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

_NAME_RE = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*")
_VERSION_RE = re.compile(r"\d+\.\d+(?:\.\d+)?")
_BNNSFW_PATH_RE = re.compile(r"bnnsfw(?:\.[A-Za-z_]\w*)+")


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


def format_platforms(versions: Mapping[str, str]) -> str:
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
        >>> BY_NAME["BNNSFilterApply"].since()
        'since macOS 15.0 and iOS 18.0'
        >>> BY_NAME["BNNSCopy"].since()
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

        add("introduced", format_platforms(self.introduced) or "unknown")
        if self.status == "deprecated":
            add("deprecated", format_platforms(self.deprecated))
        if self.status == "renamed":
            add("Swift name", self.apple_replacement)
        else:
            add("Apple replacement", self.apple_replacement or "none named")
        add("bnnsfw replacement", self.bnnsfw_replacement or "none")
        if "BNNSGraph" in self.apple_replacement and self.status == "deprecated":
            add("to BNNSGraph", MIGRATION)
        for successor in deprecated_names_in(self.apple_replacement):
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


def _expand(cell: str) -> str:
    """Return a table cell with ``-`` read as empty and aliases spelled out."""
    cell = _table.ALIASES.get(cell, cell)
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
    """Parse :data:`bnnsfw.deprecation._table.TABLE` (format in that module's docstring)."""
    rows: list[tuple[list[str], list[str], str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        where = f"bnnsfw.deprecation._table.TABLE line {number}"
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


_Index = Mapping[str, DeprecationRecord]


def _index(records: Sequence[DeprecationRecord]) -> tuple[_Index, _Index]:
    """Index records by exact and by case-folded name, refusing duplicates of either."""
    exact: dict[str, DeprecationRecord] = {}
    folded: dict[str, DeprecationRecord] = {}
    for record in records:
        key = record.name.casefold()
        if key in folded:
            clash = f"{folded[key].name} and {record.name}"
            raise InvalidParameterError(must_be("registry names", "unique, ignoring case", clash))
        exact[record.name] = folded[key] = record
    return types.MappingProxyType(exact), types.MappingProxyType(folded)


#: Every record, in table order.
RECORDS: tuple[DeprecationRecord, ...] = _parse_table(_table.TABLE)
#: The records by exact name, and by case-folded name (``name.casefold()``); read-only.
BY_NAME, BY_FOLDED_NAME = _index(RECORDS)


@functools.cache
def names_pattern() -> re.Pattern[str]:
    """Compile one regex matching every deprecated or renamed name as a whole token.

    Longest names come first so that ``BNNSImageStackDescriptor.init`` wins over
    ``BNNSImageStackDescriptor``; the look-arounds keep ``BNNSFilterApply`` from matching
    inside ``BNNSFilterApplyBatch`` or ``MyBNNSFilterApply``. The prefix the names share
    (``BNNS``) leads the pattern as a literal, which lets the regex engine skip quickly to
    candidate positions; the look-behind after it checks the character before the name.
    """
    names = sorted(
        (record.name for record in RECORDS if record.status != "available"),
        key=lambda name: (-len(name), name),
    )
    shared = os.path.commonprefix(names)
    prefix = re.escape(shared)
    alternatives = "|".join(re.escape(name[len(shared):]) for name in names)
    return re.compile(rf"{prefix}(?<!\w{prefix})(?:{alternatives})(?!\w)")


def deprecated_names_in(text: str) -> list[DeprecationRecord]:
    """Return the deprecated records named in a piece of text (e.g. a replacement)."""
    found = (BY_NAME[match.group()] for match in names_pattern().finditer(text))
    return [record for record in found if record.status == "deprecated"]

"""Questions to the deprecation registry, and the warning it gives for a deprecated name.

:func:`lookup`, :func:`entries` and :func:`is_deprecated` answer from the records of
:mod:`bnnsfw.deprecation.records`; :func:`warn_deprecated` emits the
:class:`DeprecationWarning` that bnnsfw's BNNS-named functions raise, pointing at the
caller's line.
"""

from __future__ import annotations

import difflib
import warnings

from ..errors import InvalidParameterError, UnknownNameError, must_be
from .records import BY_FOLDED_NAME, BY_NAME, KINDS, RECORDS, STATUSES, DeprecationRecord

__all__ = ["lookup", "entries", "is_deprecated", "warn_deprecated"]


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
    record = BY_NAME.get(name) or BY_FOLDED_NAME.get(name.casefold())
    if record is None:
        message = must_be("name", "a BNNS name in the deprecation registry", name)
        raise UnknownNameError(message + _suggestion(name))
    return record


def _suggestion(name: str) -> str:
    """Return ' Did you mean ...?' for names close to ``name``, or a pointer to the list."""
    close = difflib.get_close_matches(name.casefold(), list(BY_FOLDED_NAME), n=3, cutoff=0.6)
    if not close:
        return " Run `bnnsfw deprecations --list` to see every known name."
    names = [repr(BY_FOLDED_NAME[key].name) for key in close]
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
        for record in RECORDS
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

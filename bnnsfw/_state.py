"""Reading a parameter object back from its plain state (the ``from_state`` side of ``to_state``).

A :class:`StateReader` hands out a state's entries one key at a time; a missing key and the
keys left over at the end are errors that name them, so a mistyped or foreign state is
refused instead of being read as "no such array".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidParameterError, must_be

__all__ = ["StateReader"]


class StateReader:
    """The entries of one ``state`` mapping, each taken once.

    Parameters
    ----------
    owner : str
        The class being read (``"LSTMParameters"``), for messages.
    state : Mapping[str, Any]
        What the class's ``to_state()`` returned, or the same entries read from a file.
    """

    def __init__(self, owner: str, state: object) -> None:
        self._where = f"{owner}.from_state(state)"
        if not isinstance(state, Mapping):
            rule = "a mapping from to_state()"
            raise InvalidParameterError(must_be(self._where, rule, type(state).__name__))
        self._keys = sorted(state)
        self._left = dict(state)

    def required(self, key: str) -> Any:
        """The entry ``key``; its absence is an error."""
        if key not in self._left:
            rule = f"a state with the key {key!r}"
            raise InvalidParameterError(must_be(self._where, rule, f"keys {self._keys}"))
        return self._left.pop(key)

    def optional(self, key: str) -> Any:
        """The entry ``key``, or ``None`` when the state leaves it out (an absent array)."""
        return self._left.pop(key, None)

    def required_entries(self, *keys: str) -> dict[str, Any]:
        """The entries ``keys``, by key (keyword arguments of the class); each must be there."""
        return {key: self.required(key) for key in keys}

    def optional_entries(self, *keys: str) -> dict[str, Any]:
        """The entries ``keys``, by key, ``None`` for those the state leaves out."""
        return {key: self.optional(key) for key in keys}

    def prefixed(self, prefix: str) -> dict[str, Any]:
        """Every entry whose key starts with ``prefix``, keyed by the rest of the key."""
        taken = {key: value for key, value in self._left.items() if key.startswith(prefix)}
        for key in taken:
            del self._left[key]
        return {key[len(prefix):]: value for key, value in taken.items()}

    def finish(self) -> None:
        """Refuse the entries nobody asked for."""
        if self._left:
            rule = "a state with only the keys to_state() writes"
            raise InvalidParameterError(must_be(self._where, rule, f"unexpected keys {sorted(self._left)}"))

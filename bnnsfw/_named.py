"""Arrays by name: the checks behind ``parameters()``, ``state_dict()`` and ``load_state_dict()``.

Layers and :class:`~bnnsfw.Sequential` name their arrays (``"weights"``,
``"layer0.forward.input_gate.bias"``, ``"head.weights"`` …). Loading a state means matching
names, then shapes, then values; everything is checked before anything is written, so a
refused state changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, overload

import numpy as np

from ._validation import parameter_array
from .errors import InvalidParameterError, must_be

__all__ = ["IncompatibleKeys", "name_differences", "checked_state", "read_only"]


@overload
def read_only(array: np.ndarray) -> np.ndarray: ...


@overload
def read_only(array: None) -> None: ...


@overload
def read_only(array: np.ndarray | None) -> np.ndarray | None: ...


def read_only(array: np.ndarray | None) -> np.ndarray | None:
    """A read-only view of ``array`` (``None`` stays ``None``): its values follow the array's,
    and writing through it raises instead of being silently ignored."""
    if array is None:
        return None
    view = array.view()
    view.flags.writeable = False
    return view


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(state, strict=False)`` left out (``strict=True`` refuses both).

    ``missing_keys``: names the model has and the state does not (those arrays kept their
    values); ``unexpected_keys``: names in the state that the model does not have (ignored).
    """

    missing_keys: list[str]
    unexpected_keys: list[str]


def name_differences(expected: Mapping[str, object], given: Mapping[str, object]) -> IncompatibleKeys:
    """The names of ``expected`` absent from ``given``, and those of ``given`` not expected."""
    return IncompatibleKeys(missing_keys=[name for name in expected if name not in given],
                            unexpected_keys=[name for name in given if name not in expected])


def describe_differences(keys: IncompatibleKeys) -> str:
    """``"missing names ['a'], unexpected names ['b']"`` for messages."""
    return f"missing names {keys.missing_keys}, unexpected names {keys.unexpected_keys}"


def checked_state(owner: str, state: object, targets: Mapping[str, np.ndarray], *, strict: object,
                  where: str | None = None) -> tuple[dict[str, np.ndarray], IncompatibleKeys]:
    """Match ``state`` against the live ``targets`` and check every value it brings.

    Returns the values to copy by name (each already of its target's dtype and shape, and
    finite) and the names left out. With ``strict`` any missing or unexpected name
    is an error listing them all. Values are converted to the layer's dtype, as a parameter
    object converts weights. ``owner`` names the class in messages (``"LSTMLayer"``), or
    ``where`` the whole call.
    """
    where = where or f"{owner}.load_state_dict(state)"
    if not isinstance(strict, (bool, np.bool_)):
        raise InvalidParameterError(must_be(f"{owner}.load_state_dict(strict)", "True or False", strict))
    if not isinstance(state, Mapping):
        raise InvalidParameterError(must_be(where, "a mapping of name to array (from state_dict())",
                                            type(state).__name__))
    keys = name_differences(targets, state)
    if strict and (keys.missing_keys or keys.unexpected_keys):
        raise InvalidParameterError(must_be(where, "a state with exactly the names of state_dict()",
                                            describe_differences(keys)))
    values = {name: parameter_array(f"{where}[{name!r}]", state[name], target.dtype, target.shape,
                                    copy=False)
              for name, target in targets.items() if name in state}
    return values, keys

"""The bnnsfw exception hierarchy.

Every exception derives from :class:`BNNSError` and from the built-in exception a caller
would catch anyway (``ValueError`` or ``TypeError``), so ``except ValueError`` keeps working.
Messages follow one template: "``<where>`` must be <rule>; got <value>."
"""

from __future__ import annotations

__all__ = [
    "BNNSError",
    "InvalidParameterError",
    "ShapeError",
    "DTypeError",
    "FilterClosedError",
    "UnknownBackendError",
    "BackendError",
    "UnknownNameError",
    "UnsupportedError",
]


class BNNSError(Exception):
    """Root of every exception raised by bnnsfw."""


class InvalidParameterError(BNNSError, ValueError):
    """A parameter value breaks a rule (range, divisibility, unsupported option)."""


class ShapeError(BNNSError, ValueError):
    """An array has the wrong number of dimensions or the wrong extent."""


class DTypeError(BNNSError, TypeError):
    """An array has a dtype other than the one the layer was created with."""


class FilterClosedError(BNNSError, ValueError):
    """A layer was used after :meth:`~bnnsfw.Filter.close`."""


class UnknownBackendError(BNNSError, ValueError):
    """A backend name is not registered."""


class BackendError(InvalidParameterError, TypeError):
    """An object offered as a backend does not implement the backend contract."""


class UnknownNameError(BNNSError, ValueError, LookupError):
    """A BNNS name is not in the deprecation registry."""


class UnsupportedError(InvalidParameterError):
    """A model uses a feature that bnnsfw cannot express (an ONNX operator or attribute, a
    PyTorch or Keras option, a Core ML limit); the message names the feature and where it is."""


def must_be(where: str, rule: str, value: object) -> str:
    """Format the project's one error-message template."""
    return f"{where} must be {rule}; got {value!r}."

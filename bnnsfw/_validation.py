"""Checks shared by every layer: dtypes, shapes and array arguments.

Each check raises one of the project's exceptions with a message that names the argument,
the rule and the value it got, so that bad input never reaches NumPy.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .errors import DTypeError, InvalidParameterError, ShapeError, must_be

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def layer_dtype(value: object, where: str = "dtype") -> np.dtype:
    """Normalise a layer dtype: float32 or float64."""
    try:
        dtype = np.dtype(value)  # type: ignore[call-overload]  # any object: np.dtype() is the check
    except TypeError:
        raise DTypeError(must_be(where, "float32 or float64", value)) from None
    if dtype not in SUPPORTED_DTYPES:
        raise DTypeError(must_be(where, "float32 or float64", dtype.name))
    return dtype


def describe(array: np.ndarray) -> str:
    """``"shape (2, 3) float32"``: for messages."""
    return f"shape {tuple(array.shape)} {array.dtype.name}"


def as_input(
    where: str,
    value: object,
    dtype: np.dtype,
    shape: Sequence[int | None] | None = None,
    *,
    shape_text: str | None = None,
) -> np.ndarray:
    """Check an array argument and return it as an ndarray (never a copy of an ndarray).

    One dtype rule for every kind of input: the value is read as NumPy reads it
    (``numpy.asarray``, which keeps an ndarray and asks an array-like for its array) and
    that array must already have ``dtype``. A float64 ndarray, a float64 array-like (anything
    with ``__array__``) and a list of Python floats (float64 to NumPy) are all refused by a
    float32 layer, with the same message: a silent cast hides a bug as often as it helps.
    ``shape`` entries of ``None`` match any extent.
    """
    if value is None:
        raise InvalidParameterError(must_be(where, "an array", None))
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(must_be(where, f"an array of {dtype.name}",
                                            type(value).__name__)) from None
    if array.dtype != dtype:
        given = array.dtype.name
        if not isinstance(value, np.ndarray):
            given += f" from {type(value).__name__}"
        rule = f"a {dtype.name} array (the layer's dtype)"
        raise DTypeError(must_be(where, rule, given))
    if shape is not None and not shape_matches(array.shape, shape):
        expected = shape_text or format_shape(shape)
        raise ShapeError(must_be(where, f"of shape {expected}", describe(array)))
    return array


def as_output(where: str, value: np.ndarray | None, dtype: np.dtype,
              shape: Sequence[int]) -> np.ndarray | None:
    """Check a caller-provided output buffer (writable, exact shape and dtype)."""
    if value is None:
        return None
    if not isinstance(value, np.ndarray):
        raise InvalidParameterError(must_be(where, "a NumPy array", type(value).__name__))
    if value.dtype != dtype:
        raise DTypeError(must_be(where, f"a {dtype.name} array", value.dtype.name))
    if tuple(value.shape) != tuple(shape):
        raise ShapeError(must_be(where, f"of shape {tuple(shape)}", describe(value)))
    if not value.flags.writeable:
        raise InvalidParameterError(must_be(where, "a writable array", "a read-only array"))
    return value


def shape_matches(actual: Sequence[int], expected: Sequence[int | None]) -> bool:
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected))


def format_shape(shape: Sequence[int | None]) -> str:
    inner = ", ".join("*" if s is None else str(s) for s in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def parameter_array(
    where: str,
    value: object,
    dtype: np.dtype,
    shape: Sequence[int] | None = None,
    *,
    copy: bool = True,
    finite: bool = True,
) -> np.ndarray:
    """A weight-like array for a parameter object: right shape, finite, cast to ``dtype``.

    Weights are data the layer owns, so unlike inputs they are cast to the layer's dtype;
    ``copy=False`` keeps the caller's array when no cast is needed (client pointers).
    """
    try:
        # np.asarray copies only when it must; np.array(copy=None) means the same on NumPy 2
        # but is refused by NumPy 1.x.
        array = np.array(value, dtype=dtype, copy=True) if copy else np.asarray(value, dtype=dtype)
    except (TypeError, ValueError):
        raise InvalidParameterError(must_be(where, f"an array convertible to {dtype.name}",
                                            type(value).__name__)) from None
    if shape is not None and tuple(array.shape) != tuple(shape):
        raise ShapeError(must_be(where, f"of shape {tuple(shape)}", describe(array)))
    if finite and array.size and not np.isfinite(array).all():
        raise InvalidParameterError(must_be(where, "finite (no NaN or infinity)",
                                            "an array with non-finite values"))
    return array


def positive_int(where: str, value: object, *, minimum: int = 1) -> int:
    """An integer ``>= minimum`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParameterError(must_be(where, f"an integer >= {minimum}", value))
    if value < minimum:
        raise InvalidParameterError(must_be(where, f"an integer >= {minimum}", value))
    return int(value)


def finite_float(where: str, value: object, *, low: float | None = None, high: float | None = None,
                 high_open: bool = False) -> float:
    """A finite float within ``[low, high]`` (or ``[low, high)`` with ``high_open``)."""
    try:
        number = float(value)  # type: ignore[arg-type]  # any object: float() is the check
    except (TypeError, ValueError):
        raise InvalidParameterError(must_be(where, "a number", value)) from None
    if not math.isfinite(number):
        raise InvalidParameterError(must_be(where, "finite", value))
    too_high = high is not None and (number >= high if high_open else number > high)
    if (low is not None and number < low) or too_high:
        closing = ")" if high_open else "]"
        raise InvalidParameterError(must_be(where, f"in [{low}, {high}{closing}", value))
    return number

"""Checks shared by every layer: dtypes, shapes and array arguments.

Each check raises one of the project's exceptions with a message that names the argument,
the rule and the value it got, so that bad input never reaches NumPy.
"""

from __future__ import annotations

import math
from typing import Any, Sequence, cast

import numpy as np

from ._compat import TooHardError
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


def dtype_text(dtype: np.dtype) -> str:
    """A dtype's name, saying when its byte order is not the machine's ("float32, big-endian")."""
    if dtype.isnative:
        return dtype.name
    return f"{dtype.name}, {'big' if dtype.byteorder == '>' else 'little'}-endian"


def describe(array: np.ndarray) -> str:
    """``"shape (2, 3) float32"``: for messages."""
    return f"shape {tuple(array.shape)} {dtype_text(array.dtype)}"


#: What arrays of kinds that do not hold real numbers are called in messages.
_NOT_REAL = {"c": "complex numbers", "U": "text", "S": "bytes", "O": "objects that are not numbers",
             "M": "dates", "m": "time spans", "V": "structured data"}


def added_dtype(dtype: np.dtype) -> bool:
    """A dtype that a package adds to NumPy (``ml_dtypes.bfloat16``, its float8 and int4
    types…): kind ``'V'`` like structured data, but without fields and not a plain void."""
    return dtype.kind == "V" and dtype.names is None and dtype.type is not np.void


def _converted_rule(rule: str, given: np.dtype, dtype: np.dtype) -> str:
    """``rule``, pointing at the conversion when ``given`` is a type bnnsfw does not compute in."""
    if added_dtype(given):
        return f"{rule}; convert {given.name} data with .astype(np.{dtype.name})"
    return rule


def real_array(where: str, value: object, dtype: np.dtype, *, copy: bool = False,
               rule: str | None = None) -> np.ndarray:
    """``value`` as an array of ``dtype``, refusing what does not hold real numbers.

    NumPy would drop the imaginary part of complex numbers (with a warning), turn numeric
    strings into numbers and ``None`` into NaN; here each of those is an error naming
    ``where``. Ragged nested sequences are refused as well.
    """
    rule = rule or f"an array of real numbers ({dtype.name})"
    if value is None:
        raise InvalidParameterError(must_be(where, rule, None))
    try:
        raw = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (TypeError, ValueError):
        what = f"a ragged or unreadable {type(value).__name__}"
        raise InvalidParameterError(must_be(where, rule, what)) from None
    if added_dtype(raw.dtype):
        raise DTypeError(must_be(where, _converted_rule(rule, raw.dtype, dtype), raw.dtype.name))
    if raw.dtype.kind not in "biuf":
        what = _NOT_REAL.get(raw.dtype.kind, dtype_text(raw.dtype))
        error = DTypeError if isinstance(value, np.ndarray) else InvalidParameterError
        raise error(must_be(where, rule, what))
    return np.array(raw, dtype=dtype, copy=True) if copy else raw.astype(dtype, copy=False)


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
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(must_be(where, f"an array of {dtype.name}",
                                            f"a ragged or unreadable {type(value).__name__}")) from None
    if array.dtype != dtype:
        given = array.dtype.name if added_dtype(array.dtype) else _NOT_REAL.get(array.dtype.kind,
                                                                                   dtype_text(array.dtype))
        if not isinstance(value, np.ndarray):
            given += f" from {type(value).__name__}"
        rule = _converted_rule(f"a {dtype.name} array (the layer's dtype)", array.dtype, dtype)
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
        rule = _converted_rule(f"a {dtype.name} array", value.dtype, dtype)
        raise DTypeError(must_be(where, rule, dtype_text(value.dtype)))
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
    array = real_array(where, value, dtype, copy=copy)
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


def real_number(where: str, value: object, rule: str = "a number") -> float:
    """``value`` as a float, when it is a real number: an int, a float, a NumPy real scalar or
    0-d array. Booleans, text and complex numbers are refused (``float()`` would take ``True``
    as 1, ``"0.5"`` as 0.5 and drop an imaginary part)."""
    kind = np.asarray(value).dtype.kind if isinstance(value, (np.ndarray, np.generic)) else None
    if isinstance(value, (bool, str, bytes, complex)) or kind in ("b", "c", "U", "S", "O", "V"):
        raise InvalidParameterError(must_be(where, rule, value))
    try:
        return float(value)  # type: ignore[arg-type]  # any object: float() is the check
    except (TypeError, ValueError):
        raise InvalidParameterError(must_be(where, rule, value)) from None


def finite_float(where: str, value: object, *, low: float | None = None, high: float | None = None,
                 high_open: bool = False) -> float:
    """A finite real number (:func:`real_number`) within ``[low, high]`` (or ``[low, high)``
    with ``high_open``)."""
    number = real_number(where, value)
    if not math.isfinite(number):
        raise InvalidParameterError(must_be(where, "finite", value))
    too_high = high is not None and (number >= high if high_open else number > high)
    if (low is not None and number < low) or too_high:
        closing = ")" if high_open else "]"
        raise InvalidParameterError(must_be(where, f"in [{low}, {high}{closing}", value))
    return number


def same_elements(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` are the same elements of the same memory, in the same order."""
    return (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` share an element (exactly; too hard to tell counts as shared)."""
    if not np.may_share_memory(a, b):
        return False
    try:
        work = cast(Any, 100_000)  # numpy's stubs list only the two special values
        return bool(np.shares_memory(a, b, max_work=work))
    except TooHardError:
        return True


def separate_outputs(where: str, buffers: dict[str, np.ndarray | None]) -> None:
    """Refuse two output buffers that share memory: one buffer for two outputs would hold only
    the one written last. ``where`` is the method (``"Layer.apply_backward"``)."""
    given = [(name, buffer) for name, buffer in buffers.items() if buffer is not None]
    for i, (name, buffer) in enumerate(given):
        for other, earlier in given[:i]:
            if overlap(buffer, earlier):
                raise InvalidParameterError(must_be(
                    f"{where}({name})", f"memory apart from {other} (one buffer for two outputs)",
                    f"an array overlapping {other}"))

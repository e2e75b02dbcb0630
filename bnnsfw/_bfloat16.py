"""BFloat16 data as the C-style API holds it: 2-byte elements, the upper half of a float32.

A BFloat16 descriptor's data is an ``ml_dtypes.bfloat16`` array or the raw ``uint16`` bits a
C buffer holds; bnnsfw works on the bits (it needs no package for that) and computes in
float32. Widening is exact. Narrowing rounds to nearest, ties to even, on the bits; a NaN
becomes the quiet NaN of its sign (0x7FC0 or 0xFFC0), as ``ml_dtypes`` (and Eigen) narrow it:
the rounding alone would carry some NaN payloads into the exponent and make them infinite.
"""

from __future__ import annotations

import numpy as np

#: How BFloat16 data is stored and handed around here.
STORAGE = np.dtype(np.uint16)


def is_bfloat16(dtype: np.dtype) -> bool:
    """True for ``ml_dtypes.bfloat16`` (a 2-byte dtype of kind ``'V'`` without fields, named
    ``bfloat16``): its arrays are read through their bits."""
    return (dtype.kind == "V" and dtype.names is None and dtype.type is not np.void
            and dtype.itemsize == 2 and dtype.name == "bfloat16")


def to_float32(bits: np.ndarray) -> np.ndarray:
    """The float32 values of BFloat16 ``bits`` (exact: the bits become the upper half)."""
    wide = np.asarray(bits, dtype=STORAGE).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32)


def from_float32(values: np.ndarray) -> np.ndarray:
    """BFloat16 bits of float32 ``values``, rounded to nearest, ties to even."""
    shape = np.shape(values)
    bits = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # in 64 bits: no carry out of the word
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    quiet = ((bits >> 16) & 0x8000) | 0x7FC0
    return np.where(nan, quiet, rounded).astype(STORAGE).reshape(shape)

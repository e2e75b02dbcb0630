"""NumPy functions the package uses that its oldest supported NumPy (1.24) does not have.

Each name is NumPy's own function when it exists and an equivalent otherwise, so callers
import it from here and read the same on every supported version.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numpy.typing import ArrayLike


def _vecdot(x1: ArrayLike, x2: ArrayLike, /, *, out: np.ndarray | None = None) -> Any:
    """``np.vecdot`` for real arrays on NumPy < 2.0: the sum over the last axis of ``x1 * x2``.

    The leading axes broadcast, the result has the promoted dtype of the inputs and goes to
    ``out`` when one is given, as with ``np.vecdot``. Each row is a ``(1, K) @ (K, 1)``
    product, so ``matmul`` hands it to BLAS like ``np.vecdot`` does (complex inputs would
    need ``x1`` conjugated; the package uses real floats only).
    """
    a, b = np.asarray(x1), np.asarray(x2)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("vecdot: both inputs need at least one axis")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"vecdot: last axes differ in length; got shapes {a.shape} and {b.shape}")
    rows = a[..., None, :], b[..., :, None]
    if out is None:
        return np.matmul(*rows)[..., 0, 0][()]
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    if out.shape != shape:
        raise ValueError(f"vecdot: out must have shape {shape}; got {out.shape}")
    np.matmul(*rows, out=out[..., None, None])
    return out


vecdot: Callable[..., Any] = getattr(np, "vecdot", _vecdot)

#: Raised by ``np.shares_memory`` when deciding takes more than ``max_work`` steps
#: (``numpy.exceptions`` from NumPy 1.25; the top-level name before NumPy 2.0).
TooHardError: type[Exception] = getattr(getattr(np, "exceptions", np), "TooHardError")

"""A backend that calls BLAS ``?gemm`` directly through ``scipy.linalg.blas``.

BLAS is column-major; a C-contiguous ``(m, n)`` array is the column-major ``(n, m)`` matrix
of its transpose. So ``C = op(A) @ op(B)`` in row-major is computed as
``Cᵀ = op(B)ᵀ @ op(A)ᵀ`` in column-major, handing BLAS the transposed views: no copies, and
``out`` is written in place (``beta = 1`` accumulates without a temporary).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import blas

from ._fast_lstm import FastLSTMKernels
from ._fast_normalization import BlockedNormalizationKernels
from .numpy import NumpyBackend, check_gemm_operands

__all__ = ["ScipyBlasBackend"]

_GEMM = {np.dtype(np.float32): blas.sgemm, np.dtype(np.float64): blas.dgemm}


def _column_major_view(m: np.ndarray, trans: bool) -> tuple[np.ndarray, bool]:
    """The Fortran-ordered matrix BLAS should read for ``op(m)ᵀ`` and its transpose flag."""
    if m.flags.c_contiguous:
        return m.T, trans
    if m.flags.f_contiguous:
        return m, not trans
    return np.ascontiguousarray(m).T, trans


class ScipyBlasBackend(BlockedNormalizationKernels, FastLSTMKernels, NumpyBackend):
    """Direct BLAS products into preallocated outputs, cache-blocked multithreaded
    normalization kernels; every other kernel from the NumPy reference."""

    name = "scipy-blas"

    def gemm(
        self,
        a: np.ndarray,
        b: np.ndarray,
        out: np.ndarray | None = None,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> np.ndarray:
        """``out = alpha · op(a) @ op(b) + beta · out`` (see :class:`~bnnsfw.backends.Backend`)."""
        m, n, k = check_gemm_operands(a, b, out, trans_a, trans_b, beta)
        routine = _GEMM.get(a.dtype)
        if (
            routine is None
            or b.dtype != a.dtype
            or (out is not None and (out.dtype != a.dtype or not out.flags.c_contiguous))
            or 0 in (m, n, k)
        ):
            return super().gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        first, trans_first = _column_major_view(b, trans_b)
        second, trans_second = _column_major_view(a, trans_a)
        if out is None:
            out = np.empty((m, n), dtype=a.dtype)
            beta = 0.0
        result = routine(
            alpha, first, second, beta=beta, c=out.T,
            trans_a=int(trans_first), trans_b=int(trans_second), overwrite_c=1,
        )
        if not np.shares_memory(result, out):  # pragma: no cover - BLAS wrapper copied
            out[...] = result.T
        return out

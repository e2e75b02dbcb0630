"""The reference backend: every kernel in plain NumPy."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidParameterError, ShapeError, must_be
from ._lstm_kernels import LSTMKernels
from ._normalization_kernels import NormalizationKernels

__all__ = ["NumpyBackend"]


def _operand(m: np.ndarray, trans: bool) -> np.ndarray:
    return m.T if trans else m


def check_gemm_operands(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None, trans_a: bool, trans_b: bool, beta: float
) -> tuple[int, int, int]:
    """Validate a gemm call and return ``(m, n, k)``."""
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(must_be("gemm(a, b)", "2-D arrays", (a.shape, b.shape)))
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb:
        raise ShapeError(
            must_be("gemm(a, b)", "operands with matching inner dimensions",
                    f"op(a) {(m, k)} and op(b) {(kb, n)}")
        )
    if out is None:
        if beta != 0.0:
            raise InvalidParameterError(must_be("gemm(beta)", "0 when out is None", beta))
    elif out.shape != (m, n):
        raise ShapeError(must_be("gemm(out)", f"of shape {(m, n)}", out.shape))
    return m, n, k


class NumpyBackend(NormalizationKernels, LSTMKernels):
    """Pure NumPy: ``numpy.matmul`` for products and the reference per-layer kernels."""

    name = "numpy"

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
        check_gemm_operands(a, b, out, trans_a, trans_b, beta)
        left, right = _operand(a, trans_a), _operand(b, trans_b)
        if out is None or beta == 0.0:
            out = np.matmul(left, right, out=out)
            if alpha != 1.0:
                out *= alpha
            return out
        product = np.matmul(left, right)
        if alpha != 1.0:
            product *= alpha
        if beta != 1.0:
            out *= beta
        out += product
        return out

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

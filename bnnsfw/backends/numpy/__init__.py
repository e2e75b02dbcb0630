"""The reference backend: every operation of the contract in plain NumPy."""

from __future__ import annotations

import numpy as np

from .._shared.lstm_stack import LSTMStack
from .._shared.normalization_kernels import NormalizationKernels
from ..contract import GemmRequest, GemmResult

__all__ = ["NumpyBackend"]


def _operand(m: np.ndarray, trans: bool) -> np.ndarray:
    return m.T if trans else m


class NumpyBackend(NormalizationKernels, LSTMStack):
    """Pure NumPy: ``numpy.matmul`` for products and the reference kernels of every layer.

    It implements the whole contract (:mod:`bnnsfw.backends.contract`); a faster backend may
    subclass it and override only what it speeds up, or implement the contract from scratch.
    """

    name = "numpy"

    def gemm(self, request: GemmRequest) -> GemmResult:
        """``out = alpha · op(a) @ op(b) + beta · out`` (:class:`~bnnsfw.backends.contract.GemmRequest`)."""
        r = request
        return GemmResult(self._gemm(r.a, r.b, r.out, trans_a=r.trans_a, trans_b=r.trans_b, alpha=r.alpha,
                                     beta=r.beta))

    def _gemm(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *, trans_a: bool = False,
              trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
        """The product for checked operands; the kernels call it directly."""
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

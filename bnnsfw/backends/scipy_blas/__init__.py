"""A backend that calls BLAS ``?gemm`` directly through ``scipy.linalg.blas``.

BLAS is column-major; a C-contiguous ``(m, n)`` array is the column-major ``(n, m)`` matrix
of its transpose. So ``C = op(A) @ op(B)`` in row-major is computed as
``Cᵀ = op(B)ᵀ @ op(A)ᵀ`` in column-major, handing BLAS the transposed views: no copies, and
``out`` is written in place (``beta = 1`` accumulates without a temporary).

Besides the product, the backend has its own kernels for the LSTM's default cell
(:mod:`._lstm`) and blocked, multithreaded normalization kernels
(:mod:`._normalization`); which implementation serves a request is decided in one
place, the section "Which implementation serves a request" below. Everything else runs the
reference kernels it inherits from :class:`~bnnsfw.backends.numpy.NumpyBackend`.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import blas

from . import _lstm
from ._normalization import BlockedNormalizationKernels
from .._shared.lstm_kernels import LSTMStepPlan
from .._shared.lstm_stack import BackwardKernel, ForwardKernel
from ..contract import (
    NormalizationBackwardRequest,
    NormalizationBackwardResult,
    NormalizationForwardRequest,
    NormalizationForwardResult,
)
from ..numpy import NumpyBackend

__all__ = ["ScipyBlasBackend"]

_GEMM = {np.dtype(np.float32): blas.sgemm, np.dtype(np.float64): blas.dgemm}


def _column_major_view(m: np.ndarray, trans: bool) -> tuple[np.ndarray, bool]:
    """The Fortran-ordered matrix BLAS should read for ``op(m)ᵀ`` and its transpose flag."""
    if m.flags.c_contiguous:
        return m.T, trans
    if m.flags.f_contiguous:
        return m, not trans
    return np.ascontiguousarray(m).T, trans


class ScipyBlasBackend(BlockedNormalizationKernels, NumpyBackend):
    """Direct BLAS products into preallocated outputs, the default LSTM cell with direct BLAS
    calls, and cache-blocked multithreaded normalization; the reference kernels otherwise."""

    name = "scipy-blas"

    def _gemm(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *, trans_a: bool = False,
              trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
        """``?gemm`` on column-major views; mixed dtypes, an output that is not C-contiguous
        and empty products go to NumPy."""
        routine = _GEMM.get(a.dtype)
        m = a.shape[1] if trans_a else a.shape[0]
        n = b.shape[0] if trans_b else b.shape[1]
        k = a.shape[0] if trans_a else a.shape[1]
        if (
            routine is None
            or b.dtype != a.dtype
            or (out is not None and (out.dtype != a.dtype or not out.flags.c_contiguous))
            or 0 in (m, n, k)
        ):
            return super()._gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
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

    # ----------------------------------------------------------------------------------
    # Which implementation serves a request: decided here and nowhere else.
    # ----------------------------------------------------------------------------------
    def _lstm_sequence_kernels(self, plan: LSTMStepPlan, lengths: np.ndarray | None,
                               batch: int) -> tuple[ForwardKernel, BackwardKernel]:
        """The direct-BLAS kernels for the default cell over full-length sequences; the
        reference kernels for every other cell and for variable lengths. (A configuration
        with a SPEC §4.1 variant never gets here: ``_lstm_general_serves`` sends it to the
        general reference kernels first.)"""
        if _lstm.serves(plan, lengths):
            return _lstm.forward_sequence, _lstm.backward_sequence
        return super()._lstm_sequence_kernels(plan, lengths, batch)

    def normalization_forward(self, request: NormalizationForwardRequest) -> NormalizationForwardResult:
        """Blocked when :meth:`blocked_plan` gives blocks, else (and for RMS normalization) the
        reference kernel."""
        r = request
        plan = None
        if r.centered:
            plan = self.blocked_plan(r.x, r.gamma, r.batch_statistics, r.mean is not None, r.threads, r.out)
        if plan is None:
            return super().normalization_forward(request)
        out, mean, variance = self.blocked_forward(
            r.x, r.gamma, r.beta, epsilon=r.epsilon, batch_statistics=r.batch_statistics,
            activation=r.activation, out=r.out, mean=r.mean, variance=r.variance, plan=plan)
        return NormalizationForwardResult(output=out, mean=mean, variance=variance)

    def normalization_backward(self, request: NormalizationBackwardRequest) -> NormalizationBackwardResult:
        """Blocked when :meth:`blocked_plan` gives blocks, else (and for RMS normalization) the
        reference kernel."""
        r = request
        plan = None
        if r.centered:
            plan = self.blocked_plan(r.x, r.gamma, r.batch_statistics, r.mean is not None, r.threads,
                                     r.dy, r.output, r.out)
        if plan is None:
            return super().normalization_backward(request)
        dx, dgamma, dbeta = self.blocked_backward(
            r.x, r.dy, r.gamma, r.beta, epsilon=r.epsilon, batch_statistics=r.batch_statistics,
            activation=r.activation, output=r.output, out=r.out, mean=r.mean, variance=r.variance, plan=plan)
        return NormalizationBackwardResult(input=dx, gamma=dgamma, beta=dbeta)

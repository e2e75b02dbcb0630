"""A backend with compiled (Numba) kernels, on top of the ``scipy-blas`` backend.

It serves the LSTM's default cell over full-length sequences with compiled time loops
(:mod:`._numba_lstm`: per step one BLAS product and one fused, vectorized pass, forward and
backward), and normalization with the statistics of the batch and the identity activation with
compiled, multithreaded row kernels (:mod:`._numba_normalization`). Every other request goes to
what ``scipy-blas`` does with it. Which implementation serves a request is decided in the
section "Which implementation serves a request" below, and nowhere else.
"""

from __future__ import annotations

import numpy as np

from . import _numba_lstm, _numba_normalization
from ._lstm_kernels import LSTMStepPlan
from ._lstm_stack import BackwardKernel, ForwardKernel
from .contract import (
    NormalizationBackwardRequest,
    NormalizationBackwardResult,
    NormalizationForwardRequest,
    NormalizationForwardResult,
)
from .scipy_blas import ScipyBlasBackend

__all__ = ["NumbaBackend"]


class NumbaBackend(ScipyBlasBackend):
    """Compiled LSTM time loops and normalization row kernels; ``scipy-blas`` for the rest."""

    name = "numba"

    # ----------------------------------------------------------------------------------
    # Which implementation serves a request.
    # ----------------------------------------------------------------------------------

    #: The compiled LSTM loops serve cells of at most this many units per step (H·N). Above
    #: it the products dominate and the direct-BLAS kernels of ``scipy-blas``, which accumulate
    #: into the step block instead of adding a strided projection afterwards, were faster
    #: (measured, ``bnnsfw bench``: compiled 0.37–0.89× of ``scipy-blas`` at H·N = 64 and 2048,
    #: 1.04–1.13× at 8192 and 32768).
    lstm_max_units: int = 4096

    def _lstm_sequence_kernels(self, plan: LSTMStepPlan, lengths: np.ndarray | None,
                               batch: int) -> tuple[ForwardKernel, BackwardKernel]:
        """The compiled kernels for the default cell over full-length sequences of at most
        :attr:`lstm_max_units` units per step; otherwise what ``scipy-blas`` picks. (A
        configuration with a SPEC §4.1 variant never gets here: ``_lstm_general_serves``
        sends it to the general reference kernels first.)"""
        if _numba_lstm.serves(plan, lengths) and plan.hidden_size * batch <= self.lstm_max_units:
            return _numba_lstm.forward_sequence, _numba_lstm.backward_sequence
        return super()._lstm_sequence_kernels(plan, lengths, batch)

    def normalization_forward(self, request: NormalizationForwardRequest) -> NormalizationForwardResult:
        """Compiled for the statistics of the batch and the identity activation (not for RMS
        normalization)."""
        r = request
        compiled = _numba_normalization.serves(r.x, r.activation.is_identity, r.mean is not None)
        if not (r.centered and compiled):
            return super().normalization_forward(request)
        out, mean, variance = _numba_normalization.forward(
            r.x, r.gamma, r.beta, epsilon=r.epsilon, batch_statistics=r.batch_statistics, out=r.out,
            threads=r.threads)
        return NormalizationForwardResult(output=out, mean=mean, variance=variance)

    def normalization_backward(self, request: NormalizationBackwardRequest) -> NormalizationBackwardResult:
        """Compiled for the statistics of the batch and the identity activation (not for RMS
        normalization)."""
        r = request
        compiled = _numba_normalization.serves(r.x, r.activation.is_identity, r.mean is not None)
        if not (r.centered and compiled):
            return super().normalization_backward(request)
        dx, d_gamma, d_beta = _numba_normalization.backward(
            r.x, r.dy, r.gamma, epsilon=r.epsilon, batch_statistics=r.batch_statistics, out=r.out,
            threads=r.threads)
        return NormalizationBackwardResult(input=dx, gamma=d_gamma, beta=d_beta)

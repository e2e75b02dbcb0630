"""A backend with compiled (Numba) kernels, on top of the ``scipy-blas`` backend.

It serves the LSTM's default cell over full-length sequences with compiled time loops
(:mod:`._numba_lstm`): per step one BLAS product and one fused, vectorized pass, forward and
backward. Every other request goes to what ``scipy-blas`` does with it. Which implementation
serves a request is decided in one place, :meth:`NumbaBackend._lstm_sequence_kernels`.
"""

from __future__ import annotations

import numpy as np

from . import _numba_lstm
from ._lstm_kernels import LSTMStepPlan
from ._lstm_stack import BackwardKernel, ForwardKernel
from .scipy_blas import ScipyBlasBackend

__all__ = ["NumbaBackend"]


class NumbaBackend(ScipyBlasBackend):
    """Compiled LSTM time loops for the default cell; ``scipy-blas`` for everything else."""

    name = "numba"

    def _lstm_sequence_kernels(self, plan: LSTMStepPlan,
                               lengths: np.ndarray | None) -> tuple[ForwardKernel, BackwardKernel]:
        """The compiled kernels for the default cell over full-length sequences; otherwise
        what ``scipy-blas`` picks."""
        if _numba_lstm.serves(plan, lengths):
            return _numba_lstm.forward_sequence, _numba_lstm.backward_sequence
        return super()._lstm_sequence_kernels(plan, lengths)

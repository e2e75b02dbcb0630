"""Reference (NumPy) kernels of the LSTM layer, mixed into every backend."""

from __future__ import annotations

__all__ = ["LSTMKernels"]


class LSTMKernels:
    """Fused per-step passes of :class:`bnnsfw.LSTMLayer`."""

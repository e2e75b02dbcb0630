"""Reference (NumPy) kernels of the normalization layer, mixed into every backend."""

from __future__ import annotations

__all__ = ["NormalizationKernels"]


class NormalizationKernels:
    """Fused per-element passes of :class:`bnnsfw.NormalizationLayer`."""

"""The backend protocol: the few primitives a layer asks of its compute backend."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """What a layer needs from a compute backend.

    A backend is a strategy object: layers call its matrix product and its fused
    per-layer kernels and never branch on which backend they hold. The reference
    implementation, :class:`bnnsfw.backends.numpy.NumpyBackend`, carries every kernel; a
    faster backend subclasses it and overrides only what it speeds up.
    """

    #: Registered name, e.g. ``"numpy"``.
    name: str

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
        """``out = alpha · op(a) @ op(b) + beta · out`` for 2-D arrays; returns ``out``.

        ``op(m)`` is ``m.T`` when the matching ``trans_`` flag is set. With ``out=None`` a new
        array is returned and ``beta`` must be 0.
        """
        ...

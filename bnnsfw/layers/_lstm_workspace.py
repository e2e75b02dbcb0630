"""The LSTM layer's scratch memory: arrays reused across calls, grown on demand.

The layer hands it to its backend with each call as the contract's ``Workspace``
(:mod:`bnnsfw.backends.contract`).
"""

from __future__ import annotations

import math

import numpy as np


class _Workspace:
    """Scratch arrays reused across calls, grown on demand (the contract's ``Workspace``).

    Between calls it keeps at most :attr:`RETAINED_BYTES`, the smallest buffers first: what the
    next call of the same shape reuses at once, without an open layer holding on to the
    hundreds of MiB a long sequence may borrow.

    A call asks for twenty to thirty arrays, the same ones each time: each typed view is
    kept until its buffer changes, and the bytes held are counted as buffers come and go,
    so that a call of a small layer does not spend its time in the workspace (a view made
    anew took about 2 µs, and the end of each call sorted every buffer by size).
    """

    #: Scratch memory an open layer keeps between calls (the benchmark shapes fit).
    RETAINED_BYTES = 64 << 20

    #: Typed views kept at most (a few calls' worth of names and shapes).
    KEPT_VIEWS = 256

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}
        self._views: dict[tuple[str, tuple[int, ...], np.dtype], np.ndarray] = {}
        self._held = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._held

    def trim(self) -> None:
        """Let go of the largest buffers until at most :attr:`RETAINED_BYTES` are held."""
        if self._held <= self.RETAINED_BYTES:
            return
        for name, _ in sorted(self._buffers.items(), key=lambda item: -item[1].nbytes):
            if self._held <= self.RETAINED_BYTES:
                break
            self._drop(name)

    def _drop(self, name: str) -> None:
        """Forget buffer ``name`` and every view of it."""
        self._held -= self._buffers.pop(name).nbytes
        self._views = {key: view for key, view in self._views.items() if key[0] != name}

    def bytes(self, name: str, nbytes: int) -> np.ndarray:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < nbytes:
            if buffer is not None:
                self._drop(name)
            buffer = np.empty(max(nbytes, 1), dtype=np.uint8)
            self._buffers[name] = buffer
            self._held += buffer.nbytes
        return buffer[:nbytes]

    def array(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if type(shape) is not tuple:
            shape = tuple(shape)
        key = (name, shape, dtype)
        view = self._views.get(key)
        if view is None:
            view = self.bytes(name, math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)
            if len(self._views) >= self.KEPT_VIEWS:  # calls of many shapes: start again
                self._views.clear()
            self._views[key] = view
        return view

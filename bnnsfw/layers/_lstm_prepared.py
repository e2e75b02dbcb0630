"""The prepared forwards a layer or a stream keeps: the backend's forward made ready once for
each kind of call (the contract's optional ``lstm_prepare_forward``), a few at most.

A kind is everything about the call's arrays a backend may have chosen by: for each whether
it is given and its shape, dtype, strides and flags, with the weights' packing and whether
the call trains. The keeper forgets every prepared forward when the weights are packed
again; the layer also keys them by the packing's version.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

import numpy as np

from ..backends.contract import LSTMForwardCall, LSTMForwardRequest

#: NumPy's C-contiguous, F-contiguous, aligned and writeable flags (``ndarray.flags.num``).
_FLAGS = 0x1 | 0x2 | 0x100 | 0x400


def array_kind(a: np.ndarray | None) -> tuple | None:
    """What a prepared forward may depend on in an array: shape, strides, dtype and flags."""
    if a is None:
        return None
    return a.shape, a.strides, a.dtype.char, a.flags.num & _FLAGS


class PreparedForwards:
    """At most :attr:`LIMIT` prepared forwards by kind, the oldest dropped first; ``None`` for
    a kind the backend has nothing prepared for (it is not asked again)."""

    #: Kinds kept at most (a layer called with a few shapes keeps them all).
    LIMIT = 8

    def __init__(self) -> None:
        self._calls: dict[Hashable, LSTMForwardCall | None] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, key: Hashable) -> LSTMForwardCall | None:
        """The prepared forward of ``key``; None when the backend has none or was not asked."""
        return self._calls.get(key)

    def asked(self, key: Hashable) -> bool:
        """Whether the backend was asked for the forward of ``key`` (and said what it has)."""
        return key in self._calls

    def prepare(self, key: Hashable, backend: Any, request: LSTMForwardRequest) -> LSTMForwardCall | None:
        """Ask ``backend`` to prepare the forward of ``request``'s kind and keep the answer."""
        prepare: Callable[[LSTMForwardRequest], LSTMForwardCall | None] | None = getattr(
            backend, "lstm_prepare_forward", None)
        call = None if prepare is None else prepare(request)
        with self._lock:
            if len(self._calls) >= self.LIMIT:
                self._calls.pop(next(iter(self._calls)))
            self._calls[key] = call
        return call

    def clear(self) -> None:
        """Forget every prepared forward (the weights were packed again)."""
        with self._lock:
            self._calls.clear()

"""The prepared forwards a layer or a stream keeps: the backend's forward made ready once for
each kind of call (the contract's optional ``lstm_prepare_forward``), a few at most.

A kind is everything about the call's arrays a backend may have chosen by: for each whether
it is given and its shape, dtype, strides and flags, with the weights' packing and whether
the call trains. The keeper forgets every prepared forward when the weights are packed
again; the layer also keys them by the packing's version. A kind is prepared at its second
call: in a training loop the optimizer changes the weights at every step, so each packing
serves one forward, which preparing would only make dearer.

A layer also keeps, for a few kinds of inference, what its checks of the arguments found
(:class:`CheckedKinds`): a call of a kind that passed them once skips them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

import numpy as np

from ..backends.contract import LSTMForwardCall, LSTMForwardRequest

#: NumPy's C-contiguous, F-contiguous, aligned and writeable flags (``ndarray.flags.num``).
_FLAGS = 0x1 | 0x2 | 0x100 | 0x400


def array_kind(a: np.ndarray | None) -> tuple | None:
    """What a prepared forward, or the layer's checks of an argument, may depend on in an
    array: shape, strides, dtype (with its byte order, which ``dtype.char`` does not tell)
    and flags."""
    if a is None:
        return None
    return a.shape, a.strides, a.dtype, a.flags.num & _FLAGS


def inference_kind(x: object, hidden: object, cell: object) -> tuple | None:
    """The kind of an inference call's ``x``, ``hidden`` and ``cell`` as the layer's checks
    read them (:class:`CheckedKinds`); None when any is neither a NumPy array nor None (a list,
    an array subclass: checked at every call)."""
    if type(x) is not np.ndarray or not (hidden is None or type(hidden) is np.ndarray) \
            or not (cell is None or type(cell) is np.ndarray):
        return None
    return array_kind(x), array_kind(hidden), array_kind(cell)


class CheckedKinds(dict[Hashable, Any]):
    """What the checks of an inference call found (its views and shapes), for the last few
    kinds of call (:func:`inference_kind`), the oldest dropped first: ``get(kind)`` (a dict's,
    None for a kind not known or None). A call of a kind whose checks passed before passes
    them again (they read nothing else), so the layer skips them. The layer forgets them all
    when the weights are packed again."""

    #: Kinds kept at most.
    LIMIT = 8

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def remember(self, kind: Hashable, found: Any) -> None:
        """Keep what the checks of ``kind`` found."""
        with self._lock:
            if kind not in self and len(self) >= self.LIMIT:
                self.pop(next(iter(self)), None)
            self[kind] = found

    def clear(self) -> None:
        """Forget every kind."""
        with self._lock:
            super().clear()


class PreparedForwards:
    """At most :attr:`LIMIT` prepared forwards by kind, the oldest dropped first; ``None`` for
    a kind the backend has nothing prepared for (it is not asked again)."""

    #: Kinds kept at most (a layer called with a few shapes keeps them all).
    LIMIT = 8

    def __init__(self) -> None:
        self._calls: dict[Hashable, LSTMForwardCall | None] = {}
        self._seen: set[Hashable] = set()  # kinds called once, not prepared yet
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, key: Hashable) -> LSTMForwardCall | None:
        """The prepared forward of ``key``; None when the backend has none or was not asked."""
        return self._calls.get(key)

    def wanted(self, key: Hashable) -> bool:
        """Whether to ask the backend for the forward of ``key`` now: at the second call of
        that kind (the first is remembered here), never again once asked."""
        if key in self._calls:
            return False
        if key in self._seen:
            return True
        with self._lock:
            if len(self._seen) >= 4 * self.LIMIT:
                self._seen.clear()
            self._seen.add(key)
        return False

    def prepare(self, key: Hashable, backend: Any, request: LSTMForwardRequest) -> LSTMForwardCall | None:
        """Ask ``backend`` to prepare the forward of ``request``'s kind and keep the answer."""
        prepare: Callable[[LSTMForwardRequest], LSTMForwardCall | None] | None = getattr(
            backend, "lstm_prepare_forward", None)
        call = None if prepare is None else prepare(request)
        with self._lock:
            if len(self._calls) >= self.LIMIT:
                self._calls.pop(next(iter(self._calls)))
            self._calls[key] = call
            self._seen.discard(key)
        return call

    def clear(self) -> None:
        """Forget every prepared forward (the weights were packed again)."""
        with self._lock:
            self._calls.clear()
            self._seen.clear()

"""The weight arrays of an LSTM's parameters (or of its gradients, which have the same fields).

Every array in a fixed order (what the layer digests and compares for changes), each layer's
and direction's slice by name (the names of :meth:`LSTMLayer.parameters` and
:meth:`LSTMGradients.parameters`), and the parameters with every array replaced: by any
function of it, or by a copy in one flat buffer (the layer's own weights).
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import attrs
import numpy as np

from ._lstm_parameters import _LAYER_NORM_FIELDS, GATE_FIELDS, LSTMGateDescriptor, LSTMParameters

__all__ = ["DIRECTION_NAMES"]

#: How the names of :meth:`LSTMLayer.parameters` call the two directions.
DIRECTION_NAMES = ("forward", "reverse")


def _gate_arrays(gate: LSTMGateDescriptor) -> list[np.ndarray]:
    """Every weight array of a gate, in a fixed order."""
    arrays = (*gate.input_weights, gate.hidden_weights, gate.cell_weights, gate.bias)
    return [a for a in arrays if a is not None]


def _named_layer_arrays(gates: tuple[Any, Any, Any, Any], projection: Any = None,
                        layer_norm: Any = None) -> dict[str, np.ndarray]:
    """Per layer, direction, gate and field, the view of that slice of the stacked arrays.

    Names are ``"layer<l>.<forward|reverse>.<gate>.<field>"`` (field ``input_weights``,
    ``hidden_weights``, then ``cell_weights`` and ``bias`` where the gate has them); layer 0's
    input weights are ``(H, I)``, the upper layers' ``(H, D·P)``, the others ``(H, P)`` or
    ``(H,)``. Then, where the layer has them, ``"layer<l>.<direction>.projection_weights"``
    ``(P, H)`` and ``"layer<l>.<direction>.layer_norm.<field>"``. ``gates`` (and the others)
    are the parameters' or the gradients' (the same fields).
    """
    size_l, size_d = np.shape(gates[0].hidden_weights)[:2]
    named: dict[str, np.ndarray] = {}
    for layer in range(size_l):
        for direction in range(size_d):
            prefix = f"layer{layer}.{DIRECTION_NAMES[direction]}"
            for name, gate in zip(GATE_FIELDS, gates):
                iw0, iw1 = gate.input_weights
                iw = iw0[direction] if layer == 0 else iw1[layer - 1, direction]
                named[f"{prefix}.{name}.input_weights"] = iw
                named[f"{prefix}.{name}.hidden_weights"] = gate.hidden_weights[layer, direction]
                for field in ("cell_weights", "bias"):
                    array = getattr(gate, field)
                    if array is not None:
                        named[f"{prefix}.{name}.{field}"] = array[layer, direction]
            if projection is not None:
                named[f"{prefix}.projection_weights"] = projection[layer, direction]
            if layer_norm is not None:
                for field, array in zip(_LAYER_NORM_FIELDS, layer_norm.arrays):
                    named[f"{prefix}.layer_norm.{field}"] = array[layer, direction]
    return named


def _parameter_arrays(params: LSTMParameters) -> list[np.ndarray]:
    """Every weight array of the parameters, in a fixed order: the gates', the projection's
    and the layer norm's."""
    arrays = [a for g in params.gates for a in _gate_arrays(g)]
    if params.projection_weights is not None:
        arrays.append(params.projection_weights)
    if params.layer_norm is not None:
        arrays += params.layer_norm.arrays
    return arrays


def _with_arrays(params: LSTMParameters, make: Any) -> LSTMParameters:
    """``params`` with every weight array replaced by ``make(array)`` (None stays None)."""
    def gate(g: LSTMGateDescriptor) -> LSTMGateDescriptor:
        iw0, iw1 = g.input_weights
        return LSTMGateDescriptor(input_weights=(make(iw0), make(iw1)), hidden_weights=make(g.hidden_weights),
                                  cell_weights=make(g.cell_weights), bias=make(g.bias),
                                  activation=g.activation)

    changes: dict[str, Any] = {name: gate(getattr(params, name)) for name in GATE_FIELDS}
    if params.projection_weights is not None:
        changes["projection_weights"] = make(params.projection_weights)
    if params.layer_norm is not None:
        changes["layer_norm"] = attrs.evolve(params.layer_norm, **{
            name: make(getattr(params.layer_norm, name)) for name in _LAYER_NORM_FIELDS})
    return attrs.evolve(params, **changes)


def _copied(parameters: LSTMParameters) -> tuple[LSTMParameters, np.ndarray]:
    """``parameters`` with copies of every weight array, all views of one flat buffer, which is
    also returned (the layer compares it as one array when it watches its weights)."""
    flat = np.empty(sum(a.size for a in _parameter_arrays(parameters)), parameters.dtype)
    offset = 0

    def copy(a: Any) -> Any:
        nonlocal offset
        if a is None:
            return None
        view = flat[offset:offset + a.size].reshape(a.shape)
        np.copyto(view, a)
        offset += a.size
        return view

    return _with_arrays(parameters, copy), flat


def _load_memcmp() -> Any:
    """The C library's ``memcmp`` through ctypes, or None where it cannot be found."""
    try:
        import ctypes

        library = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        memcmp = library.memcmp
        memcmp.restype = ctypes.c_int
        memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        return memcmp
    except (OSError, AttributeError, ImportError):
        return None


_memcmp: Any = None
_memcmp_loaded = False


def _bytes_comparer() -> Any:
    global _memcmp, _memcmp_loaded
    if not _memcmp_loaded:
        _memcmp, _memcmp_loaded = _load_memcmp(), True
    return _memcmp


class _GateCopy(NamedTuple):
    """One gate's weight arrays as a pack request takes them (``LSTMGateArrays``)."""

    input_weights: tuple[np.ndarray, np.ndarray | None]
    hidden_weights: np.ndarray
    cell_weights: np.ndarray | None
    bias: np.ndarray | None


class _LayerNormCopy(NamedTuple):
    """The layer norm's arrays as a pack request takes them (``LSTMLayerNormArrays``)."""

    input_gain: np.ndarray
    input_bias: np.ndarray
    hidden_gain: np.ndarray
    hidden_bias: np.ndarray
    cell_gain: np.ndarray
    cell_bias: np.ndarray


class _PackingCopy(NamedTuple):
    """A copy of every weight array, views of one flat buffer (:func:`_packing_copy`), in the
    structures a pack request takes."""

    gates: tuple[_GateCopy, _GateCopy, _GateCopy, _GateCopy]
    projection: np.ndarray | None
    layer_norm: _LayerNormCopy | None
    #: the flat buffer, and each array's copy in :func:`_parameter_arrays`' order
    flat: np.ndarray
    arrays: list[np.ndarray]


def _packing_copy(params: LSTMParameters) -> _PackingCopy:
    """What a packing of ``params`` reads: a copy of its weights taken at once, which the live
    arrays cannot change while the backend reads it (a few µs, where a parameter object of
    copies, validated, took 160 µs for the smallest LSTM)."""
    live = _parameter_arrays(params)
    flat = np.concatenate([a.reshape(-1) for a in live])  # one copy of them all
    arrays, offset = [], 0
    for a in live:
        arrays.append(flat[offset:offset + a.size].reshape(a.shape))
        offset += a.size
    copies = iter(arrays)

    def take(a: Any) -> Any:
        return None if a is None else next(copies)

    gates = []
    for g in params.gates:  # in _gate_arrays' order
        iw0, iw1 = g.input_weights
        input_weights = (take(iw0), take(iw1))
        gates.append(_GateCopy(input_weights, take(g.hidden_weights), take(g.cell_weights), take(g.bias)))
    projection = take(params.projection_weights)
    norm = None if params.layer_norm is None else _LayerNormCopy(*(take(a) for a in params.layer_norm.arrays))
    return _PackingCopy((gates[0], gates[1], gates[2], gates[3]), projection, norm, flat, arrays)


class _WatchedBits(NamedTuple):
    """The bits of the watched arrays at one moment (:meth:`_WeightsWatch.take`), by how each is
    compared: small C-contiguous arrays with their bytes; larger ones with a copy for
    ``memcmp`` (the two addresses and the size, the arrays kept alive with them); the others
    with a copy, both seen as unsigned integers."""

    small: list[tuple[np.ndarray, bytes]]
    spans: list[tuple[int, int, int, np.ndarray, np.ndarray]]
    others: list[tuple[np.ndarray, np.ndarray]]

    def changed(self) -> bool:
        """Whether any bit of the arrays differs from the snapshot."""
        small, spans, others = self
        for live, bits in small:
            if live.tobytes() != bits:
                return True
        for live_address, copy_address, size, _, _ in spans:
            if _memcmp(live_address, copy_address, size):
                return True
        for live, copy in others:
            if not np.array_equal(live, copy):
                return True
        return False


class _WeightsWatch:
    """Weight arrays that may change outside the layer: :meth:`take` makes a snapshot of their
    bits as a packing copied them (:func:`_packing_copy`), whose
    :meth:`~_WatchedBits.changed` tells whether any bit differs since.

    Bit for bit, as packing would see them (a NaN equals itself, −0.0 differs from 0.0).
    C-contiguous arrays (the layer's own copies live in one) are compared as bytes up to
    :data:`BYTES_COMPARED` (0.2 µs for the 416 weights of an LSTM with I = 4 and H = 8, where
    ``memcmp`` through ctypes took 0.4), larger ones with the C library's ``memcmp`` (3 µs for
    the 24 832 of I = 32 and H = 64, where comparing them with NumPy as unsigned integers took
    13 µs, and as bytes 4). Other arrays, and every array where ``memcmp`` cannot be loaded,
    are compared with NumPy.
    """

    #: The largest C-contiguous array compared as bytes (copying it to bytes is then quicker
    #: than a call through ctypes).
    BYTES_COMPARED = 8192

    def __init__(self, arrays: list[np.ndarray], *, flat: bool) -> None:
        self._arrays = arrays
        self._flat = flat  # the arrays are the one flat buffer of the layer's own copies

    def take(self, packing: _PackingCopy) -> _WatchedBits:
        """A snapshot of the arrays whose bits are those ``packing`` copied from them."""
        memcmp = _bytes_comparer()
        small, spans, others = [], [], []
        copies = [packing.flat] if self._flat else packing.arrays
        for array, copy in zip(self._arrays, copies, strict=True):
            if array.flags.c_contiguous and array.nbytes <= self.BYTES_COMPARED:
                small.append((array, copy.tobytes()))
            elif memcmp is not None and array.flags.c_contiguous:
                spans.append((array.ctypes.data, copy.ctypes.data, array.nbytes, array, copy))
            else:
                bits = np.dtype(f"u{array.dtype.itemsize}")
                others.append((array.view(bits), copy.view(bits)))
        return _WatchedBits(small, spans, others)

    def release(self) -> None:
        """Drop the arrays."""
        self._arrays = []

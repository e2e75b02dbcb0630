"""What the LSTM layer returns: the forward's output and final states, and the gradients.

:class:`LSTMOutput` is the result of :meth:`LSTMLayer.apply`; :class:`LSTMGradients`, with
one :class:`LSTMGateGradients` per gate and :class:`LSTMLayerNormGradients` for the
layer-normalized cell, that of :meth:`LSTMLayer.apply_backward`, its weight gradients shaped
like the parameters' arrays and named like them.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from ._lstm_parameters import _LAYER_NORM_FIELDS, _array_repr
from ._lstm_weights import _named_layer_arrays

__all__ = ["LSTMOutput", "LSTMGateGradients", "LSTMLayerNormGradients", "LSTMGradients"]


@attrs.frozen(kw_only=True, eq=False)
class LSTMOutput:
    """What :meth:`LSTMLayer.apply` returns.

    ``output`` is ``(T, N, D·H)`` (``(N, T, D·H)`` when batch-first), direction 0 first on the
    feature axis; ``hidden`` and ``cell`` are the final states ``(L·D, N, H)``;
    ``training_cache`` is the buffer written by a training forward (the caller's object if one
    was given), else ``None``.
    """

    output: np.ndarray = attrs.field(repr=_array_repr)
    hidden: np.ndarray = attrs.field(repr=_array_repr)
    cell: np.ndarray = attrs.field(repr=_array_repr)
    training_cache: Any = attrs.field(default=None, repr=_array_repr)


@attrs.frozen(kw_only=True, eq=False)
class LSTMGateGradients:
    """Gradients of one gate's weights, shaped like :class:`LSTMGateDescriptor`'s fields.

    ``cell_weights`` is ``None`` when the gate has no peephole, ``bias`` when it has no bias.
    """

    input_weights: tuple[np.ndarray, np.ndarray | None] = attrs.field(repr=_array_repr)
    hidden_weights: np.ndarray = attrs.field(repr=_array_repr)
    cell_weights: np.ndarray | None = attrs.field(default=None, repr=_array_repr)
    bias: np.ndarray | None = attrs.field(default=None, repr=_array_repr)


@attrs.frozen(kw_only=True, eq=False)
class LSTMLayerNormGradients:
    """Gradients of an :class:`LSTMLayerNorm`'s arrays, shaped like them."""

    input_gain: np.ndarray = attrs.field(repr=_array_repr)
    input_bias: np.ndarray = attrs.field(repr=_array_repr)
    hidden_gain: np.ndarray = attrs.field(repr=_array_repr)
    hidden_bias: np.ndarray = attrs.field(repr=_array_repr)
    cell_gain: np.ndarray = attrs.field(repr=_array_repr)
    cell_bias: np.ndarray = attrs.field(repr=_array_repr)

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """The six arrays in field order (as :attr:`LSTMLayerNorm.arrays`)."""
        return tuple(getattr(self, name) for name in _LAYER_NORM_FIELDS)


@attrs.frozen(kw_only=True, eq=False)
class LSTMGradients:
    """What :meth:`LSTMLayer.apply_backward` returns, summed over batch and time.

    ``input`` is shaped like ``x``; ``hidden`` and ``cell`` (always given, also when the
    initial states were zeros) like the states, ``(L·D, N, P)`` and ``(L·D, N, H)``; one
    :class:`LSTMGateGradients` per gate; ``projection_weights`` (with a projection) and
    ``layer_norm`` (with the layer-normalized cell), else ``None``.
    """

    input: np.ndarray = attrs.field(repr=_array_repr)
    hidden: np.ndarray = attrs.field(repr=_array_repr)
    cell: np.ndarray = attrs.field(repr=_array_repr)
    input_gate: LSTMGateGradients
    forget_gate: LSTMGateGradients
    candidate_gate: LSTMGateGradients
    output_gate: LSTMGateGradients
    projection_weights: np.ndarray | None = attrs.field(default=None, repr=_array_repr)
    layer_norm: LSTMLayerNormGradients | None = None

    @property
    def gates(self) -> tuple[LSTMGateGradients, LSTMGateGradients, LSTMGateGradients, LSTMGateGradients]:
        """The four gate gradients in the order input, forget, candidate, output."""
        return (self.input_gate, self.forget_gate, self.candidate_gate, self.output_gate)

    def parameters(self) -> dict[str, np.ndarray]:
        """The weight gradients under the names of :meth:`LSTMLayer.parameters` (views of the
        arrays above, one per layer, direction, gate and field)."""
        return _named_layer_arrays(self.gates, self.projection_weights, self.layer_norm)

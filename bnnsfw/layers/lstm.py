"""The LSTM layer: stacked, bidirectional, peepholes, variable lengths, forward and backward.

Re-creates BNNS ``BNNSDirectApplyLSTMBatchTrainingCaching``,
``BNNSDirectApplyLSTMBatchBackward`` and ``BNNSComputeLSTMTrainingCacheCapacity`` as a
layer object. The math, shapes and every decision are in ``docs/lstm.md``; in short, for one
layer and direction at step t (gates in the order input, forget, candidate, output)::

    i = act_i(W_i x + U_i h + P_i c + b_i)      f = act_f(…)      g = act_g(…)
    c' = f ⊙ c + i ⊙ g
    o = act_o(W_o x + U_o h + P_o c' + b_o)     h' = o ⊙ act_h(c')

The object API also offers the variants of SPEC §4.1 (``docs/lstm.md``): ONNX ``clip``,
TensorFlow's ``cell_clip`` and ``projection_clip``, ``input_forget``, a reverse-only
direction, per-direction activations (:class:`LSTMActivations`), a projection
(``projection_size``, PyTorch's ``proj_size``), and the layer-normalized cell
(:class:`LSTMLayerNorm`).

How it runs: the layer validates, keeps the parameters and the training-cache frame, and
hands each call to its backend through the contract (:mod:`bnnsfw.backends.contract`):
``lstm_pack_weights`` once (again only when client-pointer weights change),
``lstm_forward`` for the whole stack, and ``lstm_backward``, which returns the input, state
and weight gradients. How the built-in backends compute is in ``docs/lstm.md``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
import warnings
from typing import Any, Iterator, NamedTuple, Sequence, cast

import attrs
import numpy as np

from .._named import read_only
from .._validation import (
    as_input,
    describe,
    finite_float,
    layer_dtype,
    overlap,
    parameter_array,
    positive_int,
)
from ..activation import Activation
from ..backends.contract import (
    LSTMBackwardRequest,
    LSTMCacheRequest,
    LSTMConfig,
    LSTMForwardRequest,
    LSTMGradientBuffers,
    LSTMPackedWeights,
    LSTMPackRequest,
)
from ..errors import InvalidParameterError, ShapeError, must_be
from ..filter import Filter, FilterParameters, guarded
from ._lstm_cache import (
    HEADER_BYTES,
    CacheHeader,
    CacheIdentity,
    as_byte_buffer,
    clear_header,
    digest,
    next_generation,
    read_header,
    write_header,
)

__all__ = [
    "LSTMGateDescriptor",
    "LSTMActivations",
    "LSTMLayerNorm",
    "LSTMParameters",
    "LSTMLayer",
    "LSTMOutput",
    "LSTMGateGradients",
    "LSTMLayerNormGradients",
    "LSTMGradients",
]

GATE_FIELDS = ("input_gate", "forget_gate", "candidate_gate", "output_gate")
#: How the names of :meth:`LSTMLayer.parameters` call the two directions.
DIRECTION_NAMES = ("forward", "reverse")
_DEFAULT_GATE_ACTIVATIONS = (
    Activation.sigmoid(), Activation.sigmoid(), Activation.tanh(), Activation.sigmoid())
_DEFAULT_HIDDEN_ACTIVATION = Activation.tanh()


# --------------------------------------------------------------------------------------
# Small converters and validators (one rule each; messages name the field).
# --------------------------------------------------------------------------------------
def _array_repr(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"<array {tuple(value.shape)} {value.dtype.name}>"
    if isinstance(value, tuple):
        inner = ", ".join(_array_repr(v) for v in value)
        return f"({inner})"
    return repr(value)


def _to_weight_pair(value: object) -> object:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, np.ndarray):
        return (value, None)
    return value


def _check_weight_pair(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, tuple) or len(value) != 2:
        raise InvalidParameterError(
            must_be("LSTMGateDescriptor.input_weights", "a pair (iw0, iw1) (iw1 None for one layer)", value)
        )


def _check_activation(where: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, Activation):
        raise InvalidParameterError(must_be(where, "an Activation or None", value))
    value.require_elementwise(where)


def _gate_activation(instance: object, attribute: attrs.Attribute, value: object) -> None:
    _check_activation(f"LSTMGateDescriptor.{attribute.name}", value)


def _param_activation(instance: object, attribute: attrs.Attribute, value: object) -> None:
    _check_activation(f"LSTMParameters.{attribute.name}", value)


def _check_flag(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParameterError(must_be(f"LSTMParameters.{attribute.name}", "True or False", value))


def _input_size(value: object) -> int:
    return positive_int("LSTMParameters.input_size", value)


def _hidden_size(value: object) -> int:
    return positive_int("LSTMParameters.hidden_size", value)


def _num_layers(value: object) -> int:
    return positive_int("LSTMParameters.num_layers", value)


def _dropout(value: object) -> float:
    return finite_float("LSTMParameters.dropout", value, low=0.0, high=1.0, high_open=True)


def _check_seed(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidParameterError(must_be("LSTMParameters.seed", "None or an integer >= 0", value))


def _dtype(value: object) -> np.dtype:
    return layer_dtype(value, "LSTMParameters.dtype")


def _limit(where: str, value: object) -> float | None:
    """``None`` or a finite number > 0 (a clamp's bound)."""
    if value is None:
        return None
    number = finite_float(where, value)
    if number <= 0.0:
        raise InvalidParameterError(must_be(where, "None or a number > 0", value))
    return number


def _clip(value: object) -> float | None:
    return _limit("LSTMParameters.clip", value)


def _cell_clip(value: object) -> float | None:
    return _limit("LSTMParameters.cell_clip", value)


def _projection_clip(value: object) -> float | None:
    return _limit("LSTMParameters.projection_clip", value)


def _projection_size(value: object) -> int | None:
    return None if value is None else positive_int("LSTMParameters.projection_size", value)


def _to_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def _epsilon(value: object) -> float:
    return finite_float("LSTMLayerNorm.epsilon", value, low=0.0)


def _activation_of_set(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, Activation):
        raise InvalidParameterError(must_be(f"LSTMActivations.{attribute.name}", "an Activation", value))
    value.require_elementwise(f"LSTMActivations.{attribute.name}")


# --------------------------------------------------------------------------------------
# Parameter objects.
# --------------------------------------------------------------------------------------
@attrs.frozen(kw_only=True, eq=False)
class LSTMGateDescriptor:
    """The weights and activation of one gate (``BNNSLSTMGateDescriptor``).

    Shapes, with L layers, D directions (2 if bidirectional), H hidden and I input units:

    Parameters
    ----------
    input_weights : (iw0, iw1)
        ``iw0`` (D, H, I) for layer 0; ``iw1`` (L−1, D, H, D·H) for layers 1…L−1, or ``None``
        when L = 1. A single array is taken as ``(iw0, None)``.
    hidden_weights : array (L, D, H, H)
        Recurrent weights ``U``; row = output unit, so the term is ``U @ h``.
    cell_weights : array or None
        Peephole: ``None``, a full matrix (L, D, H, H) (``P @ c``), or a diagonal (L, D, H)
        (``p ⊙ c``, ONNX's ``P``).
    bias : array (L, D, H) or None
        One bias per gate (PyTorch's two biases add up to it).
    activation : Activation or None
        ``None`` is the gate's default: sigmoid, or tanh for the candidate gate.

    Notes
    -----
    Shapes are checked against the sizes by :class:`LSTMParameters`, which also casts the
    arrays to the layer's dtype.
    """

    input_weights: tuple[Any, Any] = attrs.field(converter=_to_weight_pair, validator=_check_weight_pair,
                                                 repr=_array_repr)
    hidden_weights: Any = attrs.field(repr=_array_repr)
    cell_weights: Any = attrs.field(default=None, repr=_array_repr)
    bias: Any = attrs.field(default=None, repr=_array_repr)
    activation: Activation | None = attrs.field(default=None, validator=_gate_activation)

    @property
    def peephole(self) -> str | None:
        """``None``, ``"full"`` (a matrix per layer and direction) or ``"diagonal"``."""
        if self.cell_weights is None:
            return None
        return "full" if np.ndim(self.cell_weights) == 4 else "diagonal"

    def to_state(self) -> dict[str, Any]:
        """The gate as plain data: its arrays and its activation.

        Keys ``input_weights0``, ``input_weights1``, ``hidden_weights``, ``cell_weights`` and
        ``bias`` hold the arrays themselves (not copies; ``None`` where absent);
        ``activation`` is ``[function, alpha, beta]`` or ``None``. :meth:`from_state` reads
        it back.
        """
        return {
            "input_weights0": self.input_weights[0],
            "input_weights1": self.input_weights[1],
            "hidden_weights": self.hidden_weights,
            "cell_weights": self.cell_weights,
            "bias": self.bias,
            "activation": None if self.activation is None else self.activation.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LSTMGateDescriptor":
        """The gate that :meth:`to_state` described; absent optional entries are ``None``."""
        from .._state import StateReader

        reader = StateReader("LSTMGateDescriptor", state)
        activation = reader.optional("activation")
        gate = cls(
            input_weights=(reader.required("input_weights0"), reader.optional("input_weights1")),
            hidden_weights=reader.required("hidden_weights"),
            **reader.optional_entries("cell_weights", "bias"),
            activation=None if activation is None else Activation.from_state(activation),
        )
        reader.finish()
        return gate


@attrs.frozen(kw_only=True)
class LSTMActivations:
    """The five activations of one direction: the four gates' and ``act_h``.

    ``LSTMParameters.direction_activations`` takes one per direction, so that the two
    directions of a bidirectional LSTM may differ (ONNX's ``activations`` list gives one
    ``(f, g, h)`` triple per direction; :meth:`onnx` reads it).

    Parameters
    ----------
    input_gate, forget_gate, candidate_gate, output_gate : Activation
        Defaults sigmoid, sigmoid, tanh, sigmoid.
    hidden_activation : Activation
        ``act_h`` in ``h = o ⊙ act_h(c)``; default tanh.

    Examples
    --------
    >>> forward, backward = LSTMActivations.onnx(["Sigmoid", "Tanh", "Tanh",
    ...                                           "HardSigmoid", "LeakyRelu", "Softsign"],
    ...                                          activation_alpha=[0.25, 0.1], activation_beta=[0.4])
    >>> backward.input_gate
    Activation(function=<ActivationFunction.hard_sigmoid: 15>, alpha=0.25, beta=0.4)
    >>> backward.candidate_gate.alpha, backward.hidden_activation.function.name
    (0.1, 'softsign')
    """

    input_gate: Activation = attrs.field(factory=Activation.sigmoid, validator=_activation_of_set)
    forget_gate: Activation = attrs.field(factory=Activation.sigmoid, validator=_activation_of_set)
    candidate_gate: Activation = attrs.field(factory=Activation.tanh, validator=_activation_of_set)
    output_gate: Activation = attrs.field(factory=Activation.sigmoid, validator=_activation_of_set)
    hidden_activation: Activation = attrs.field(factory=Activation.tanh, validator=_activation_of_set)

    @property
    def gates(self) -> tuple[Activation, Activation, Activation, Activation]:
        """The gates' activations in the order input, forget, candidate, output."""
        return (self.input_gate, self.forget_gate, self.candidate_gate, self.output_gate)

    @classmethod
    def onnx(cls, activations: Sequence[str], activation_alpha: Sequence[float] = (),
             activation_beta: Sequence[float] = ()) -> tuple["LSTMActivations", ...]:
        """One set per direction from an ONNX ``LSTM`` node's attributes.

        ``activations`` holds 3 names per direction, ``(f, g, h)``: ``f`` for the input,
        forget and output gates, ``g`` for the candidate gate, ``h`` for ``act_h``. The
        values of ``activation_alpha`` and ``activation_beta`` are consumed in that order
        by the functions that take an alpha or a beta (:meth:`Activation.onnx`); a function
        left without one gets its ONNX default. Values left over are an error.
        """
        where = "LSTMActivations.onnx"
        names = list(activations)
        if len(names) not in (3, 6) or not all(isinstance(n, str) for n in names):
            raise InvalidParameterError(must_be(f"{where}(activations)",
                                                "3 names (f, g, h), or 6 for two directions", activations))
        alphas, betas = [float(a) for a in activation_alpha], [float(b) for b in activation_beta]
        made = []
        for name in names:
            try:
                takes_alpha, takes_beta = Activation.onnx_takes(name)
            except InvalidParameterError as error:
                raise InvalidParameterError(f"{where}(activations): {error}") from None
            alpha = alphas.pop(0) if takes_alpha and alphas else None
            beta = betas.pop(0) if takes_beta and betas else None
            made.append(Activation.onnx(name, alpha, beta))
        for label, left in (("activation_alpha", alphas), ("activation_beta", betas)):
            if left:
                raise InvalidParameterError(must_be(
                    f"{where}({label})", f"no longer than the functions of {names} that take one",
                    f"{len(left)} value(s) left over: {left}"))
        return tuple(cls(input_gate=f, forget_gate=f, candidate_gate=g, output_gate=f, hidden_activation=h)
                     for f, g, h in (made[k:k + 3] for k in range(0, len(made), 3)))

    def to_state(self) -> list[list[float]]:
        """The five activations as ``[function, alpha, beta]`` lists, in field order."""
        return [a.to_state() for a in (*self.gates, self.hidden_activation)]

    @classmethod
    def from_state(cls, state: object) -> "LSTMActivations":
        """The set that :meth:`to_state` described."""
        if not isinstance(state, (list, tuple)) or len(state) != 5:
            rule = "a list of 5 activations"
            raise InvalidParameterError(must_be("LSTMActivations.from_state(state)", rule, state))
        acts = [Activation.from_state(a) for a in state]
        return cls(input_gate=acts[0], forget_gate=acts[1], candidate_gate=acts[2], output_gate=acts[3],
                   hidden_activation=acts[4])


_LAYER_NORM_FIELDS = ("input_gain", "input_bias", "hidden_gain", "hidden_bias", "cell_gain", "cell_bias")


@attrs.frozen(kw_only=True, eq=False)
class LSTMLayerNorm:
    """Gains and biases of the layer-normalized LSTM (Ba, Kiros & Hinton 2016; SPEC §4.1).

    ``z = LN(W x; α_x, β_x) + LN(U h; α_h, β_h) + b`` over all 4H pre-activation units, and
    ``h = o ⊙ act_h(LN(c; α_c, β_c))``, where
    ``LN(a; α, β) = α ⊙ (a − mean(a)) / sqrt(var(a) + ε) + β`` with the biased variance.

    Parameters
    ----------
    input_gain, input_bias : array (L, D, 4H)
        ``α_x``, ``β_x``; the 4H units in the gate order input, forget, candidate, output.
    hidden_gain, hidden_bias : array (L, D, 4H)
        ``α_h``, ``β_h``.
    cell_gain, cell_bias : array (L, D, H)
        ``α_c``, ``β_c``.
    epsilon : float
        ``ε`` >= 0 (default 1e-5, PyTorch's; TF-Addons' ``LayerNormLSTMCell`` uses 1e-3).

    Notes
    -----
    Shapes are checked against the sizes by :class:`LSTMParameters`, which also casts the
    arrays to the layer's dtype.
    """

    input_gain: Any = attrs.field(repr=_array_repr)
    input_bias: Any = attrs.field(repr=_array_repr)
    hidden_gain: Any = attrs.field(repr=_array_repr)
    hidden_bias: Any = attrs.field(repr=_array_repr)
    cell_gain: Any = attrs.field(repr=_array_repr)
    cell_bias: Any = attrs.field(repr=_array_repr)
    epsilon: float = attrs.field(default=1e-5, converter=_epsilon)

    @classmethod
    def initial(cls, *, num_layers: int, hidden_size: int, num_directions: int = 1,
                epsilon: float = 1e-5) -> "LSTMLayerNorm":
        """Gains of one and biases of zero (where training starts, as in TF-Addons)."""
        size_l = positive_int("LSTMLayerNorm.initial(num_layers)", num_layers)
        h = positive_int("LSTMLayerNorm.initial(hidden_size)", hidden_size)
        size_d = positive_int("LSTMLayerNorm.initial(num_directions)", num_directions)
        wide, narrow = (size_l, size_d, 4 * h), (size_l, size_d, h)
        return cls(input_gain=np.ones(wide), input_bias=np.zeros(wide), hidden_gain=np.ones(wide),
                   hidden_bias=np.zeros(wide), cell_gain=np.ones(narrow), cell_bias=np.zeros(narrow),
                   epsilon=epsilon)

    @property
    def arrays(self) -> tuple[Any, ...]:
        """The six arrays in field order."""
        return tuple(getattr(self, name) for name in _LAYER_NORM_FIELDS)


@attrs.frozen(kw_only=True, eq=False)
class LSTMParameters:
    """Sizes, options and weights of an LSTM layer (``BNNSLayerParametersLSTM``).

    Parameters
    ----------
    input_size, hidden_size, num_layers : int
        I, H and L (all >= 1).
    bidirectional : bool
        Two directions (D = 2); direction 1 reads the sequence backwards.
    batch_first : bool
        Input and output are ``(N, T, ·)`` (BNNS layout NSE) instead of ``(T, N, ·)`` (SNE).
        States are ``(L·D, N, H)`` either way.
    dropout : float
        Probability in [0, 1) of zeroing an input of layers 1…L−1, in training only.
    seed : int or None
        Seeds the layer's dropout generator (``numpy.random.default_rng(seed)``).
    input_gate, forget_gate, candidate_gate, output_gate : LSTMGateDescriptor
    hidden_activation : Activation or None
        ``act_h`` in ``h = o ⊙ act_h(c)``; ``None`` is tanh.
    default_activations : bool
        Ignore every gate activation and ``hidden_activation``: sigmoid, sigmoid, tanh,
        sigmoid and tanh (BNNS flag 0x2).
    dtype : float32 or float64
        The layer's dtype; weights are cast to it (without a copy when they already have it,
        so a layer created with ``use_client_pointer`` sees later in-place updates).
    reverse : bool
        The fields from here on are the variants of SPEC §4.1 (``docs/lstm.md``), all off by
        default. ``reverse``: with one direction, read the sequence from its last step to
        its first (ONNX ``direction="reverse"``); :attr:`direction` names the three cases.
    direction_activations : sequence of LSTMActivations, or None
        One set of activations per direction (D of them), instead of the gates'
        ``activation``, ``hidden_activation`` and ``default_activations`` (which must then
        be left at their defaults).
    clip : float or None
        ONNX ``clip``: every activation input clamped to [−clip, clip], the gates'
        pre-activations and the argument of ``act_h``; the cell itself is not clamped.
    cell_clip : float or None
        TensorFlow's ``cell_clip``: the new cell clamped to [−cell_clip, cell_clip] and
        carried on clamped.
    projection_clip : float or None
        TensorFlow's ``proj_clip``: the projected hidden state clamped (needs a projection).
    input_forget : bool
        ONNX ``input_forget``: f = 1 − i; the forget gate's weights are not used (their
        gradients are zero).
    projection_size : int or None
        P, PyTorch's ``proj_size``: ``h = W_hr (o ⊙ act_h(c))`` with ``projection_weights``
        ``W_hr`` of shape (L, D, P, H). The hidden state, the outputs and the recurrent
        weights use P (``hidden_weights`` (L, D, H, P), ``iw1`` (L−1, D, H, D·P), states
        ``hidden`` (L·D, N, P)); the cell keeps H.
    projection_weights : array (L, D, P, H) or None
        Given exactly when ``projection_size`` is.
    layer_norm : LSTMLayerNorm or None
        The layer-normalized cell, with its gains, biases and epsilon.

    Examples
    --------
    >>> params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2,
    ...                                bidirectional=True, seed=0)
    >>> params.forget_gate.hidden_weights.shape
    (2, 2, 4, 4)
    >>> params.input_gate.input_weights[1].shape
    (1, 2, 4, 8)
    """

    input_size: int = attrs.field(converter=_input_size)
    hidden_size: int = attrs.field(converter=_hidden_size)
    num_layers: int = attrs.field(default=1, converter=_num_layers)
    bidirectional: bool = attrs.field(default=False, validator=_check_flag)
    batch_first: bool = attrs.field(default=False, validator=_check_flag)
    dropout: float = attrs.field(default=0.0, converter=_dropout)
    seed: int | None = attrs.field(default=None, validator=_check_seed)
    input_gate: LSTMGateDescriptor = attrs.field()
    forget_gate: LSTMGateDescriptor = attrs.field()
    candidate_gate: LSTMGateDescriptor = attrs.field()
    output_gate: LSTMGateDescriptor = attrs.field()
    hidden_activation: Activation | None = attrs.field(default=None, validator=_param_activation)
    default_activations: bool = attrs.field(default=False, validator=_check_flag)
    dtype: np.dtype = attrs.field(default=np.float32, converter=_dtype)
    reverse: bool = attrs.field(default=False, validator=_check_flag)
    direction_activations: tuple[LSTMActivations, ...] | None = attrs.field(default=None, converter=_to_tuple)
    clip: float | None = attrs.field(default=None, converter=_clip)
    cell_clip: float | None = attrs.field(default=None, converter=_cell_clip)
    projection_clip: float | None = attrs.field(default=None, converter=_projection_clip)
    input_forget: bool = attrs.field(default=False, validator=_check_flag)
    projection_size: int | None = attrs.field(default=None, converter=_projection_size)
    projection_weights: Any = attrs.field(default=None, repr=_array_repr)
    layer_norm: LSTMLayerNorm | None = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        for name in GATE_FIELDS:
            object.__setattr__(self, name, self._checked_gate(name, getattr(self, name)))
        self._check_variants()

    def _check_variants(self) -> None:
        """The cross-field rules of the SPEC §4.1 options; casts their arrays to the dtype."""
        where = "LSTMParameters"
        size_l, size_d, h = self.num_layers, self.num_directions, self.hidden_size
        if self.reverse and self.bidirectional:
            raise InvalidParameterError(must_be(
                f"{where}.reverse", "False when bidirectional (direction 1 already reads backwards)", True))
        sets = self.direction_activations
        if sets is not None:
            if (not isinstance(sets, tuple) or len(sets) != size_d
                    or not all(isinstance(a, LSTMActivations) for a in sets)):
                raise InvalidParameterError(must_be(
                    f"{where}.direction_activations", f"None or {size_d} LSTMActivations (one per direction)",
                    sets))
            if self.default_activations or self.hidden_activation is not None or any(
                    g.activation is not None for g in self.gates):
                raise InvalidParameterError(must_be(
                    f"{where}.direction_activations",
                    "None when a gate's activation, hidden_activation or default_activations is set "
                    "(one source of activations)", "LSTMActivations"))
        p = self.projection_size
        if p is None:
            if self.projection_weights is not None:
                raise InvalidParameterError(must_be(f"{where}.projection_weights",
                                                    "None without a projection_size", _array_repr(
                                                        self.projection_weights)))
            if self.projection_clip is not None:
                raise InvalidParameterError(must_be(f"{where}.projection_clip",
                                                    "None without a projection_size", self.projection_clip))
        else:
            shape = (size_l, size_d, p, h)
            if self.projection_weights is None:
                raise ShapeError(must_be(f"{where}.projection_weights", f"an array of shape {shape}", None))
            object.__setattr__(self, "projection_weights", parameter_array(
                f"{where}.projection_weights", self.projection_weights, self.dtype, shape, copy=False))
        norm = self.layer_norm
        if norm is not None:
            if not isinstance(norm, LSTMLayerNorm):
                raise InvalidParameterError(must_be(f"{where}.layer_norm", "None or an LSTMLayerNorm",
                                                    type(norm).__name__))
            wide, narrow = (size_l, size_d, 4 * h), (size_l, size_d, h)
            arrays = {name: parameter_array(f"{where}.layer_norm.{name}", getattr(norm, name), self.dtype,
                                            narrow if name.startswith("cell") else wide, copy=False)
                      for name in _LAYER_NORM_FIELDS}
            if any(arrays[name] is not getattr(norm, name) for name in _LAYER_NORM_FIELDS):
                object.__setattr__(self, "layer_norm", attrs.evolve(norm, **arrays))

    def _checked_gate(self, name: str, gate: object) -> LSTMGateDescriptor:
        """Every cross-field rule of one gate: shapes against the sizes, dtype, finiteness."""
        where = f"LSTMParameters.{name}"
        if not isinstance(gate, LSTMGateDescriptor):
            raise InvalidParameterError(must_be(where, "an LSTMGateDescriptor", type(gate).__name__))
        dt, size_l, size_d = self.dtype, self.num_layers, self.num_directions
        h, size_i, p = self.hidden_size, self.input_size, self.output_size

        def weight(field: str, value: object, shape: tuple[int, ...]) -> np.ndarray:
            if value is None:
                raise ShapeError(must_be(f"{where}.{field}", f"an array of shape {shape}", None))
            return parameter_array(f"{where}.{field}", value, dt, shape, copy=False)

        iw0 = weight("input_weights[0]", gate.input_weights[0], (size_d, h, size_i))
        raw = gate.input_weights[1]
        upper_shape = (size_l - 1, size_d, h, size_d * p)
        if size_l == 1:
            if raw is not None and np.shape(raw) != upper_shape:
                raise ShapeError(must_be(f"{where}.input_weights[1]", f"None (or of shape {upper_shape}) "
                                         "when num_layers == 1", _array_repr(raw)))
            iw1 = None
        else:
            iw1 = weight("input_weights[1]", raw, upper_shape)
        hw = weight("hidden_weights", gate.hidden_weights, (size_l, size_d, h, p))
        cw = None
        if gate.cell_weights is not None:
            cw = parameter_array(f"{where}.cell_weights", gate.cell_weights, dt, copy=False)
            full, diagonal = (size_l, size_d, h, h), (size_l, size_d, h)
            if cw.shape not in (full, diagonal):
                raise ShapeError(must_be(
                    f"{where}.cell_weights",
                    f"None, of shape {full} (full peephole) or {diagonal} (diagonal)", describe(cw)))
        bias = None if gate.bias is None else weight("bias", gate.bias, (size_l, size_d, h))
        if (iw0 is gate.input_weights[0] and iw1 is gate.input_weights[1] and hw is gate.hidden_weights
                and cw is gate.cell_weights and bias is gate.bias):
            return gate
        return LSTMGateDescriptor(input_weights=(iw0, iw1), hidden_weights=hw, cell_weights=cw, bias=bias,
                                  activation=gate.activation)

    # Derived facts.
    @property
    def num_directions(self) -> int:
        """D: 2 when bidirectional, else 1."""
        return 2 if self.bidirectional else 1

    @property
    def direction(self) -> str:
        """``"forward"``, ``"reverse"`` or ``"bidirectional"`` (ONNX's ``direction``)."""
        if self.bidirectional:
            return "bidirectional"
        return "reverse" if self.reverse else "forward"

    @property
    def output_size(self) -> int:
        """P, the size of the hidden state and of each direction's output: ``projection_size``
        with a projection, else ``hidden_size``."""
        return self.hidden_size if self.projection_size is None else self.projection_size

    def activations(self, direction: int = 0) -> LSTMActivations:
        """The activations ``direction`` really uses (defaults applied)."""
        if self.direction_activations is not None:
            if not 0 <= direction < self.num_directions:
                raise InvalidParameterError(must_be("LSTMParameters.activations(direction)",
                                                    f"in [0, {self.num_directions - 1}]", direction))
            return self.direction_activations[direction]
        gates = self.gate_activations
        return LSTMActivations(input_gate=gates[0], forget_gate=gates[1], candidate_gate=gates[2],
                               output_gate=gates[3], hidden_activation=self.cell_activation)

    @property
    def gates(self) -> tuple[LSTMGateDescriptor, LSTMGateDescriptor, LSTMGateDescriptor, LSTMGateDescriptor]:
        """The four gate descriptors in the order input, forget, candidate, output."""
        return (self.input_gate, self.forget_gate, self.candidate_gate, self.output_gate)

    @property
    def gate_activations(self) -> tuple[Activation, Activation, Activation, Activation]:
        """The activation each gate really uses (defaults applied; direction 0's when
        ``direction_activations`` are given)."""
        if self.direction_activations is not None:
            return self.direction_activations[0].gates
        if self.default_activations:
            return _DEFAULT_GATE_ACTIVATIONS
        used = [default if gate.activation is None else gate.activation
                for gate, default in zip(self.gates, _DEFAULT_GATE_ACTIVATIONS)]
        return (used[0], used[1], used[2], used[3])

    @property
    def cell_activation(self) -> Activation:
        """The hidden activation really used (``act_h``; tanh by default; direction 0's when
        ``direction_activations`` are given)."""
        if self.direction_activations is not None:
            return self.direction_activations[0].hidden_activation
        if self.default_activations or self.hidden_activation is None:
            return _DEFAULT_HIDDEN_ACTIVATION
        return self.hidden_activation

    @classmethod
    def random(
        cls,
        *,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bidirectional: bool = False,
        peepholes: str | None = None,
        bias: bool = True,
        seed: int | None = None,
        dtype: Any = np.float32,
        projection_size: int | None = None,
        layer_norm: bool = False,
        **options: Any,
    ) -> "LSTMParameters":
        """Parameters with weights drawn from U(−1/√H, 1/√H), as PyTorch and ONNX initialise.

        ``peepholes`` (``None``, ``"full"`` or ``"diagonal"``) gives the input, forget and
        output gates a peephole (the candidate gate none, as ONNX). Draws come from
        ``numpy.random.default_rng(seed)`` in float64, gate by gate (input, forget, candidate,
        output) and within a gate ``iw0, iw1, hidden, cell, bias``, then the projection
        weights when ``projection_size`` is given; ``seed`` also seeds the layer's dropout.
        ``layer_norm=True`` adds :meth:`LSTMLayerNorm.initial` (gains 1, biases 0). Other
        keyword ``options`` (``batch_first``, ``dropout``, ``clip``, ``reverse``, …) are passed
        to the constructor.
        """
        if peepholes not in (None, "full", "diagonal"):
            raise InvalidParameterError(
                must_be("LSTMParameters.random(peepholes)", "None, 'full' or 'diagonal'", peepholes))
        if not isinstance(layer_norm, (bool, np.bool_)):
            where = "LSTMParameters.random(layer_norm)"
            raise InvalidParameterError(must_be(where, "True or False", layer_norm))
        size_i = positive_int("LSTMParameters.input_size", input_size)
        h = positive_int("LSTMParameters.hidden_size", hidden_size)
        size_l = positive_int("LSTMParameters.num_layers", num_layers)
        p = h if projection_size is None else positive_int("LSTMParameters.projection_size", projection_size)
        size_d = 2 if bidirectional else 1
        rng = np.random.default_rng(seed)
        bound = 1.0 / math.sqrt(h)

        def draw(*shape: int) -> np.ndarray:
            return rng.uniform(-bound, bound, size=shape)

        gates: dict[str, Any] = {}
        for name in GATE_FIELDS:
            iw0 = draw(size_d, h, size_i)
            iw1 = draw(size_l - 1, size_d, h, size_d * p) if size_l > 1 else None
            hw = draw(size_l, size_d, h, p)
            cw = None
            if peepholes is not None and name != "candidate_gate":
                cw = draw(size_l, size_d, h, h) if peepholes == "full" else draw(size_l, size_d, h)
            b = draw(size_l, size_d, h) if bias else None
            gates[name] = LSTMGateDescriptor(input_weights=(iw0, iw1), hidden_weights=hw,
                                             cell_weights=cw, bias=b)
        if projection_size is not None:
            options.update(projection_size=p, projection_weights=draw(size_l, size_d, p, h))
        if layer_norm:
            options["layer_norm"] = LSTMLayerNorm.initial(num_layers=size_l, hidden_size=h,
                                                          num_directions=size_d)
        return cls(input_size=size_i, hidden_size=h, num_layers=size_l, bidirectional=bidirectional,
                   seed=seed, dtype=dtype, **gates, **options)

    def to_state(self) -> dict[str, Any]:
        """The parameters as plain data: sizes and options as numbers, strings and lists, and
        each gate's arrays under ``"<gate>/<key>"`` (``"forget_gate/bias"``, keys as in
        :meth:`LSTMGateDescriptor.to_state`; the arrays themselves, not copies).

        The gates' activations are the list ``gate_activations``, in gate order. Every value
        but the arrays is JSON-ready; :meth:`from_state` reads it back.

        >>> state = LSTMParameters.random(input_size=3, hidden_size=4, seed=0).to_state()
        >>> state["hidden_size"], state["forget_gate/hidden_weights"].shape
        (4, (1, 1, 4, 4))
        """
        state: dict[str, Any] = {
            "input_size": self.input_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "bidirectional": bool(self.bidirectional),
            "batch_first": bool(self.batch_first),
            "dropout": self.dropout,
            "seed": None if self.seed is None else int(self.seed),
            "default_activations": bool(self.default_activations),
            "hidden_activation": (None if self.hidden_activation is None
                                  else self.hidden_activation.to_state()),
            "dtype": self.dtype.name,
            "gate_activations": [],
        }
        for name, gate in zip(GATE_FIELDS, self.gates):
            gate_state = gate.to_state()
            state["gate_activations"].append(gate_state.pop("activation"))
            state.update({f"{name}/{key}": value for key, value in gate_state.items()})
        state.update(self._variants_state())
        return state

    def _variants_state(self) -> dict[str, Any]:
        """The SPEC §4.1 options that differ from their defaults (so that a BNNS-cell state is
        the same as before they existed): scalars, ``direction_activations`` as lists of
        activations, ``projection_weights`` and ``layer_norm/<field>`` arrays."""
        state: dict[str, Any] = {}
        for name in ("reverse", "input_forget"):
            if getattr(self, name):
                state[name] = True
        for name in ("clip", "cell_clip", "projection_clip", "projection_size"):
            if getattr(self, name) is not None:
                state[name] = getattr(self, name)
        if self.direction_activations is not None:
            state["direction_activations"] = [a.to_state() for a in self.direction_activations]
        if self.projection_weights is not None:
            state["projection_weights"] = self.projection_weights
        if self.layer_norm is not None:
            state["layer_norm/epsilon"] = self.layer_norm.epsilon
            state.update({f"layer_norm/{name}": array
                          for name, array in zip(_LAYER_NORM_FIELDS, self.layer_norm.arrays)})
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LSTMParameters":
        """The parameters that :meth:`to_state` described (validated like any others)."""
        from .._state import StateReader

        reader = StateReader("LSTMParameters", state)
        activations = reader.required("gate_activations")
        if not isinstance(activations, (list, tuple)) or len(activations) != len(GATE_FIELDS):
            raise InvalidParameterError(must_be(
                "LSTMParameters.from_state(state)['gate_activations']", f"a list of {len(GATE_FIELDS)}",
                activations))
        gates: dict[str, Any] = {
            name: LSTMGateDescriptor.from_state({**reader.prefixed(f"{name}/"), "activation": activation})
            for name, activation in zip(GATE_FIELDS, activations)}
        hidden_activation = reader.required("hidden_activation")
        variants: dict[str, Any] = {k: v for k, v in reader.optional_entries(
            "reverse", "input_forget", "clip", "cell_clip", "projection_clip", "projection_size",
            "projection_weights").items() if v is not None}
        sets = reader.optional("direction_activations")
        if sets is not None:
            variants["direction_activations"] = tuple(LSTMActivations.from_state(a) for a in sets)
        norm = reader.prefixed("layer_norm/")
        if norm:
            norm_reader = StateReader("LSTMLayerNorm", norm)
            entries = norm_reader.required_entries(*_LAYER_NORM_FIELDS, "epsilon")
            variants["layer_norm"] = LSTMLayerNorm(**entries)
            norm_reader.finish()
        parameters = cls(
            **reader.required_entries("input_size", "hidden_size", "num_layers", "bidirectional",
                                      "batch_first", "dropout", "seed", "default_activations", "dtype"),
            hidden_activation=None if hidden_activation is None else Activation.from_state(hidden_activation),
            **gates,
            **variants,
        )
        reader.finish()
        return parameters


# --------------------------------------------------------------------------------------
# Results.
# --------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------
# The layer.
# --------------------------------------------------------------------------------------
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


class _CacheSize(NamedTuple):
    payload: int
    format: str

    @property
    def nbytes(self) -> int:
        return HEADER_BYTES + self.payload


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


def _configuration(p: LSTMParameters) -> LSTMConfig:
    """The backend's view of the parameters (the contract's ``LSTMConfig``)."""
    sets = [p.activations(d) for d in range(p.num_directions)]
    differ = any(a != sets[0] for a in sets[1:])
    norm = p.layer_norm
    return LSTMConfig(
        input_size=p.input_size, hidden_size=p.hidden_size, num_layers=p.num_layers,
        num_directions=p.num_directions, dtype=p.dtype, gate_activations=sets[0].gates,
        hidden_activation=sets[0].hidden_activation,
        peepholes=(p.input_gate.peephole, p.forget_gate.peephole, p.candidate_gate.peephole,
                   p.output_gate.peephole),
        dropout=p.dropout if p.num_layers > 1 else 0.0,
        reverse=p.reverse,
        direction_activations=tuple((*a.gates, a.hidden_activation) for a in sets) if differ else None,
        clip=p.clip, cell_clip=p.cell_clip, projection_clip=p.projection_clip, input_forget=p.input_forget,
        projection_size=p.projection_size, layer_norm=norm is not None,
        layer_norm_epsilon=1e-5 if norm is None else norm.epsilon,
    )


class LSTMLayer(Filter):
    """A stacked (optionally bidirectional) LSTM with forward, training cache and backward.

    Parameters
    ----------
    parameters : LSTMParameters
    filter_parameters : FilterParameters, optional
        Backend, BLAS thread limit, and ``use_client_pointer`` (keep the weight arrays held
        by ``parameters`` and see in-place updates to them, instead of copying them once).

    Notes
    -----
    Training: :meth:`parameters` names the live weight arrays (copies made at creation, or
    the caller's with ``use_client_pointer``) and :meth:`LSTMGradients.parameters` their
    gradients, so ``optimizer.step(layer.parameters(), grads.parameters())`` trains the
    layer whatever the filter parameters. Once its arrays have been handed out, the layer
    compares them before each call with a copy taken when the backend last packed them and
    has them packed again when any element changed (``docs/conventions.md``).

    ``layer(x)`` is ``layer.apply(x)`` (inference). An unbatched ``x`` of shape ``(T, I)``
    (in either layout) is a batch of one: the states are then ``(L·D, H)`` and the output
    ``(T, D·H)``, as in PyTorch. ``dropout`` with one layer has no effect and warns once.

    Examples
    --------
    >>> import numpy as np
    >>> params = LSTMParameters.random(input_size=3, hidden_size=4, seed=0, dtype=np.float64)
    >>> layer = LSTMLayer(params)
    >>> x = np.ones((5, 2, 3))                    # (T, N, I)
    >>> out = layer.apply(x, training=True)
    >>> out.output.shape, out.hidden.shape
    ((5, 2, 4), (1, 2, 4))
    >>> grads = layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
    >>> grads.input.shape, grads.forget_gate.hidden_weights.shape
    ((5, 2, 3), (1, 1, 4, 4))
    >>> layer.close()
    """

    def __init__(self, parameters: LSTMParameters, filter_parameters: FilterParameters | None = None) -> None:
        if not isinstance(parameters, LSTMParameters):
            raise InvalidParameterError(
                must_be("LSTMLayer(parameters)", "an LSTMParameters", type(parameters).__name__))
        super().__init__(filter_parameters)
        if parameters.dropout > 0.0 and parameters.num_layers == 1:
            warnings.warn(
                f"LSTMParameters.dropout={parameters.dropout} has no effect with num_layers=1: dropout "
                "applies to the inputs of layers 1…L−1, between stacked layers, never after the last one.",
                UserWarning, stacklevel=2)
        client = self.filter_parameters.use_client_pointer
        public = parameters
        # The arrays to compare when the weights are watched (see _packed_weights).
        self._watched_arrays = _parameter_arrays(parameters)
        if not client:  # BNNS copies the weights at creation
            parameters, flat = _copied(parameters)
            self._watched_arrays = [flat]
            public = _with_arrays(parameters, read_only)
        self._params = parameters
        self._public = public
        # Whether the weight arrays may change outside the layer: the caller's (client
        # pointers) from the start, the layer's own copies once parameters() handed them out.
        self._watched = client
        self._stale = False  # the layer itself wrote new weights (load_state_dict)
        self._dtype = parameters.dtype
        self._config = _configuration(parameters)
        self._pack_lock = threading.Lock()
        self._weights_digests: dict[int, int] = {}  # by packed version
        self._packed: LSTMPackedWeights | None = None
        self._snapshot: list[np.ndarray] = []  # watched weights: their values as last packed
        self._packed_weights()
        self._rng: np.random.Generator | None = np.random.default_rng(parameters.seed)
        self._workspace: _Workspace | None = _Workspace()
        self._workspace_lock = threading.Lock()
        self._cache_sizes: dict[tuple[int, int], _CacheSize] = {}
        self._fingerprints: dict[tuple[int, int], int] = {}
        self._zero_state_digests: dict[int, int] = {}
        self._config_key = self._configuration_key()

    # ----------------------------------------------------------------------------------
    # Public API.
    # ----------------------------------------------------------------------------------
    @property
    def layer_parameters(self) -> LSTMParameters:
        """The parameters the layer computes with, holding its live weight arrays.

        With ``use_client_pointer`` the caller's parameter object; otherwise the copy made at
        creation, with read-only views of the layer's arrays (they show the current values;
        train through :meth:`parameters`).
        """
        self._check_open("layer_parameters")
        return self._public

    def _named_parameters(self) -> dict[str, np.ndarray]:
        p = self._params
        return _named_layer_arrays(p.gates, p.projection_weights, p.layer_norm)

    def _share_arrays(self) -> None:
        with self._pack_lock:
            if not self._watched:
                self._snapshot = [np.array(a, copy=True) for a in self._watched_arrays]
                self._watched = True

    def _state_written(self) -> None:
        self._stale = True

    def __call__(self, x: np.ndarray, hidden: np.ndarray | None = None, cell: np.ndarray | None = None,
                 sequence_lengths: Any = None) -> LSTMOutput:
        """``layer(x)`` is ``layer.apply(x)``: an inference forward."""
        return self.apply(x, hidden, cell, sequence_lengths)

    @guarded
    def training_cache_capacity(self, batch_size: int, seq_len: int) -> int:
        """Bytes a training forward of ``batch_size`` sequences of ``seq_len`` steps writes.

        ``64 + payload``, where the backend's payload is affine in ``seq_len · batch_size``
        (``BNNSComputeLSTMTrainingCacheCapacity``; the built-in backends' layout is in
        ``docs/lstm.md``).
        """
        self._check_open("training_cache_capacity")
        n = positive_int("LSTMLayer.training_cache_capacity(batch_size)", batch_size)
        t = positive_int("LSTMLayer.training_cache_capacity(seq_len)", seq_len)
        return self._cache_size(t, n).nbytes

    @guarded
    def apply(
        self,
        x: np.ndarray,
        hidden: np.ndarray | None = None,
        cell: np.ndarray | None = None,
        sequence_lengths: Any = None,
        training: bool = False,
        training_cache: Any = None,
    ) -> LSTMOutput:
        """Run the LSTM forward (``BNNSDirectApplyLSTMBatchTrainingCaching``).

        Parameters
        ----------
        x : array (T, N, I), or (N, T, I) when batch-first; or unbatched (T, I)
            An unbatched sequence is a batch of one: the output is then (T, D·P) and the
            states (L·D, P) and (L·D, H).
        hidden, cell : arrays (L·D, N, P) and (L·D, N, H), without N for an unbatched x, optional
            Initial states, layer-major then direction; zeros when omitted. P is
            ``parameters.output_size`` (H without a projection).
        sequence_lengths : N integers in [0, T], optional
            Steps at or past a sequence's length output zeros and keep its state; the reverse
            direction starts at the last valid step. A sequence of length 0 has zero outputs
            and zero final states (as ONNX Runtime gives).
        training : bool
            Apply dropout and write a training cache for :meth:`apply_backward`.
        training_cache : writable buffer, optional
            Where a training forward writes its cache (a ``numpy.uint8`` array, ``bytearray``
            or any writable buffer of at least :meth:`training_cache_capacity` bytes);
            allocated and returned when omitted.
        """
        self._check_open("apply")
        if not isinstance(training, (bool, np.bool_)):
            raise InvalidParameterError(must_be("LSTMLayer.apply(training)", "True or False", training))
        x_tm, seq_len, batch, unbatched = self._check_x("LSTMLayer.apply(x)", x)
        h0 = self._check_state("LSTMLayer.apply(hidden)", hidden, batch, unbatched, hidden=True)
        c0 = self._check_state("LSTMLayer.apply(cell)", cell, batch, unbatched)
        lengths = self._check_lengths("LSTMLayer.apply(sequence_lengths)", sequence_lengths, seq_len, batch,
                                      unbatched)
        size = self._cache_size(seq_len, batch)
        cache_object = buffer = None
        if training:
            if training_cache is None:
                buffer = cache_object = np.empty(size.nbytes, dtype=np.uint8)
            else:
                where = "LSTMLayer.apply(training_cache)"
                buffer = as_byte_buffer(where, training_cache, writable=True)
                self._check_cache_size(where, buffer, size, seq_len, batch)
                for name, array in (("x", x_tm), ("hidden", h0), ("cell", c0)):
                    if array is not None and overlap(buffer[:size.nbytes], array):
                        raise InvalidParameterError(must_be(
                            where, f"memory apart from {name} (the forward writes the cache)",
                            f"a buffer overlapping {name}"))
                cache_object = training_cache
        elif training_cache is not None:
            raise InvalidParameterError(must_be(
                "LSTMLayer.apply(training_cache)",
                "None when training=False (only a training forward writes a cache)",
                type(training_cache).__name__))
        p = self._params
        size_ld, h = p.num_layers * p.num_directions, p.hidden_size
        width = p.num_directions * p.output_size
        out_shape = (batch, seq_len, width) if p.batch_first else (seq_len, batch, width)
        output = np.empty(out_shape, dtype=self._dtype)
        h_out = np.empty((size_ld, batch, p.output_size), dtype=self._dtype)
        c_out = np.empty((size_ld, batch, h), dtype=self._dtype)
        output_tm = output.transpose(1, 0, 2) if p.batch_first else output
        with self._threads(), self._borrow_workspace() as workspace:
            weights = self._packed_weights()
            x_prepared = self._prepared_input(x_tm, lengths, workspace)
            if buffer is not None:
                clear_header(buffer)
            with self._payload(buffer, size, workspace, write=True) as payload:
                self._forward(weights, x_prepared, h0, c0, lengths, output_tm, h_out, c_out, payload,
                              workspace)
            if buffer is not None:
                write_header(buffer, fingerprint=self._fingerprint(size, seq_len, batch, lengths),
                             payload_bytes=size.payload, seq_len=seq_len, batch_size=batch,
                             itemsize=self._dtype.itemsize,
                             identity=CacheIdentity(self._weights_digests[weights.version],
                                                    weights.version & 0xFFFFFFFF, next_generation(),
                                                    digest(x_prepared), self._state_digest(h0, c0, batch)))
        if unbatched:  # drop the batch axis of one that was added
            output = output[0] if p.batch_first else output[:, 0]
            h_out, c_out = h_out[:, 0], c_out[:, 0]
        return LSTMOutput(output=output, hidden=h_out, cell=c_out, training_cache=cache_object)

    @guarded
    def apply_backward(
        self,
        x: np.ndarray,
        output_gradient: np.ndarray | None,
        hidden: np.ndarray | None = None,
        cell: np.ndarray | None = None,
        hidden_gradient: np.ndarray | None = None,
        cell_gradient: np.ndarray | None = None,
        sequence_lengths: Any = None,
        training_cache: Any = None,
    ) -> LSTMGradients:
        """Backpropagate through time (``BNNSDirectApplyLSTMBatchBackward``).

        Parameters
        ----------
        x, hidden, cell, sequence_lengths
            As given to the training forward. With a cache, ``hidden`` and ``cell`` are only
            checked (the cache holds them); without one the forward is recomputed from them.
        output_gradient : array like the output, or None
            ``None`` when only the final states carry gradient.
        hidden_gradient, cell_gradient : array (L·D, N, H), optional
            Gradients with respect to the final states; zeros when omitted.
        training_cache : buffer, optional
            The cache of the training forward. Without one the forward is recomputed, which
            is refused when the layer has dropout (the masks live in the cache).
        """
        self._check_open("apply_backward")
        x_tm, seq_len, batch, unbatched = self._check_x("LSTMLayer.apply_backward(x)", x)
        p = self._params
        width = p.num_directions * p.output_size
        dy = None
        if output_gradient is not None:
            where = "LSTMLayer.apply_backward(output_gradient)"
            if unbatched:
                dy = as_input(where, output_gradient, self._dtype, (seq_len, width))[:, None]
            else:
                shape = (batch, seq_len, width) if p.batch_first else (seq_len, batch, width)
                dy = as_input(where, output_gradient, self._dtype, shape)
                if p.batch_first:
                    dy = dy.transpose(1, 0, 2)
        h0 = self._check_state("LSTMLayer.apply_backward(hidden)", hidden, batch, unbatched, hidden=True)
        c0 = self._check_state("LSTMLayer.apply_backward(cell)", cell, batch, unbatched)
        dh_final = self._check_state("LSTMLayer.apply_backward(hidden_gradient)", hidden_gradient, batch,
                                     unbatched, hidden=True)
        dc_final = self._check_state("LSTMLayer.apply_backward(cell_gradient)", cell_gradient, batch,
                                     unbatched)
        lengths = self._check_lengths("LSTMLayer.apply_backward(sequence_lengths)", sequence_lengths,
                                      seq_len, batch, unbatched)
        size = self._cache_size(seq_len, batch)
        where = "LSTMLayer.apply_backward(training_cache)"
        buffer = header = None
        if training_cache is None:
            if self._config.dropout > 0.0:
                raise InvalidParameterError(must_be(
                    where, "the cache of the training forward when dropout > 0 (it holds the dropout masks)",
                    None))
        else:
            buffer = as_byte_buffer(where, training_cache, writable=False)
            self._check_cache_size(where, buffer, size, seq_len, batch)
            header = self._check_cache_header(where, buffer, size, seq_len, batch, lengths)
        gradients = self._gradient_buffers(seq_len, batch)
        with self._threads(), self._borrow_workspace() as workspace:
            weights = self._packed_weights()
            x_prepared = self._prepared_input(x_tm, lengths, workspace)
            if header is not None:
                self._check_cache_identity(where, header.identity, weights, x_prepared, h0, c0, batch)
            with self._payload(buffer, size, workspace, write=False) as payload:
                assert payload is not None  # without a cache: the recomputed forward's
                if buffer is None:  # recompute the forward, as BNNS does without a cache
                    size_ld, h = p.num_layers * p.num_directions, p.hidden_size
                    output_tm = workspace.array("recompute_output", (seq_len, batch, width), self._dtype)
                    h_out = workspace.array("recompute_hidden", (size_ld, batch, p.output_size), self._dtype)
                    c_out = workspace.array("recompute_cell", (size_ld, batch, h), self._dtype)
                    self._forward(weights, x_prepared, h0, c0, lengths, output_tm, h_out, c_out, payload,
                                  workspace)
                self.backend.lstm_backward(LSTMBackwardRequest(
                    config=self._config, weights=weights, x=x_prepared, cache=payload, output_gradient=dy,
                    hidden_gradient=dh_final, cell_gradient=dc_final, sequence_lengths=lengths,
                    gradients=gradients, workspace=workspace, threads=self.filter_parameters.n_threads))
        if buffer is not None and read_header(where, buffer) != header:
            raise InvalidParameterError(must_be(
                where, "left alone while apply_backward reads it",
                "a cache overwritten by another forward during the backward"))
        return self._gradients_result(gradients, unbatched)

    # ----------------------------------------------------------------------------------
    # Orchestration: the backend computes, the layer prepares and hands over.
    # ----------------------------------------------------------------------------------
    def _forward(self, weights: LSTMPackedWeights, x: np.ndarray, h0: np.ndarray | None,
                 c0: np.ndarray | None, lengths: np.ndarray | None, output_tm: np.ndarray,
                 h_out: np.ndarray, c_out: np.ndarray, payload: np.ndarray | None,
                 workspace: _Workspace) -> None:
        """One forward through the backend; a training forward when ``payload`` is given."""
        training = payload is not None
        masks = self._dropout_masks(x.shape[0], x.shape[1], workspace) if training else None
        self.backend.lstm_forward(LSTMForwardRequest(
            config=self._config, weights=weights, x=x, hidden=h0, cell=c0, sequence_lengths=lengths,
            output=output_tm, hidden_out=h_out, cell_out=c_out, training=training, cache=payload,
            dropout_masks=masks, workspace=workspace, threads=self.filter_parameters.n_threads))

    def _dropout_masks(self, seq_len: int, batch: int,
                       workspace: _Workspace) -> tuple[np.ndarray | None, ...] | None:
        """Inverted-dropout scales for the inputs of layers 1…L−1: 0 with probability p, else
        1/(1−p); drawn from the layer's generator in layer order."""
        config = self._config
        if config.dropout <= 0.0:
            return None
        assert self._rng is not None
        p = config.dropout
        masks: list[np.ndarray | None] = [None]
        for layer in range(1, config.num_layers):
            width = config.num_directions * config.output_size
            mask = workspace.array(f"dropout{layer}", (seq_len, batch, width), self._dtype)
            self._rng.random(dtype=self._dtype, out=mask)
            np.greater_equal(mask, p, out=mask)
            np.multiply(mask, 1.0 / (1.0 - p), out=mask)
            masks.append(mask)
        return tuple(masks)

    @contextlib.contextmanager
    def _payload(self, buffer: np.ndarray | None, size: _CacheSize, workspace: _Workspace, *,
                 write: bool) -> Iterator[np.ndarray | None]:
        """The cache payload the backend works on.

        The contract promises backends a payload aligned to the item size, so a caller's
        buffer at an odd address is staged through aligned workspace memory (copied in for
        backward, out for a forward): the backend then runs the same code wherever the
        caller's buffer lies. Without a buffer: ``None`` for a forward (inference), aligned
        workspace memory for backward (the recomputed forward).
        """
        if buffer is None:
            yield None if write else workspace.bytes("recompute", size.payload)
            return
        payload = buffer[HEADER_BYTES:size.nbytes]
        if payload.ctypes.data % self._dtype.itemsize == 0:
            yield payload
            return
        staged = workspace.bytes("staged_cache", size.payload)
        if not write:
            np.copyto(staged, payload)
        yield staged
        if write:
            np.copyto(payload, staged)

    def _packed_weights(self) -> LSTMPackedWeights:
        """The backend's packed weights, packed again only when the weights changed.

        Weights that may change outside the layer (client pointers, or arrays handed out by
        :meth:`parameters`) are compared with a copy taken at the last packing: one read of
        the weights per call, stopping at the first array that differs (packing also writes
        and transposes them). When any differs, or :meth:`load_state_dict` wrote new ones,
        the backend packs them again with the next ``version``. A layer whose arrays never
        left it pays nothing.
        """
        packed = self._packed
        if packed is not None and not self._stale and not (self._watched and self._weights_changed()):
            return packed
        with self._pack_lock:
            packed = self._packed
            if packed is not None and not self._stale and not (self._watched and self._weights_changed()):
                return packed
            params = self._params
            version = 0 if packed is None else packed.version + 1
            packed = self.backend.lstm_pack_weights(LSTMPackRequest(
                config=self._config, gates=params.gates, version=version,
                projection=params.projection_weights, layer_norm=params.layer_norm))
            if self._watched:
                self._snapshot = [np.array(a, copy=True) for a in self._watched_arrays]
            self._stale = False
            # What a training cache is stamped with: the weights it was computed from.
            self._weights_digests = {v: d for v, d in self._weights_digests.items() if v > version - 4}
            self._weights_digests[version] = digest(*_parameter_arrays(params), size=8)
            self._packed = packed
            return packed

    def _weights_changed(self) -> bool:
        """Whether any bit of the watched weights differs from the copy taken at the last packing.

        The arrays are compared as unsigned integers of their item size: bit for bit (a NaN
        equals itself, −0.0 differs from 0.0, as packing would see them), and about twice as
        fast as comparing floats. The layer's own copies live in one buffer, compared at once.
        """
        bits = np.dtype(f"u{self._dtype.itemsize}")
        pairs = zip(self._watched_arrays, self._snapshot)
        return not all(np.array_equal(a.view(bits), b.view(bits)) for a, b in pairs)

    def _gradient_buffers(self, seq_len: int, batch: int) -> LSTMGradientBuffers:
        """Gradients in the public structure (written by the backend), ``input`` time-major."""
        p = self._params
        size_l, size_d, h, size_i = p.num_layers, p.num_directions, p.hidden_size, p.input_size
        size_p = p.output_size
        dtype = self._dtype
        gates = []
        for gate in p.gates:
            iw1 = np.empty((size_l - 1, size_d, h, size_d * size_p), dtype) if size_l > 1 else None
            cw = None if gate.cell_weights is None else np.empty(np.shape(gate.cell_weights), dtype)
            bias = None if gate.bias is None else np.empty((size_l, size_d, h), dtype)
            gates.append(LSTMGateGradients(input_weights=(np.empty((size_d, h, size_i), dtype), iw1),
                                           hidden_weights=np.empty((size_l, size_d, h, size_p), dtype),
                                           cell_weights=cw, bias=bias))
        d_x = np.empty((batch, seq_len, size_i) if p.batch_first else (seq_len, batch, size_i), dtype)
        norm = None
        if p.layer_norm is not None:
            norm = LSTMLayerNormGradients(**{name: np.empty(np.shape(getattr(p.layer_norm, name)), dtype)
                                             for name in _LAYER_NORM_FIELDS})
        return LSTMGradientBuffers(
            input=d_x.transpose(1, 0, 2) if p.batch_first else d_x,
            hidden=np.empty((size_l * size_d, batch, size_p), dtype),
            cell=np.empty((size_l * size_d, batch, h), dtype),
            gates=(gates[0], gates[1], gates[2], gates[3]),
            projection=None if p.projection_size is None else np.empty((size_l, size_d, size_p, h), dtype),
            layer_norm=norm)

    def _gradients_result(self, buffers: LSTMGradientBuffers, unbatched: bool) -> LSTMGradients:
        gates = buffers.gates
        d_x = buffers.input.transpose(1, 0, 2) if self._params.batch_first else buffers.input
        d_h, d_c = buffers.hidden, buffers.cell
        if unbatched:
            d_x = buffers.input[:, 0]
            d_h, d_c = d_h[:, 0], d_c[:, 0]
        return LSTMGradients(input=d_x, hidden=d_h, cell=d_c,
                             input_gate=cast(LSTMGateGradients, gates[0]),
                             forget_gate=cast(LSTMGateGradients, gates[1]),
                             candidate_gate=cast(LSTMGateGradients, gates[2]),
                             output_gate=cast(LSTMGateGradients, gates[3]),
                             projection_weights=buffers.projection,
                             layer_norm=cast("LSTMLayerNormGradients | None", buffers.layer_norm))

    # ----------------------------------------------------------------------------------
    # Helpers.
    # ----------------------------------------------------------------------------------
    def _prepared_input(self, x_tm: np.ndarray, lengths: np.ndarray | None,
                        workspace: _Workspace) -> np.ndarray:
        """``x`` as a C-contiguous (T, N, I) array; steps past a sequence's end are zeroed, so
        whatever the caller padded with (even NaN) cannot reach the gradients."""
        if lengths is None and x_tm.flags.c_contiguous:
            return x_tm
        seq_len, batch, size_i = x_tm.shape
        x = workspace.array("input", (seq_len, batch, size_i), self._dtype)
        np.copyto(x, x_tm)
        if lengths is not None:
            x[np.arange(seq_len)[:, None] >= lengths[None, :]] = 0.0
        return x

    @contextlib.contextmanager
    def _borrow_workspace(self) -> Iterator[_Workspace]:
        """The layer's scratch space, or a private one if another thread is using it."""
        if self._workspace_lock.acquire(blocking=False):
            try:
                assert self._workspace is not None
                yield self._workspace
            finally:
                if self._workspace is not None:
                    self._workspace.trim()
                self._workspace_lock.release()
        else:
            yield _Workspace()

    def _cache_size(self, seq_len: int, batch: int) -> _CacheSize:
        """The backend's payload for T and N; the last few are kept (a call's fixed cost matters
        when the sequences are short)."""
        key = (seq_len, batch)
        size = self._cache_sizes.get(key)
        if size is None:
            layout = self.backend.lstm_cache_layout(LSTMCacheRequest(config=self._config, seq_len=seq_len,
                                                                     batch_size=batch))
            size = _CacheSize(int(layout.nbytes), str(layout.format))
            if len(self._cache_sizes) >= 8:
                self._cache_sizes.clear()
            self._cache_sizes[key] = size
        return size

    def _configuration_key(self) -> bytes:
        c = self._config
        acts = [[(a.function.value, a.alpha, a.beta) for a in c.activations(d)]
                for d in range(c.num_directions)]
        variants = (c.reverse, c.clip, c.cell_clip, c.projection_clip, c.input_forget, c.projection_size,
                    c.layer_norm, c.layer_norm_epsilon)
        return repr(("bnnsfw.LSTMLayer", c.input_size, c.hidden_size, c.num_layers, c.num_directions,
                     self._dtype.str, c.peepholes, acts, c.dropout > 0.0, variants)).encode()

    def _fingerprint(self, size: _CacheSize, seq_len: int, batch: int, lengths: np.ndarray | None) -> int:
        """64-bit digest of the configuration, the payload format and size, T, N and the lengths
        (kept per T and N for full-length sequences: a call's fixed cost matters when they are short)."""
        key = (seq_len, batch)
        if lengths is None and key in self._fingerprints:
            return self._fingerprints[key]
        digest = hashlib.blake2b(self._config_key, digest_size=8)
        digest.update(repr((size.format, size.payload, seq_len, batch)).encode())
        if lengths is not None:
            digest.update(lengths.astype("<i8").tobytes())
        value = int.from_bytes(digest.digest(), "little")
        if lengths is None:
            if len(self._fingerprints) >= 8:
                self._fingerprints.clear()
            self._fingerprints[key] = value
        return value

    def _check_cache_size(self, where: str, buffer: np.ndarray, size: _CacheSize, seq_len: int,
                          batch: int) -> None:
        if buffer.size < size.nbytes:
            call = f"training_cache_capacity(batch_size={batch}, seq_len={seq_len})"
            raise InvalidParameterError(
                must_be(where, f"at least {size.nbytes} bytes ({call})", f"{buffer.size} bytes"))

    def _check_cache_header(self, where: str, buffer: np.ndarray, size: _CacheSize, seq_len: int, batch: int,
                            lengths: np.ndarray | None) -> CacheHeader:
        header = read_header(where, buffer)
        if (header.seq_len, header.batch_size) != (seq_len, batch):
            raise InvalidParameterError(must_be(
                where, f"a cache written for T={seq_len}, N={batch}",
                f"a cache for T={header.seq_len}, N={header.batch_size}"))
        if header.itemsize != self._dtype.itemsize:
            raise InvalidParameterError(must_be(where, f"a cache of {self._dtype.name} data",
                                                f"a cache of {header.itemsize}-byte items"))
        if header.fingerprint != self._fingerprint(size, seq_len, batch, lengths):
            raise InvalidParameterError(must_be(
                where,
                "the cache of a training forward with this layer configuration and these sequence_lengths",
                "a cache written for another configuration or other sequence lengths"))
        return header

    def _state_digest(self, h0: np.ndarray | None, c0: np.ndarray | None, batch: int) -> int:
        """digest(h0, c0), zeros standing for a missing state (kept per N when both are missing)."""
        if h0 is None and c0 is None and batch in self._zero_state_digests:
            return self._zero_state_digests[batch]
        p = self._params
        zeros = np.zeros((p.num_layers * p.num_directions, batch, p.hidden_size), self._dtype)
        value = digest(zeros if h0 is None else h0, zeros if c0 is None else c0)
        if h0 is None and c0 is None:
            if len(self._zero_state_digests) >= 8:
                self._zero_state_digests.clear()
            self._zero_state_digests[batch] = value
        return value

    def _check_cache_identity(self, where: str, identity: CacheIdentity, weights: LSTMPackedWeights,
                              x: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None,
                              batch: int) -> None:
        """A cache is trusted only for the layer, weights and inputs of the forward that wrote it
        (the initial states are compared when the backward is given any)."""
        if identity.weights != self._weights_digests[weights.version]:
            changed = "" if identity.weights_version == weights.version & 0xFFFFFFFF else (
                f" (this layer's weights changed since: version {identity.weights_version} then, "
                f"{weights.version} now)")
            raise InvalidParameterError(must_be(
                where, "a cache written with the weights this layer computes with",
                f"a cache written by a layer with other weights{changed}"))
        if identity.x_digest != digest(x):
            raise InvalidParameterError(must_be(where, "the cache of the forward of this x",
                                                "a cache written for another x"))
        states_given = h0 is not None or c0 is not None
        if states_given and identity.state_digest != self._state_digest(h0, c0, batch):
            raise InvalidParameterError(must_be(
                where, "the cache of the forward from these initial hidden and cell states",
                "a cache written from other initial states"))

    def _check_x(self, where: str, x: object) -> tuple[np.ndarray, int, int, bool]:
        """``x`` as a time-major (T, N, I) view, T, N, and whether it came unbatched ``(T, I)``."""
        p = self._params
        size_i = p.input_size
        batched = f"(N, T, {size_i})" if p.batch_first else f"(T, N, {size_i})"
        text = f"{batched} or unbatched (T, {size_i})"
        array = as_input(where, x, self._dtype)
        if array.ndim not in (2, 3) or array.shape[-1] != size_i:
            raise ShapeError(must_be(where, f"of shape {text}", describe(array)))
        if 0 in array.shape[:-1]:
            raise ShapeError(must_be(where, f"of shape {text} with T >= 1 and N >= 1", describe(array)))
        unbatched = array.ndim == 2
        if unbatched:  # PyTorch's rule: a batch of one, in either layout
            array = array[:, None]
        elif p.batch_first:
            array = array.transpose(1, 0, 2)
        return array, array.shape[0], array.shape[1], unbatched

    def _check_state(self, where: str, value: object, batch: int, unbatched: bool, *,
                     hidden: bool = False) -> np.ndarray | None:
        """A hidden state (``hidden=True``: ``(L·D, N, P)``) or a cell state (``(L·D, N, H)``);
        without the N axis for an unbatched x, as in PyTorch."""
        if value is None:
            return None
        p = self._params
        projected = hidden and p.projection_size is not None
        size, name = (p.output_size, "P") if projected else (p.hidden_size, "H")
        size_ld = p.num_layers * p.num_directions
        if unbatched:  # states of an unbatched input are unbatched too, as in PyTorch
            text = f"(L·D, {name}) = {(size_ld, size)} for an unbatched x"
            return as_input(where, value, self._dtype, (size_ld, size), shape_text=text)[:, None]
        shape = (size_ld, batch, size)
        return as_input(where, value, self._dtype, shape, shape_text=f"(L·D, N, {name}) = {shape}")

    @staticmethod
    def _check_lengths(where: str, value: object, seq_len: int, batch: int,
                       unbatched: bool) -> np.ndarray | None:
        if value is None:
            return None
        lengths = np.asarray(value)
        if unbatched and lengths.ndim == 0:  # the one sequence's length
            lengths = lengths.reshape(1)
        if lengths.shape != (batch,):
            raise ShapeError(must_be(where, f"of shape ({batch},) (one length per sequence)",
                                     f"shape {tuple(lengths.shape)}"))
        if lengths.dtype.kind not in "iu":
            raise InvalidParameterError(must_be(where, "integers", lengths.dtype.name))
        if lengths.min() < 0 or lengths.max() > seq_len:
            raise InvalidParameterError(
                must_be(where, f"in [0, {seq_len}] (T = {seq_len})", lengths.tolist()))
        lengths = lengths.astype(np.int64)
        return None if (lengths == seq_len).all() else lengths

    # Filter hooks.
    def _release(self) -> None:
        self._packed = None
        self._snapshot = []
        self._watched_arrays = []
        self._workspace = None
        self._rng = None

    def _describe(self) -> str:
        p = self._params
        text = (f"input_size={p.input_size}, hidden_size={p.hidden_size}, num_layers={p.num_layers}, "
                f"bidirectional={p.bidirectional}, dtype={self._dtype.name}")
        if self._config.variants:
            text += f", variants={'+'.join(self._config.variants)}"
        return text

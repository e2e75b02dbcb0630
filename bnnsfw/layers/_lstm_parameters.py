"""The LSTM layer's parameter objects: sizes, options and weights, validated once.

:class:`LSTMParameters` holds the sizes and options of the stack and one
:class:`LSTMGateDescriptor` per gate; :class:`LSTMActivations` are one direction's activations
and :class:`LSTMLayerNorm` the gains and biases of the layer-normalized cell. Converters
normalise and validators reject, one rule each, with messages that name the field; the
cross-field rules (shapes against the sizes, the variants' options) are in
:class:`LSTMParameters`, which also casts every array to the layer's dtype. The shapes and
the variants are in ``docs/lstm.md``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import attrs
import numpy as np

from .._validation import describe, finite_float, layer_dtype, parameter_array, positive_int
from ..activation import Activation
from ..errors import InvalidParameterError, ShapeError, must_be

__all__ = ["GATE_FIELDS", "LSTMGateDescriptor", "LSTMActivations", "LSTMLayerNorm", "LSTMParameters"]

GATE_FIELDS = ("input_gate", "forget_gate", "candidate_gate", "output_gate")
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

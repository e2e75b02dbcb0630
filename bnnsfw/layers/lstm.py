"""The LSTM layer: stacked, bidirectional, peepholes, variable lengths, forward and backward.

Re-creates BNNS ``BNNSDirectApplyLSTMBatchTrainingCaching``,
``BNNSDirectApplyLSTMBatchBackward`` and ``BNNSComputeLSTMTrainingCacheCapacity`` as a
layer object. The math, shapes and every decision are in ``docs/lstm.md``; in short, for one
layer and direction at step t (gates in the order input, forget, candidate, output)::

    i = act_i(W_i x + U_i h + P_i c + b_i)      f = act_f(…)      g = act_g(…)
    c' = f ⊙ c + i ⊙ g
    o = act_o(W_o x + U_o h + P_o c' + b_o)     h' = o ⊙ act_h(c')

How it runs: per layer and direction the backend's ``lstm_forward_sequence`` kernel does
the input projection of all time steps as one matrix product, then the recurrence: each step
is one product ``U h_{t-1}`` into the step's feature-major ``(6H, N)`` block (previous cell,
gates, activated new cell) and a few in-place ufuncs. Backward runs
``lstm_backward_sequence`` (one fused pass and one product ``Uᵀ dz`` per step), then the
weight and input gradients as single products over all T·N columns. ``docs/lstm.md`` has
the details.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
from typing import Any, Iterator

import attrs
import numpy as np

from .._validation import as_input, describe, finite_float, layer_dtype, parameter_array, positive_int
from ..activation import Activation
from ..backends._lstm_kernels import INTERNAL_ORDER, PROJECTION_PAD, LSTMPeepholes, LSTMStepPlan, LSTMWeights
from ..errors import InvalidParameterError, ShapeError, must_be
from ..filter import Filter, FilterParameters
from ._lstm_cache import (
    CacheLayout,
    CacheViews,
    as_byte_buffer,
    clear_header,
    read_header,
    write_header,
)

__all__ = [
    "LSTMGateDescriptor",
    "LSTMParameters",
    "LSTMLayer",
    "LSTMOutput",
    "LSTMGateGradients",
    "LSTMGradients",
]

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

    def __attrs_post_init__(self) -> None:
        for name in GATE_FIELDS:
            object.__setattr__(self, name, self._checked_gate(name, getattr(self, name)))

    def _checked_gate(self, name: str, gate: object) -> LSTMGateDescriptor:
        """Every cross-field rule of one gate: shapes against the sizes, dtype, finiteness."""
        where = f"LSTMParameters.{name}"
        if not isinstance(gate, LSTMGateDescriptor):
            raise InvalidParameterError(must_be(where, "an LSTMGateDescriptor", type(gate).__name__))
        dt, size_l, size_d = self.dtype, self.num_layers, self.num_directions
        h, size_i = self.hidden_size, self.input_size

        def weight(field: str, value: object, shape: tuple[int, ...]) -> np.ndarray:
            if value is None:
                raise ShapeError(must_be(f"{where}.{field}", f"an array of shape {shape}", None))
            return parameter_array(f"{where}.{field}", value, dt, shape, copy=False)

        iw0 = weight("input_weights[0]", gate.input_weights[0], (size_d, h, size_i))
        raw = gate.input_weights[1]
        upper_shape = (size_l - 1, size_d, h, size_d * h)
        if size_l == 1:
            if raw is not None and np.shape(raw) != upper_shape:  # type: ignore[arg-type]
                raise ShapeError(must_be(f"{where}.input_weights[1]", f"None (or of shape {upper_shape}) "
                                         "when num_layers == 1", _array_repr(raw)))
            iw1 = None
        else:
            iw1 = weight("input_weights[1]", raw, upper_shape)
        hw = weight("hidden_weights", gate.hidden_weights, (size_l, size_d, h, h))
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
    def gates(self) -> tuple[LSTMGateDescriptor, LSTMGateDescriptor, LSTMGateDescriptor, LSTMGateDescriptor]:
        """The four gate descriptors in the order input, forget, candidate, output."""
        return (self.input_gate, self.forget_gate, self.candidate_gate, self.output_gate)

    @property
    def gate_activations(self) -> tuple[Activation, Activation, Activation, Activation]:
        """The activation each gate really uses (defaults applied)."""
        if self.default_activations:
            return _DEFAULT_GATE_ACTIVATIONS
        return tuple(  # type: ignore[return-value]
            default if gate.activation is None else gate.activation
            for gate, default in zip(self.gates, _DEFAULT_GATE_ACTIVATIONS)
        )

    @property
    def cell_activation(self) -> Activation:
        """The hidden activation really used (``act_h``; tanh by default)."""
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
        **options: Any,
    ) -> "LSTMParameters":
        """Parameters with weights drawn from U(−1/√H, 1/√H), as PyTorch and ONNX initialise.

        ``peepholes`` (``None``, ``"full"`` or ``"diagonal"``) gives the input, forget and
        output gates a peephole (the candidate gate none, as ONNX). Draws come from
        ``numpy.random.default_rng(seed)`` in float64, gate by gate (input, forget, candidate,
        output) and within a gate ``iw0, iw1, hidden, cell, bias``; ``seed`` also seeds the
        layer's dropout. Other keyword ``options`` (``batch_first``, ``dropout``,
        ``hidden_activation``, …) are passed to the constructor.
        """
        if peepholes not in (None, "full", "diagonal"):
            raise InvalidParameterError(
                must_be("LSTMParameters.random(peepholes)", "None, 'full' or 'diagonal'", peepholes))
        size_i = positive_int("LSTMParameters.input_size", input_size)
        h = positive_int("LSTMParameters.hidden_size", hidden_size)
        size_l = positive_int("LSTMParameters.num_layers", num_layers)
        size_d = 2 if bidirectional else 1
        rng = np.random.default_rng(seed)
        bound = 1.0 / math.sqrt(h)

        def draw(*shape: int) -> np.ndarray:
            return rng.uniform(-bound, bound, size=shape)

        gates: dict[str, Any] = {}
        for name in GATE_FIELDS:
            iw0 = draw(size_d, h, size_i)
            iw1 = draw(size_l - 1, size_d, h, size_d * h) if size_l > 1 else None
            hw = draw(size_l, size_d, h, h)
            cw = None
            if peepholes is not None and name != "candidate_gate":
                cw = draw(size_l, size_d, h, h) if peepholes == "full" else draw(size_l, size_d, h)
            b = draw(size_l, size_d, h) if bias else None
            gates[name] = LSTMGateDescriptor(input_weights=(iw0, iw1), hidden_weights=hw,
                                             cell_weights=cw, bias=b)
        return cls(input_size=size_i, hidden_size=h, num_layers=size_l, bidirectional=bidirectional,
                   seed=seed, dtype=dtype, **gates, **options)


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
class LSTMGradients:
    """What :meth:`LSTMLayer.apply_backward` returns, summed over batch and time.

    ``input`` is shaped like ``x``; ``hidden`` and ``cell`` (always given, also when the
    initial states were zeros) like the states ``(L·D, N, H)``; one :class:`LSTMGateGradients`
    per gate.
    """

    input: np.ndarray = attrs.field(repr=_array_repr)
    hidden: np.ndarray = attrs.field(repr=_array_repr)
    cell: np.ndarray = attrs.field(repr=_array_repr)
    input_gate: LSTMGateGradients
    forget_gate: LSTMGateGradients
    candidate_gate: LSTMGateGradients
    output_gate: LSTMGateGradients

    @property
    def gates(self) -> tuple[LSTMGateGradients, LSTMGateGradients, LSTMGateGradients, LSTMGateGradients]:
        """The four gate gradients in the order input, forget, candidate, output."""
        return (self.input_gate, self.forget_gate, self.candidate_gate, self.output_gate)


# --------------------------------------------------------------------------------------
# The layer.
# --------------------------------------------------------------------------------------
class _Workspace:
    """Scratch arrays reused across calls, grown on demand."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def bytes(self, name: str, nbytes: int) -> np.ndarray:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < nbytes:
            buffer = np.empty(max(nbytes, 1), dtype=np.uint8)
            self._buffers[name] = buffer
        return buffer[:nbytes]

    def array(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return self.bytes(name, math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


class LSTMLayer(Filter):
    """A stacked (optionally bidirectional) LSTM with forward, training cache and backward.

    Parameters
    ----------
    parameters : LSTMParameters
    filter_parameters : FilterParameters, optional
        Backend, BLAS thread limit, and ``use_client_pointer`` (re-read the weight arrays held
        by ``parameters`` at every call instead of copying them once).

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
        self._params = parameters
        self._dtype = parameters.dtype
        self._plan = LSTMStepPlan.build(
            parameters.hidden_size,
            parameters.gate_activations,
            parameters.cell_activation,
            tuple(g.peephole for g in parameters.gates),  # type: ignore[arg-type]
        )
        self._weights: list[list[LSTMWeights]] | None = (
            None if self.filter_parameters.use_client_pointer else self._stack_weights()
        )
        self._rng: np.random.Generator | None = np.random.default_rng(parameters.seed)
        self._workspace: _Workspace | None = _Workspace()
        self._workspace_lock = threading.Lock()
        self._layouts: dict[tuple[int, int, bool], CacheLayout] = {}
        self._config_key = self._configuration_key()

    # ----------------------------------------------------------------------------------
    # Public API.
    # ----------------------------------------------------------------------------------
    @property
    def parameters(self) -> LSTMParameters:
        """The parameters the layer was created with."""
        return self._params

    def training_cache_capacity(self, batch_size: int, seq_len: int) -> int:
        """Bytes a training forward of ``batch_size`` sequences of ``seq_len`` steps writes.

        Exactly ``64 + itemsize · seq_len · batch_size · k`` for a ``k`` fixed by the
        configuration (see ``docs/lstm.md``) (``BNNSComputeLSTMTrainingCacheCapacity``).
        """
        self._check_open("training_cache_capacity")
        n = positive_int("LSTMLayer.training_cache_capacity(batch_size)", batch_size)
        t = positive_int("LSTMLayer.training_cache_capacity(seq_len)", seq_len)
        return self._layout(t, n, training=True).nbytes

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
        x : array (T, N, I), or (N, T, I) when batch-first
        hidden, cell : array (L·D, N, H), optional
            Initial states, layer-major then direction; zeros when omitted.
        sequence_lengths : N integers in [1, T], optional
            Steps at or past a sequence's length output zeros and keep its state; the reverse
            direction starts at the last valid step.
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
        x_tm, seq_len, batch = self._check_x("LSTMLayer.apply(x)", x)
        h0 = self._check_state("LSTMLayer.apply(hidden)", hidden, batch)
        c0 = self._check_state("LSTMLayer.apply(cell)", cell, batch)
        lengths = self._check_lengths("LSTMLayer.apply(sequence_lengths)", sequence_lengths, seq_len, batch)
        layout = self._layout(seq_len, batch, training=bool(training))
        cache_object = None
        if training:
            if training_cache is None:
                buffer = cache_object = np.empty(layout.nbytes, dtype=np.uint8)
            else:
                where = "LSTMLayer.apply(training_cache)"
                buffer = as_byte_buffer(where, training_cache, writable=True)
                self._check_cache_size(where, buffer, layout)
                cache_object = training_cache
        elif training_cache is not None:
            raise InvalidParameterError(must_be(
                "LSTMLayer.apply(training_cache)",
                "None when training=False (only a training forward writes a cache)",
                type(training_cache).__name__))
        p = self._params
        size_ld, h = p.num_layers * p.num_directions, p.hidden_size
        width = p.num_directions * h
        out_shape = (batch, seq_len, width) if p.batch_first else (seq_len, batch, width)
        output = np.empty(out_shape, dtype=self._dtype)
        h_out = np.empty((size_ld, batch, h), dtype=self._dtype)
        c_out = np.empty((size_ld, batch, h), dtype=self._dtype)
        output_tm = output.transpose(1, 0, 2) if p.batch_first else output
        with self._threads(), self._borrow_workspace() as workspace:
            weights = self._current_weights()
            if training:
                clear_header(buffer)
            else:
                buffer = workspace.bytes("forward", layout.nbytes)
            views = layout.bind(buffer)
            x2 = self._prepared_input(x_tm, lengths, workspace)
            self._forward(weights, x2, h0, c0, lengths, views, output_tm, h_out, c_out, bool(training),
                          workspace)
            if training:
                write_header(buffer, layout, self._fingerprint(layout, lengths))
        return LSTMOutput(output=output, hidden=h_out, cell=c_out, training_cache=cache_object)

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
        x_tm, seq_len, batch = self._check_x("LSTMLayer.apply_backward(x)", x)
        p = self._params
        width = p.num_directions * p.hidden_size
        dy = None
        if output_gradient is not None:
            shape = (batch, seq_len, width) if p.batch_first else (seq_len, batch, width)
            dy = as_input("LSTMLayer.apply_backward(output_gradient)", output_gradient, self._dtype, shape)
            if p.batch_first:
                dy = dy.transpose(1, 0, 2)
        h0 = self._check_state("LSTMLayer.apply_backward(hidden)", hidden, batch)
        c0 = self._check_state("LSTMLayer.apply_backward(cell)", cell, batch)
        dh_final = self._check_state("LSTMLayer.apply_backward(hidden_gradient)", hidden_gradient, batch)
        dc_final = self._check_state("LSTMLayer.apply_backward(cell_gradient)", cell_gradient, batch)
        lengths = self._check_lengths("LSTMLayer.apply_backward(sequence_lengths)", sequence_lengths,
                                      seq_len, batch)
        layout = self._layout(seq_len, batch, training=True)
        where = "LSTMLayer.apply_backward(training_cache)"
        buffer = None
        if training_cache is None:
            if self._has_dropout:
                raise InvalidParameterError(must_be(
                    where, "the cache of the training forward when dropout > 0 (it holds the dropout masks)",
                    None))
        else:
            buffer = as_byte_buffer(where, training_cache, writable=False)
            self._check_cache_size(where, buffer, layout)
            self._check_cache_header(where, buffer, layout, lengths)
        with self._threads(), self._borrow_workspace() as workspace:
            weights = self._current_weights()
            x2 = self._prepared_input(x_tm, lengths, workspace)
            if buffer is None:  # recompute the forward, as BNNS does without a cache
                buffer = workspace.bytes("recompute", layout.nbytes)
                size_ld, h = p.num_layers * p.num_directions, p.hidden_size
                views = layout.bind(buffer)
                output_tm = workspace.array("recompute_output", (seq_len, batch, width), self._dtype)
                states = np.empty((2, size_ld, batch, h), self._dtype)
                self._forward(weights, x2, h0, c0, lengths, views, output_tm, states[0], states[1], True,
                              workspace)
            else:
                views = layout.bind(buffer)
            return self._backward(weights, x2, dy, dh_final, dc_final, lengths, views, workspace)

    # ----------------------------------------------------------------------------------
    # Forward and backward, next to each other.
    # ----------------------------------------------------------------------------------
    def _forward(self, weights: list[list[LSTMWeights]], x2: np.ndarray, h0: np.ndarray | None,
                 c0: np.ndarray | None, lengths: np.ndarray | None, views: CacheViews, output_tm: np.ndarray,
                 h_out: np.ndarray, c_out: np.ndarray, training: bool, workspace: _Workspace) -> None:
        """All layers forward; writes the cache views, the output and the final states.

        Per layer and direction, the backend's ``lstm_forward_sequence`` runs the projection
        and the recurrence and writes that direction's columns of the output (or of the next
        layer's input).
        """
        p = self._params
        seq_len, batch = output_tm.shape[:2]
        size_d, h = p.num_directions, p.hidden_size
        active, inactive = self._step_masks(lengths, seq_len, batch)
        forward = self.backend.lstm_forward_sequence  # type: ignore[attr-defined]
        layer_input = x2
        for layer in range(p.num_layers):
            last = layer == p.num_layers - 1
            target = output_tm if last else views.inputs[layer + 1]
            assert target is not None
            for d in range(size_d):
                index = layer * size_d + d
                forward(self._plan, weights[layer][d], layer_input,
                        None if h0 is None else h0[index], None if c0 is None else c0[index],
                        views.steps[layer][d], views.pre[layer][d], views.hidden[layer][d],
                        target[:, :, d * h:(d + 1) * h], h_out[index], c_out[index],
                        reverse=d == 1, inactive=inactive, scratch=workspace)
            if active is not None:
                target[~active] = 0.0
            if not last:
                mask = views.masks[layer + 1]
                if training and self._has_dropout:
                    assert mask is not None
                    self._draw_dropout(mask)
                    np.multiply(target, mask, out=target)
                layer_input = target.reshape(seq_len * batch, size_d * h)

    def _backward(self, weights: list[list[LSTMWeights]], x2: np.ndarray, dy: np.ndarray | None,
                  dh_final: np.ndarray | None, dc_final: np.ndarray | None, lengths: np.ndarray | None,
                  views: CacheViews, workspace: _Workspace) -> LSTMGradients:
        """All layers backward, top layer first: per layer and direction the backend's
        ``lstm_backward_sequence`` leaves dGates feature-major ``(4H, T·N)``, then the weight and
        input gradients are one product each."""
        p = self._params
        seq_len, _, batch = views.steps[0][0].shape
        size_l, size_d, h = p.num_layers, p.num_directions, p.hidden_size
        dtype = self._dtype
        active, inactive = self._step_masks(lengths, seq_len, batch)
        backward = self.backend.lstm_backward_sequence  # type: ignore[attr-defined]
        grads = _GradientArrays(p)
        d_hidden = np.empty((size_l * size_d, batch, h), dtype)
        d_cell = np.empty((size_l * size_d, batch, h), dtype)
        d_gates = workspace.array("d_gates", (4 * h, seq_len * batch), dtype)
        c_new = workspace.array("cell_new", (seq_len, h, batch), dtype) if self._plan.needs_cell else None
        d_input = None
        for layer in range(size_l - 1, -1, -1):
            upper = views.inputs[layer]
            layer_input = x2 if upper is None else upper.reshape(seq_len * batch, size_d * h)
            if layer == 0:
                d_input = np.empty(layer_input.shape, dtype)
            else:
                d_input = workspace.array(f"d_input{layer % 2}", layer_input.shape, dtype)
            for d in range(size_d):
                index = layer * size_d + d
                w = weights[layer][d]
                backward(self._plan, w, views.steps[layer][d], views.pre[layer][d],
                         None if dy is None else dy[:, :, d * h:(d + 1) * h],
                         None if dh_final is None else dh_final[index],
                         None if dc_final is None else dc_final[index], d_hidden[index], d_cell[index],
                         d_gates,
                         reverse=d == 1, active=active, inactive=inactive, c_new=c_new, scratch=workspace)
                self._weight_gradients(w, layer, d, layer_input, views, d_gates, c_new, d_input, grads,
                                       workspace)
            if layer > 0:
                mask = views.masks[layer]
                if mask is not None:
                    np.multiply(d_input, mask.reshape(d_input.shape), out=d_input)
                dy = d_input.reshape(seq_len, batch, size_d * h)
        assert d_input is not None
        d_x = d_input.reshape(seq_len, batch, p.input_size)
        if p.batch_first:
            d_x = np.ascontiguousarray(d_x.transpose(1, 0, 2))
        return grads.result(d_x, d_hidden, d_cell)

    def _weight_gradients(self, w: LSTMWeights, layer: int, d: int, layer_input: np.ndarray,
                          views: CacheViews, d_gates: np.ndarray, c_new: np.ndarray | None,
                          d_input: np.ndarray, grads: "_GradientArrays", workspace: _Workspace) -> None:
        """Weight, bias, peephole and input gradients of one layer and direction: one product each
        over all T·N columns of ``d_gates`` (4H, T·N)."""
        backend, plan, dtype = self.backend, self._plan, self._dtype
        four_h, columns = d_gates.shape
        h = four_h // 4
        d_wx = backend.gemm(d_gates, layer_input)
        before = views.hidden[layer][d]
        assert before is not None  # a training cache keeps the states
        hidden = _columns(before, workspace.array("hidden_columns", (h, columns), dtype))
        d_u = backend.gemm(d_gates, hidden, trans_b=True)
        d_bias = d_gates.sum(axis=1)
        d_peep: list[np.ndarray | None] = [None] * 4
        if any(plan.peepholes):
            cell_prev = _columns(views.steps[layer][d][:, :h],
                                 workspace.array("cell_columns", (h, columns), dtype))
            d_full_pre = None
            if w.full_pre_grad is not None:
                d_full_pre = backend.gemm(d_gates, cell_prev, trans_b=True)
            for gate, kind in enumerate(plan.peepholes):
                if kind is None:
                    continue
                block = d_gates[gate * h:(gate + 1) * h]
                if gate < 3:
                    source = cell_prev
                else:  # the output gate sees the new cell
                    assert c_new is not None
                    source = _columns(c_new, workspace.array("cell_new_columns", (h, columns), dtype))
                if kind == "full" and gate < 3:
                    assert d_full_pre is not None
                    d_peep[gate] = d_full_pre[gate * h:(gate + 1) * h]
                elif kind == "full":
                    d_peep[gate] = backend.gemm(block, source, trans_b=True)
                else:
                    d_peep[gate] = np.einsum("hr,hr->h", block, source)
        backend.gemm(d_gates, w.wx_t, out=d_input, trans_a=True, trans_b=True, beta=0.0 if d == 0 else 1.0)
        grads.store(layer, d, d_wx, d_u, d_bias, d_peep)

    # ----------------------------------------------------------------------------------
    # Helpers.
    # ----------------------------------------------------------------------------------
    def _draw_dropout(self, mask: np.ndarray) -> None:
        """Inverted-dropout scales: 0 with probability p, else 1/(1−p); from the layer's generator."""
        assert self._rng is not None
        p = self._params.dropout
        if mask.flags.aligned:
            self._rng.random(dtype=self._dtype, out=mask)
        else:  # a caller's buffer at an odd address
            mask[...] = self._rng.random(mask.shape, dtype=self._dtype)
        np.greater_equal(mask, p, out=mask)
        np.multiply(mask, 1.0 / (1.0 - p), out=mask)

    @staticmethod
    def _step_masks(lengths: np.ndarray | None, seq_len: int,
                    batch: int) -> tuple[np.ndarray | None, list[np.ndarray | None]]:
        """``active`` (T, N) and, per step, a (1, N) mask of the sequences past their length
        (None when all run), for the feature-major ``(·, N)`` step arrays."""
        if lengths is None:
            return None, [None] * seq_len
        active = np.arange(seq_len)[:, None] < lengths[None, :]
        inactive = [None if active[t].all() else ~active[t][None, :] for t in range(seq_len)]
        return active, inactive

    def _prepared_input(self, x_tm: np.ndarray, lengths: np.ndarray | None,
                        workspace: _Workspace) -> np.ndarray:
        """``x`` as a C-contiguous (T·N, I) matrix; steps past a sequence's end are zeroed, so
        whatever the caller padded with (even NaN) cannot reach the gradients."""
        seq_len, batch, size_i = x_tm.shape
        if lengths is None and x_tm.flags.c_contiguous:
            return x_tm.reshape(seq_len * batch, size_i)
        x2 = workspace.array("input", (seq_len, batch, size_i), self._dtype)
        np.copyto(x2, x_tm)
        if lengths is not None:
            x2[np.arange(seq_len)[:, None] >= lengths[None, :]] = 0.0
        return x2.reshape(seq_len * batch, size_i)

    def _stack_weights(self) -> list[list[LSTMWeights]]:
        """Per layer and direction, the gates' weights stacked in the internal gate order
        (copies); the forward ones with the rows of sigmoid gates halved (``LSTMWeights``)."""
        p = self._params
        h, dtype = p.hidden_size, self._dtype
        plan = self._plan
        gates = [p.gates[k] for k in INTERNAL_ORDER]
        kinds = plan.peepholes
        scale = plan.row_scale(dtype)
        halve = any(plan.halved)
        stacked = []
        for layer in range(p.num_layers):
            row = []
            for d in range(p.num_directions):
                wx = np.concatenate([g.input_weights[0][d] if layer == 0 else g.input_weights[1][layer - 1, d]
                                     for g in gates])
                u = np.concatenate([g.hidden_weights[layer, d] for g in gates])
                bias = np.zeros((4 * h, 1), dtype)
                for k, g in enumerate(gates):
                    if g.bias is not None:
                        bias[k * h:(k + 1) * h, 0] = g.bias[layer, d]
                full_pre = None
                if any(kind == "full" for kind in kinds[:3]):
                    full_pre = np.zeros((4 * h, h), dtype)
                    for k in range(3):
                        if kinds[k] == "full":
                            full_pre[k * h:(k + 1) * h] = gates[k].cell_weights[layer, d]
                diagonal = tuple(  # columns (H, 1): they scale the rows of an (H, N) state
                    np.array(g.cell_weights[layer, d]).reshape(h, 1) if kind == "diagonal" else None
                    for g, kind in zip(gates, kinds)
                )
                full_output = np.array(gates[3].cell_weights[layer, d]) if kinds[3] == "full" else None
                peepholes = LSTMPeepholes(diagonal, full_output)  # type: ignore[arg-type]
                wx_bias = np.zeros((4 * h + PROJECTION_PAD, wx.shape[1] + 1), dtype)
                wx_bias[:4 * h, :-1] = wx
                wx_bias[:4 * h, -1:] = bias
                if halve:
                    rows = [scale[k * h:(k + 1) * h] for k in range(4)]
                    wx_bias[:4 * h] *= scale
                    halved = tuple(None if c is None else c * rows[k] for k, c in enumerate(diagonal))
                    forward = (wx_bias, u * scale, None if full_pre is None else full_pre * scale,
                               LSTMPeepholes(halved,  # type: ignore[arg-type]
                                             None if full_output is None else full_output * rows[3]))
                else:
                    forward = (wx_bias, u, full_pre, peepholes)
                row.append(LSTMWeights(*forward, wx_t=np.ascontiguousarray(wx.T),
                                       u_t=np.ascontiguousarray(u.T), full_pre_grad=full_pre,
                                       peepholes_grad=peepholes))
            stacked.append(row)
        return stacked

    def _current_weights(self) -> list[list[LSTMWeights]]:
        if self._weights is not None:
            return self._weights
        return self._stack_weights()  # client pointers: see in-place updates of the caller's arrays

    @contextlib.contextmanager
    def _borrow_workspace(self) -> Iterator[_Workspace]:
        """The layer's scratch space, or a private one if another thread is using it."""
        if self._workspace_lock.acquire(blocking=False):
            try:
                assert self._workspace is not None
                yield self._workspace
            finally:
                self._workspace_lock.release()
        else:
            yield _Workspace()

    @property
    def _has_dropout(self) -> bool:
        """Dropout applies between layers only, so one layer never drops anything."""
        return self._params.dropout > 0.0 and self._params.num_layers > 1

    def _layout(self, seq_len: int, batch: int, *, training: bool) -> CacheLayout:
        """The layout for T, N and the mode; the last few are kept (a call's fixed cost matters
        when the sequences are short)."""
        key = (seq_len, batch, training)
        layout = self._layouts.get(key)
        if layout is None:
            p = self._params
            layout = CacheLayout(
                seq_len=seq_len, batch_size=batch, hidden_size=p.hidden_size, num_layers=p.num_layers,
                num_directions=p.num_directions, dtype=self._dtype,
                store_pre=training and self._plan.store_pre, store_masks=training and self._has_dropout,
                reuse_steps=not training,
            )
            if len(self._layouts) >= 8:
                self._layouts.clear()
            self._layouts[key] = layout
        return layout

    def _configuration_key(self) -> bytes:
        p = self._params
        acts = [(a.function.value, a.alpha, a.beta) for a in (*p.gate_activations, p.cell_activation)]
        return repr(("bnnsfw.LSTMLayer", p.input_size, p.hidden_size, p.num_layers, p.num_directions,
                     self._dtype.str, self._plan.peepholes, acts, self._has_dropout)).encode()

    def _fingerprint(self, layout: CacheLayout, lengths: np.ndarray | None) -> int:
        """64-bit digest of the configuration, T, N, the lengths and the cache layout."""
        if lengths is None and layout.fingerprint is not None:
            return layout.fingerprint
        digest = hashlib.blake2b(self._config_key, digest_size=8)
        digest.update(repr((layout.seq_len, layout.batch_size, layout.flags, layout.nbytes)).encode())
        if lengths is not None:
            digest.update(lengths.astype("<i8").tobytes())
        value = int.from_bytes(digest.digest(), "little")
        if lengths is None:
            layout.fingerprint = value
        return value

    def _check_cache_size(self, where: str, buffer: np.ndarray, layout: CacheLayout) -> None:
        if buffer.size < layout.nbytes:
            call = f"training_cache_capacity(batch_size={layout.batch_size}, seq_len={layout.seq_len})"
            raise InvalidParameterError(
                must_be(where, f"at least {layout.nbytes} bytes ({call})", f"{buffer.size} bytes"))

    def _check_cache_header(self, where: str, buffer: np.ndarray, layout: CacheLayout,
                            lengths: np.ndarray | None) -> None:
        header = read_header(where, buffer)
        if (header.seq_len, header.batch_size) != (layout.seq_len, layout.batch_size):
            raise InvalidParameterError(must_be(
                where, f"a cache written for T={layout.seq_len}, N={layout.batch_size}",
                f"a cache for T={header.seq_len}, N={header.batch_size}"))
        if header.itemsize != self._dtype.itemsize:
            raise InvalidParameterError(must_be(where, f"a cache of {self._dtype.name} data",
                                                f"a cache of {header.itemsize}-byte items"))
        if header.fingerprint != self._fingerprint(layout, lengths):
            raise InvalidParameterError(must_be(
                where,
                "the cache of a training forward with this layer configuration and these sequence_lengths",
                "a cache written for another configuration or other sequence lengths"))

    def _check_x(self, where: str, x: object) -> tuple[np.ndarray, int, int]:
        p = self._params
        text = f"(N, T, {p.input_size})" if p.batch_first else f"(T, N, {p.input_size})"
        array = as_input(where, x, self._dtype, (None, None, p.input_size), shape_text=text)
        if 0 in array.shape[:2]:
            raise ShapeError(must_be(where, f"of shape {text} with T >= 1 and N >= 1", describe(array)))
        if p.batch_first:
            array = array.transpose(1, 0, 2)
        return array, array.shape[0], array.shape[1]

    def _check_state(self, where: str, value: object, batch: int) -> np.ndarray | None:
        if value is None:
            return None
        p = self._params
        shape = (p.num_layers * p.num_directions, batch, p.hidden_size)
        return as_input(where, value, self._dtype, shape, shape_text=f"(L·D, N, H) = {shape}")

    @staticmethod
    def _check_lengths(where: str, value: object, seq_len: int, batch: int) -> np.ndarray | None:
        if value is None:
            return None
        lengths = np.asarray(value)
        if lengths.shape != (batch,):
            raise ShapeError(must_be(where, f"of shape ({batch},) (one length per sequence)",
                                     f"shape {tuple(lengths.shape)}"))
        if lengths.dtype.kind not in "iu":
            raise InvalidParameterError(must_be(where, "integers", lengths.dtype.name))
        if lengths.min() < 1 or lengths.max() > seq_len:
            raise InvalidParameterError(
                must_be(where, f"in [1, {seq_len}] (T = {seq_len})", lengths.tolist()))
        lengths = lengths.astype(np.int64)
        return None if (lengths == seq_len).all() else lengths

    # Filter hooks.
    def _release(self) -> None:
        self._weights = None
        self._workspace = None
        self._rng = None

    def _describe(self) -> str:
        p = self._params
        return (f"input_size={p.input_size}, hidden_size={p.hidden_size}, num_layers={p.num_layers}, "
                f"bidirectional={p.bidirectional}, dtype={self._dtype.name}")


def _columns(per_step: np.ndarray, out: np.ndarray) -> np.ndarray:
    """A (T, F, N) per-step feature-major array as one (F, T·N) matrix (column t·N + n)."""
    seq_len, features, batch = per_step.shape
    np.copyto(out.reshape(features, seq_len, batch), per_step.transpose(1, 0, 2))
    return out


class _GradientArrays:
    """Gradients in the public structure, filled layer by layer from the stacked products."""

    def __init__(self, p: LSTMParameters) -> None:
        size_l, size_d, h, size_i = p.num_layers, p.num_directions, p.hidden_size, p.input_size
        dtype = p.dtype
        self._h = h
        self._gates = []
        for gate in p.gates:
            iw1 = np.empty((size_l - 1, size_d, h, size_d * h), dtype) if size_l > 1 else None
            cw = None if gate.cell_weights is None else np.empty(np.shape(gate.cell_weights), dtype)
            bias = None if gate.bias is None else np.empty((size_l, size_d, h), dtype)
            self._gates.append(LSTMGateGradients(
                input_weights=(np.empty((size_d, h, size_i), dtype), iw1),
                hidden_weights=np.empty((size_l, size_d, h, h), dtype),
                cell_weights=cw,
                bias=bias,
            ))

    def store(self, layer: int, d: int, d_wx: np.ndarray, d_u: np.ndarray, d_bias: np.ndarray,
              d_peep: list[np.ndarray | None]) -> None:
        """Scatter one layer and direction's stacked gradients (rows in the internal gate
        order, ``d_peep`` per internal gate) into the public per-gate arrays."""
        h = self._h
        for k, public in enumerate(INTERNAL_ORDER):
            g = self._gates[public]
            rows = slice(k * h, (k + 1) * h)
            if layer == 0:
                g.input_weights[0][d] = d_wx[rows]
            else:
                g.input_weights[1][layer - 1, d] = d_wx[rows]  # type: ignore[index]
            g.hidden_weights[layer, d] = d_u[rows]
            if g.bias is not None:
                g.bias[layer, d] = d_bias[rows]
            if g.cell_weights is not None:
                g.cell_weights[layer, d] = d_peep[k]

    def result(self, d_x: np.ndarray, d_hidden: np.ndarray, d_cell: np.ndarray) -> LSTMGradients:
        return LSTMGradients(input=d_x, hidden=d_hidden, cell=d_cell, input_gate=self._gates[0],
                             forget_gate=self._gates[1], candidate_gate=self._gates[2],
                             output_gate=self._gates[3])

"""The layer nodes: ONNX ``LSTM`` and normalization nodes, each run by a bnnsfw layer.

:func:`_lstm_parameters` is the one place where an ONNX LSTM node's attributes and its
``W``, ``R``, ``B`` and ``P`` meet :class:`~bnnsfw.LSTMParameters`. A node builds its layer
once when its weights are constants (the layer that ``Session.layer`` hands out), or for each
run when they are graph inputs. ONNX's gate order and RNN activations, defined here, are also
what export writes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np

from ..activation import Activation
from ..enums import LearningPhase
from ..errors import DTypeError, InvalidParameterError, ShapeError, must_be
from ..filter import Filter, FilterParameters
from ..layers.lstm import GATE_FIELDS, LSTMActivations, LSTMGateDescriptor, LSTMLayer, LSTMParameters
from ..layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType
from ._nodes import _MIN_OPSET, Array, _axis, _Node, _unsupported

_LAYER_OPS: dict[str, frozenset[str]] = {
    "LSTM": frozenset({"activation_alpha", "activation_beta", "activations", "clip", "direction",
                       "hidden_size",
                       "input_forget", "layout"}),
    "BatchNormalization": frozenset({"epsilon", "momentum", "training_mode", "spatial"}),
    "InstanceNormalization": frozenset({"epsilon"}),
    "LayerNormalization": frozenset({"axis", "epsilon", "stash_type"}),
    "GroupNormalization": frozenset({"epsilon", "num_groups", "stash_type"}),
    "RMSNormalization": frozenset({"axis", "epsilon", "stash_type"}),
}

# ONNX's RNN activation functions: how each becomes a bnnsfw Activation from its alpha and
# beta, how many of activation_alpha / activation_beta it consumes, and its defaults
# (those of the ONNX operator of the same name, as ONNX Runtime uses them).
_RNN_ACTIVATIONS: dict[str, tuple[int, tuple[float, float], Callable[[float, float], Activation]]] = {
    "Sigmoid": (0, (0.0, 0.0), lambda a, b: Activation.sigmoid()),
    "Tanh": (0, (0.0, 0.0), lambda a, b: Activation.tanh()),
    "Relu": (0, (0.0, 0.0), lambda a, b: Activation.relu()),
    "Softsign": (0, (0.0, 0.0), lambda a, b: Activation.softsign()),
    "Softplus": (0, (0.0, 0.0), lambda a, b: Activation.softplus()),
    "LeakyRelu": (1, (0.01, 0.0), lambda a, b: Activation.leaky_relu(a)),
    "ThresholdedRelu": (1, (1.0, 0.0), lambda a, b: Activation.threshold(a, 0.0)),
    "Elu": (1, (1.0, 0.0), lambda a, b: Activation.elu(a)),
    "Affine": (2, (1.0, 0.0), lambda a, b: Activation.linear_with_bias(a, b)),
    "ScaledTanh": (2, (1.0, 1.0), lambda a, b: Activation.scaled_tanh(a, b)),
    "HardSigmoid": (2, (0.2, 0.5), lambda a, b: Activation.hard_sigmoid(a, b)),
}
_ONNX_GATES = ("input_gate", "output_gate", "forget_gate", "candidate_gate")  # W, R, B: i, o, f, c
_ONNX_PEEPHOLES = ("input_gate", "output_gate", "forget_gate")  # P: i, o, f


def _rnn_activations(node: _Node, directions: int) -> tuple[LSTMActivations, ...] | None:
    """The node's ``activations`` (with ``activation_alpha`` / ``activation_beta``) as one
    :class:`~bnnsfw.LSTMActivations` per direction; ``None`` when they are the defaults."""
    names = node.attr("activations")
    if names is None:
        if node.attr("activation_alpha") or node.attr("activation_beta"):
            raise InvalidParameterError(must_be(
                f"ONNX node {node.name!r} (LSTM) activation_alpha / activation_beta",
                "given only with activations", [node.attr("activation_alpha"), node.attr("activation_beta")]))
        return None
    names = [str(name) for name in names]
    if len(names) != 3 * directions:
        raise InvalidParameterError(must_be(f"ONNX node {node.name!r} (LSTM) activations",
                                            f"{3 * directions} names (f, g, h per direction)", names))
    for name in names:
        try:
            Activation.onnx_takes(name)
        except InvalidParameterError:
            raise _unsupported(node, "activations", name) from None
    try:
        sets = LSTMActivations.onnx(names, node.attr("activation_alpha") or (),
                                    node.attr("activation_beta") or ())
    except InvalidParameterError as error:
        raise InvalidParameterError(f"ONNX node {node.name!r} (LSTM): {error}") from None
    return None if all(s == LSTMActivations() for s in sets) else sets


def _lstm_parameters(node: _Node, w: Array, r: Array, b: Array | None, p: Array | None,
                     dtype: np.dtype) -> LSTMParameters:
    """bnnsfw parameters for an ONNX LSTM node.

    This is the one place where the node's attributes meet LSTMParameters' fields:
    ``direction`` → ``bidirectional`` / ``reverse``, ``clip`` → ``clip``, ``input_forget`` →
    ``input_forget``, ``activations`` (with their alphas and betas) → one
    :class:`~bnnsfw.LSTMActivations` per direction, ``layout`` → ``batch_first``.
    """
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise _unsupported(node, "attribute direction", direction)
    d = 2 if direction == "bidirectional" else 1
    clip = node.attr("clip")
    input_forget = node.attr("input_forget", 0)
    if input_forget not in (0, 1):
        raise InvalidParameterError(must_be(f"ONNX node {node.name!r} (LSTM) attribute input_forget",
                                            "0 or 1", input_forget))
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise InvalidParameterError(must_be(f"ONNX node {node.name!r} (LSTM) attribute clip",
                                            "a positive finite number", clip))
    activations = _rnn_activations(node, d)
    if w.ndim != 3 or w.shape[0] != d or w.shape[1] % 4:
        raise ShapeError(must_be(f"ONNX node {node.name!r} (LSTM) input W", f"of shape [{d}, 4·H, I]",
                                 f"shape {w.shape}"))
    h, size_i = w.shape[1] // 4, w.shape[2]
    if node.attr("hidden_size", h) != h:
        raise ShapeError(must_be(f"ONNX node {node.name!r} (LSTM) attribute hidden_size",
                                 f"{h} (W's shape)", node.attr("hidden_size")))
    for name, array, shape in (("R", r, (d, 4 * h, h)), ("B", b, (d, 8 * h)), ("P", p, (d, 3 * h))):
        if array is not None and array.shape != shape:
            raise ShapeError(must_be(f"ONNX node {node.name!r} (LSTM) input {name}",
                                     f"of shape {list(shape)}",
                                     f"shape {array.shape}"))

    def block(array: Array, gate: str, order: tuple[str, ...]) -> Array:
        k = order.index(gate)
        return array[:, k * h:(k + 1) * h]

    gates: dict[str, Any] = {}
    for gate in GATE_FIELDS:
        bias = None
        if b is not None:
            bias = (block(b[:, :4 * h], gate, _ONNX_GATES) + block(b[:, 4 * h:], gate, _ONNX_GATES))[None]
        cell = None
        if p is not None and gate in _ONNX_PEEPHOLES:
            cell = block(p, gate, _ONNX_PEEPHOLES)[None]
        gates[gate] = LSTMGateDescriptor(
            input_weights=(np.array(block(w, gate, _ONNX_GATES), dtype=dtype), None),
            hidden_weights=np.array(block(r, gate, _ONNX_GATES), dtype=dtype)[None],
            cell_weights=None if cell is None else np.array(cell, dtype=dtype),
            bias=None if bias is None else np.array(bias, dtype=dtype))
    return LSTMParameters(input_size=size_i, hidden_size=h, bidirectional=d == 2,
                          batch_first=node.attr("layout", 0) == 1, dtype=dtype,
                          reverse=direction == "reverse", direction_activations=activations,
                          clip=None if clip is None else float(clip), input_forget=bool(input_forget),
                          **gates)


def _float_dtype(node: _Node, x: Array) -> np.dtype:
    if x.dtype not in (np.float32, np.float64):
        raise DTypeError(must_be(f"ONNX node {node.name!r} ({node.op_type}) input {node.inputs[0]!r}",
                                 "float32 or float64 (bnnsfw layers' dtypes)", x.dtype.name))
    return x.dtype


def _fixed(shape: Sequence[int | None]) -> tuple[int, ...] | None:
    """``shape`` as ints when every extent is known, else ``None``."""
    if all(isinstance(s, int) and s > 0 for s in shape):
        return tuple(int(s) for s in shape if s is not None)
    return None


class _LayerNode:
    """An LSTM or normalization node: builds its bnnsfw layer once when the weights are
    constants (the layer the user gets), or for each run when they are graph inputs."""

    def __init__(self, node: _Node, constants: Mapping[str, Array],
                 filter_parameters: FilterParameters) -> None:
        self.node = node
        self.weight_names = [name for name in node.inputs[1:] if name]
        self.constant = all(name in constants for name in self.weight_names)
        self.filter_parameters = attrs.evolve(filter_parameters, use_client_pointer=True)
        self.layers: dict[Any, Filter] = {}   # key (dtype, per-sample shape) -> layer
        self.primary: Filter | None = None

    def run(self, inputs: list[Array | None]) -> list[Array | None]:
        raise NotImplementedError

    def close(self) -> None:
        for layer in self.layers.values():
            layer.close()
        self.layers.clear()


class _LSTMNode(_LayerNode):
    def __init__(self, node: _Node, constants: Mapping[str, Array],
                 filter_parameters: FilterParameters) -> None:
        super().__init__(node, constants, filter_parameters)
        if node.attr("layout", 0) not in (0, 1):
            raise _unsupported(node, "attribute layout", node.attr("layout"))
        names = node.inputs + [""] * (8 - len(node.inputs))
        self.names = dict(zip(("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"), names))
        weight_names = [self.names[k] for k in ("W", "R", "B", "P") if self.names[k]]
        self.constant = all(name in constants for name in weight_names)
        if self.constant:
            w = constants[self.names["W"]]
            self.primary = self._build(w.dtype if w.dtype in (np.float32,
                                                              np.float64) else np.dtype(np.float32),
                                       [constants.get(self.names[k]) if self.names[k] else None
                                        for k in ("W", "R", "B", "P")])

    def _build(self, dtype: np.dtype, weights: list[Array | None]) -> LSTMLayer:
        w, r, b, p = weights
        assert w is not None and r is not None
        params = _lstm_parameters(self.node, w, r, b, p, dtype)
        return LSTMLayer(params, self.filter_parameters)

    def run(self, inputs: list[Array | None]) -> list[Array | None]:
        node = self.node
        x, w, r, b, lengths, h0, c0, p = (inputs + [None] * 8)[:8]
        assert x is not None
        dtype = _float_dtype(node, x)
        layer = self.primary
        if layer is None:
            layer = self._build(dtype, [w, r, b, p])
        assert isinstance(layer, LSTMLayer)
        params = layer.layer_parameters
        batch_first = params.batch_first
        if x.ndim != 3:
            raise ShapeError(must_be(f"ONNX node {node.name!r} (LSTM) input X", "3-D", f"shape {x.shape}"))
        if x.dtype != params.dtype:
            raise DTypeError(must_be(f"ONNX node {node.name!r} (LSTM) input X",
                                     f"{params.dtype.name} (W's type)",
                                     x.dtype.name))
        seq_len, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])

        def state(value: Array | None) -> Array | None:
            if value is None:
                return None
            if value.dtype != params.dtype:
                raise DTypeError(must_be(f"ONNX node {node.name!r} (LSTM) initial state", params.dtype.name,
                                         value.dtype.name))
            return value.transpose(1, 0, 2) if batch_first else value  # [N, D, H] -> [D, N, H]

        seq = None
        if lengths is not None:
            seq = np.asarray(lengths).astype(np.int64)
            if seq.shape != (batch,):
                raise ShapeError(must_be(f"ONNX node {node.name!r} (LSTM) input sequence_lens",
                                         f"of shape [{batch}]", f"shape {seq.shape}"))
            if (seq == seq_len).all():
                seq = None
        out = layer.apply(np.ascontiguousarray(x), state(h0), state(c0), sequence_lengths=seq)
        y = out.output
        d, h = params.num_directions, params.hidden_size
        if batch_first:
            y_onnx = y.reshape(batch, seq_len, d, h)
            hidden, cell = out.hidden.transpose(1, 0, 2), out.cell.transpose(1, 0, 2)
        else:
            y_onnx = y.reshape(seq_len, batch, d, h).transpose(0, 2, 1, 3)
            hidden, cell = out.hidden, out.cell
        return [np.ascontiguousarray(y_onnx), hidden, cell]


_TRAILING_AXES_OPS = frozenset({"LayerNormalization", "RMSNormalization"})  # normalize from ``axis`` on


class _NormNode(_LayerNode):
    """Batch, instance, layer and group normalization nodes.

    bnnsfw normalization layers have a fixed per-sample shape; a node keeps one layer per
    shape it has seen, all sharing the first one's weight arrays (client pointers), so
    fine-tuning the layer :meth:`Session.layer` returns changes every run.
    """

    def __init__(self, node: _Node, constants: Mapping[str, Array], filter_parameters: FilterParameters,
                 input_shape: Sequence[int | None] | None) -> None:
        super().__init__(node, constants, filter_parameters)
        op, opset = node.op_type, node.opset
        self.training = False
        if op == "BatchNormalization":
            if opset < _MIN_OPSET:
                raise _unsupported(node, "opset", opset)
            if node.attr("spatial", 1) != 1:
                raise _unsupported(node, "attribute spatial", node.attr("spatial"))
            self.training = bool(node.attr("training_mode", 0))
            outputs = [o for o in node.outputs[1:] if o]
            if outputs and not self.training:
                raise _unsupported(node, "outputs",
                                   f"{node.outputs} (statistics outputs need training_mode=1)")
            if len(node.outputs) > 3:
                raise _unsupported(node, "outputs", node.outputs)
        if op in _TRAILING_AXES_OPS and node.attr("stash_type", 1) != 1:
            raise _unsupported(node, "attribute stash_type", node.attr("stash_type"))
        if op == "RMSNormalization" and opset < 23:
            raise _unsupported(node, "opset", f"{opset} (RMSNormalization exists from opset 23)")
        if op == "RMSNormalization" and len(node.outputs) > 1:
            raise _unsupported(node, "outputs", node.outputs)
        if op == "GroupNormalization" and node.attr("stash_type", 1) != 1:
            raise _unsupported(node, "attribute stash_type", node.attr("stash_type"))
        self.constants = {name: constants[name] for name in self.weight_names if name in constants}
        per_sample = self._known_per_sample_shape(input_shape)
        if self.constant and per_sample is not None:
            dtype: np.dtype = np.dtype(np.float32)
            first = constants.get(self.weight_names[0]) if self.weight_names else None
            if first is not None and first.dtype == np.float64:
                dtype = np.dtype(np.float64)
            self.primary = self._layer(dtype, (1, *per_sample), self._constant_inputs(), per_sample)

    def _known_per_sample_shape(self, input_shape: Sequence[int | None] | None) -> tuple[int, ...] | None:
        """The layer's per-sample shape when the graph fixes it: from the input's static shape,
        or for a layer norm over trailing axes from its scale."""
        node = self.node
        if node.op_type in _TRAILING_AXES_OPS:
            axis = node.attr("axis", -1)
            scale = self.constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
            if axis < 0 and scale is not None and scale.ndim == -axis:
                return tuple(int(s) for s in scale.shape)
            if input_shape is not None and 0 <= axis < len(input_shape):
                tail = input_shape[axis:]
                return _fixed(tail)
            return None
        if input_shape is None or len(input_shape) < 2:
            return None
        tail = input_shape[1:]
        return _fixed(tail)

    def _constant_inputs(self) -> list[Array | None]:
        return [self.constants.get(name) if name else None for name in self.node.inputs[1:]]

    def _layer_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The bnnsfw per-sample shape of an input of ``shape``."""
        if self.node.op_type in _TRAILING_AXES_OPS:
            axis = _axis(self.node, self.node.attr("axis", -1), len(shape))
            return shape[axis:]
        return shape[1:]

    def _parameters(self, dtype: np.dtype, per_sample: tuple[int, ...],
                    weights: list[Array | None]) -> NormalizationParameters:
        node, op = self.node, self.node.op_type
        eps = float(node.attr("epsilon", 1e-5))

        def cast(a: Array | None) -> Array | None:
            return None if a is None else np.array(a, dtype=dtype)

        scale, bias = (weights + [None, None])[:2]
        if op == "BatchNormalization":
            mean, var = weights[2], weights[3]
            if not per_sample:
                raise ShapeError(must_be(f"ONNX node {node.name!r} input X", "of rank >= 2 (N, C, …)",
                                         per_sample))
            return NormalizationParameters(
                type=NormalizationType.batch(moving_mean=cast(mean), moving_variance=cast(var)),
                input_shape=per_sample, gamma=cast(scale), beta=cast(bias),
                momentum=float(node.attr("momentum", 0.9)), epsilon=eps, dtype=dtype)
        if op == "InstanceNormalization":
            if len(per_sample) < 2:
                raise ShapeError(must_be(f"ONNX node {node.name!r} input X", "of rank >= 3 (N, C, D1, …)",
                                         per_sample))
            return NormalizationParameters(type=NormalizationType.instance(), input_shape=per_sample,
                                           gamma=cast(scale), beta=cast(bias), epsilon=eps, dtype=dtype)
        if op in _TRAILING_AXES_OPS:
            # The node normalizes x over its axes from ``axis`` on (``axis`` counts the batch
            # axis): the layer's per-sample shape is that trailing shape, normalized from its
            # first axis, and the leading axes (the batch axis among them) are its batch.
            rms = op == "RMSNormalization"
            if scale is not None:
                try:
                    scale = np.broadcast_to(np.asarray(cast(scale)), per_sample)
                except ValueError:
                    raise ShapeError(must_be(f"ONNX node {node.name!r} input scale",
                                             f"broadcastable to the normalized shape {list(per_sample)}",
                                             f"shape {np.shape(scale)}")) from None
            gamma = None if scale is None else np.array(scale)
            beta = None if bias is None else np.broadcast_to(np.asarray(cast(bias)), per_sample).copy()
            kind = NormalizationType.rms(0) if rms else NormalizationType.layer(normalization_axis=0)
            return NormalizationParameters(type=kind, input_shape=per_sample,
                                           gamma=gamma, beta=beta, epsilon=eps, dtype=dtype)
        assert op == "GroupNormalization"
        groups = int(node.attr("num_groups"))
        channels = per_sample[0]
        if node.opset < 21 and scale is not None and bias is not None:
            # Opset 18's scale and bias are per group; opset 21's per channel.
            if scale.shape != (groups,) or channels % groups:
                raise ShapeError(must_be(f"ONNX node {node.name!r} input scale",
                                         f"of shape [{groups}] (opset 18)",
                                         f"shape {scale.shape}"))
            scale, bias = np.repeat(scale, channels // groups), np.repeat(bias, channels // groups)
        return NormalizationParameters(type=NormalizationType.group(group_count=groups),
                                       input_shape=per_sample,
                                       gamma=cast(scale), beta=cast(bias), epsilon=eps, dtype=dtype)

    def _layer(self, dtype: np.dtype, shape: tuple[int, ...], weights: list[Array | None],
               per_sample: tuple[int, ...] | None = None) -> NormalizationLayer:
        per_sample = self._layer_shape(shape) if per_sample is None else per_sample
        key = (dtype.str, per_sample)
        layer = self.layers.get(key)
        if layer is not None:
            assert isinstance(layer, NormalizationLayer)
            return layer
        if isinstance(self.primary, NormalizationLayer) and self.primary.dtype == dtype:
            primary = self.primary
            assert isinstance(primary, NormalizationLayer)
            shared: list[Array | None] = [primary.gamma, primary.beta, primary.moving_mean,
                                          primary.moving_variance]
            if self.node.op_type in _TRAILING_AXES_OPS and primary.input_shape != per_sample:
                raise ShapeError(must_be(f"ONNX node {self.node.name!r} input X", f"normalized over "
                                         f"{primary.input_shape}", shape))
            params = self._parameters(dtype, per_sample, shared)
        else:
            params = self._parameters(dtype, per_sample, weights)
        layer = NormalizationLayer(params, self.filter_parameters)
        if self.constant:
            self.layers[key] = layer
            if self.primary is None:
                self.primary = layer
        return layer

    def run(self, inputs: list[Array | None]) -> list[Array | None]:
        node = self.node
        x = inputs[0]
        assert x is not None
        dtype = _float_dtype(node, x)
        weights = self._constant_inputs() if self.constant else list(inputs[1:])
        layer = self._layer(dtype, x.shape, weights)
        per_sample = layer.input_shape
        x2 = x.reshape(-1, *per_sample)
        op = node.op_type
        if op == "BatchNormalization" and self.training:
            assert layer.moving_mean is not None and layer.moving_variance is not None
            saved = layer.moving_mean.copy(), layer.moving_variance.copy()
            try:
                y = layer.apply(x2, phase=LearningPhase.training)
                new_mean, new_var = layer.moving_mean.copy(), layer.moving_variance.copy()
            finally:  # a run is a pure function: the layer's statistics stay as they were
                np.copyto(layer.moving_mean, saved[0])
                np.copyto(layer.moving_variance, saved[1])
            return [y.reshape(x.shape), new_mean, new_var]
        phase = LearningPhase.inference if op == "BatchNormalization" else LearningPhase.training
        if op == "LayerNormalization" and any(node.outputs[1:]):
            # Mean and InvStdDev: the statistics the layer normalized with, the normalized
            # axes kept as size 1 (ONNX's shape: x's leading axes, then ones).
            result = layer.apply_with_statistics(x2, phase=phase)
            assert result.mean is not None
            stats_shape = (*x.shape[:x.ndim - len(per_sample)], *(1,) * len(per_sample))
            return [result.output.reshape(x.shape), result.mean.reshape(stats_shape),
                    result.inv_std_dev.reshape(stats_shape)]
        y = layer.apply(x2, phase=phase).reshape(x.shape)
        if op == "LayerNormalization":
            return [y, None, None]
        return [y]

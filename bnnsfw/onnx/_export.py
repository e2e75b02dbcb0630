"""Writing bnnsfw layers, applied one after the other, as an ONNX model: :func:`export`.

Each layer becomes its nodes: one ``LSTM`` node per layer of a stack; a normalization node;
``MatMul`` and ``Add``; the last two followed by the layer's activation. The graph passes
``onnx.checker.check_model(full_check=True)``; what ONNX cannot express is refused with
:class:`~bnnsfw.UnsupportedError`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

import numpy as np

from ..activation import Activation
from ..enums import ActivationFunction, FilterType
from ..errors import InvalidParameterError, ShapeError, UnsupportedError, must_be
from ..filter import Filter
from ..layers.fully_connected import FullyConnectedLayer
from ..layers.lstm import GATE_FIELDS, LSTMGateDescriptor, LSTMLayer
from ..layers.normalization import NormalizationLayer
from ._layer_nodes import _ONNX_GATES, _ONNX_PEEPHOLES, _RNN_ACTIVATIONS
from ._nodes import _MIN_OPSET, Array, _onnx

__all__ = ["DEFAULT_OPSET", "export"]

DEFAULT_OPSET = 21  # the opset export writes unless told otherwise (bnnsfw.onnx.DEFAULT_OPSET)

# bnnsfw activation -> (ONNX operator, attributes) for a fused activation after a layer.
_EXPORT_ACTIVATIONS: dict[ActivationFunction, Callable[[Activation], tuple[str, dict[str, Any]]]] = {
    ActivationFunction.relu: lambda a: ("Relu", {}),
    ActivationFunction.sigmoid: lambda a: ("Sigmoid", {}),
    ActivationFunction.tanh: lambda a: ("Tanh", {}),
    ActivationFunction.leaky_relu: lambda a: ("LeakyRelu", {"alpha": a.alpha}),
    ActivationFunction.elu: lambda a: ("Elu", {"alpha": a.alpha}),
    ActivationFunction.selu: lambda a: ("Selu", {}),
    ActivationFunction.softsign: lambda a: ("Softsign", {}),
    ActivationFunction.hard_sigmoid: lambda a: ("HardSigmoid", {"alpha": a.alpha, "beta": a.beta}),
    ActivationFunction.abs: lambda a: ("Abs", {}),
}

# bnnsfw activation -> ONNX LSTM activation name and its (alpha, beta), for the gate functions.
_EXPORT_RNN_ACTIVATIONS: dict[ActivationFunction, Callable[[Activation], tuple[str, list[float]]]] = {
    ActivationFunction.sigmoid: lambda a: ("Sigmoid", []),
    ActivationFunction.tanh: lambda a: ("Tanh", []),
    ActivationFunction.relu: lambda a: ("Relu", []),
    ActivationFunction.softsign: lambda a: ("Softsign", []),
    ActivationFunction.leaky_relu: lambda a: ("LeakyRelu", [a.alpha]),
    ActivationFunction.elu: lambda a: ("Elu", [a.alpha]),
    ActivationFunction.linear_with_bias: lambda a: ("Affine", [a.alpha, a.beta]),
    ActivationFunction.scaled_tanh: lambda a: ("ScaledTanh", [a.alpha, a.beta]),
    ActivationFunction.hard_sigmoid: lambda a: ("HardSigmoid", [a.alpha, a.beta]),
}


class _GraphWriter:
    """Collects the nodes, initializers and names of the graph being written."""

    def __init__(self, opset: int, dtype: np.dtype) -> None:
        self.onnx = _onnx()
        self.opset = opset
        self.dtype = dtype
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def constant(self, stem: str, array: Any, dtype: Any = None) -> str:
        name = self.name(stem)
        value = np.asarray(array, dtype=dtype if dtype is not None else self.dtype)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: Sequence[str], outputs: int | Sequence[str] = 1,
             **attributes: Any) -> list[str]:
        names = [self.name(op.lower()) for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
        self.nodes.append(self.onnx.helper.make_node(op, list(inputs), names, name=self.name(op),
                                                     **attributes))
        return names

    def ints(self, values: Sequence[int]) -> str:
        return self.constant("shape", np.asarray(values, dtype=np.int64), np.int64)


def _export_activation(writer: _GraphWriter, activation: Activation, x: str, where: str) -> str:
    if activation.is_identity:
        return x
    make = _EXPORT_ACTIVATIONS.get(activation.function)
    if make is None:
        raise UnsupportedError(must_be(f"{where}.activation", "one ONNX has as an operator "
                                       f"({', '.join(f.name for f in _EXPORT_ACTIVATIONS)})",
                                       activation.function.name))
    op, attributes = make(activation)
    return writer.node(op, [x], **attributes)[0]


def _export_lstm(writer: _GraphWriter, layer: LSTMLayer, x: str, where: str,
                 initial: tuple[str, str] | None = None) -> tuple[str, str, str]:
    """LSTM nodes (one per layer of the stack) reading x (T, N, I) or (N, T, I), and with
    ``initial`` the names of the initial states (L·D, N, H), each layer's D rows of them;
    returns the output (same layout as bnnsfw's) and the final states (L·D, N, H)."""
    p = layer.layer_parameters
    h, d = p.hidden_size, p.num_directions
    for name, gate in zip(GATE_FIELDS, p.gates):
        if gate.peephole == "full":
            raise UnsupportedError(must_be(f"{where}.{name}.cell_weights", "None or diagonal (ONNX's P)",
                                           "a full peephole matrix"))
    if p.candidate_gate.cell_weights is not None:
        raise UnsupportedError(must_be(f"{where}.candidate_gate.cell_weights", "None (ONNX has no candidate "
                                       "peephole)", "a peephole"))
    # The SPEC §4.1 variants ONNX's LSTM has no attribute for.
    for name, value, why in (
            ("projection_size", p.projection_size, "ONNX's LSTM has no projection"),
            ("layer_norm", p.layer_norm, "ONNX's LSTM has no layer-normalized cell"),
            ("cell_clip", p.cell_clip, "ONNX's clip clamps the activation inputs, not the carried cell"),
            ("projection_clip", p.projection_clip, "ONNX's LSTM has no projection")):
        if value is not None:
            raise UnsupportedError(must_be(f"{where}.{name}", f"None ({why})",
                                           "an LSTMLayerNorm" if name == "layer_norm" else value))
    attributes: dict[str, Any] = {"hidden_size": h, "direction": p.direction}
    names: list[str] = []
    alphas: list[float] = []
    betas: list[float] = []
    for k in range(d):
        acts = p.activations(k)
        if not (acts.input_gate == acts.forget_gate == acts.output_gate):
            raise UnsupportedError(must_be(f"{where} gate activations (direction {k})",
                                           "the same for the input, forget and output gates (ONNX's f)",
                                           [a.function.name for a in acts.gates]))
        for activation in (acts.input_gate, acts.candidate_gate, acts.hidden_activation):
            make = _EXPORT_RNN_ACTIVATIONS.get(activation.function)
            if make is None:
                raise UnsupportedError(must_be(f"{where} activation", "one of ONNX's RNN activations",
                                               activation.function.name))
            name, values = make(activation)
            takes = _RNN_ACTIVATIONS[name][0]
            names.append(name)
            alphas.extend(float(v) for v in values[:min(takes, 1)])
            betas.extend(float(v) for v in values[1:takes])
    if names != ["Sigmoid", "Tanh", "Tanh"] * d:
        attributes["activations"] = names
        if alphas:
            attributes["activation_alpha"] = alphas
        if betas:
            attributes["activation_beta"] = betas
    if p.clip is not None:
        attributes["clip"] = float(p.clip)
    if p.input_forget:
        attributes["input_forget"] = 1
    if p.batch_first:  # ONNX Runtime runs layout=0 only: transpose around the nodes instead
        x = writer.node("Transpose", [x], perm=[1, 0, 2])[0]
    hiddens, cells = [], []
    has_peepholes = any(g.cell_weights is not None for g in p.gates)
    for layer_index in range(p.num_layers):
        def stacked(field: Callable[[LSTMGateDescriptor], Array], order: Sequence[str]) -> Array:
            gates = dict(zip(GATE_FIELDS, p.gates))
            return np.concatenate([field(gates[g]) for g in order], axis=1)

        if layer_index == 0:
            w = stacked(lambda g: g.input_weights[0], _ONNX_GATES)
        else:
            w = stacked(lambda g: g.input_weights[1][layer_index - 1], _ONNX_GATES)
        r = stacked(lambda g: g.hidden_weights[layer_index], _ONNX_GATES)
        inputs = [x, writer.constant("W", w), writer.constant("R", r)]
        if p.input_gate.bias is not None or has_peepholes:
            if p.input_gate.bias is not None:
                wb = stacked(lambda g: g.bias[layer_index], _ONNX_GATES)
            else:
                wb = np.zeros((d, 4 * h))
            inputs.append(writer.constant("B", np.concatenate([wb, np.zeros_like(wb)], axis=1)))
        if has_peepholes:
            def peephole(g: LSTMGateDescriptor) -> Array:
                return np.zeros((d, h)) if g.cell_weights is None else g.cell_weights[layer_index]
        if initial is not None:
            inputs += [""] * (4 - len(inputs)) + [""]  # no B (when absent), no sequence_lens
            if p.num_layers == 1:
                inputs += list(initial)
            else:
                first, end = layer_index * d, (layer_index + 1) * d
                rows = [writer.ints([first]), writer.ints([end]), writer.ints([0])]
                inputs += [writer.node("Slice", [state, *rows])[0] for state in initial]
        if has_peepholes:
            inputs += [""] * (7 - len(inputs)) + [writer.constant("P", stacked(peephole, _ONNX_PEEPHOLES))]
        y, y_h, y_c = writer.node("LSTM", inputs, 3, **attributes)
        hiddens.append(y_h)
        cells.append(y_c)
        # Y [T, D, N, H] -> [T, N, D·H], the next layer's input and bnnsfw's output
        y = writer.node("Transpose", [y], perm=[0, 2, 1, 3])[0]
        x = writer.node("Reshape", [y, writer.ints([0, 0, -1])])[0]
    if p.batch_first:
        x = writer.node("Transpose", [x], perm=[1, 0, 2])[0]
    hidden = hiddens[0] if len(hiddens) == 1 else writer.node("Concat", hiddens, axis=0)[0]
    cell = cells[0] if len(cells) == 1 else writer.node("Concat", cells, axis=0)[0]
    return x, hidden, cell


def _export_normalization(writer: _GraphWriter, layer: NormalizationLayer, x: str, where: str) -> str:
    """Normalization nodes for the layer's inference phase, on (…, *input_shape) data."""
    p = layer.layer_parameters
    kind, shape = p.type.kind, layer.input_shape
    if p.type.root_mean_square:  # no shift
        return _export_activation(writer, p.activation, _export_rms(writer, layer, x), where)
    gamma, beta = layer.gamma, layer.beta
    rank = len(shape)
    # bnnsfw flattens any leading axes into the batch: N = the product of the leading extents.
    if kind is FilterType.layer_norm:
        if writer.opset < 17:
            raise UnsupportedError(must_be(f"{where}: opset", ">= 17 for LayerNormalization", writer.opset))
        axis = -(rank - p.type.axis)
        y = writer.node("LayerNormalization", [x, writer.constant("scale", gamma), writer.constant("bias",
                                                                                                   beta)],
                        axis=axis, epsilon=p.epsilon)[0]
        return _export_activation(writer, p.activation, y, where)
    # Open sizes (None) stay symbolic: the data is (N, C, *spatial) already (export checked
    # that one batch axis leads), which the ONNX operators take as it is.
    open_sizes = None in shape
    fixed = cast(tuple[int, ...], shape)
    flat = x if open_sizes else writer.node("Reshape", [x, writer.ints([-1, *fixed])])[0]
    if kind is FilterType.batch_norm or (kind is FilterType.instance_norm and p.type.has_moving_statistics):
        mean, var = layer.moving_mean, layer.moving_variance
        if mean is None or var is None:
            raise UnsupportedError(must_be(f"{where}: batch norm",
                                           "with moving statistics (the inference phase "
                                           "of one without them uses each batch's statistics)", "none"))
        y = writer.node("BatchNormalization", [flat, writer.constant("scale", gamma), writer.constant("bias",
                                                                                                      beta),
                                               writer.constant("mean", mean), writer.constant("var", var)],
                        epsilon=p.epsilon, momentum=p.momentum)[0]
    elif kind is FilterType.instance_norm:
        if rank < 2:
            raise UnsupportedError(must_be(f"{where}: instance norm input_shape",
                                           "(C, *spatial) with spatial "
                                           "axes", shape))
        y = writer.node("InstanceNormalization", [flat, writer.constant("scale", gamma),
                                                  writer.constant("bias", beta)], epsilon=p.epsilon)[0]
    else:
        groups = p.type.groups
        if writer.opset < 21:
            raise UnsupportedError(must_be(f"{where}: opset",
                                           ">= 21 for GroupNormalization (per-channel scale)",
                                           writer.opset))
        y = writer.node("GroupNormalization", [flat, writer.constant("scale", gamma), writer.constant("bias",
                                                                                                      beta)],
                        num_groups=groups, epsilon=p.epsilon)[0]
    y = _export_activation(writer, p.activation, y, where)
    if open_sizes:
        return y
    return writer.node("Reshape", [y, writer.node("Shape", [x])[0]])[0]


def _export_rms(writer: _GraphWriter, layer: NormalizationLayer, x: str) -> str:
    """RMS normalization over the layer's axes from ``normalization_axis`` on: an
    ``RMSNormalization`` node from opset 23, before it the same formula in primitive nodes
    (``x / Sqrt(ReduceMean(x·x) + ε) · γ``, computed in the data's type)."""
    p = layer.layer_parameters
    shape = layer.input_shape
    axis = -(len(shape) - p.type.axis)  # counted from the end: the leading axes are the batch
    gamma = np.ones(p.affine_shape) if layer.gamma is None else layer.gamma
    if writer.opset >= 23:
        return writer.node("RMSNormalization", [x, writer.constant("scale", gamma)], axis=axis,
                           epsilon=p.epsilon)[0]
    axes = list(range(axis, 0))
    square = writer.node("Mul", [x, x])[0]
    if writer.opset >= 18:
        mean = writer.node("ReduceMean", [square, writer.ints(axes)], keepdims=1)[0]
    else:
        mean = writer.node("ReduceMean", [square], axes=axes, keepdims=1)[0]
    shifted = writer.node("Add", [mean, writer.constant("epsilon", np.asarray(p.epsilon))])[0]
    normalized = writer.node("Div", [x, writer.node("Sqrt", [shifted])[0]])[0]
    return writer.node("Mul", [normalized, writer.constant("scale", gamma)])[0]


def _export_fully_connected(writer: _GraphWriter, layer: FullyConnectedLayer, x: str, where: str) -> str:
    y = writer.node("MatMul", [x, writer.constant("weights", layer.weights.T)])[0]
    if layer.bias is not None:
        y = writer.node("Add", [y, writer.constant("bias", layer.bias)])[0]
    return _export_activation(writer, layer.activation, y, where)


def _layers_of(model_or_layers: Any) -> list[Filter]:
    if isinstance(model_or_layers, Filter):
        return [model_or_layers]
    if isinstance(model_or_layers, Mapping):
        return list(model_or_layers.values())
    if isinstance(model_or_layers, Iterable):
        return list(model_or_layers)
    raise InvalidParameterError(must_be("export(model_or_layers)", "a layer or a sequence of layers",
                                        type(model_or_layers).__name__))


def export(model_or_layers: Any, path: str | os.PathLike[str] | None = None, *, opset: int = DEFAULT_OPSET,
           check: bool = True, initial_states: bool = False) -> Any:
    """Write bnnsfw layers, applied one after the other, as an ONNX model.

    Parameters
    ----------
    model_or_layers : layer, sequence or mapping of layers
        ``LSTMLayer``, ``NormalizationLayer`` and ``FullyConnectedLayer`` objects, in the
        order data flows through them (a mapping's values in order). Each normalization
        layer sees its input as a batch of samples of its ``input_shape``: the leading axes
        before them are the batch (so a layer norm over ``(H,)`` after an LSTM normalizes
        every step of every sequence).
    path : str or PathLike, optional
        Where to write the ``.onnx`` file; the model is returned either way.
    opset : int
        The ONNX opset (default :data:`DEFAULT_OPSET`); layer normalization needs 17 or more,
        group normalization 21 or more. RMS normalization is an ``RMSNormalization`` node
        from opset 23, and the same formula in primitive nodes (``Mul``, ``ReduceMean``,
        ``Add``, ``Sqrt``, ``Div``) before it.
    check : bool
        Run ``onnx.checker.check_model(model, full_check=True)`` before returning.
    initial_states : bool
        For a single LSTM layer: also take its initial states as the inputs
        ``initial_hidden`` and ``initial_cell`` ``(L·D, N, H)``, as :meth:`LSTMLayer.apply`'s
        ``hidden`` and ``cell`` (without them the states start at zero). With ``T = 1`` the
        graph is one streaming step: feed the ``hidden`` and ``cell`` it returned back in.

    Returns
    -------
    onnx.ModelProto
        One input ``input`` (and the initial states, with ``initial_states``); the output
        ``output``; for a single LSTM layer also ``hidden`` and ``cell``, the final states
        ``(L·D, N, H)``. Batch and sequence dimensions are symbolic, and so are a
        normalization's open sizes (``S1``, ``S2``, … by axis; its input must then have one
        batch axis). The graph computes the layers' inference phase (normalization with moving
        statistics where the layer has them; no dropout). ONNX stores float attributes
        (``epsilon``, activation ``alpha`` and ``beta``) as float32, so a float64 layer comes
        back exactly only where those values are float32 numbers (``clip`` too). A batch-first
        LSTM is written as a ``layout=0`` LSTM between two ``Transpose`` nodes, since ONNX
        Runtime does not run ``layout=1``. The LSTM variants ONNX has attributes for are written
        with them: ``reverse`` as ``direction="reverse"``, ``clip``, ``input_forget`` and
        per-direction activations (with their alphas and betas).

    Raises
    ------
    UnsupportedError
        For what ONNX cannot express: a full peephole matrix, a peephole on the candidate
        gate, different activations on the input, forget and output gates, activations ONNX
        has no operator for, an LSTM projection (with its ``projection_clip``), a
        layer-normalized LSTM cell, ``cell_clip``, an opset too old for a layer.
    """
    onnx = _onnx()
    layers = _layers_of(model_or_layers)
    if not layers:
        raise InvalidParameterError(must_be("export(model_or_layers)", "at least one layer", "none"))
    if not isinstance(opset, int) or not _MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise InvalidParameterError(must_be("export(opset)", f"an int in [{_MIN_OPSET}, "
                                            f"{onnx.defs.onnx_opset_version()}]", opset))
    dtypes = {layer.layer_parameters.dtype for layer in layers if hasattr(layer, "layer_parameters")}
    if len(dtypes) != 1:
        raise InvalidParameterError(must_be("export(model_or_layers)", "layers of one dtype",
                                            sorted(map(str, dtypes))))
    dtype = np.dtype(dtypes.pop())
    writer = _GraphWriter(opset, dtype)
    x = "input"
    first = layers[0]
    if not isinstance(initial_states, bool):
        raise InvalidParameterError(must_be("export(initial_states)", "a bool", initial_states))
    if initial_states and (len(layers) != 1 or not isinstance(first, LSTMLayer)):
        raise InvalidParameterError(must_be("export(initial_states=True)", "given a single LSTM layer",
                                            f"{len(layers)} layers, the first a {type(first).__name__}"))
    initial = ("initial_hidden", "initial_cell") if initial_states else None
    if isinstance(first, LSTMLayer):
        size = first.layer_parameters.input_size
        in_shape: list[Any] = ["N", "T", size] if first.layer_parameters.batch_first else ["T", "N", size]
    elif isinstance(first, NormalizationLayer):  # open sizes are symbolic: S1, S2 … by axis
        in_shape = ["N", *(f"S{i}" if s is None else s for i, s in enumerate(first.input_shape))]
    elif isinstance(first, FullyConnectedLayer):
        in_shape = ["N", first.input_size]
    else:
        raise InvalidParameterError(must_be("export(model_or_layers)[0]", "an LSTM, normalization or fully "
                                            "connected layer", type(first).__name__))
    states: tuple[str, str] | None = None
    shape = list(in_shape)  # the data's shape as it flows, with symbolic batch and time
    state_shape: list[Any] = []
    for index, layer in enumerate(layers):
        where = f"export(model_or_layers)[{index}]"
        if not isinstance(layer, Filter):
            raise InvalidParameterError(must_be(where, "a bnnsfw layer", type(layer).__name__))
        layer.check_open("export")
        if isinstance(layer, LSTMLayer):
            p = layer.layer_parameters
            _check_width(where, shape, p.input_size)
            x, hidden, cell = _export_lstm(writer, layer, x, where, initial)
            states = (hidden, cell)
            shape = [*shape[:-1], p.num_directions * p.hidden_size]
            state_shape = [p.num_layers * p.num_directions, shape[0 if p.batch_first else 1], p.hidden_size]
        elif isinstance(layer, NormalizationLayer):
            _check_width(where, shape, *layer.input_shape)
            if None in layer.input_shape and len(shape) != len(layer.input_shape) + 1:
                raise UnsupportedError(must_be(
                    f"{where} input", "(N, C, *spatial) data, one batch axis, for a normalization with "
                    "open sizes", f"data of shape {shape}"))
            x = _export_normalization(writer, layer, x, where)
        elif isinstance(layer, FullyConnectedLayer):
            _check_width(where, shape, layer.input_size)
            x = _export_fully_connected(writer, layer, x, where)
            shape = [*shape[:-1], layer.output_size]
        else:
            raise InvalidParameterError(must_be(where, "an LSTM, normalization or fully connected layer",
                                                type(layer).__name__))
    element = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    writer.nodes.append(onnx.helper.make_node("Identity", [x], ["output"], name="output"))
    outputs = [onnx.helper.make_tensor_value_info("output", element, shape)]
    if len(layers) == 1 and states is not None:
        writer.nodes.append(onnx.helper.make_node("Identity", [states[0]], ["hidden"], name="hidden"))
        writer.nodes.append(onnx.helper.make_node("Identity", [states[1]], ["cell"], name="cell"))
        outputs += [onnx.helper.make_tensor_value_info(n, element, state_shape) for n in ("hidden", "cell")]
    inputs = [onnx.helper.make_tensor_value_info("input", element, in_shape)]
    if initial is not None:
        inputs += [onnx.helper.make_tensor_value_info(n, element, state_shape) for n in initial]
    graph = onnx.helper.make_graph(writer.nodes, "bnnsfw", inputs, outputs, writer.initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   producer_name="bnnsfw")
    model.ir_version = min(model.ir_version, _ir_version(onnx, opset))
    model = onnx.shape_inference.infer_shapes(model)
    if check:
        onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


def _check_width(where: str, shape: list[Any], *trailing: int | None) -> None:
    """The data reaching a layer must end in the extents the layer takes (``None``: any)."""
    tail = shape[len(shape) - len(trailing):]
    if len(shape) < len(trailing) or any(t is not None and s != t for s, t in zip(tail, trailing)):
        raise ShapeError(must_be(f"{where} input", f"data ending in {list(trailing)}",
                                 f"data of shape {shape}"))


def _ir_version(onnx: Any, opset: int) -> int:
    """The oldest IR version that carries ``opset``, so older runtimes read the file."""
    for entry in onnx.helper.VERSION_TABLE:
        if entry[2] >= opset:
            return int(entry[1])
    return int(onnx.IR_VERSION)

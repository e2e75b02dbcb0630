"""Run ONNX graphs on bnnsfw layers, and write bnnsfw layers as ONNX graphs.

:func:`load` takes a path, bytes or an ``onnx.ModelProto`` and returns a :class:`Session`
whose :meth:`Session.run` has ONNX Runtime's signature (``run(output_names, input_feed)``,
a list of arrays back). Its ``LSTM``, ``BatchNormalization``, ``InstanceNormalization``,
``LayerNormalization``, ``GroupNormalization`` and ``RMSNormalization`` nodes run as bnnsfw
layers — the session builds one per node whose weights are constants, and
:meth:`Session.layer` hands it out to run backward and fine-tune — and the glue that
exporters put around them (``MatMul``, ``Gemm``, element-wise arithmetic and activations,
``Transpose``, ``Reshape``, ``Squeeze``/``Unsqueeze``, ``Slice``, ``Gather``, ``Concat``,
``Shape``, reductions, ``Softmax`` …) runs in NumPy. An operator, attribute or attribute
value outside that set is refused at load with :class:`~bnnsfw.UnsupportedError` naming the
node, the operator and the attribute; nothing is approximated silently.

:func:`export` writes bnnsfw LSTM, normalization and fully connected layers, applied one
after the other, as an ONNX graph that passes ``onnx.checker.check_model(full_check=True)``.

Only the ``onnx`` package is needed (``pip install 'bnnsfw[onnx]'``); ONNX Runtime is not.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np

from ..activation import Activation
from ..enums import ActivationFunction, FilterType
from ..errors import DTypeError, InvalidParameterError, ShapeError, UnsupportedError, must_be
from ..filter import Filter, FilterParameters
from ..layers.fully_connected import FullyConnectedLayer
from ..layers.lstm import GATE_FIELDS, LSTMGateDescriptor, LSTMLayer
from ..layers.normalization import NormalizationLayer
from ._layer_nodes import (
    _LAYER_OPS,
    _ONNX_GATES,
    _ONNX_PEEPHOLES,
    _RNN_ACTIVATIONS,
    _LayerNode,
    _LSTMNode,
    _NormNode,
)
from ._nodes import _MIN_OPSET, Array, _Node, _onnx, _unsupported
from ._operators import _OPS

__all__ = ["load", "Session", "NodeArg", "export", "SUPPORTED_OPS", "DEFAULT_OPSET"]

#: The opset :func:`export` writes unless told otherwise.
DEFAULT_OPSET = 21

#: Every operator a session runs (see the module docstring).
SUPPORTED_OPS: frozenset[str] = frozenset(_OPS) | frozenset(_LAYER_OPS)


# ------------------------------------------------------------------------------------------
# Nodes and values.
# ------------------------------------------------------------------------------------------
@attrs.frozen
class NodeArg:
    """An input or output of a session, as ONNX Runtime describes it: ``name``, ``shape``
    (ints, dimension names or ``None``) and ``type`` (``"tensor(float)"`` …)."""

    name: str
    shape: list[Any]
    type: str


# ------------------------------------------------------------------------------------------
# The session.
# ------------------------------------------------------------------------------------------
def _value_info(value: Any) -> NodeArg:
    onnx = _onnx()
    tensor = value.type.tensor_type
    shape: list[Any] = []
    if tensor.HasField("shape"):
        for dim in tensor.shape.dim:
            shape.append(dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None))
    try:
        element = onnx.helper.tensor_dtype_to_string(tensor.elem_type).removeprefix("TensorProto.").lower()
    except (KeyError, ValueError):
        element = str(tensor.elem_type)
    names = {"float": "float", "double": "double", "int64": "int64", "int32": "int32", "bool": "bool"}
    return NodeArg(name=value.name, shape=shape, type=f"tensor({names.get(element, element)})")


class Session:
    """A loaded ONNX graph, run with bnnsfw layers (see :func:`load`).

    ``run(output_names, input_feed)`` is ONNX Runtime's ``InferenceSession.run``:
    ``output_names`` a list of names, or ``None`` for every output; ``input_feed`` a mapping
    from input name to array; the result a list of arrays in the order asked for.
    """

    def __init__(self, model: Any, filter_parameters: FilterParameters | None = None) -> None:
        onnx = _onnx()
        graph = model.graph
        opset = None
        for entry in model.opset_import:
            if entry.domain in ("", "ai.onnx"):
                opset = int(entry.version)
            elif entry.domain not in ("ai.onnx.ml",):
                raise UnsupportedError(must_be("ONNX model opset_import", "the default domain only",
                                               f"domain {entry.domain!r}"))
        if opset is None or opset < _MIN_OPSET:
            raise UnsupportedError(must_be("ONNX model opset", f">= {_MIN_OPSET}", opset))
        self.opset = opset
        fp = filter_parameters or FilterParameters()
        self._constants: dict[str, Array] = {init.name: onnx.numpy_helper.to_array(init)
                                             for init in graph.initializer}
        initializer_names = set(self._constants)
        self._inputs = [_value_info(v) for v in graph.input if v.name not in initializer_names]
        self._input_dtypes: dict[str, np.dtype] = {}
        for value in graph.input:
            element = value.type.tensor_type.elem_type
            if value.name not in initializer_names and element:
                try:
                    self._input_dtypes[value.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(element))
                except (KeyError, TypeError, ValueError):
                    pass  # a type NumPy has no dtype for: the nodes that read it refuse it
        self._outputs = [_value_info(v) for v in graph.output]
        shapes = self._static_shapes(model)
        self._nodes: list[_Node] = []
        self._runners: dict[str, _LayerNode] = {}
        names: set[str] = set()
        for index, proto in enumerate(graph.node):
            node = _Node(proto, index, opset)
            if proto.domain not in ("", "ai.onnx"):
                raise _unsupported(node, "domain", proto.domain)
            if node.name in names:
                node.name = f"{node.name}_{index}"
            names.add(node.name)
            allowed = _LAYER_OPS.get(node.op_type)
            if allowed is None:
                if node.op_type not in _OPS:
                    raise _unsupported(node, "operator", node.op_type)
                allowed = _OPS[node.op_type][0]
            for attribute in node.attributes:
                if attribute not in allowed:
                    raise _unsupported(node, f"attribute {attribute}", node.attributes[attribute])
            if node.op_type == "LSTM":
                self._runners[node.name] = _LSTMNode(node, self._constants, fp)
            elif node.op_type in _LAYER_OPS:
                self._runners[node.name] = _NormNode(node, self._constants, fp, shapes.get(node.inputs[0]))
            elif all(name in self._constants for name in node.inputs if name) and node.op_type != "Dropout":
                # Constant folding: the node's value is the same on every run.
                values = self._call(node, [self._constants.get(n) for n in node.inputs])
                for name, value in zip(node.outputs, values):
                    if name and value is not None:
                        self._constants[name] = np.asarray(value)
                continue
            self._nodes.append(node)

    @staticmethod
    def _static_shapes(model: Any) -> dict[str, list[int | None]]:
        onnx = _onnx()
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - shapes are only a hint for building layers early
            return {}
        shapes = {}
        for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
            tensor = value.type.tensor_type
            if tensor.HasField("shape"):
                shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None
                                      for d in tensor.shape.dim]
        return shapes

    def _call(self, node: _Node, inputs: list[Any]) -> list[Any]:
        runner = self._runners.get(node.name)
        if runner is not None:
            return runner.run(inputs)
        function = _OPS[node.op_type][1]
        while inputs and inputs[-1] is None:
            inputs = inputs[:-1]
        try:
            return list(function(node, *inputs))
        except (ValueError, TypeError, IndexError) as error:
            if isinstance(error, (InvalidParameterError, ShapeError, DTypeError)):
                raise
            raise InvalidParameterError(must_be(f"ONNX node {node.name!r} ({node.op_type}) inputs",
                                                "valid for the operator", f"{error}")) from None

    # ONNX Runtime's interface.
    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs that are not initializers."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs."""
        return list(self._outputs)

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[Array]:
        """Run the graph; returns the outputs named (every output for ``None``) as arrays."""
        if not isinstance(input_feed, Mapping):
            raise InvalidParameterError(must_be("Session.run(input_feed)", "a mapping of input name to array",
                                                type(input_feed).__name__))
        expected = {arg.name for arg in self._inputs}
        unknown = sorted(set(input_feed) - expected)
        if unknown:
            raise InvalidParameterError(must_be("Session.run(input_feed) names", f"among {sorted(expected)}",
                                                unknown))
        values: dict[str, Any] = dict(self._constants)
        for arg in self._inputs:
            if arg.name not in input_feed:
                raise InvalidParameterError(must_be(f"Session.run(input_feed)[{arg.name!r}]", "given",
                                                    "missing"))
            value = np.asarray(input_feed[arg.name])
            declared = self._input_dtypes.get(arg.name)
            if declared is not None and value.dtype != declared:  # ONNX Runtime refuses these too
                raise DTypeError(must_be(f"Session.run(input_feed)[{arg.name!r}]", f"of type {arg.type}",
                                         value.dtype.name))
            values[arg.name] = value
        wanted = [arg.name for arg in self._outputs] if output_names is None else list(output_names)
        known = {arg.name for arg in self._outputs}
        for name in wanted:
            if name not in known:
                raise InvalidParameterError(must_be("Session.run(output_names)", f"among {sorted(known)}",
                                                    name))
        for node in self._nodes:
            missing = [name for name in node.inputs if name and name not in values]
            if missing:
                raise InvalidParameterError(must_be(f"ONNX node {node.name!r} inputs", "computed before it",
                                                    missing))
            outputs = self._call(node, [values[name] if name else None for name in node.inputs])
            for name, value in zip(node.outputs, outputs):
                if name:
                    values[name] = value
        return [np.asarray(values[name]) for name in wanted]

    # bnnsfw's additions.
    @property
    def layer_names(self) -> list[str]:
        """Names of the LSTM and normalization nodes whose weights are constants."""
        return [name for name, runner in self._runners.items() if runner.constant]

    def layer(self, name: str) -> Filter:
        """The bnnsfw layer that runs node ``name``: fine-tune it, and later runs see it.

        Layers are created with ``use_client_pointer=True`` over arrays the session owns,
        so an optimizer updating ``layer.layer_parameters``' arrays (LSTM) or ``layer.gamma`` …
        (normalization) in place changes what :meth:`run` computes. An LSTM node with
        ``direction="reverse"`` runs its (forward) layer on time-reversed sequences.
        A normalization node whose input shape is not fixed in the graph gets its layer on
        the first :meth:`run`.
        """
        runner = self._runners.get(name)
        if runner is None or not runner.constant:
            raise InvalidParameterError(must_be("Session.layer(name)", f"one of {self.layer_names}", name))
        if runner.primary is None:
            raise InvalidParameterError(must_be(
                f"Session.layer({name!r})",
                "asked after a run (the node's input shape is not fixed in the graph)", "no run yet"))
        return runner.primary

    def close(self) -> None:
        """Close every layer the session created."""
        for runner in self._runners.values():
            runner.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(model: Any, *, filter_parameters: FilterParameters | None = None) -> Session:
    """Load an ONNX model to run with bnnsfw.

    Parameters
    ----------
    model : str, os.PathLike, bytes or onnx.ModelProto
        A file, its bytes, or the model itself.
    filter_parameters : FilterParameters, optional
        Backend and thread options for the layers the session creates.

    Returns
    -------
    Session

    Raises
    ------
    UnsupportedError
        Naming the node, operator and attribute of the first thing bnnsfw cannot run.
    """
    onnx = _onnx()
    if isinstance(model, (str, os.PathLike)):
        proto = onnx.load(os.fspath(model))
    elif isinstance(model, (bytes, bytearray)):
        proto = onnx.load_from_string(bytes(model))
    elif isinstance(model, onnx.ModelProto):
        proto = model
    else:
        raise InvalidParameterError(must_be("bnnsfw.onnx.load(model)", "a path, bytes or an onnx.ModelProto",
                                            type(model).__name__))
    if proto.functions:
        raise UnsupportedError(must_be("ONNX model functions", "absent (local functions are not run)",
                                       [f.name for f in proto.functions]))
    return Session(proto, filter_parameters)


# ------------------------------------------------------------------------------------------
# Export.
# ------------------------------------------------------------------------------------------
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


def _export_lstm(writer: _GraphWriter, layer: LSTMLayer, x: str, where: str) -> tuple[str, str, str]:
    """LSTM nodes (one per layer of the stack) reading x (T, N, I) or (N, T, I); returns
    the output (same layout as bnnsfw's) and the final states (L·D, N, H)."""
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
            inputs += ["", "", "", writer.constant("P", stacked(peephole, _ONNX_PEEPHOLES))]
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
    flat = writer.node("Reshape", [x, writer.ints([-1, *shape])])[0]
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
           check: bool = True) -> Any:
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

    Returns
    -------
    onnx.ModelProto
        One input ``input``; the output ``output``; for a single LSTM layer also ``hidden``
        and ``cell``, the final states ``(L·D, N, H)``. Batch and sequence dimensions are
        symbolic. The graph computes the layers' inference phase (normalization with moving
        statistics where the layer has them; no dropout). ONNX stores float attributes
        (``epsilon``, activation ``alpha`` and ``beta``) as float32, so a float64 layer comes
        back exactly only where those values are float32 numbers (``clip`` too). A batch-first
        LSTM is written as a ``layout=0`` LSTM between two ``Transpose`` nodes, since ONNX
        Runtime does not run ``layout=1``. The LSTM variants ONNX has attributes for are
        written with them: ``reverse`` as ``direction="reverse"``, ``clip``, ``input_forget``
        and per-direction activations (with their alphas and betas).

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
    if isinstance(first, LSTMLayer):
        size = first.layer_parameters.input_size
        in_shape: list[Any] = ["N", "T", size] if first.layer_parameters.batch_first else ["T", "N", size]
    elif isinstance(first, NormalizationLayer):
        in_shape = ["N", *first.input_shape]
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
            x, hidden, cell = _export_lstm(writer, layer, x, where)
            states = (hidden, cell)
            shape = [*shape[:-1], p.num_directions * p.hidden_size]
            state_shape = [p.num_layers * p.num_directions, shape[0 if p.batch_first else 1], p.hidden_size]
        elif isinstance(layer, NormalizationLayer):
            _check_width(where, shape, *layer.input_shape)
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
    graph = onnx.helper.make_graph(writer.nodes, "bnnsfw", [onnx.helper.make_tensor_value_info("input",
                                                                                               element,
                                                                                               in_shape)],
                                   outputs, writer.initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   producer_name="bnnsfw")
    model.ir_version = min(model.ir_version, _ir_version(onnx, opset))
    model = onnx.shape_inference.infer_shapes(model)
    if check:
        onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


def _check_width(where: str, shape: list[Any], *trailing: int) -> None:
    """The data reaching a layer must end in the extents the layer takes."""
    if len(shape) < len(trailing) or [s for s in shape[len(shape) - len(trailing):]] != list(trailing):
        raise ShapeError(must_be(f"{where} input", f"data ending in {list(trailing)}",
                                 f"data of shape {shape}"))


def _ir_version(onnx: Any, opset: int) -> int:
    """The oldest IR version that carries ``opset``, so older runtimes read the file."""
    for entry in onnx.helper.VERSION_TABLE:
        if entry[2] >= opset:
            return int(entry[1])
    return int(onnx.IR_VERSION)

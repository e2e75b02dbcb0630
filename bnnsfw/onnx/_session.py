"""Loading an ONNX model and running its graph: :func:`load` and :class:`Session`.

A session reads the graph once: it refuses what it cannot run (naming the node, the operator
and the attribute), folds the nodes whose inputs are all constants, and gives each layer node
its runner; :meth:`Session.run` then runs the remaining nodes in order.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import attrs
import numpy as np

from ..errors import DTypeError, InvalidParameterError, ShapeError, UnsupportedError, must_be
from ..filter import Filter, FilterParameters
from ._external_data import load_external_data
from ._layer_nodes import _LAYER_OPS, _LayerNode, _LSTMNode, _NormNode
from ._nodes import _MIN_OPSET, Array, _Node, _onnx, _unsupported
from ._operators import _OPS

__all__ = ["NodeArg", "Session", "load"]


@attrs.frozen
class NodeArg:
    """An input or output of a session, as ONNX Runtime describes it: ``name``, ``shape``
    (ints, dimension names or ``None``) and ``type`` (``"tensor(float)"`` …)."""

    name: str
    shape: list[Any]
    type: str


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
    InvalidParameterError
        For a tensor whose external data is not a file inside the model's folder (or that
        cannot be read from there), naming the tensor and the location; a model given as
        bytes or a ``ModelProto`` has no folder, so its tensors must hold their data.
    """
    onnx = _onnx()
    folder = None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        proto, where = onnx.load(path, load_external_data=False), f"bnnsfw.onnx.load({path!r})"
        folder = os.path.dirname(os.path.abspath(path))
    elif isinstance(model, (bytes, bytearray)):
        proto, where = onnx.load_from_string(bytes(model)), "bnnsfw.onnx.load(model)"
    elif isinstance(model, onnx.ModelProto):
        proto, where = model, "bnnsfw.onnx.load(model)"
    else:
        raise InvalidParameterError(must_be("bnnsfw.onnx.load(model)", "a path, bytes or an onnx.ModelProto",
                                            type(model).__name__))
    load_external_data(where, proto, folder)
    if proto.functions:
        raise UnsupportedError(must_be("ONNX model functions", "absent (local functions are not run)",
                                       [f.name for f in proto.functions]))
    return Session(proto, filter_parameters)

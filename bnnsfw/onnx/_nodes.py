"""One node of an ONNX graph as bnnsfw reads it, and what loading and export share.

The ``onnx`` package is optional: :func:`_onnx` imports it when it is first needed, so that
``import bnnsfw.onnx`` works without it. :class:`_Node` parses a node's attributes once;
:func:`_unsupported` and :func:`_axis` make the errors that name the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidParameterError, UnsupportedError, must_be

Array = np.ndarray

_MIN_OPSET = 7  # LSTM and BatchNormalization as they have been since opset 7


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:  # pragma: no cover - exercised only without onnx
        raise UnsupportedError(must_be("bnnsfw.onnx", "used with the onnx package installed "
                                       "(pip install 'bnnsfw[onnx]')", "no onnx")) from None
    return onnx


def _unsupported(node: "_Node", what: str, value: object) -> UnsupportedError:
    return UnsupportedError(must_be(f"ONNX node {node.name!r} ({node.op_type}) {what}",
                                    "something bnnsfw supports", value))


class _Node:
    """One graph node: its op, attributes (parsed), opset and the names it reads and writes."""

    def __init__(self, proto: Any, index: int, opset: int) -> None:
        onnx = _onnx()
        self.proto = proto
        self.op_type: str = proto.op_type
        self.name: str = proto.name or f"{proto.op_type}_{index}"
        self.inputs: list[str] = list(proto.input)
        self.outputs: list[str] = list(proto.output)
        self.opset = opset
        self.attributes: dict[str, Any] = {}
        for attribute in proto.attribute:
            if attribute.ref_attr_name:
                raise _unsupported(self, f"attribute {attribute.name}", "a reference to a function attribute")
            value = onnx.helper.get_attribute_value(attribute)
            if attribute.type == onnx.AttributeProto.TENSOR:
                value = onnx.numpy_helper.to_array(value)
            elif isinstance(value, bytes):
                value = value.decode()
            elif isinstance(value, list) and value and isinstance(value[0], bytes):
                value = [v.decode() for v in value]
            self.attributes[attribute.name] = value

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attributes.get(name, default)


def _axis(node: _Node, axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise InvalidParameterError(must_be(f"ONNX node {node.name!r} ({node.op_type}) {name}",
                                            f"in [{-rank}, {rank - 1}]", axis))
    return axis % rank

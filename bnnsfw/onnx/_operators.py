"""The operators a session runs in NumPy: the glue that exporters put around the layers.

Each registers itself in ``_OPS`` with the attributes it understands (:func:`_op`); its
function takes the node and the node's input arrays (``None`` for an omitted optional input)
and returns the outputs. Element-wise arithmetic and activations, matrix products, shapes and
data movement, and reductions.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..activation import Activation
from ._nodes import Array, _axis, _Node, _onnx, _unsupported

#: op type -> (the attributes it understands, the function that runs it). The function takes
#: the node and its input arrays (``None`` for an omitted optional input) and returns the outputs.
_OPS: dict[str, tuple[frozenset[str], Callable[..., list[Any]]]] = {}


_OpFunction = Callable[..., list[Any]]


def _op(*names: str, attributes: Sequence[str] = ()) -> Callable[[_OpFunction], _OpFunction]:
    def register(function: _OpFunction) -> _OpFunction:
        for name in names:
            _OPS[name] = (frozenset(attributes), function)
        return function

    return register


def _ints(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


# --- element-wise ------------------------------------------------------------------------
def _same(x: Array, result: Any) -> Array:
    return np.asarray(result).astype(x.dtype, copy=False)


_BINARY: dict[str, Callable[[Array, Array], Array]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}


@_op(*_BINARY)
def _binary(node: _Node, *inputs: Array) -> list[Any]:
    function = _BINARY[node.op_type]
    result = inputs[0]
    for other in inputs[1:]:  # Max and Min take any number of inputs
        result = function(result, other)
    return [result]


@_op("Div")
def _div(node: _Node, x: Array, y: Array) -> list[Any]:
    if x.dtype.kind in "iu":
        return [np.trunc(x / y).astype(x.dtype)]  # integer division truncates toward zero
    return [x / y]


@_op("Pow")
def _pow(node: _Node, x: Array, y: Array) -> list[Any]:
    return [_same(x, np.power(x, y))]


@_op("Mod", attributes=("fmod",))
def _mod(node: _Node, x: Array, y: Array) -> list[Any]:
    return [np.fmod(x, y) if node.attr("fmod", 0) else np.mod(x, y)]


def _erf(x: Array) -> Array:
    from scipy import special

    return special.erf(x)


_UNARY: dict[str, Callable[[Array], Any]] = {
    "Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Tanh": np.tanh,
    "Reciprocal": np.reciprocal, "Floor": np.floor, "Ceil": np.ceil, "Not": np.logical_not, "Sign": np.sign,
    "Sin": np.sin, "Cos": np.cos, "Erf": _erf, "Identity": lambda x: x, "Round": np.round,
}


@_op(*_UNARY)
def _unary(node: _Node, x: Array) -> list[Any]:
    return [_same(x, _UNARY[node.op_type](x)) if x.dtype != np.bool_ else _UNARY[node.op_type](x)]


# Activations that bnnsfw's Activation computes, with the ONNX attributes they take.
_ACTIVATION_OPS: dict[str, tuple[tuple[str, ...], Callable[[_Node], Activation]]] = {
    "Relu": ((), lambda n: Activation.relu()),
    "Sigmoid": ((), lambda n: Activation.sigmoid()),
    "LeakyRelu": (("alpha",), lambda n: Activation.leaky_relu(n.attr("alpha", 0.01))),
    "Elu": (("alpha",), lambda n: Activation.elu(n.attr("alpha", 1.0))),
    "Celu": (("alpha",), lambda n: Activation.celu(n.attr("alpha", 1.0))),
    "HardSigmoid": (("alpha", "beta"), lambda n: Activation.hard_sigmoid(n.attr("alpha", 0.2),
                                                                          n.attr("beta", 0.5))),
    "HardSwish": ((), lambda n: Activation.hard_swish()),
    "Softplus": ((), lambda n: Activation.softplus()),
    "Softsign": ((), lambda n: Activation.softsign()),
    "ThresholdedRelu": (("alpha",), lambda n: Activation.threshold(n.attr("alpha", 1.0), 0.0)),
    "Shrink": (("lambd", "bias"), lambda n: _shrink(n)),
    "Gelu": (("approximate",), lambda n: _gelu(n)),
    "Mish": ((), lambda n: _not_elementwise(n)),
}


def _shrink(node: _Node) -> Activation:
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    if bias == 0.0:
        return Activation.hard_shrink(lambd)
    if bias == lambd:
        return Activation.soft_shrink(lambd)
    raise _unsupported(node, "attribute bias", bias)


def _gelu(node: _Node) -> Activation:
    approximate = node.attr("approximate", "none")
    if approximate == "none":
        return Activation.gelu()
    if approximate == "tanh":
        return Activation.gelu_approximation()
    raise _unsupported(node, "attribute approximate", approximate)


def _not_elementwise(node: _Node) -> Activation:
    raise _unsupported(node, "operator", node.op_type)


def _activation_op(node: _Node, x: Array) -> list[Any]:
    return [_ACTIVATION_OPS[node.op_type][1](node).forward(x)]


for _name, (_attributes, _) in _ACTIVATION_OPS.items():
    if _name != "Mish":
        _OPS[_name] = (frozenset(_attributes), _activation_op)


@_op("Selu", attributes=("alpha", "gamma"))
def _selu(node: _Node, x: Array) -> list[Any]:
    alpha, gamma = node.attr("alpha", 1.6732632423543772), node.attr("gamma", 1.0507009873554805)
    return [_same(x, gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0))))]


@_op("Clip", attributes=("min", "max"))
def _clip(node: _Node, x: Array, low: Array | None = None, high: Array | None = None) -> list[Any]:
    if node.opset < 11:
        low, high = node.attr("min", -np.inf), node.attr("max", np.inf)
    result = x
    if low is not None:
        result = np.maximum(result, low)
    if high is not None:
        result = np.minimum(result, high)
    return [_same(x, result)]


@_op("Where")
def _where(node: _Node, condition: Array, x: Array, y: Array) -> list[Any]:
    return [np.where(condition, x, y)]


@_op("Softmax", "LogSoftmax", attributes=("axis",))
def _softmax(node: _Node, x: Array) -> list[Any]:
    if node.opset < 13:  # coerced to 2-D at axis (default 1)
        axis = _axis(node, node.attr("axis", 1), x.ndim)
        flat = x.reshape(math.prod(x.shape[:axis]), -1)
        return [_softmax_along(node, flat, 1).reshape(x.shape)]
    return [_softmax_along(node, x, _axis(node, node.attr("axis", -1), x.ndim))]


def _softmax_along(node: _Node, x: Array, axis: int) -> Array:
    shifted = x - x.max(axis=axis, keepdims=True)
    if node.op_type == "LogSoftmax":
        return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    e = np.exp(shifted)
    return e / e.sum(axis=axis, keepdims=True)


@_op("Dropout", attributes=("seed", "ratio", "is_test"))
def _dropout(node: _Node, x: Array, ratio: Array | None = None, training: Array | None = None) -> list[Any]:
    if training is not None and bool(np.asarray(training)):
        raise _unsupported(node, "input training_mode", "true (dropout runs in inference only here)")
    return [x, np.ones(x.shape, dtype=bool)]


# --- matrix products ----------------------------------------------------------------------
@_op("MatMul")
def _matmul(node: _Node, a: Array, b: Array) -> list[Any]:
    return [np.matmul(a, b)]


@_op("Gemm", attributes=("alpha", "beta", "transA", "transB"))
def _gemm(node: _Node, a: Array, b: Array, c: Array | None = None) -> list[Any]:
    a = a.T if node.attr("transA", 0) else a
    b = b.T if node.attr("transB", 0) else b
    result = node.attr("alpha", 1.0) * (a @ b)
    if c is not None:
        result = result + node.attr("beta", 1.0) * c
    return [_same(a, result)]


# --- shapes and data movement -------------------------------------------------------------
@_op("Constant", attributes=("value", "value_float", "value_floats", "value_int", "value_ints"))
def _constant(node: _Node) -> list[Any]:
    if "value" in node.attributes:
        return [np.asarray(node.attr("value"))]
    for name, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                        ("value_ints", np.int64)):
        if name in node.attributes:
            return [np.asarray(node.attr(name), dtype=dtype)]
    raise _unsupported(node, "attributes", sorted(node.attributes) or "none")


@_op("Cast", attributes=("to", "saturate", "round_mode"))
def _cast(node: _Node, x: Array) -> list[Any]:
    return [x.astype(_numpy_dtype(node, node.attr("to")))]


@_op("CastLike", attributes=("saturate", "round_mode"))
def _cast_like(node: _Node, x: Array, like: Array) -> list[Any]:
    return [x.astype(like.dtype)]


def _numpy_dtype(node: _Node, onnx_type: int) -> np.dtype:
    onnx = _onnx()
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))
    except (KeyError, TypeError, ValueError):
        raise _unsupported(node, "tensor type", onnx_type) from None
    if dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise _unsupported(node, "tensor type", str(dtype))
    return dtype


@_op("Shape", attributes=("start", "end"))
def _shape(node: _Node, x: Array) -> list[Any]:
    start, end = node.attr("start", 0), node.attr("end", None)
    return [np.array(x.shape[start:end] if end is not None else x.shape[start:], dtype=np.int64)]


@_op("Size")
def _size(node: _Node, x: Array) -> list[Any]:
    return [np.array(x.size, dtype=np.int64)]


@_op("Reshape", attributes=("allowzero", "shape"))
def _reshape(node: _Node, x: Array, shape: Array | None = None) -> list[Any]:
    target = _ints(node.attr("shape") if node.opset < 5 else shape)
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return [x.reshape(target)]


@_op("Flatten", attributes=("axis",))
def _flatten(node: _Node, x: Array) -> list[Any]:
    axis = node.attr("axis", 1)
    axis = axis if axis >= 0 else axis + x.ndim
    return [x.reshape(math.prod(x.shape[:axis]), -1)]


@_op("Transpose", attributes=("perm",))
def _transpose(node: _Node, x: Array) -> list[Any]:
    perm = node.attr("perm")
    return [np.transpose(x, perm)]


def _axes_input(node: _Node, axes: Array | None, since: int) -> list[int] | None:
    value = node.attr("axes") if node.opset < since else axes
    return None if value is None else _ints(value)


@_op("Squeeze", attributes=("axes",))
def _squeeze(node: _Node, x: Array, axes: Array | None = None) -> list[Any]:
    chosen = _axes_input(node, axes, 13)
    if chosen is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(_axis(node, a, x.ndim, "axes") for a in chosen))]


@_op("Unsqueeze", attributes=("axes",))
def _unsqueeze(node: _Node, x: Array, axes: Array | None = None) -> list[Any]:
    chosen = _axes_input(node, axes, 13) or []
    rank = x.ndim + len(chosen)
    return [np.expand_dims(x, tuple(sorted(_axis(node, a, rank, "axes") for a in chosen)))]


@_op("Concat", attributes=("axis",))
def _concat(node: _Node, *inputs: Array) -> list[Any]:
    arrays = [a for a in inputs if a is not None]
    return [np.concatenate(arrays, axis=_axis(node, node.attr("axis"), arrays[0].ndim))]


@_op("Split", attributes=("axis", "split", "num_outputs"))
def _split(node: _Node, x: Array, split: Array | None = None) -> list[Any]:
    axis = _axis(node, node.attr("axis", 0), x.ndim)
    sizes = _ints(node.attr("split")) if node.opset < 13 and node.attr("split") is not None else (
        None if split is None else _ints(split))
    count = len(node.outputs)
    if sizes is None:
        part = -(-x.shape[axis] // count)
        sizes = [min(part, x.shape[axis] - k * part) for k in range(count)]
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@_op("Slice", attributes=("starts", "ends", "axes"))
def _slice(node: _Node, x: Array, starts: Array | None = None, ends: Array | None = None,
           axes: Array | None = None, steps: Array | None = None) -> list[Any]:
    if node.opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
    start_list, end_list = _ints(starts), _ints(ends)
    axis_list = list(range(len(start_list))) if axes is None else [_axis(node, a, x.ndim, "axes")
                                                                    for a in _ints(axes)]
    step_list = [1] * len(start_list) if steps is None else _ints(steps)
    index = [slice(None)] * x.ndim
    for axis, start, end, step in zip(axis_list, start_list, end_list, step_list):
        extent = x.shape[axis]
        if step > 0:
            start = int(np.clip(start + extent if start < 0 else start, 0, extent))
            end = int(np.clip(end + extent if end < 0 else end, 0, extent))
        else:
            start = int(np.clip(start + extent if start < 0 else start, -1, extent - 1))
            end = int(np.clip(end + extent if end < 0 else end, -1, extent - 1))
        stop = None if end < 0 else int(end)
        index[axis] = slice(int(start), stop, step)
    return [x[tuple(index)]]


@_op("Gather", attributes=("axis",))
def _gather(node: _Node, x: Array, indices: Array) -> list[Any]:
    axis = _axis(node, node.attr("axis", 0), x.ndim)
    indices = np.where(indices < 0, indices + x.shape[axis], indices)
    return [np.take(x, indices, axis=axis)]


@_op("Expand")
def _expand(node: _Node, x: Array, shape: Array) -> list[Any]:
    return [x * np.ones(_ints(shape), dtype=x.dtype)]


@_op("Tile")
def _tile(node: _Node, x: Array, repeats: Array) -> list[Any]:
    return [np.tile(x, _ints(repeats))]


@_op("ConstantOfShape", attributes=("value",))
def _constant_of_shape(node: _Node, shape: Array) -> list[Any]:
    value = node.attr("value")
    fill = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(_ints(shape), fill[0], dtype=fill.dtype)]


@_op("Range")
def _range(node: _Node, start: Array, limit: Array, delta: Array) -> list[Any]:
    dtype = np.asarray(start).dtype
    return [np.arange(start.item(), limit.item(), delta.item()).astype(dtype)]


_REDUCE: dict[str, Callable[..., Any]] = {
    "ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min,
    "ReduceProd": np.prod}


@_op(*_REDUCE, attributes=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce(node: _Node, x: Array, axes: Array | None = None) -> list[Any]:
    since = 13 if node.op_type == "ReduceSum" else 18
    chosen = _axes_input(node, axes, since)
    if not chosen:
        if node.attr("noop_with_empty_axes", 0):
            return [x]
        chosen = list(range(x.ndim))
    axis = tuple(_axis(node, a, x.ndim, "axes") for a in chosen)
    return [_same(x, _REDUCE[node.op_type](x, axis=axis, keepdims=bool(node.attr("keepdims", 1))))]

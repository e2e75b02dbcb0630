"""The BNNS C-style API: Apple's entry points by their Apple names, on BNNS-shaped structures.

For people who know BNNS: the same functions, the same structures, the same conventions —
sizes fastest dimension first, strides in elements (0 = contiguous), ``data=None`` meaning
zeros for inputs and "not computed" for deltas, 0 / −1 return codes with the reason logged
on the ``bnnsfw`` logger, and ``None`` from a create function that fails. Nothing here
raises for bad input.

Every function delegates to the object API (:class:`bnnsfw.NormalizationLayer`,
:class:`bnnsfw.LSTMLayer`): there is one copy of the math. Each emits the
:class:`DeprecationWarning` that Apple's headers carry (see :mod:`bnnsfw.deprecation`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Iterable, ParamSpec, SupportsInt, TypeVar

import attrs
import numpy as np

from . import _descriptors as nd
from .activation import Activation
from .deprecation import warn_deprecated
from .enums import ActivationFunction, DataLayout, DataType, FilterType, LayerFlags, NDArrayFlags
from .errors import BNNSError, InvalidParameterError, ShapeError, must_be
from .filter import FilterParameters
from .layers.lstm import GATE_FIELDS

__all__ = [
    "BNNSFlagsUseClientPtr",
    "BNNSNDArrayDescriptor",
    "BNNSActivation",
    "BNNSFilterParameters",
    "BNNSLayerParametersNormalization",
    "BNNSLSTMGateDescriptor",
    "BNNSLSTMDataDescriptor",
    "BNNSLayerParametersLSTM",
    "BNNSFilter",
    "BNNSFilterCreateLayerNormalization",
    "BNNSNormalizationFilterApplyBatch",
    "BNNSNormalizationFilterApplyBackwardBatch",
    "BNNSFilterDestroy",
    "BNNSComputeLSTMTrainingCacheCapacity",
    "BNNSDirectApplyLSTMBatchTrainingCaching",
    "BNNSDirectApplyLSTMBatchBackward",
]

_log = logging.getLogger("bnnsfw")

#: The ``BNNSFlags`` bit that keeps the caller's weight pointers instead of copying the weights.
BNNSFlagsUseClientPtr = 0x0001

_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")


def _entry_point(failure: _T) -> Callable[[Callable[_P, _R]], Callable[_P, _R | _T]]:
    """Wrap a BNNS entry point: warn as deprecated, and turn any error into ``failure``.

    The reason is logged on the ``bnnsfw`` logger, as BNNS logs it on the console.
    """

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R | _T]:
        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R | _T:
            warn_deprecated(fn.__name__, stacklevel=2)
            try:
                return fn(*args, **kwargs)
            except BNNSError as exc:
                _log.error("%s failed: %s", fn.__name__, exc)
            except Exception as exc:  # never raise through the C-style surface
                _log.error("%s failed: %s: %s", fn.__name__, type(exc).__name__, exc)
            return failure

        return wrapper

    return decorate


def _deprecated_struct(cls: type[_T]) -> type[_T]:
    """Make constructing ``cls`` emit the registry's warning, pointing at the caller."""
    original: Callable[..., None] = getattr(cls, "__init__")

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        warn_deprecated(cls.__name__, stacklevel=2)
        original(self, *args, **kwargs)

    setattr(cls, "__init__", __init__)
    return cls


def _eight(values: Iterable[SupportsInt]) -> tuple[int, ...]:
    items = tuple(int(v) for v in values)
    if len(items) > nd.MAX_RANK:
        raise InvalidParameterError(must_be("BNNSNDArrayDescriptor.size/stride", "at most 8 entries", items))
    return items + (0,) * (nd.MAX_RANK - len(items))


# attrs converters (named functions, so that type checkers see the fields' types).
def _layout(value: object) -> DataLayout:
    return DataLayout.parse(value)


def _data_type(value: object) -> DataType:
    return DataType.parse(value)


def _activation_function(value: object) -> ActivationFunction:
    return ActivationFunction.parse(value)


# ------------------------------------------------------------------ structures ---------


@attrs.define
class BNNSNDArrayDescriptor:
    """``BNNSNDArrayDescriptor``: an n-dimensional array, sizes and strides fastest first.

    ``data`` is a NumPy array or any writable buffer holding elements of ``data_type``, or
    ``None``. Strides are in elements; all-zero strides mean contiguous.
    """

    flags: int = attrs.field(default=0, converter=int)
    layout: DataLayout = attrs.field(default=DataLayout.vector, converter=_layout)
    size: tuple[int, ...] = attrs.field(default=(0,) * 8, converter=_eight)
    stride: tuple[int, ...] = attrs.field(default=(0,) * 8, converter=_eight)
    data: Any = None
    data_type: DataType = attrs.field(default=DataType.float32, converter=_data_type)

    @classmethod
    def from_array(cls, array: np.ndarray, layout: DataLayout | int | str | None = None, *,
                   flags: int = 0) -> "BNNSNDArrayDescriptor":
        """Describe a C-contiguous NumPy array (sizes are its shape reversed).

        The default layout follows the rank: vector, row-major matrix, 3-D and 4-D last-major.
        """
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise InvalidParameterError(must_be("BNNSNDArrayDescriptor.from_array(array)",
                                                "a C-contiguous NumPy array", type(array).__name__))
        defaults = {1: DataLayout.vector, 2: DataLayout.row_major_matrix, 3: DataLayout.last_major_3d,
                    4: DataLayout.last_major_4d}
        chosen = DataLayout.parse(layout) if layout is not None else defaults.get(array.ndim)
        if chosen is None or chosen.rank != array.ndim:
            raise ShapeError(must_be("BNNSNDArrayDescriptor.from_array(layout)",
                                     f"a layout of rank {array.ndim}", chosen))
        sizes = tuple(reversed(array.shape))
        if chosen is DataLayout.column_major_matrix:
            raise InvalidParameterError(must_be("BNNSNDArrayDescriptor.from_array(layout)",
                                                "row-major for a C-contiguous array (describe "
                                                "np.asfortranarray data by hand)", chosen.name))
        return cls(flags=flags, layout=chosen, size=sizes, data=array,
                   data_type=DataType.from_numpy(array.dtype))

    @classmethod
    def shape_only(cls, shape: tuple[int, ...], layout: DataLayout | int | str) -> "BNNSNDArrayDescriptor":
        """A descriptor with sizes and no data (NumPy-order ``shape``), e.g. for ``i_desc``."""
        return cls(layout=layout, size=tuple(reversed(shape)))


@attrs.define
class BNNSActivation:
    """``BNNSActivation``: function, alpha and beta."""

    function: ActivationFunction = attrs.field(default=ActivationFunction.identity,
                                               converter=_activation_function)
    alpha: float = attrs.field(default=0.0, converter=float)
    beta: float = attrs.field(default=0.0, converter=float)

    def to_activation(self) -> Activation:
        return Activation(self.function, self.alpha, self.beta)


@attrs.define
class BNNSFilterParameters:
    """``BNNSFilterParameters``: flags (``BNNSFlagsUseClientPtr``) and thread count."""

    flags: int = attrs.field(default=0, converter=int)
    n_threads: int = attrs.field(default=0, converter=int)
    alloc_memory: Any = None
    free_memory: Any = None

    def to_filter_parameters(self) -> FilterParameters:
        return FilterParameters(n_threads=self.n_threads,
                                use_client_pointer=bool(self.flags & BNNSFlagsUseClientPtr))


def _filter_parameters(fp: BNNSFilterParameters | None) -> FilterParameters:
    return FilterParameters() if fp is None else fp.to_filter_parameters()


def _activation(where: str, value: BNNSActivation | Activation | None) -> Activation:
    if value is None:
        return Activation.identity()
    if isinstance(value, Activation):
        return value
    if isinstance(value, BNNSActivation):
        return value.to_activation()
    raise InvalidParameterError(must_be(where, "a BNNSActivation", type(value).__name__))


@_deprecated_struct
@attrs.define
class BNNSLayerParametersNormalization:
    """``BNNSLayerParametersNormalization``."""

    i_desc: BNNSNDArrayDescriptor | None = None
    o_desc: BNNSNDArrayDescriptor | None = None
    beta_desc: BNNSNDArrayDescriptor | None = None
    gamma_desc: BNNSNDArrayDescriptor | None = None
    moving_mean_desc: BNNSNDArrayDescriptor | None = None
    moving_variance_desc: BNNSNDArrayDescriptor | None = None
    momentum: float = 0.0
    epsilon: float = 1e-5
    activation: BNNSActivation | None = None
    num_groups: int = 1
    normalization_axis: int = 0


@_deprecated_struct
@attrs.define
class BNNSLSTMGateDescriptor:
    """``BNNSLSTMGateDescriptor``: ``iw_desc`` is a pair (layer 0, layers 1…L−1)."""

    iw_desc: tuple[BNNSNDArrayDescriptor | None, BNNSNDArrayDescriptor | None] = (None, None)
    hw_desc: BNNSNDArrayDescriptor | None = None
    cw_desc: BNNSNDArrayDescriptor | None = None
    b_desc: BNNSNDArrayDescriptor | None = None
    activation: BNNSActivation | None = None


@_deprecated_struct
@attrs.define
class BNNSLSTMDataDescriptor:
    """``BNNSLSTMDataDescriptor``: sequence data, hidden state and cell state."""

    data_desc: BNNSNDArrayDescriptor | None = None
    hidden_desc: BNNSNDArrayDescriptor | None = None
    cell_state_desc: BNNSNDArrayDescriptor | None = None


@_deprecated_struct
@attrs.define
class BNNSLayerParametersLSTM:
    """``BNNSLayerParametersLSTM``."""

    input_size: int = 0
    hidden_size: int = 0
    batch_size: int = 0
    num_layers: int = 1
    seq_len: int = 0
    dropout: float = 0.0
    lstm_flags: int = 0
    sequence_descriptor: BNNSNDArrayDescriptor | None = None
    input_descriptor: BNNSLSTMDataDescriptor | None = None
    output_descriptor: BNNSLSTMDataDescriptor | None = None
    input_gate: BNNSLSTMGateDescriptor | None = None
    forget_gate: BNNSLSTMGateDescriptor | None = None
    candidate_gate: BNNSLSTMGateDescriptor | None = None
    output_gate: BNNSLSTMGateDescriptor | None = None
    hidden_activation: BNNSActivation | None = None


# ------------------------------------------------------------------ normalization ------

_NORMALIZATION_TYPES = {
    FilterType.batch_norm: "batch",
    FilterType.instance_norm: "instance",
    FilterType.layer_norm: "layer",
    FilterType.group_norm: "group",
}


class BNNSFilter:
    """What a BNNS create function returns: the layer and the state BNNS keeps with it."""

    def __init__(self, layer: Any, i_desc: BNNSNDArrayDescriptor, o_desc: BNNSNDArrayDescriptor,
                 moving_descs: tuple[BNNSNDArrayDescriptor | None,
                                     BNNSNDArrayDescriptor | None] = (None, None),
                 ) -> None:
        self.layer = layer
        self.i_desc = i_desc
        self.o_desc = o_desc
        #: Where a training forward writes the updated moving mean and variance back.
        self.moving_descs = moving_descs
        #: The input and phase of the last forward, which the backward differentiates.
        self.last_input: np.ndarray | None = None
        self.last_phase: str | None = None

    def __repr__(self) -> str:
        return f"<BNNSFilter {self.layer!r}>"


def _descriptor(where: str, desc: BNNSNDArrayDescriptor | None) -> BNNSNDArrayDescriptor:
    if not isinstance(desc, BNNSNDArrayDescriptor):
        raise InvalidParameterError(must_be(where, "a BNNSNDArrayDescriptor", type(desc).__name__))
    return desc


def _descriptor_shape(where: str, desc: BNNSNDArrayDescriptor) -> tuple[int, ...]:
    layout = nd.layout_of(where, desc.layout)
    sizes = desc.size[: layout.rank]
    if any(s <= 0 for s in sizes):
        raise ShapeError(must_be(f"{where}.size", f"{layout.rank} positive sizes for layout {layout.name}",
                                 tuple(sizes)))
    shape = tuple(reversed(sizes))
    return shape[::-1] if layout is DataLayout.column_major_matrix else shape


@_entry_point(failure=None)
def BNNSFilterCreateLayerNormalization(
    filter_type: FilterType | int,
    layer_params: BNNSLayerParametersNormalization,
    filter_params: BNNSFilterParameters | None = None,
) -> BNNSFilter | None:
    """Create a batch, instance, layer or group normalization filter (``None`` on failure)."""
    from .layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

    kind = FilterType.parse(filter_type, "filter_type")
    if kind not in _NORMALIZATION_TYPES:
        raise InvalidParameterError(must_be("filter_type",
                                            "batch_norm, instance_norm, layer_norm or group_norm",
                                            kind.name))
    p = layer_params
    if not isinstance(p, BNNSLayerParametersNormalization):
        raise InvalidParameterError(must_be("layer_params", "a BNNSLayerParametersNormalization",
                                            type(p).__name__))
    i_desc = _descriptor("layer_params.i_desc", p.i_desc)
    shape = _descriptor_shape("layer_params.i_desc", i_desc)
    o_desc = _descriptor("layer_params.o_desc", p.o_desc)
    out_shape = _descriptor_shape("layer_params.o_desc", o_desc)
    if out_shape != shape:
        raise ShapeError(must_be("layer_params.o_desc.size", f"the input's sizes {tuple(reversed(shape))}",
                                 tuple(reversed(out_shape))))
    channels = shape[0]
    name = _NORMALIZATION_TYPES[kind]
    if name == "layer":
        axis = p.normalization_axis
        weights_shape: tuple[int, ...] = shape[axis:] if 0 <= axis < len(shape) else shape
    else:
        weights_shape = (channels,)
    gamma = nd.read("layer_params.gamma_desc", p.gamma_desc, weights_shape, required=False)
    beta = nd.read("layer_params.beta_desc", p.beta_desc, weights_shape, required=False)
    moving_mean = nd.read("layer_params.moving_mean_desc", p.moving_mean_desc, (channels,), required=False)
    moving_var = nd.read("layer_params.moving_variance_desc", p.moving_variance_desc, (channels,),
                         required=False)
    if name == "batch":
        ntype = NormalizationType.batch(moving_mean=moving_mean, moving_variance=moving_var)
    elif name == "instance":
        ntype = NormalizationType.instance(moving_mean=moving_mean, moving_variance=moving_var)
    elif name == "layer":
        ntype = NormalizationType.layer(normalization_axis=p.normalization_axis)
    else:
        ntype = NormalizationType.group(group_count=p.num_groups)
    params = NormalizationParameters(
        type=ntype, input_shape=shape, gamma=gamma, beta=beta, momentum=p.momentum, epsilon=p.epsilon,
        activation=_activation("layer_params.activation", p.activation), dtype=np.float32,
    )
    layer = NormalizationLayer(params, _filter_parameters(filter_params))
    return BNNSFilter(layer, i_desc, o_desc, (p.moving_mean_desc, p.moving_variance_desc))


def _check_filter(value: object) -> BNNSFilter:
    if not isinstance(value, BNNSFilter):
        raise InvalidParameterError(must_be("filter", "a filter from a BNNSFilterCreate… function",
                                            type(value).__name__))
    return value


def _batch_desc(template: BNNSNDArrayDescriptor, data: object) -> BNNSNDArrayDescriptor:
    return attrs.evolve(template, data=data)


@_entry_point(failure=-1)
def BNNSNormalizationFilterApplyBatch(
    filter: BNNSFilter, batch_size: int, in_: object, in_stride: int, out: object, out_stride: int,
    training: bool,
) -> int:
    """Forward ``batch_size`` samples (``in_stride``/``out_stride`` elements apart; 0 = dense)."""
    f = _check_filter(filter)
    shape = f.layer.input_shape
    n = int(batch_size)
    if n < 1:
        raise InvalidParameterError(must_be("batch_size", "at least 1", batch_size))
    x = nd.read("in", _batch_desc(f.i_desc, in_), shape, batch=(n, int(in_stride)))
    phase = "training" if training else "inference"
    y = f.layer.apply(x, phase=phase)
    if not nd.write("out", _batch_desc(f.o_desc, out), y, batch=(n, int(out_stride))):
        raise InvalidParameterError(must_be("out", "a buffer", None))
    f.last_input, f.last_phase = x, phase
    mean_desc, var_desc = f.moving_descs
    if training and f.layer.moving_mean is not None:  # BNNS updates the caller's moving statistics
        nd.write("layer_params.moving_mean_desc", mean_desc, f.layer.moving_mean)
        nd.write("layer_params.moving_variance_desc", var_desc, f.layer.moving_variance)
    return 0


@_entry_point(failure=-1)
def BNNSNormalizationFilterApplyBackwardBatch(
    filter: BNNSFilter, batch_size: int, in_delta: object, in_delta_stride: int, out: object, out_stride: int,
    out_delta: object, out_delta_stride: int, beta_delta: BNNSNDArrayDescriptor | None,
    gamma_delta: BNNSNDArrayDescriptor | None,
) -> int:
    """Backward of the filter's last forward: writes dL/dx into ``in_delta`` and the beta and
    gamma deltas into their descriptors (``None`` or ``data=None``: not computed)."""
    f = _check_filter(filter)
    n = int(batch_size)
    if f.last_input is None:
        raise InvalidParameterError(must_be("filter", "applied forward before its backward",
                                            "no forward yet"))
    if f.last_input.shape[0] != n:
        raise ShapeError(must_be("batch_size", f"the last forward's batch size {f.last_input.shape[0]}", n))
    shape = f.layer.input_shape
    dy = nd.read("out_delta", _batch_desc(f.o_desc, out_delta), shape, batch=(n, int(out_delta_stride)))
    y = None if out is None else nd.read("out", _batch_desc(f.o_desc, out), shape, batch=(n, int(out_stride)))
    grads = f.layer.apply_backward(f.last_input, dy, output=y, phase=f.last_phase)
    nd.write("in_delta", _batch_desc(f.i_desc, in_delta) if in_delta is not None else None, grads.input,
             batch=(n, int(in_delta_stride)))
    for name, desc, value in (("beta_delta", beta_delta, grads.beta),
                              ("gamma_delta", gamma_delta, grads.gamma)):
        if desc is not None and value is not None:
            nd.write(name, desc, value, accumulate=bool(desc.flags & NDArrayFlags.backprop_accumulate))
    return 0


@_entry_point(failure=None)
def BNNSFilterDestroy(filter: BNNSFilter) -> None:
    """Release a filter made by a create function (a no-op on one already destroyed)."""
    _check_filter(filter).layer.close()
    return None


# ------------------------------------------------------------------ LSTM ---------------


@attrs.frozen
class _LSTMCall:
    layer: Any
    batch_first: bool
    sequence_lengths: np.ndarray | None
    input_data: BNNSNDArrayDescriptor  # layer_params.input_descriptor.data_desc, checked to be there


def _lstm_sizes(p: BNNSLayerParametersLSTM) -> tuple[int, int, int, int, int, int]:
    if not isinstance(p, BNNSLayerParametersLSTM):
        raise InvalidParameterError(must_be("layer_params", "a BNNSLayerParametersLSTM", type(p).__name__))
    values: list[int] = []
    for field in ("input_size", "hidden_size", "batch_size", "num_layers", "seq_len"):
        v = getattr(p, field)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidParameterError(must_be(f"BNNSLayerParametersLSTM.{field}", "an integer >= 1", v))
        values.append(int(v))
    d = 2 if int(p.lstm_flags) & LayerFlags.lstm_bidirectional else 1
    i, h, n, layers, t = values
    return i, h, n, layers, t, d


def _gate(where: str, g: BNNSLSTMGateDescriptor | None, i: int, h: int, layers: int, d: int,
          default_activations: bool) -> Any:
    from .layers.lstm import LSTMGateDescriptor

    if not isinstance(g, BNNSLSTMGateDescriptor):
        raise InvalidParameterError(must_be(where, "a BNNSLSTMGateDescriptor", type(g).__name__))
    if len(g.iw_desc) != 2:
        raise InvalidParameterError(must_be(f"{where}.iw_desc", "a pair of descriptors", g.iw_desc))
    first, rest = g.iw_desc
    iw1 = None
    if layers > 1:
        iw1 = nd.read(f"{where}.iw_desc[1]", rest, (layers - 1, d, h, d * h), required=False)
        if iw1 is None and i == d * h:  # every layer's input weights in iw_desc[0]
            both = nd.read(f"{where}.iw_desc[0]", first, (layers, d, h, i))
            iw0, iw1 = both[0], both[1:]
        elif iw1 is None:
            raise InvalidParameterError(must_be(f"{where}.iw_desc[1].data", "set when num_layers > 1", None))
        else:
            iw0 = nd.read(f"{where}.iw_desc[0]", first, (d, h, i))
    else:
        iw0 = nd.read(f"{where}.iw_desc[0]", first, (d, h, i))
    hw = nd.read(f"{where}.hw_desc", g.hw_desc, (layers, d, h, h))
    cw = None
    if g.cw_desc is not None and g.cw_desc.data is not None:
        # Full (L, D, H, H) peephole matrices, or ONNX-style diagonal ones (L, D, H): told
        # apart by the element count; sizes left 0 mean the full matrices BNNS describes.
        count = int(np.prod(g.cw_desc.size[: nd.layout_of(f"{where}.cw_desc", g.cw_desc.layout).rank]))
        diagonal = count == layers * d * h
        cw = nd.read(f"{where}.cw_desc", g.cw_desc, (layers, d, h) if diagonal else (layers, d, h, h))
    bias = nd.read(f"{where}.b_desc", g.b_desc, (layers, d, h), required=False)
    activation = None if default_activations or g.activation is None else _activation(
        f"{where}.activation", g.activation)
    return LSTMGateDescriptor(input_weights=(iw0, iw1), hidden_weights=hw, cell_weights=cw, bias=bias,
                              activation=activation)


def _sequence_lengths(p: BNNSLayerParametersLSTM, n: int, t: int) -> np.ndarray | None:
    desc = p.sequence_descriptor
    if desc is None or desc.data is None:
        return None
    sizes = nd.read("layer_params.sequence_descriptor", desc, (t,),
                    data_types=(DataType.int32, DataType.float32)).astype(np.int64)
    if sizes[0] != n or np.any(sizes < 1) or np.any(np.diff(sizes) > 0):
        raise InvalidParameterError(must_be("layer_params.sequence_descriptor.data",
                                            f"non-increasing batch sizes per step in [1, {n}], "
                                            f"starting at {n}", sizes.tolist()))
    return (sizes[None, :] > np.arange(n)[:, None]).sum(axis=1)


def _lstm(p: BNNSLayerParametersLSTM, filter_params: BNNSFilterParameters | None) -> _LSTMCall:
    from .layers.lstm import LSTMLayer, LSTMParameters

    i, h, n, layers, t, d = _lstm_sizes(p)
    default_activations = bool(int(p.lstm_flags) & LayerFlags.lstm_default_activations)
    gates = {name: _gate(f"layer_params.{name}", getattr(p, name), i, h, layers, d, default_activations)
             for name in GATE_FIELDS}
    hidden_activation = (Activation.tanh() if default_activations or p.hidden_activation is None
                         else _activation("layer_params.hidden_activation", p.hidden_activation))
    if p.input_descriptor is None or p.input_descriptor.data_desc is None:
        raise InvalidParameterError(must_be("layer_params.input_descriptor.data_desc", "a descriptor", None))
    input_data = p.input_descriptor.data_desc
    layout = nd.layout_of("layer_params.input_descriptor.data_desc", input_data.layout)
    if layout not in (DataLayout.sne, DataLayout.nse):
        raise InvalidParameterError(must_be("layer_params.input_descriptor.data_desc.layout", "SNE or NSE",
                                            layout.name))
    params = LSTMParameters(
        input_size=i, hidden_size=h, num_layers=layers, bidirectional=d == 2,
        batch_first=layout is DataLayout.nse, dropout=float(p.dropout), **gates,
        hidden_activation=hidden_activation, default_activations=default_activations, dtype=np.float32,
    )
    layer = LSTMLayer(params, _filter_parameters(filter_params))
    return _LSTMCall(layer, layout is DataLayout.nse, _sequence_lengths(p, n, t), input_data)


def _sequence_shape(batch_first: bool, t: int, n: int, width: int) -> tuple[int, int, int]:
    return (n, t, width) if batch_first else (t, n, width)


def _write_sequence(where: str, desc: BNNSNDArrayDescriptor | None, value: np.ndarray, batch_first: bool,
                    accumulate: bool = False) -> None:
    """Write (T, N, W) or (N, T, W) data into an SNE or NSE descriptor, converting if needed."""
    if desc is None or desc.data is None:
        return
    layout = nd.layout_of(where, desc.layout)
    if layout not in (DataLayout.sne, DataLayout.nse):
        raise InvalidParameterError(must_be(f"{where}.layout", "SNE or NSE", layout.name))
    if (layout is DataLayout.nse) != batch_first:
        value = np.ascontiguousarray(value.swapaxes(0, 1))
    nd.write(where, desc, value, accumulate=accumulate)


def _read_sequence(where: str, desc: BNNSNDArrayDescriptor | None, batch_first: bool, t: int, n: int,
                   width: int, required: bool) -> np.ndarray | None:
    if desc is None or desc.data is None:
        if required:
            raise InvalidParameterError(must_be(f"{where}.data", "set", None))
        return None
    layout = nd.layout_of(where, desc.layout)
    if layout not in (DataLayout.sne, DataLayout.nse):
        raise InvalidParameterError(must_be(f"{where}.layout", "SNE or NSE", layout.name))
    own = layout is DataLayout.nse
    value = nd.read(where, desc, _sequence_shape(own, t, n, width))
    if own != batch_first:
        value = np.ascontiguousarray(value.swapaxes(0, 1))
    return value


def _state(where: str, data: BNNSLSTMDataDescriptor | None, field: str,
           shape: tuple[int, ...]) -> np.ndarray | None:
    if data is None:
        return None
    return nd.read(f"{where}.{field}", getattr(data, field), shape, required=False)


def _cache_view(training_cache: object, capacity: int) -> object:
    if training_cache is None:
        return None
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 0:
        raise InvalidParameterError(must_be("training_cache_capacity", "a byte count >= 0", capacity))
    buffer = memoryview(training_cache).cast("B")  # type: ignore[arg-type]  # checked by memoryview()
    if buffer.nbytes < capacity:
        raise InvalidParameterError(must_be("training_cache_capacity",
                                            f"at most the buffer's {buffer.nbytes} bytes",
                                            capacity))
    return buffer[: int(capacity)]


@_entry_point(failure=-1)
def BNNSComputeLSTMTrainingCacheCapacity(layer_params: BNNSLayerParametersLSTM) -> int:
    """Bytes of training cache that a forward with these parameters writes (−1 on failure)."""
    call = _lstm(layer_params, None)
    try:
        return int(call.layer.training_cache_capacity(batch_size=layer_params.batch_size,
                                                      seq_len=layer_params.seq_len))
    finally:
        call.layer.close()


@_entry_point(failure=-1)
def BNNSDirectApplyLSTMBatchTrainingCaching(
    layer_params: BNNSLayerParametersLSTM, filter_params: BNNSFilterParameters | None,
    training_cache: object, training_cache_capacity: int,
) -> int:
    """Forward: reads the input descriptor, writes the output descriptor; with a training
    cache, in training mode, leaving in the cache what the backward needs."""
    p = layer_params
    call = _lstm(p, filter_params)
    i, h, n, layers, t, d = _lstm_sizes(p)
    try:
        x = _read_sequence("layer_params.input_descriptor.data_desc", call.input_data,
                           call.batch_first, t, n, i, required=True)
        states = (layers * d, n, h)
        h0 = _state("layer_params.input_descriptor", p.input_descriptor, "hidden_desc", states)
        c0 = _state("layer_params.input_descriptor", p.input_descriptor, "cell_state_desc", states)
        cache = _cache_view(training_cache, training_cache_capacity)
        result = call.layer.apply(x, hidden=h0, cell=c0, sequence_lengths=call.sequence_lengths,
                                  training=cache is not None, training_cache=cache)
        out = p.output_descriptor
        if out is not None:
            _write_sequence("layer_params.output_descriptor.data_desc", out.data_desc, result.output,
                            call.batch_first)
            nd.write("layer_params.output_descriptor.hidden_desc", out.hidden_desc, result.hidden)
            nd.write("layer_params.output_descriptor.cell_state_desc", out.cell_state_desc, result.cell)
        return 0
    finally:
        call.layer.close()


def _accumulate(desc: BNNSNDArrayDescriptor | None) -> bool:
    return desc is not None and bool(int(desc.flags) & NDArrayFlags.backprop_accumulate)


def _write_delta(where: str, desc: BNNSNDArrayDescriptor | None, value: np.ndarray | None) -> None:
    if value is not None:
        nd.write(where, desc, value, accumulate=_accumulate(desc))


@_entry_point(failure=-1)
def BNNSDirectApplyLSTMBatchBackward(
    layer_params: BNNSLayerParametersLSTM, layer_delta_params: BNNSLayerParametersLSTM,
    filter_params: BNNSFilterParameters | None, training_cache: object, training_cache_capacity: int,
) -> int:
    """Backward: reads dL/dy, dL/dh_T, dL/dc_T from the delta's output descriptor and writes
    dL/dx, dL/dh_0, dL/dc_0 and every gate's deltas into the delta's input and gate descriptors.

    Without a training cache the forward is recomputed, as BNNS does.
    """
    p, dp = layer_params, layer_delta_params
    if not isinstance(dp, BNNSLayerParametersLSTM):
        raise InvalidParameterError(must_be("layer_delta_params", "a BNNSLayerParametersLSTM",
                                            type(dp).__name__))
    call = _lstm(p, filter_params)
    i, h, n, layers, t, d = _lstm_sizes(p)
    try:
        x = _read_sequence("layer_params.input_descriptor.data_desc", call.input_data,
                           call.batch_first, t, n, i, required=True)
        states = (layers * d, n, h)
        h0 = _state("layer_params.input_descriptor", p.input_descriptor, "hidden_desc", states)
        c0 = _state("layer_params.input_descriptor", p.input_descriptor, "cell_state_desc", states)
        dout = dp.output_descriptor
        dy = dht = dct = None
        if dout is not None:
            dy = _read_sequence("layer_delta_params.output_descriptor.data_desc", dout.data_desc,
                                call.batch_first, t, n, d * h, required=False)
            dht = _state("layer_delta_params.output_descriptor", dout, "hidden_desc", states)
            dct = _state("layer_delta_params.output_descriptor", dout, "cell_state_desc", states)
        cache = _cache_view(training_cache, training_cache_capacity)
        grads = call.layer.apply_backward(x, dy, hidden=h0, cell=c0, hidden_gradient=dht, cell_gradient=dct,
                                          sequence_lengths=call.sequence_lengths, training_cache=cache)
        din = dp.input_descriptor
        if din is not None:
            if din.data_desc is not None and din.data_desc.data is not None:
                _write_sequence("layer_delta_params.input_descriptor.data_desc", din.data_desc, grads.input,
                                call.batch_first, accumulate=_accumulate(din.data_desc))
            _write_delta("layer_delta_params.input_descriptor.hidden_desc", din.hidden_desc, grads.hidden)
            _write_delta("layer_delta_params.input_descriptor.cell_state_desc", din.cell_state_desc,
                         grads.cell)
        for name in GATE_FIELDS:
            gd, g = getattr(dp, name), getattr(grads, name)
            if gd is None:
                continue
            where = f"layer_delta_params.{name}"
            iw0, iw1 = g.input_weights
            first, rest = gd.iw_desc
            if layers > 1 and (rest is None or rest.data is None) and i == d * h and first is not None \
                    and first.data is not None:
                _write_delta(f"{where}.iw_desc[0]", first, np.concatenate([iw0[None], iw1]))
            else:
                _write_delta(f"{where}.iw_desc[0]", first, iw0)
                if iw1 is not None:
                    _write_delta(f"{where}.iw_desc[1]", rest, iw1)
            _write_delta(f"{where}.hw_desc", gd.hw_desc, g.hidden_weights)
            _write_delta(f"{where}.cw_desc", gd.cw_desc, g.cell_weights)
            _write_delta(f"{where}.b_desc", gd.b_desc, g.bias)
        return 0
    finally:
        call.layer.close()

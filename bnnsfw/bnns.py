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

import contextlib
import functools
import logging
import math
from typing import Any, Callable, Iterator, ParamSpec, TypeVar

import attrs
import numpy as np

from . import _descriptors as nd
from ._validation import overlap, same_elements
from .activation import Activation
from .deprecation import warn_deprecated
from .enums import ActivationFunction, DataLayout, DataType, FilterType, LayerFlags, NDArrayFlags, apple_name
from .enums import (  # Apple's constant names
    BNNSDataTypeFloat16,
    BNNSDataTypeFloat32,
    BNNSDataTypeBFloat16,
    BNNSDataTypeInt8,
    BNNSDataTypeInt32,
    BNNSDataTypeUInt8,
    BNNSDataLayoutVector,
    BNNSDataLayout1DLastMajor,
    BNNSDataLayout1DFirstMajor,
    BNNSDataLayoutRowMajorMatrix,
    BNNSDataLayoutColumnMajorMatrix,
    BNNSDataLayout2DLastMajor,
    BNNSDataLayout2DFirstMajor,
    BNNSDataLayoutImageCHW,
    BNNSDataLayoutSNE,
    BNNSDataLayoutNSE,
    BNNSDataLayout3DLastMajor,
    BNNSDataLayout3DFirstMajor,
    BNNSDataLayout4DLastMajor,
    BNNSDataLayout4DFirstMajor,
    BNNSActivationFunctionIdentity,
    BNNSActivationFunctionRectifiedLinear,
    BNNSActivationFunctionLeakyRectifiedLinear,
    BNNSActivationFunctionSigmoid,
    BNNSActivationFunctionTanh,
    BNNSActivationFunctionScaledTanh,
    BNNSActivationFunctionAbs,
    BNNSActivationFunctionLinear,
    BNNSActivationFunctionClamp,
    BNNSActivationFunctionIntegerLinearSaturate,
    BNNSActivationFunctionIntegerLinearSaturatePerChannel,
    BNNSActivationFunctionSoftmax,
    BNNSActivationFunctionGELUApproximation,
    BNNSActivationFunctionGumbel,
    BNNSActivationFunctionGumbelMax,
    BNNSActivationFunctionHardSigmoid,
    BNNSActivationFunctionSoftplus,
    BNNSActivationFunctionSoftsign,
    BNNSActivationFunctionELU,
    BNNSActivationFunctionClampedLeakyRectifiedLinear,
    BNNSActivationFunctionLinearWithBias,
    BNNSActivationFunctionLogSoftmax,
    BNNSActivationFunctionLogSigmoid,
    BNNSActivationFunctionSELU,
    BNNSActivationFunctionCELU,
    BNNSActivationFunctionHardShrink,
    BNNSActivationFunctionSoftShrink,
    BNNSActivationFunctionTanhShrink,
    BNNSActivationFunctionThreshold,
    BNNSActivationFunctionPReLUPerChannel,
    BNNSActivationFunctionHardSwish,
    BNNSActivationFunctionGELUApproximation2,
    BNNSActivationFunctionSiLU,
    BNNSActivationFunctionReLU6,
    BNNSActivationFunctionErf,
    BNNSActivationFunctionGELU,
    BNNSActivationFunctionGELUApproximationSigmoid,
    BNNSConvolution,
    BNNSFullyConnected,
    BNNSBatchNorm,
    BNNSInstanceNorm,
    BNNSLayerNorm,
    BNNSGroupNorm,
    BNNSTransposedConvolution,
    BNNSQuantization,
    BNNSArithmetic,
    BNNSLayerFlagsLSTMBidirectional,
    BNNSLayerFlagsLSTMDefaultActivations,
    BNNSNDArrayFlagBackpropSet,
    BNNSNDArrayFlagBackpropAccumulate,
)
from .errors import BNNSError, FilterClosedError, InvalidParameterError, ShapeError, must_be
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
    # Apple's constant names (bnns_constants.h): aliases of the enums' members
    "BNNSDataTypeFloat16",
    "BNNSDataTypeFloat32",
    "BNNSDataTypeBFloat16",
    "BNNSDataTypeInt8",
    "BNNSDataTypeInt32",
    "BNNSDataTypeUInt8",
    "BNNSDataLayoutVector",
    "BNNSDataLayout1DLastMajor",
    "BNNSDataLayout1DFirstMajor",
    "BNNSDataLayoutRowMajorMatrix",
    "BNNSDataLayoutColumnMajorMatrix",
    "BNNSDataLayout2DLastMajor",
    "BNNSDataLayout2DFirstMajor",
    "BNNSDataLayoutImageCHW",
    "BNNSDataLayoutSNE",
    "BNNSDataLayoutNSE",
    "BNNSDataLayout3DLastMajor",
    "BNNSDataLayout3DFirstMajor",
    "BNNSDataLayout4DLastMajor",
    "BNNSDataLayout4DFirstMajor",
    "BNNSActivationFunctionIdentity",
    "BNNSActivationFunctionRectifiedLinear",
    "BNNSActivationFunctionLeakyRectifiedLinear",
    "BNNSActivationFunctionSigmoid",
    "BNNSActivationFunctionTanh",
    "BNNSActivationFunctionScaledTanh",
    "BNNSActivationFunctionAbs",
    "BNNSActivationFunctionLinear",
    "BNNSActivationFunctionClamp",
    "BNNSActivationFunctionIntegerLinearSaturate",
    "BNNSActivationFunctionIntegerLinearSaturatePerChannel",
    "BNNSActivationFunctionSoftmax",
    "BNNSActivationFunctionGELUApproximation",
    "BNNSActivationFunctionGumbel",
    "BNNSActivationFunctionGumbelMax",
    "BNNSActivationFunctionHardSigmoid",
    "BNNSActivationFunctionSoftplus",
    "BNNSActivationFunctionSoftsign",
    "BNNSActivationFunctionELU",
    "BNNSActivationFunctionClampedLeakyRectifiedLinear",
    "BNNSActivationFunctionLinearWithBias",
    "BNNSActivationFunctionLogSoftmax",
    "BNNSActivationFunctionLogSigmoid",
    "BNNSActivationFunctionSELU",
    "BNNSActivationFunctionCELU",
    "BNNSActivationFunctionHardShrink",
    "BNNSActivationFunctionSoftShrink",
    "BNNSActivationFunctionTanhShrink",
    "BNNSActivationFunctionThreshold",
    "BNNSActivationFunctionPReLUPerChannel",
    "BNNSActivationFunctionHardSwish",
    "BNNSActivationFunctionGELUApproximation2",
    "BNNSActivationFunctionSiLU",
    "BNNSActivationFunctionReLU6",
    "BNNSActivationFunctionErf",
    "BNNSActivationFunctionGELU",
    "BNNSActivationFunctionGELUApproximationSigmoid",
    "BNNSConvolution",
    "BNNSFullyConnected",
    "BNNSBatchNorm",
    "BNNSInstanceNorm",
    "BNNSLayerNorm",
    "BNNSGroupNorm",
    "BNNSTransposedConvolution",
    "BNNSQuantization",
    "BNNSArithmetic",
    "BNNSLayerFlagsLSTMBidirectional",
    "BNNSLayerFlagsLSTMDefaultActivations",
    "BNNSNDArrayFlagBackpropSet",
    "BNNSNDArrayFlagBackpropAccumulate",
]

_log = logging.getLogger("bnnsfw")

#: The ``BNNSFlags`` bit that keeps the caller's weight pointers instead of copying the weights.
BNNSFlagsUseClientPtr = 0x0001

_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")


def _entry_point(failure: _T) -> Callable[[Callable[_P, _R]], Callable[_P, _R | _T]]:
    """Wrap a BNNS entry point: warn as deprecated, and turn any error into ``failure``.

    The reason is logged on the ``bnnsfw`` logger, as BNNS logs it on the console; the log
    record carries the exception as ``record.bnnsfw_error`` for programs that inspect it.
    """

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R | _T]:
        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R | _T:
            warn_deprecated(fn.__name__, stacklevel=2)
            try:
                return fn(*args, **kwargs)
            except BNNSError as exc:
                _log.error("%s failed: %s", fn.__name__, exc, extra={"bnnsfw_error": exc})
            except Exception as exc:  # never raise through the C-style surface
                _log.error("%s failed: %s: %s", fn.__name__, type(exc).__name__, exc,
                           extra={"bnnsfw_error": exc})
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


_integer, _finite, _real = nd.integer, nd.finite, nd.real


# attrs converters. A structure holds what the caller wrote, as a C structure does: the fields
# are checked where a call reads them, under the name of the argument that holds them (a
# zero-filled descriptor can exist, and is absent wherever BNNS does not read it). The
# converters only normalise the values they understand: an enum's name or number to its member,
# a short size list to its eight entries.
def _layout(value: object) -> object:
    return _lenient_member(DataLayout, value)


def _data_type(value: object) -> object:
    return _lenient_member(DataType, value)


def _function(value: object) -> object:
    return _lenient_member(ActivationFunction, value)


def _lenient_member(kind: Any, value: object) -> object:
    member = nd._member(kind, value)
    return value if member is None else member


def _eight_entries(value: object) -> object:
    if isinstance(value, (tuple, list)) and len(value) <= nd.MAX_RANK:
        return tuple(value) + (0,) * (nd.MAX_RANK - len(value))
    return value


# ------------------------------------------------------------------ structures ---------


@attrs.define
class BNNSNDArrayDescriptor:
    """``BNNSNDArrayDescriptor``: an n-dimensional array, sizes and strides fastest first.

    ``data`` is a NumPy array or any writable buffer holding elements of ``data_type``, or
    ``None``. Strides are in elements; all-zero strides mean contiguous. The fields hold what
    the caller wrote (``BNNSNDArrayDescriptor(layout=0, data_type=0)`` is a zero-filled
    descriptor): a call checks the fields it reads, naming the argument, and takes a
    descriptor without data as absent wherever BNNS does.
    """

    flags: int = 0
    layout: DataLayout | int = attrs.field(default=DataLayout.vector, converter=_layout)
    size: tuple[int, ...] = attrs.field(default=(0,) * 8, converter=_eight_entries)
    stride: tuple[int, ...] = attrs.field(default=(0,) * 8, converter=_eight_entries)
    data: Any = None
    data_type: DataType | int = attrs.field(default=DataType.float32, converter=_data_type)

    @classmethod
    def from_array(cls, array: np.ndarray, layout: DataLayout | int | str | None = None, *,
                   flags: int = 0, data_type: DataType | int | str | None = None) -> "BNNSNDArrayDescriptor":
        """Describe a C-contiguous NumPy array (sizes are its shape reversed).

        The default layout follows the rank: vector, row-major matrix, 3-D and 4-D last-major.
        The data type is the array's (``ml_dtypes.bfloat16`` is ``BNNSDataTypeBFloat16``);
        ``data_type`` names it for an array of raw bits (``uint16`` holding BFloat16).
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
        kind = DataType.from_numpy(array.dtype) if data_type is None else DataType.parse(
            data_type, "BNNSNDArrayDescriptor.from_array(data_type)")
        return cls(flags=flags, layout=chosen, size=sizes, data=array, data_type=kind)

    @classmethod
    def shape_only(cls, shape: tuple[int, ...], layout: DataLayout | int | str) -> "BNNSNDArrayDescriptor":
        """A descriptor with sizes and no data (NumPy-order ``shape``), e.g. for ``i_desc``."""
        return cls(layout=layout, size=tuple(reversed(shape)))


@attrs.define
class BNNSActivation:
    """``BNNSActivation``: function, alpha and beta (all zero: the identity)."""

    function: ActivationFunction | int = attrs.field(default=ActivationFunction.identity, converter=_function)
    alpha: float = 0.0
    beta: float = 0.0

    def to_activation(self, where: str = "activation") -> Activation:
        """The :class:`~bnnsfw.Activation` this structure describes (its fields checked, named
        after ``where``)."""
        function = nd._member(ActivationFunction, self.function)
        if function is None:
            raise InvalidParameterError(must_be(f"{where}.function", "a BNNSActivationFunction value",
                                                self.function))
        if not function.is_elementwise:
            raise InvalidParameterError(must_be(
                f"{where}.function", "a per-element activation (not softmax, log-softmax, PReLU, integer "
                "or random ones)", nd.Named(apple_name(ActivationFunction, function))))
        alpha = _finite(f"{where}.alpha", self.alpha)
        beta = _finite(f"{where}.beta", self.beta)
        if function is ActivationFunction.celu and alpha == 0.0:
            raise InvalidParameterError(must_be(f"{where}.alpha", "non-zero for BNNSActivationFunctionCELU",
                                                alpha))
        return Activation(function, alpha, beta)


@attrs.define
class BNNSFilterParameters:
    """``BNNSFilterParameters``: flags (``BNNSFlagsUseClientPtr``) and thread count (all zero:
    the defaults). ``alloc_memory`` and ``free_memory`` are not called: bnnsfw's memory is
    NumPy's."""

    flags: int = 0
    n_threads: int = 0
    alloc_memory: Any = None
    free_memory: Any = None

    def to_filter_parameters(self, where: str = "filter_params") -> FilterParameters:
        flags = _integer(f"{where}.flags", self.flags, maximum=nd.UINT32_MAX)
        n_threads = _integer(f"{where}.n_threads", self.n_threads)
        return FilterParameters(n_threads=n_threads, use_client_pointer=bool(flags & BNNSFlagsUseClientPtr))


def _filter_parameters(fp: BNNSFilterParameters | None) -> FilterParameters:
    if fp is None:
        return FilterParameters()
    if not isinstance(fp, BNNSFilterParameters):
        raise InvalidParameterError(must_be("filter_params", "a BNNSFilterParameters or None",
                                            type(fp).__name__))
    return fp.to_filter_parameters()


def _activation(where: str, value: BNNSActivation | Activation | None) -> Activation:
    if value is None:
        return Activation.identity()
    if isinstance(value, Activation):
        return value
    if isinstance(value, BNNSActivation):
        return value.to_activation(where)
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
    """The NumPy shape that a shape descriptor (``i_desc``, ``o_desc``) describes, its layout,
    sizes, strides and data type checked: BNNS reads them all."""
    layout = nd.layout_of(where, desc)
    nd.data_type_of(where, desc, (DataType.float32,))
    sizes = nd.eight(f"{where}.size", desc.size, layout.rank)
    if any(s == 0 for s in sizes):
        raise ShapeError(must_be(f"{where}.size", f"{layout.rank} sizes > 0 for "
                                 f"{apple_name(DataLayout, layout)}", sizes))
    strides = nd.eight(f"{where}.stride", desc.stride, layout.rank)
    if any(strides):
        if not all(strides):
            raise InvalidParameterError(must_be(f"{where}.stride", "all positive, or all 0 for contiguous",
                                                strides))
        nd.check_layout(where, sizes, strides)
    shape = tuple(reversed(sizes))
    return shape[::-1] if layout is DataLayout.column_major_matrix else shape


def _optional(where: str, desc: object) -> BNNSNDArrayDescriptor | None:
    """A descriptor that may be absent: ``None`` or one without data (a zero-filled one)."""
    if desc is None:
        return None
    if not isinstance(desc, BNNSNDArrayDescriptor):
        raise InvalidParameterError(must_be(where, "a BNNSNDArrayDescriptor or None", type(desc).__name__))
    return None if desc.data is None else desc


def _finite_array(where: str, value: np.ndarray | None, *, non_negative: bool = False) -> np.ndarray | None:
    """Weights and statistics are finite (and a variance >= 0), as the layer requires."""
    if value is not None and value.size:
        if not np.isfinite(value).all():
            raise InvalidParameterError(must_be(f"{where}.data", "finite (no NaN or infinity)",
                                                nd.Named("data with non-finite values")))
        if non_negative and (value < 0).any():
            raise InvalidParameterError(must_be(f"{where}.data", ">= 0 everywhere (a variance)",
                                                nd.Named("data with negative values")))
    return value


@_entry_point(failure=None)
def BNNSFilterCreateLayerNormalization(
    normType: FilterType | int,
    layer_params: BNNSLayerParametersNormalization,
    filter_params: BNNSFilterParameters | None = None,
) -> BNNSFilter | None:
    """Create a batch, instance, layer or group normalization filter (``None`` on failure).

    Each field is read as BNNS reads it for ``normType``: ``num_groups`` for group norm only,
    ``normalization_axis`` for layer norm only, the moving statistics (and ``momentum``, which
    updates them) for batch and instance norm only. A field that is not read may hold anything
    of its C type, 0 in particular; a descriptor without data is absent (beta 0, gamma 1, no
    moving statistics).
    """
    from .layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

    kind = FilterType.parse(normType, "normType")
    if kind not in _NORMALIZATION_TYPES:
        raise InvalidParameterError(must_be("normType",
                                            "BNNSBatchNorm, BNNSInstanceNorm, BNNSLayerNorm or BNNSGroupNorm",
                                            nd.Named(apple_name(FilterType, kind))))
    p = layer_params
    if not isinstance(p, BNNSLayerParametersNormalization):
        raise InvalidParameterError(must_be("layer_params", "a BNNSLayerParametersNormalization",
                                            type(p).__name__))
    where = "layer_params"
    i_desc = _descriptor(f"{where}.i_desc", p.i_desc)
    shape = _descriptor_shape(f"{where}.i_desc", i_desc)
    o_desc = _descriptor(f"{where}.o_desc", p.o_desc)
    out_shape = _descriptor_shape(f"{where}.o_desc", o_desc)
    if out_shape != shape:
        raise ShapeError(must_be(f"{where}.o_desc.size", f"the input's sizes {tuple(reversed(shape))}",
                                 tuple(reversed(out_shape))))
    channels = shape[0]
    name = _NORMALIZATION_TYPES[kind]
    tracked = name in ("batch", "instance")  # the only kinds with moving statistics (and momentum)
    epsilon = _finite(f"{where}.epsilon", p.epsilon)
    if epsilon < 0:
        raise InvalidParameterError(must_be(f"{where}.epsilon", ">= 0", epsilon))
    if name == "group":
        groups = _integer(f"{where}.num_groups", p.num_groups, minimum=1)
        if channels % groups:
            raise InvalidParameterError(must_be(
                f"{where}.num_groups", f"a divisor of the {channels} channels ({where}.i_desc.size"
                f"[{0 if i_desc.layout is DataLayout.column_major_matrix else len(shape) - 1}])", groups))
    else:
        _integer(f"{where}.num_groups", p.num_groups)
    if name == "layer":
        axis = _integer(f"{where}.normalization_axis", p.normalization_axis)
        if axis >= len(shape):
            raise InvalidParameterError(must_be(f"{where}.normalization_axis",
                                                f"in [0, {len(shape) - 1}] for a rank-{len(shape)} input",
                                                axis))
        weights_shape: tuple[int, ...] = shape[axis:]
    else:
        _integer(f"{where}.normalization_axis", p.normalization_axis)
        weights_shape = (channels,)
    activation = _activation(f"{where}.activation", p.activation)
    gamma = _finite_array(f"{where}.gamma_desc", nd.read(
        f"{where}.gamma_desc", _optional(f"{where}.gamma_desc", p.gamma_desc), weights_shape, required=False))
    beta = _finite_array(f"{where}.beta_desc", nd.read(
        f"{where}.beta_desc", _optional(f"{where}.beta_desc", p.beta_desc), weights_shape, required=False))
    moving = {field: _optional(f"{where}.{field}", getattr(p, field))
              for field in ("moving_mean_desc", "moving_variance_desc")}
    moving_descs: tuple[BNNSNDArrayDescriptor | None, BNNSNDArrayDescriptor | None] = (None, None)
    params_type: Any
    momentum = 0.0
    if tracked:
        mean_desc, var_desc = moving["moving_mean_desc"], moving["moving_variance_desc"]
        if (mean_desc is None) != (var_desc is None):
            given, missing = ("moving_mean_desc", "moving_variance_desc") if var_desc is None else \
                ("moving_variance_desc", "moving_mean_desc")
            raise InvalidParameterError(must_be(
                f"{where}.{missing}.data", f"set when {where}.{given}.data is (BNNS tracks both or neither)",
                None))
        if mean_desc is not None:  # momentum updates the moving statistics: read only with them
            momentum = _finite(f"{where}.momentum", p.momentum)
            if not 0.0 <= momentum <= 1.0:
                raise InvalidParameterError(must_be(f"{where}.momentum", "in [0, 1]", momentum))
        else:
            _real(f"{where}.momentum", p.momentum)
        moving_mean = _finite_array(f"{where}.moving_mean_desc", nd.read(
            f"{where}.moving_mean_desc", mean_desc, (channels,), required=False))
        moving_var = _finite_array(f"{where}.moving_variance_desc", nd.read(
            f"{where}.moving_variance_desc", var_desc, (channels,), required=False), non_negative=True)
        make = NormalizationType.batch if name == "batch" else NormalizationType.instance
        params_type = make(moving_mean=moving_mean, moving_variance=moving_var)
        moving_descs = (mean_desc, var_desc)
    else:
        _real(f"{where}.momentum", p.momentum)
        if name == "layer":
            params_type = NormalizationType.layer(normalization_axis=axis)
        else:
            params_type = NormalizationType.group(group_count=groups)
    params = NormalizationParameters(
        type=params_type, input_shape=shape, gamma=gamma, beta=beta, momentum=momentum,
        epsilon=epsilon, activation=activation, dtype=np.float32,
    )
    layer = NormalizationLayer(params, _filter_parameters(filter_params))
    return BNNSFilter(layer, i_desc, o_desc, moving_descs)


def _check_filter(value: object) -> BNNSFilter:
    if not isinstance(value, BNNSFilter):
        raise InvalidParameterError(must_be("filter", "a filter from a BNNSFilterCreate… function",
                                            type(value).__name__))
    return value


def _check_open(f: BNNSFilter, function: str) -> None:
    """A destroyed filter is refused in the C call's words."""
    try:
        f.layer.check_open("apply")
    except FilterClosedError:
        raise FilterClosedError(f"filter was passed to {function}() after close() (BNNSFilterDestroy); "
                                "create a new filter with BNNSFilterCreateLayerNormalization to compute "
                                "again.") from None


def _batch_desc(template: BNNSNDArrayDescriptor, data: object) -> BNNSNDArrayDescriptor:
    return attrs.evolve(template, data=data)


def _accumulates(where: str, desc: BNNSNDArrayDescriptor | None) -> bool:
    """Whether a delta descriptor's ``flags`` ask to add to its data (read only for a delta with data)."""
    if desc is None or desc.data is None:
        return False
    return bool(nd.flags_of(where, desc) & NDArrayFlags.backprop_accumulate)


#: The types Apple declares for the deltas of BNNSNormalizationFilterApplyBackwardBatch: "must be
#: in BNNSDataTypeFloat32 or BNNSDataTypeBFloat16" (bnns.h), each delta on its own.
_DELTA_TYPES = (DataType.float32, DataType.bfloat16)


def _pointer(where: str, value: object) -> None:
    """A ``void *`` argument: a NumPy array, any other buffer, or ``None``."""
    if value is None or isinstance(value, np.ndarray):
        return
    try:
        memoryview(value)  # type: ignore[arg-type]  # any object: memoryview() is the check
    except TypeError:
        raise InvalidParameterError(must_be(where, "a NumPy array, a buffer or None",
                                            type(value).__name__)) from None


def _sample(where: str, template: BNNSNDArrayDescriptor, value: object) -> BNNSNDArrayDescriptor | None:
    """One sample of a batch argument as a descriptor: the caller's own (Apple declares
    ``BNNSNDArrayDescriptor *`` for the deltas), or a bare buffer laid out as ``template``
    (the filter's ``i_desc`` or ``o_desc``); ``None`` for a null argument."""
    if value is None:
        return None
    if isinstance(value, BNNSNDArrayDescriptor):
        return value
    if isinstance(value, (BNNSLayerParametersNormalization, BNNSLSTMDataDescriptor, BNNSFilter)):
        raise InvalidParameterError(must_be(where, "a BNNSNDArrayDescriptor, a NumPy array or a buffer",
                                            type(value).__name__))
    return attrs.evolve(template, data=value)


class _Memory:
    """The caller's memory one call reads and writes, to refuse overlapping arguments.

    Inputs are copied before anything is written, so an output may overlap an input only
    when it is the same elements (in place, as BNNS allows); outputs never overlap each
    other (one buffer for two outputs would keep only the last one written).
    """

    def __init__(self) -> None:
        self.inputs: list[tuple[str, np.ndarray]] = []
        self.outputs: list[tuple[str, np.ndarray]] = []

    def add(self, kind: str, where: str, region: np.ndarray | None) -> None:
        if region is not None:
            (self.outputs if kind == "out" else self.inputs).append((where, region))

    def check(self) -> None:
        for i, (where, out) in enumerate(self.outputs):
            for other, region in self.outputs[:i]:
                if overlap(out, region):
                    raise InvalidParameterError(must_be(
                        where, f"memory apart from {other} (one buffer for two outputs)",
                        f"a buffer overlapping {other}"))
            for other, region in self.inputs:
                if overlap(out, region) and not same_elements(out, region):
                    raise InvalidParameterError(must_be(
                        where, f"memory apart from {other}, or exactly the same elements (in place)",
                        f"a buffer partly overlapping {other}"))


def _batch(where: str, batch_size: object, stride: object, stride_where: str) -> nd.Batch:
    return nd.Batch(_integer(where, batch_size, minimum=1), _integer(stride_where, stride), stride_where)


@_entry_point(failure=-1)
def BNNSNormalizationFilterApplyBatch(
    filter: BNNSFilter, batch_size: int, in_: object, in_stride: int, out: object, out_stride: int,
    training: bool,
) -> int:
    """Forward ``batch_size`` samples (``in_stride``/``out_stride`` elements apart; 0 = dense).

    ``in_`` and ``out`` are buffers (Apple: ``const void *`` and ``void *``) laid out as the
    filter's ``i_desc`` and ``o_desc``; ``out`` may be ``in_`` itself (in place).
    """
    f = _check_filter(filter)
    _check_open(f, "BNNSNormalizationFilterApplyBatch")
    shape = f.layer.input_shape
    in_batch = _batch("batch_size", batch_size, in_stride, "in_stride")
    out_batch = _batch("batch_size", batch_size, out_stride, "out_stride")
    if not isinstance(training, (bool, np.bool_)):
        raise InvalidParameterError(must_be("training", "True or False", training))
    in_desc, out_desc = _batch_desc(f.i_desc, in_), _batch_desc(f.o_desc, out)
    if out_desc.data is None:
        raise InvalidParameterError(must_be("out", "a buffer", None))
    memory = _Memory()
    memory.add("in", "in", nd.region("in", in_desc, shape, batch=in_batch))
    memory.add("out", "out", nd.region("out", out_desc, shape, batch=out_batch))
    mean_desc, var_desc = f.moving_descs
    if training and f.layer.moving_mean is not None:
        channels = (shape[0],)
        memory.add("out", "layer_params.moving_mean_desc",
                   nd.region("layer_params.moving_mean_desc", mean_desc, channels))
        memory.add("out", "layer_params.moving_variance_desc",
                   nd.region("layer_params.moving_variance_desc", var_desc, channels))
    memory.check()
    x = nd.read("in", in_desc, shape, batch=in_batch)
    phase = "training" if training else "inference"
    y = f.layer.apply(x, phase=phase)
    nd.write("out", out_desc, y, batch=out_batch)
    f.last_input, f.last_phase = x, phase
    if training and f.layer.moving_mean is not None:  # BNNS updates the caller's moving statistics
        nd.write("layer_params.moving_mean_desc", mean_desc, f.layer.moving_mean)
        nd.write("layer_params.moving_variance_desc", var_desc, f.layer.moving_variance)
    return 0


@_entry_point(failure=-1)
def BNNSNormalizationFilterApplyBackwardBatch(
    filter: BNNSFilter, batch_size: int, in_delta: BNNSNDArrayDescriptor | object | None,
    in_delta_stride: int, out: object, out_stride: int, out_delta: BNNSNDArrayDescriptor | object,
    out_delta_stride: int,
    beta_delta: BNNSNDArrayDescriptor | None, gamma_delta: BNNSNDArrayDescriptor | None,
) -> int:
    """Backward of the filter's last forward, with Apple's argument types.

    ``in_delta``, ``out_delta``, ``beta_delta`` and ``gamma_delta`` are
    ``BNNSNDArrayDescriptor`` s, as Apple declares them: each describes one sample (``in_delta``,
    ``out_delta``; sizes 0 take the filter's) or the parameter's shape, with its own strides, and
    the ``*_stride`` arguments give the distance between samples. A delta whose ``flags`` has
    ``NDArrayFlags.backprop_accumulate`` is added to, otherwise overwritten; ``None`` (or
    ``data=None``) is "not computed". A bare buffer for ``in_delta`` or ``out_delta`` is taken
    as laid out like the filter's ``i_desc`` / ``o_desc``; ``out`` (the forward output, Apple's
    ``const void *``) is a buffer laid out like ``o_desc``, read only with a fused activation.

    Each delta is ``BNNSDataTypeFloat32`` or ``BNNSDataTypeBFloat16``, as Apple's header
    declares: BFloat16 data (an ``ml_dtypes.bfloat16`` array or ``uint16`` bits) is widened,
    the arithmetic is float32's, and each result is rounded once to nearest even.
    """
    f = _check_filter(filter)
    _check_open(f, "BNNSNormalizationFilterApplyBackwardBatch")
    shape = f.layer.input_shape
    n = _integer("batch_size", batch_size, minimum=1)
    if f.last_input is None:
        raise InvalidParameterError(must_be("filter", "applied forward before its backward",
                                            "no forward yet"))
    if f.last_input.shape[0] != n:
        raise ShapeError(must_be("batch_size", f"the last forward's batch size {f.last_input.shape[0]}", n))
    in_batch = _batch("batch_size", n, in_delta_stride, "in_delta_stride")
    out_batch = _batch("batch_size", n, out_stride, "out_stride")
    delta_batch = _batch("batch_size", n, out_delta_stride, "out_delta_stride")
    dx_desc = _sample("in_delta", f.i_desc, in_delta)
    dy_desc = _sample("out_delta", f.o_desc, out_delta)
    if dy_desc is None:
        raise InvalidParameterError(must_be("out_delta", "a BNNSNDArrayDescriptor with data (dy)", None))
    if dy_desc.data is None:
        raise InvalidParameterError(must_be("out_delta.data", "set (dy: BNNS requires it)", None))
    activation = f.layer.layer_parameters.activation
    # Apple: "out is ignored if activation is BNNSActivationFunctionIdentity"; otherwise required.
    _pointer("out", out)
    y_desc = None if out is None or activation.is_identity else _batch_desc(f.o_desc, out)
    if y_desc is None and not activation.is_identity:
        raise InvalidParameterError(must_be(
            "out", "the forward output, laid out as layer_params.o_desc (the fused "
            f"{apple_name(ActivationFunction, activation.function)} needs it)", None))
    affine = f.layer.layer_parameters.affine_shape
    parameters = {"beta_delta": beta_delta, "gamma_delta": gamma_delta}
    for name, desc in parameters.items():
        if desc is not None and not isinstance(desc, BNNSNDArrayDescriptor):
            raise InvalidParameterError(must_be(name, "a BNNSNDArrayDescriptor or None", type(desc).__name__))
    deltas = _DELTA_TYPES  # Apple: each delta "must be in BNNSDataTypeFloat32 or BNNSDataTypeBFloat16"
    memory = _Memory()
    memory.add("in", "out_delta",
               nd.region("out_delta", dy_desc, shape, data_types=deltas, batch=delta_batch))
    memory.add("in", "out", nd.region("out", y_desc, shape, batch=out_batch))
    memory.add("out", "in_delta", nd.region("in_delta", dx_desc, shape, data_types=deltas, batch=in_batch))
    for name, desc in parameters.items():
        memory.add("out", name, nd.region(name, desc, affine, data_types=deltas))
    memory.check()
    dy = nd.read("out_delta", dy_desc, shape, data_types=deltas, batch=delta_batch)
    y = nd.read("out", y_desc, shape, required=False, batch=out_batch)
    grads = f.layer.apply_backward(f.last_input, dy, output=y, phase=f.last_phase)
    nd.write("in_delta", dx_desc, grads.input, accumulate=_accumulates("in_delta", dx_desc),
             data_types=deltas, batch=in_batch)
    for name, value in (("beta_delta", grads.beta), ("gamma_delta", grads.gamma)):
        desc = parameters[name]
        nd.write(name, desc, value, accumulate=_accumulates(name, desc), data_types=deltas)
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


_LSTM_SIZES = ("input_size", "hidden_size", "batch_size", "num_layers", "seq_len")


def _lstm_structure(where: str, p: object) -> BNNSLayerParametersLSTM:
    """``p`` when it is a ``BNNSLayerParametersLSTM`` whose members have their C types."""
    if not isinstance(p, BNNSLayerParametersLSTM):
        raise InvalidParameterError(must_be(where, "a BNNSLayerParametersLSTM", type(p).__name__))
    if p.sequence_descriptor is not None and not isinstance(p.sequence_descriptor, BNNSNDArrayDescriptor):
        raise InvalidParameterError(must_be(f"{where}.sequence_descriptor", "a BNNSNDArrayDescriptor or None",
                                            type(p.sequence_descriptor).__name__))
    for name in ("input_descriptor", "output_descriptor"):
        data = getattr(p, name)
        if data is None:
            continue
        if not isinstance(data, BNNSLSTMDataDescriptor):
            raise InvalidParameterError(must_be(f"{where}.{name}", "a BNNSLSTMDataDescriptor or None",
                                                type(data).__name__))
        for field in ("data_desc", "hidden_desc", "cell_state_desc"):
            desc = getattr(data, field)
            if desc is not None and not isinstance(desc, BNNSNDArrayDescriptor):
                rule = "a BNNSNDArrayDescriptor or None"
                raise InvalidParameterError(must_be(f"{where}.{name}.{field}", rule, type(desc).__name__))
    return p


def _lstm_sizes(p: BNNSLayerParametersLSTM,
                where: str = "layer_params") -> tuple[int, int, int, int, int, int]:
    """I, H, N, L, T and D of a ``BNNSLayerParametersLSTM``, its fields checked for their C types
    (``dropout`` is read only between stacked layers: with one layer any C float is taken)."""
    _lstm_structure(where, p)
    values = [_integer(f"{where}.{field}", getattr(p, field), minimum=1) for field in _LSTM_SIZES]
    flags = _integer(f"{where}.lstm_flags", p.lstm_flags, maximum=nd.UINT32_MAX)
    _dropout(where, p, values[3])
    d = 2 if flags & LayerFlags.lstm_bidirectional else 1
    i, h, n, layers, t = values
    return i, h, n, layers, t, d


def _dropout(where: str, p: BNNSLayerParametersLSTM, layers: int) -> float:
    """The dropout between stacked layers; Apple: ignored when ``num_layers == 1``."""
    if layers == 1:
        _real(f"{where}.dropout", p.dropout)
        return 0.0
    dropout = _finite(f"{where}.dropout", p.dropout)
    if not 0.0 <= dropout < 1.0:
        raise InvalidParameterError(must_be(f"{where}.dropout", "in [0, 1)", dropout))
    return dropout


def _delta_sizes(p: BNNSLayerParametersLSTM, dp: object, sizes: tuple[int, ...]) -> BNNSLayerParametersLSTM:
    """The delta structure's sizes: 0 (zero-filled: the forward's) or the forward's own. Its
    ``lstm_flags``, dropout, sequence descriptor and activations are not read: the configuration
    is ``layer_params``'s."""
    where = "layer_delta_params"
    dp = _lstm_structure(where, dp)
    for field, size in zip(_LSTM_SIZES, sizes):
        value = _integer(f"{where}.{field}", getattr(dp, field))
        if value not in (0, size):
            raise InvalidParameterError(must_be(f"{where}.{field}", f"0 or layer_params.{field} ({size})",
                                                value))
    _integer(f"{where}.lstm_flags", dp.lstm_flags, maximum=nd.UINT32_MAX)
    _real(f"{where}.dropout", dp.dropout)
    return dp


def _activation_type(where: str, value: object) -> None:
    """An activation that is not read (default activations): of its C type only."""
    if value is not None and not isinstance(value, (BNNSActivation, Activation)):
        raise InvalidParameterError(must_be(where, "a BNNSActivation", type(value).__name__))


def _gate(where: str, g: BNNSLSTMGateDescriptor | None, i: int, h: int, layers: int, d: int,
          default_activations: bool) -> Any:
    """A gate's weights, read as BNNS reads them: ``iw_desc[1]`` only with stacked layers, the
    peephole and bias descriptors when they have data, the activation unless the default
    activations are asked for (a zero-filled ``BNNSActivation`` is the identity, as in BNNS)."""
    from .layers.lstm import LSTMGateDescriptor

    if not isinstance(g, BNNSLSTMGateDescriptor):
        raise InvalidParameterError(must_be(where, "a BNNSLSTMGateDescriptor", type(g).__name__))
    if not isinstance(g.iw_desc, (tuple, list)) or len(g.iw_desc) != 2:
        raise InvalidParameterError(must_be(f"{where}.iw_desc", "a pair of descriptors", g.iw_desc))
    first, rest = g.iw_desc
    if layers > 1:
        upper = (layers - 1, d, h, d * h)
        iw1 = nd.read(f"{where}.iw_desc[1]", _optional(f"{where}.iw_desc[1]", rest), upper, required=False)
        if iw1 is None and i == d * h:  # every layer's input weights in iw_desc[0]
            both = nd.read(f"{where}.iw_desc[0]", first, (layers, d, h, i))
            iw0, iw1 = both[0], both[1:]
        elif iw1 is None:
            raise InvalidParameterError(must_be(f"{where}.iw_desc[1].data", "set when num_layers > 1", None))
        else:
            iw0 = nd.read(f"{where}.iw_desc[0]", first, (d, h, i))
    else:  # iw_desc[1] is not read
        _optional(f"{where}.iw_desc[1]", rest)
        iw0, iw1 = nd.read(f"{where}.iw_desc[0]", first, (d, h, i)), None
    hw = nd.read(f"{where}.hw_desc", g.hw_desc, (layers, d, h, h))
    cw = None
    cw_desc = _optional(f"{where}.cw_desc", g.cw_desc)
    if cw_desc is not None:
        # Full (L, D, H, H) peephole matrices, or ONNX-style diagonal ones (L, D, H): told
        # apart by the element count; sizes left 0 mean the full matrices BNNS describes.
        rank = nd.layout_of(f"{where}.cw_desc", cw_desc).rank
        count = math.prod(nd.eight(f"{where}.cw_desc.size", cw_desc.size, rank))
        diagonal = count == layers * d * h
        cw = nd.read(f"{where}.cw_desc", cw_desc, (layers, d, h) if diagonal else (layers, d, h, h))
    bias = nd.read(f"{where}.b_desc", _optional(f"{where}.b_desc", g.b_desc), (layers, d, h), required=False)
    for name, value in (("iw_desc[0]", iw0), ("iw_desc[1]", iw1), ("hw_desc", hw), ("cw_desc", cw),
                        ("b_desc", bias)):
        _finite_array(f"{where}.{name}", value)
    if default_activations:
        _activation_type(f"{where}.activation", g.activation)
        activation = None
    else:
        activation = None if g.activation is None else _activation(f"{where}.activation", g.activation)
    return LSTMGateDescriptor(input_weights=(iw0, iw1), hidden_weights=hw, cell_weights=cw, bias=bias,
                              activation=activation)


def _sequence_lengths(p: BNNSLayerParametersLSTM, n: int, t: int) -> np.ndarray | None:
    """Per-sequence lengths from the batch size of each step (no data: every sequence full)."""
    where = "layer_params.sequence_descriptor"
    desc = _optional(where, p.sequence_descriptor)
    if desc is None:
        return None
    values = nd.read(where, desc, (t,), data_types=(DataType.int32, DataType.float32))
    if values.dtype.kind == "f" and not (np.isfinite(values).all() and (values == np.round(values)).all()):
        raise InvalidParameterError(must_be(f"{where}.data", "whole numbers (batch sizes, which Apple "
                                            "declares unsigned integers)", values.tolist()))
    sizes = values.astype(np.int64)
    if sizes[0] != n or np.any(sizes < 1) or np.any(np.diff(sizes) > 0):
        raise InvalidParameterError(must_be(f"{where}.data",
                                            f"non-increasing batch sizes per step in [1, {n}], "
                                            f"starting at {n}", sizes.tolist()))
    return (sizes[None, :] > np.arange(n)[:, None]).sum(axis=1)


def _lstm(p: BNNSLayerParametersLSTM, filter_params: BNNSFilterParameters | None) -> _LSTMCall:
    from .layers.lstm import LSTMLayer, LSTMParameters

    i, h, n, layers, t, d = _lstm_sizes(p)
    default_activations = bool(int(p.lstm_flags) & LayerFlags.lstm_default_activations)
    gates = {name: _gate(f"layer_params.{name}", getattr(p, name), i, h, layers, d, default_activations)
             for name in GATE_FIELDS}
    if default_activations:
        _activation_type("layer_params.hidden_activation", p.hidden_activation)
        hidden_activation = Activation.tanh()
    else:
        hidden_activation = (Activation.tanh() if p.hidden_activation is None
                             else _activation("layer_params.hidden_activation", p.hidden_activation))
    where = "layer_params.input_descriptor.data_desc"
    input_data = None if p.input_descriptor is None else _optional(where, p.input_descriptor.data_desc)
    if input_data is None:
        raise InvalidParameterError(must_be(f"{where}.data", "set (x: BNNS requires it)", None))
    layout = nd.layout_of(where, input_data)
    if layout not in (DataLayout.sne, DataLayout.nse):
        raise InvalidParameterError(must_be(f"{where}.layout", "BNNSDataLayoutSNE or BNNSDataLayoutNSE",
                                            nd.Named(apple_name(DataLayout, layout))))
    params = LSTMParameters(
        input_size=i, hidden_size=h, num_layers=layers, bidirectional=d == 2,
        batch_first=layout is DataLayout.nse, dropout=_dropout("layer_params", p, layers), **gates,
        hidden_activation=hidden_activation, default_activations=default_activations, dtype=np.float32,
    )
    layer = LSTMLayer(params, _filter_parameters(filter_params))
    return _LSTMCall(layer, layout is DataLayout.nse, _sequence_lengths(p, n, t), input_data)


def _sequence_shape(batch_first: bool, t: int, n: int, width: int) -> tuple[int, int, int]:
    return (n, t, width) if batch_first else (t, n, width)


def _sequence_layout(where: str, desc: BNNSNDArrayDescriptor) -> DataLayout:
    """A sequence descriptor's layout: SNE or NSE."""
    layout = nd.layout_of(where, desc)
    if layout not in (DataLayout.sne, DataLayout.nse):
        raise InvalidParameterError(must_be(f"{where}.layout", "BNNSDataLayoutSNE or BNNSDataLayoutNSE",
                                            nd.Named(apple_name(DataLayout, layout))))
    return layout


def _in_layout(where: str, desc: BNNSNDArrayDescriptor | None, value: np.ndarray,
               batch_first: bool) -> np.ndarray | None:
    """(T, N, W) or (N, T, W) data in the layout of an SNE or NSE descriptor (None without data)."""
    if desc is None or desc.data is None:
        return None
    if (_sequence_layout(where, desc) is DataLayout.nse) != batch_first:
        value = np.ascontiguousarray(value.swapaxes(0, 1))
    return value


class _Writes:
    """The outputs of one call, checked against each other and the inputs before any is written."""

    def __init__(self, memory: _Memory) -> None:
        self.memory = memory
        self.pending: list[tuple[str, BNNSNDArrayDescriptor, np.ndarray]] = []

    def add(self, where: str, desc: BNNSNDArrayDescriptor | None, value: np.ndarray | None) -> None:
        desc = _optional(where, desc)
        if desc is None or value is None:
            return
        self.memory.add("out", where, nd.region(where, desc, value.shape))
        self.pending.append((where, desc, value))

    def write(self) -> None:
        self.memory.check()
        for where, desc, value in self.pending:
            nd.write(where, desc, value, accumulate=_accumulates(where, desc))


def _read_sequence(where: str, desc: BNNSNDArrayDescriptor | None, batch_first: bool, t: int, n: int,
                   width: int, required: bool) -> np.ndarray | None:
    if desc is None or desc.data is None:
        if required:
            raise InvalidParameterError(must_be(f"{where}.data", "set", None))
        return None
    own = _sequence_layout(where, desc) is DataLayout.nse
    value = nd.read(where, desc, _sequence_shape(own, t, n, width))
    if own != batch_first:
        value = np.ascontiguousarray(value.swapaxes(0, 1))
    return value


def _state(where: str, data: BNNSLSTMDataDescriptor | None, field: str,
           shape: tuple[int, ...]) -> np.ndarray | None:
    if data is None:
        return None
    return nd.read(f"{where}.{field}", getattr(data, field), shape, required=False)


def _sequence_region(where: str, desc: BNNSNDArrayDescriptor | None, t: int, n: int,
                     width: int) -> np.ndarray | None:
    if desc is None or desc.data is None:
        return None
    own = _sequence_layout(where, desc) is DataLayout.nse
    return nd.region(where, desc, _sequence_shape(own, t, n, width))


def _data_regions(memory: _Memory, kind: str, where: str, data: BNNSLSTMDataDescriptor | None,
                  t: int, n: int, width: int, states: tuple[int, ...]) -> None:
    """The sequence and state descriptors of one ``BNNSLSTMDataDescriptor``."""
    if data is None:
        return
    sequence = f"{where}.data_desc"
    memory.add(kind, sequence, _sequence_region(sequence, data.data_desc, t, n, width))
    for field in ("hidden_desc", "cell_state_desc"):
        memory.add(kind, f"{where}.{field}", nd.region(f"{where}.{field}", getattr(data, field), states))


def _cache_view(call: _LSTMCall, training_cache_ptr: object, capacity: object, n: int,
                t: int) -> np.ndarray | None:
    """The first ``capacity`` bytes of the caller's cache buffer (Apple: ``void *`` and ``size_t``),
    at least the bytes ``BNNSComputeLSTMTrainingCacheCapacity`` gives for these sizes."""
    capacity = _integer("training_cache_capacity", capacity)
    if training_cache_ptr is None:
        return None
    try:
        buffer = memoryview(training_cache_ptr).cast("B")  # type: ignore[arg-type]  # checked by memoryview()
    except (TypeError, ValueError):
        raise InvalidParameterError(must_be("training_cache_ptr", "a C-contiguous buffer or None",
                                            type(training_cache_ptr).__name__)) from None
    if buffer.nbytes < capacity:
        raise InvalidParameterError(must_be("training_cache_capacity",
                                            f"at most the buffer's {buffer.nbytes} bytes",
                                            capacity))
    required = int(call.layer.training_cache_capacity(batch_size=n, seq_len=t))
    if capacity < required:
        raise InvalidParameterError(must_be(
            "training_cache_capacity", f"at least {required} bytes (BNNSComputeLSTMTrainingCacheCapacity "
            "of these layer_params)", capacity))
    return np.frombuffer(buffer, dtype=np.uint8)[:capacity] if capacity else np.empty(0, np.uint8)


#: How the object API names what the C-style calls hand it: its errors are reported with the C
#: argument (the checks before it cover the rest in the caller's words).
_C_ARGUMENTS = (("LSTMLayer.apply(training_cache)", "training_cache_ptr"),
                ("LSTMLayer.apply_backward(training_cache)", "training_cache_ptr"))


@contextlib.contextmanager
def _in_c_terms() -> Iterator[None]:
    """Re-raise an object-API error whose subject is a C argument under the argument's name."""
    try:
        yield
    except BNNSError as exc:
        text = str(exc)
        for words, argument in _C_ARGUMENTS:
            if text.startswith(words + " "):
                raise type(exc)(argument + text[len(words):]) from exc
        raise


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
    training_cache_ptr: object, training_cache_capacity: int,
) -> int:
    """Forward: reads the input descriptor, writes the output descriptor; with a training
    cache, in training mode, leaving in the cache what the backward needs."""
    p = layer_params
    call = _lstm(p, filter_params)
    i, h, n, layers, t, d = _lstm_sizes(p)
    try:
        states = (layers * d, n, h)
        cache = _cache_view(call, training_cache_ptr, training_cache_capacity, n, t)
        memory = _Memory()
        _data_regions(memory, "in", "layer_params.input_descriptor", p.input_descriptor, t, n, i, states)
        _data_regions(memory, "out", "layer_params.output_descriptor", p.output_descriptor, t, n, d * h,
                      states)
        memory.add("out", "training_cache_ptr", cache)
        memory.check()
        x = _read_sequence("layer_params.input_descriptor.data_desc", call.input_data,
                           call.batch_first, t, n, i, required=True)
        h0 = _state("layer_params.input_descriptor", p.input_descriptor, "hidden_desc", states)
        c0 = _state("layer_params.input_descriptor", p.input_descriptor, "cell_state_desc", states)
        with _in_c_terms():
            result = call.layer.apply(x, hidden=h0, cell=c0, sequence_lengths=call.sequence_lengths,
                                      training=cache is not None, training_cache=cache)
        out = p.output_descriptor
        if out is not None:
            where = "layer_params.output_descriptor"
            output = _in_layout(f"{where}.data_desc", out.data_desc, result.output, call.batch_first)
            if output is not None:
                nd.write(f"{where}.data_desc", out.data_desc, output)
            nd.write(f"{where}.hidden_desc", out.hidden_desc, result.hidden)
            nd.write(f"{where}.cell_state_desc", out.cell_state_desc, result.cell)
        return 0
    finally:
        call.layer.close()


@_entry_point(failure=-1)
def BNNSDirectApplyLSTMBatchBackward(
    layer_params: BNNSLayerParametersLSTM, layer_delta_params: BNNSLayerParametersLSTM,
    filter_params: BNNSFilterParameters | None, training_cache_ptr: object, training_cache_capacity: int,
) -> int:
    """Backward: reads dL/dy, dL/dh_T, dL/dc_T from the delta's output descriptor and writes
    dL/dx, dL/dh_0, dL/dc_0 and every gate's deltas into the delta's input and gate descriptors.

    Without a training cache the forward is recomputed, as BNNS does.
    """
    p = layer_params
    i, h, n, layers, t, d = _lstm_sizes(p)
    dp = _delta_sizes(p, layer_delta_params, (i, h, n, layers, t))
    call = _lstm(p, filter_params)
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
        cache = _cache_view(call, training_cache_ptr, training_cache_capacity, n, t)
        with _in_c_terms():
            grads = call.layer.apply_backward(x, dy, hidden=h0, cell=c0, hidden_gradient=dht,
                                              cell_gradient=dct, sequence_lengths=call.sequence_lengths,
                                              training_cache=cache)
        memory = _Memory()
        _data_regions(memory, "in", "layer_params.input_descriptor", p.input_descriptor, t, n, i, states)
        _data_regions(memory, "in", "layer_delta_params.output_descriptor", dout, t, n, d * h, states)
        memory.add("in", "training_cache_ptr", cache)
        writes = _Writes(memory)
        din = dp.input_descriptor
        if din is not None:
            where = "layer_delta_params.input_descriptor"
            writes.add(f"{where}.data_desc", din.data_desc,
                       _in_layout(f"{where}.data_desc", din.data_desc, grads.input, call.batch_first))
            writes.add(f"{where}.hidden_desc", din.hidden_desc, grads.hidden)
            writes.add(f"{where}.cell_state_desc", din.cell_state_desc, grads.cell)
        for name in GATE_FIELDS:
            gd, g = getattr(dp, name), getattr(grads, name)
            if gd is None:
                continue
            where = f"layer_delta_params.{name}"
            if not isinstance(gd, BNNSLSTMGateDescriptor):
                rule = "a BNNSLSTMGateDescriptor or None"
                raise InvalidParameterError(must_be(where, rule, type(gd).__name__))
            iw0, iw1 = g.input_weights
            if not isinstance(gd.iw_desc, (tuple, list)) or len(gd.iw_desc) != 2:
                raise InvalidParameterError(must_be(f"{where}.iw_desc", "a pair of descriptors", gd.iw_desc))
            first, rest = gd.iw_desc
            if layers > 1 and (rest is None or rest.data is None) and i == d * h and first is not None \
                    and first.data is not None:
                writes.add(f"{where}.iw_desc[0]", first, np.concatenate([iw0[None], iw1]))
            else:
                writes.add(f"{where}.iw_desc[0]", first, iw0)
                writes.add(f"{where}.iw_desc[1]", rest, iw1)
            writes.add(f"{where}.hw_desc", gd.hw_desc, g.hidden_weights)
            writes.add(f"{where}.cw_desc", gd.cw_desc, g.cell_weights)
            writes.add(f"{where}.b_desc", gd.b_desc, g.bias)
        writes.write()
        return 0
    finally:
        call.layer.close()

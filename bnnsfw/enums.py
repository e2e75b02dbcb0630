"""BNNS enumerations with Apple's raw values.

The numbers match ``bnns_constants.h`` so that values read from a BNNS program (or written to
one) mean the same thing here. Each enum accepts its member name as a string, case-insensitively,
through :meth:`parse`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import DTypeLike

from .errors import DTypeError, InvalidParameterError, must_be

if TYPE_CHECKING:
    from typing_extensions import Self

    # Every class that mixes in _Parse is an enum; saying so lets the type checker see the
    # members that parse() iterates over and builds.
    _EnumMixin = enum.Enum
else:
    _EnumMixin = object

__all__ = [
    "DataType",
    "DataLayout",
    "ActivationFunction",
    "FilterType",
    "LayerFlags",
    "NDArrayFlags",
    "LearningPhase",
    "APPLE_CONSTANTS",
    "apple_name",
]


class _Parse(_EnumMixin):
    """Mixin: build a member from itself, its raw value or its name (any case)."""

    @classmethod
    def parse(cls, value: object, where: str | None = None) -> Self:
        """Return the member for ``value`` (a member, a raw integer, or a name string)."""
        where = where or cls.__name__
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().replace("-", "_").replace(" ", "_").lower()
            for member in cls:
                if member.name.lower() == key:
                    return member
            names = ", ".join(m.name for m in cls)
            raise InvalidParameterError(must_be(where, f"one of {names}", value))
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            try:
                return cls(int(value))
            except ValueError:
                pass
        raise InvalidParameterError(must_be(where, f"a {cls.__name__} member, raw value or name", value))


class DataType(_Parse, enum.IntEnum):
    """``BNNSDataType``: element types of BNNS arrays."""

    float16 = 0x10010
    float32 = 0x10020
    bfloat16 = 0x18010
    int8 = 0x20008
    int32 = 0x20020
    uint8 = 0x40008

    @property
    def numpy_dtype(self) -> np.dtype:
        """The NumPy dtype with the same layout (``bfloat16`` has none and raises)."""
        if self is DataType.bfloat16:
            raise DTypeError("DataType.bfloat16 has no NumPy dtype; convert the data to float32.")
        return np.dtype(self.name)

    @classmethod
    def from_numpy(cls, dtype: DTypeLike) -> "DataType":
        """The BNNS data type of a NumPy dtype (float64 has none: BNNS does not support it)."""
        name = np.dtype(dtype).name
        if name not in cls.__members__:
            supported = ", ".join(m.name for m in cls if m is not cls.bfloat16)
            raise DTypeError(must_be("dtype", f"one BNNS supports ({supported})", name))
        return cls[name]


class DataLayout(_Parse, enum.IntEnum):
    """``BNNSDataLayout``: how an n-dimensional array is laid out."""

    vector = 0x10000
    last_major_1d = 0x18000
    first_major_1d = 0x18001
    row_major_matrix = 0x20000
    column_major_matrix = 0x20001
    last_major_2d = 0x28000
    first_major_2d = 0x28001
    image_chw = 0x30000
    sne = 0x30001
    nse = 0x30002
    last_major_3d = 0x38000
    first_major_3d = 0x38001
    last_major_4d = 0x48000
    first_major_4d = 0x48001

    @property
    def rank(self) -> int:
        """Number of dimensions (``BNNSDataLayoutGetRank``), the high 16 bits of the value."""
        return int(self) >> 16


class ActivationFunction(_Parse, enum.IntEnum):
    """``BNNSActivationFunction``: numbered as in BNNS."""

    identity = 0
    relu = 1
    leaky_relu = 2
    sigmoid = 3
    tanh = 4
    scaled_tanh = 5
    abs = 6
    linear = 7
    clamp = 8
    integer_linear_saturate = 9
    integer_linear_saturate_per_channel = 10
    softmax = 11
    gelu_approximation = 12
    gumbel = 13
    gumbel_max = 14
    hard_sigmoid = 15
    softplus = 16
    softsign = 17
    elu = 18
    clamped_leaky_relu = 19
    linear_with_bias = 20
    log_softmax = 21
    log_sigmoid = 22
    selu = 23
    celu = 24
    hard_shrink = 25
    soft_shrink = 26
    tanh_shrink = 27
    threshold = 28
    prelu_per_channel = 29
    hard_swish = 30
    silu = 31
    relu6 = 32
    erf = 33
    gelu = 34
    gelu_approximation_sigmoid = 35

    @property
    def is_elementwise(self) -> bool:
        """True when the function maps each element on its own, deterministically."""
        return self not in _NOT_ELEMENTWISE


_NOT_ELEMENTWISE = frozenset(
    {
        ActivationFunction.integer_linear_saturate,
        ActivationFunction.integer_linear_saturate_per_channel,
        ActivationFunction.softmax,
        ActivationFunction.gumbel,
        ActivationFunction.gumbel_max,
        ActivationFunction.log_softmax,
        ActivationFunction.prelu_per_channel,
    }
)


class FilterType(_Parse, enum.IntEnum):
    """``BNNSFilterType``: the layer kinds that take a ``BNNSLayerParameters*`` structure."""

    convolution = 0
    fully_connected = 1
    batch_norm = 2
    instance_norm = 3
    layer_norm = 4
    group_norm = 5
    transposed_convolution = 6
    quantization = 7
    arithmetic = 8


class LayerFlags(_Parse, enum.IntFlag):
    """``BNNSLayerFlags`` of the LSTM layer parameters."""

    none = 0
    lstm_bidirectional = 0x1
    lstm_default_activations = 0x2


class NDArrayFlags(_Parse, enum.IntFlag):
    """``BNNSNDArrayFlags``: how a delta (gradient) buffer is written."""

    backprop_set = 0
    backprop_accumulate = 1


class LearningPhase(_Parse, enum.IntEnum):
    """``BNNSLearningPhase``: training uses batch statistics, inference the moving ones."""

    training = 0
    inference = 1

# ------------------------------------------------------------------ Apple's names ------
# Apple's constant names, spelled as bnns_constants.h spells them, as aliases of the members,
# so that code ported from C reads the same (``bnnsfw.bnns`` exports them). BNNSLearningPhase
# has none: the C functions take a ``bool training``.

# DataType
BNNSDataTypeFloat16 = DataType.float16
BNNSDataTypeFloat32 = DataType.float32
BNNSDataTypeBFloat16 = DataType.bfloat16
BNNSDataTypeInt8 = DataType.int8
BNNSDataTypeInt32 = DataType.int32
BNNSDataTypeUInt8 = DataType.uint8
# DataLayout
BNNSDataLayoutVector = DataLayout.vector
BNNSDataLayout1DLastMajor = DataLayout.last_major_1d
BNNSDataLayout1DFirstMajor = DataLayout.first_major_1d
BNNSDataLayoutRowMajorMatrix = DataLayout.row_major_matrix
BNNSDataLayoutColumnMajorMatrix = DataLayout.column_major_matrix
BNNSDataLayout2DLastMajor = DataLayout.last_major_2d
BNNSDataLayout2DFirstMajor = DataLayout.first_major_2d
BNNSDataLayoutImageCHW = DataLayout.image_chw
BNNSDataLayoutSNE = DataLayout.sne
BNNSDataLayoutNSE = DataLayout.nse
BNNSDataLayout3DLastMajor = DataLayout.last_major_3d
BNNSDataLayout3DFirstMajor = DataLayout.first_major_3d
BNNSDataLayout4DLastMajor = DataLayout.last_major_4d
BNNSDataLayout4DFirstMajor = DataLayout.first_major_4d
# ActivationFunction
BNNSActivationFunctionIdentity = ActivationFunction.identity
BNNSActivationFunctionRectifiedLinear = ActivationFunction.relu
BNNSActivationFunctionLeakyRectifiedLinear = ActivationFunction.leaky_relu
BNNSActivationFunctionSigmoid = ActivationFunction.sigmoid
BNNSActivationFunctionTanh = ActivationFunction.tanh
BNNSActivationFunctionScaledTanh = ActivationFunction.scaled_tanh
BNNSActivationFunctionAbs = ActivationFunction.abs
BNNSActivationFunctionLinear = ActivationFunction.linear
BNNSActivationFunctionClamp = ActivationFunction.clamp
BNNSActivationFunctionIntegerLinearSaturate = ActivationFunction.integer_linear_saturate
BNNSActivationFunctionIntegerLinearSaturatePerChannel = ActivationFunction.integer_linear_saturate_per_channel
BNNSActivationFunctionSoftmax = ActivationFunction.softmax
BNNSActivationFunctionGELUApproximation = ActivationFunction.gelu_approximation
BNNSActivationFunctionGumbel = ActivationFunction.gumbel
BNNSActivationFunctionGumbelMax = ActivationFunction.gumbel_max
BNNSActivationFunctionHardSigmoid = ActivationFunction.hard_sigmoid
BNNSActivationFunctionSoftplus = ActivationFunction.softplus
BNNSActivationFunctionSoftsign = ActivationFunction.softsign
BNNSActivationFunctionELU = ActivationFunction.elu
BNNSActivationFunctionClampedLeakyRectifiedLinear = ActivationFunction.clamped_leaky_relu
BNNSActivationFunctionLinearWithBias = ActivationFunction.linear_with_bias
BNNSActivationFunctionLogSoftmax = ActivationFunction.log_softmax
BNNSActivationFunctionLogSigmoid = ActivationFunction.log_sigmoid
BNNSActivationFunctionSELU = ActivationFunction.selu
BNNSActivationFunctionCELU = ActivationFunction.celu
BNNSActivationFunctionHardShrink = ActivationFunction.hard_shrink
BNNSActivationFunctionSoftShrink = ActivationFunction.soft_shrink
BNNSActivationFunctionTanhShrink = ActivationFunction.tanh_shrink
BNNSActivationFunctionThreshold = ActivationFunction.threshold
BNNSActivationFunctionPReLUPerChannel = ActivationFunction.prelu_per_channel
BNNSActivationFunctionHardSwish = ActivationFunction.hard_swish
BNNSActivationFunctionGELUApproximation2 = ActivationFunction.hard_swish
BNNSActivationFunctionSiLU = ActivationFunction.silu
BNNSActivationFunctionReLU6 = ActivationFunction.relu6
BNNSActivationFunctionErf = ActivationFunction.erf
BNNSActivationFunctionGELU = ActivationFunction.gelu
BNNSActivationFunctionGELUApproximationSigmoid = ActivationFunction.gelu_approximation_sigmoid
# FilterType
BNNSConvolution = FilterType.convolution
BNNSFullyConnected = FilterType.fully_connected
BNNSBatchNorm = FilterType.batch_norm
BNNSInstanceNorm = FilterType.instance_norm
BNNSLayerNorm = FilterType.layer_norm
BNNSGroupNorm = FilterType.group_norm
BNNSTransposedConvolution = FilterType.transposed_convolution
BNNSQuantization = FilterType.quantization
BNNSArithmetic = FilterType.arithmetic
# LayerFlags
BNNSLayerFlagsLSTMBidirectional = LayerFlags.lstm_bidirectional
BNNSLayerFlagsLSTMDefaultActivations = LayerFlags.lstm_default_activations
# NDArrayFlags
BNNSNDArrayFlagBackpropSet = NDArrayFlags.backprop_set
BNNSNDArrayFlagBackpropAccumulate = NDArrayFlags.backprop_accumulate


#: Every alias above, by name, in the header's order.
APPLE_CONSTANTS: dict[str, enum.Enum] = {
    name: value for name, value in list(globals().items()) if name.startswith("BNNS")}

# One name per member (the first, where the header gives two: BNNSActivationFunctionHardSwish
# before its alias BNNSActivationFunctionGELUApproximation2), keyed by class and value: an
# IntEnum member equals the members of other enums with its number.
_APPLE_NAMES: dict[tuple[type, int], str] = {}
for _name, _member in APPLE_CONSTANTS.items():
    _APPLE_NAMES.setdefault((type(_member), _member.value), _name)
del _name, _member


def apple_name(kind: type[enum.Enum], value: object) -> str:
    """Apple's name of ``value``, a ``kind`` member or its raw number (``BNNSDataLayoutSNE``);
    a number that names no member is written as it is (hexadecimal from 16 on)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        number = int(value)
        name = _APPLE_NAMES.get((kind, number))
        if name is not None:
            return name
        return f"{number:#x}" if number >= 16 else str(number)
    return repr(value)

import enum

import numpy as np
import pytest

import bnnsfw as bf


def test_raw_values_match_bnns_headers():
    assert bf.DataType.float32 == 0x10020 and bf.DataType.float16 == 0x10010
    assert bf.DataType.bfloat16 == 0x18010 and bf.DataType.int8 == 0x20008
    assert bf.DataType.int32 == 0x20020 and bf.DataType.uint8 == 0x40008
    assert bf.DataLayout.vector == 0x10000 and bf.DataLayout.row_major_matrix == 0x20000
    assert bf.DataLayout.column_major_matrix == 0x20001 and bf.DataLayout.image_chw == 0x30000
    assert bf.DataLayout.sne == 0x30001 and bf.DataLayout.nse == 0x30002
    assert bf.DataLayout.last_major_3d == 0x38000 and bf.DataLayout.first_major_4d == 0x48001
    assert [bf.FilterType(i).name for i in range(9)] == [
        "convolution", "fully_connected", "batch_norm", "instance_norm", "layer_norm",
        "group_norm", "transposed_convolution", "quantization", "arithmetic"]
    assert bf.LayerFlags.lstm_bidirectional == 0x1 and bf.LayerFlags.lstm_default_activations == 0x2
    assert bf.NDArrayFlags.backprop_set == 0 and bf.NDArrayFlags.backprop_accumulate == 1
    assert bf.ActivationFunction.gelu == 34 and bf.ActivationFunction.silu == 31
    assert bf.ActivationFunction.gelu_approximation_sigmoid == 35


def test_layout_rank():
    assert bf.DataLayout.vector.rank == 1
    assert bf.DataLayout.column_major_matrix.rank == 2
    assert bf.DataLayout.sne.rank == 3
    assert bf.DataLayout.last_major_1d.rank == 1 and bf.DataLayout.last_major_4d.rank == 4


@pytest.mark.parametrize("value", ["training", "Training", 0, bf.LearningPhase.training])
def test_learning_phase_parses_names_and_numbers(value):
    assert bf.LearningPhase.parse(value) is bf.LearningPhase.training


def test_parse_rejects_unknown_with_choices():
    with pytest.raises(bf.InvalidParameterError,
                       match=r"LearningPhase must be one of training, inference; got 'train'"):
        bf.LearningPhase.parse("train")
    with pytest.raises(bf.InvalidParameterError, match="got 7"):
        bf.LearningPhase.parse(7)
    with pytest.raises(bf.InvalidParameterError):
        bf.LearningPhase.parse(True)


def test_data_type_numpy_round_trip():
    assert bf.DataType.from_numpy(np.float32) is bf.DataType.float32
    assert bf.DataType.float32.numpy_dtype == np.float32
    with pytest.raises(bf.DTypeError, match="float64"):
        bf.DataType.from_numpy(np.float64)
    with pytest.raises(bf.DTypeError, match="bfloat16"):
        bf.DataType.bfloat16.numpy_dtype


def test_elementwise_classification():
    not_elementwise = {9, 10, 11, 13, 14, 21, 29}
    for f in bf.ActivationFunction:
        assert f.is_elementwise == (int(f) not in not_elementwise)


#: A sample of Apple's constants with the values bnns_constants.h gives them.
APPLE_VALUES = {
    "BNNSDataTypeFloat16": 0x10010, "BNNSDataTypeFloat32": 0x10020, "BNNSDataTypeBFloat16": 0x18010,
    "BNNSDataTypeInt8": 0x20008, "BNNSDataTypeInt32": 0x20020, "BNNSDataTypeUInt8": 0x40008,
    "BNNSDataLayoutVector": 0x10000, "BNNSDataLayout1DLastMajor": 0x18000,
    "BNNSDataLayoutRowMajorMatrix": 0x20000, "BNNSDataLayoutColumnMajorMatrix": 0x20001,
    "BNNSDataLayout2DLastMajor": 0x28000, "BNNSDataLayoutImageCHW": 0x30000, "BNNSDataLayoutSNE": 0x30001,
    "BNNSDataLayoutNSE": 0x30002, "BNNSDataLayout3DFirstMajor": 0x38001, "BNNSDataLayout4DLastMajor": 0x48000,
    "BNNSActivationFunctionIdentity": 0, "BNNSActivationFunctionRectifiedLinear": 1,
    "BNNSActivationFunctionSigmoid": 3, "BNNSActivationFunctionTanh": 4,
    "BNNSActivationFunctionGELUApproximation2": 30, "BNNSActivationFunctionHardSwish": 30,
    "BNNSActivationFunctionSiLU": 31, "BNNSActivationFunctionGELU": 34,
    "BNNSBatchNorm": 2, "BNNSGroupNorm": 5, "BNNSArithmetic": 8,
    "BNNSLayerFlagsLSTMBidirectional": 0x1, "BNNSLayerFlagsLSTMDefaultActivations": 0x2,
    "BNNSNDArrayFlagBackpropSet": 0, "BNNSNDArrayFlagBackpropAccumulate": 1,
}


def test_apples_constant_names_are_the_members():
    from bnnsfw import bnns, enums

    for name, value in APPLE_VALUES.items():
        member = getattr(bnns, name)
        assert isinstance(member, enum.Enum) and member == value, name
        assert name in bnns.__all__ and getattr(bf, name) is member  # reachable from the package too
    assert bnns.BNNSDataLayoutSNE is bf.DataLayout.sne and bnns.BNNSDataTypeFloat32 is bf.DataType.float32
    assert bnns.BNNSLayerFlagsLSTMBidirectional is bf.LayerFlags.lstm_bidirectional
    # every member has its name, and every name exported by bnnsfw.bnns is a member's
    for kind in (bf.DataType, bf.DataLayout, bf.ActivationFunction, bf.FilterType, bf.NDArrayFlags):
        for member in kind:
            assert enums.apple_name(kind, member).startswith("BNNS"), member
    for name, member in enums.APPLE_CONSTANTS.items():
        assert getattr(bnns, name) is member and name in bnns.__all__
    assert enums.apple_name(bf.DataLayout, 0x30001) == "BNNSDataLayoutSNE"
    assert enums.apple_name(bf.ActivationFunction, 30) == "BNNSActivationFunctionHardSwish"
    assert enums.apple_name(bf.DataType, 0) == "0" and enums.apple_name(bf.DataType, 0x20010) == "0x20010"
    assert enums.apple_name(bf.DataType, 2) != enums.apple_name(bf.FilterType, 2)  # equal numbers apart

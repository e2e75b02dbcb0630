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

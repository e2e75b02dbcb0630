"""BFloat16 where Apple declares it: the deltas of BNNSNormalizationFilterApplyBackwardBatch.

The conversions are checked bit for bit against ``ml_dtypes`` over every BFloat16 pattern and
over float32 values chosen to be hard (ties, NaN payloads, subnormals, the largest finite
values); the C-style backward's BFloat16 results against the float32 path's, rounded.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import _bfloat16 as bf16
from bnnsfw import bnns
from bnnsfw.bnns import BNNSNDArrayDescriptor as Desc
from bnnsfw.layers.lstm import LSTMLayer, LSTMParameters

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

F32 = np.float32
U16 = np.uint16
BF16 = np.dtype(ml_dtypes.bfloat16)


def reference_narrow(values: np.ndarray) -> np.ndarray:
    """ml_dtypes' rounding of float32 ``values``, as bits (it warns for NaN: quietened here)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(values, F32).astype(BF16).view(U16)


def hard_float32(rng: np.random.Generator) -> np.ndarray:
    """Float32 values whose rounding is easy to get wrong, and random ones."""
    high = rng.integers(0, 2**16, 200_000, dtype=np.uint32) << 16
    parts = [
        rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32),   # any pattern
        high | 0x8000,                                                      # ties: to even
        high | 0x7FFF, high | 0x8001,                                       # either side of a tie
        (rng.integers(0, 2, 100_000, dtype=np.uint32) << 31) | 0x7F800000
        | rng.integers(1, 2**23, 100_000, dtype=np.uint32),                 # NaN payloads, both signs
        rng.integers(0, 2**23, 100_000, dtype=np.uint32),                   # positive subnormals
        rng.integers(0, 2**23, 100_000, dtype=np.uint32) | 0x80000000,      # negative subnormals
        np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                  0x007FFFFF, 0x00008000, 0x00018000, 0x7FC00000, 0x7F800001, 0x7F80FFFF, 0x7FFFFFFF,
                  0xFFFFFFFF, 0x7F818000], np.uint32),
    ]
    return np.concatenate(parts).view(F32)


def test_every_bfloat16_pattern_widens_as_ml_dtypes_does():
    bits = np.arange(2**16, dtype=U16)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        ours = bf16.to_float32(bits)
    with np.errstate(invalid="ignore"):
        theirs = bits.view(BF16).astype(F32)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    # and back: every pattern but a NaN is its own rounding; a NaN stays a NaN of its sign
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        back = bf16.from_float32(ours)
    nan = np.isnan(ours)
    np.testing.assert_array_equal(back[~nan], bits[~nan])
    np.testing.assert_array_equal(back, reference_narrow(ours))
    assert np.isnan(bf16.to_float32(back[nan])).all()


def test_float32_values_round_to_nearest_even_as_ml_dtypes_does():
    values = hard_float32(np.random.default_rng(2026))
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")  # the suite's -W error, and no floating-point flag raised either
        ours = bf16.from_float32(values)
    np.testing.assert_array_equal(ours, reference_narrow(values))
    nan = np.isnan(values)
    assert np.isnan(bf16.to_float32(ours[nan])).all()  # NaN stays NaN (the plain bit trick fails here)
    plain = ((values.view(np.uint32).astype(np.uint64) + 0x7FFF
              + ((values.view(np.uint32) >> 16) & 1)) >> 16).astype(U16)
    assert np.isinf(bf16.to_float32(plain[nan])).any()  # …which is why NaN is handled apart


def test_shapes_and_strided_values_are_kept():
    values = np.arange(12, dtype=F32).reshape(3, 4)[:, ::2] + F32(0.5)
    bits = bf16.from_float32(values)
    assert bits.shape == (3, 2) and bits.dtype == U16
    np.testing.assert_array_equal(bf16.to_float32(bits), values)


# ------------------------------------------------------------------ the C-style backward ---

SHAPE = (4, 2, 3)
ACCUMULATE = int(bf.NDArrayFlags.backprop_accumulate)
GUARD = 4


def make_filter(kind: str, backend: str) -> bnns.BNNSFilter:
    sample = Desc.shape_only(SHAPE, "image_chw")
    params = bnns.BNNSLayerParametersNormalization(
        i_desc=sample, o_desc=sample, epsilon=1e-3, num_groups=2, normalization_axis=1,
        activation=bnns.BNNSActivation(function="tanh"))
    with bf.use_backend(backend):
        f = bnns.BNNSFilterCreateLayerNormalization(getattr(bf.FilterType, kind), params, None)
    assert f is not None
    return f


def guarded_bits(count: int, fill: int = 0xABCD) -> tuple[np.ndarray, np.ndarray]:
    """A uint16 buffer of ``count`` elements between guard regions: (backing, buffer)."""
    backing = np.full(GUARD + count + GUARD, fill, U16)
    return backing, backing[GUARD:GUARD + count]


@pytest.mark.parametrize("kind", ["batch_norm", "layer_norm", "group_norm"])
def test_bfloat16_deltas_are_the_float32_paths_rounded(kind: str, backend_name: str) -> None:
    """Each delta in BFloat16 (dy as an ml_dtypes array; dx in the raw bits of a strided
    buffer, accumulating; gamma accumulating in a bytearray exactly large enough; beta
    overwritten): every result is the round-to-nearest-even of the float32 call's, bit for bit,
    and nothing outside the described elements is touched."""
    rng = np.random.default_rng(11)
    n = 3
    x = rng.standard_normal((n, *SHAPE)).astype(F32)
    dy16 = rng.standard_normal((n, *SHAPE)).astype(F32).astype(BF16)
    dy = dy16.astype(F32)                                                     # exact
    affine = SHAPE[1:] if kind == "layer_norm" else (SHAPE[0],)
    layout = "row_major_matrix" if len(affine) == 2 else "vector"
    gamma_start = bf16.from_float32(rng.standard_normal(affine).astype(F32))
    dx_start = bf16.from_float32(rng.standard_normal((n, *SHAPE)).astype(F32))
    sizes = tuple(reversed(SHAPE))
    sample = int(np.prod(SHAPE))

    # the float32 path: the same values, float32 descriptors
    f32 = make_filter(kind, backend_name)
    y = np.zeros(n * sample, F32)
    assert bnns.BNNSNormalizationFilterApplyBatch(f32, n, x.ravel(), 0, y, 0, True) == 0
    dx32 = bf16.to_float32(dx_start).ravel().copy()
    gamma32 = bf16.to_float32(gamma_start).copy()
    beta32 = np.zeros(affine, F32)
    assert bnns.BNNSNormalizationFilterApplyBackwardBatch(
        f32, n, Desc(layout="image_chw", size=sizes, data=dx32, flags=ACCUMULATE), 0, y, 0,
        Desc(layout="image_chw", size=sizes, data=dy.ravel().copy()), 0,
        Desc.from_array(beta32, layout), Desc.from_array(gamma32, layout, flags=ACCUMULATE)) == 0

    # the BFloat16 call
    f16 = make_filter(kind, backend_name)
    y16 = np.zeros(n * sample, F32)
    assert bnns.BNNSNormalizationFilterApplyBatch(f16, n, x.ravel(), 0, y16, 0, True) == 0
    np.testing.assert_array_equal(y16, y)
    # dx: samples 5 elements apart, every element 2 apart (strides in elements of 2 bytes)
    strides = (2, 2 * SHAPE[2], 2 * SHAPE[2] * SHAPE[1])
    span = 1 + sum((e - 1) * s for e, s in zip(sizes, strides))
    batch_stride = span + 5
    dx_backing, dx_buf = guarded_bits((n - 1) * batch_stride + span)
    dx_view = np.lib.stride_tricks.as_strided(
        dx_buf, (n, *SHAPE), tuple(2 * s for s in (batch_stride, *reversed(strides))))
    dx_view[...] = dx_start
    gamma_buf = bytearray(gamma_start.tobytes())                             # exactly large enough
    beta_bits = np.full(affine, 0x1234, U16)
    before = dx_backing.copy()
    dy16_before = dy16.copy()
    assert bnns.BNNSNormalizationFilterApplyBackwardBatch(
        f16, n,
        Desc(layout="image_chw", size=sizes, stride=strides, data=dx_buf, data_type="bfloat16",
             flags=ACCUMULATE), batch_stride,
        y16, 0,
        Desc(layout="image_chw", size=sizes, data=dy16.reshape(-1), data_type=bnns.BNNSDataTypeBFloat16), 0,
        Desc.from_array(beta_bits, layout, data_type=bnns.BNNSDataTypeBFloat16),
        Desc(layout=layout, size=tuple(reversed(affine)), data=gamma_buf, data_type="bfloat16",
             flags=ACCUMULATE)) == 0
    np.testing.assert_array_equal(dx_view.reshape(-1), bf16.from_float32(dx32))   # read, add, round once
    np.testing.assert_array_equal(np.frombuffer(gamma_buf, U16).reshape(affine), bf16.from_float32(gamma32))
    np.testing.assert_array_equal(beta_bits, bf16.from_float32(beta32))
    assert dy16.view(U16).tobytes() == dy16_before.view(U16).tobytes()  # an input: not modified
    touched = dx_backing != before
    assert touched.sum() <= n * sample
    np.testing.assert_array_equal(dx_backing[:GUARD], before[:GUARD])
    np.testing.assert_array_equal(dx_backing[-GUARD:], before[-GUARD:])
    gaps = np.ones(dx_backing.size, bool)
    gaps[GUARD:GUARD + dx_buf.size] = False
    offsets = (np.arange(n)[:, None] * batch_stride + np.array(
        [sum(i * s for i, s in zip(index, strides)) for index in np.ndindex(*sizes)])).ravel()
    gaps[GUARD + offsets] = True
    np.testing.assert_array_equal(dx_backing[~gaps], before[~gaps])  # between the elements: untouched


def test_a_bfloat16_buffer_one_element_short_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    f = make_filter("batch_norm", "numpy")
    n = 2
    x = np.random.default_rng(0).standard_normal((n, *SHAPE)).astype(F32)
    y = np.zeros(x.size, F32)
    assert bnns.BNNSNormalizationFilterApplyBatch(f, n, x.ravel(), 0, y, 0, True) == 0
    dy = Desc(layout="image_chw", size=tuple(reversed(SHAPE)), data=np.zeros(x.size, F32))
    channels = SHAPE[0]
    for data, ok, message in (
            (bytearray(2 * channels), True, None),
            (bytearray(2 * channels - 2), False,
             "gamma_delta.data must be at least 4 elements for sizes (4,), strides (1,); got '3 elements'."),
            (bytearray(2 * channels + 1), False,
             "gamma_delta.data must be a whole number of bfloat16 elements (2 bytes each); got '9 bytes'."),
            (np.zeros(channels, F32), False,
             "gamma_delta.data must be an array of ml_dtypes.bfloat16, or of uint16 holding the bits"),
    ):
        caplog.clear()
        gamma = Desc(layout="vector", size=(channels,), data=data, data_type="bfloat16")
        result = bnns.BNNSNormalizationFilterApplyBackwardBatch(f, n, None, 0, y, 0, dy, 0, None, gamma)
        assert result == (0 if ok else -1), caplog.text
        if message:
            assert message in caplog.text


@pytest.mark.parametrize("data_type", ["float16", "int8", 0])
def test_other_types_for_the_deltas_name_the_declared_ones(data_type, caplog):
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    f = make_filter("layer_norm", "numpy")
    x = np.ones((1, *SHAPE), F32)
    y = np.zeros(x.size, F32)
    assert bnns.BNNSNormalizationFilterApplyBatch(f, 1, x.ravel(), 0, y, 0, True) == 0
    dy = Desc(layout="image_chw", size=tuple(reversed(SHAPE)), data=np.zeros(x.size, U16),
              data_type=data_type)
    assert bnns.BNNSNormalizationFilterApplyBackwardBatch(f, 1, None, 0, y, 0, dy, 0, None, None) == -1
    assert "out_delta.data_type must be BNNSDataTypeFloat32 or BNNSDataTypeBFloat16; got " in caplog.text


def test_bfloat16_elsewhere_is_refused_naming_the_declared_type(caplog, rng):
    """Only the backward's deltas take BFloat16: a BFloat16 gamma, input or LSTM weight is
    refused with the type the C-style API takes there."""
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    sample = Desc.shape_only((2, 3), "row_major_matrix")
    gamma = Desc.from_array(np.ones(2, BF16))
    assert gamma.data_type is bf.DataType.bfloat16
    params = bnns.BNNSLayerParametersNormalization(i_desc=sample, o_desc=sample, gamma_desc=gamma)
    assert bnns.BNNSFilterCreateLayerNormalization(bnns.BNNSBatchNorm, params, None) is None
    assert "layer_params.gamma_desc.data_type must be BNNSDataTypeFloat32; got BNNSDataTypeBFloat16." \
        in caplog.text
    caplog.clear()
    p = LSTMParameters.random(input_size=2, hidden_size=2, seed=0)
    gates = {name: bnns.BNNSLSTMGateDescriptor(iw_desc=(Desc.from_array(g.input_weights[0]), None),
                                               hw_desc=Desc.from_array(g.hidden_weights.astype(BF16)))
             for name, g in zip(("input_gate", "forget_gate", "candidate_gate", "output_gate"), p.gates)}
    lp = bnns.BNNSLayerParametersLSTM(
        input_size=2, hidden_size=2, batch_size=1, num_layers=1, seq_len=2,
        input_descriptor=bnns.BNNSLSTMDataDescriptor(
            data_desc=Desc.from_array(np.ones((2, 1, 2), F32), "sne")),
        **gates)
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, None, 0) == -1
    assert ("layer_params.input_gate.hw_desc.data_type must be BNNSDataTypeFloat32; "
            "got BNNSDataTypeBFloat16.") in caplog.text


def test_the_object_api_refuses_bfloat16_pointing_at_the_conversion():
    x16 = np.ones((2, 3), BF16)
    layer_norm = bf.NormalizationType.layer()
    layer = bf.NormalizationLayer(bf.NormalizationParameters(type=layer_norm, input_shape=(3,)))
    with pytest.raises(bf.DTypeError, match=r"NormalizationLayer.apply\(x\) must be a float32 array \(the "
                       r"layer's dtype\); convert bfloat16 data with \.astype\(np\.float32\); "
                       r"got 'bfloat16'"):
        layer.apply(x16)
    with pytest.raises(bf.DTypeError, match=r"convert bfloat16 data with \.astype\(np\.float32\)") as caught:
        bf.NormalizationParameters(type=layer_norm, input_shape=(3,), gamma=np.ones(3, BF16))
    assert "structured" not in str(caught.value)
    lstm = LSTMLayer(LSTMParameters.random(input_size=3, hidden_size=2, seed=0))
    with pytest.raises(bf.DTypeError, match=r"convert bfloat16 data with \.astype\(np\.float32\)"):
        lstm.apply(np.ones((2, 1, 3), BF16))
    np.testing.assert_array_equal(layer.apply(x16.astype(np.float32)), layer.apply(np.ones((2, 3), F32)))

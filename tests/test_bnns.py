"""The BNNS C-style API gives the object API's results, through BNNS-shaped descriptors."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import bnns
from bnnsfw.bnns import BNNSNDArrayDescriptor as Desc
from bnnsfw.layers.lstm import LSTMLayer, LSTMParameters
from bnnsfw.layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

F32 = np.float32


def desc(array: np.ndarray, layout=None, flags: int = 0) -> Desc:
    return Desc.from_array(np.ascontiguousarray(array, dtype=F32), layout, flags=flags)


def strided(array: np.ndarray, layout, pad: int = 3) -> tuple[Desc, np.ndarray]:
    """A descriptor whose innermost stride is ``pad`` elements: data spread over a larger buffer."""
    shape = array.shape
    sizes = tuple(reversed(shape))
    strides, step = [], pad
    for s in sizes:
        strides.append(step)
        step *= s
    buf = np.full(step + pad, np.nan, F32)
    view = np.lib.stride_tricks.as_strided(buf, shape=shape,
                                           strides=tuple(4 * s for s in reversed(strides)), writeable=True)
    view[...] = array
    return Desc(layout=layout, size=sizes, stride=tuple(strides), data=buf), buf


# ------------------------------------------------------------------ normalization ------

NORM_CASES = [
    ("batch_norm", NormalizationType.batch(moving_mean=np.zeros(4), moving_variance=np.ones(4)), {}),
    ("instance_norm", NormalizationType.instance(), {}),
    ("layer_norm", NormalizationType.layer(normalization_axis=1), {"normalization_axis": 1}),
    ("group_norm", NormalizationType.group(group_count=2), {"num_groups": 2}),
]


@pytest.mark.parametrize("filter_type, ntype, extra", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_normalization_matches_object_api(filter_type, ntype, extra, rng):
    n, shape = 3, (4, 2, 3)
    x = rng.standard_normal((n, *shape)).astype(F32)
    dy = rng.standard_normal((n, *shape)).astype(F32)
    affine = shape[1:] if filter_type == "layer_norm" else (4,)
    gamma = rng.uniform(0.5, 1.5, affine).astype(F32)
    beta = rng.standard_normal(affine).astype(F32)
    act = bf.Activation.tanh()
    reference = NormalizationLayer(NormalizationParameters(
        type=ntype, input_shape=shape, gamma=gamma, beta=beta, momentum=0.8, epsilon=1e-3, activation=act))
    y_ref = reference.apply(x, phase="training")
    g_ref = reference.apply_backward(x, dy, output=y_ref, phase="training")

    moving_mean, moving_var = np.zeros(4, F32), np.ones(4, F32)
    params = bnns.BNNSLayerParametersNormalization(
        i_desc=Desc.shape_only(shape, "image_chw"), o_desc=Desc.shape_only(shape, "image_chw"),
        gamma_desc=desc(gamma), beta_desc=desc(beta), momentum=0.8, epsilon=1e-3,
        activation=bnns.BNNSActivation(function="tanh"),
        moving_mean_desc=desc(moving_mean) if filter_type == "batch_norm" else None,
        moving_variance_desc=desc(moving_var) if filter_type == "batch_norm" else None, **extra)
    f = bnns.BNNSFilterCreateLayerNormalization(getattr(bf.FilterType, filter_type), params, None)
    assert f is not None
    sample = int(np.prod(shape))
    in_stride = sample + 5                       # samples 5 elements apart: not contiguous
    inp = np.zeros(n * in_stride, F32)
    for b in range(n):
        inp[b * in_stride:b * in_stride + sample] = x[b].ravel()
    out = np.zeros(n * sample, F32)
    assert bnns.BNNSNormalizationFilterApplyBatch(f, n, inp, in_stride, out, 0, True) == 0
    np.testing.assert_allclose(out.reshape(n, *shape), y_ref, rtol=1e-6, atol=1e-6)
    if filter_type == "batch_norm":
        np.testing.assert_allclose(params.moving_mean_desc.data, reference.moving_mean, rtol=1e-6)

    in_delta = np.zeros(n * sample, F32)
    beta_delta = Desc.from_array(np.zeros(affine, F32), "row_major_matrix" if len(affine) == 2 else None)
    gamma_delta = Desc.from_array(np.ones(affine, F32), "row_major_matrix" if len(affine) == 2 else None,
                                  flags=bf.NDArrayFlags.backprop_accumulate)
    assert bnns.BNNSNormalizationFilterApplyBackwardBatch(
        f, n, in_delta, 0, out, 0, dy.ravel().copy(), 0, beta_delta, gamma_delta) == 0
    np.testing.assert_allclose(in_delta.reshape(n, *shape), g_ref.input, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(beta_delta.data, g_ref.beta, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gamma_delta.data, 1 + g_ref.gamma, rtol=1e-5, atol=1e-6)  # accumulated
    bnns.BNNSFilterDestroy(f)
    assert bnns.BNNSNormalizationFilterApplyBatch(f, n, inp, in_stride, out, 0, True) == -1


def test_normalization_failures_return_none_or_minus_one_with_reason(caplog):
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    shape = (6, 2, 2)
    params = bnns.BNNSLayerParametersNormalization(
        i_desc=Desc.shape_only(shape, "image_chw"), o_desc=Desc.shape_only(shape, "image_chw"), num_groups=4)
    assert bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.group_norm, params, None) is None
    assert ("layer_params.num_groups must be a divisor of the 6 channels (layer_params.i_desc.size[2]); "
            "got 4") in caplog.text
    caplog.clear()
    params.num_groups = 3
    params.o_desc = Desc.shape_only((6, 2, 3), "image_chw")
    assert bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.group_norm, params, None) is None
    assert "o_desc.size" in caplog.text
    caplog.clear()
    params.o_desc = Desc.shape_only(shape, "image_chw")
    params.gamma_desc = Desc(layout="vector", size=(6,), data=np.ones(6, np.int8), data_type="int8")
    assert bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.group_norm, params, None) is None
    assert "gamma_desc.data_type must be BNNSDataTypeFloat32; got BNNSDataTypeInt8" in caplog.text
    params.gamma_desc = None
    params.i_desc = None
    assert bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.group_norm, params, None) is None
    assert "i_desc must be a BNNSNDArrayDescriptor" in caplog.text
    params.i_desc = Desc.shape_only(shape, "image_chw")
    f = bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.group_norm, params, None)
    caplog.clear()
    assert bnns.BNNSNormalizationFilterApplyBatch(f, 2, np.zeros(5, F32), 0, np.zeros(48, F32), 0, True) == -1
    assert "in.data must be at least 48 elements" in caplog.text
    caplog.clear()
    assert bnns.BNNSNormalizationFilterApplyBackwardBatch(f, 2, None, 0, None, 0, np.zeros(48, F32), 0,
                                                          None, None) == -1
    assert "applied forward before its backward" in caplog.text


def test_entry_points_warn_with_the_callers_line():
    shape = (2, 1, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        params = bnns.BNNSLayerParametersNormalization(i_desc=Desc.shape_only(shape, "image_chw"),
                                                       o_desc=Desc.shape_only(shape, "image_chw"))
        bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.instance_norm, params, None)
    messages = [(str(w.message), w.filename) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any("BNNSLayerParametersNormalization" in m and f.endswith("test_bnns.py") for m, f in messages)
    assert any("BNNSFilterCreateLayerNormalization" in m and "bnnsfw.NormalizationLayer" in m
               and f.endswith("test_bnns.py") for m, f in messages)


# ------------------------------------------------------------------ LSTM ---------------

GATES = ("input_gate", "forget_gate", "candidate_gate", "output_gate")


def lstm_params(p: LSTMParameters, n: int, t: int, x_desc: Desc, y_desc: Desc | None,
                h0: np.ndarray | None = None, c0: np.ndarray | None = None, outputs: dict | None = None,
                batch_sizes: np.ndarray | None = None) -> bnns.BNNSLayerParametersLSTM:
    gates = {}
    for name, g in zip(GATES, p.gates):
        iw0, iw1 = g.input_weights
        gates[name] = bnns.BNNSLSTMGateDescriptor(
            iw_desc=(desc(iw0), desc(iw1) if iw1 is not None else None), hw_desc=desc(g.hidden_weights),
            cw_desc=None if g.cell_weights is None else desc(g.cell_weights),
            b_desc=None if g.bias is None else desc(g.bias))
    states = (p.num_layers * p.num_directions, n, p.hidden_size)
    outputs = outputs if outputs is not None else {}
    return bnns.BNNSLayerParametersLSTM(
        input_size=p.input_size, hidden_size=p.hidden_size, batch_size=n, num_layers=p.num_layers, seq_len=t,
        dropout=p.dropout, lstm_flags=int(bf.LayerFlags.lstm_bidirectional) if p.bidirectional else 0,
        sequence_descriptor=None if batch_sizes is None else Desc(
            layout="vector", size=(t,), data=batch_sizes.astype(np.int32), data_type="int32"),
        input_descriptor=bnns.BNNSLSTMDataDescriptor(
            data_desc=x_desc, hidden_desc=None if h0 is None else desc(h0),
            cell_state_desc=None if c0 is None else desc(c0)),
        output_descriptor=bnns.BNNSLSTMDataDescriptor(
            data_desc=y_desc, hidden_desc=desc(outputs.setdefault("h", np.zeros(states, F32))),
            cell_state_desc=desc(outputs.setdefault("c", np.zeros(states, F32)))),
        **gates)


LSTM_CASES = [
    dict(num_layers=1, bidirectional=False, peepholes=None, layout="sne", lengths=False),
    dict(num_layers=2, bidirectional=True, peepholes="full", layout="sne", lengths=True),
    dict(num_layers=2, bidirectional=False, peepholes="diagonal", layout="nse", lengths=False),
    dict(num_layers=2, bidirectional=True, peepholes=None, layout="nse", lengths=True),
]


@pytest.mark.parametrize("case", LSTM_CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_lstm_matches_object_api(case, rng):
    t, n, i, h = 5, 3, 4, 3
    batch_first = case["layout"] == "nse"
    p = LSTMParameters.random(input_size=i, hidden_size=h, num_layers=case["num_layers"],
                              bidirectional=case["bidirectional"], peepholes=case["peepholes"], seed=3,
                              batch_first=batch_first)
    d = p.num_directions
    x = rng.standard_normal((n, t, i) if batch_first else (t, n, i)).astype(F32)
    h0 = rng.standard_normal((case["num_layers"] * d, n, h)).astype(F32)
    c0 = rng.standard_normal((case["num_layers"] * d, n, h)).astype(F32)
    lengths = np.array([5, 3, 2]) if case["lengths"] else None
    batch_sizes = None if lengths is None else np.array([(lengths > s).sum() for s in range(t)])
    dy = rng.standard_normal((n, t, d * h) if batch_first else (t, n, d * h)).astype(F32)
    dht = rng.standard_normal(h0.shape).astype(F32)

    layer = LSTMLayer(p)
    ref = layer.apply(x, hidden=h0, cell=c0, sequence_lengths=lengths, training=True)
    ref_g = layer.apply_backward(x, dy, hidden=h0, cell=c0, hidden_gradient=dht, sequence_lengths=lengths,
                                 training_cache=ref.training_cache)

    x_desc, _ = strided(x, case["layout"])           # non-contiguous input descriptor
    y_buf = np.zeros(((n, t, d * h) if batch_first else (t, n, d * h)), F32)
    outputs: dict = {}
    lp = lstm_params(p, n, t, x_desc, desc(y_buf, case["layout"]), h0, c0, outputs, batch_sizes)
    capacity = bnns.BNNSComputeLSTMTrainingCacheCapacity(lp)
    assert capacity == layer.training_cache_capacity(batch_size=n, seq_len=t)
    cache = np.zeros(capacity, np.uint8)
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, cache, capacity) == 0
    np.testing.assert_allclose(y_buf, ref.output, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(outputs["h"], ref.hidden, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(outputs["c"], ref.cell, rtol=1e-6, atol=1e-6)

    # the delta structure: dy and dh_T in its output descriptor, dx/dh0/dc0 and gate deltas out
    dx_desc, dx_buf = strided(np.zeros_like(x), case["layout"], pad=2)
    states = h0.shape
    delta_gates = {}
    for name, g in zip(GATES, p.gates):
        iw0, iw1 = g.input_weights
        delta_gates[name] = bnns.BNNSLSTMGateDescriptor(
            iw_desc=(desc(np.zeros_like(iw0)), None if iw1 is None else desc(np.zeros_like(iw1))),
            hw_desc=desc(np.zeros_like(g.hidden_weights)),
            cw_desc=None if g.cell_weights is None else desc(np.zeros_like(g.cell_weights)),
            b_desc=desc(np.ones_like(g.bias), flags=bf.NDArrayFlags.backprop_accumulate))
    dlp = bnns.BNNSLayerParametersLSTM(
        input_size=i, hidden_size=h, batch_size=n, num_layers=p.num_layers, seq_len=t,
        input_descriptor=bnns.BNNSLSTMDataDescriptor(data_desc=dx_desc, hidden_desc=desc(np.zeros(states)),
                                                     cell_state_desc=desc(np.zeros(states))),
        output_descriptor=bnns.BNNSLSTMDataDescriptor(data_desc=desc(dy, case["layout"]),
                                                      hidden_desc=desc(dht),
                                                      cell_state_desc=None),
        **delta_gates)
    assert bnns.BNNSDirectApplyLSTMBatchBackward(lp, dlp, None, cache, capacity) == 0
    dx = np.lib.stride_tricks.as_strided(dx_buf, shape=x.shape,
                                         strides=tuple(np.array(dx_desc.stride[:3][::-1]) * 4))
    np.testing.assert_allclose(dx, ref_g.input, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dlp.input_descriptor.hidden_desc.data, ref_g.hidden, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dlp.input_descriptor.cell_state_desc.data, ref_g.cell, rtol=1e-5, atol=1e-6)
    for name in GATES:
        got, want = delta_gates[name], getattr(ref_g, name)
        np.testing.assert_allclose(got.iw_desc[0].data, want.input_weights[0], rtol=1e-5, atol=1e-5)
        if want.input_weights[1] is not None:
            np.testing.assert_allclose(got.iw_desc[1].data, want.input_weights[1], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got.hw_desc.data, want.hidden_weights, rtol=1e-5, atol=1e-5)
        if want.cell_weights is not None:
            np.testing.assert_allclose(got.cw_desc.data, want.cell_weights, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got.b_desc.data, 1 + want.bias, rtol=1e-5, atol=1e-5)  # accumulated

    # without a cache the backward recomputes the forward, as BNNS does
    for g in delta_gates.values():
        g.b_desc.flags = 0
    assert bnns.BNNSDirectApplyLSTMBatchBackward(lp, dlp, None, None, 0) == 0
    np.testing.assert_allclose(delta_gates["forget_gate"].b_desc.data, ref_g.forget_gate.bias, rtol=1e-5,
                               atol=1e-5)


def test_lstm_padding_between_strided_elements_is_untouched(rng):
    t, n, i, h = 3, 2, 2, 2
    p = LSTMParameters.random(input_size=i, hidden_size=h, seed=0)
    x = rng.standard_normal((t, n, i)).astype(F32)
    y_desc, y_buf = strided(np.zeros((t, n, h), F32), "sne", pad=2)
    lp = lstm_params(p, n, t, desc(x, "sne"), y_desc)
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, None, 0) == 0
    written = ~np.isnan(y_buf)
    assert written.sum() == t * n * h
    np.testing.assert_allclose(y_buf[written], LSTMLayer(p).apply(x).output.ravel(), rtol=1e-6, atol=1e-6)


def test_lstm_failures_log_the_reason(caplog, rng):
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    t, n, i, h = 3, 2, 2, 2
    p = LSTMParameters.random(input_size=i, hidden_size=h, seed=0)
    x = rng.standard_normal((t, n, i)).astype(F32)
    lp = lstm_params(p, n, t, desc(x, "sne"), desc(np.zeros((t, n, h), F32), "sne"))
    capacity = bnns.BNNSComputeLSTMTrainingCacheCapacity(lp)
    small = np.zeros(capacity - 1, np.uint8)
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, small, capacity - 1) == -1
    assert f"training_cache_capacity must be at least {capacity} bytes" in caplog.text
    caplog.clear()
    lp.hidden_size = 3                                  # weights no longer match
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, None, 0) == -1
    assert "iw_desc[0].size must be (2, 3, 1), fastest first" in caplog.text
    caplog.clear()
    lp.hidden_size = 2
    lp.input_gate.hw_desc = None                        # a required descriptor missing
    assert bnns.BNNSComputeLSTMTrainingCacheCapacity(lp) == -1
    assert "input_gate.hw_desc must be a BNNSNDArrayDescriptor" in caplog.text
    caplog.clear()
    lp.input_gate.hw_desc = Desc(layout="last_major_4d", size=(2, 2, 1, 1), data=np.zeros(4, np.int8),
                                 data_type="int8")
    assert bnns.BNNSComputeLSTMTrainingCacheCapacity(lp) == -1
    assert "data_type must be BNNSDataTypeFloat32; got BNNSDataTypeInt8" in caplog.text
    caplog.clear()
    lp.input_gate.hw_desc = desc(p.input_gate.hidden_weights)
    lp.sequence_descriptor = Desc(layout="vector", size=(t,), data=np.array([1, 2, 2], np.int32),
                                  data_type="int32")
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, None, 0) == -1
    assert "non-increasing" in caplog.text


def test_deprecated_names_reachable_from_the_package_warn_when_called():
    with pytest.warns(DeprecationWarning, match="BNNSComputeLSTMTrainingCacheCapacity") as record:
        assert bf.BNNSComputeLSTMTrainingCacheCapacity(None) == -1
    assert record[0].filename.endswith("test_bnns.py")


def test_a_descriptors_fields_are_named_after_the_argument(caplog):
    """A negative stride (or any field a C structure could not hold) is reported with the
    argument that holds the descriptor, where the call reads it."""
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    shape = (2, 1, 3)
    gamma = Desc(layout="vector", size=(2,), stride=(-1,), data=np.ones(2, F32))
    params = bnns.BNNSLayerParametersNormalization(
        i_desc=Desc.shape_only(shape, "image_chw"), o_desc=Desc.shape_only(shape, "image_chw"),
        gamma_desc=gamma)
    assert bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.batch_norm, params, None) is None
    assert "layer_params.gamma_desc.stride[0] must be an integer >= 0; got -1." in caplog.text
    caplog.clear()
    params.gamma_desc = Desc(layout="vector", size=(2, -5), data=np.ones(2, F32))  # size[1]: not read
    assert bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.batch_norm, params, None) is not None
    params.gamma_desc = None
    params.activation = bnns.BNNSActivation(function=99)
    assert bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.batch_norm, params, None) is None
    assert "layer_params.activation.function must be a BNNSActivationFunction value; got 99." in caplog.text
    params.activation = None
    filter_params = bnns.BNNSFilterParameters(n_threads=-2)
    assert bnns.BNNSFilterCreateLayerNormalization(bf.FilterType.batch_norm, params, filter_params) is None
    assert "filter_params.n_threads must be an integer >= 0; got -2." in caplog.text


def test_messages_speak_of_the_c_call(caplog, rng):
    """Sizes fastest first, as the caller wrote them, on both sides of a message; the C
    argument's name, not the object API's."""
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    t, n, i, h = 2, 1, 4, 6
    p = LSTMParameters.random(input_size=i, hidden_size=h, seed=0)
    x = rng.standard_normal((t, n, i)).astype(F32)
    lp = lstm_params(p, n, t, desc(x, "sne"), desc(np.zeros((t, n, h), F32), "sne"))
    lp.hidden_size = 7
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, None, 0) == -1
    assert ("layer_params.input_gate.iw_desc[0].size must be (4, 7, 1), fastest first (or the same 28 "
            "elements in another rank); got (4, 6, 1).") in caplog.text
    caplog.clear()
    lp.hidden_size = h
    capacity = bnns.BNNSComputeLSTMTrainingCacheCapacity(lp)
    cache = np.zeros(capacity, np.uint8)
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, cache, 0) == -1
    assert (f"training_cache_capacity must be at least {capacity} bytes "
            "(BNNSComputeLSTMTrainingCacheCapacity of these layer_params); got 0.") in caplog.text
    assert "LSTMLayer" not in caplog.text
    caplog.clear()
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, cache, capacity) == 0
    lp.input_descriptor.data_desc = desc(x + 1, "sne")  # the backward of another x
    assert bnns.BNNSDirectApplyLSTMBatchBackward(lp, lp, None, cache, capacity) == -1
    assert "training_cache_ptr must be the cache of the forward of this x" in caplog.text
    assert "LSTMLayer" not in caplog.text


def test_normalization_backward_reads_out_only_with_an_activation(caplog, rng):
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    shape = (2, 3)
    x = rng.standard_normal((2, *shape)).astype(F32)
    for function, needs_out in (("identity", False), ("tanh", True)):
        sample = Desc.shape_only(shape, "row_major_matrix")
        params = bnns.BNNSLayerParametersNormalization(i_desc=sample, o_desc=sample,
                                                       activation=bnns.BNNSActivation(function=function))
        f = bnns.BNNSFilterCreateLayerNormalization(bnns.BNNSLayerNorm, params, None)
        y = np.zeros(x.size, F32)
        assert bnns.BNNSNormalizationFilterApplyBatch(f, 2, x.ravel(), 0, y, 0, True) == 0
        dy = np.ones(x.size, F32)
        result = bnns.BNNSNormalizationFilterApplyBackwardBatch(f, 2, None, 0, None, 0, dy, 0, None, None)
        assert result == (-1 if needs_out else 0)
        # Apple: "out is ignored if activation is BNNSActivationFunctionIdentity"
        out = y if needs_out else np.zeros(1, np.float64)  # not read: of its C type (a buffer) only
        assert bnns.BNNSNormalizationFilterApplyBackwardBatch(f, 2, None, 0, out, 0, dy, 0, None, None) == 0
    assert ("out must be the forward output, laid out as layer_params.o_desc (the fused "
            "BNNSActivationFunctionTanh needs it); got None.") in caplog.text


@pytest.mark.parametrize("values", [[3, 2.5, 1], [3, 3, np.nan], [3, np.inf, 1], [3, 2, 0.999]])
def test_fractional_batch_sizes_in_a_float32_sequence_descriptor_are_refused(values, caplog, rng):
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    t, n, i, h = 3, 3, 2, 2
    p = LSTMParameters.random(input_size=i, hidden_size=h, seed=0)
    x = rng.standard_normal((t, n, i)).astype(F32)
    lp = lstm_params(p, n, t, desc(x, "sne"), desc(np.zeros((t, n, h), F32), "sne"))
    lp.sequence_descriptor = Desc(layout="vector", size=(t,), data=np.array(values, F32), data_type="float32")
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, None, 0) == -1
    assert "layer_params.sequence_descriptor.data must be whole numbers" in caplog.text
    lp.sequence_descriptor.data = np.array([3, 2, 1], F32)  # whole numbers in float32: taken
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(lp, None, None, 0) == 0


def test_a_destroyed_filter_is_refused_in_the_c_calls_words(caplog):
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    sample = Desc.shape_only((2, 3), "row_major_matrix")
    f = bnns.BNNSFilterCreateLayerNormalization(
        bnns.BNNSLayerNorm, bnns.BNNSLayerParametersNormalization(i_desc=sample, o_desc=sample), None)
    bnns.BNNSFilterDestroy(f)
    assert bnns.BNNSNormalizationFilterApplyBatch(f, 1, np.ones(6, F32), 0, np.zeros(6, F32), 0, False) == -1
    assert ("filter was passed to BNNSNormalizationFilterApplyBatch() after close() (BNNSFilterDestroy); "
            "create a new filter") in caplog.text
    assert "NormalizationLayer" not in caplog.text

"""RMS normalization and the statistics of the forward (SPEC 4.1): hand-derived cases, finite
differences in float64, PyTorch's ``RMSNorm`` and ONNX's ``RMSNormalization`` /
``LayerNormalization`` (``Mean``, ``InvStdDev``) when installed; every test on every backend."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.layers.normalization import (
    NormalizationLayer,
    NormalizationOutput,
    NormalizationParameters,
    NormalizationType,
)
from gradcheck import assert_gradient_close, numerical_gradient

A = bf.Activation


def layer_for(params, backend_name, **options):
    return NormalizationLayer(params, bf.FilterParameters(backend=backend_name, **options))


def rms_params(input_shape, axis, rng, *, gamma=True, activation=None, dtype=np.float64, epsilon=1e-5):
    affine = input_shape[axis:]
    return NormalizationParameters(type=NormalizationType.rms(normalization_axis=axis),
                                   input_shape=input_shape,
                                   gamma=rng.uniform(0.5, 1.5, affine) if gamma else None,
                                   activation=activation or A.identity(), epsilon=epsilon, dtype=dtype)


def rms_by_formula(x, gamma, axis, epsilon):
    """``x / sqrt(mean(x²) + ε) · γ`` over the per-sample axes ``axis`` … end, written out."""
    axes = tuple(range(1 + axis, x.ndim))
    return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + epsilon) * gamma


# ------------------------------------------------------------------------------------------
# RMS normalization.
# ------------------------------------------------------------------------------------------
def test_rms_by_hand(backend_name):
    """x = (3, 4): mean(x²) = 12.5, so y = x / √12.5 · γ (ε = 0)."""
    params = NormalizationParameters(type=NormalizationType.rms(), input_shape=(2,), gamma=[2.0, -1.0],
                                     epsilon=0.0, dtype=np.float64)
    with layer_for(params, backend_name) as layer:
        y = layer.apply(np.array([[3.0, 4.0]]))
        stats = layer.apply_with_statistics(np.array([[3.0, 4.0]]))
    np.testing.assert_allclose(y, [[6.0 / math.sqrt(12.5), -4.0 / math.sqrt(12.5)]], rtol=1e-15)
    assert stats.mean is None
    np.testing.assert_allclose(stats.inv_std_dev, [[1.0 / math.sqrt(12.5)]], rtol=1e-15)


@pytest.mark.parametrize("axis, shape", [(0, (3, 4, 5)), (1, (3, 4, 5)), (2, (3, 4, 5)), (0, (7,))])
def test_rms_matches_its_formula(backend_name, rng, axis, shape):
    params = rms_params(shape, axis, rng)
    x = rng.standard_normal((4, *shape)) + 0.5
    with layer_for(params, backend_name) as layer:
        y = layer.apply(x, phase="inference")
        again = layer.apply(x)  # no moving statistics: both phases normalize with the batch's
    np.testing.assert_allclose(y, rms_by_formula(x, params.gamma, axis, 1e-5), rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(y, again)


@pytest.mark.parametrize("activation", [A.identity(), A.gelu(), A.tanh()])
@pytest.mark.parametrize("axis", [0, 1])
def test_rms_gradients_match_finite_differences(backend_name, rng, axis, activation):
    params = rms_params((3, 4), axis, rng, activation=activation)
    x = rng.standard_normal((3, 3, 4))
    w = rng.standard_normal(x.shape)
    layer = layer_for(params, backend_name, use_client_pointer=True)

    def loss():
        return float(np.sum(w * layer.apply(x)))

    y = layer.apply(x)
    grads = layer.apply_backward(x, w, output=y)
    assert grads.beta is None
    assert_gradient_close(grads.input, numerical_gradient(loss, x), rtol=1e-6, atol=1e-8, name="input")
    assert_gradient_close(grads.gamma, numerical_gradient(loss, params.gamma), rtol=1e-6, atol=1e-8,
                          name="gamma")


def test_rms_without_gamma_and_in_float32(backend_name, rng):
    params = rms_params((6, 8), 1, rng, gamma=False, dtype=np.float32)
    x = rng.standard_normal((5, 6, 8)).astype(np.float32)
    with layer_for(params, backend_name) as layer:
        y = layer.apply(x)
        in_place = x.copy()
        layer.apply(in_place, output=in_place)
        grads = layer.apply_backward(x, np.ones_like(x))
        np.testing.assert_array_equal(layer.gamma, np.ones((8,), np.float32))
    assert y.dtype == np.float32 and grads.gamma.dtype == np.float32
    np.testing.assert_allclose(y, rms_by_formula(x.astype(np.float64), 1.0, 1, 1e-5), rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(in_place, y)


def test_rms_never_reaches_the_fast_kernels(backend_name, monkeypatch, rng):
    """The blocked and compiled normalization kernels serve centred statistics only."""
    from bnnsfw.backends.scipy_blas import _normalization as _fast_normalization
    from bnnsfw.backends.numba import _normalization as _numba_normalization

    def refuse(*args, **kwargs):
        raise AssertionError("a fast kernel was asked for RMS normalization")

    monkeypatch.setattr(_fast_normalization.BlockedNormalizationKernels, "blocked_forward", refuse)
    monkeypatch.setattr(_fast_normalization.BlockedNormalizationKernels, "blocked_backward", refuse)
    monkeypatch.setattr(_numba_normalization, "forward", refuse)
    monkeypatch.setattr(_numba_normalization, "backward", refuse)
    params = rms_params((64, 768), 1, rng, dtype=np.float32)  # large enough for the blocked kernels
    x = rng.standard_normal((8, 64, 768)).astype(np.float32)
    with layer_for(params, backend_name, n_threads=2) as layer:
        y = layer.apply(x)
        layer.apply_backward(x, np.ones_like(y))
    np.testing.assert_allclose(y, rms_by_formula(x.astype(np.float64), params.gamma, 1, 1e-5), rtol=1e-4,
                               atol=1e-5)


def test_rms_rules():
    with pytest.raises(bf.InvalidParameterError, match="NormalizationParameters.beta must be None for RMS"):
        NormalizationParameters(type=NormalizationType.rms(), input_shape=(3,), beta=[0.0, 0.0, 0.0])
    with pytest.raises(bf.InvalidParameterError, match="root_mean_square must be False for batch_norm"):
        NormalizationType(kind="batch_norm", root_mean_square=True)
    with pytest.raises(bf.InvalidParameterError, match="root_mean_square must be True or False"):
        NormalizationType(kind="layer_norm", normalization_axis=0, root_mean_square=1)
    with pytest.raises(bf.InvalidParameterError, match=r"normalization_axis must be in \[0, 1\]"):
        NormalizationParameters(type=NormalizationType.rms(normalization_axis=2), input_shape=(3, 4))
    params = NormalizationParameters(type=NormalizationType.rms(), input_shape=(3,))
    with NormalizationLayer(params) as layer:
        with pytest.raises(bf.InvalidParameterError, match="NormalizationLayer.beta must be asked of a"):
            layer.beta
        with pytest.raises(bf.InvalidParameterError, match="NormalizationLayer.beta must be asked of a"):
            layer.beta = np.zeros(3, np.float32)
    assert "beta" not in params.to_state()


def test_rms_round_trips_through_state_and_files(tmp_path, rng):
    params = rms_params((3, 4), 1, rng, dtype=np.float32, activation=A.relu())
    again = NormalizationParameters.from_state(params.to_state())
    assert again.type.root_mean_square and again.type.normalization_axis == 1
    np.testing.assert_array_equal(again.gamma, params.gamma)
    assert "root_mean_square" not in NormalizationParameters(type=NormalizationType.layer(),
                                                             input_shape=(3,)).to_state()
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    with NormalizationLayer(params) as layer:
        bf.save_weights(tmp_path / "rms.npz", {"norm": layer})
        with bf.load_weights(tmp_path / "rms.npz")["norm"] as loaded:
            np.testing.assert_array_equal(loaded.apply(x), layer.apply(x))


def test_rms_matches_pytorch(backend_name, rng):
    torch = pytest.importorskip("torch")
    params = rms_params((4, 6), 0, rng, epsilon=1e-6)
    module = torch.nn.RMSNorm([4, 6], eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(params.gamma))
    x, dy = rng.standard_normal((3, 4, 6)), rng.standard_normal((3, 4, 6))
    tx = torch.tensor(x, requires_grad=True)
    ty = module(tx)
    (ty * torch.from_numpy(dy)).sum().backward()
    with layer_for(params, backend_name) as layer:
        y = layer.apply(x)
        grads = layer.apply_backward(x, dy)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads.input, tx.grad.numpy(), rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(grads.gamma, module.weight.grad.numpy(), rtol=1e-11, atol=1e-13)


def run_onnx_node(engine, op, opset, inputs, outputs, **attributes):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    node = helper.make_node(op, list(inputs), outputs, **attributes)
    graph = helper.make_graph([node], "norm",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if engine == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, inputs)
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, inputs)


@pytest.mark.parametrize("engine", ["onnxruntime", "reference"])
@pytest.mark.parametrize("onnx_axis", [-1, 2, 1])
def test_rms_matches_onnx(backend_name, rng, engine, onnx_axis):
    """ONNX's ``axis`` counts the batch axis: ``normalization_axis = axis − 1`` (``rank + axis − 1``
    when negative)."""
    shape = (3, 4, 5)
    axis = (len(shape) + onnx_axis - 1) if onnx_axis < 0 else onnx_axis - 1
    params = rms_params(shape[1:], axis, rng, dtype=np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    (y,) = run_onnx_node(engine, "RMSNormalization", 23, dict(X=x, scale=params.gamma), ["Y"],
                         axis=onnx_axis, epsilon=1e-5)
    with layer_for(params, backend_name) as layer:
        np.testing.assert_allclose(layer.apply(x), y, rtol=2e-6, atol=2e-6)


# ------------------------------------------------------------------------------------------
# The statistics of the forward (ONNX Mean and InvStdDev).
# ------------------------------------------------------------------------------------------
def test_layer_norm_statistics_by_hand(backend_name):
    """Rows (0, 2) and (1, 5): means 1 and 3, variances 1 and 4 (ε = 0)."""
    params = NormalizationParameters(type=NormalizationType.layer(normalization_axis=1), input_shape=(2, 2),
                                     epsilon=0.0, dtype=np.float64)
    x = np.array([[[0.0, 2.0], [1.0, 5.0]]])
    with layer_for(params, backend_name) as layer:
        result = layer.apply_with_statistics(x)
        plain = layer.apply(x)
    assert isinstance(result, NormalizationOutput)
    np.testing.assert_array_equal(result.output, plain)
    np.testing.assert_allclose(result.mean, [[[1.0], [3.0]]], rtol=1e-15)
    np.testing.assert_allclose(result.inv_std_dev, [[[1.0], [0.5]]], rtol=1e-15)


STATISTICS_CASES = {  # type, per-sample shape, expected statistics shape for N = 3
    "layer_all": (NormalizationType.layer(0), (4, 2, 5), (3, 1, 1, 1)),
    "layer_from_1": (NormalizationType.layer(1), (4, 2, 5), (3, 4, 1, 1)),
    "layer_last": (NormalizationType.layer(2), (4, 2, 5), (3, 4, 2, 1)),
    "instance": (NormalizationType.instance(), (4, 2, 5), (3, 4, 1, 1)),
    "batch": (NormalizationType.batch(), (4, 2, 5), (1, 4, 1, 1)),
    "group": (NormalizationType.group(2), (4, 2, 5), (3, 2, 1, 1)),
    "rms": (NormalizationType.rms(1), (4, 10), (3, 4, 1)),
}


@pytest.mark.parametrize("case", sorted(STATISTICS_CASES))
def test_statistics_of_every_type(backend_name, rng, case):
    kind, shape, stats_shape = STATISTICS_CASES[case]
    params = NormalizationParameters(type=kind, input_shape=shape, epsilon=1e-3, dtype=np.float64)
    x = rng.standard_normal((3, *shape)) * 2.0 + 1.0
    with layer_for(params, backend_name) as layer:
        result = layer.apply_with_statistics(x)
        np.testing.assert_array_equal(result.output, layer.apply(x))
    reduced = {"layer_all": (1, 2, 3), "layer_from_1": (2, 3), "layer_last": (3,), "instance": (2, 3),
               "batch": (0, 2, 3), "rms": (2,)}
    if case == "group":
        grouped = x.reshape(3, 2, 2, 2, 5)
        mean = grouped.mean(axis=(2, 3, 4)).reshape(stats_shape)
        variance = grouped.var(axis=(2, 3, 4)).reshape(stats_shape)
    elif case == "rms":
        mean, variance = None, np.mean(x * x, axis=reduced[case], keepdims=True)
    else:
        mean = x.mean(axis=reduced[case], keepdims=True)
        variance = x.var(axis=reduced[case], keepdims=True)
    assert result.inv_std_dev.shape == stats_shape
    np.testing.assert_allclose(result.inv_std_dev, 1.0 / np.sqrt(variance + 1e-3), rtol=1e-12)
    if mean is None:
        assert result.mean is None
    else:
        assert result.mean.shape == stats_shape
        np.testing.assert_allclose(result.mean, mean, rtol=1e-12, atol=1e-14)


def test_statistics_in_inference_are_the_moving_ones(backend_name, rng):
    moving_mean, moving_variance = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    params = NormalizationParameters(type=NormalizationType.batch(moving_mean, moving_variance),
                                     input_shape=(3, 4), momentum=0.5, dtype=np.float64)
    x = rng.standard_normal((2, 3, 4))
    with layer_for(params, backend_name) as layer:
        inference = layer.apply_with_statistics(x, phase="inference")
        np.testing.assert_allclose(inference.mean.ravel(), moving_mean, rtol=1e-15)
        np.testing.assert_allclose(inference.inv_std_dev.ravel(), 1.0 / np.sqrt(moving_variance + 1e-5),
                                   rtol=1e-15)
        training = layer.apply_with_statistics(x, training=True)  # also updates the moving statistics
        np.testing.assert_allclose(training.mean.ravel(), x.mean(axis=(0, 2)), rtol=1e-12)
        np.testing.assert_allclose(layer.moving_mean, 0.5 * moving_mean + 0.5 * x.mean(axis=(0, 2)),
                                   rtol=1e-12)
        assert training.mean is not layer.moving_mean
    with pytest.raises(bf.FilterClosedError, match="apply_with_statistics"):
        layer.apply_with_statistics(x)


@pytest.mark.parametrize("engine", ["onnxruntime", "reference"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_layer_norm_statistics_match_onnx(backend_name, rng, engine, axis):
    shape = (3, 4, 5)
    params = NormalizationParameters(type=NormalizationType.layer(normalization_axis=axis),
                                     input_shape=shape, gamma=rng.uniform(0.5, 1.5, shape[axis:]),
                                     beta=rng.standard_normal(shape[axis:]))
    x = (rng.standard_normal((2, *shape)) + 0.3).astype(np.float32)
    y, mean, inv_std_dev = run_onnx_node(engine, "LayerNormalization", 17, dict(X=x, Scale=params.gamma,
                                                                                  B=params.beta),
                                         ["Y", "Mean", "InvStdDev"], axis=axis + 1, epsilon=1e-5)
    with layer_for(params, backend_name) as layer:
        result = layer.apply_with_statistics(x)
    np.testing.assert_allclose(result.output, y, rtol=2e-5, atol=2e-5)
    assert result.mean.shape == mean.shape and result.inv_std_dev.shape == inv_std_dev.shape
    np.testing.assert_allclose(result.mean, mean, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(result.inv_std_dev, inv_std_dev, rtol=2e-5, atol=2e-6)


def test_statistics_are_not_views_of_layer_state(backend_name, rng):
    params = NormalizationParameters(type=NormalizationType.layer(1), input_shape=(2, 3))
    x = rng.standard_normal((2, 2, 3)).astype(np.float32)
    with layer_for(params, backend_name) as layer:
        first = layer.apply_with_statistics(x)
        kept = first.mean.copy(), first.inv_std_dev.copy()
        layer.apply_with_statistics(x * 3.0 + 1.0)
    np.testing.assert_array_equal(first.mean, kept[0])
    np.testing.assert_array_equal(first.inv_std_dev, kept[1])
    assert attrs.has(NormalizationOutput)

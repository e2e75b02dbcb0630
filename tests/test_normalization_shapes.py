"""The shapes normalization layers take (SPEC §7): layer and RMS norm under any number of
leading axes, batch, instance and group norm with open spatial sizes (``None``), what the
conversions and exports do with them, and the errors; every layer test on every backend,
gradients against finite differences in float64."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import coreml, interop
from bnnsfw.layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType
from gradcheck import assert_gradient_close, numerical_gradient


def layer_for(params, backend_name):
    return NormalizationLayer(params, bf.FilterParameters(backend=backend_name))


def by_formula(kind, x, gamma, beta, epsilon, groups=2):
    """The forward of SPEC §3 written out for (N, C, *spatial) data, batch statistics."""
    n, c = x.shape[:2]
    if kind == "group":
        g = x.reshape(n, groups, -1)
        z = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + epsilon)
        z = z.reshape(x.shape)
    else:
        axes = (0, *range(2, x.ndim)) if kind == "batch" else tuple(range(2, x.ndim))
        z = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + epsilon)
    per_channel = (1, c, *(1,) * (x.ndim - 2))
    return z * gamma.reshape(per_channel) + beta.reshape(per_channel)


# ------------------------------------------------------------------------------------------
# Layer and RMS norm under leading axes.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_leading_axes_equal_applying_each_sample(backend_name, rng, rms):
    kind = NormalizationType.rms(1) if rms else NormalizationType.layer(normalization_axis=1)
    params = NormalizationParameters(type=kind, input_shape=(3, 4), gamma=rng.uniform(0.5, 1.5, 4),
                                     beta=None if rms else rng.standard_normal(4), dtype=np.float64)
    x = rng.standard_normal((2, 3, 3, 4))  # leading (2, 3), as an LSTM's (T, N, …) output
    dy = rng.standard_normal(x.shape)
    with layer_for(params, backend_name) as layer:
        y = layer.apply(x)
        stats = layer.apply_with_statistics(x)
        grads = layer.apply_backward(x, dy)
        per = [layer.apply(x[t]) for t in range(2)]
        per_stats = [layer.apply_with_statistics(x[t]) for t in range(2)]
        per_grads = [layer.apply_backward(x[t], dy[t]) for t in range(2)]
    np.testing.assert_allclose(y, np.stack(per), rtol=1e-13, atol=1e-14)
    assert stats.inv_std_dev.shape == (2, 3, 3, 1)
    np.testing.assert_allclose(stats.inv_std_dev, np.stack([s.inv_std_dev for s in per_stats]), rtol=1e-13)
    if not rms:
        np.testing.assert_allclose(stats.mean, np.stack([s.mean for s in per_stats]), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(grads.input, np.stack([g.input for g in per_grads]), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(grads.gamma, sum(g.gamma for g in per_grads), rtol=1e-12, atol=1e-13)
    if not rms:
        np.testing.assert_allclose(grads.beta, sum(g.beta for g in per_grads), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_leading_axes_gradients_match_finite_differences(backend_name, rng, rms):
    kind = NormalizationType.rms() if rms else NormalizationType.layer()
    params = NormalizationParameters(type=kind, input_shape=(3,), gamma=rng.uniform(0.5, 1.5, 3),
                                     beta=None if rms else rng.standard_normal(3),
                                     activation=bf.Activation.tanh(), dtype=np.float64)
    x, dy = rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 2, 3))
    with layer_for(params, backend_name) as layer:
        y = layer.apply(x)
        grads = layer.apply_backward(x, dy, output=y)

        def loss():
            return float(np.sum(layer.apply(x) * dy))

        assert_gradient_close(grads.input, numerical_gradient(loss, x), name="x")
        assert_gradient_close(grads.gamma, numerical_gradient(loss, layer.gamma), name="gamma")
        if not rms:
            assert_gradient_close(grads.beta, numerical_gradient(loss, layer.beta), name="beta")


def test_leading_axes_with_buffers(backend_name, rng):
    """output= and input_gradient= of the leading-axes shape, contiguous or not, and in place."""
    params = NormalizationParameters(type=NormalizationType.layer(), input_shape=(4,), dtype=np.float64)
    x, dy = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    with layer_for(params, backend_name) as layer:
        expected, grads = layer.apply(x), layer.apply_backward(x, dy)
        strided = np.zeros((2, 3, 8))[..., ::2]
        assert layer.apply(x, output=strided) is strided
        np.testing.assert_allclose(strided, expected, rtol=1e-14)
        in_place = x.copy()
        assert layer.apply(in_place, output=in_place) is in_place
        np.testing.assert_allclose(in_place, expected, rtol=1e-14)
        dx = np.ones((2, 3, 8))[..., ::2]
        assert layer.apply_backward(x, dy, input_gradient=dx, accumulate=True).input is dx
        np.testing.assert_allclose(dx, grads.input + 1.0, rtol=1e-13)
        x_before = x.copy()
        layer.apply(x)
        np.testing.assert_array_equal(x, x_before)


# ------------------------------------------------------------------------------------------
# Open spatial sizes.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["batch", "instance", "group"])
def test_open_sizes_take_any_spatial_size(backend_name, rng, kind):
    ntype = {"batch": NormalizationType.batch(np.zeros(4), np.ones(4)),
             "instance": NormalizationType.instance(), "group": NormalizationType.group(group_count=2)}[kind]
    gamma, beta = rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    params = NormalizationParameters(type=ntype, input_shape=(4, None, None), gamma=gamma, beta=beta,
                                     momentum=0.5, dtype=np.float64)
    with layer_for(params, backend_name) as layer:
        assert layer.input_shape == (4, None, None)
        for spatial in ((2, 3), (3, 1)):
            x = rng.standard_normal((2, 4, *spatial))
            y = layer.apply(x, training=True)
            np.testing.assert_allclose(y, by_formula(kind, x, gamma, beta, 1e-5), rtol=1e-12, atol=1e-13)
            np.testing.assert_allclose(layer.apply(x[0], training=True),
                                       by_formula(kind, x[:1], gamma, beta, 1e-5)[0], rtol=1e-12, atol=1e-13)

def test_open_size_batch_norm_moving_statistics(backend_name, rng):
    params = NormalizationParameters(type=NormalizationType.batch(np.zeros(2), np.ones(2)),
                                     input_shape=(2, None), momentum=0.25, dtype=np.float64)
    a, b = rng.standard_normal((3, 2, 4)), rng.standard_normal((2, 2, 5))
    with layer_for(params, backend_name) as layer:
        layer.apply(a, training=True)
        layer.apply(b, training=True)
        inference = layer.apply(b, training=False)
        mean = 0.25 * (0.75 * a.mean(axis=(0, 2))) + 0.75 * b.mean(axis=(0, 2))
        variance = 0.25 * (0.25 + 0.75 * a.var(axis=(0, 2))) + 0.75 * b.var(axis=(0, 2))
        np.testing.assert_allclose(layer.moving_mean, mean, rtol=1e-12)
        np.testing.assert_allclose(layer.moving_variance, variance, rtol=1e-12)
    np.testing.assert_allclose(inference, (b - mean[:, None]) / np.sqrt(variance[:, None] + 1e-5), rtol=1e-12)


@pytest.mark.parametrize("kind", ["batch", "instance", "group"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_open_sizes_gradients_match_finite_differences(backend_name, rng, kind, training):
    ntype = {"batch": NormalizationType.batch(rng.standard_normal(4), rng.uniform(0.5, 2, 4)),
             "instance": NormalizationType.instance(), "group": NormalizationType.group(group_count=2)}[kind]
    params = NormalizationParameters(type=ntype, input_shape=(4, None), gamma=rng.uniform(0.5, 1.5, 4),
                                     beta=rng.standard_normal(4), dtype=np.float64)
    x, dy = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 3))
    with layer_for(params, backend_name) as layer:
        grads = layer.apply_backward(x, dy, training=training)
        frozen = layer.state_dict()

        def loss():
            value = float(np.sum(layer.apply(x, training=training) * dy))
            layer.load_state_dict(frozen)  # a training forward moved the statistics: put them back
            return value

        assert_gradient_close(grads.input, numerical_gradient(loss, x), name="x")
        assert_gradient_close(grads.gamma, numerical_gradient(loss, layer.gamma), name="gamma")
        assert_gradient_close(grads.beta, numerical_gradient(loss, layer.beta), name="beta")


# ------------------------------------------------------------------------------------------
# Errors.
# ------------------------------------------------------------------------------------------
def test_shapes_refused_with_their_reason(backend_name):
    layer_params = NormalizationParameters(type=NormalizationType.layer(normalization_axis=1),
                                           input_shape=(3, 4), dtype=np.float64)
    open_params = NormalizationParameters(type=NormalizationType.group(group_count=2),
                                          input_shape=(4, None, None), dtype=np.float64)
    with layer_for(layer_params, backend_name) as layer:
        with pytest.raises(bf.ShapeError, match=r"apply\(x\) must be of shape \(\*leading, 3, 4\) with any "
                                                r"number of leading axes; got 'shape \(2, 5, 3, 5\)"):
            layer.apply(np.zeros((2, 5, 3, 5)))
        with pytest.raises(bf.ShapeError, match=r"\(\*leading, 3, 4\).*got 'shape \(4,\)"):
            layer.apply(np.zeros(4))
        with pytest.raises(bf.ShapeError, match="at least one sample"):
            layer.apply(np.zeros((2, 0, 3, 4)))
        with pytest.raises(bf.ShapeError, match=r"apply_backward\(dy\)"):
            layer.apply_backward(np.zeros((2, 2, 3, 4)), np.zeros((2, 3, 4)))
    with layer_for(open_params, backend_name) as layer:
        text = r"\(N, 4, any, any\) or unbatched \(4, any, any\)"
        with pytest.raises(bf.ShapeError, match=rf"apply\(x\) must be of shape {text}; got 'shape \(2, 3, 5"):
            layer.apply(np.zeros((2, 3, 5, 5)))
        with pytest.raises(bf.ShapeError, match=rf"{text}; got 'shape \(2, 4\)"):
            layer.apply(np.zeros((2, 4)))
        with pytest.raises(bf.ShapeError, match=rf"{text}; got 'shape \(1, 2, 4, 5, 5\)"):
            layer.apply(np.zeros((1, 2, 4, 5, 5)))  # leading axes are for layer norm only
        with pytest.raises(bf.ShapeError, match="sizes >= 1 where input_shape leaves them open"):
            layer.apply(np.zeros((2, 4, 0, 5)))
    with pytest.raises(bf.InvalidParameterError, match=r"input_shape\[0\] \(channels\) must be a positive"):
        NormalizationParameters(type=NormalizationType.batch(), input_shape=(None, 4))
    with pytest.raises(bf.InvalidParameterError, match="fixed sizes for layer and RMS norm"):
        NormalizationParameters(type=NormalizationType.layer(), input_shape=(3, None))
    with pytest.raises(bf.InvalidParameterError, match=r"input_shape\[1\] must be"):
        NormalizationParameters(type=NormalizationType.batch(), input_shape=(3, "any"))


# ------------------------------------------------------------------------------------------
# Conversions, files and exports.
# ------------------------------------------------------------------------------------------
def test_state_dicts_without_input_shape_give_open_sizes(rng):
    sd = {"weight": rng.uniform(0.5, 1.5, 6), "bias": rng.standard_normal(6),
          "running_mean": np.zeros(6), "running_var": np.ones(6)}
    assert interop.from_state_dict("BatchNorm2d", sd).input_shape == (6, None, None)
    assert interop.from_state_dict("BatchNorm3d", sd).input_shape == (6, None, None, None)
    assert interop.from_state_dict("BatchNorm1d", sd).input_shape == (6,)
    assert interop.from_state_dict("BatchNorm1d", sd, input_shape=(6, None)).input_shape == (6, None)
    assert interop.from_state_dict("InstanceNorm1d", {}, num_features=6).input_shape == (6, None)
    group = interop.from_state_dict("GroupNorm", {"weight": sd["weight"], "bias": sd["bias"]}, num_groups=2)
    assert group.input_shape == (6, None, None)
    with pytest.raises(bf.InvalidParameterError, match="no array says C"):
        interop.from_state_dict("InstanceNorm2d", {})


def test_from_torch_without_input_shape(rng):
    torch = pytest.importorskip("torch")
    modules = [torch.nn.BatchNorm2d(6), torch.nn.GroupNorm(2, 6), torch.nn.InstanceNorm2d(6, affine=True),
               torch.nn.LayerNorm([8]), torch.nn.RMSNorm([8])]
    for module in modules:
        module.double().eval()
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.uniform_(0.5, 1.5)
        layer = interop.from_torch(module)
        shapes = [(4, 5, 8), (2, 8)] if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) \
            else [(3, 6, 4, 4), (2, 6, 5, 3)]
        for shape in shapes:
            x = rng.standard_normal(shape)
            expected = module(torch.from_numpy(x)).detach().numpy()
            np.testing.assert_allclose(layer.apply(x, training=False), expected, rtol=1e-10, atol=1e-12,
                                       err_msg=type(module).__name__)
        layer.close()
    assert interop.from_torch(torch.nn.BatchNorm1d(6)).input_shape == (6,)


def test_weights_files_keep_open_sizes(tmp_path, rng):
    moving = NormalizationType.batch(rng.standard_normal(3), rng.uniform(0.5, 2, 3))
    params = NormalizationParameters(type=moving, input_shape=(3, None, None), gamma=rng.uniform(0.5, 1.5, 3),
                                     dtype=np.float64)
    x = rng.standard_normal((2, 3, 2, 5))
    with NormalizationLayer(params) as layer:
        bf.save_weights(tmp_path / "norm", layer)
        expected = layer.apply(x, training=False)
    back = bf.load_weights(tmp_path / "norm")
    assert back.input_shape == (3, None, None)
    with copy.deepcopy(back) as copied:
        assert copied.input_shape == (3, None, None)
        np.testing.assert_array_equal(copied.apply(x, training=False), expected)
    np.testing.assert_array_equal(back.apply(x, training=False), expected)
    with NormalizationLayer(params) as into:
        bf.load_weights(tmp_path / "norm", into=into)
    back.close()


def test_onnx_export_keeps_open_sizes_symbolic(rng):
    pytest.importorskip("onnx")
    from bnnsfw import onnx as bonnx

    cases = [(NormalizationType.batch(rng.standard_normal(4), rng.uniform(0.5, 2, 4)), 15),
             (NormalizationType.instance(), 15), (NormalizationType.group(group_count=2), 21)]
    for kind, opset in cases:
        params = NormalizationParameters(type=kind, input_shape=(4, None, None),
                                         gamma=rng.uniform(0.5, 1.5, 4), beta=rng.standard_normal(4))
        with NormalizationLayer(params) as layer:
            session = bonnx.load(bonnx.export(layer, opset=opset))
            dims = session.get_inputs()[0].shape
            assert dims[1] == 4 and isinstance(dims[2], str) and isinstance(dims[3], str)
            for spatial in ((2, 3), (4, 1)):
                x = rng.standard_normal((2, 4, *spatial)).astype(np.float32)
                np.testing.assert_allclose(session.run(None, {"input": x})[0], layer(x),
                                           rtol=1e-5, atol=1e-6, err_msg=kind.kind.name)
    lstm = bf.LSTMLayer(bf.LSTMParameters.random(input_size=2, hidden_size=4))
    with NormalizationLayer(NormalizationParameters(type=NormalizationType.batch(np.zeros(4), np.ones(4)),
                                                    input_shape=(4, None))) as norm:
        with pytest.raises(bf.ShapeError, match=r"data ending in \[4, None\]"):
            bonnx.export([lstm, norm])
    lstm.close()


def test_coreml_export_refuses_open_sizes():
    params = NormalizationParameters(type=NormalizationType.batch(np.zeros(3), np.ones(3)),
                                     input_shape=(3, None))
    with NormalizationLayer(params) as layer:
        with pytest.raises(bf.UnsupportedError, match=r"input_shape must be fixed sizes .*got \(3, None\)"):
            coreml.export(layer, "unused.mlpackage")

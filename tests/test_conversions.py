"""bnnsfw.interop: PyTorch and Keras conversions, checked against the libraries themselves.

With PyTorch installed, converted layers must give PyTorch's outputs and gradients in
float64 to 1e-10 relative, and PyTorch -> bnnsfw -> PyTorch must give back the very arrays.
Without it, the state-dict forms are checked against NumPy transcriptions of the PyTorch and
Keras equations. Keras checks read real ``.keras`` files when Keras (and h5py) are installed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import interop
from bnnsfw.bnns import BNNSNDArrayDescriptor


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _torch_state(module):
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def _random_pytorch_state(rng, *, input_size, hidden_size, num_layers, bidirectional, bias=True, proj_size=0):
    """A torch.nn.LSTM-shaped state dict made with NumPy (no torch needed)."""
    h, d = hidden_size, 2 if bidirectional else 1
    p = proj_size or h
    sd = {}
    for layer in range(num_layers):
        for s in ("", "_reverse")[:d]:
            width = input_size if layer == 0 else d * p
            sd[f"weight_ih_l{layer}{s}"] = rng.uniform(-0.5, 0.5, (4 * h, width))
            sd[f"weight_hh_l{layer}{s}"] = rng.uniform(-0.5, 0.5, (4 * h, p))
            if proj_size:
                sd[f"weight_hr_l{layer}{s}"] = rng.uniform(-0.8, 0.8, (p, h))
            if bias:
                sd[f"bias_ih_l{layer}{s}"] = rng.uniform(-0.5, 0.5, 4 * h)
                sd[f"bias_hh_l{layer}{s}"] = rng.uniform(-0.5, 0.5, 4 * h)
    return sd


def _pytorch_lstm_equations(sd, x, num_layers, bidirectional):
    """torch.nn.LSTM's documented equations (gates i, f, g, o stacked by rows), time-major."""
    d = 2 if bidirectional else 1
    layer_input = x
    for layer in range(num_layers):
        outputs = []
        for k, s in enumerate(("", "_reverse")[:d]):
            w_ih, w_hh = sd[f"weight_ih_l{layer}{s}"], sd[f"weight_hh_l{layer}{s}"]
            b = sd.get(f"bias_ih_l{layer}{s}", 0.0) + sd.get(f"bias_hh_l{layer}{s}", 0.0)
            w_hr = sd.get(f"weight_hr_l{layer}{s}")  # proj_size: h = W_hr (o * tanh(c))
            h = np.zeros((x.shape[1], w_hh.shape[1]))
            c = np.zeros((x.shape[1], w_hh.shape[0] // 4))
            y = np.zeros((x.shape[0], x.shape[1], w_hh.shape[1]))
            steps = range(x.shape[0])
            for t in (reversed(steps) if k == 1 else steps):
                z = layer_input[t] @ w_ih.T + h @ w_hh.T + b
                i, f, g, o = np.split(z, 4, axis=1)
                c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
                h = _sigmoid(o) * np.tanh(c)
                if w_hr is not None:
                    h = h @ w_hr.T
                y[t] = h
            outputs.append(y)
        layer_input = np.concatenate(outputs, axis=2)
    return layer_input


# ------------------------------------------------------------------------------------------
# PyTorch LSTM.
# ------------------------------------------------------------------------------------------
def _lstm_gradients_as_torch(grads, num_layers, num_directions):
    """bnnsfw LSTM gate gradients in torch.nn.LSTM's parameter layout."""
    out = {}
    for layer in range(num_layers):
        for k, s in enumerate(("", "_reverse")[:num_directions]):
            iw = [g.input_weights[0][k] if layer == 0 else g.input_weights[1][layer - 1, k]
                  for g in grads.gates]
            out[f"weight_ih_l{layer}{s}"] = np.concatenate(iw)
            out[f"weight_hh_l{layer}{s}"] = np.concatenate([g.hidden_weights[layer, k] for g in grads.gates])
            if grads.projection_weights is not None:
                out[f"weight_hr_l{layer}{s}"] = grads.projection_weights[layer, k]
            if grads.input_gate.bias is not None:
                bias = np.concatenate([g.bias[layer, k] for g in grads.gates])
                out[f"bias_ih_l{layer}{s}"] = out[f"bias_hh_l{layer}{s}"] = bias  # d/d(sum) = d/d(either)
    return out


@pytest.mark.parametrize("num_layers, bidirectional, batch_first, bias, proj_size", [
    (2, True, True, True, 0),
    (2, False, False, False, 0),
    (2, True, False, True, 3),
])
def test_pytorch_lstm_outputs_and_gradients_match_in_float64(rng, backend_name, num_layers, bidirectional,
                                                             batch_first, bias, proj_size):
    torch = pytest.importorskip("torch")
    i, h, t, n = 3, 4, 4, 2
    p = proj_size or h
    d = 2 if bidirectional else 1
    torch.manual_seed(0)
    net = torch.nn.LSTM(i, h, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first,
                        bias=bias, proj_size=proj_size).double()
    layer = interop.from_torch(net, filter_parameters=bf.FilterParameters(backend=backend_name))
    assert isinstance(layer, bf.LSTMLayer) and layer.layer_parameters.batch_first == batch_first
    assert layer.layer_parameters.projection_size == (proj_size or None)
    x = rng.standard_normal((n, t, i) if batch_first else (t, n, i))
    h0, dh = rng.standard_normal((2, num_layers * d, n, p))
    c0, dc = rng.standard_normal((2, num_layers * d, n, h))
    dy = rng.standard_normal((n, t, d * p) if batch_first else (t, n, d * p))

    tx, th0, tc0 = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, h0, c0))
    ty, (th, tc) = net(tx, (th0, tc0))
    ((ty * torch.from_numpy(dy)).sum() + (th * torch.from_numpy(dh)).sum()
     + (tc * torch.from_numpy(dc)).sum()).backward()

    out = layer.apply(x, h0, c0, training=True)
    grads = layer.apply_backward(x, dy, h0, c0, dh, dc, training_cache=out.training_cache)
    tight = {"rtol": 1e-10, "atol": 1e-13}
    np.testing.assert_allclose(out.output, ty.detach().numpy(), **tight)
    np.testing.assert_allclose(out.hidden, th.detach().numpy(), **tight)
    np.testing.assert_allclose(out.cell, tc.detach().numpy(), **tight)
    np.testing.assert_allclose(grads.input, tx.grad.numpy(), **tight)
    np.testing.assert_allclose(grads.hidden, th0.grad.numpy(), **tight)
    np.testing.assert_allclose(grads.cell, tc0.grad.numpy(), **tight)
    ours = _lstm_gradients_as_torch(grads, num_layers, d)
    for name, parameter in net.named_parameters():
        np.testing.assert_allclose(ours[name], parameter.grad.numpy(), err_msg=name, **tight)
    layer.close()


@pytest.mark.parametrize("dtype, proj_size", [("float32", 0), ("float64", 0), ("float32", 2)])
def test_pytorch_lstm_round_trip_is_bit_identical(dtype, proj_size):
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    net = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=proj_size).to(getattr(torch, dtype))
    with torch.no_grad():
        for p in net.parameters():
            p.uniform_(-1, 1)
    layer = interop.from_torch(net)
    assert layer.layer_parameters.dtype == np.dtype(dtype)
    back = interop.to_torch(layer)
    assert type(back) is torch.nn.LSTM and back.bidirectional and back.num_layers == 2
    assert back.proj_size == proj_size
    assert set(back.state_dict()) == set(net.state_dict())
    for key, value in net.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key
    # Through a saved and reloaded copy of the layer too (the split is found by the bias's bytes).
    copy = bf.LSTMLayer(layer.layer_parameters)
    for key, value in net.state_dict().items():
        assert torch.equal(value, interop.to_torch(copy).state_dict()[key]), key


def test_a_trained_lstm_bias_goes_back_as_bias_ih(rng):
    sd = _random_pytorch_state(rng, input_size=3, hidden_size=2, num_layers=1, bidirectional=False)
    params = interop.from_state_dict("LSTM", sd)
    layer = bf.LSTMLayer(params, bf.FilterParameters(use_client_pointer=True))
    params.forget_gate.bias[...] += 0.25                 # a training step changed the bias
    state = interop.to_state_dict(layer)
    np.testing.assert_array_equal(state.state_dict["bias_hh_l0"], np.zeros(8, np.float64))
    total = sd["bias_ih_l0"] + sd["bias_hh_l0"]
    total[2:4] += 0.25
    np.testing.assert_allclose(state.state_dict["bias_ih_l0"], total, rtol=1e-15)


def test_pytorch_packed_sequences_are_sequence_lengths(rng):
    torch = pytest.importorskip("torch")
    i, h, t, n = 4, 5, 6, 4
    torch.manual_seed(1)
    net = torch.nn.LSTM(i, h, num_layers=2, bidirectional=True)
    x = rng.standard_normal((t, n, i)).astype(np.float32)
    lengths = np.array([6, 2, 5, 1])
    with torch.no_grad():
        packed = torch.nn.utils.rnn.pack_padded_sequence(torch.from_numpy(x), torch.from_numpy(lengths),
                                                         enforce_sorted=False)
        packed_out, (th, tc) = net(packed)
        ty, _ = torch.nn.utils.rnn.pad_packed_sequence(packed_out, total_length=t)
    with interop.from_torch(net) as layer:
        out = layer.apply(x, sequence_lengths=lengths)
    np.testing.assert_allclose(out.output, ty.numpy(), atol=1e-5)
    np.testing.assert_allclose(out.hidden, th.numpy(), atol=1e-5)
    np.testing.assert_allclose(out.cell, tc.numpy(), atol=1e-5)


@pytest.mark.parametrize("num_layers, bidirectional, bias, proj_size",
                         [(1, False, True, 0), (2, True, True, 0), (3, True, False, 0), (2, True, True, 2)])
def test_lstm_state_dict_needs_no_torch(rng, num_layers, bidirectional, bias, proj_size):
    i, h = 4, 3
    sd = _random_pytorch_state(rng, input_size=i, hidden_size=h, num_layers=num_layers,
                               bidirectional=bidirectional, bias=bias, proj_size=proj_size)
    params = interop.from_state_dict("LSTM", sd)
    assert params.projection_size == (proj_size or None)
    assert (params.input_size, params.hidden_size, params.num_layers, params.bidirectional) == (
        i, h, num_layers, bidirectional)
    assert params.dtype == np.float64
    x = rng.standard_normal((5, 2, i))
    with bf.LSTMLayer(params) as layer:
        expected = _pytorch_lstm_equations(sd, x, num_layers, bidirectional)
        np.testing.assert_allclose(layer.apply(x).output, expected, rtol=1e-10, atol=1e-12)
    state = interop.to_state_dict(params)
    assert state.module_type == "LSTM" and state.options["num_layers"] == num_layers
    assert state.options["proj_size"] == proj_size
    assert set(state.state_dict) == set(sd)
    for key in sd:
        np.testing.assert_array_equal(state.state_dict[key], sd[key])


def test_lstm_state_dict_errors_name_the_problem(rng):
    sd = _random_pytorch_state(rng, input_size=3, hidden_size=2, num_layers=1, bidirectional=False)
    with pytest.raises(bf.ShapeError, match="weight_hh_l0"):
        interop.from_state_dict("LSTM", {**sd, "weight_hh_l0": np.zeros((8, 3))})
    with pytest.raises(bf.InvalidParameterError, match="extra"):
        interop.from_state_dict("LSTM", {**sd, "extra": np.zeros(1)})
    with pytest.raises(bf.ShapeError, match="weight_hr_l0"):
        interop.from_state_dict("LSTM", {**sd, "weight_hr_l0": np.zeros((1, 3))})
    with pytest.raises(bf.InvalidParameterError, match="weight_hr_l0"):
        interop.from_state_dict("LSTM", sd, proj_size=1)
    with pytest.raises(bf.ShapeError, match="weight_hh_l0"):  # with a projection, (4·H, P)
        interop.from_state_dict("LSTM", {**sd, "weight_hr_l0": np.zeros((1, 2))})
    with pytest.raises(bf.ShapeError, match="hidden_size"):
        interop.from_state_dict("LSTM", sd, hidden_size=3)
    with pytest.raises(bf.UnsupportedError, match="Conv2d"):
        interop.from_state_dict("Conv2d", sd)
    peephole = bf.LSTMParameters.random(input_size=2, hidden_size=2, peepholes="diagonal")
    with pytest.raises(bf.UnsupportedError, match="peephole"):
        interop.to_state_dict(peephole)
    relu = bf.LSTMParameters.random(input_size=2, hidden_size=2, hidden_activation=bf.Activation.relu())
    with pytest.raises(bf.UnsupportedError, match="relu"):
        interop.to_state_dict(relu)
    two = bf.LSTMActivations.onnx(["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "Tanh"])
    per_direction = bf.LSTMParameters.random(input_size=2, hidden_size=2, bidirectional=True,
                                             direction_activations=two)
    with pytest.raises(bf.UnsupportedError, match="relu"):
        interop.to_state_dict(per_direction)
    for option, value in (("reverse", True), ("clip", 3.0), ("cell_clip", 3.0), ("input_forget", True),
                          ("layer_norm", True)):
        if option == "layer_norm":
            params = bf.LSTMParameters.random(input_size=2, hidden_size=2, layer_norm=True)
        else:
            params = bf.LSTMParameters.random(input_size=2, hidden_size=2, **{option: value})
        with pytest.raises(bf.UnsupportedError, match=option):
            interop.to_state_dict(params)


def test_what_pytorch_cannot_express_is_refused_by_name():
    torch = pytest.importorskip("torch")
    with pytest.raises(bf.UnsupportedError, match="momentum"):
        interop.from_torch(torch.nn.BatchNorm1d(3, momentum=None))
    with pytest.raises(bf.UnsupportedError, match="Conv1d"):
        interop.from_torch(torch.nn.Conv1d(3, 3, 1))


# ------------------------------------------------------------------------------------------
# PyTorch normalizations and Linear.
# ------------------------------------------------------------------------------------------
def _norm_modules(torch):
    """(module, per-sample input shape) pairs, float64, with non-trivial weights."""
    cases = [
        (torch.nn.BatchNorm1d(3, momentum=0.2), (3, 5)),
        (torch.nn.BatchNorm1d(3), (3,)),
        (torch.nn.BatchNorm2d(2), (2, 3, 2)),
        (torch.nn.InstanceNorm1d(3, affine=True, track_running_stats=True, momentum=0.3), (3, 6)),
        (torch.nn.InstanceNorm2d(2, affine=True), (2, 3, 3)),
        (torch.nn.GroupNorm(2, 4, eps=1e-3), (4, 5)),
        (torch.nn.LayerNorm([2, 3]), (4, 2, 3)),
        (torch.nn.LayerNorm(5), (5,)),
        (torch.nn.RMSNorm([2, 3], eps=1e-4), (4, 2, 3)),
        (torch.nn.RMSNorm(5), (5,)),  # eps=None: the dtype's machine epsilon
        (torch.nn.RMSNorm(3, elementwise_affine=False), (2, 3)),
    ]
    with torch.no_grad():
        for module, _ in cases:
            module.double()
            if getattr(module, "weight", None) is not None:
                module.weight.uniform_(0.5, 1.5)
            if getattr(module, "bias", None) is not None:
                module.bias.uniform_(-1, 1)
            if getattr(module, "running_mean", None) is not None:
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    return cases


@pytest.mark.parametrize("case", range(11))
def test_pytorch_norms_match_in_both_phases_with_gradients(rng, backend_name, case):
    torch = pytest.importorskip("torch")
    module, shape = _norm_modules(torch)[case]
    layer = interop.from_torch(module, input_shape=shape, dtype=np.float64,  # (some have no parameters)
                               filter_parameters=bf.FilterParameters(backend=backend_name))
    assert layer.dtype == np.float64
    tight = {"rtol": 1e-10, "atol": 1e-12}
    # Inference first: after training steps the running variances part (PyTorch's is unbiased).
    for phase, train in (("inference", False), ("training", True)):
        module.train(train)
        x = rng.standard_normal((4, *shape)) * 2 + 0.5
        dy = rng.standard_normal(x.shape)
        tx = torch.from_numpy(x.copy()).requires_grad_()
        ty = module(tx)
        (ty * torch.from_numpy(dy)).sum().backward()
        y = layer.apply(x, phase=phase)
        grads = layer.apply_backward(x, dy, output=y, phase=phase)
        np.testing.assert_allclose(y, ty.detach().numpy(), err_msg=phase, **tight)
        np.testing.assert_allclose(grads.input, tx.grad.numpy(), err_msg=phase, **tight)
        if module.weight is not None:
            np.testing.assert_allclose(grads.gamma, module.weight.grad.numpy(), **tight)
            module.weight.grad = None
        if getattr(module, "bias", None) is not None:
            np.testing.assert_allclose(grads.beta, module.bias.grad.numpy(), **tight)
            module.bias.grad = None
        if getattr(module, "running_mean", None) is not None:
            np.testing.assert_allclose(layer.moving_mean, module.running_mean.numpy(), **tight)
    back = interop.to_torch(layer)
    assert type(back).__name__ == type(module).__name__ or (type(module).__name__ == "InstanceNorm2d")
    layer.close()


@pytest.mark.parametrize("case", range(11))
def test_pytorch_norm_round_trip_is_bit_identical(case):
    torch = pytest.importorskip("torch")
    module, shape = _norm_modules(torch)[case]
    back = interop.to_torch(interop.from_torch(module, input_shape=shape))
    assert type(back) is type(module)
    assert back.eps == module.eps
    if hasattr(module, "momentum"):
        assert back.momentum == pytest.approx(module.momentum, abs=1e-15)
    ours = back.state_dict()
    for key, value in module.state_dict().items():
        if key == "num_batches_tracked":
            continue
        if key in ("weight", "bias") and module.state_dict().get("weight") is None:
            continue
        assert torch.equal(value, ours[key]), key


def test_batch_norm_running_variance_follows_pytorch(rng):
    torch = pytest.importorskip("torch")
    n, c, length, momentum_pt = 6, 4, 3, 0.1
    count = n * length                                   # values per channel in one batch
    bn = torch.nn.BatchNorm1d(c, momentum=momentum_pt).double()
    sd = _torch_state(bn)
    sd["running_var"] = interop.running_variance_from_torch(sd["running_var"], count)  # the same track
    params = interop.from_state_dict("BatchNorm1d", sd, input_shape=(c, length), momentum=momentum_pt)
    assert params.momentum == pytest.approx(1 - momentum_pt)
    with bf.NormalizationLayer(params) as layer:
        for _ in range(5):
            x = rng.standard_normal((n, c, length)) * 3 + 2
            y = layer.apply(x, phase="training")
            with torch.no_grad():
                ty = bn(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(y, ty, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(layer.moving_mean, bn.running_mean.numpy(), rtol=1e-12)
            np.testing.assert_allclose(interop.running_variance_to_torch(layer.moving_variance, count),
                                       bn.running_var.numpy(), rtol=1e-12)
            assert not np.allclose(layer.moving_variance, bn.running_var.numpy(), rtol=1e-3)


def test_norm_state_dicts_without_torch(rng):
    gamma, beta = rng.uniform(0.5, 1.5, 4), rng.uniform(-1, 1, 4)
    mean, var = rng.uniform(-1, 1, 4), rng.uniform(0.5, 2, 4)
    sd = {"weight": gamma, "bias": beta, "running_mean": mean, "running_var": var,
          "num_batches_tracked": np.array(3)}
    params = interop.from_state_dict("BatchNorm2d", sd, input_shape=(4, 2, 2), eps=1e-3, momentum=0.25)
    assert params.type.kind is bf.FilterType.batch_norm and params.momentum == 0.75 and params.epsilon == 1e-3
    x = rng.standard_normal((3, 4, 2, 2))
    expected = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-3) * gamma[:, None, None] \
        + beta[:, None, None]
    with bf.NormalizationLayer(params) as layer:
        np.testing.assert_allclose(layer.apply(x, phase="inference"), expected, rtol=1e-12)
    state = interop.to_state_dict(params)
    assert state.module_type == "BatchNorm2d" and state.options["momentum"] == 0.25
    for key in ("weight", "bias", "running_mean", "running_var"):
        np.testing.assert_array_equal(state.state_dict[key], sd[key])
    assert interop.from_state_dict("BatchNorm2d", sd).input_shape == (4, None, None)  # any H, W
    with pytest.raises(bf.ShapeError, match="input_shape"):
        interop.from_state_dict("BatchNorm2d", sd, input_shape=(4, 2))
    with pytest.raises(bf.InvalidParameterError, match="num_groups"):
        interop.from_state_dict("GroupNorm", {"weight": gamma, "bias": beta})
    layer_norm = interop.from_state_dict("LayerNorm", {"weight": gamma, "bias": beta}, input_shape=(3, 4))
    assert layer_norm.type.normalization_axis == 1
    rms = interop.from_state_dict("RMSNorm", {"weight": gamma}, input_shape=(3, 4), eps=0.25)
    assert rms.type.root_mean_square and rms.type.normalization_axis == 1 and rms.epsilon == 0.25
    x = rng.standard_normal((2, 3, 4))
    with bf.NormalizationLayer(rms) as layer:
        expected = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 0.25) * gamma
        np.testing.assert_allclose(layer.apply(x), expected, rtol=1e-12)
    state = interop.to_state_dict(rms)
    assert state.module_type == "RMSNorm" and set(state.state_dict) == {"weight"}
    assert state.options == {"normalized_shape": [4], "eps": 0.25}
    default_eps = interop.from_state_dict("RMSNorm", {"weight": gamma})  # PyTorch's eps=None
    assert default_eps.epsilon == np.finfo(np.float64).eps
    assert interop.to_state_dict(default_eps).options["eps"] is None
    with pytest.raises(bf.InvalidParameterError, match="bias"):
        interop.from_state_dict("RMSNorm", {"weight": gamma, "bias": beta})
    with pytest.raises(bf.UnsupportedError, match="activation"):
        interop.to_state_dict(bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(2,),
                                                         activation=bf.Activation.relu()))


def test_pytorch_linear(rng, backend_name):
    torch = pytest.importorskip("torch")
    torch.manual_seed(2)
    linear = torch.nn.Linear(5, 3).double()
    layer = interop.from_torch(linear, filter_parameters=bf.FilterParameters(backend=backend_name))
    x, dy = rng.standard_normal((7, 4, 5)), rng.standard_normal((7, 4, 3))
    tx = torch.from_numpy(x.copy()).requires_grad_()
    ty = linear(tx)
    (ty * torch.from_numpy(dy)).sum().backward()
    grads = layer.apply_backward(x, dy)
    np.testing.assert_allclose(layer.apply(x), ty.detach().numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(grads.input, tx.grad.numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(grads.weights, linear.weight.grad.numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(grads.bias, linear.bias.grad.numpy(), rtol=1e-10, atol=1e-13)
    back = interop.to_torch(layer)
    assert torch.equal(back.weight, linear.weight) and torch.equal(back.bias, linear.bias)


# ------------------------------------------------------------------------------------------
# Keras.
# ------------------------------------------------------------------------------------------
def _keras_lstm_equations(kernel, recurrent, bias, x, act=np.tanh, gate=_sigmoid):
    """Keras's LSTM cell (columns i, f, c, o), batch-first input (N, T, I), full sequence out."""
    n, t, _ = x.shape
    h = np.zeros((n, recurrent.shape[0]))
    c = np.zeros_like(h)
    ys = []
    for step in range(t):
        z = x[:, step] @ kernel + h @ recurrent + bias
        i, f, g, o = np.split(z, 4, axis=1)
        c = gate(f) * c + gate(i) * act(g)
        h = gate(o) * act(c)
        ys.append(h)
    return np.stack(ys, axis=1)


def test_keras_lstm_weights(rng):
    i, h = 3, 4
    kernel, recurrent, bias = rng.uniform(-0.5, 0.5, (i, 4 * h)), rng.uniform(-0.5, 0.5, (h, 4 * h)), \
        rng.uniform(-0.5, 0.5, 4 * h)
    x = rng.standard_normal((2, 5, i))
    params = interop.from_keras("LSTM", [kernel, recurrent, bias], {"units": h})
    assert params.batch_first
    with bf.LSTMLayer(params) as layer:
        np.testing.assert_allclose(layer.apply(x).output, _keras_lstm_equations(kernel, recurrent, bias, x),
                                   rtol=1e-10, atol=1e-12)
    relu = interop.from_keras("LSTM", [kernel, recurrent, bias], {"activation": "relu",
                                                                  "recurrent_activation": "hard_sigmoid"})
    expected = _keras_lstm_equations(kernel, recurrent, bias, x, act=lambda z: np.maximum(z, 0),
                                     gate=lambda z: np.clip(z / 6 + 0.5, 0, 1))
    with bf.LSTMLayer(relu) as layer:
        np.testing.assert_allclose(layer.apply(x).output, expected, rtol=1e-10, atol=1e-12)
    backward = [rng.uniform(-0.5, 0.5, a.shape) for a in (kernel, recurrent, bias)]
    bi = interop.from_keras("Bidirectional", [kernel, recurrent, bias, *backward],
                            {"layer": {"config": {"units": h}}, "merge_mode": "concat"})
    with bf.LSTMLayer(bi) as layer:
        y = layer.apply(x).output
    np.testing.assert_allclose(y[..., :h], _keras_lstm_equations(kernel, recurrent, bias, x), rtol=1e-10)
    np.testing.assert_allclose(y[..., h:], _keras_lstm_equations(*backward, x[:, ::-1])[:, ::-1], rtol=1e-10)
    with pytest.raises(bf.UnsupportedError, match="go_backwards"):
        interop.from_keras("LSTM", [kernel, recurrent, bias], {"go_backwards": True})
    with pytest.raises(bf.ShapeError, match="recurrent_kernel"):
        interop.from_keras("LSTM", [kernel, recurrent[:, :4], bias])
    with pytest.raises(bf.UnsupportedError, match="exponential"):
        interop.from_keras("LSTM", [kernel, recurrent, bias], {"activation": "exponential"})


def test_keras_normalization_weights(rng):
    gamma, beta, mean, var = rng.uniform(0.5, 1.5, 3), rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 3), \
        rng.uniform(0.5, 2, 3)
    bn = interop.from_keras("BatchNormalization", [gamma, beta, mean, var])
    assert bn.momentum == 0.99 and bn.epsilon == 1e-3 and bn.input_shape == (3,)
    x = rng.standard_normal((4, 3))
    with bf.NormalizationLayer(bn) as layer:
        np.testing.assert_allclose(layer.apply(x, phase="inference"),
                                   (x - mean) / np.sqrt(var + 1e-3) * gamma + beta, rtol=1e-12)
    no_scale = interop.from_keras("BatchNormalization", [beta, mean, var], {"scale": False})
    assert no_scale.gamma is None
    ln = interop.from_keras("LayerNormalization", [gamma, beta], {"epsilon": 1e-6}, input_shape=(5, 3))
    assert ln.type.normalization_axis == 1
    with pytest.raises(bf.UnsupportedError, match="channel axis"):
        interop.from_keras("BatchNormalization", [gamma, beta, mean, var], input_shape=(5, 3))
    gn = interop.from_keras("GroupNormalization", [np.ones(4), np.zeros(4)], {"groups": 2, "axis": 1},
                            input_shape=(4, 6))
    assert gn.type.group_count == 2
    with pytest.raises(bf.UnsupportedError, match="var"):  # Keras's rms_scaling is not RMS normalization
        interop.from_keras("LayerNormalization", [gamma], {"rms_scaling": True, "center": False})
    rms = interop.from_keras("RMSNormalization", [gamma], {"epsilon": 0.25}, input_shape=(5, 3))
    assert rms.type.root_mean_square and rms.type.normalization_axis == 1
    x = rng.standard_normal((2, 5, 3))
    with bf.NormalizationLayer(rms) as layer:  # Keras 3: x · rsqrt(mean(x²) + ε) · scale
        expected = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 0.25) * gamma
        np.testing.assert_allclose(layer.apply(x), expected, rtol=1e-12)
    assert interop.from_keras("RMSNormalization", [gamma]).epsilon == 1e-6


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras's own, from its torch backend
def test_keras_file_loads_and_matches_keras(rng, tmp_path, monkeypatch):
    pytest.importorskip("h5py")
    monkeypatch.setenv("KERAS_BACKEND", os.environ.get("KERAS_BACKEND", "torch"))
    keras = pytest.importorskip("keras")
    model = keras.Sequential([
        keras.Input((5, 3)),
        keras.layers.LSTM(4, return_sequences=True, name="encoder"),
        keras.layers.LayerNormalization(name="norm"),
        keras.layers.Bidirectional(keras.layers.LSTM(2, return_sequences=True), name="bi"),
        keras.layers.LSTM(3, return_sequences=True, activation="relu", name="second"),
        keras.layers.Dense(2, activation="relu", name="head"),
    ])
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = interop.load_keras(path, dtype=np.float64)
    assert list(loaded.layers) == ["encoder", "norm", "bi", "second", "head"]
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    expected = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(loaded.apply(x.astype(np.float64)), expected, rtol=1e-4, atol=1e-5)


def test_keras_file_errors(tmp_path):
    pytest.importorskip("h5py")
    bad = tmp_path / "not.keras"
    bad.write_bytes(b"not a zip")
    with pytest.raises(bf.InvalidParameterError, match="zip"):
        interop.load_keras(bad)


# ------------------------------------------------------------------------------------------
# BNNS sizes: NumPy shapes reversed (the recipe of docs/conversions.md).
# ------------------------------------------------------------------------------------------
def test_bnns_sizes_are_numpy_shapes_reversed(rng):
    x = rng.standard_normal((7, 3, 5)).astype(np.float32)                 # (T, N, I)
    desc = BNNSNDArrayDescriptor.from_array(x, bf.DataLayout.sne)
    assert tuple(reversed(x.shape)) + (0,) * 5 == desc.size == (5, 3, 7, 0, 0, 0, 0, 0)

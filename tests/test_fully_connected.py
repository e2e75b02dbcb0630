"""FullyConnectedLayer: forward against NumPy, backward against finite differences, errors,
client pointers and output buffers, on every backend."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import Activation, FilterParameters
from bnnsfw.layers.fully_connected import (
    FullyConnectedGradients,
    FullyConnectedLayer,
    FullyConnectedParameters,
)

from gradcheck import assert_gradient_close, numerical_gradient

IN, OUT = 3, 4

# Identity, three whose derivative comes from the output (sigmoid, tanh, ReLU) and three
# whose derivative needs the pre-activation (GELU, softplus, leaky ReLU).
ACTIVATIONS = [
    Activation.identity(),
    Activation.sigmoid(),
    Activation.tanh(),
    Activation.relu(),
    Activation.gelu(),
    Activation.softplus(),
    Activation.leaky_relu(0.1),
]
ACTIVATION_IDS = [a.function.name for a in ACTIVATIONS]
SHAPES = [(5, IN), (2, 3, IN)]


def make_layer(backend_name, *, activation=None, bias=True, dtype=np.float64, client=False, seed=3):
    params = FullyConnectedParameters.random(input_size=IN, output_size=OUT, bias=bias,
                                             activation=activation, seed=seed, dtype=dtype)
    return FullyConnectedLayer(params, FilterParameters(backend=backend_name, use_client_pointer=client))


def reference_forward(x, weights, bias, activation):
    z = x @ weights.T
    if bias is not None:
        z = z + bias
    return activation.forward(z)


# Forward.
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=["NI", "TNI"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_forward_matches_numpy(backend_name, rng, dtype, shape, bias):
    activation = Activation.tanh()
    layer = make_layer(backend_name, activation=activation, bias=bias, dtype=dtype)
    x = rng.standard_normal(shape).astype(dtype)
    y = layer.apply(x)
    assert y.shape == shape[:-1] + (OUT,) and y.dtype == dtype
    expected = reference_forward(x.astype(np.float64), layer.weights.astype(np.float64),
                                 None if layer.bias is None else layer.bias.astype(np.float64), activation)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=ACTIVATION_IDS)
def test_forward_every_activation(backend_name, rng, activation):
    layer = make_layer(backend_name, activation=activation)
    x = rng.standard_normal((4, IN))
    np.testing.assert_allclose(layer.apply(x), reference_forward(x, layer.weights, layer.bias, activation),
                               rtol=1e-12, atol=1e-12)


def test_forward_hand_computed(backend_name):
    params = FullyConnectedParameters(input_size=2, output_size=3, weights=[[1, 2], [0, -1], [3, 0.5]],
                                      bias=[0.5, 0, -1], dtype=np.float64)
    layer = FullyConnectedLayer(params, FilterParameters(backend=backend_name))
    y = layer.apply(np.array([[1.0, 1.0], [2.0, -2.0]]))
    np.testing.assert_array_equal(y, [[3.5, -1.0, 2.5], [-1.5, 2.0, 4.0]])


def test_forward_accepts_lists(backend_name):
    layer = make_layer(backend_name)
    x = [[0.5, -1.0, 2.0]]
    np.testing.assert_allclose(layer.apply(x), layer.apply(np.array(x)))


def test_apply_output_buffer(backend_name, rng):
    layer = make_layer(backend_name, activation=Activation.sigmoid())
    x = rng.standard_normal((2, 3, IN))
    expected = layer.apply(x)
    out = np.full((2, 3, OUT), np.nan)
    assert layer.apply(x, output=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-14)
    # A non-contiguous buffer is filled too.
    wide = np.zeros((2, 3, 2 * OUT))
    view = wide[..., ::2]
    assert layer.apply(x, output=view) is view
    np.testing.assert_allclose(view, expected, rtol=1e-14)


def test_apply_output_may_be_the_input(backend_name, rng):
    params = FullyConnectedParameters.random(input_size=3, output_size=3, dtype=np.float64, seed=5)
    layer = FullyConnectedLayer(params, FilterParameters(backend=backend_name))
    x = rng.standard_normal((4, 3))
    expected = layer.apply(x)
    assert layer.apply(x, output=x) is x
    np.testing.assert_allclose(x, expected, rtol=1e-14)


# Backward.
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=ACTIVATION_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=["NI", "TNI"])
def test_gradients_match_finite_differences(backend_name, rng, activation, shape):
    layer = make_layer(backend_name, activation=activation)
    x = rng.standard_normal(shape)
    upstream = rng.standard_normal(shape[:-1] + (OUT,))

    def loss() -> float:
        return float(np.sum(upstream * layer.apply(x)))

    y = layer.apply(x)
    grads = layer.apply_backward(x, upstream, output=y)
    assert isinstance(grads, FullyConnectedGradients)
    assert grads.input.shape == shape and grads.weights.shape == (OUT, IN) and grads.bias.shape == (OUT,)
    assert_gradient_close(grads.input, numerical_gradient(loss, x), name="input")
    assert_gradient_close(grads.weights, numerical_gradient(loss, layer.weights), name="weights")
    assert_gradient_close(grads.bias, numerical_gradient(loss, layer.bias), name="bias")


def test_gradients_without_bias(backend_name, rng):
    layer = make_layer(backend_name, activation=Activation.gelu(), bias=False)
    x = rng.standard_normal((3, IN))
    upstream = rng.standard_normal((3, OUT))
    grads = layer.apply_backward(x, upstream, output=layer.apply(x))
    assert grads.bias is None and layer.bias is None
    loss = lambda: float(np.sum(upstream * layer.apply(x)))  # noqa: E731
    assert_gradient_close(grads.weights, numerical_gradient(loss, layer.weights), name="weights")
    assert_gradient_close(grads.input, numerical_gradient(loss, x), name="input")


def test_identity_backward_needs_no_output(backend_name, rng):
    layer = make_layer(backend_name)
    x = rng.standard_normal((3, IN))
    dy = rng.standard_normal((3, OUT))
    grads = layer.apply_backward(x, dy)
    np.testing.assert_allclose(grads.input, dy @ layer.weights, rtol=1e-13)
    np.testing.assert_allclose(grads.weights, dy.T @ x, rtol=1e-13)
    np.testing.assert_allclose(grads.bias, dy.sum(axis=0), rtol=1e-13)


def test_float32_backward_matches_float64(backend_name, rng):
    x = rng.standard_normal((2, 3, IN))
    dy = rng.standard_normal((2, 3, OUT))
    results = {}
    for dtype in (np.float32, np.float64):
        layer = make_layer(backend_name, activation=Activation.softplus(), dtype=dtype)
        xd, dyd = x.astype(dtype), dy.astype(dtype)
        grads = layer.apply_backward(xd, dyd, output=layer.apply(xd))
        assert grads.input.dtype == grads.weights.dtype == grads.bias.dtype == dtype
        results[dtype] = grads
    for field in ("input", "weights", "bias"):
        np.testing.assert_allclose(getattr(results[np.float32], field), getattr(results[np.float64], field),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", [Activation.identity(), Activation.tanh(), Activation.gelu()],
                         ids=["identity", "tanh", "gelu"])
def test_accumulate_adds_into_buffers(backend_name, rng, activation):
    layer = make_layer(backend_name, activation=activation)
    x = rng.standard_normal((2, 3, IN))
    dy = rng.standard_normal((2, 3, OUT))
    y = layer.apply(x)
    fresh = layer.apply_backward(x, dy, output=y)
    start = [rng.standard_normal(s) for s in ((2, 3, IN), (OUT, IN), (OUT,))]
    buffers = [s.copy() for s in start]
    grads = layer.apply_backward(x, dy, output=y, input_gradient=buffers[0], weights_gradient=buffers[1],
                                 bias_gradient=buffers[2], accumulate=True)
    assert grads.input is buffers[0] and grads.weights is buffers[1] and grads.bias is buffers[2]
    for got, s, f in zip(buffers, start, (fresh.input, fresh.weights, fresh.bias)):
        np.testing.assert_allclose(got, s + f, rtol=1e-12, atol=1e-12)
    # accumulate=False overwrites the buffers.
    grads = layer.apply_backward(x, dy, output=y, input_gradient=buffers[0], weights_gradient=buffers[1],
                                 bias_gradient=buffers[2])
    for got, f in zip(buffers, (fresh.input, fresh.weights, fresh.bias)):
        np.testing.assert_allclose(got, f, rtol=1e-12, atol=1e-12)


def test_accumulate_into_non_contiguous_and_partial_buffers(backend_name, rng):
    layer = make_layer(backend_name)
    x = rng.standard_normal((5, IN))
    dy = rng.standard_normal((5, OUT))
    fresh = layer.apply_backward(x, dy)
    weights_gradient = np.asfortranarray(np.ones((OUT, IN)))
    grads = layer.apply_backward(x, dy, weights_gradient=weights_gradient, accumulate=True)
    assert grads.weights is weights_gradient
    np.testing.assert_allclose(weights_gradient, 1.0 + fresh.weights, rtol=1e-12)
    # Gradients without a buffer come back fresh.
    np.testing.assert_allclose(grads.input, fresh.input, rtol=1e-12)
    np.testing.assert_allclose(grads.bias, fresh.bias, rtol=1e-12)


def test_input_gradient_buffer_may_alias_dy(backend_name, rng):
    params = FullyConnectedParameters.random(input_size=3, output_size=3, dtype=np.float64, seed=2)
    layer = FullyConnectedLayer(params, FilterParameters(backend=backend_name))
    x = rng.standard_normal((4, 3))
    dy = rng.standard_normal((4, 3))
    expected = layer.apply_backward(x, dy.copy())
    grads = layer.apply_backward(x, dy, input_gradient=dy)
    assert grads.input is dy
    np.testing.assert_allclose(dy, expected.input, rtol=1e-13)
    np.testing.assert_allclose(grads.weights, expected.weights, rtol=1e-13)


def test_inputs_are_not_modified(backend_name, rng):
    layer = make_layer(backend_name, activation=Activation.sigmoid())
    x = rng.standard_normal((2, 3, IN))
    dy = rng.standard_normal((2, 3, OUT))
    y = layer.apply(x)
    weights, bias = layer.weights.copy(), layer.bias.copy()
    saved = [a.copy() for a in (x, dy, y)]
    layer.apply_backward(x, dy, output=y)
    layer.apply(x)
    for before, after in zip(saved, (x, dy, y)):
        np.testing.assert_array_equal(before, after)
    np.testing.assert_array_equal(weights, layer.weights)
    np.testing.assert_array_equal(bias, layer.bias)


def test_empty_batch(backend_name):
    layer = make_layer(backend_name, activation=Activation.gelu())
    x = np.zeros((0, IN))
    y = layer.apply(x)
    grads = layer.apply_backward(x, np.zeros((0, OUT)), output=y)
    assert y.shape == (0, OUT) and grads.input.shape == (0, IN)
    np.testing.assert_array_equal(grads.weights, np.zeros((OUT, IN)))
    np.testing.assert_array_equal(grads.bias, np.zeros(OUT))


# Client pointers.
def test_client_pointer_keeps_the_callers_arrays(backend_name, rng):
    weights = rng.uniform(-1, 1, (OUT, IN)).astype(np.float32)
    bias = np.zeros(OUT, np.float32)
    params = FullyConnectedParameters(input_size=IN, output_size=OUT, weights=weights, bias=bias)
    layer = FullyConnectedLayer(params, FilterParameters(backend=backend_name, use_client_pointer=True))
    assert layer.weights is weights and layer.bias is bias
    x = rng.standard_normal((2, IN)).astype(np.float32)
    before = layer.apply(x)
    weights *= 2.0
    bias += 1.0
    np.testing.assert_allclose(layer.apply(x), 2.0 * before + 1.0, rtol=1e-5)


def test_default_copies_the_weights(backend_name, rng):
    weights = rng.uniform(-1, 1, (OUT, IN))
    params = FullyConnectedParameters(input_size=IN, output_size=OUT, weights=weights, dtype=np.float64)
    assert params.weights is weights  # the parameter object keeps an array of its dtype
    layer = FullyConnectedLayer(params, FilterParameters(backend=backend_name))
    assert layer.weights is not weights
    x = rng.standard_normal((2, IN))
    before = layer.apply(x)
    weights[...] = 0.0
    np.testing.assert_array_equal(layer.apply(x), before)
    # The layer's own arrays are live: updating them changes the next apply.
    layer.weights[...] = 0.0
    np.testing.assert_array_equal(layer.apply(x), np.zeros((2, OUT)))


def test_client_pointer_with_a_cast_keeps_the_converted_array(backend_name):
    weights64 = np.ones((OUT, IN))
    params = FullyConnectedParameters(input_size=IN, output_size=OUT, weights=weights64)  # float32 layer
    layer = FullyConnectedLayer(params, FilterParameters(backend=backend_name, use_client_pointer=True))
    assert layer.weights is params.weights and layer.weights is not weights64
    assert layer.weights.dtype == np.float32


# Parameters.
def test_random_parameters():
    p = FullyConnectedParameters.random(input_size=16, output_size=8, seed=7)
    q = FullyConnectedParameters.random(input_size=16, output_size=8, seed=7)
    r = FullyConnectedParameters.random(input_size=16, output_size=8, seed=8, dtype=np.float64)
    assert p == q and p != r
    assert p.weights.dtype == np.float32 and r.weights.dtype == np.float64 and r.dtype == np.float64
    assert np.all(np.abs(p.weights) <= 0.25) and np.all(np.abs(p.bias) <= 0.25)
    assert p.weights.std() > 0.1  # really spread over the interval
    assert FullyConnectedParameters.random(input_size=2, output_size=2, bias=False).bias is None
    with_act = FullyConnectedParameters.random(input_size=2, output_size=2, activation=Activation.relu())
    assert with_act.activation == Activation.relu()


def test_parameters_convert_and_evolve():
    p = FullyConnectedParameters(input_size=2, output_size=1, weights=[[1, 2]], bias=[3])
    assert p.weights.dtype == np.float32 and p.bias.dtype == np.float32
    assert p.activation.is_identity
    q = attrs.evolve(p, dtype="float64")
    assert q.weights.dtype == np.float64 and q.bias.dtype == np.float64
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        p.input_size = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes, error, match",
    [
        ({"weights": np.ones((IN, OUT))}, bf.ShapeError,
         r"FullyConnectedParameters.weights must be of shape \(4, 3\)"),
        ({"weights": np.ones(OUT * IN)}, bf.ShapeError, "weights must be of shape"),
        ({"bias": np.ones(OUT + 1)}, bf.ShapeError, r"FullyConnectedParameters.bias must be of shape \(4,\)"),
        ({"weights": np.full((OUT, IN), np.nan)}, bf.InvalidParameterError, "weights must be finite"),
        ({"input_size": 0}, bf.InvalidParameterError, "input_size must be an integer >= 1"),
        ({"output_size": 2.5}, bf.InvalidParameterError, "output_size must be an integer >= 1"),
        ({"dtype": np.int32}, bf.DTypeError, "FullyConnectedParameters.dtype must be float32 or float64"),
        ({"activation": "relu"}, bf.InvalidParameterError, "activation must be an Activation"),
        ({"activation": Activation("softmax")}, bf.InvalidParameterError,
         "FullyConnectedParameters.activation must be a per-element activation"),
        ({"weights": "abc"}, bf.InvalidParameterError, "weights must be an array of real numbers"),
    ],
)
def test_parameter_errors(changes, error, match):
    fields = {"input_size": IN, "output_size": OUT, "weights": np.ones((OUT, IN)), "bias": None}
    fields.update(changes)
    with pytest.raises(error, match=match):
        FullyConnectedParameters(**fields)


def test_layer_needs_parameters():
    match = r"FullyConnectedLayer\(parameters\) must be a FullyConnectedParameters"
    with pytest.raises(bf.InvalidParameterError, match=match):
        FullyConnectedLayer({"input_size": 2})  # type: ignore[arg-type]


# Errors when applying.
def test_apply_errors(backend_name):
    layer = make_layer(backend_name, dtype=np.float32)
    match = (r"apply\(x\) must be of shape \(N, 3\), \(T, N, 3\) or unbatched \(3,\); "
             r"got 'shape \(2, 4\) float32'")
    with pytest.raises(bf.ShapeError, match=match):
        layer.apply(np.ones((2, 4), np.float32))
    with pytest.raises(bf.ShapeError, match="apply\\(x\\) must be of shape"):
        layer.apply(np.ones(IN + 1, np.float32))
    with pytest.raises(bf.ShapeError):
        layer.apply(np.ones((1, 2, 3, IN), np.float32))
    with pytest.raises(bf.DTypeError, match="apply\\(x\\) must be a float32 array"):
        layer.apply(np.ones((2, IN)))
    with pytest.raises(bf.ShapeError, match="apply\\(output\\) must be of shape \\(2, 4\\)"):
        layer.apply(np.ones((2, IN), np.float32), output=np.empty((2, IN), np.float32))
    with pytest.raises(bf.DTypeError, match="apply\\(output\\)"):
        layer.apply(np.ones((2, IN), np.float32), output=np.empty((2, OUT)))
    with pytest.raises(bf.InvalidParameterError, match="apply\\(x\\) must be an array"):
        layer.apply(None)


def test_apply_backward_errors(backend_name):
    layer = make_layer(backend_name, activation=Activation.sigmoid())
    x, dy = np.ones((2, IN)), np.ones((2, OUT))
    match = r"apply_backward\(output\) must be the forward output \(the sigmoid activation needs it\)"
    with pytest.raises(bf.InvalidParameterError, match=match):
        layer.apply_backward(x, dy)
    y = layer.apply(x)
    with pytest.raises(bf.ShapeError, match=r"apply_backward\(dy\) must be of shape \(2, 4\)"):
        layer.apply_backward(x, np.ones((2, IN)), output=y)
    with pytest.raises(bf.ShapeError, match=r"apply_backward\(output\) must be of shape \(2, 4\)"):
        layer.apply_backward(x, dy, output=y[:1])
    with pytest.raises(bf.DTypeError, match=r"apply_backward\(dy\)"):
        layer.apply_backward(x, dy.astype(np.float32), output=y)
    with pytest.raises(bf.ShapeError, match=r"apply_backward\(x\)"):
        layer.apply_backward(np.ones((2, OUT)), dy, output=y)
    with pytest.raises(bf.ShapeError, match=r"apply_backward\(weights_gradient\) must be of shape \(4, 3\)"):
        layer.apply_backward(x, dy, output=y, weights_gradient=np.zeros((IN, OUT)))
    with pytest.raises(bf.DTypeError, match=r"apply_backward\(input_gradient\)"):
        layer.apply_backward(x, dy, output=y, input_gradient=np.zeros((2, IN), np.float32))
    read_only = np.zeros(OUT)
    read_only.flags.writeable = False
    with pytest.raises(bf.InvalidParameterError, match=r"\(bias_gradient\) must be a writable array"):
        layer.apply_backward(x, dy, output=y, bias_gradient=read_only)
    with pytest.raises(bf.InvalidParameterError, match=r"apply_backward\(accumulate\) must be True or False"):
        layer.apply_backward(x, dy, output=y, accumulate=1)
    no_bias = make_layer(backend_name, bias=False)
    with pytest.raises(bf.InvalidParameterError, match=r"bias_gradient\) must be None for a layer without"):
        no_bias.apply_backward(x, dy, bias_gradient=np.zeros(OUT))


def test_closed_layer(backend_name):
    layer = make_layer(backend_name)
    x = np.ones((1, IN))
    with layer:
        layer.apply(x)
    assert layer.closed and "closed" in repr(layer)
    layer.close()
    for call in (lambda: layer.apply(x), lambda: layer.apply_backward(x, np.ones((1, OUT))),
                 lambda: layer.weights, lambda: layer.bias):
        with pytest.raises(bf.FilterClosedError, match="create a new FullyConnectedLayer"):
            call()


def test_repr_and_properties(backend_name):
    layer = make_layer(backend_name, activation=Activation.tanh(), dtype=np.float32)
    text = repr(layer)
    assert "input_size=3, output_size=4, bias=True, activation=tanh, dtype=float32" in text
    assert f"backend={backend_name!r}" in text and "open" in text
    assert (layer.input_size, layer.output_size, layer.dtype) == (IN, OUT, np.float32)
    assert layer.activation == Activation.tanh() and layer.backend.name == backend_name
    assert layer.layer_parameters.input_size == IN


# Optional cross-check with PyTorch.
def test_matches_torch_linear(backend_name, rng):
    torch = pytest.importorskip("torch")
    layer = make_layer(backend_name, activation=Activation.tanh())
    x = rng.standard_normal((2, 3, IN))
    dy = rng.standard_normal((2, 3, OUT))
    linear = torch.nn.Linear(IN, OUT, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(layer.weights))
        linear.bias.copy_(torch.from_numpy(layer.bias))
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    yt = torch.tanh(linear(xt))
    yt.backward(torch.from_numpy(dy))
    y = layer.apply(x)
    grads = layer.apply_backward(x, dy, output=y)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads.input, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads.weights, linear.weight.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads.bias, linear.bias.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_training_keyword_is_accepted_and_changes_nothing(backend_name, rng):
    """Every layer's apply and call take ``training=``; a dense layer computes the same in both."""
    layer = make_layer(backend_name, activation=Activation.tanh())
    x = rng.standard_normal((2, IN))
    expected = reference_forward(x, layer.weights, layer.bias, Activation.tanh())
    for result in (layer.apply(x, training=True), layer(x, training=True), layer(x, training=False)):
        np.testing.assert_allclose(result, expected, rtol=1e-12)
    with pytest.raises(bf.InvalidParameterError, match=r"FullyConnectedLayer.apply\(training\) must be True"):
        layer(x, training=None)
    layer.close()

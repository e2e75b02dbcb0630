"""NormalizationLayer: forward against the SPEC formulas, backward against finite differences.

Every layer test runs on every registered backend (the ``backend_name`` fixture, overridden
here), and once more on a ``scipy-blas`` backend whose blocks hold a handful of elements, so
that the blocked, multithreaded kernels run on the tests' small inputs with uneven blocks
(the default backends hand inputs that small to the reference kernels).
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import Activation, FilterParameters
from bnnsfw.layers.normalization import (
    NormalizationGradients,
    NormalizationLayer,
    NormalizationParameters,
    NormalizationType,
)

from bnnsfw.backends.scipy_blas import _normalization as fast
from bnnsfw.backends.scipy_blas import ScipyBlasBackend
from conftest import BACKENDS
from gradcheck import assert_gradient_close, numerical_gradient

KINDS = ("batch", "instance", "layer", "group")
# Per-sample shapes of rank 1…4 (C = 4, so group norm with G = 2 fits every one).
SHAPES = {1: (4,), 2: (4, 3), 3: (4, 2, 3), 4: (4, 2, 2, 2)}
ACTIVATIONS = {
    "identity": Activation.identity(),
    "sigmoid": Activation.sigmoid(),  # derivative from the output
    "tanh": Activation.tanh(),  # derivative from the output
    "gelu": Activation.gelu(),  # derivative from the (recomputed) pre-activation
    "softplus": Activation.softplus(1.5, 0.8),  # idem
}


def blocked_backend(block: int = 5, threaded_block: int = 11) -> ScipyBlasBackend:
    """The ``scipy-blas`` backend with blocks of ``block`` (one thread) or ``threaded_block``
    (several) elements and no lower size limit: its blocked kernels run on any input."""
    backend = ScipyBlasBackend()
    backend.normalization_min_elements = 0
    backend.normalization_block_elements = block
    backend.normalization_threaded_block_elements = threaded_block
    return backend


def _channel_plan(backend: ScipyBlasBackend, x: np.ndarray, threads: int):
    """The blocks the backend would use for per-sample statistics of ``x`` (N, C, 1, S)."""
    return backend.blocked_plan(x, np.ones((1, x.shape[1], 1, 1), x.dtype), False, False, threads)


@pytest.fixture(params=[*BACKENDS, "scipy-blas (tiny blocks)"])
def backend_name(request: pytest.FixtureRequest) -> object:
    """Each registered backend's name, then a backend object running the blocked kernels."""
    return blocked_backend() if request.param == "scipy-blas (tiny blocks)" else request.param


def make_type(kind: str, rank: int, *, moving: bool = False, rng: np.random.Generator | None = None,
              axis: int | None = None) -> NormalizationType:
    channels = 4
    if kind in ("batch", "instance"):
        if not moving:
            return getattr(NormalizationType, kind)()
        rng = rng or np.random.default_rng(0)
        return getattr(NormalizationType, kind)(
            moving_mean=rng.standard_normal(channels), moving_variance=rng.uniform(0.5, 2.0, channels)
        )
    if kind == "layer":
        return NormalizationType.layer(normalization_axis=(rank - 1) // 2 if axis is None else axis)
    return NormalizationType.group(group_count=2)


def make_params(kind: str, shape: tuple[int, ...], rng: np.random.Generator, *, moving: bool = False,
                activation: Activation | None = None, dtype=np.float64, axis: int | None = None,
                **extra) -> NormalizationParameters:
    ntype = make_type(kind, len(shape), moving=moving, rng=rng, axis=axis)
    affine = shape[ntype.normalization_axis:] if kind == "layer" else shape[:1]
    return NormalizationParameters(
        type=ntype, input_shape=shape, gamma=rng.uniform(0.5, 1.5, affine), beta=rng.standard_normal(affine),
        activation=activation or Activation.identity(), dtype=dtype, **extra,
    )


def make_layer(params: NormalizationParameters, backend_name: object, **extra) -> NormalizationLayer:
    return NormalizationLayer(params, FilterParameters(backend=backend_name, **extra))


def reference_forward(x: np.ndarray, params: NormalizationParameters, phase: str,
                      moving: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """SPEC §3 written directly on the ``(N, C, *spatial)`` array, in float64."""
    x = x.astype(np.float64)
    n, channels = x.shape[:2]
    kind = params.type.kind
    eps = params.epsilon
    gamma = np.ones(params.affine_shape) if params.gamma is None else params.gamma.astype(np.float64)
    beta = np.zeros(params.affine_shape) if params.beta is None else params.beta.astype(np.float64)
    spatial = tuple(range(2, x.ndim))
    per_channel = (channels,) + (1,) * len(spatial)
    if kind is bf.FilterType.layer_norm:
        axes = tuple(range(1 + params.type.normalization_axis, x.ndim))
        mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
        z = gamma * (x - mean) / np.sqrt(var + eps) + beta  # gamma aligns with the trailing axes
    elif kind is bf.FilterType.group_norm:
        xg = x.reshape(n, params.type.group_count, -1)
        mean, var = xg.mean(axis=2, keepdims=True), xg.var(axis=2, keepdims=True)
        xhat = ((xg - mean) / np.sqrt(var + eps)).reshape(x.shape)
        z = gamma.reshape(per_channel) * xhat + beta.reshape(per_channel)
    else:
        if phase == "inference" and moving is not None:
            mean, var = (m.astype(np.float64).reshape(per_channel) for m in moving)
        else:
            axes = (0, *spatial) if kind is bf.FilterType.batch_norm else spatial
            mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
        z = gamma.reshape(per_channel) * (x - mean) / np.sqrt(var + eps) + beta.reshape(per_channel)
    return params.activation.forward(z)


# --- forward ----------------------------------------------------------------------------


def test_apple_instance_norm_example(backend_name):
    # Per-sample shape (3, 1, 9); the channels hold 1…9, 10…90 and 100…900; gamma 1, no beta,
    # epsilon 0, inference without moving statistics. Each channel is k·(1…9) with mean 5k
    # and biased variance 20k²/3, so every channel normalizes to (i − 5)/sqrt(20/3).
    x = (np.arange(1, 10, dtype=np.float32) * np.array([1, 10, 100], np.float32)[:, None]).reshape(1, 3, 1, 9)
    params = NormalizationParameters(type=NormalizationType.instance(), input_shape=(3, 1, 9),
                                     gamma=np.ones(3), epsilon=0.0)
    with make_layer(params, backend_name) as layer:
        y = layer.apply(x, phase="inference")
    expected = [-1.549, -1.162, -0.775, -0.387, 0.0, 0.387, 0.775, 1.162, 1.549]
    for channel in range(3):
        np.testing.assert_allclose(y[0, channel, 0], expected, atol=5e-4)
        np.testing.assert_allclose(y[0, channel, 0], (np.arange(1, 10) - 5) / math.sqrt(20 / 3), rtol=2e-6,
                                   atol=1e-6)


@pytest.mark.parametrize("rank", sorted(SHAPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("phase", ["training", "inference"])
def test_forward_matches_reference(backend_name, rng, kind, rank, phase):
    shape = SHAPES[rank]
    moving = kind in ("batch", "instance")
    params = make_params(kind, shape, rng, moving=moving, activation=Activation.gelu())
    layer = make_layer(params, backend_name)
    stats = (layer.moving_mean.copy(), layer.moving_variance.copy()) if moving else None
    x = rng.standard_normal((3, *shape)) * 2.0 + 0.5
    expected = reference_forward(x, params, phase, stats)
    np.testing.assert_allclose(layer.apply(x, phase=phase), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_layer_norm_every_axis(backend_name, rng, axis):
    shape = SHAPES[4]
    params = make_params("layer", shape, rng, axis=axis)
    assert params.gamma.shape == shape[axis:]
    x = rng.standard_normal((2, *shape))
    with make_layer(params, backend_name) as layer:
        np.testing.assert_allclose(layer.apply(x), reference_forward(x, params, "training"), rtol=1e-12,
                                   atol=1e-12)


def test_missing_gamma_and_beta_mean_one_and_zero(backend_name, rng):
    params = NormalizationParameters(type=NormalizationType.group(group_count=2), input_shape=(4, 3),
                                     dtype=np.float64)
    layer = make_layer(params, backend_name)
    np.testing.assert_array_equal(layer.gamma, np.ones(4))
    np.testing.assert_array_equal(layer.beta, np.zeros(4))
    x = rng.standard_normal((2, 4, 3))
    xg = x.reshape(2, 2, 6)
    expected = (xg - xg.mean(axis=2, keepdims=True)) / np.sqrt(xg.var(axis=2, keepdims=True) + 1e-5)
    expected = expected.reshape(x.shape)
    np.testing.assert_allclose(layer.apply(x), expected, rtol=1e-12, atol=1e-12)


# --- moving statistics and the inference path (numbers worked out by hand) --------------


def test_batch_norm_moving_statistics_by_hand(backend_name):
    # C = 2 channels, 2 positions, N = 2 samples.
    #   channel 0 holds 1, 3 | 5, 7:   mean 4, biased variance (9 + 1 + 1 + 9) / 4 = 5
    #   channel 1 holds -1, 3 | -1, 3: mean 1, biased variance (4 + 4 + 4 + 4) / 4 = 4
    # momentum 0.5 with moving mean (2, 5) and moving variance (1, 12):
    #   moving mean     = 0.5·(2, 5)  + 0.5·(4, 1) = (3, 3)
    #   moving variance = 0.5·(1, 12) + 0.5·(5, 4) = (3, 8)
    x = np.array([[[1, 3], [-1, 3]], [[5, 7], [-1, 3]]], dtype=np.float32)
    moving_mean = np.array([2, 5], np.float32)
    moving_variance = np.array([1, 12], np.float32)
    params = NormalizationParameters(
        type=NormalizationType.batch(moving_mean=moving_mean, moving_variance=moving_variance),
        input_shape=(2, 2), gamma=[2.0, 1.0], beta=[0.5, -1.0], momentum=0.5, epsilon=1.0,
    )
    layer = make_layer(params, backend_name)
    y = layer.apply(x, phase="training")
    np.testing.assert_array_equal(layer.moving_mean, [3, 3])
    np.testing.assert_array_equal(layer.moving_variance, [3, 8])
    np.testing.assert_array_equal(moving_mean, [2, 5])  # the layer owns a copy (no client pointer)
    # Training normalized with the batch statistics: channel 0 (x − 4)/sqrt(6)·2 + 0.5.
    np.testing.assert_allclose(y[:, 0], (x[:, 0] - 4) / math.sqrt(6) * 2 + 0.5, rtol=1e-6)
    np.testing.assert_allclose(y[:, 1], (x[:, 1] - 1) / math.sqrt(5) - 1, rtol=1e-6)

    # Inference uses the moving statistics (σ² + ε = 4 and 9) and leaves them alone:
    #   channel 0: 2·(x − 3)/2 + 0.5 = x − 2.5      channel 1: (x − 3)/3 − 1
    probe = np.array([[[7, 3], [9, 0]]], dtype=np.float32)
    y = layer.apply(probe, phase="inference")
    np.testing.assert_allclose(y, [[[4.5, 0.5], [1.0, -2.0]]], rtol=1e-6)
    np.testing.assert_array_equal(layer.moving_mean, [3, 3])
    np.testing.assert_array_equal(layer.moving_variance, [3, 8])

    # A second training step compounds: mean 0.5·3 + 0.5·4 = 3.5 and 0.5·3 + 0.5·1 = 2.
    layer.apply(x, phase=bf.LearningPhase.training)
    np.testing.assert_array_equal(layer.moving_mean, [3.5, 2])
    np.testing.assert_array_equal(layer.moving_variance, [4, 6])


@pytest.mark.parametrize("momentum, mean, variance", [(0.0, 3.5, 2.5), (0.5, 2.5, 1.5), (1.0, 1.5, 0.5)])
def test_instance_norm_moving_statistics_by_hand(backend_name, momentum, mean, variance):
    # C = 1, 2 positions, N = 2: sample 0 holds 0, 2 (mean 1, var 1), sample 1 holds 4, 8
    # (mean 6, var 4). The batch statistic is the mean over samples: mean 3.5, variance 2.5.
    # Starting from moving (1.5, 0.5): momentum·old + (1 − momentum)·(3.5, 2.5).
    x = np.array([[[0, 2]], [[4, 8]]], dtype=np.float64)
    params = NormalizationParameters(
        type=NormalizationType.instance(moving_mean=[1.5], moving_variance=[0.5]),
        input_shape=(1, 2), momentum=momentum, epsilon=0.0, dtype=np.float64,
    )
    layer = make_layer(params, backend_name)
    y = layer.apply(x, phase="training")
    np.testing.assert_allclose(y, [[[-1, 1]], [[-1, 1]]], rtol=1e-12)  # each instance on its own
    np.testing.assert_allclose(layer.moving_mean, [mean], rtol=1e-15)
    np.testing.assert_allclose(layer.moving_variance, [variance], rtol=1e-15)
    # Inference applies the moving statistics to every instance alike.
    y = layer.apply(x, phase="inference")
    np.testing.assert_allclose(y, (x - mean) / math.sqrt(variance), rtol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_inference_without_moving_statistics_uses_the_batch(backend_name, rng, kind):
    params = make_params(kind, (4, 3), rng)
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((3, 4, 3))
    np.testing.assert_array_equal(layer.apply(x, phase="inference"), layer.apply(x, phase="training"))
    assert layer.moving_mean is None and layer.moving_variance is None


# --- backward: finite differences in float64 ---------------------------------------------


def check_gradients(layer: NormalizationLayer, x: np.ndarray, phase: str, rng: np.random.Generator,
                    *, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    dy = rng.standard_normal(x.shape)

    def loss() -> float:
        return float(np.sum(dy * layer.apply(x, phase=phase)))

    y = layer.apply(x, phase=phase)
    grads = layer.apply_backward(x, dy, output=y, phase=phase)
    assert isinstance(grads, NormalizationGradients)
    assert_gradient_close(grads.input, numerical_gradient(loss, x), rtol=rtol, atol=atol, name="input")
    # gamma and beta are the layer's live arrays: perturbing them in place changes the forward.
    assert_gradient_close(grads.gamma, numerical_gradient(loss, layer.gamma), rtol=rtol, atol=atol,
                          name="gamma")
    assert_gradient_close(grads.beta, numerical_gradient(loss, layer.beta), rtol=rtol, atol=atol, name="beta")


@pytest.mark.parametrize("rank", sorted(SHAPES))
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("phase", ["training", "inference"])
@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_finite_differences(backend_name, rng, kind, phase, activation, rank):
    # Batch and instance norm carry moving statistics, so their inference backward is the
    # constant-statistics one; layer and group norm differentiate through the statistics.
    shape = SHAPES[rank]
    params = make_params(kind, shape, rng, moving=kind in ("batch", "instance"),
                         activation=ACTIVATIONS[activation])
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((3, *shape)) * 1.5 + 0.3
    check_gradients(layer, x, phase, rng)


@pytest.mark.parametrize("kind", ["batch", "instance"])
def test_inference_gradients_without_moving_statistics(backend_name, rng, kind):
    # Without moving statistics inference normalizes with the batch's: full gradient.
    params = make_params(kind, SHAPES[3], rng, activation=Activation.sigmoid())
    check_gradients(make_layer(params, backend_name), rng.standard_normal((3, *SHAPES[3])), "inference", rng)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_layer_norm_gradients_every_axis(backend_name, rng, axis):
    params = make_params("layer", SHAPES[4], rng, axis=axis, activation=Activation.tanh())
    check_gradients(make_layer(params, backend_name), rng.standard_normal((2, *SHAPES[4])), "training", rng)


def test_inference_gradient_with_moving_statistics_is_the_constant_one(backend_name, rng):
    # dx = dy·gamma/sqrt(moving_variance + eps), channel by channel.
    params = make_params("batch", (4, 3), rng, moving=True)
    layer = make_layer(params, backend_name)
    x, dy = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 3))
    g = layer.apply_backward(x, dy, phase="inference")
    scale = layer.gamma / np.sqrt(layer.moving_variance + params.epsilon)
    np.testing.assert_allclose(g.input, dy * scale[:, None], rtol=1e-12)
    xhat = (x - layer.moving_mean[:, None]) / np.sqrt(layer.moving_variance[:, None] + params.epsilon)
    np.testing.assert_allclose(g.gamma, np.sum(dy * xhat, axis=(0, 2)), rtol=1e-12)
    np.testing.assert_allclose(g.beta, np.sum(dy, axis=(0, 2)), rtol=1e-12)


def test_backward_does_not_touch_moving_statistics(backend_name, rng):
    params = make_params("batch", (4, 3), rng, moving=True)
    layer = make_layer(params, backend_name)
    before = layer.moving_mean.copy(), layer.moving_variance.copy()
    x = rng.standard_normal((2, 4, 3))
    layer.apply_backward(x, np.ones_like(x), phase="training")
    np.testing.assert_array_equal(layer.moving_mean, before[0])
    np.testing.assert_array_equal(layer.moving_variance, before[1])


# --- buffers, in-place, accumulate, dtypes, backends -------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_same_results_on_every_backend(backend_name, rng, kind):
    shape = (4, 3, 5)
    params = make_params(kind, shape, rng, moving=kind in ("batch", "instance"), activation=Activation.silu(),
                         dtype=np.float32)
    x = rng.standard_normal((3, *shape)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    results = {}
    for name in ("numpy", backend_name):
        layer = make_layer(params, name)
        y = layer.apply(x, training=True)
        g = layer.apply_backward(x, dy, output=y, training=True)
        results[name] = (y, g.input, g.gamma, g.beta, layer.moving_mean)
    for ours, reference in zip(results[backend_name], results["numpy"]):
        if reference is not None:
            np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_in_place_forward(backend_name, rng, kind):
    params = make_params(kind, (4, 6), rng, activation=Activation.relu(), dtype=np.float32)
    x = rng.standard_normal((3, 4, 6)).astype(np.float32)
    expected = make_layer(params, backend_name).apply(x)
    buffer = x.copy()
    assert make_layer(params, backend_name).apply(buffer, output=buffer) is buffer
    np.testing.assert_array_equal(buffer, expected)
    # A different view of the same memory also counts as in place.
    buffer = x.copy()
    make_layer(params, backend_name).apply(buffer, output=buffer[...])
    np.testing.assert_array_equal(buffer, expected)


def test_output_buffers_and_non_contiguous_arrays(backend_name, rng):
    params = make_params("group", (4, 6), rng, dtype=np.float64)
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((3, 4, 12))[:, :, ::2]  # not contiguous
    expected = reference_forward(x, params, "training")
    out = np.empty((3, 4, 6))
    assert layer.apply(x, output=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    strided = np.empty((3, 4, 12))[:, :, 1::2]
    layer.apply(x, output=strided)
    np.testing.assert_allclose(strided, expected, rtol=1e-12)
    dy = rng.standard_normal((3, 4, 6))
    reference = layer.apply_backward(np.ascontiguousarray(x), dy)
    dx = np.empty((6, 4, 6))[::2]
    g = layer.apply_backward(x, dy, input_gradient=dx)
    assert g.input is dx
    np.testing.assert_allclose(dx, reference.input, rtol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_inputs_are_never_modified(backend_name, rng, kind):
    params = make_params(kind, (4, 2, 3), rng, moving=kind in ("batch", "instance"),
                         activation=Activation.gelu(), dtype=np.float32)
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((3, 4, 2, 3)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    saved = x.copy(), dy.copy()
    for phase in ("training", "inference"):
        y = layer.apply(x, phase=phase)
        y_saved = y.copy()
        layer.apply_backward(x, dy, output=y, phase=phase)
        np.testing.assert_array_equal(y, y_saved)
    np.testing.assert_array_equal(x, saved[0])
    np.testing.assert_array_equal(dy, saved[1])


@pytest.mark.parametrize("activation", ["identity", "sigmoid", "gelu"])
@pytest.mark.parametrize("kind", KINDS)
def test_input_gradient_may_overwrite_dy(backend_name, rng, kind, activation):
    params = make_params(kind, (4, 3), rng, activation=ACTIVATIONS[activation])
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((3, 4, 3))
    dy = rng.standard_normal(x.shape)
    y = layer.apply(x)
    expected = layer.apply_backward(x, dy, output=y)
    g = layer.apply_backward(x, dy, output=y, input_gradient=dy)
    assert g.input is dy
    np.testing.assert_allclose(dy, expected.input, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_size_may_change_between_calls(backend_name, rng, kind):
    # The layer reuses its backward workspaces; a new batch size must not confuse them.
    params = make_params(kind, (4, 3), rng, activation=Activation.softplus())
    layer = make_layer(params, backend_name)
    for n in (2, 5, 2):
        x, dy = rng.standard_normal((n, 4, 3)), rng.standard_normal((n, 4, 3))
        y = layer.apply(x)
        g = layer.apply_backward(x, dy, output=y)
        fresh = make_layer(params, backend_name).apply_backward(x, dy, output=y)
        for name in ("input", "gamma", "beta"):
            np.testing.assert_array_equal(getattr(g, name), getattr(fresh, name))


def test_concurrent_backward_calls_agree(backend_name, rng):
    # One layer used from several threads: each call either takes the layer's workspaces or
    # allocates its own, never shares them.
    from concurrent.futures import ThreadPoolExecutor

    params = make_params("group", (4, 64, 32), rng, activation=Activation.gelu(), dtype=np.float32)
    layer = make_layer(params, backend_name)
    batches = [rng.standard_normal((4, 4, 64, 32)).astype(np.float32) for _ in range(6)]
    expected = [layer.apply_backward(x, x, output=layer.apply(x)).input for x in batches]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda x: layer.apply_backward(x, x, output=layer.apply(x)).input, batches))
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_accumulate_adds_into_the_buffers(backend_name, rng, kind):
    params = make_params(kind, (4, 3), rng, moving=kind in ("batch", "instance"))
    layer = make_layer(params, backend_name)
    x, dy = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 3))
    fresh = layer.apply_backward(x, dy, training=True)
    dx = np.full(x.shape, 0.25)
    dbeta, dgamma = np.full(params.affine_shape, -1.0), np.full(params.affine_shape, 2.0)
    g = layer.apply_backward(x, dy, input_gradient=dx, beta_gradient=dbeta, gamma_gradient=dgamma,
                             accumulate=True, training=True)
    assert g.input is dx and g.beta is dbeta and g.gamma is dgamma
    np.testing.assert_allclose(dx, fresh.input + 0.25, rtol=1e-12)
    np.testing.assert_allclose(dbeta, fresh.beta - 1.0, rtol=1e-12)
    np.testing.assert_allclose(dgamma, fresh.gamma + 2.0, rtol=1e-12)
    # Without accumulate the buffers are overwritten.
    layer.apply_backward(x, dy, input_gradient=dx, beta_gradient=dbeta, gamma_gradient=dgamma,
                         training=True)
    np.testing.assert_allclose(dx, fresh.input, rtol=1e-12)
    np.testing.assert_allclose(dbeta, fresh.beta, rtol=1e-12)
    np.testing.assert_allclose(dgamma, fresh.gamma, rtol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_float32_agrees_with_float64(backend_name, rng, kind):
    shape = (8, 5, 7)
    p64 = make_params(kind, shape, rng, activation=Activation.tanh(), dtype=np.float64)
    p32 = attrs.evolve(p64, dtype=np.float32)
    x = (rng.standard_normal((4, *shape)) * 3 + 10).astype(np.float32).astype(np.float64)
    dy = rng.standard_normal(x.shape).astype(np.float32).astype(np.float64)
    l64, l32 = make_layer(p64, backend_name), make_layer(p32, backend_name)
    y64, y32 = l64.apply(x), l32.apply(x.astype(np.float32))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-5, atol=1e-5)
    g64 = l64.apply_backward(x, dy, output=y64)
    g32 = l32.apply_backward(x.astype(np.float32), dy.astype(np.float32), output=y32)
    for name in ("input", "gamma", "beta"):
        a, b = getattr(g32, name), getattr(g64, name)
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max(), err_msg=name)


def test_client_pointer_shares_the_callers_arrays(backend_name, rng):
    gamma, beta = np.ones(4), np.zeros(4)
    mean, variance = np.zeros(4), np.ones(4)
    params = NormalizationParameters(type=NormalizationType.batch(moving_mean=mean, moving_variance=variance),
                                     input_shape=(4, 2), gamma=gamma, beta=beta, dtype=np.float64)
    layer = make_layer(params, backend_name, use_client_pointer=True)
    assert layer.gamma is gamma and layer.beta is beta
    assert layer.moving_mean is mean and layer.moving_variance is variance
    x = rng.standard_normal((3, 4, 2)) + 2.0
    layer.apply(x, phase="training")  # momentum 0: the moving statistics become the batch's
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2)), rtol=1e-12)
    np.testing.assert_allclose(variance, x.var(axis=(0, 2)), rtol=1e-12)
    gamma *= 2.0  # an optimizer step on the caller's array is seen by the next call
    np.testing.assert_allclose(layer.apply(x, phase="inference"),
                               2.0 * (x - mean[:, None]) / np.sqrt(variance[:, None] + 1e-5))
    copied = make_layer(params, backend_name)
    assert copied.gamma is not gamma and copied.moving_mean is not mean


def test_live_arrays_can_be_updated_in_place(backend_name, rng):
    params = make_params("layer", (4, 3), rng, axis=1)
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((2, 4, 3))
    y = layer.apply(x)
    live = layer.beta
    layer.beta += 1.0  # an optimizer step: stays the same live array
    assert layer.beta is live
    np.testing.assert_allclose(layer.apply(x), y + 1.0, rtol=1e-12)
    assert params.beta is not layer.beta
    layer.gamma = [2.0, 2.0, 2.0]  # assignment copies into the live array
    np.testing.assert_array_equal(layer.gamma, [2.0, 2.0, 2.0])
    with pytest.raises(bf.ShapeError, match=r"NormalizationLayer.gamma must be of shape \(3,\)"):
        layer.gamma = np.ones(4)
    with pytest.raises(bf.InvalidParameterError, match=r"NormalizationLayer.beta must be finite"):
        layer.beta = [0.0, np.nan, 0.0]


def test_nan_in_input_propagates_to_its_statistics_set_only(backend_name, rng):
    params = make_params("layer", (4, 3), rng, dtype=np.float32)
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((3, 4, 3)).astype(np.float32)
    x[1, 2, 0] = np.nan
    y = layer.apply(x)  # no warning (pytest runs with -W error)
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()


def test_zero_epsilon_with_a_constant_set_gives_nan_without_warnings(backend_name):
    params = NormalizationParameters(type=NormalizationType.instance(), input_shape=(2, 3), epsilon=0.0)
    x = np.array([[[1, 1, 1], [1, 2, 3]]], np.float32)
    y = make_layer(params, backend_name).apply(x)
    assert np.isnan(y[0, 0]).all() and np.isfinite(y[0, 1]).all()


# --- lifecycle and errors ------------------------------------------------------------------


def test_closed_layer_raises(backend_name, rng):
    params = make_params("batch", (4,), rng)
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((2, 4))
    layer.close()
    layer.close()
    with pytest.raises(bf.FilterClosedError, match=r"NormalizationLayer.apply\(\) was called after close"):
        layer.apply(x)
    with pytest.raises(bf.FilterClosedError, match="apply_backward"):
        layer.apply_backward(x, x)
    with pytest.raises(bf.FilterClosedError):
        layer.gamma
    assert "closed" in repr(layer)


def test_repr_and_properties(backend_name, rng):
    params = make_params("group", (4, 3), rng)
    layer = make_layer(params, backend_name)
    assert repr(layer) == (f"<NormalizationLayer type=group_norm, group_count=2, input_shape=(4, 3), "
                           f"dtype=float64, activation=identity, backend={layer.backend.name!r}, open>")
    live = layer.layer_parameters
    assert attrs.evolve(live, gamma=params.gamma, beta=params.beta) == params
    assert live.gamma is not None and not live.gamma.flags.writeable  # views of the layer's own copies
    assert layer.input_shape == (4, 3) and layer.dtype == np.float64


def _params(**changes):
    base = dict(type=NormalizationType.batch(), input_shape=(4, 3))
    base.update(changes)
    return NormalizationParameters(**base)


@pytest.mark.parametrize(
    "changes, error, message",
    [
        (dict(type=NormalizationType.group(group_count=3)), bf.InvalidParameterError,
         r"input_shape\[0\] \(channels\) must be divisible by NormalizationType.group_count = 3; got 4"),
        (dict(gamma=np.ones(3)), bf.ShapeError,
         r"NormalizationParameters.gamma must be of shape \(4,\); got 'shape \(3,\) float32'"),
        (dict(beta=np.ones((4, 3))), bf.ShapeError, r"NormalizationParameters.beta must be of shape \(4,\)"),
        (dict(type=NormalizationType.layer(1), gamma=np.ones(4)), bf.ShapeError,
         r"NormalizationParameters.gamma must be of shape \(3,\)"),
        (dict(type=NormalizationType.batch(moving_mean=np.zeros(3), moving_variance=np.ones(3))),
         bf.ShapeError,
         r"NormalizationParameters.type.moving_mean must be of shape \(4,\)"),
        (dict(type=NormalizationType.instance(moving_mean=np.zeros(4), moving_variance=np.ones(5))),
         bf.ShapeError,
         r"type.moving_variance must be of shape \(4,\)"),
        (dict(type=NormalizationType.batch(moving_mean=np.zeros(4), moving_variance=-np.ones(4))),
         bf.InvalidParameterError, r"moving_variance must be >= 0 everywhere"),
        (dict(momentum=1.5), bf.InvalidParameterError,
         r"NormalizationParameters.momentum must be in \[0, 1\]; got 1.5\."),
        (dict(momentum=-0.1), bf.InvalidParameterError, r"momentum must be in \[0, 1\]; got -0.1\."),
        (dict(epsilon=-1e-3), bf.InvalidParameterError,
         r"NormalizationParameters.epsilon must be >= 0; got -0.001\."),
        (dict(epsilon=float("nan")), bf.InvalidParameterError,
         r"NormalizationParameters.epsilon must be finite"),
        (dict(type=NormalizationType.layer(normalization_axis=2)), bf.InvalidParameterError,
         r"NormalizationParameters.type.normalization_axis must be in \[0, 1\] "
         r"for input_shape \(4, 3\); got 2"),
        (dict(gamma=[1.0, np.nan, 1.0, 1.0]), bf.InvalidParameterError, r"gamma must be finite"),
        (dict(beta=[1.0, np.inf, 1.0, 1.0]), bf.InvalidParameterError, r"beta must be finite"),
        (dict(dtype=np.float16), bf.DTypeError,
         r"NormalizationParameters.dtype must be float32 or float64; got 'float16'"),
        (dict(activation=Activation(11)),
         bf.InvalidParameterError, r"NormalizationParameters.activation must be a per-element activation"),
        (dict(activation="relu"), bf.InvalidParameterError, r"activation must be an Activation"),
        (dict(input_shape=()), bf.InvalidParameterError, r"input_shape must be a tuple of positive extents"),
        (dict(input_shape=(4, 0)), bf.InvalidParameterError,
         r"input_shape\[1\] must be an integer >= 1; got 0"),
        (dict(type="batch"), bf.InvalidParameterError,
         r"NormalizationParameters.type must be a NormalizationType"),
    ],
)
def test_invalid_parameters(changes, error, message):
    with pytest.raises(error, match=message):
        _params(**changes)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: NormalizationType.batch(moving_mean=np.zeros(4)),
         r"given together or not at all; got 'only moving_mean'"),
        (lambda: NormalizationType(kind="layer_norm", normalization_axis=-1),
         r"normalization_axis must be an integer >= 0"),
        (lambda: NormalizationType.group(group_count=0), r"group_count must be an integer >= 1; got 0"),
        (lambda: NormalizationType(kind="convolution"), r"NormalizationType.kind must be one of batch_norm"),
        (lambda: NormalizationType(kind="group_norm", group_count=2, moving_mean=[0], moving_variance=[1]),
         r"NormalizationType.moving_mean must be None for group_norm"),
        (lambda: NormalizationType(kind="batch_norm", group_count=2),
         r"group_count must be None for batch_norm"),
        (lambda: NormalizationType.instance(moving_mean="zero", moving_variance=[1.0]),
         r"NormalizationType.moving_mean must be None or an array of real numbers; got 'text'"),
    ],
)
def test_invalid_types(build, message):
    with pytest.raises(bf.InvalidParameterError, match=message):
        build()


def test_types_compare_by_value():
    assert NormalizationType.layer(1) == NormalizationType(kind=4, normalization_axis=1)
    same = NormalizationType.batch(np.array([0.0, 1.0]), [1, 1])
    assert NormalizationType.batch([0.0, 1.0], [1.0, 1.0]) == same
    assert NormalizationType.batch([0.0, 1.0], [1.0, 1.0]) != NormalizationType.batch([0.0, 2.0], [1.0, 1.0])
    assert hash(_params()) == hash(_params())
    assert NormalizationType.group(2).kind is bf.FilterType.group_norm


def test_invalid_calls(backend_name, rng):
    params = make_params("batch", (4, 3), rng, activation=Activation.sigmoid(), dtype=np.float32)
    layer = make_layer(params, backend_name)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    with pytest.raises(bf.ShapeError, match=r"NormalizationLayer.apply\(x\) must be of shape \(N, 4, 3\) "
                                            r"or unbatched \(4, 3\); "
                                            r"got 'shape \(2, 3, 4\) float32'\."):
        layer.apply(x.reshape(2, 3, 4))
    with pytest.raises(bf.ShapeError, match=r"at least one sample"):
        layer.apply(x[:0])
    with pytest.raises(bf.DTypeError, match=r"NormalizationLayer.apply\(x\) must be a float32 array "
                                            r"\(the layer's dtype\); got 'float64'"):
        layer.apply(x.astype(np.float64))
    with pytest.raises(bf.InvalidParameterError, match=r"apply\(phase\) must be one of training, inference"):
        layer.apply(x, phase="testing")
    with pytest.raises(bf.InvalidParameterError,
                       match=r"apply\(output\) must be x itself or an array that does not overlap x"):
        big = np.zeros((3, 4, 3), np.float32)
        layer.apply(big[:2], output=big[1:])
    with pytest.raises(bf.ShapeError, match=r"apply\(output\) must be of shape \(2, 4, 3\)"):
        layer.apply(x, output=np.empty((2, 4, 4), np.float32))
    y = layer.apply(x)
    with pytest.raises(bf.InvalidParameterError,
                       match=r"apply_backward\(output\) must be the forward output "
                             r"\(the fused sigmoid activation needs it"):
        layer.apply_backward(x, y)
    with pytest.raises(bf.ShapeError, match=r"apply_backward\(dy\) must be of shape \(2, 4, 3\)"):
        layer.apply_backward(x, y[:1], output=y)
    with pytest.raises(bf.DTypeError, match=r"apply_backward\(dy\)"):
        layer.apply_backward(x, y.astype(np.float64), output=y)
    with pytest.raises(bf.ShapeError, match=r"apply_backward\(gamma_gradient\) must be of shape \(4,\)"):
        layer.apply_backward(x, y, output=y, gamma_gradient=np.zeros(3, np.float32))
    with pytest.raises(bf.InvalidParameterError,
                       match=r"input_gradient\) must be an array that does not overlap x"):
        layer.apply_backward(x, y.copy(), output=y, input_gradient=x)
    dy = y.copy()
    with pytest.raises(bf.InvalidParameterError, match=r"does not overlap dy when accumulate=True"):
        layer.apply_backward(x, dy, output=y, input_gradient=dy, accumulate=True)
    with pytest.raises(bf.InvalidParameterError, match=r"accumulate\) must be True or False"):
        layer.apply_backward(x, dy, output=y, accumulate=1)
    with pytest.raises(bf.InvalidParameterError,
                       match=r"NormalizationLayer\(parameters\) must be a NormalizationParameters"):
        NormalizationLayer({"type": "batch"})


def test_read_only_moving_statistics_need_a_copy(backend_name):
    mean, variance = np.zeros(2), np.ones(2)
    mean.flags.writeable = False
    params = NormalizationParameters(type=NormalizationType.batch(mean, variance), input_shape=(2,),
                                     dtype=np.float64)
    make_layer(params, backend_name)  # the layer's own copy is writable
    with pytest.raises(bf.InvalidParameterError, match=r"NormalizationType.moving_mean must be writable"):
        make_layer(params, backend_name, use_client_pointer=True)


# --- optional cross-check against PyTorch ---------------------------------------------------


def test_matches_pytorch_batch_norm(backend_name, rng):
    torch = pytest.importorskip("torch")
    n, c, h, w = 4, 3, 5, 2
    x = rng.standard_normal((n, c, h, w))
    dy = rng.standard_normal(x.shape)
    gamma, beta = rng.uniform(0.5, 1.5, c), rng.standard_normal(c)
    momentum = 0.8
    params = NormalizationParameters(
        type=NormalizationType.batch(moving_mean=np.zeros(c), moving_variance=np.ones(c)),
        input_shape=(c, h, w),
        gamma=gamma, beta=beta, momentum=momentum, dtype=np.float64,
    )
    layer = make_layer(params, backend_name)
    y = layer.apply(x, training=True)
    g = layer.apply_backward(x, dy, training=True)
    bn = torch.nn.BatchNorm2d(c, eps=params.epsilon, momentum=1.0 - momentum).double()
    with torch.no_grad():
        bn.weight.copy_(torch.from_numpy(gamma))
        bn.bias.copy_(torch.from_numpy(beta))
    tx = torch.from_numpy(x).requires_grad_(True)
    ty = bn(tx)
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g.input, tx.grad.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(g.gamma, bn.weight.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(g.beta, bn.bias.grad.numpy(), rtol=1e-10)
    m = n * h * w  # PyTorch keeps the unbiased variance: convert it to the biased one
    np.testing.assert_allclose(layer.moving_mean, bn.running_mean.numpy(), rtol=1e-10)
    np.testing.assert_allclose(layer.moving_variance,
                               momentum * 1.0 + (1 - momentum) * x.var(axis=(0, 2, 3)), rtol=1e-10)
    unbiased_part = (bn.running_var.numpy() - momentum * 1.0) / (1 - momentum)
    np.testing.assert_allclose(unbiased_part * (m - 1) / m, x.var(axis=(0, 2, 3)), rtol=1e-10)


@pytest.mark.parametrize("kind", ["layer", "group"])
def test_matches_pytorch_layer_and_group_norm(backend_name, rng, kind):
    torch = pytest.importorskip("torch")
    shape = (4, 3, 2)
    x = rng.standard_normal((3, *shape))
    dy = rng.standard_normal(x.shape)
    params = make_params(kind, shape, rng, axis=1)
    layer = make_layer(params, backend_name)
    y = layer.apply(x)
    g = layer.apply_backward(x, dy)
    tx = torch.from_numpy(x).requires_grad_(True)
    tgamma = torch.from_numpy(params.gamma.copy()).requires_grad_(True)
    tbeta = torch.from_numpy(params.beta.copy()).requires_grad_(True)
    if kind == "layer":
        ty = torch.nn.functional.layer_norm(tx, shape[1:], tgamma, tbeta, eps=params.epsilon)
    else:
        ty = torch.nn.functional.group_norm(tx, 2, tgamma, tbeta, eps=params.epsilon)
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g.input, tx.grad.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(g.gamma, tgamma.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g.beta, tbeta.grad.numpy(), rtol=1e-10, atol=1e-12)


# --- the blocked, multithreaded kernels of the scipy-blas backend --------------------------

# Odd extents, so that blocks of whole rows split the batch unevenly.
BLOCKED_SHAPES = {"batch": (5, 7, 9, 11), "instance": (3, 6, 13, 7), "layer": (7, 5, 33),
                  "group": (3, 6, 5, 7)}


def _blocked_case(kind: str, rng: np.random.Generator, activation: Activation, dtype=np.float64):
    shape = BLOCKED_SHAPES[kind]
    channels = shape[1]
    if kind in ("batch", "instance"):
        ntype = getattr(NormalizationType, kind)(moving_mean=rng.standard_normal(channels),
                                                 moving_variance=rng.uniform(0.5, 2.0, channels))
    elif kind == "layer":
        ntype = NormalizationType.layer(normalization_axis=len(shape) - 2)
    else:
        ntype = NormalizationType.group(group_count=3)
    affine = shape[-1:] if kind == "layer" else (channels,)
    params = NormalizationParameters(type=ntype, input_shape=shape[1:], gamma=rng.uniform(0.5, 1.5, affine),
                                     beta=rng.standard_normal(affine), activation=activation, momentum=0.3,
                                     dtype=dtype)
    x = (rng.standard_normal(shape) * 2.0 + 3.0).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    return params, x, dy


# What _run returns, in order.
RESULTS = ("output", "input", "gamma", "beta", "moving_mean", "moving_variance")


def _run(params, backend, x, dy, phase, **filter_options):
    layer = NormalizationLayer(params, FilterParameters(backend=backend, **filter_options))
    y = layer.apply(x, phase=phase)
    g = layer.apply_backward(x, dy, output=y, phase=phase)
    return y, g.input, g.gamma, g.beta, layer.moving_mean, layer.moving_variance


@pytest.mark.parametrize("block", [1, 64, 97, 1 << 16])
@pytest.mark.parametrize("activation", ["identity", "sigmoid", "gelu"])
@pytest.mark.parametrize("phase", ["training", "inference"])
@pytest.mark.parametrize("kind", KINDS)
def test_blocked_kernels_match_the_reference(rng, kind, phase, activation, block):
    # Blocks of one row, of a few rows with a remainder, and one block for everything.
    params, x, dy = _blocked_case(kind, rng, ACTIVATIONS[activation])
    ours = _run(params, blocked_backend(block, block), x, dy, phase)
    reference = _run(params, "numpy", x, dy, phase)
    for name, a, b in zip(RESULTS, ours, reference):
        if b is not None:
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_blocked_kernels_float32_agree_with_the_reference(rng, kind):
    params, x, dy = _blocked_case(kind, rng, Activation.tanh(), dtype=np.float32)
    ours = _run(params, blocked_backend(64, 64), x, dy, "training")
    reference = _run(params, "numpy", x, dy, "training")
    for name, a, b in zip(RESULTS, ours, reference):
        if b is not None:
            assert a.dtype == np.float32
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * np.abs(b).max(), err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_thread_count_does_not_change_results(rng, kind):
    # The blocks depend on the shape only and partial sums are combined in block order, so
    # one, two or more threads give identical bits.
    params, x, dy = _blocked_case(kind, rng, Activation.gelu(), dtype=np.float32)
    backend = blocked_backend(64, 64)
    results = [_run(params, backend, x, dy, "training", n_threads=threads) for threads in (1, 2, 3)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            if a is not None:
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_default_blocks_one_and_two_threads_agree(rng, kind):
    # Above the size limit, with the default block sizes (which differ with the thread count).
    shape = {"batch": (6, 8, 40, 40), "instance": (4, 8, 40, 40), "layer": (6, 64, 128),
             "group": (4, 8, 40, 40)}[kind]
    channels = shape[1]
    ntype = {"batch": NormalizationType.batch(np.zeros(channels), np.ones(channels)),
             "instance": NormalizationType.instance(),
             "layer": NormalizationType.layer(normalization_axis=1),
             "group": NormalizationType.group(group_count=4)}[kind]
    affine = shape[-1:] if kind == "layer" else (channels,)
    params = NormalizationParameters(type=ntype, input_shape=shape[1:], gamma=rng.uniform(0.5, 1.5, affine),
                                     beta=rng.standard_normal(affine), dtype=np.float32)
    x = (rng.standard_normal(shape) + 1.0).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    assert _channel_plan(ScipyBlasBackend(), x.reshape(shape[0], channels, 1, -1), 1) is not None
    one = _run(params, "scipy-blas", x, dy, "training", n_threads=1)
    two = _run(params, "scipy-blas", x, dy, "training", n_threads=2)
    reference = _run(params, "numpy", x, dy, "training")
    for name, a, b, c in zip(RESULTS, one, two, reference):
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(a).max(), err_msg=name)
            np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-4 * np.abs(c).max(), err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_blocked_backward_may_overwrite_dy_and_forward_x(rng, kind):
    params, x, dy = _blocked_case(kind, rng, Activation.sigmoid())
    backend = blocked_backend(64, 64)
    y, dx, *_ = _run(params, backend, x, dy, "training")
    layer = NormalizationLayer(params, FilterParameters(backend=backend))
    x_in_place = x.copy()
    np.testing.assert_allclose(layer.apply(x_in_place, output=x_in_place, training=True), y, rtol=1e-12,
                               atol=1e-12)
    dy_in_place = dy.copy()
    g = layer.apply_backward(x, dy_in_place, output=y, input_gradient=dy_in_place, training=True)
    assert g.input is dy_in_place
    np.testing.assert_allclose(dy_in_place, dx, rtol=1e-12, atol=1e-12)


def test_default_sizes_use_the_reference_below_the_limit_and_blocks_above(rng, monkeypatch):
    backend = ScipyBlasBackend()
    x = rng.standard_normal((2, 3, 4, 5))
    assert _channel_plan(backend, x, 0) is None  # small: the reference kernels
    big = np.empty((64, 64, 1, 1024), np.float32)
    plan = _channel_plan(backend, big, 1)
    assert plan is not None and plan.threads == 1
    assert max(r1 - r0 for r0, r1 in plan.spans) * 1024 <= backend.normalization_block_elements
    assert sum(r1 - r0 for r0, r1 in plan.spans) == 64 * 64
    monkeypatch.setattr(fast, "_CPUS", 4)
    assert _channel_plan(backend, big, 2).threads == 2
    assert _channel_plan(backend, big, 0).threads == fast.default_threads() == 4
    assert _channel_plan(backend, big, 64).threads == 4  # n_threads is a limit, capped at the CPUs


def test_workspaces_and_allocated_gradients_are_aligned(rng):
    a = fast.aligned_empty_like(np.empty((3, 5, 7), np.float32))
    assert a.shape == (3, 5, 7) and a.dtype == np.float32 and a.ctypes.data % 64 == 0
    params, x, dy = _blocked_case("instance", rng, Activation.identity(), dtype=np.float32)
    layer = NormalizationLayer(params, FilterParameters(backend=blocked_backend(64, 64)))
    assert layer.apply_backward(x, dy, training=True).input.ctypes.data % 64 == 0


def test_a_worker_error_reaches_the_caller():
    plan = fast._Plan((8, 1, 1, 4), 4, 2)  # eight blocks, two threads

    def task(index, r0, r1, work, spare):
        if index == 5:
            raise RuntimeError("block 5 failed")

    with pytest.raises(RuntimeError, match="block 5 failed"):
        plan.run(task, np.dtype(np.float64))
    seen = []
    plan.run(lambda index, *_: seen.append(index), np.dtype(np.float64))  # the pool still works
    assert sorted(seen) == list(range(8))


def test_plain_moments_flag_rows_whose_mean_is_large_against_their_spread():
    ones, inv = np.ones(4), 1 / 4
    means, variances = np.empty(2), np.empty(2)
    spread = np.array([[-1.0, 1.0, -1.0, 1.0], [0.0, 2.0, 0.0, 2.0]])  # mean² ≤ 4·variance
    assert fast._plain_moments(spread, ones, inv, means, variances)
    np.testing.assert_allclose(means, [0.0, 1.0])
    np.testing.assert_allclose(variances, [1.0, 1.0])
    for row in ([3.0, 5.0, 3.0, 5.0], [2.0, 2.0, 2.0, 2.0], [np.nan, 1.0, 2.0, 3.0], [np.inf, 1.0, 2.0, 3.0]):
        with np.errstate(invalid="ignore"):  # as the layer runs the kernels
            assert not fast._plain_moments(np.array([spread[0], row]), ones, inv, means, variances)


@pytest.mark.parametrize("kind", ["instance", "group"])
def test_blocked_forward_keeps_float32_precision_for_offset_rows(rng, kind):
    # Rows whose mean dwarfs their spread take the centred formula (Σx² − mean² would lose
    # every bit); the others the plain moments. Blocks of one row and of several rows mix both.
    params, x, dy = _blocked_case(kind, rng, Activation.identity(), dtype=np.float32)
    x = x.astype(np.float64)
    x[1] += 1e4
    x[2, :2] -= 300.0
    x = x.astype(np.float32)
    expected = reference_forward(x, params, "training")
    for block in (1, 64, 1 << 16):
        layer = NormalizationLayer(params, FilterParameters(backend=blocked_backend(block, block)))
        y = layer.apply(x, phase="training")
        np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
        if kind == "instance":  # the moving variance averages the per-instance ones
            np.testing.assert_allclose(layer.moving_variance, _run(params, "numpy", x, dy, "training")[5],
                                       rtol=1e-4)


def test_layer_norm_backward_restores_the_blas_thread_limit(rng):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    params, x, dy = _blocked_case("layer", rng, Activation.identity())
    before = [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]
    _run(params, blocked_backend(64, 64), x, dy, "training", n_threads=2)
    after = [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]
    assert after == before


def test_type_accessors_give_the_option_of_their_kind_and_refuse_the_others():
    assert NormalizationType.layer(normalization_axis=1).axis == 1
    assert NormalizationType.group(group_count=4).groups == 4
    with pytest.raises(bf.InvalidParameterError, match="axis must be asked of a layer norm"):
        NormalizationType.batch().axis
    with pytest.raises(bf.InvalidParameterError, match="groups must be asked of a group norm"):
        NormalizationType.instance().groups


@pytest.mark.parametrize("kind", KINDS)
def test_float32_statistics_survive_a_large_mean(backend_name, kind, rng):
    """Data of mean 1e4 and spread 1 in float32: a variance taken as E[x²] − E[x]² would lose
    every digit (1e8 − 1e8); every backend normalizes it as float64 arithmetic would."""
    shape = (4, 8, 24, 24)
    channels = shape[1]
    ntype = {"batch": NormalizationType.batch(), "instance": NormalizationType.instance(),
             "layer": NormalizationType.layer(normalization_axis=1),
             "group": NormalizationType.group(group_count=2)}[kind]
    affine = shape[2:] if kind == "layer" else (channels,)
    params = NormalizationParameters(type=ntype, input_shape=shape[1:], gamma=np.ones(affine),
                                     beta=np.zeros(affine), dtype=np.float32)
    x = (1e4 + rng.standard_normal(shape)).astype(np.float32)
    axes = {"batch": (0, 2, 3), "instance": (2, 3), "layer": (2, 3), "group": None}[kind]
    wide = x.astype(np.float64)
    if kind == "group":
        grouped = wide.reshape(4, 2, -1)
        want = ((grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-5))
        want = want.reshape(shape)
    else:
        want = (wide - wide.mean(axes, keepdims=True)) / np.sqrt(wide.var(axes, keepdims=True) + 1e-5)
    layer = NormalizationLayer(params, FilterParameters(backend=backend_name))
    np.testing.assert_allclose(layer.apply(x), want, atol=2e-3)


@pytest.mark.skipif("numba" not in BACKENDS, reason="needs the numba backend (Numba installed)")
@pytest.mark.parametrize("kind", KINDS)
def test_numba_thread_counts_agree_and_the_callers_setting_is_restored(kind, rng):
    """One thread and two: the same code with other blocks of rows, so agreement within the
    contract's tolerance (bitwise for one thread count); Numba's own setting is left as found."""
    import numba

    from bnnsfw.backends.contract import TOLERANCE

    params, x, dy = _blocked_case(kind, rng, Activation.identity(), dtype=np.float32)
    before = numba.get_num_threads()
    one = _run(params, "numba", x, dy, "training", n_threads=1)
    again = _run(params, "numba", x, dy, "training", n_threads=1)
    two = _run(params, "numba", x, dy, "training", n_threads=2)
    assert numba.get_num_threads() == before
    rtol, atol = TOLERANCE[np.dtype(np.float32)]
    for a, b, c in zip(one, again, two):
        if a is not None:
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(a, c, rtol=rtol, atol=atol)


@pytest.mark.skipif("numba" not in BACKENDS, reason="needs the numba backend (Numba installed)")
def test_numba_keeps_small_calls_on_the_calling_thread(monkeypatch, rng):
    """Below PARALLEL_MIN_ELEMENTS a call runs on one thread (waking the others costs more, and
    stalls on a busy machine); larger calls use Numba's threads."""
    import numba

    from bnnsfw.backends.numba import _normalization as _numba_normalization

    counts = []  # Numba's thread count as each kernel starts

    def counted(kernel):
        return lambda *args: (counts.append(numba.get_num_threads()), kernel(*args))[1]

    for name in ("_flat_forward", "_flat_backward"):
        monkeypatch.setattr(_numba_normalization, name, counted(getattr(_numba_normalization, name)))
    most = getattr(numba.config, "NUMBA_NUM_THREADS")
    before = numba.get_num_threads()
    for shape in ((64, 32), (64, 1024)):
        counts.clear()
        params = NormalizationParameters(type=NormalizationType.layer(), input_shape=shape[1:])
        x = rng.standard_normal(shape).astype(np.float32)
        with NormalizationLayer(params, bf.FilterParameters(backend="numba")) as layer:
            y = layer.apply(x, phase="training")
            layer.apply_backward(x, np.ones_like(x), output=y, phase="training")
        small = x.size < _numba_normalization.PARALLEL_MIN_ELEMENTS
        assert counts == [1 if small else most] * 2, (shape, counts)
        assert numba.get_num_threads() == before


@pytest.mark.parametrize("shape", [(2, 4, 4100), (2, 2000, 3), (2, 6000)],
                         ids=["runs-longer-than-a-segment", "short-runs", "runs-of-one"])
def test_group_statistics_over_long_and_short_runs(backend_name, shape, rng):
    """Group norm (two groups) whose per-channel runs are longer than the compiled kernels'
    segments (``_numba_normalization.SEGMENT``, 2048), or so short that one segment holds many
    channels. The float32 data have a large mean and a trend along each set, so the first
    segment's mean is far from the set's: forward and backward agree with the float64
    reference."""
    channels = shape[1]
    params = NormalizationParameters(type=NormalizationType.group(group_count=2), input_shape=shape[1:],
                                     gamma=rng.uniform(0.5, 1.5, channels), beta=rng.uniform(-1, 1, channels),
                                     dtype=np.float32)
    trend = np.linspace(0.0, 40.0, math.prod(shape[1:])).reshape(shape[1:])
    x = (1e3 + trend + rng.standard_normal(shape)).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    ours = _run(params, backend_name, x, dy, "training")
    wide = attrs.evolve(params, dtype=np.float64)
    reference = _run(wide, "numpy", x.astype(np.float64), dy.astype(np.float64), "training")
    for name, a, b in zip(RESULTS, ours, reference):
        if b is not None:
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4 * np.abs(b).max(), err_msg=name)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_stream_pass_writes_its_formula_and_nothing_else(rng):
    """``_numba_stream.affine`` (``out = a·u + b·(v − centre) + shift``, stored past the
    caches) agrees with the formula for runs shorter than ``STREAM_MIN`` (a plain loop),
    longer ones starting at every alignment (scalar head, whole lines, scalar tail), with and
    without ``u``, and strided runs (a plain loop); it writes nothing outside ``out``."""
    import numba

    from bnnsfw.backends.numba._stream import STREAM_MIN, affine, store_fence

    dtype = np.float32  # the compiled kernels' dtype

    @numba.njit
    def both(u, v, out, a, b, centre, shift):
        affine(u, v, out, a, b, centre, shift, True)
        store_fence()

    @numba.njit
    def without_u(u, v, out, a, b, centre, shift):
        affine(u, v, out, a, b, centre, shift, False)
        store_fence()

    a, b, centre, shift = 0.75, -1.25, 3.0, 0.5
    for size in (0, 1, STREAM_MIN - 1, STREAM_MIN, STREAM_MIN + 17, 1000):
        for start in range(0, 16, 3):
            for step in (1, 2):
                u = rng.standard_normal(start + step * size + 1).astype(dtype)[start::step][:size]
                v = rng.standard_normal(size + 7).astype(dtype)[7:]
                frame = np.full(start + step * size + 9, 5.0, dtype)
                out = frame[start + 1::step][:size]
                inside = np.zeros(frame.size, bool)
                inside[start + 1::step][:size] = True
                for kernel, with_u in ((both, True), (without_u, False)):
                    kernel(u, v, out, a, b, centre, shift)
                    want = b * (v.astype(np.float64) - centre) + shift
                    if with_u:
                        want += a * u.astype(np.float64)
                    np.testing.assert_allclose(out, want, rtol=1e-6 if dtype == np.float32 else 1e-14,
                                               atol=1e-6 if dtype == np.float32 else 1e-14,
                                               err_msg=f"{size} {start} {step} {with_u}")
                    assert (frame[~inside] == 5.0).all(), (size, start, step, with_u)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_stream_copy_copies_every_bit(rng):
    """``_numba_stream.stream_copy`` copies a run bit for bit at every alignment: negative
    zeros, infinities, NaN, subnormal and ordinary numbers."""
    import numba

    from bnnsfw.backends.numba._normalization import _FASTMATH
    from bnnsfw.backends.numba._stream import store_fence, stream_copy

    dtype = np.float32  # the compiled kernels' dtype

    @numba.njit(fastmath=_FASTMATH, error_model="numpy")
    def copy(source, out):
        stream_copy(source, out)
        store_fence()

    tiny = np.finfo(dtype).smallest_subnormal
    special = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, tiny, -tiny, 1.0], dtype)
    for size in (1, 15, 64, 100):
        source = np.resize(np.concatenate([special, rng.standard_normal(7).astype(dtype)]), size)
        for start in range(16):
            frame = np.full(start + size + 3, 7.0, dtype)
            out = frame[start + 1:start + 1 + size]
            copy(source, out)
            assert out.tobytes() == source.tobytes(), (size, start)
            assert (frame[:start + 1] == 7.0).all() and (frame[start + 1 + size:] == 7.0).all()


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("stream", [True, False], ids=["past-the-caches", "ordinary-stores"])
def test_layer_norm_row_pass_writes_its_formula_and_nothing_else(stream, rng):
    """``_numba_stream.normalized_row`` (``(x − mean)·rstd·gamma + beta``) and
    ``normalized_row_backward`` (``rstd·(gamma·dy − a − (x − mean)·rstd·c)``) agree with their
    formulas for rows of every length around a line and starting at every alignment (scalar
    head, whole lines, scalar tail), in place too, and write nothing outside ``out``. Called
    from code with the kernels' fast-math flags, as in the kernels, a row's bits do not depend
    on where its output starts (the head and tail are computed as the lines are); nor do
    ``affine``'s."""
    import numba

    from bnnsfw.backends.numba._normalization import _FASTMATH
    from bnnsfw.backends.numba._stream import affine, normalized_row, normalized_row_backward, store_fence

    dtype = np.float32  # the compiled kernels' dtype

    kernel = numba.njit(fastmath=_FASTMATH, error_model="numpy")

    @kernel
    def forward(x, gamma, beta, out, mean, rstd, stream):
        normalized_row(x, gamma, beta, out, mean, rstd, stream)
        store_fence()

    @kernel
    def backward(x, dy, gamma, out, mean, rstd, a, c, stream):
        normalized_row_backward(x, dy, gamma, out, mean, rstd, a, c, stream)
        store_fence()

    @kernel
    def scaled(u, v, out, a, b, centre, shift):
        affine(u, v, out, a, b, centre, shift, True)
        store_fence()

    mean, rstd, a, c = 0.5, 1.75, -0.25, 0.625
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-13)
    for size in (0, 1, 15, 16, 17, 64, 100, 771):
        x = rng.standard_normal(size + 3).astype(dtype)[3:]
        dy = rng.standard_normal(size + 1).astype(dtype)[1:]
        gamma = rng.uniform(0.5, 1.5, size).astype(dtype)
        beta = rng.uniform(-1, 1, size).astype(dtype)
        xhat = (x.astype(np.float64) - mean) * rstd
        made: dict[str, list[np.ndarray]] = {"forward": [], "backward": [], "affine": []}
        for start in range(16):
            frame = np.full(start + size + 9, 7.0, dtype)
            out = frame[start + 1:start + 1 + size]
            forward(x, gamma, beta, out, mean, rstd, stream)
            np.testing.assert_allclose(out, xhat * gamma + beta, **tol, err_msg=f"{size} {start}")
            made["forward"].append(out.copy())
            backward(x, dy, gamma, out, mean, rstd, a, c, stream)
            np.testing.assert_allclose(out, rstd * (gamma * dy.astype(np.float64) - a - xhat * c), **tol,
                                       err_msg=f"{size} {start}")
            made["backward"].append(out.copy())
            assert (frame[:start + 1] == 7.0).all() and (frame[start + 1 + size:] == 7.0).all(), (size, start)
            scaled(dy, x, out, a, rstd, mean, c)
            made["affine"].append(out.copy())
            inplace = x.copy()
            forward(inplace, gamma, beta, inplace, mean, rstd, stream)
            np.testing.assert_allclose(inplace, xhat * gamma + beta, **tol, err_msg=f"in place {size}")
        for name, rows in made.items():
            for start, row in enumerate(rows):
                assert row.tobytes() == rows[0].tobytes(), (name, size, start)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_layer_norm_row_pass_streams_with_non_temporal_stores(backward):
    """Layer norm's row pass compiles to non-temporal stores on x86-64 (``movntps``, or
    ``movntpd`` for the same line's bits) when streamed, and to none otherwise."""
    import platform

    import numba

    from bnnsfw.backends.numba._stream import normalized_row, normalized_row_backward

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the instruction is named here for x86-64 only")

    def assembly(stream):
        if backward:
            def kernel(x, dy, gamma, out):
                normalized_row_backward(x, dy, gamma, out, 0.5, 2.0, 0.25, 0.125, stream)
        else:
            def kernel(x, dy, gamma, out):
                normalized_row(x, gamma, dy, out, 0.5, 2.0, stream)
        row = np.ones(100, np.float32)
        compiled = numba.njit(kernel)
        compiled(row, row, row, np.empty_like(row))
        return "\n".join(compiled.inspect_asm().values())

    assert "movntp" in assembly(True)
    assert "movntp" not in assembly(False)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("kind,shape", [("group", (3, 4, 67)), ("instance", (2, 3, 130)),
                                        ("group", (2, 4, 5)), ("layer", (3, 5, 67)), ("layer", (7, 2, 5)),
                                        ("layer", (3, 2, 1000))],
                         ids=["group-runs-with-head-and-tail", "instance", "group-runs-shorter-than-a-line",
                              "layer-rows-with-head-and-tail", "layer-rows-shorter-than-a-line",
                              "layer-long-rows"])
def test_outputs_written_past_the_caches_agree_with_the_reference(kind, shape, monkeypatch, rng):
    """Instance, group and layer norm write their output (and ``dx``) past the caches when the
    arrays would not stay in the last-level cache; with a cache of one byte assumed, small
    arrays take that path too (the test checks that both passes chose it), and forward and
    backward, float32 (the compiled kernels' dtype), agree with the float64 reference."""
    from bnnsfw.backends.numba import _normalization as _numba_normalization

    dtype = np.float32

    monkeypatch.setattr(_numba_normalization, "last_level_cache_bytes", lambda: 1)
    chosen = []
    real = _numba_normalization._streams
    monkeypatch.setattr(_numba_normalization, "_streams",
                        lambda *args: (chosen.append(real(*args)), chosen[-1])[1])
    affine = shape[-1:] if kind == "layer" else shape[1:2]
    norm_type = (NormalizationType.group(group_count=2) if kind == "group"
                 else NormalizationType.layer(normalization_axis=len(shape) - 2) if kind == "layer"
                 else NormalizationType.instance())
    params = NormalizationParameters(type=norm_type, input_shape=shape[1:],
                                     gamma=rng.uniform(0.5, 1.5, affine), beta=rng.uniform(-1, 1, affine),
                                     dtype=dtype)
    x = (10.0 + rng.standard_normal(shape)).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    ours = _run(params, "numba", x, dy, "training")
    assert chosen == [True, True], chosen
    wide = attrs.evolve(params, dtype=np.float64)
    reference = _run(wide, "numpy", x.astype(np.float64), dy.astype(np.float64), "training")
    rtol, atol = 2e-4, 2e-5
    for name, a, b in zip(RESULTS, ours, reference):
        if b is not None:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * max(1.0, np.abs(b).max()), err_msg=name)


# ------------------------------------------------------------------------------------------
# Training or inference: one keyword, inference by default.
# ------------------------------------------------------------------------------------------
def test_inference_is_the_default_and_training_is_asked_for(backend_name, rng):
    params = make_params("batch", (4, 2), rng, moving=True, momentum=0.5)
    x, dy = rng.standard_normal((3, 4, 2)), rng.standard_normal((3, 4, 2))
    mean, var = params.type.moving_mean.copy(), params.type.moving_variance.copy()
    layer = make_layer(params, backend_name)
    inference = reference_forward(x, params, "inference", (mean, var))
    training = reference_forward(x, params, "training")
    np.testing.assert_allclose(layer(x), inference, rtol=1e-12)
    np.testing.assert_allclose(layer.apply(x, training=False), inference, rtol=1e-12)
    np.testing.assert_allclose(layer.apply(x, phase="inference", training=False), inference, rtol=1e-12)
    np.testing.assert_array_equal(layer.moving_mean, mean)  # inference moved nothing
    np.testing.assert_allclose(layer.apply(x, training=True), training, rtol=1e-12)
    np.testing.assert_allclose(layer.moving_mean, 0.5 * mean + 0.5 * x.mean(axis=(0, 2)), rtol=1e-12)
    np.testing.assert_allclose(layer(x, training=True), layer.apply(x, phase=bf.LearningPhase.training),
                               rtol=1e-12)
    by_keyword = layer.apply_backward(x, dy, training=True)
    by_phase = layer.apply_backward(x, dy, phase="training", training=True)
    np.testing.assert_array_equal(by_keyword.input, by_phase.input)
    frozen = layer.apply_backward(x, dy, training=False)
    scale = params.gamma / np.sqrt(layer.moving_variance + 1e-5)
    np.testing.assert_allclose(frozen.input, dy * scale[:, None], rtol=1e-12)
    with pytest.raises(bf.InvalidParameterError,
                       match=r"apply\(training, phase\) must be the same phase when both are given .*"
                             r"got \"training=True and phase='inference'\""):
        layer.apply(x, phase="inference", training=True)
    with pytest.raises(bf.InvalidParameterError, match=r"apply_backward\(training, phase\) must be the same"):
        layer.apply_backward(x, dy, phase="training", training=False)
    with pytest.raises(bf.InvalidParameterError, match=r"__call__\(training\) must be True or False"):
        layer(x, training="yes")
    with pytest.raises(bf.InvalidParameterError, match=r"apply_with_statistics\(phase\)"):
        layer.apply_with_statistics(x, phase="train")
    layer.close()


def test_relying_on_the_old_default_is_warned_where_it_changes_the_result(backend_name, rng):
    """Neither keyword on a layer with moving statistics: a DeprecationWarning at the caller's
    line, and the inference result; layers whose phases compute the same are not warned."""
    params = make_params("instance", (4, 2), rng, moving=True)
    x, dy = rng.standard_normal((2, 4, 2)), rng.standard_normal((2, 4, 2))
    mean = params.type.moving_mean.copy()
    with make_layer(params, backend_name) as layer:
        for call in (lambda: layer.apply(x), lambda: layer.apply_with_statistics(x),
                     lambda: layer.apply_backward(x, dy)):
            with pytest.warns(DeprecationWarning, match=r"without training= or phase= runs inference .* "
                                                        r"Pass training=True to train") as caught:
                call()
            assert [w.filename for w in caught] == [__file__]
        np.testing.assert_array_equal(layer.moving_mean, mean)
        with pytest.warns(DeprecationWarning):
            np.testing.assert_array_equal(layer.apply(x), layer(x))
    for kind in ("batch", "layer", "group"):  # no moving statistics: the two phases agree, no warning
        with make_layer(make_params(kind, (4, 2), rng), backend_name) as layer:
            np.testing.assert_array_equal(layer.apply(x), layer.apply(x, training=True))
            layer.apply_backward(x, dy)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("kind", ["batch", "layer", "instance", "group"])
def test_numba_read_only_inputs_run_the_passes_compiled_for_writable_ones(kind):
    """A read-only ``x`` and ``dy`` (a memory-mapped file opened for reading, an array over
    ``bytes``) reach the passes compiled for writable arrays: no
    pass is compiled for them (each read-only flag was a signature of its own), and the
    results agree with those of the writable arrays."""
    from bnnsfw.backends.numba import _normalization as _numba_normalization

    def signatures() -> dict[str, int]:
        return {name: len(value.signatures) for name, value in vars(_numba_normalization).items()
                if hasattr(value, "signatures") and hasattr(value, "py_func")}

    def read_only(a: np.ndarray) -> np.ndarray:
        copy = a.copy()
        copy.flags.writeable = False
        return copy

    rng = np.random.default_rng(3)
    shape = (6, 5) if kind == "layer" else (4, 6, 5)
    types = {"batch": lambda: bf.NormalizationType.batch(moving_mean=np.zeros(4, np.float32),
                                                          moving_variance=np.ones(4, np.float32)),
             "layer": lambda: bf.NormalizationType.layer(normalization_axis=1),
             "instance": bf.NormalizationType.instance,
             "group": lambda: bf.NormalizationType.group(group_count=2)}
    x = rng.standard_normal((3, *shape)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for arrays in ((x, dy), (read_only(x), read_only(dy))):
        params = bf.NormalizationParameters(type=types[kind](), input_shape=shape, dtype=np.float32)
        layer = bf.NormalizationLayer(params, FilterParameters(backend="numba"))
        if arrays[0] is not x:
            compiled = signatures()
        out = layer.apply(arrays[0], training=True)
        grads = layer.apply_backward(arrays[0], arrays[1], training=True)
        results.append([out, grads.input, grads.gamma, grads.beta])
    assert signatures() == compiled
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

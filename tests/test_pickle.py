"""Layers, Sequential and optimizers pickle and deep-copy as what they are, and train on as copies."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import backends
from bnnsfw.optimizers import SGD, Adam, RMSProp

ROUND_TRIPS = {
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "deepcopy": copy.deepcopy,
}


def _lstm(fp, **options):
    params = bf.LSTMParameters.random(input_size=3, hidden_size=8, num_layers=2, dropout=0.25, seed=3,
                                      **options)
    return bf.LSTMLayer(params, fp)


def _norm(fp, kind, input_shape, **options):
    rng = np.random.default_rng(7)
    channels = input_shape[0]
    affine = input_shape[kind.axis:] if kind.kind is bf.FilterType.layer_norm else (channels,)
    beta = None if kind.root_mean_square else rng.uniform(-0.5, 0.5, affine)
    params = bf.NormalizationParameters(type=kind, input_shape=input_shape,
                                        gamma=rng.uniform(0.5, 1.5, affine), beta=beta, **options)
    return bf.NormalizationLayer(params, fp)


#: Every layer kind: (make the layer from filter parameters, the shape of an input batch).
LAYERS = {
    "lstm": (lambda fp: _lstm(fp), (6, 4, 3)),
    "lstm-client-pointer": (
        lambda fp: _lstm(bf.FilterParameters(backend=fp.backend, use_client_pointer=True),
                         bidirectional=True),
        (6, 4, 3)),
    "batch-norm": (lambda fp: _norm(fp, bf.NormalizationType.batch(moving_mean=np.zeros(4),
                                                                   moving_variance=np.ones(4)),
                                    (4, 3), momentum=0.5), (5, 4, 3)),
    "instance-norm": (lambda fp: _norm(fp, bf.NormalizationType.instance(), (4, 3)), (5, 4, 3)),
    "layer-norm": (lambda fp: _norm(fp, bf.NormalizationType.layer(normalization_axis=1), (4, 3),
                                    activation=bf.Activation.tanh()), (5, 4, 3)),
    "group-norm": (lambda fp: _norm(fp, bf.NormalizationType.group(group_count=2), (4, 3)), (5, 4, 3)),
    "rms-norm": (lambda fp: _norm(fp, bf.NormalizationType.rms(), (4, 3)), (5, 4, 3)),
    "fully-connected": (
        lambda fp: bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(
            input_size=3, output_size=5, activation=bf.Activation.sigmoid(), seed=2), fp),
        (4, 3)),
}


def _make(kind, backend_name):
    make, shape = LAYERS[kind]
    x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
    return make(bf.FilterParameters(backend=backend_name)), x


def _predict(layer, x):
    """An inference forward (no dropout; a normalization's moving statistics where it has them)."""
    if isinstance(layer, bf.LSTMLayer):
        return layer.apply(x).output
    if isinstance(layer, bf.NormalizationLayer):
        return layer.apply(x, phase="inference")
    return layer.apply(x)


def _train_forward(layer, x):
    """A training forward: an LSTM draws dropout masks, a batch norm moves its statistics."""
    if isinstance(layer, bf.LSTMLayer):
        return layer.apply(x, training=True).output
    if isinstance(layer, bf.NormalizationLayer):
        return layer.apply(x, phase="training")
    return layer.apply(x)


def _gradients(layer, x):
    """A training forward and its backward, the loss ½‖y − ¼‖²: the gradients by name."""
    if isinstance(layer, bf.LSTMLayer):
        out = layer.apply(x, training=True)
        return layer.apply_backward(x, out.output - 0.25, training_cache=out.training_cache).parameters()
    if isinstance(layer, bf.NormalizationLayer):
        y = layer.apply(x, phase="training")
        return layer.apply_backward(x, y - 0.25, output=y, phase="training").parameters()
    y = layer.apply(x)
    return layer.apply_backward(x, y - 0.25, output=y).parameters()


def _step(layer, x, optimizer):
    optimizer.step(layer.parameters(), _gradients(layer, x))


def _with_backend(fp, name):
    return bf.FilterParameters(backend=name, n_threads=fp.n_threads, use_client_pointer=fp.use_client_pointer)


def _used(kind, backend_name):
    """A layer that has trained a step (its arrays handed out, its generator and moving
    statistics moved), with its optimizer, and an input."""
    layer, x = _make(kind, backend_name)
    optimizer = Adam(learning_rate=0.05)
    _step(layer, x, optimizer)
    _train_forward(layer, x)
    return layer, optimizer, x


# ------------------------------------------------------------------------------------------
# Every layer kind on every backend.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ROUND_TRIPS)
@pytest.mark.parametrize("kind", LAYERS)
def test_a_layer_computes_the_same_after_the_round_trip(kind, backend_name, how):
    layer, _, x = _used(kind, backend_name)
    again = ROUND_TRIPS[how](layer)
    assert type(again) is type(layer) and again is not layer
    assert again.backend is layer.backend
    assert again.filter_parameters == _with_backend(layer.filter_parameters, backend_name)
    np.testing.assert_array_equal(_predict(again, x), _predict(layer, x))
    for name, array in layer.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[name], array, err_msg=name)
    # The dropout generator and the moving statistics go on from where they were.
    np.testing.assert_array_equal(_train_forward(again, x), _train_forward(layer, x))
    np.testing.assert_array_equal(_predict(again, x), _predict(layer, x))


@pytest.mark.parametrize("how", ROUND_TRIPS)
@pytest.mark.parametrize("kind", LAYERS)
def test_the_same_optimizer_step_on_the_original_and_the_copy_gives_the_same_outputs(kind, backend_name, how):
    layer, optimizer, x = _used(kind, backend_name)
    layer_copy, optimizer_copy = ROUND_TRIPS[how]((layer, optimizer))
    assert optimizer_copy.step_count == optimizer.step_count == 1
    before = _predict(layer, x)
    _step(layer, x, optimizer)
    _step(layer_copy, x, optimizer_copy)
    after = _predict(layer, x)
    assert not np.array_equal(after, before), "the step changed nothing: the test would prove nothing"
    np.testing.assert_array_equal(_predict(layer_copy, x), after)
    for name, array in layer.parameters().items():
        np.testing.assert_array_equal(layer_copy.parameters()[name], array, err_msg=name)


@pytest.mark.parametrize("how", ROUND_TRIPS)
@pytest.mark.parametrize("kind", LAYERS)
def test_copies_are_independent(kind, backend_name, how):
    layer, _, x = _used(kind, backend_name)
    before = _predict(layer, x)
    state = layer.state_dict()
    again = ROUND_TRIPS[how](layer)
    for array in again.parameters().values():
        array *= 0.5
    _train_forward(again, x)  # moves the copy's moving statistics and generator only
    assert not np.array_equal(_predict(again, x), before)
    np.testing.assert_array_equal(_predict(layer, x), before)
    for name, array in layer.state_dict().items():
        np.testing.assert_array_equal(array, state[name], err_msg=name)
    again.close()
    np.testing.assert_array_equal(_predict(layer, x), before)


@pytest.mark.parametrize("how", ROUND_TRIPS)
@pytest.mark.parametrize("kind", ["lstm", "batch-norm", "fully-connected"])
def test_a_closed_layer_is_refused(kind, how):
    layer, _ = _make(kind, "numpy")
    layer.close()
    name = type(layer).__name__
    with pytest.raises(bf.FilterClosedError, match=f"{name} was closed: .* cannot be pickled or copied"):
        ROUND_TRIPS[how](layer)


# ------------------------------------------------------------------------------------------
# The backend by name.
# ------------------------------------------------------------------------------------------
class _Travelling(backends.NumpyBackend):
    name = "travelling"


@pytest.fixture
def registry(monkeypatch):
    """The backend registry, restored after the test."""
    monkeypatch.setattr(backends, "_factories", dict(backends._factories))
    monkeypatch.setattr(backends, "_instances", dict(backends._instances))
    return backends


def test_the_backend_travels_by_name_and_is_the_registered_one_where_it_lands(registry):
    registry.register_backend("travelling", _Travelling)
    layer, x = _make("fully-connected", "travelling")
    again = pickle.loads(pickle.dumps(layer))
    assert again.backend is registry.get_backend("travelling")
    assert again.filter_parameters.backend == "travelling"
    np.testing.assert_array_equal(_predict(again, x), _predict(layer, x))


def test_a_layer_created_with_the_default_carries_the_backend_it_computes_with():
    with backends.use_backend("numpy"):
        layer, _ = _make("fully-connected", None)
    assert layer.filter_parameters.backend is None
    with backends.use_backend("scipy-blas"):
        again = copy.deepcopy(layer)
    assert again.backend.name == "numpy" and again.filter_parameters.backend == "numpy"


def test_a_backend_name_not_available_where_it_lands_gives_the_default_with_one_log_line(registry, caplog):
    registry.register_backend("travelling", _Travelling)
    layer, x = _make("batch-norm", "travelling")
    data = pickle.dumps(layer)
    del registry._factories["travelling"], registry._instances["travelling"]
    with backends.use_backend("numpy"), caplog.at_level("WARNING", logger="bnnsfw"):
        again = pickle.loads(data)
    lines = [r.getMessage() for r in caplog.records if r.name == "bnnsfw"]
    assert len(lines) == 1
    assert "'travelling'" in lines[0] and "not available" in lines[0] and "'numpy'" in lines[0]
    assert again.backend.name == "numpy" and again.filter_parameters.backend is None
    np.testing.assert_allclose(_predict(again, x), _predict(layer, x), rtol=2e-4, atol=2e-5)


def test_a_backend_object_made_outside_the_registry_is_refused(pack_recorder):
    layer, _ = _make("fully-connected", "numpy")
    recorded = bf.LSTMLayer(bf.LSTMParameters.random(input_size=2, hidden_size=3, seed=0),
                            bf.FilterParameters(backend=pack_recorder))
    for how in ROUND_TRIPS.values():
        with pytest.raises(bf.InvalidParameterError,
                           match="registry gives by name.*'recording', not registered"):
            how(recorded)
    # The same class as a registered backend is not enough: an object's own settings would not travel.
    own = bf.FullyConnectedLayer(layer.layer_parameters, bf.FilterParameters(backend=backends.NumpyBackend()))
    with pytest.raises(bf.InvalidParameterError, match="NumpyBackend object named 'numpy', not registered"):
        pickle.dumps(own)


def test_a_layer_in_a_call_on_another_thread_pickles(registry):
    """Pickling takes no lock a call holds (the locks do not travel; a call in flight is no obstacle)."""
    started, release = threading.Event(), threading.Event()

    class Slow(backends.NumpyBackend):
        name = "slow"

        def gemm(self, request):
            started.set()
            release.wait(10)
            return super().gemm(request)

    registry.register_backend("slow", Slow)
    layer, x = _make("fully-connected", "slow")
    worker = threading.Thread(target=layer.apply, args=(x,))
    worker.start()
    try:
        assert started.wait(10)
        data = pickle.dumps(layer)
    finally:
        release.set()
        worker.join()
    np.testing.assert_array_equal(_predict(pickle.loads(data), x), _predict(layer, x))


# ------------------------------------------------------------------------------------------
# Sequential.
# ------------------------------------------------------------------------------------------
def _model(backend_name, input_size=3, hidden_size=8, head=2):
    fp = bf.FilterParameters(backend=backend_name)
    return bf.Sequential({
        "lstm": bf.LSTMLayer(bf.LSTMParameters.random(input_size=input_size, hidden_size=hidden_size,
                                                      num_layers=2, dropout=0.1, seed=0), fp),
        "last": bf.LastStep(),
        "norm": bf.NormalizationLayer(bf.NormalizationParameters(
            type=bf.NormalizationType.batch(moving_mean=np.zeros(hidden_size),
                                            moving_variance=np.ones(hidden_size)),
            input_shape=(hidden_size,), momentum=0.5), fp),
        "head": bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(
            input_size=hidden_size, output_size=head, seed=1), fp),
    })


def _model_step(model, x, optimizer):
    y = model.apply(x, training=True)
    optimizer.step(model.parameters(), model.apply_backward(y - 0.25).parameters())


@pytest.mark.parametrize("how", ROUND_TRIPS)
def test_a_sequential_and_its_optimizer_train_on_as_copies(backend_name, how):
    model = _model(backend_name)
    x = np.random.default_rng(5).standard_normal((7, 4, 3)).astype(np.float32)
    optimizer = Adam(learning_rate=0.05)
    _model_step(model, x, optimizer)
    model_copy, optimizer_copy = ROUND_TRIPS[how]((model, optimizer))
    assert list(model_copy.layers) == ["lstm", "last", "norm", "head"]
    assert [type(e) for e in model_copy] == [type(e) for e in model]
    assert all(a is not b for a, b in zip(model_copy, model))
    np.testing.assert_array_equal(model_copy(x), model(x))
    before = model(x)
    _model_step(model, x, optimizer)
    _model_step(model_copy, x, optimizer_copy)
    assert not np.array_equal(model(x), before)
    np.testing.assert_array_equal(model_copy(x), model(x))
    # Independent: the copy trains on alone.
    after = model(x)
    _model_step(model_copy, x, optimizer_copy)
    np.testing.assert_array_equal(model(x), after)
    assert not np.array_equal(model_copy(x), after)


@pytest.mark.parametrize("how", ROUND_TRIPS)
def test_a_sequential_pickled_between_a_training_forward_and_its_backward_carries_no_pending_step(how):
    model = _model("numpy")
    x = np.random.default_rng(5).standard_normal((7, 4, 3)).astype(np.float32)
    y = model.apply(x, training=True)
    again = ROUND_TRIPS[how](model)
    with pytest.raises(bf.InvalidParameterError, match="called after a training forward"):
        again.apply_backward(y - 0.25)
    assert model.apply_backward(y - 0.25).input.shape == x.shape  # the original's step is still pending


@pytest.mark.parametrize("how", ROUND_TRIPS)
def test_a_closed_sequential_or_one_with_a_closed_layer_is_refused(how):
    model = _model("numpy")
    model.layers["norm"].close()
    with pytest.raises(bf.FilterClosedError,
                       match="the layer 'norm' was closed.*cannot be pickled or copied"):
        ROUND_TRIPS[how](model)
    model.close()
    with pytest.raises(bf.FilterClosedError, match="Sequential was closed: .*cannot be pickled or copied"):
        ROUND_TRIPS[how](model)


def test_the_pickle_is_within_ten_percent_of_the_safetensors_file(tmp_path):
    model = _model("numpy", input_size=16, hidden_size=64, head=8)
    for name, obj in [("model", model), ("lstm", model.layers["lstm"])]:
        bf.save_weights(tmp_path / name, obj)
        file_size = os.path.getsize(tmp_path / f"{name}.safetensors")
        pickle_size = len(pickle.dumps(obj))
        assert abs(pickle_size - file_size) <= 0.1 * file_size, (name, pickle_size, file_size)


def test_a_model_computes_the_same_in_another_process(tmp_path):
    """The use pickle is for: a worker process (here a fresh interpreter) gets the model."""
    model = _model("numpy")
    x = np.random.default_rng(5).standard_normal((7, 4, 3)).astype(np.float32)
    script = ("import pickle, sys\n"
              "model, x = pickle.load(sys.stdin.buffer)\n"
              "sys.stdout.buffer.write(pickle.dumps(model(x)))\n")
    done = subprocess.run([sys.executable, "-c", script], input=pickle.dumps((model, x)), capture_output=True,
                          check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(bf.__file__))))
    np.testing.assert_array_equal(pickle.loads(done.stdout), model(x))


# ------------------------------------------------------------------------------------------
# Optimizers.
# ------------------------------------------------------------------------------------------
OPTIMIZERS = {
    "sgd": lambda: SGD(0.1),
    "sgd-nesterov": lambda: SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda: Adam(learning_rate=0.05, beta1=0.8, clip_norm=1.0),
    "rmsprop": lambda: RMSProp(learning_rate=0.01, centered=True, momentum=0.5, clip_value=0.5),
}


@pytest.mark.parametrize("by_name", [True, False], ids=["by-name", "by-position"])
@pytest.mark.parametrize("how", ROUND_TRIPS)
@pytest.mark.parametrize("which", OPTIMIZERS)
def test_an_optimizer_carries_its_moments_and_step_count(which, how, by_name):
    rng = np.random.default_rng(1)
    params = {"a": rng.standard_normal((3, 2)), "b": rng.standard_normal(4).astype(np.float32)}

    def step(optimizer, arrays, k):
        grads = {name: np.sin(array * k + 1.0) for name, array in arrays.items()}
        if by_name:
            optimizer.step(arrays, grads)
        else:
            optimizer.step(list(arrays.values()), list(grads.values()))

    optimizer = OPTIMIZERS[which]()
    for k in range(3):
        step(optimizer, params, k)
    optimizer_copy = ROUND_TRIPS[how](optimizer)
    params_copy = copy.deepcopy(params)
    assert type(optimizer_copy) is type(optimizer) and repr(optimizer_copy) == repr(optimizer)
    assert optimizer_copy.step_count == 3
    state, state_copy = optimizer.state_dict(), optimizer_copy.state_dict()
    assert state.keys() == state_copy.keys()
    for key, value in state.items():
        np.testing.assert_array_equal(state_copy[key], value, err_msg=key)
    for k in range(3, 5):
        step(optimizer, params, k)
        step(optimizer_copy, params_copy, k)
    for name, array in params.items():
        np.testing.assert_array_equal(params_copy[name], array, err_msg=name)
    # Independent: the copy's moments are its own.
    step(optimizer_copy, params_copy, 9)
    assert optimizer.step_count == 5 and optimizer_copy.step_count == 6


def test_a_fresh_optimizer_pickles_and_learning_rate_changes_travel():
    optimizer = Adam(learning_rate=0.05)
    optimizer.learning_rate = 0.01  # a schedule's change
    again = pickle.loads(pickle.dumps(optimizer))
    assert again.learning_rate == 0.01 and again.step_count == 0

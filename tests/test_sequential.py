"""The Sequential container: forward in order, backward in reverse, parameters by name."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.losses import MeanSquaredError
from bnnsfw.optimizers import Adam

from gradcheck import assert_gradient_close, numerical_gradient


def _fp(backend_name):
    return bf.FilterParameters(backend=backend_name)


def _lstm(backend_name, *, input_size=2, hidden_size=3, num_layers=2, dtype=np.float64, **options):
    params = bf.LSTMParameters.random(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                                      seed=4, dtype=dtype, **options)
    return bf.LSTMLayer(params, _fp(backend_name))


def _norm(backend_name, channels, kind=None, dtype=np.float64):
    kind = kind or bf.NormalizationType.layer()
    params = bf.NormalizationParameters(type=kind, input_shape=(channels,), dtype=dtype,
                                        gamma=np.linspace(0.5, 1.5, channels),
                                        beta=np.linspace(-0.2, 0.2, channels))
    return bf.NormalizationLayer(params, _fp(backend_name))


def _dense(backend_name, input_size, output_size, dtype=np.float64, activation=None):
    params = bf.FullyConnectedParameters.random(input_size=input_size, output_size=output_size, seed=5,
                                                dtype=dtype, activation=activation)
    return bf.FullyConnectedLayer(params, _fp(backend_name))


def _forecaster(backend_name, dtype=np.float64, **lstm_options):
    """The demo's shape: LSTM → last step → layer norm → fully connected."""
    return bf.Sequential({
        "lstm": _lstm(backend_name, dtype=dtype, **lstm_options),
        "last": bf.LastStep(),
        "norm": _norm(backend_name, 3 * (2 if lstm_options.get("bidirectional") else 1), dtype=dtype),
        "head": _dense(backend_name, 3 * (2 if lstm_options.get("bidirectional") else 1), 2, dtype=dtype),
    })


# ------------------------------------------------------------------------------------------
# Forward: the chain the user would write by hand.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [False, True])
def test_forward_is_the_hand_written_chain(backend_name, batch_first, rng):
    model = _forecaster(backend_name, batch_first=batch_first, bidirectional=True)
    x = rng.standard_normal((3, 5, 2) if batch_first else (5, 3, 2))
    lstm, norm, head = (model.layers[name] for name in ("lstm", "norm", "head"))
    output = lstm.apply(x).output
    last = output[:, -1] if batch_first else output[-1]
    expected = head.apply(norm.apply(np.ascontiguousarray(last), phase="inference"))
    np.testing.assert_allclose(model(x), expected, rtol=1e-12, atol=1e-12)
    assert model.apply(x, training=True).shape == (3, 2)
    model.close()


def test_all_steps_flow_through_normalization_and_the_head(backend_name, rng):
    """Without LastStep every step reaches the normalization (each (t, n) a sample) and the head."""
    kind = bf.NormalizationType.batch(moving_mean=np.zeros(3), moving_variance=np.ones(3))
    layers = (_lstm(backend_name), _norm(backend_name, 3, kind), _dense(backend_name, 3, 1))
    with bf.Sequential(*layers) as model:
        x = rng.standard_normal((4, 2, 2))
        y = model.apply(x, training=True)
        assert y.shape == (4, 2, 1)
        hidden = model.layers["0"].apply(x).output
        # The training forward normalized the 8 steps together, as one batch of samples.
        normed = (hidden - hidden.reshape(-1, 3).mean(0)) / np.sqrt(hidden.reshape(-1, 3).var(0) + 1e-5)
        gamma, beta = model.layers["1"].gamma, model.layers["1"].beta
        expected = model.layers["2"].apply(normed * gamma + beta)
        np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------
# Backward: finite differences in float64 through the whole chain.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["last-step", "all-steps-batch-first"])
def test_gradients_match_finite_differences(backend_name, case, rng):
    if case == "last-step":
        model = _forecaster(backend_name, bidirectional=True)
        x = rng.standard_normal((4, 2, 2))
    else:
        model = bf.Sequential(_lstm(backend_name, batch_first=True),
                              _norm(backend_name, 3, bf.NormalizationType.batch()),
                              _dense(backend_name, 3, 2, activation=bf.Activation.tanh()))
        x = rng.standard_normal((2, 4, 2))
    weights = rng.standard_normal(model.apply(x).shape)

    def loss() -> float:
        return float(np.sum(weights * model.apply(x, training=True)))

    model.apply(x, training=True)
    grads = model.apply_backward(weights)
    assert_gradient_close(grads.input, numerical_gradient(loss, x), rtol=1e-6, atol=1e-8, name="input")
    named = grads.parameters()
    parameters = model.parameters()
    assert list(named) == list(parameters)
    for name in ("lstm.layer1.forward.forget_gate.hidden_weights", "0.layer0.forward.input_gate.bias",
                 "norm.gamma", "1.beta", "head.weights", "2.bias"):
        if name in parameters:
            numeric = numerical_gradient(loss, parameters[name])
            assert_gradient_close(named[name], numeric, rtol=1e-6, atol=1e-8, name=name)
    model.close()


# ------------------------------------------------------------------------------------------
# Training by name.
# ------------------------------------------------------------------------------------------
def test_parameters_are_the_union_of_the_layers_by_name(backend_name):
    with _forecaster(backend_name) as model:
        named = model.parameters()
        lstm_names = list(model.layers["lstm"].parameters())
        assert list(named) == ([f"lstm.{n}" for n in lstm_names]
                               + ["norm.gamma", "norm.beta", "head.weights", "head.bias"])
        assert named["head.weights"] is model.layers["head"].weights
        assert list(model.state_dict()) == list(named)


def test_a_forecaster_trains_with_default_options(backend_name):
    rng = np.random.default_rng(1)
    t = np.arange(12)[:, None] + rng.uniform(0, 6, size=(1, 32))
    x = np.sin(t)[:, :, None].astype(np.float32)                         # (T, N, 1)
    target = np.sin(t[-1] + np.array([[1.0], [2.0]])).T.astype(np.float32)   # the next two values
    model = bf.Sequential(
        bf.LSTMLayer(bf.LSTMParameters.random(input_size=1, hidden_size=8, seed=0), _fp(backend_name)),
        bf.LastStep(),
        bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=8, output_size=2, seed=1),
                               _fp(backend_name)))
    loss, optimizer = MeanSquaredError(), Adam(0.05)
    losses = []
    for _ in range(60):
        result = loss.apply(model.apply(x, training=True), target)
        optimizer.step(model.parameters(), model.apply_backward(result.gradient).parameters())
        losses.append(result.loss)
    assert losses[-1] < 0.2 * losses[0], losses
    model.close()


def test_state_dict_round_trip_between_twins(backend_name, rng):
    x = rng.standard_normal((4, 3, 2))
    with _forecaster(backend_name) as source, _forecaster(backend_name) as twin:
        for array in source.parameters().values():
            array *= 0.5
        assert not np.allclose(source(x), twin(x))
        twin.load_state_dict(source.state_dict())
        np.testing.assert_array_equal(twin(x), source(x))
        state = source.state_dict()
        state["head.weight"] = state.pop("head.weights")
        match = (r"Sequential.load_state_dict\(state\) must be a state with exactly the names of "
                 r"state_dict\(\); got \"missing names \['head.weights'\], "
                 r"unexpected names \['head.weight'\]\"")
        with pytest.raises(bf.InvalidParameterError, match=match):
            twin.load_state_dict(state)


# ------------------------------------------------------------------------------------------
# Shapes, errors and lifecycle.
# ------------------------------------------------------------------------------------------
def test_unbatched_input_runs_through(backend_name, rng):
    with _forecaster(backend_name) as model:
        x = rng.standard_normal((5, 2))                     # (T, I)
        batched = model(x[:, None])
        y = model.apply(x, training=True)
        assert y.shape == (2,)
        np.testing.assert_allclose(y, batched[0], rtol=1e-12)
        assert model.apply_backward(np.ones(2)).input.shape == (5, 2)


def test_construction_checks_that_the_layers_chain(backend_name):
    lstm = _lstm(backend_name)                                     # 2 → 3
    with pytest.raises(bf.ShapeError, match=r"Sequential\(layers\['1'\]\) must be an input_size equal to "
                                            r"what layer '0' gives \(3\); got 4"):
        bf.Sequential(lstm, _dense(backend_name, 4, 1))
    with pytest.raises(bf.ShapeError, match=r"layers\['2'\]\) must be a channel count equal to what "
                                            r"layer '1' gives \(3\); got 5"):
        bf.Sequential(lstm, bf.LastStep(), _norm(backend_name, 5))
    with pytest.raises(bf.InvalidParameterError,
                       match=r"layers\['2'\]\) must be given a sequence \(not after a LastStep\)"):
        bf.Sequential(lstm, bf.LastStep(), _lstm(backend_name, input_size=3))
    with pytest.raises(bf.InvalidParameterError,
                       match=r"must be layers of one dtype; got '0: float64, 1: float32'"):
        bf.Sequential(lstm, _dense(backend_name, 3, 1, dtype=np.float32))
    with pytest.raises(bf.InvalidParameterError,
                       match=r"layers\['x'\]\) must be an LSTMLayer, NormalizationLayer, "
                             r"FullyConnectedLayer, LastStep, FinalState, Softmax or Dropout"):
        bf.Sequential({"x": object()})
    with pytest.raises(bf.InvalidParameterError, match=r"names must be non-empty names without '.' or '/'"):
        bf.Sequential({"a.b": lstm})
    with pytest.raises(bf.InvalidParameterError, match=r"must be at least one layer"):
        bf.Sequential()
    with pytest.raises(bf.InvalidParameterError, match=r"layers\['0'\]\) must be a layer of its own .*; "
                                                       r"got \"the layer also named '1'\""):
        bf.Sequential(lstm, lstm)
    closed = _dense(backend_name, 3, 1)
    closed.close()
    with pytest.raises(bf.FilterClosedError, match=r"layers\['1'\]\) must be an open layer"):
        bf.Sequential(lstm, closed)


def test_backward_needs_a_training_forward_and_a_matching_gradient(backend_name, rng):
    x = rng.standard_normal((4, 3, 2))
    with _forecaster(backend_name) as model:
        with pytest.raises(bf.InvalidParameterError,
                           match=r"apply_backward\(\) must be called after a training forward"):
            model.apply_backward(np.ones((3, 2)))
        model.apply(x, training=True)
        with pytest.raises(bf.ShapeError,
                           match=r"apply_backward\(output_gradient\) must be of shape \(3, 2\)"):
            model.apply_backward(np.ones((3, 1)))
        with pytest.raises(bf.DTypeError, match=r"must be a float64 array"):
            model.apply_backward(np.ones((3, 2), np.float32))
        with pytest.raises(bf.InvalidParameterError, match=r"apply\(training\) must be True or False"):
            model.apply(x, training="yes")


def test_close_closes_every_layer(backend_name):
    model = _forecaster(backend_name)
    layers = [layer for layer in model if isinstance(layer, bf.Filter)]
    assert len(model) == 4 and repr(model).startswith("<Sequential lstm=LSTMLayer, last=LastStep")
    model.close()
    model.close()
    assert model.closed and all(layer.closed for layer in layers)
    with pytest.raises(bf.FilterClosedError, match=r"Sequential.parameters\(\) was called after close"):
        model.parameters()
    other = _forecaster(backend_name)
    other.layers["head"].close()
    with pytest.raises(bf.FilterClosedError, match=r"the layer 'head' was closed"):
        other.apply(np.ones((2, 1, 2)))
    other.close()


# ------------------------------------------------------------------------------------------
# FinalState and Softmax: each direction's final state, softmax along the last axis.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [False, True])
def test_final_state_is_the_last_layers_hidden_states(backend_name, batch_first, rng):
    lstm = _lstm(backend_name, bidirectional=True, batch_first=batch_first)
    model = bf.Sequential({"lstm": lstm, "final": bf.FinalState(2)})
    x = rng.standard_normal((3, 4, 2) if batch_first else (4, 3, 2))
    hidden = lstm.apply(x).hidden  # (L·D, N, H): the last layer's forward, then its reverse direction
    np.testing.assert_allclose(model(x), np.concatenate([hidden[-2], hidden[-1]], axis=-1),
                               rtol=1e-12, atol=1e-14)
    single = x[0] if batch_first else x[:, 0]  # unbatched (T, I)
    np.testing.assert_allclose(model(single), model(x)[0], rtol=1e-12, atol=1e-14)
    model.close()


@pytest.mark.parametrize("batch_first", [False, True])
def test_final_state_with_lengths_is_the_lstms_final_state(backend_name, batch_first, rng):
    """Given lengths, each direction's final state: the LSTM's ``hidden`` (zeros for length 0),
    and the gradients reach the steps they came from (finite differences)."""
    lstm = _lstm(backend_name, num_layers=1, bidirectional=True, batch_first=batch_first)
    model = bf.Sequential({"lstm": lstm, "final": bf.FinalState(2)})
    lengths = np.array([4, 2, 0])
    x = rng.standard_normal((3, 4, 2) if batch_first else (4, 3, 2))
    hidden = lstm.apply(x, sequence_lengths=lengths).hidden
    expected = np.concatenate([hidden[-2], hidden[-1]], axis=-1)
    expected[lengths == 0] = 0.0
    np.testing.assert_allclose(model(x, sequence_lengths=lengths), expected, rtol=1e-12, atol=1e-14)
    weights = rng.standard_normal((3, 6))

    def loss() -> float:
        return float((model.apply(x, sequence_lengths=lengths) * weights).sum())

    model.apply(x, training=True, sequence_lengths=lengths)
    grads = model.apply_backward(weights)
    assert_gradient_close(grads.input, numerical_gradient(loss, x), rtol=1e-6, atol=1e-9, name="input")
    single = x[1] if batch_first else x[:, 1]  # unbatched (T, I): one sequence of length 2
    np.testing.assert_allclose(model(single, sequence_lengths=np.array([2])), expected[1],
                               rtol=1e-12, atol=1e-14)
    model.close()


def test_softmax_is_the_formula_and_keeps_the_dtype(rng):
    dense = _dense(None, 3, 4, dtype=np.float32)
    model = bf.Sequential(dense, bf.Softmax())
    x = rng.standard_normal((2, 5, 3)).astype(np.float32) * 30  # large logits: no overflow
    z = dense.apply(x).astype(np.float64)
    expected = np.exp(z - z.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    y = model(x)
    assert y.dtype == np.float32 and np.isfinite(y).all()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-7)
    model.close()


@pytest.mark.parametrize("batch_first", [False, True])
def test_final_state_and_softmax_gradients_match_finite_differences(backend_name, batch_first, rng):
    model = bf.Sequential(_lstm(backend_name, num_layers=1, bidirectional=True, batch_first=batch_first),
                          bf.FinalState(2), _dense(backend_name, 6, 3), bf.Softmax())
    x = rng.standard_normal((2, 4, 2) if batch_first else (4, 2, 2))
    weights = rng.standard_normal((2, 3))

    def loss() -> float:
        return float((model.apply(x) * weights).sum())

    model.apply(x, training=True)
    grads = model.apply_backward(weights)
    assert_gradient_close(grads.input, numerical_gradient(loss, x), rtol=1e-6, atol=1e-9, name="input")
    parameters = model.parameters()
    for name in ("0.layer0.reverse.input_gate.input_weights", "2.weights"):
        assert_gradient_close(grads.parameters()[name], numerical_gradient(loss, parameters[name]),
                              rtol=1e-6, atol=1e-9, name=name)
    model.close()


def test_final_state_must_follow_its_lstm(backend_name):
    with pytest.raises(bf.InvalidParameterError, match=r"FinalState.num_directions must be 1 or 2; got 3"):
        bf.FinalState(3)
    with pytest.raises(bf.InvalidParameterError, match=r"FinalState\(num_directions=1\), as the LSTM"):
        bf.Sequential(_lstm(backend_name), bf.FinalState(2))
    with pytest.raises(bf.InvalidParameterError,
                       match=r"directly after an LSTMLayer; got 'a FullyConnectedLayer'"):
        bf.Sequential(_lstm(backend_name), _dense(backend_name, 3, 3), bf.FinalState(1))
    with pytest.raises(bf.InvalidParameterError, match=r"forward-running LSTM"):
        bf.Sequential(_lstm(backend_name, reverse=True), bf.FinalState(1))
    with pytest.raises(bf.InvalidParameterError, match=r"only elements without weights"):
        bf.Sequential(bf.Softmax())


# Sequence lengths and states routed to the LSTMs; LastStep at each sequence's last valid step.
# ------------------------------------------------------------------------------------------
def _classifier(backend_name, *, batch_first=False, bidirectional=True):
    width = 2 * 2 if bidirectional else 2
    return bf.Sequential({
        "lstm": _lstm(backend_name, hidden_size=2, num_layers=1, batch_first=batch_first,
                      bidirectional=bidirectional),
        "last": bf.LastStep(),
        "head": _dense(backend_name, width, 2),
    })


@pytest.mark.parametrize("batch_first", [False, True])
def test_padded_batch_with_lengths_equals_each_sequence_alone(backend_name, batch_first, rng):
    lengths = np.array([4, 1, 3, 0])
    x = rng.standard_normal((4, 4, 2))                                      # (T, N, I)
    padded = x.copy()
    padded[np.arange(4)[:, None] >= lengths] = np.nan                      # padding is never read
    if batch_first:
        x, padded = x.transpose(1, 0, 2).copy(), padded.transpose(1, 0, 2).copy()
    with _classifier(backend_name, batch_first=batch_first) as model:
        y = model.apply(padded, sequence_lengths=lengths)
        for n, length in enumerate(lengths[:3]):
            alone = x[n:n + 1, :length] if batch_first else x[:length, n:n + 1]
            np.testing.assert_allclose(y[n], model(alone)[0], rtol=1e-12, atol=1e-12)
        # A sequence of length 0: the LSTM's zeros, so the head's bias alone.
        np.testing.assert_allclose(y[3], model.layers["head"].bias, rtol=1e-12)
        assert np.array_equal(model.apply(padded, training=True, sequence_lengths=lengths), y)
        grads = model.apply_backward(np.ones((4, 2)))
        steps = np.arange(4)[None] if batch_first else np.arange(4)[:, None]
        lengths_by_row = lengths[:, None] if batch_first else lengths[None]
        assert np.all(grads.input[steps >= lengths_by_row] == 0.0)


def test_padded_classifier_matches_pytorch_packed_sequences(rng):
    """PyTorch packs the padded batch; its output at length − 1 per sequence, then the head,
    equals LSTM → LastStep → head with the lengths (bidirectional, batch-first)."""
    torch = pytest.importorskip("torch")
    from bnnsfw.interop import to_torch

    lengths = np.array([4, 1, 3])
    x = rng.standard_normal((3, 4, 2))
    with _classifier("numpy", batch_first=True) as model:
        lstm, head = to_torch(model.layers["lstm"]), to_torch(model.layers["head"])
        packed = torch.nn.utils.rnn.pack_padded_sequence(torch.from_numpy(x), torch.from_numpy(lengths),
                                                         batch_first=True, enforce_sorted=False)
        with torch.no_grad():
            output, _ = torch.nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True)
            expected = head(output[torch.arange(3), torch.from_numpy(lengths - 1)]).numpy()
        np.testing.assert_allclose(model.apply(x, sequence_lengths=lengths), expected, rtol=1e-10, atol=1e-12)


def test_lengths_gradients_match_finite_differences(backend_name, rng):
    """LSTM → LastStep at the valid step → head, batch-first and bidirectional, float64."""
    lengths = np.array([3, 1])
    x = rng.standard_normal((2, 3, 2))
    with _classifier(backend_name, batch_first=True) as model:
        weights = rng.standard_normal((2, 2))

        def loss() -> float:
            return float(np.sum(weights * model.apply(x, training=True, sequence_lengths=lengths)))

        model.apply(x, training=True, sequence_lengths=lengths)
        grads = model.apply_backward(weights)                    # the lengths are not given again
        assert_gradient_close(grads.input, numerical_gradient(loss, x), rtol=1e-6, atol=1e-8, name="input")
        named, parameters = grads.parameters(), model.parameters()
        for name in ("lstm.layer0.reverse.input_gate.hidden_weights", "lstm.layer0.forward.output_gate.bias",
                     "head.weights"):
            numeric = numerical_gradient(loss, parameters[name])
            assert_gradient_close(named[name], numeric, rtol=1e-6, atol=1e-8, name=name)


def test_initial_states_and_final_state_gradients_match_finite_differences(backend_name, rng):
    """States in, final states out (return_states), their gradients against finite differences,
    with lengths."""
    model = _classifier(backend_name, bidirectional=False)
    lstm, head = model.layers["lstm"], model.layers["head"]
    x, lengths = rng.standard_normal((3, 2, 2)), np.array([2, 3])
    h0, c0 = rng.standard_normal((1, 2, 2)), rng.standard_normal((1, 2, 2))
    out = model.apply(x, hidden=h0, cell=c0, sequence_lengths=lengths, return_states=True)
    by_hand = lstm.apply(x, h0, c0, sequence_lengths=lengths)
    np.testing.assert_allclose(out.hidden["lstm"], by_hand.hidden, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out.cell["lstm"], by_hand.cell, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out.output, head(by_hand.hidden[0]), rtol=1e-12, atol=1e-14)  # last valid step
    w_y, w_h, w_c = (rng.standard_normal(shape) for shape in ((2, 2), (1, 2, 2), (1, 2, 2)))

    def loss() -> float:
        run = model.apply(x, training=True, hidden=h0, cell={"lstm": c0}, sequence_lengths=lengths,
                          return_states=True)
        states = np.sum(w_h * run.hidden["lstm"]) + np.sum(w_c * run.cell["lstm"])
        return float(np.sum(w_y * run.output) + states)

    loss()
    grads = model.apply_backward(w_y, hidden_gradient=w_h, cell_gradient={"lstm": w_c})
    assert grads.hidden["lstm"] is grads.layers["lstm"].hidden
    for name, analytic, array in (("hidden", grads.hidden["lstm"], h0), ("cell", grads.cell["lstm"], c0),
                                  ("input", grads.input, x)):
        assert_gradient_close(analytic, numerical_gradient(loss, array), rtol=1e-6, atol=1e-8, name=name)
    # Only the final states carry gradient (after a forward of x itself: the loop perturbed it).
    loss()
    only_states = model.apply_backward(None, hidden_gradient=w_h)
    assert np.any(only_states.input != 0.0)
    model.close()


def test_states_reach_lstms_by_name(backend_name, rng):
    first, second = _lstm(backend_name, hidden_size=3, num_layers=1), _lstm(backend_name, input_size=3,
                                                                            num_layers=1)
    with bf.Sequential({"a": first, "b": second, "last": bf.LastStep()}) as model:
        x, h0 = rng.standard_normal((3, 2, 2)), rng.standard_normal((1, 2, 3))
        out = model.apply(x, hidden={"b": h0}, return_states=True)
        expected = second.apply(first.apply(x).output, h0)
        np.testing.assert_allclose(out.output, expected.output[-1], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(out.hidden["b"], expected.hidden, rtol=1e-12, atol=1e-14)
        assert list(out.hidden) == ["a", "b"]
        with pytest.raises(bf.InvalidParameterError,
                           match=r"Sequential.apply\(hidden\) must be a mapping of LSTM name "
                                 r"\(\['a', 'b'\]\) to array for a model with 2 LSTMs; got 'ndarray'"):
            model.apply(x, hidden=h0)
        with pytest.raises(bf.InvalidParameterError,
                           match=r"Sequential.apply\(cell\) names must be names of the model's LSTMs "
                                 r"\['a', 'b'\]; got \['last'\]"):
            model.apply(x, cell={"last": h0})


def test_a_pending_training_step_survives_an_inference_forward(backend_name, rng):
    """train → evaluate → backward gives the gradients of train → backward (the twin)."""
    def model() -> bf.Sequential:
        return bf.Sequential({"lstm": _lstm(backend_name, dropout=0.5), "drop": bf.Dropout(0.5, seed=1),
                              "last": bf.LastStep(), "head": _dense(backend_name, 3, 2)})

    x, x_val, lengths = rng.standard_normal((4, 2, 2)), rng.standard_normal((5, 3, 2)), [4, 3]
    with model() as reference, model() as evaluated:
        reference.apply(x, training=True, sequence_lengths=lengths)
        expected = reference.apply_backward(np.ones((2, 2)))
        evaluated.apply(x, training=True, sequence_lengths=lengths)
        evaluated(x_val)
        evaluated.apply(x_val)
        got = evaluated.apply_backward(np.ones((2, 2)))
        for name, array in expected.parameters().items():
            np.testing.assert_allclose(got.parameters()[name], array, rtol=1e-12, atol=1e-14, err_msg=name)
        np.testing.assert_allclose(got.input, expected.input, rtol=1e-12, atol=1e-14)


def test_lengths_and_states_errors_name_the_argument(backend_name, rng):
    x = rng.standard_normal((4, 3, 2))
    with _classifier(backend_name, bidirectional=False) as model:
        with pytest.raises(bf.ShapeError, match=r"Sequential.apply\(sequence_lengths\) must be of shape "
                                                r"\(3,\) \(one length per sequence\); got 'shape \(2,\)'"):
            model.apply(x, sequence_lengths=[4, 4])
        with pytest.raises(bf.InvalidParameterError, match=r"apply\(sequence_lengths\) must be in \[0, 4\] "
                                                           r"\(T = 4\); got \[4, 5, 1\]"):
            model.apply(x, sequence_lengths=[4, 5, 1])
        with pytest.raises(bf.InvalidParameterError, match=r"apply\(sequence_lengths\) must be integers; "
                                                           r"got 'float64'"):
            model.apply(x, sequence_lengths=[4.0, 2.0, 1.0])
        with pytest.raises(bf.ShapeError, match=r"Sequential.apply\(cell\) must be of shape \(L·D, N, H\) = "
                                                r"\(1, 3, 2\); got 'shape \(1, 2, 2\) float64'"):
            model.apply(x, cell=np.zeros((1, 2, 2)))
        with pytest.raises(bf.ShapeError, match=r"Sequential.apply\(x\) must be of shape \(T, N, F\)"):
            model.apply(x[None], sequence_lengths=[1])
        with pytest.raises(bf.ShapeError, match=r"apply\(x\) must be of shape .* with T >= 1 and N >= 1"):
            model.apply(x[:, :0], sequence_lengths=np.zeros(0, np.int64))     # no sequences: the LSTM says so
        model.apply(x, training=True)
        with pytest.raises(bf.ShapeError, match=r"apply_backward\(hidden_gradient\['lstm'\]\) must be of "
                                                r"shape \(L·D, N, P\) = \(1, 3, 2\)"):
            model.apply_backward(np.ones((3, 2)), hidden_gradient={"lstm": np.ones((1, 2))})
        # Unbatched: one integer, states without N.
        y = model.apply(x[:, 0], sequence_lengths=2, hidden=np.zeros((1, 2)))
        np.testing.assert_allclose(y, model(x[:2, 0]), rtol=1e-12)
    with bf.Sequential(_dense(backend_name, 2, 2)) as dense:
        with pytest.raises(bf.InvalidParameterError, match=r"sequence_lengths\) must be None for a model "
                                                           r"without an LSTMLayer or LastStep"):
            dense.apply(x, sequence_lengths=[1, 2, 3])


# ------------------------------------------------------------------------------------------
# Dropout.
# ------------------------------------------------------------------------------------------
def _dropped(backend_name, rate=0.25, seed=3):
    return bf.Sequential({"head": _dense(backend_name, 2, 40), "drop": bf.Dropout(rate, seed=seed)})


def test_dropout_zeros_at_rate_and_scales_the_rest_in_training_only(backend_name, rng):
    x = rng.standard_normal((100, 2))
    with _dropped(backend_name) as model:
        kept = model.layers["head"](x)
        np.testing.assert_array_equal(model(x), kept)                       # identity at inference
        y = model.apply(x, training=True)
        zeros = y == 0.0
        assert abs(zeros.mean() - 0.25) < 0.03                             # 4000 draws: σ ≈ 0.007
        np.testing.assert_allclose(y[~zeros], kept[~zeros] / 0.75, rtol=1e-12)
        dy = rng.standard_normal(y.shape)
        grads = model.apply_backward(dy)                                   # the forward's mask
        expected = model.layers["head"].apply_backward(x, np.where(zeros, 0.0, dy / 0.75))
        np.testing.assert_allclose(grads.input, expected.input, rtol=1e-12, atol=1e-14)
    with _dropped(backend_name, rate=0.0) as model:
        np.testing.assert_array_equal(model.apply(x, training=True), model(x))


def test_dropout_gradients_match_finite_differences_with_a_fixed_mask(backend_name, rng):
    """Each evaluation runs a copy of a copy taken before the first forward: its generator draws
    the mask of the model's forward."""
    model = bf.Sequential({"lstm": _lstm(backend_name, num_layers=1), "drop": bf.Dropout(0.5, seed=7),
                           "last": bf.LastStep(), "head": _dense(backend_name, 3, 2)})
    frozen = copy.deepcopy(model)
    x, weights = rng.standard_normal((3, 2, 2)), rng.standard_normal((2, 2))

    def loss() -> float:
        twin = copy.deepcopy(frozen)
        value = float(np.sum(weights * twin.apply(x, training=True)))
        twin.close()
        return value

    y = model.apply(x, training=True)
    assert np.any(model.apply(x) != y)                            # dropout was active
    grads = model.apply_backward(weights)
    assert_gradient_close(grads.input, numerical_gradient(loss, x), rtol=1e-6, atol=1e-8, name="input")
    name = "lstm.layer0.forward.candidate_gate.input_weights"
    assert_gradient_close(grads.parameters()[name], numerical_gradient(loss, frozen.parameters()[name]),
                          rtol=1e-6, atol=1e-8, name=name)
    model.close()
    frozen.close()


def test_dropout_seeds_repeat_and_travel(backend_name, rng, tmp_path):
    x = rng.standard_normal((8, 2))
    with _dropped(backend_name, seed=5) as model, _dropped(backend_name, seed=5) as same, \
            _dropped(backend_name, seed=6) as other:
        first = model.apply(x, training=True)
        np.testing.assert_array_equal(first, same.apply(x, training=True))
        assert not np.array_equal(first, other.apply(x, training=True))
        assert not np.array_equal(first, model.apply(x, training=True))   # a new mask each forward
        travelled = pickle.loads(pickle.dumps(model))                     # the generator's state travels
        np.testing.assert_array_equal(travelled.apply(x, training=True), model.apply(x, training=True))
        assert repr(travelled.layers["drop"]) == "Dropout(0.25, seed=5)"
        assert list(model.state_dict()) == ["head.weights", "head.bias"]
        bf.save_weights(tmp_path / "m", model)
        loaded = bf.load_weights(tmp_path / "m")
        assert isinstance(loaded.layers["drop"], bf.Dropout) and loaded.layers["drop"].rate == 0.25
        np.testing.assert_array_equal(loaded(x), model(x))
        bf.load_weights(tmp_path / "m", into=other)
        travelled.close()
        loaded.close()


@pytest.mark.parametrize(("rate", "seed", "message"), [
    (1.0, None, r"Dropout\(rate\) must be in \[0.0, 1.0\); got 1.0"),
    (-0.1, None, r"Dropout\(rate\) must be in \[0.0, 1.0\); got -0.1"),
    (float("nan"), None, r"Dropout\(rate\) must be finite; got nan"),
    ("0.5", None, r"Dropout\(rate\) must be a number; got '0.5'"),
    (0.5, -1, r"Dropout\(seed\) must be an integer >= 0; got -1"),
    (0.5, 1.5, r"Dropout\(seed\) must be an integer >= 0; got 1.5"),
])
def test_dropout_rate_and_seed_are_checked(rate, seed, message):
    with pytest.raises(bf.InvalidParameterError, match=message):
        bf.Dropout(rate, seed=seed)


def test_call_takes_training_as_apply_does(backend_name, rng):
    model = _forecaster(backend_name)
    x = rng.standard_normal((4, 3, 2))
    trained = model(x, training=True)
    grads = model.apply_backward(np.ones_like(trained))
    np.testing.assert_array_equal(trained, model.apply(x, training=True))
    np.testing.assert_array_equal(grads.input, model.apply_backward(np.ones_like(trained)).input)
    np.testing.assert_array_equal(model(x), model.apply(x))
    with pytest.raises(bf.InvalidParameterError, match=r"apply\(training\) must be True or False"):
        model(x, training="yes")
    model.close()

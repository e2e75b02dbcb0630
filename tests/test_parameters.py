"""Parameters and gradients by name, state dicts, callable layers and unbatched inputs."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import LSTMLayer, LSTMParameters
from bnnsfw.layers import _lstm_weights
from bnnsfw.losses import MeanSquaredError
from bnnsfw.optimizers import SGD, Adam

FILTER_OPTIONS = [{}, {"use_client_pointer": True}]


def _fp(backend_name, **options):
    return bf.FilterParameters(backend=backend_name, **options)


def _lstm(backend_name, *, num_layers=2, bidirectional=False, peepholes=None, dtype=np.float64, **options):
    params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=num_layers,
                                   bidirectional=bidirectional, peepholes=peepholes, seed=1, dtype=dtype)
    return LSTMLayer(params, _fp(backend_name, **options))


def _norm(backend_name, dtype=np.float64, **options):
    kind = bf.NormalizationType.batch(moving_mean=np.zeros(3), moving_variance=np.ones(3))
    params = bf.NormalizationParameters(type=kind, input_shape=(3, 2), momentum=0.5, dtype=dtype)
    return bf.NormalizationLayer(params, _fp(backend_name, **options))


def _dense(backend_name, dtype=np.float64, **options):
    params = bf.FullyConnectedParameters.random(input_size=3, output_size=2, seed=2, dtype=dtype)
    return bf.FullyConnectedLayer(params, _fp(backend_name, **options))


# ------------------------------------------------------------------------------------------
# Names.
# ------------------------------------------------------------------------------------------
def test_lstm_names_are_per_layer_direction_gate_and_field(backend_name):
    with _lstm(backend_name, bidirectional=True, peepholes="diagonal") as layer:
        named = layer.parameters()
    assert list(named)[:4] == ["layer0.forward.input_gate.input_weights",
                               "layer0.forward.input_gate.hidden_weights",
                               "layer0.forward.input_gate.cell_weights",
                               "layer0.forward.input_gate.bias"]
    assert "layer0.forward.candidate_gate.cell_weights" not in named   # no peephole there
    assert named["layer0.reverse.output_gate.input_weights"].shape == (4, 3)
    assert named["layer1.reverse.output_gate.input_weights"].shape == (4, 8)   # (H, D·H)
    assert named["layer1.forward.forget_gate.hidden_weights"].shape == (4, 4)
    assert named["layer1.forward.forget_gate.cell_weights"].shape == (4,)
    assert len(named) == 2 * 2 * (4 * 4 - 1)


def test_gradients_offer_the_parameter_names_with_matching_shapes(backend_name, rng):
    x_seq = rng.standard_normal((5, 2, 3))
    with _lstm(backend_name, bidirectional=True, peepholes="full") as lstm:
        out = lstm.apply(x_seq, training=True)
        grads = lstm.apply_backward(x_seq, np.ones_like(out.output), training_cache=out.training_cache)
        _same_names_and_shapes(lstm.parameters(), grads.parameters())
        # The named gradients are views of the stacked ones.
        np.testing.assert_array_equal(grads.parameters()["layer1.reverse.candidate_gate.hidden_weights"],
                                      grads.candidate_gate.hidden_weights[1, 1])
    x = rng.standard_normal((4, 3, 2))
    with _norm(backend_name) as norm:
        y = norm.apply(x, training=True)
        _same_names_and_shapes(norm.parameters(),
                               norm.apply_backward(x, np.ones_like(y), training=True).parameters())
        assert list(norm.parameters()) == ["gamma", "beta"]
        assert list(norm.state_dict()) == ["gamma", "beta", "moving_mean", "moving_variance"]
    with _dense(backend_name) as dense:
        grads = dense.apply_backward(x[:, :, 0], np.ones((4, 2)))
        _same_names_and_shapes(dense.parameters(), grads.parameters())
        assert list(dense.parameters()) == ["weights", "bias"]


def _same_names_and_shapes(params, grads):
    assert list(params) == list(grads)
    for name in params:
        assert params[name].shape == grads[name].shape, name


# ------------------------------------------------------------------------------------------
# Live arrays: an in-place update is what the next call computes with, whatever the options.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", FILTER_OPTIONS, ids=["copy", "client"])
def test_in_place_updates_reach_the_next_call(backend_name, options, rng):
    x_seq = rng.standard_normal((4, 2, 3))
    x = rng.standard_normal((5, 3, 2))
    for layer, run in ((_lstm(backend_name, **options), lambda layer: layer(x_seq).output),
                       (_norm(backend_name, **options), lambda layer: layer(x)),
                       (_dense(backend_name, **options), lambda layer: layer(x[:, :, 0]))):
        with layer:
            before = run(layer)
            for name, array in layer.parameters().items():
                array += 0.25
                after = run(layer)
                assert not np.allclose(after, before), f"{type(layer).__name__}: {name} was ignored"
                before = after
            # A fresh layer built from the layer's own description computes the same.
            with type(layer)(layer.layer_parameters, _fp(backend_name)) as fresh:
                np.testing.assert_allclose(run(fresh), before, rtol=1e-12, atol=1e-12)


def test_an_lstm_packs_once_until_its_arrays_leave_it_then_only_when_they_change(rng, pack_recorder):
    """Default options: no comparison until parameters() hands the arrays out; after that the
    backend is asked again only when an array changed."""
    packs = pack_recorder.versions
    params = LSTMParameters.random(input_size=2, hidden_size=3, seed=0, dtype=np.float64)
    x = rng.standard_normal((4, 2, 2))
    with LSTMLayer(params, bf.FilterParameters(backend=pack_recorder)) as layer:
        assert layer._watched is False
        first = layer(x).output
        named = layer.parameters()
        assert layer._watched is True
        layer(x)
        assert packs == [0]
        named["layer0.forward.forget_gate.bias"][1] += 0.5
        second = layer(x).output
        layer(x)
        assert packs == [0, 1]
        layer.load_state_dict(layer.state_dict())   # the layer wrote its arrays: packed again
        np.testing.assert_array_equal(layer(x).output, second)
        assert packs == [0, 1, 2]
    assert not np.allclose(first, second)


@pytest.mark.parametrize("compared", ["bytes", "memcmp", "numpy"])
@pytest.mark.parametrize("client", [False, True], ids=["copy", "client"])
def test_every_bit_of_a_handed_out_weight_is_watched(monkeypatch, pack_recorder, rng, compared, client):
    """−0.0 for 0.0 is a change, the same NaN is not; compared as bytes (small arrays), with
    memcmp or with NumPy."""
    if compared != "bytes":  # as for arrays larger than the ones compared as bytes
        monkeypatch.setattr(_lstm_weights._WeightsWatch, "BYTES_COMPARED", 0)
    if compared == "numpy":
        monkeypatch.setattr(_lstm_weights, "_memcmp", None)
        monkeypatch.setattr(_lstm_weights, "_memcmp_loaded", True)
    params = bf.LSTMParameters.random(input_size=2, hidden_size=3, seed=0, dtype=np.float64)
    x = rng.standard_normal((2, 1, 2))
    with bf.LSTMLayer(params, bf.FilterParameters(backend=pack_recorder, use_client_pointer=client)) as layer:
        bias = layer.parameters()["layer0.forward.forget_gate.bias"]
        bias[0] = 0.0
        layer(x)
        packs = len(pack_recorder.versions)
        bias[0] = -0.0
        layer(x)
        assert len(pack_recorder.versions) == packs + 1
        bias[1] = np.nan
        layer(x)
        layer(x)
        assert len(pack_recorder.versions) == packs + 2


class _PausingPacker(type(bf.backends.get_backend("scipy-blas"))):  # type: ignore[misc]
    """``scipy-blas``, which packs copies of the weights, whose next packing, once ``pause``
    is set, sets ``paused`` and waits until ``go`` is set: after reading the weights, or
    before with ``before`` (``packed`` is set when that packing has read them)."""

    name = "pausing"

    def __init__(self, *, before: bool = False) -> None:
        self.before = before
        self.pause, self.paused, self.go, self.packed = (threading.Event() for _ in range(4))

    def _wait(self) -> None:
        self.paused.set()
        assert self.go.wait(10)

    def lstm_pack_weights(self, request):
        pausing = self.pause.is_set()
        self.pause.clear()
        if pausing and self.before:
            self._wait()
        packing = super().lstm_pack_weights(request)
        if pausing:
            self.packed.set()
            if not self.before:
                self._wait()
        return packing


@pytest.mark.parametrize("change", ["load_state_dict", "in place"])
def test_a_change_during_a_packing_is_packed_by_the_next_call(rng, change):
    """Weights written while another thread's call is packing the ones before (after the
    backend read them): that call keeps its packing, and the next call packs the new weights.
    A layer whose weights were never handed out (nothing watched) sees a ``load_state_dict``
    by its count of writes; a handed-out array changed in place, by the snapshot taken before
    the packing."""
    params = bf.LSTMParameters.random(input_size=2, hidden_size=3, seed=0, dtype=np.float64)
    backend = _PausingPacker()
    x = rng.standard_normal((2, 1, 2))
    with bf.LSTMLayer(params, bf.FilterParameters(backend=backend)) as layer:
        state = layer.state_dict()
        before = layer(x).output
        if change == "load_state_dict":
            changed = dict(state)
            changed["layer0.forward.input_gate.bias"] = state["layer0.forward.input_gate.bias"] + 1.0
            layer.load_state_dict(changed)                # packed again by the next call...
        else:
            bias = layer.parameters()["layer0.forward.input_gate.bias"]
            original = bias.copy()
            bias[...] = original + 1.0
        backend.pause.set()
        packing = threading.Thread(target=layer, args=(x,))
        packing.start()
        assert backend.paused.wait(10)                    # ...which has read the weights
        if change == "load_state_dict":
            writing = threading.Thread(target=layer.load_state_dict, args=(state,))
            writing.start()                               # writes the arrays, then waits for the packing
            time.sleep(0.2)
        else:
            bias[...] = original
        backend.go.set()
        packing.join(10)
        if change == "load_state_dict":
            writing.join(10)
        assert layer._watched == (change == "in place")
        np.testing.assert_allclose(layer(x).output, before, rtol=1e-12, atol=1e-12)


def test_a_change_undone_while_a_packing_reads_is_not_packed(rng):
    """A handed-out array changed after a call started packing and changed back before the
    next call: the backend packed the weights as they were when the packing began (its own
    copy), which the next call's comparison then vouches for."""
    params = bf.LSTMParameters.random(input_size=2, hidden_size=3, seed=0, dtype=np.float64)
    backend = _PausingPacker(before=True)
    x = rng.standard_normal((2, 1, 2))
    with bf.LSTMLayer(params, bf.FilterParameters(backend=backend)) as layer:
        bias = layer.parameters()["layer0.forward.input_gate.bias"]
        layer(x)
        bias[...] += 1.0                                  # packed again by the next call
        began = bias.copy()
        backend.pause.set()
        packing = threading.Thread(target=layer, args=(x,))
        packing.start()
        assert backend.paused.wait(10)                    # the packing began; the backend waits
        bias[...] = began + 1.0
        backend.go.set()
        assert backend.packed.wait(10)
        bias[...] = began                                 # bit for bit as when the packing began
        packing.join(10)
        got = layer(x).output
        with bf.LSTMLayer(layer.layer_parameters, bf.FilterParameters(backend="numpy")) as fresh:
            np.testing.assert_allclose(got, fresh(x).output, rtol=1e-12, atol=1e-12)


def test_layer_parameters_are_read_only_views_of_the_live_copies(backend_name):
    with _lstm(backend_name) as layer:
        live = layer.layer_parameters.forget_gate.hidden_weights
        with pytest.raises(ValueError, match="read-only"):
            live[...] = 0.0                        # not a silent no-op: the layer refuses the write
        layer.parameters()["layer1.forward.forget_gate.hidden_weights"][...] = 7.0
        assert (live[1] == 7.0).all()              # the view shows the live values
        with pytest.raises(bf.InvalidParameterError, match=r"parameters\[0\]\) must be a writable array"):
            SGD(0.1).step([live], [np.ones_like(live)])
    params = LSTMParameters.random(input_size=3, hidden_size=4, seed=1, dtype=np.float64)
    with LSTMLayer(params, _fp(backend_name, use_client_pointer=True)) as client:
        assert client.layer_parameters is params


# ------------------------------------------------------------------------------------------
# Training through parameters() with default filter options.
# ------------------------------------------------------------------------------------------
def test_the_readme_lstm_trains_with_default_options_through_parameters(backend_name):
    """The README's LSTM, default FilterParameters: named parameters, named gradients, Adam."""
    params = bf.LSTMParameters.random(input_size=8, hidden_size=16, num_layers=2, seed=0)
    layer = bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 4, 8)).astype(np.float32)                # (T, N, I)
    target = np.tanh(np.cumsum(x[:, :, :1], axis=0) / 4)                  # (T, N, 1): a running sum
    target = np.repeat(target, 16, axis=2).astype(np.float32)
    loss, optimizer = MeanSquaredError(), Adam(learning_rate=0.02)
    losses = []
    for _ in range(40):
        out = layer.apply(x, training=True)
        result = loss.apply(out.output, target)
        grads = layer.apply_backward(x, result.gradient, training_cache=out.training_cache)
        optimizer.step(layer.parameters(), grads.parameters())
        losses.append(result.loss)
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(b < a for a, b in zip(losses[:5], losses[1:6]))     # falling from the first step
    layer.close()


def test_a_name_mismatch_is_refused_before_anything_changes(backend_name, rng):
    x = rng.standard_normal((3, 2, 3))
    with _lstm(backend_name, num_layers=1) as lstm, _dense(backend_name) as dense:
        out = lstm.apply(x, training=True)
        grads = lstm.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
        before = lstm.state_dict()
        optimizer = SGD(0.1)
        with pytest.raises(bf.InvalidParameterError) as info:
            optimizer.step(lstm.parameters(), dense.apply_backward(x[0], np.ones((2, 2))).parameters())
        message = str(info.value)
        assert message.startswith("SGD.step(gradients) must be the gradients of exactly the parameters' "
                                  "names")
        assert "missing names ['layer0.forward.input_gate.input_weights'," in message
        assert "unexpected names ['weights', 'bias']" in message
        renamed = dict(grads.parameters())
        renamed["layer0.forward.input_gate.biases"] = renamed.pop("layer0.forward.input_gate.bias")
        with pytest.raises(bf.InvalidParameterError,
                           match=r"missing names \['layer0.forward.input_gate.bias'\], "
                                 r"unexpected names \['layer0.forward.input_gate.biases'\]"):
            optimizer.step(lstm.parameters(), renamed)
        wrong_shape = dict(grads.parameters(), **{"layer0.forward.output_gate.bias": np.ones(5)})
        with pytest.raises(bf.ShapeError, match=r"SGD.step\(gradients\['layer0.forward.output_gate.bias'\]\) "
                                                r"must be of shape \(4,\)"):
            optimizer.step(lstm.parameters(), wrong_shape)
        with pytest.raises(bf.InvalidParameterError,   # gate objects: the message says what to pass
                           match=r"layer.parameters\(\) and grads.parameters\(\) give every array"):
            optimizer.step(lstm.layer_parameters.gates, grads.gates)
        for name, array in lstm.state_dict().items():
            np.testing.assert_array_equal(array, before[name])
        assert optimizer.step_count == 0


# ------------------------------------------------------------------------------------------
# state_dict / load_state_dict.
# ------------------------------------------------------------------------------------------
def test_state_dict_is_a_copy_and_loads_into_a_twin(backend_name, rng):
    x = rng.standard_normal((5, 3, 2))
    x_seq = rng.standard_normal((5, 2, 3))
    for make, run in ((lambda: _lstm(backend_name, bidirectional=True),
                       lambda layer: layer(x_seq).output),
                      (lambda: _norm(backend_name), lambda layer: layer(x)),
                      (lambda: _dense(backend_name), lambda layer: layer(x[:, :, 0]))):
        with make() as source, make() as twin:
            for array in source.parameters().values():
                array *= 1.5
            if isinstance(source, bf.NormalizationLayer):
                source.apply(x, training=True)     # moves the moving statistics
            state = source.state_dict()
            assert all(not np.shares_memory(state[n], a) for n, a in source._state_targets().items())
            assert twin.load_state_dict(state) == ([], [])
            np.testing.assert_array_equal(run(twin), run(source))


def test_load_state_dict_is_strict_and_lists_every_difference(backend_name):
    with _norm(backend_name) as norm:
        state = norm.state_dict()
        state["gamma_typo"] = state.pop("gamma")
        state["extra"] = np.zeros(1)
        with pytest.raises(bf.InvalidParameterError,
                           match=r"NormalizationLayer.load_state_dict\(state\) must be a state with exactly "
                                 r"the "
                                 r"names of state_dict\(\); got \"missing names \['gamma'\], "
                                 r"unexpected names \['gamma_typo', 'extra'\]\""):
            norm.load_state_dict(state)
        beta = np.full(3, 2.0)
        keys = norm.load_state_dict({"beta": beta, "extra": 1}, strict=False)
        assert keys.missing_keys == ["gamma", "moving_mean", "moving_variance"]
        assert keys.unexpected_keys == ["extra"]
        np.testing.assert_array_equal(norm.beta, beta)


def test_load_state_dict_checks_every_value_before_writing(backend_name):
    with _norm(backend_name) as norm:
        good = norm.state_dict()
        for bad, error, match in (
                ({"gamma": np.ones(4)}, bf.ShapeError, r"\['gamma'\] must be of shape \(3,\)"),
                ({"beta": np.array([0.0, np.nan, 0.0])}, bf.InvalidParameterError,
                 r"\['beta'\] must be finite"),
                ({"moving_variance": -np.ones(3)}, bf.InvalidParameterError,
                 r"\['moving_variance'\] must be >= 0 everywhere")):
            changed = {**{n: a + 1.0 for n, a in good.items() if n != "moving_variance"},
                       "moving_variance": good["moving_variance"], **bad}
            with pytest.raises(error, match=match):
                norm.load_state_dict(changed)
            for name, array in norm.state_dict().items():   # nothing was written
                np.testing.assert_array_equal(array, good[name])
        with pytest.raises(bf.InvalidParameterError,
                           match=r"load_state_dict\(strict\) must be True or False"):
            norm.load_state_dict(good, strict="no")
        with pytest.raises(bf.InvalidParameterError, match=r"must be a mapping of name to array"):
            norm.load_state_dict([good["gamma"]])


def test_values_are_converted_to_the_layer_dtype(backend_name):
    with _dense(backend_name, dtype=np.float32) as dense:
        state = {name: array.astype(np.float64) + 1.0 for name, array in dense.state_dict().items()}
        dense.load_state_dict(state)
        assert dense.weights.dtype == np.float32
        np.testing.assert_allclose(dense.weights, state["weights"], rtol=1e-6)


def test_closed_layers_refuse_the_named_api(backend_name):
    layer = _dense(backend_name)
    state = layer.state_dict()
    layer.close()
    for call in (layer.parameters, layer.state_dict, lambda: layer.load_state_dict(state),
                 lambda: layer.layer_parameters):
        with pytest.raises(bf.FilterClosedError, match="after close"):
            call()


# ------------------------------------------------------------------------------------------
# Callable layers and unbatched inputs (PyTorch's rule).
# ------------------------------------------------------------------------------------------
def test_layers_are_callable_for_inference(backend_name, rng):
    x = rng.standard_normal((5, 3, 2))
    x_seq = rng.standard_normal((5, 2, 3))
    with _lstm(backend_name) as lstm, _norm(backend_name) as norm, _dense(backend_name) as dense:
        np.testing.assert_array_equal(lstm(x_seq).output, lstm.apply(x_seq).output)
        moving = norm.moving_mean.copy()
        np.testing.assert_array_equal(norm(x), norm.apply(x, phase="inference"))
        np.testing.assert_array_equal(norm.moving_mean, moving)   # inference: statistics untouched
        np.testing.assert_array_equal(dense(x[:, :, 0]), dense.apply(x[:, :, 0]))


@pytest.mark.parametrize("batch_first", [False, True])
def test_an_unbatched_lstm_input_is_a_batch_of_one(backend_name, batch_first, rng):
    params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2, bidirectional=True, seed=3,
                                   dtype=np.float64, batch_first=batch_first)
    x = rng.standard_normal((6, 3))                          # (T, I) in either layout
    h0, c0 = rng.standard_normal((2, 4, 4))                   # (L·D, H)
    dy, dh = rng.standard_normal((6, 8)), rng.standard_normal((4, 4))
    batched_x = x[None] if batch_first else x[:, None]
    with LSTMLayer(params, _fp(backend_name)) as layer:
        out = layer.apply(x, h0, c0, training=True)
        ref = layer.apply(batched_x, h0[:, None], c0[:, None], training=True)
        assert out.output.shape == (6, 8) and out.hidden.shape == (4, 4) and out.cell.shape == (4, 4)
        np.testing.assert_array_equal(out.output, ref.output[0] if batch_first else ref.output[:, 0])
        np.testing.assert_array_equal(out.hidden, ref.hidden[:, 0])
        grads = layer.apply_backward(x, dy, h0, c0, hidden_gradient=dh, training_cache=out.training_cache)
        ref_grads = layer.apply_backward(batched_x, dy[None] if batch_first else dy[:, None], h0[:, None],
                                         c0[:, None], hidden_gradient=dh[:, None],
                                         training_cache=ref.training_cache)
        assert grads.input.shape == (6, 3) and grads.hidden.shape == (4, 4)
        ref_input = ref_grads.input[0] if batch_first else ref_grads.input[:, 0]
        np.testing.assert_array_equal(grads.input, ref_input)
        np.testing.assert_array_equal(grads.cell, ref_grads.cell[:, 0])
        for name, array in grads.parameters().items():
            np.testing.assert_array_equal(array, ref_grads.parameters()[name])
        np.testing.assert_array_equal(layer.apply(x, sequence_lengths=4).output[4:], 0.0)
        with pytest.raises(bf.ShapeError, match=r"apply\(hidden\) must be of shape \(L·D, H\) = \(4, 4\) "
                                                r"for an unbatched x"):
            layer.apply(x, h0[:, None])


def test_unbatched_normalization_and_dense_inputs(backend_name, rng):
    x = rng.standard_normal((3, 2))
    with _norm(backend_name) as norm, _dense(backend_name) as dense:
        out = np.empty((3, 2))
        assert norm.apply(x, phase="inference", output=out) is out
        np.testing.assert_array_equal(out, norm.apply(x[None], phase="inference")[0])
        dy = rng.standard_normal((3, 2))
        grads = norm.apply_backward(x, dy, phase="inference")
        ref = norm.apply_backward(x[None], dy[None], phase="inference")
        assert grads.input.shape == (3, 2)
        np.testing.assert_array_equal(grads.input, ref.input[0])
        np.testing.assert_array_equal(grads.gamma, ref.gamma)
        v = x[:, 0]
        assert dense(v).shape == (2,)
        np.testing.assert_array_equal(dense(v), dense(v[None])[0])
        grads = dense.apply_backward(v, np.ones(2))
        np.testing.assert_array_equal(grads.input, dense.apply_backward(v[None], np.ones((1, 2))).input[0])
        assert grads.input.shape == (3,) and grads.weights.shape == (2, 3)

"""The prepared forwards an LSTM layer and a stream keep (``lstm_prepare_forward``), and the
watch on handed-out weights: one prepared forward per kind of call, a few at most, forgotten
whenever the weights are packed again; results as the unprepared path gives them."""

from __future__ import annotations

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.backends.contract import OPERATIONS, TOLERANCE
from bnnsfw.layers._lstm_prepared import CheckedKinds, PreparedForwards


class Counting:
    """Another backend's operations, counting the forwards it prepares (``prepare=False``:
    offering none, so the layer calls ``lstm_forward``)."""

    name = "counting"

    def __init__(self, inner, prepare=True):
        self.inner = inner
        self.prepared = 0
        for operation in OPERATIONS:
            setattr(self, operation, getattr(inner, operation))
        if prepare:
            self.lstm_prepare_forward = self._prepare

    def _prepare(self, request):
        self.prepared += 1
        return self.inner.lstm_prepare_forward(request)


def _layer(backend, *, dtype=np.float64, **options):
    params = bf.LSTMParameters.random(input_size=3, hidden_size=4, seed=3, dtype=dtype, **options)
    return bf.LSTMLayer(params, bf.FilterParameters(backend=backend))


def _close(got, want):
    rtol, atol = TOLERANCE[np.dtype(want.dtype)]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("options", [{}, {"num_layers": 2, "bidirectional": True, "dropout": 0.2}],
                         ids=["one-layer", "stacked"])
def test_prepared_and_unprepared_forwards_agree(backend_name, options, rng):
    """Inference and training (forward and its cache, read by backward), with and without states."""
    inner = bf.backends.get_backend(backend_name)
    with _layer(Counting(inner), **options) as prepared, \
            _layer(Counting(inner, prepare=False), **options) as plain:
        size_ld = prepared.layer_parameters.num_layers * prepared.layer_parameters.num_directions
        for states in (False, True):
            x = rng.standard_normal((3, 2, 3))
            h0, c0 = (rng.standard_normal((size_ld, 2, 4)) if states else None for _ in range(2))
            for _ in range(3):  # the second call prepares the forward, the third reuses it
                got, want = prepared.apply(x, h0, c0), plain.apply(x, h0, c0)
                for name in ("output", "hidden", "cell"):
                    _close(getattr(got, name), getattr(want, name))
            for _ in range(2):  # prepared at the second call of a kind
                got, want = prepared.apply(x, h0, c0, training=True), plain.apply(x, h0, c0, training=True)
                _close(got.output, want.output)
            dy = rng.standard_normal(got.output.shape)
            got_grads = prepared.apply_backward(x, dy, h0, c0, training_cache=got.training_cache)
            want_grads = plain.apply_backward(x, dy, h0, c0, training_cache=want.training_cache)
            for name, gradient in want_grads.parameters().items():
                _close(got_grads.parameters()[name], gradient)
            _close(got_grads.input, want_grads.input)
        assert prepared.backend.prepared == 4  # (no states, states) x (inference, training)
        assert plain.backend.prepared == 0


def test_each_kind_of_call_is_prepared_once(rng):
    """Keyed by everything the backend may choose by: shape, dtype, strides, flags, which
    states are given, training; prepared at the second call of a kind, reused after."""
    backend = Counting(bf.backends.get_backend("numpy"))
    with _layer(backend) as layer:
        x = rng.standard_normal((3, 2, 3))
        h0 = rng.standard_normal((1, 2, 4))
        layer(x)
        assert backend.prepared == 0                     # one call of a kind: not prepared
        layer(x.copy())
        layer(x)
        assert backend.prepared == 1
        frozen = x.copy()
        frozen.setflags(write=False)
        kinds = [lambda: layer(frozen),                  # flags
                 lambda: layer(x[:2]),                   # shape (T)
                 lambda: layer(x, h0),                   # which states
                 lambda: layer(x, None, h0),
                 lambda: layer(x, h0, h0),
                 lambda: layer(x, np.asfortranarray(h0), h0),  # strides
                 lambda: layer.apply(x, training=True)]  # training
        for call in kinds + kinds:
            call()
        assert backend.prepared == 8
        for _ in range(3):
            layer(x, sequence_lengths=[3, 1])            # lengths are values: never prepared
        assert backend.prepared == 8 and len(layer._prepared) <= PreparedForwards.LIMIT


def test_the_prepared_forwards_are_bounded_and_forgotten_when_the_weights_change(rng):
    backend = Counting(bf.backends.get_backend("numpy"))
    with _layer(backend) as layer:
        for steps in range(1, 2 * PreparedForwards.LIMIT):
            x = rng.standard_normal((steps, 1, 3))
            layer(x)
            layer(x)
        assert len(layer._prepared) == PreparedForwards.LIMIT
        x = rng.standard_normal((2, 2, 3))
        layer(x)
        layer(x)
        layer.load_state_dict(layer.state_dict())      # the layer wrote its weights
        before = backend.prepared
        layer(x)
        assert len(layer._prepared) == 0
        layer(x)
        assert backend.prepared == before + 1 and len(layer._prepared) == 1
        named = layer.parameters()
        named["layer0.forward.output_gate.hidden_weights"][0, 0] += 1.0  # in place, handed out
        layer(x)
        got = layer(x).output
        assert backend.prepared == before + 2 and len(layer._prepared) == 1
        with bf.LSTMLayer(layer.layer_parameters, bf.FilterParameters(backend="numpy")) as fresh:
            _close(got, fresh(x).output)


@pytest.fixture
def checks_run(monkeypatch) -> list[str]:
    """The ``where`` of each check of ``x`` an LSTM layer runs."""
    seen: list[str] = []
    run = bf.LSTMLayer._check_x

    def spy(self, where, x):
        seen.append(where)
        return run(self, where, x)

    monkeypatch.setattr(bf.LSTMLayer, "_check_x", spy)
    return seen


@pytest.mark.parametrize("batch_first", [False, True])
def test_an_inference_of_a_kind_whose_checks_passed_skips_them(backend_name, batch_first, rng, checks_run):
    """The checks of an inference read the kind of ``x``, ``hidden`` and ``cell`` (shape,
    strides, dtype with its byte order, flags, or missing) and nothing else: a kind that
    passed them once skips them after, with the answers of a layer that runs them; every
    other kind runs them, and what they refuse stays refused."""
    params = bf.LSTMParameters.random(input_size=3, hidden_size=4, seed=5, dtype=np.float32,
                                      batch_first=batch_first)
    with bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name)) as layer, \
            bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name)) as reference:
        x = rng.standard_normal((2, 3, 3) if batch_first else (3, 2, 3)).astype(np.float32)  # T 3, N 2
        h0 = rng.standard_normal((1, 2, 4)).astype(np.float32)
        one = rng.standard_normal((3, 3)).astype(np.float32)
        calls = [
            ((x,), {}),
            ((x, h0), {}),
            ((x, None, h0), {}),
            ((one,), {}),                                        # unbatched (T, I)
            ((one, h0[:, 0], h0[:, 0]), {}),
            ((np.asfortranarray(x),), {}),
            ((x[:, :, ::-1],), {}),                              # strided
        ]
        readonly = x.copy()
        readonly.flags.writeable = False
        calls.append(((readonly,), {}))
        for args, kwargs in calls:
            for round_ in range(3):
                before = len(checks_run)
                got = layer.apply(*args, **kwargs)
                assert len(checks_run) == before + (round_ == 0), "a known kind skips the checks"
                want = reference.apply(*[None if a is None else a.copy() for a in args])
                for name in ("output", "hidden", "cell"):
                    assert getattr(got, name).shape == getattr(want, name).shape
                    _close(getattr(got, name), getattr(want, name))
        assert 0 < len(layer._checked) <= CheckedKinds.LIMIT
        refused = [
            ((x.astype(">f4"),), bf.DTypeError),                 # same shape and strides, other byte order
            ((x.astype(np.float64),), bf.DTypeError),
            ((x[:, :, :2],), bf.ShapeError),
            ((x[:0],), bf.ShapeError),
            ((one.astype(">f4"),), bf.DTypeError),
            ((x, h0.astype(">f4")), bf.DTypeError),
            ((x, h0[:, :1]), bf.ShapeError),
            ((x, None, h0.astype(np.float16)), bf.DTypeError),
        ]
        for args, error in refused:
            with pytest.raises(error):
                layer.apply(*args)
        before = len(checks_run)
        listed = x.tolist()                                      # not an array: checked at every call
        for _ in range(2):
            with pytest.raises(bf.DTypeError):                    # (a float64 array to NumPy)
                layer.apply(listed)
        assert len(checks_run) == before + 2


def test_the_checked_kinds_are_bounded_and_forgotten_with_the_weights(rng, checks_run):
    with _layer("numpy") as layer:
        for steps in range(1, CheckedKinds.LIMIT + 4):
            layer(rng.standard_normal((steps, 1, 3)))
        assert len(layer._checked) == CheckedKinds.LIMIT
        x = rng.standard_normal((2, 2, 3))
        layer(x)
        layer.load_state_dict(layer.state_dict())                 # the layer wrote its weights
        assert len(layer._checked) == 0
        before = len(checks_run)
        layer(x)                                                 # checked again
        assert len(checks_run) == before + 1 and len(layer._checked) == 1
        layer.parameters()["layer0.forward.input_gate.bias"][...] += 1.0   # in place, handed out
        got = layer(x).output                                    # the call that notices: forgotten
        assert len(layer._checked) == 0
        layer(x)
        layer(x)
        assert len(checks_run) == before + 2 and len(layer._checked) == 1
        for training in (True, np.True_):                        # training calls are checked each time
            layer(x, training=training)
        layer(x, sequence_lengths=[2, 1])
        assert len(checks_run) == before + 5
        with bf.LSTMLayer(layer.layer_parameters, bf.FilterParameters(backend="numpy")) as fresh:
            _close(got, fresh(x).output)
    with pytest.raises(bf.FilterClosedError):
        layer(x)


def test_a_stream_steps_with_the_forward_prepared_for_its_kind_of_step(backend_name, rng):
    inner = bf.backends.get_backend(backend_name)
    with _layer(Counting(inner), num_layers=2) as layer, \
            _layer(Counting(inner, prepare=False), num_layers=2) as plain:
        stream, reference = layer.stream(batch_size=2), plain.stream(batch_size=2)
        out = np.empty((4, 2)).T                                     # another kind: a strided out
        for step in range(3):
            x = rng.standard_normal((2, 3))
            _close(stream.step(x), reference.step(x))
            _close(stream.step(x, out=out), reference.step(x, out=out.copy()))
        assert layer.backend.prepared == 2
        layer.parameters()["layer1.forward.input_gate.bias"][...] += 1.0
        stream.reset()
        reference.reset()  # its layer's weights did not change: nothing new for it
        stream.step(x)
        assert layer.backend.prepared == 2
        stream.step(x)
        assert layer.backend.prepared == 3


def test_the_forward_weight_arguments_follow_the_weights(backend_name, rng):
    """What a backend keeps per packing for its forwards (the compiled forward's arguments
    taken from the weights, kept for a few kinds) is new with each packing: a bias changed in
    place, through the handed-out arrays, or by load_state_dict, is what the next call reads;
    with many batch sizes at most a few kinds are kept."""
    with _layer(backend_name, dtype=np.float32, peepholes="diagonal") as layer:  # numba's compiled dtype
        x = rng.standard_normal((2, 3, 3)).astype(np.float32)
        for _ in range(2):
            layer(x)
        named = layer.parameters()
        named["layer0.forward.input_gate.bias"][...] += 0.5          # in place, handed out
        named["layer0.forward.input_gate.cell_weights"][...] *= -1.0  # the peepholes too
        got = layer(x).output
        with bf.LSTMLayer(layer.layer_parameters, bf.FilterParameters(backend="numpy")) as fresh:
            _close(got, fresh(x).output)
        state = layer.state_dict()
        state["layer0.forward.forget_gate.bias"] = state["layer0.forward.forget_gate.bias"] - 1.0
        layer.load_state_dict(state)
        got = layer(x).output
        with bf.LSTMLayer(layer.layer_parameters, bf.FilterParameters(backend="numpy")) as fresh:
            _close(got, fresh(x).output)
        for batch in range(1, 13):
            xb = rng.standard_normal((1, batch, 3)).astype(np.float32)
            _close(layer(xb).output, layer(xb.copy()).output)
        kept = layer._packed_weights().payload.weights[0][0].forward_args
        if backend_name == "numba":
            from bnnsfw.backends.numba._lstm import FORWARD_WEIGHTS_KEPT
            assert kept is not None and 0 < len(kept) <= FORWARD_WEIGHTS_KEPT
        else:
            assert kept is None


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("peepholes", [None, "diagonal", "full"])
def test_a_one_direction_inference_prepared_agrees(backend_name, peepholes, num_layers, rng, direct_calls):
    """One direction in inference, the kind a backend may run without its stack's layers of
    calls (``numba`` does, its scratch views kept while the workspace's buffer stays): one
    layer and three, float32, several batch sizes in turn, with both states, the hidden one
    only or none, a batch-first layer, against the ``numpy`` backend's unprepared forward."""
    params = bf.LSTMParameters.random(input_size=3, hidden_size=4, num_layers=num_layers, seed=5,
                                      dtype=np.float32, peepholes=peepholes, batch_first=True)
    with bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name)) as layer, \
            bf.LSTMLayer(params, bf.FilterParameters(backend=Counting(bf.backends.get_backend("numpy"),
                                                                      prepare=False))) as plain:
        # a larger batch between two of a smaller one grows the scratch the prepared calls
        # share: the smaller one's call then finds its scratch somewhere else
        for batch, states in ((3, 0), (3, 2), (7, 2), (3, 2), (12, 0), (3, 0), (3, 1)):
            h0, c0 = (rng.standard_normal((num_layers, batch, 4)).astype(np.float32) if states > k else None
                      for k in range(2))
            for _ in range(3):  # the second call prepares the forward, the third reuses it
                x = rng.standard_normal((batch, 2, 3)).astype(np.float32)
                got, want = layer(x, h0, c0), plain(x, h0, c0)
                for name in ("output", "hidden", "cell"):
                    _close(getattr(got, name), getattr(want, name))
    # on numba its direct inference ran the second and third call of the five kinds, and every
    # call of the two kinds that came back
    assert direct_calls is None or direct_calls == [num_layers] * (5 * 2 + 2 * 3)


@pytest.mark.parametrize("num_layers", [1, 3])
def test_a_one_sequence_inference_takes_the_states_where_they_lie(backend_name, num_layers, rng, monkeypatch):
    """One sequence through one direction in inference: ``numba``'s direct inference reads and
    writes contiguous states where the caller's arrays hold them (one sequence's ``(L, 1, H)``
    lies as the kernels' ``(L, H, 1)``) and copies strided ones; an output of a few KiB is
    written to scratch and copied out, a larger one written in place. Every case agrees with
    the ``numpy`` backend's unprepared forward, and the caller's states are left as they were."""
    seen: list[tuple[np.ndarray, ...]] = []
    if backend_name == "numba":
        from bnnsfw.backends.numba import _lstm

        forward = _lstm._forward_one  # one sequence's kernel

        def spy(*args):
            seen.append(args[8:10] + args[13:16])  # h0, c0, output, h_fin, c_fin
            return forward(*args)

        monkeypatch.setattr(_lstm, "_forward_one", spy)
    params = bf.LSTMParameters.random(input_size=3, hidden_size=4, num_layers=num_layers, seed=6,
                                      dtype=np.float32, peepholes="diagonal")
    with bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name)) as layer, \
            bf.LSTMLayer(params, bf.FilterParameters(backend=Counting(bf.backends.get_backend("numpy"),
                                                                      prepare=False))) as plain:
        wide = rng.standard_normal((num_layers, 1, 8)).astype(np.float32)
        # (T, N, strided states): a small output and a large one (1 100 steps of 4 float32 units)
        for seq_len, strided in ((2, False), (2, True), (1100, False), (1100, True)):
            h0, c0 = (w[:, :, ::2] if strided else w[:, :, :4].copy() for w in (wide, wide + np.float32(0.5)))
            given = (h0.copy(), c0.copy())
            for _ in range(3):  # the second call prepares the forward, the third reuses it
                x = rng.standard_normal((seq_len, 1, 3)).astype(np.float32)
                seen.clear()
                got, want = layer(x, h0, c0), plain(x, h0, c0)
                for name in ("output", "hidden", "cell"):
                    _close(getattr(got, name), getattr(want, name))
                np.testing.assert_array_equal(h0, given[0])
                np.testing.assert_array_equal(c0, given[1])
            if backend_name == "numba":  # the third call's kernels, one per layer
                assert len(seen) == num_layers
                top = seen[-1][2][0]
                assert np.shares_memory(top, got.output) == (seq_len == 1100)
                for k, (h_in, c_in, _, h_fin, c_fin) in enumerate(seen):
                    assert np.shares_memory(h_in, h0) == (not strided)
                    assert np.shares_memory(c_in, c0) == (not strided)
                    assert np.shares_memory(h_fin, got.hidden[k]) and np.shares_memory(c_fin, got.cell[k])


def test_numba_prepares_its_direct_inference_itself_for_a_kind_that_runs_compiled(rng, monkeypatch):
    """A kind that runs compiled when it is prepared (``wait`` mode here), with writable
    inputs, gets :class:`StackInference` itself; a read-only ``x`` (copied first) gets the
    tiered forward; both answer as the reference does."""
    from bnnsfw.backends._shared import compiling
    from bnnsfw.backends.numba import _TieredForward
    from bnnsfw.backends.numba._lstm import StackInference

    monkeypatch.setattr(compiling, "_mode", "wait")
    with _layer("numba", dtype=np.float32) as layer, _layer("numpy", dtype=np.float32) as reference:
        x = rng.standard_normal((2, 1, 3)).astype(np.float32)
        readonly = x.copy()
        readonly.flags.writeable = False
        for _ in range(3):
            for given in (x, readonly):
                _close(layer(given).output, reference(x).output)
        assert sorted(type(call).__name__ for call in layer._prepared._calls.values()) == \
            sorted([StackInference.__name__, _TieredForward.__name__])

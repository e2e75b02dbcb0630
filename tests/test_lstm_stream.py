"""Streaming (``LSTMLayer.stream``): stepping through a sequence equals one ``apply`` over it.

On every registered backend: stacked layers and each variant that reads forward in time,
unbatched streams, ``out=`` without allocation, the states as copies, ``reset`` of all or some
rows, the weights taken at ``stream()`` and ``reset()`` only, and every refusal.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.backends.contract import OPERATIONS, TOLERANCE
from bnnsfw.layers.lstm import LSTMActivations, LSTMParameters

F32 = np.dtype(np.float32)
RTOL, ATOL = TOLERANCE[F32]

VARIANTS = {
    "stacked": dict(num_layers=3),
    "diagonal_peepholes": dict(num_layers=2, peepholes="diagonal"),
    "full_peepholes": dict(peepholes="full"),
    "projection": dict(num_layers=2, projection_size=3),
    "layer_norm": dict(num_layers=2, layer_norm=True),
    "clip": dict(clip=0.3),
    "cell_and_projection_clip": dict(cell_clip=0.2, projection_size=3, projection_clip=0.1),
    "input_forget": dict(input_forget=True),
    "activations": dict(clip=5.0, direction_activations=LSTMActivations.onnx(
        ["HardSigmoid", "LeakyRelu", "Softsign"], activation_alpha=[0.25, 0.1], activation_beta=[0.45])),
    "batch_first": dict(num_layers=2, batch_first=True),
}


#: The variants whose steps ``numba`` runs without its stack's layers of calls once a step's
#: forward is prepared (an inference of one direction of BNNS's cell, whose steps stay on the
#: calling thread: ``_lstm.StackInference``).
DIRECT = {"stacked", "diagonal_peepholes", "full_peepholes", "batch_first"}


def _layer(backend_name, **options):
    params = LSTMParameters.random(input_size=3, hidden_size=5, seed=7, **options)
    return bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name))


def _sequence(rng, steps=6, batch=2, size=3):
    return rng.standard_normal((steps, batch, size)).astype(np.float32)


def _states(rng, layer, batch):
    p = layer.layer_parameters
    hidden = rng.standard_normal((p.num_layers, batch, p.output_size)).astype(np.float32)
    cell = rng.standard_normal((p.num_layers, batch, p.hidden_size)).astype(np.float32)
    return hidden, cell


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def _apply(layer, x_tm, **states):
    """``apply`` over a time-major sequence whatever the layer's layout; output time-major."""
    batch_first = layer.layer_parameters.batch_first
    out = layer.apply(x_tm.transpose(1, 0, 2) if batch_first else x_tm, **states)
    return (out.output.transpose(1, 0, 2) if batch_first else out.output), out.hidden, out.cell


# ------------------------------------------------------------------------------------------
# Stepping equals apply.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_stepping_equals_one_apply(backend_name, variant, rng, direct_calls):
    """On ``numba`` the steps of the variants in DIRECT after the first run its direct inference
    (the first step goes through ``lstm_forward``, the second prepares the forward)."""
    with _layer(backend_name, **VARIANTS[variant]) as layer:
        x = _sequence(rng)
        hidden, cell = _states(rng, layer, 2)
        output, final_h, final_c = _apply(layer, x, hidden=hidden, cell=cell)
        stream = layer.stream(batch_size=2, hidden=hidden, cell=cell)
        steps = np.stack([stream.step(x[t]) for t in range(len(x))])
        _close(steps, output)
        _close(stream.hidden, final_h)
        _close(stream.cell, final_c)
        if direct_calls is not None:
            num_layers = layer.layer_parameters.num_layers
            assert direct_calls == ([num_layers] * (len(x) - 1) if variant in DIRECT else [])


def test_stepping_from_zero_states(backend_name, rng, direct_calls):
    with _layer(backend_name, num_layers=2) as layer:
        x = _sequence(rng)
        output, final_h, final_c = _apply(layer, x)
        stream = layer.stream(batch_size=2)
        _close(np.stack([stream.step(x[t]) for t in range(len(x))]), output)
        _close(stream.cell, final_c)
        assert direct_calls is None or direct_calls == [2] * (len(x) - 1)


def test_float64_layers_stream_within_their_tolerance(backend_name, rng):
    params = LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, peepholes="diagonal", seed=2,
                                   dtype=np.float64)
    with bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name)) as layer:
        x = rng.standard_normal((6, 2, 3))
        expected = layer.apply(x)
        stream = layer.stream(batch_size=2)
        steps = np.stack([stream.step(x[t]) for t in range(6)])
        rtol, atol = TOLERANCE[np.dtype(np.float64)]
        np.testing.assert_allclose(steps, expected.output, rtol=rtol, atol=atol)
        np.testing.assert_allclose(stream.cell, expected.cell, rtol=rtol, atol=atol)
        with pytest.raises(bf.DTypeError, match=r"LSTMStream.step\(x\) must be a float64 array"):
            stream.step(x[0].astype(np.float32))


def test_unbatched_stream_steps_as_apply_on_an_unbatched_sequence(backend_name, rng):
    with _layer(backend_name, num_layers=2, projection_size=4) as layer:
        x = _sequence(rng, batch=1)[:, 0]                       # (T, I)
        hidden, cell = (s[:, 0] for s in _states(rng, layer, 1))
        expected = layer.apply(x, hidden=hidden, cell=cell)
        stream = layer.stream(hidden=hidden, cell=cell)
        assert stream.batch_size is None
        steps = np.stack([stream.step(x[t]) for t in range(len(x))])
        assert steps.shape == (6, 4)
        _close(steps, expected.output)
        assert stream.hidden.shape == (2, 4) and stream.cell.shape == (2, 5)
        _close(stream.hidden, expected.hidden)
        _close(stream.cell, expected.cell)
        stream.reset()
        out = np.empty(4, np.float32)
        for t in range(len(x)):
            assert stream.step(x[t], out=out) is out
        _close(out, expected.output[-1])
        stream.hidden = hidden                                   # unbatched states set as (L, P)
        _close(stream.hidden, hidden)
        with pytest.raises(bf.ShapeError, match=r"LSTMStream.step\(x\) must be of shape \(I,\) = \(3,\)"):
            stream.step(x[:1])


# ------------------------------------------------------------------------------------------
# out=: written, returned, and no allocation by the stepper.
# ------------------------------------------------------------------------------------------
class _Measured:
    """A backend that runs another one and leaves its calls out of tracemalloc's peak.

    The peak outside the backend's calls is what the stepper itself allocates (the backend's
    own kernels may use temporaries: they are not the stepper's).
    """

    name = "measured"

    def __init__(self, inner):
        self.inner = inner
        self.peak_outside = 0
        for operation in OPERATIONS:
            if operation != "lstm_forward":
                setattr(self, operation, getattr(inner, operation))

    def lstm_forward(self, request):
        self.peak_outside = max(self.peak_outside, tracemalloc.get_traced_memory()[1])
        result = self.inner.lstm_forward(request)
        tracemalloc.reset_peak()
        return result


def _peak_of_steps(stream, measured, x, out, steps=5):
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        measured.peak_outside = 0
        for _ in range(steps):
            stream.step(x, out=out)
        return max(measured.peak_outside, tracemalloc.get_traced_memory()[1]) - base
    finally:
        tracemalloc.stop()


def test_out_is_written_and_the_step_allocates_no_array(backend_name, rng):
    measured = _Measured(bf.backends.get_backend(backend_name))
    batch, hidden = 64, 256                                     # output and states: 64 KiB each
    params = LSTMParameters.random(input_size=8, hidden_size=hidden, num_layers=2, seed=1)
    with bf.LSTMLayer(params, bf.FilterParameters(backend=measured)) as layer:
        stream = layer.stream(batch_size=batch)
        x = rng.standard_normal((batch, 8)).astype(np.float32)
        out = np.empty((batch, hidden), np.float32)
        for _ in range(2):                                      # the backend's first-call work
            assert stream.step(x, out=out) is out
        allocated = _peak_of_steps(stream, measured, x, out)
        assert allocated < 8192, f"a step with out= allocated {allocated} bytes"
        allocated = _peak_of_steps(stream, measured, x, None)  # without out: a new output each step
        assert allocated >= out.nbytes


@pytest.mark.parametrize("backend_name", ["numba"])
def test_a_direct_step_allocates_no_array_around_its_kernels(backend_name, rng, direct_calls, monkeypatch):
    """``numba``'s direct inference (two layers whose steps stay on the calling thread; output
    7.75 KiB, states 15.5 KiB each) keeps its scratch in the stream's workspace: a step with
    out= allocates no array, the backend's code around its kernels included. The kernels'
    own temporaries (freed as each returns) are left out, as the test above leaves out the
    backend's: the kernel is replaced by a no-op once the steps have run it."""
    from bnnsfw.backends.numba import _lstm

    batch, hidden = 31, 64
    params = LSTMParameters.random(input_size=8, hidden_size=hidden, num_layers=2, seed=1)
    with bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name)) as layer:
        stream = layer.stream(batch_size=batch)
        x = rng.standard_normal((batch, 8)).astype(np.float32)
        out = np.empty((batch, hidden), np.float32)
        for _ in range(3):                                      # the second step prepares the forward
            stream.step(x, out=out)
        monkeypatch.setattr(_lstm, "_forward", lambda *arguments: None)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for _ in range(5):
                stream.step(x, out=out)
            allocated = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert allocated < 8192, f"a step with out= allocated {allocated} bytes"
    assert direct_calls == [2] * 7


def test_out_of_any_strides_and_overlapping_x(backend_name, rng):
    with _layer(backend_name, num_layers=2) as layer:
        x = _sequence(rng)
        output, _, _ = _apply(layer, x)
        stream = layer.stream(batch_size=2)
        wide = np.full((2, 11), np.nan, np.float32)
        for t in range(3):
            assert stream.step(x[t], out=wide[:, 1:11:2]) is not None
            _close(wide[:, 1:11:2], output[t])
            assert np.isnan(wide[:, 0::2]).all()                # nothing written beside it
        shared = np.zeros((2, 5), np.float32)                    # x in the first three columns
        for t in range(3, 6):
            shared[:, :3] = x[t]
            stream.step(shared[:, :3], out=shared)
            _close(shared, output[t])


# ------------------------------------------------------------------------------------------
# States and reset.
# ------------------------------------------------------------------------------------------
def test_hidden_and_cell_are_copies_and_settable(backend_name, rng):
    with _layer(backend_name, num_layers=2, projection_size=4) as layer:
        x = _sequence(rng)
        stream = layer.stream(batch_size=2)
        stream.step(x[0])
        got = stream.hidden
        got[:] = 100.0
        assert not np.array_equal(stream.hidden, got)
        stream.cell[:] = 100.0
        assert np.abs(stream.cell).max() < 100.0
        hidden, cell = _states(rng, layer, 2)
        expected, final_h, final_c = _apply(layer, x[1:], hidden=hidden, cell=cell)
        stream.hidden, stream.cell = hidden, cell
        hidden[:] = 0.0                                          # the stream holds a copy
        _close(np.stack([stream.step(x[t]) for t in range(1, 6)]), expected)
        _close(stream.hidden, final_h)
        _close(stream.cell, final_c)
        with pytest.raises(bf.ShapeError, match=r"LSTMStream.hidden must be of shape \(L·D, N, P\)"):
            stream.hidden = np.zeros((2, 2, 5), np.float32)
        with pytest.raises(bf.DTypeError, match=r"LSTMStream.cell must be a float32 array"):
            stream.cell = np.zeros((2, 2, 5))
        with pytest.raises(bf.InvalidParameterError, match=r"LSTMStream.cell must be an array"):
            stream.cell = None


def test_reset_returns_every_row_to_the_initial_states(backend_name, rng):
    with _layer(backend_name, num_layers=2) as layer:
        x = _sequence(rng)
        hidden, cell = _states(rng, layer, 2)
        output, _, final_c = _apply(layer, x, hidden=hidden, cell=cell)
        stream = layer.stream(batch_size=2, hidden=hidden, cell=cell)
        hidden[:] = 0.0                                          # the stream keeps its own copy
        for t in range(4):
            stream.step(x[t])
        stream.reset()
        _close(np.stack([stream.step(x[t]) for t in range(6)]), output)
        _close(stream.cell, final_c)


@pytest.mark.parametrize("rows", [[1], 1, np.array([False, True, False]), (1, 2)])
def test_reset_of_some_rows_restarts_those_streams_only(backend_name, rng, rows):
    with _layer(backend_name, num_layers=2) as layer:
        x = _sequence(rng, steps=8, batch=3)
        whole, _, _ = _apply(layer, x)
        stream = layer.stream(batch_size=3)
        for t in range(3):
            stream.step(x[t])
        restarted = np.zeros(3, bool)
        restarted[np.asarray(rows)] = True
        stream.reset(rows=rows)
        again, _, _ = _apply(layer, x[3:])                        # the reset rows start from zeros at t = 3
        steps = np.stack([stream.step(x[t]) for t in range(3, 8)])
        _close(steps[:, ~restarted], whole[3:, ~restarted])
        _close(steps[:, restarted], again[:, restarted])


def test_reset_refuses_bad_rows(backend_name):
    with _layer(backend_name) as layer:
        stream = layer.stream(batch_size=3)
        for rows in (3, [-1], [0.5], True, [[0, 1]]):
            with pytest.raises(bf.InvalidParameterError, match=r"reset\(rows\) must be row numbers"):
                stream.reset(rows=rows)
        with pytest.raises(bf.ShapeError, match=r"LSTMStream.reset\(rows\) must be of shape \(3,\)"):
            stream.reset(rows=[True, False])
        stream.reset(rows=[])                                    # no row: nothing to do
        with pytest.raises(bf.InvalidParameterError, match="None for an unbatched stream"):
            layer.stream().reset(rows=[0])


# ------------------------------------------------------------------------------------------
# Weights: taken at stream() and reset(), not in between.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["parameters", "load_state_dict", "client_pointer"])
def test_weight_changes_reach_the_stream_at_reset_only(backend_name, rng, how):
    params = LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, seed=3)
    client = how == "client_pointer"
    layer = bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name, use_client_pointer=client))
    x = _sequence(rng)
    old, _, _ = _apply(layer, x)
    stream = layer.stream(batch_size=2)
    stream.step(x[0])
    if how == "parameters":
        for array in layer.parameters().values():
            array *= 0.5
    elif how == "load_state_dict":
        layer.load_state_dict({name: 0.5 * a for name, a in layer.state_dict().items()})
    else:
        for gate in params.gates:
            gate.hidden_weights[...] *= 0.5
    new, _, _ = _apply(layer, x)
    assert np.abs(new - old).max() > 10 * ATOL
    _close(np.stack([stream.step(x[t]) for t in range(1, 6)]), old[1:])    # the weights of stream()
    stream.reset()
    _close(np.stack([stream.step(x[t]) for t in range(6)]), new)           # taken again by reset()
    fresh = layer.stream(batch_size=2)
    _close(np.stack([fresh.step(x[t]) for t in range(6)]), new)
    layer.close()


# ------------------------------------------------------------------------------------------
# Refusals.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options, kind", [(dict(bidirectional=True), "bidirectional"),
                                           (dict(reverse=True), "reverse")])
def test_a_direction_that_reads_backward_is_refused(backend_name, options, kind):
    with _layer(backend_name, **options) as layer:
        with pytest.raises(bf.InvalidParameterError, match=f"needs the whole sequence.*a {kind} layer"):
            layer.stream(batch_size=2)


def test_a_closed_layer_is_refused(backend_name, rng):
    layer = _layer(backend_name)
    stream = layer.stream(batch_size=2)
    layer.close()
    with pytest.raises(bf.FilterClosedError, match=r"LSTMLayer.stream\(\) was called after close"):
        layer.stream(batch_size=2)
    x = _sequence(rng)[0]
    with pytest.raises(bf.FilterClosedError, match=r"LSTMLayer.stream\(\).step\(\) was called after close"):
        stream.step(x)
    with pytest.raises(bf.FilterClosedError, match=r"stream\(\).reset\(\) was called after close"):
        stream.reset()
    with pytest.raises(bf.FilterClosedError, match=r"stream\(\).hidden\(\) was called after close"):
        stream.hidden


def test_bad_arguments_are_refused_naming_them(backend_name):
    with _layer(backend_name, num_layers=2) as layer:
        stream = layer.stream(batch_size=2)
        cases = [
            (bf.ShapeError, r"LSTMStream.step\(x\) must be of shape \(N, I\) = \(2, 3\)",
             dict(x=np.zeros((3, 3), np.float32))),
            (bf.ShapeError, r"LSTMStream.step\(x\) must be of shape",
             dict(x=np.zeros((1, 2, 3), np.float32))),
            (bf.DTypeError, r"LSTMStream.step\(x\) must be a float32 array", dict(x=np.zeros((2, 3)))),
            (bf.DTypeError, r"LSTMStream.step\(x\) must be a float32 array", dict(x=[[0.0] * 3] * 2)),
            (bf.ShapeError, r"LSTMStream.step\(out\) must be of shape \(2, 5\)",
             dict(x=np.zeros((2, 3), np.float32), out=np.zeros((2, 4), np.float32))),
            (bf.DTypeError, r"LSTMStream.step\(out\) must be a float32 array",
             dict(x=np.zeros((2, 3), np.float32), out=np.zeros((2, 5)))),
            (bf.InvalidParameterError, r"LSTMStream.step\(out\) must be a writable array",
             dict(x=np.zeros((2, 3), np.float32), out=np.zeros((2, 5), np.float32)[:, :].view())),
        ]
        cases[-1][2]["out"].flags.writeable = False
        before = stream.hidden
        for error, message, arguments in cases:
            with pytest.raises(error, match=message):
                stream.step(**arguments)
        np.testing.assert_array_equal(stream.hidden, before)    # a refused step changes nothing
        with pytest.raises(bf.InvalidParameterError, match=r"LSTMLayer.stream\(batch_size\) must be an int"):
            layer.stream(batch_size=0)
        with pytest.raises(bf.InvalidParameterError, match=r"LSTMLayer.stream\(batch_size\) must be an int"):
            layer.stream(batch_size=True)
        with pytest.raises(bf.ShapeError, match=r"LSTMLayer.stream\(hidden\) must be of shape"):
            layer.stream(batch_size=2, hidden=np.zeros((2, 3, 5), np.float32))
        with pytest.raises(bf.DTypeError, match=r"LSTMLayer.stream\(cell\) must be a float32 array"):
            layer.stream(batch_size=2, cell=np.zeros((2, 2, 5)))

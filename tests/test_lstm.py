"""LSTMLayer: agreement with a plain per-step LSTM, finite-difference gradients, the training
cache, and the errors. Every test runs on every registered backend."""

from __future__ import annotations

import functools
import inspect
import itertools

import attrs
import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.backends.contract import TOLERANCE
import lstm_reference as ref
from bnnsfw.layers.lstm import (
    LSTMGateDescriptor,
    LSTMGateGradients,
    LSTMGradients,
    LSTMLayer,
    LSTMOutput,
    LSTMParameters,
)
from gradcheck import assert_gradient_close, numerical_gradient

GATES = ("input_gate", "forget_gate", "candidate_gate", "output_gate")
A = bf.Activation


# ------------------------------------------------------------------------------------------
# Helpers.
# ------------------------------------------------------------------------------------------
def reference_activation(act):
    """The reference module's formula for a bnnsfw activation (None: the gate default)."""
    name = act.function.name
    simple = {"sigmoid": ref.sigmoid, "tanh": ref.tanh, "softsign": ref.softsign, "silu": ref.silu,
              "gelu": ref.gelu, "relu": ref.relu, "identity": ref.identity}
    if name in simple:
        return simple[name]
    if name == "scaled_tanh":
        return ref.make_scaled_tanh(act.alpha, act.beta)
    if name == "elu":
        return ref.make_elu(act.alpha)
    if name == "hard_sigmoid":
        assert (act.alpha, act.beta) == (0.2, 0.5)
        return ref.hard_sigmoid
    raise AssertionError(name)


def gate_arrays(params):
    return [dict(iw0=g.input_weights[0], iw1=g.input_weights[1], hw=g.hidden_weights, cw=g.cell_weights,
                 b=g.bias) for g in params.gates]


def run_reference(params, x, hidden=None, cell=None, lengths=None, dropout_scales=None):
    return ref.reference_lstm(
        x, gate_arrays(params), hidden_size=params.hidden_size, num_layers=params.num_layers,
        bidirectional=params.bidirectional, batch_first=params.batch_first,
        activations=tuple(reference_activation(a) for a in params.gate_activations),
        hidden_activation=reference_activation(params.cell_activation),
        hidden=hidden, cell=cell, lengths=lengths, dropout_scales=dropout_scales,
    )


def with_gates(params, **per_gate):
    """``params`` with gate fields replaced: ``with_gates(p, input_gate=dict(activation=...))``."""
    changes = {name: attrs.evolve(getattr(params, name), **fields) for name, fields in per_gate.items()}
    return attrs.evolve(params, **changes)


def mixed_peepholes(params, rng):
    """Input gate full, forget diagonal, candidate full, output diagonal."""
    size_l, size_d, h = params.num_layers, params.num_directions, params.hidden_size
    full = lambda: rng.uniform(-0.5, 0.5, (size_l, size_d, h, h))  # noqa: E731
    diag = lambda: rng.uniform(-0.5, 0.5, (size_l, size_d, h))  # noqa: E731
    return with_gates(params, input_gate=dict(cell_weights=full()), forget_gate=dict(cell_weights=diag()),
                      candidate_gate=dict(cell_weights=full()), output_gate=dict(cell_weights=diag()))


SMOOTH_ACTIVATIONS = dict(
    input_gate=dict(activation=A.softsign()),
    forget_gate=dict(activation=A.scaled_tanh(0.9, 1.3)),
    candidate_gate=dict(activation=A.silu()),
    output_gate=dict(activation=A.gelu()),
)


def shapes(params, seq_len, batch):
    p = params
    x = (batch, seq_len, p.input_size) if p.batch_first else (seq_len, batch, p.input_size)
    y = (batch, seq_len, p.num_directions * p.hidden_size) if p.batch_first else (
        seq_len, batch, p.num_directions * p.hidden_size)
    state = (p.num_layers * p.num_directions, batch, p.hidden_size)
    return x, y, state


def dropout_scales(params, seq_len, batch, seed):
    """The documented draw: for l = 1…L−1, u = rng.random((T, N, D·H)); keep where u >= p."""
    rng = np.random.default_rng(seed)
    width = params.num_directions * params.hidden_size
    scales = {}
    for layer in range(1, params.num_layers):
        u = rng.random((seq_len, batch, width), dtype=params.dtype)
        scales[layer] = (u >= params.dropout) / (1.0 - params.dropout)
    return scales


def _gate_gradients(grads) -> list[np.ndarray]:
    """Every weight gradient array of a backward result's gates, in a fixed order."""
    return [a for gate in grads.gates
            for a in (*gate.input_weights, gate.hidden_weights, gate.bias, gate.cell_weights)
            if a is not None]


def _assert_all_close(got: list[np.ndarray], want: list[np.ndarray], dtype) -> None:
    """Pairwise agreement within the contract's tolerance for ``dtype``, naming the array."""
    rtol, atol = TOLERANCE[np.dtype(dtype)]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"array {k}")


def _record_calls(monkeypatch, names, note=None) -> list:
    """Wrap each of ``_numba_lstm``'s functions ``names`` so that every call first appends
    ``note(name, function, args)`` (the name without ``note``) to the list returned."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    calls: list = []
    for name in names:
        original = getattr(_numba_lstm, name)

        def spy(*args, _original=original, _name=name):
            calls.append(_name if note is None else note(_name, _original, args))
            return _original(*args)

        monkeypatch.setattr(_numba_lstm, name, spy)
    return calls


def layer_for(params, backend_name, **options):
    return LSTMLayer(params, bf.FilterParameters(backend=backend_name, **options))


def _forward_and_backward(layer, x, dy) -> list[np.ndarray]:
    """An inference output, a training forward's output, and the input and weight gradients of
    the backward from its cache."""
    inferred = layer.apply(x).output
    out = layer.apply(x, training=True)
    grads = layer.apply_backward(x, dy, training_cache=out.training_cache)
    return [inferred, out.output, grads.input] + _gate_gradients(grads)


# ------------------------------------------------------------------------------------------
# Forward agrees with the plain reference.
# ------------------------------------------------------------------------------------------
REFERENCE_CASES = {
    "one_layer": dict(num_layers=1),
    "stacked_bidirectional_lengths": dict(num_layers=2, bidirectional=True, lengths=True),
    "three_layers_full_peepholes_states": dict(num_layers=3, peepholes="full", states=True),
    "diagonal_peepholes_batch_first_lengths": dict(num_layers=2, bidirectional=True, peepholes="diagonal",
                                                   batch_first=True, lengths=True, states=True),
    "mixed_peepholes_no_bias": dict(num_layers=2, bidirectional=True, mixed=True, bias=False, states=True),
    "odd_activations_lengths": dict(num_layers=2, bidirectional=True, lengths=True, odd=True, states=True),
    "default_activations_flag": dict(num_layers=1, bidirectional=True, odd=True, default_activations=True),
}


@pytest.mark.parametrize("case", sorted(REFERENCE_CASES))
def test_forward_matches_plain_reference(backend_name, case):
    spec = REFERENCE_CASES[case]
    rng = np.random.default_rng(sorted(REFERENCE_CASES).index(case))
    size_i, h = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    seq_len, batch = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    params = LSTMParameters.random(
        input_size=size_i, hidden_size=h, num_layers=spec["num_layers"],
        bidirectional=spec.get("bidirectional", False), peepholes=spec.get("peepholes"),
        bias=spec.get("bias", True), seed=int(rng.integers(1000)), dtype=np.float64,
        batch_first=spec.get("batch_first", False),
        default_activations=spec.get("default_activations", False))
    if spec.get("mixed"):
        params = mixed_peepholes(params, rng)
    if spec.get("odd"):
        params = with_gates(params, input_gate=dict(activation=A.hard_sigmoid()),
                            forget_gate=dict(activation=A.elu(0.7)), candidate_gate=dict(activation=A.relu()),
                            output_gate=dict(activation=A.identity()))
        params = attrs.evolve(params, hidden_activation=A.softsign())
    x_shape, _, state_shape = shapes(params, seq_len, batch)
    x = rng.standard_normal(x_shape)
    hidden = rng.standard_normal(state_shape) if spec.get("states") else None
    cell = rng.standard_normal(state_shape) if spec.get("states") else None
    lengths = rng.integers(1, seq_len + 1, batch) if spec.get("lengths") else None
    with layer_for(params, backend_name) as layer:
        out = layer.apply(x, hidden, cell, sequence_lengths=lengths)
    want = run_reference(params, x, hidden, cell, lengths)
    for got, expected, name in zip((out.output, out.hidden, out.cell), want, ("output", "hidden", "cell")):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10, err_msg=name)


def test_forward_matches_reference_on_random_configurations(backend_name):
    rng = np.random.default_rng(7)
    for trial in range(12):
        num_layers = int(rng.integers(1, 4))
        params = LSTMParameters.random(
            input_size=int(rng.integers(1, 5)), hidden_size=int(rng.integers(1, 5)), num_layers=num_layers,
            bidirectional=bool(rng.integers(2)), peepholes=[None, "full", "diagonal"][int(rng.integers(3))],
            bias=bool(rng.integers(2)), seed=trial, dtype=np.float64, batch_first=bool(rng.integers(2)))
        seq_len, batch = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        x_shape, _, state_shape = shapes(params, seq_len, batch)
        x = rng.standard_normal(x_shape)
        states = rng.standard_normal((2, *state_shape)) if rng.integers(2) else (None, None)
        lengths = rng.integers(1, seq_len + 1, batch) if rng.integers(2) else None
        with layer_for(params, backend_name) as layer:
            out = layer.apply(x, *states, sequence_lengths=lengths, training=bool(rng.integers(2)))
        want = run_reference(params, x, *states, lengths=lengths)
        for got, expected in zip((out.output, out.hidden, out.cell), want):
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10, err_msg=f"trial {trial}")


def test_float32_agrees_with_float64(backend_name, rng):
    p64 = LSTMParameters.random(input_size=5, hidden_size=6, num_layers=2, bidirectional=True, seed=3,
                                dtype=np.float64)
    p32 = attrs.evolve(p64, dtype=np.float32)
    assert p32.input_gate.hidden_weights.dtype == np.float32
    x = rng.standard_normal((7, 3, 5))
    with layer_for(p64, backend_name) as l64, layer_for(p32, backend_name) as l32:
        o64 = l64.apply(x)
        o32 = l32.apply(x.astype(np.float32), training=True)
        g32 = l32.apply_backward(x.astype(np.float32), np.ones_like(o32.output),
                                 training_cache=o32.training_cache)
        g64 = l64.apply_backward(x, np.ones_like(o64.output))
    assert o32.output.dtype == np.float32 and g32.forget_gate.hidden_weights.dtype == np.float32
    np.testing.assert_allclose(o32.output, o64.output, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g32.input, g64.input, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(g32.output_gate.input_weights[1], g64.output_gate.input_weights[1], rtol=1e-3,
                               atol=1e-4)


def test_variable_lengths_semantics(backend_name, rng):
    """Zero outputs past the end, final states at each sequence's end, and the reverse
    direction starting at the last valid step: each sequence run alone, truncated."""
    params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2, bidirectional=True, seed=5,
                                   dtype=np.float64)
    x = rng.standard_normal((6, 3, 3))
    lengths = [6, 2, 4]
    padded = x.copy()
    padded[2:, 1] = np.nan  # whatever lies past the end is ignored, even NaN
    padded[4:, 2] = 1e30
    with layer_for(params, backend_name) as layer:
        out = layer.apply(padded, sequence_lengths=lengths, training=True)
        grads = layer.apply_backward(padded, np.ones_like(out.output), sequence_lengths=lengths,
                                     training_cache=out.training_cache)
        for n, length in enumerate(lengths):
            alone = layer.apply(x[:length, n:n + 1])
            np.testing.assert_allclose(out.output[:length, n:n + 1], alone.output, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(out.output[length:, n], 0.0)
            np.testing.assert_allclose(out.hidden[:, n:n + 1], alone.hidden, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(out.cell[:, n:n + 1], alone.cell, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(grads.input[length:, n], 0.0)
    assert np.isfinite(grads.input).all() and np.isfinite(grads.forget_gate.hidden_weights).all()


def test_lengths_all_full_equal_no_lengths(backend_name, rng):
    params = LSTMParameters.random(input_size=2, hidden_size=3, bidirectional=True, seed=1, dtype=np.float64)
    x = rng.standard_normal((4, 2, 2))
    with layer_for(params, backend_name) as layer:
        a = layer.apply(x, sequence_lengths=np.array([4, 4], dtype=np.int32), training=True)
        b = layer.apply(x, training=True)
        np.testing.assert_array_equal(a.output, b.output)  # full lengths are no lengths: one code path
        np.testing.assert_array_equal(a.hidden, b.hidden)
        # inference runs other loops (no cache rows): equal within the stated tolerance, not bitwise
        _assert_all_close([layer.apply(x).output], [a.output], np.float64)
        # a cache written with full lengths serves a backward without lengths
        layer.apply_backward(x, None, hidden_gradient=np.ones((2, 2, 3)), training_cache=a.training_cache)


def test_default_activations_ignore_the_gate_activations(backend_name, rng):
    plain = LSTMParameters.random(input_size=3, hidden_size=3, seed=2, dtype=np.float64)
    odd = with_gates(plain, **SMOOTH_ACTIVATIONS)
    odd = attrs.evolve(odd, hidden_activation=A.relu(), default_activations=True)
    explicit = with_gates(plain, input_gate=dict(activation=A.sigmoid()),
                          candidate_gate=dict(activation=A.tanh()))
    x = rng.standard_normal((3, 2, 3))
    with layer_for(plain, backend_name) as a, layer_for(odd, backend_name) as b, \
            layer_for(explicit, backend_name) as c:
        np.testing.assert_array_equal(a.apply(x).output, b.apply(x).output)
        np.testing.assert_array_equal(a.apply(x).output, c.apply(x).output)
    assert odd.gate_activations[2] == A.tanh() and odd.cell_activation == A.tanh()


# ------------------------------------------------------------------------------------------
# Backward agrees with finite differences (float64).
# ------------------------------------------------------------------------------------------
GRADIENT_CASES = {
    "one_layer": dict(num_layers=1),
    "two_layers_bidirectional": dict(num_layers=2, bidirectional=True),
    "full_peepholes": dict(num_layers=1, bidirectional=True, peepholes="full"),
    "diagonal_peepholes": dict(num_layers=2, peepholes="diagonal"),
    "mixed_peepholes_candidate_too": dict(num_layers=1, mixed=True),
    "one_gate_peephole": dict(num_layers=1, bidirectional=True, forget_peephole_only=True),
    "gate_and_hidden_activations": dict(num_layers=2, smooth=True, peepholes="full"),
    "other_activations_lengths": dict(num_layers=2, bidirectional=True, smooth=True, peepholes="diagonal",
                                      lengths=[3, 0, 2]),
    "batch_first": dict(num_layers=2, bidirectional=True, batch_first=True),
    "final_state_gradients_only": dict(num_layers=2, bidirectional=True, no_output_gradient=True),
    "variable_lengths_bidirectional_stack": dict(num_layers=2, bidirectional=True, lengths=[3, 1, 2]),
    "dropout_with_cache": dict(num_layers=3, bidirectional=True, dropout=0.4),
    "three_layers_lengths": dict(num_layers=3, lengths=[3, 1, 2]),  # two layers together, then one
    "dropout_between_layers": dict(num_layers=2, dropout=0.4),
    # Size-one axes (NumPy leaves the stride of a length-1 axis free; BLAS needs it).
    "input_size_one": dict(num_layers=2, bidirectional=True, input_size=1),
    "hidden_size_one": dict(num_layers=2, hidden_size=1, peepholes="diagonal"),
    "one_sequence_one_step": dict(num_layers=2, bidirectional=True, batch=1, seq_len=1),
}


def gradient_params(spec, rng):
    params = LSTMParameters.random(
        input_size=spec.get("input_size", 3), hidden_size=spec.get("hidden_size", 2),
        num_layers=spec["num_layers"],
        bidirectional=spec.get("bidirectional", False), peepholes=spec.get("peepholes"), seed=11,
        dtype=np.float64, batch_first=spec.get("batch_first", False), dropout=spec.get("dropout", 0.0))
    if spec.get("mixed"):
        params = mixed_peepholes(params, rng)
    if spec.get("forget_peephole_only"):
        params = with_gates(params, forget_gate=dict(cell_weights=rng.uniform(-0.5, 0.5, (1, 2, 2, 2))))
    if spec.get("smooth"):
        params = attrs.evolve(with_gates(params, **SMOOTH_ACTIVATIONS), hidden_activation=A.softsign())
    return params


@pytest.mark.parametrize("case", list(GRADIENT_CASES))
def test_gradients_match_finite_differences(backend_name, case):
    spec = GRADIENT_CASES[case]
    rng = np.random.default_rng(list(GRADIENT_CASES).index(case) + 100)
    params = gradient_params(spec, rng)
    seq_len, batch = spec.get("seq_len", 3), spec.get("batch", 3)
    x_shape, y_shape, state_shape = shapes(params, seq_len, batch)
    x = rng.standard_normal(x_shape)
    h0, c0 = rng.standard_normal(state_shape), rng.standard_normal(state_shape)
    lengths = spec.get("lengths")
    wy = None if spec.get("no_output_gradient") else rng.standard_normal(y_shape)
    wh, wc = rng.standard_normal(state_shape), rng.standard_normal(state_shape)

    def make():  # client pointers: the finite differences perturb the parameters' arrays in place
        return layer_for(params, backend_name, use_client_pointer=True)

    shared = make()
    dropout = spec.get("dropout", 0.0) > 0

    def loss():
        # with dropout, a fresh layer (same seed) redraws the same masks in training
        out = make().apply(x, h0, c0, lengths, training=True) if dropout else shared.apply(x, h0, c0, lengths)
        total = np.sum(wh * out.hidden) + np.sum(wc * out.cell)
        return total if wy is None else total + np.sum(wy * out.output)

    layer = make()
    out = layer.apply(x, h0, c0, lengths, training=True)
    grads = layer.apply_backward(x, wy, h0, c0, wh, wc, lengths, training_cache=out.training_cache)
    assert isinstance(grads, LSTMGradients)
    assert_gradient_close(grads.input, numerical_gradient(loss, x), name="input")
    assert_gradient_close(grads.hidden, numerical_gradient(loss, h0), name="hidden")
    assert_gradient_close(grads.cell, numerical_gradient(loss, c0), name="cell")
    for name in GATES:
        gate, grad = getattr(params, name), getattr(grads, name)
        assert isinstance(grad, LSTMGateGradients)
        pairs = [("input_weights[0]", gate.input_weights[0], grad.input_weights[0]),
                 ("input_weights[1]", gate.input_weights[1], grad.input_weights[1]),
                 ("hidden_weights", gate.hidden_weights, grad.hidden_weights),
                 ("cell_weights", gate.cell_weights, grad.cell_weights),
                 ("bias", gate.bias, grad.bias)]
        for label, weights, analytic in pairs:
            if weights is None:
                assert analytic is None, f"{name}.{label}"
                continue
            assert analytic.shape == weights.shape and analytic.dtype == np.float64
            assert_gradient_close(analytic, numerical_gradient(loss, weights), name=f"{name}.{label}")
    if not dropout:  # without a cache the forward is recomputed, to the same result
        again = shared.apply_backward(x, wy, h0, c0, wh, wc, lengths)
        np.testing.assert_allclose(again.input, grads.input, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(again.output_gate.hidden_weights, grads.output_gate.hidden_weights,
                                   rtol=1e-13, atol=1e-15)


def test_backward_with_no_gradients_is_zero(backend_name, rng):
    params = LSTMParameters.random(input_size=2, hidden_size=2, seed=0, dtype=np.float64)
    with layer_for(params, backend_name) as layer:
        grads = layer.apply_backward(rng.standard_normal((3, 1, 2)), None)
    assert not grads.input.any() and not grads.hidden.any() and not grads.input_gate.bias.any()


def test_backward_can_run_twice_from_one_cache(backend_name, rng):
    params = LSTMParameters.random(input_size=2, hidden_size=3, num_layers=2, seed=0, dtype=np.float64)
    x = rng.standard_normal((4, 2, 2))
    with layer_for(params, backend_name) as layer:
        out = layer.apply(x, training=True)
        dy = rng.standard_normal(out.output.shape)
        first = layer.apply_backward(x, dy, training_cache=out.training_cache)
        second = layer.apply_backward(x, dy, training_cache=out.training_cache)
    np.testing.assert_array_equal(first.input, second.input)
    np.testing.assert_array_equal(first.forget_gate.input_weights[1], second.forget_gate.input_weights[1])



def test_an_inference_forward_between_leaves_the_training_cache_usable(backend_name, rng):
    """train → evaluate on other data → backward: the gradients of the training forward,
    dropout masks included (the evaluation draws none)."""
    params = LSTMParameters.random(input_size=2, hidden_size=3, num_layers=2, dropout=0.5, seed=0,
                                   dtype=np.float64)
    x, x_val = rng.standard_normal((4, 2, 2)), rng.standard_normal((3, 5, 2))
    lengths = [4, 2]
    with layer_for(params, backend_name) as layer, layer_for(params, backend_name) as twin:
        out = layer.apply(x, sequence_lengths=lengths, training=True)
        dy = rng.standard_normal(out.output.shape)
        expected = layer.apply_backward(x, dy, sequence_lengths=lengths, training_cache=out.training_cache)
        twin_out = twin.apply(x, sequence_lengths=lengths, training=True)
        twin(x_val)
        got = twin.apply_backward(x, dy, sequence_lengths=lengths, training_cache=twin_out.training_cache)
    np.testing.assert_allclose(got.input, expected.input, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got.forget_gate.input_weights[1], expected.forget_gate.input_weights[1],
                               rtol=1e-12, atol=1e-14)

# ------------------------------------------------------------------------------------------
# Dropout.
# ------------------------------------------------------------------------------------------
def test_dropout_follows_the_documented_draw_and_only_in_training(backend_name, rng):
    params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=3, bidirectional=True, seed=42,
                                   dtype=np.float64, dropout=0.3)
    x = rng.standard_normal((5, 2, 3))
    with layer_for(params, backend_name) as layer:
        first = layer.apply(x, training=True)
        second = layer.apply(x, training=True)
        inference = layer.apply(x)
    want = run_reference(params, x, dropout_scales=dropout_scales(params, 5, 2, seed=42))
    np.testing.assert_allclose(first.output, want[0], rtol=1e-10, atol=1e-10)
    assert not np.allclose(first.output, second.output)  # the generator moves on
    np.testing.assert_allclose(inference.output, run_reference(params, x)[0], rtol=1e-10, atol=1e-10)
    with layer_for(params, backend_name) as again:  # same seed, same sequence of masks
        np.testing.assert_array_equal(again.apply(x, training=True).output, first.output)


def test_dropout_needs_a_cache_for_backward(backend_name, rng):
    params = LSTMParameters.random(input_size=2, hidden_size=2, num_layers=2, seed=0, dtype=np.float64,
                                   dropout=0.5)
    with layer_for(params, backend_name) as layer:
        with pytest.raises(bf.InvalidParameterError,
                           match=r"apply_backward\(training_cache\) must be the cache"):
            layer.apply_backward(np.ones((2, 1, 2)), np.ones((2, 1, 2)))


def test_dropout_on_a_single_layer_changes_nothing(backend_name, rng):
    params = LSTMParameters.random(input_size=2, hidden_size=2, seed=0, dtype=np.float64, dropout=0.9)
    x = rng.standard_normal((3, 2, 2))
    with pytest.warns(UserWarning, match=r"dropout=0.9 has no effect with num_layers=1") as record:
        layer = layer_for(params, backend_name)
    assert len(record) == 1 and record[0].filename == __file__  # once, pointing at the caller's line
    with layer:
        # training and inference run different loops: equal within the stated tolerance
        _assert_all_close([layer.apply(x, training=True).output], [layer.apply(x).output], np.float64)
        layer.apply_backward(x, np.ones((3, 2, 2)))  # no masks, so no cache needed


# ------------------------------------------------------------------------------------------
# Training cache.
# ------------------------------------------------------------------------------------------
def cache_params():
    """Every optional part of the cache present: stacked, bidirectional, dropout, pre-activations."""
    params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=3, bidirectional=True,
                                   peepholes="full", seed=9, dtype=np.float32, dropout=0.25)
    return with_gates(params, input_gate=dict(activation=A.softsign()))


def test_capacity_is_exact(backend_name, rng):
    params = cache_params()
    x = rng.standard_normal((5, 3, 3)).astype(np.float32)
    with layer_for(params, backend_name) as layer:
        capacity = layer.training_cache_capacity(batch_size=3, seq_len=5)
        buffer = np.full(capacity + 4096, 0xA5, dtype=np.uint8)
        out = layer.apply(x, training=True, training_cache=buffer)
        assert out.training_cache is buffer
        assert (buffer[capacity:] == 0xA5).all(), "the forward wrote past training_cache_capacity"
        assert (buffer[capacity - 16:capacity] != 0xA5).any(), "the capacity is larger than what is written"
        exact = np.empty(capacity, dtype=np.uint8)
        layer.apply(x, training=True, training_cache=exact)
        with pytest.raises(bf.InvalidParameterError,
                           match=rf"at least {capacity} bytes .*got '{capacity - 1} bytes'"):
            layer.apply(x, training=True, training_cache=np.empty(capacity - 1, dtype=np.uint8))
        allocated = layer.apply(x, training=True).training_cache
        assert isinstance(allocated, np.ndarray) and allocated.dtype == np.uint8
        assert allocated.size == capacity


def test_capacity_is_affine_in_steps_times_batch(backend_name):
    for params in (cache_params(), LSTMParameters.random(input_size=7, hidden_size=5, seed=0)):
        with layer_for(params, backend_name) as layer:
            base = layer.training_cache_capacity(1, 1)
            slope = layer.training_cache_capacity(1, 2) - base
            assert slope > 0
            for seq_len, batch in [(3, 1), (1, 7), (4, 5), (64, 32), (10, 3)]:
                capacity = layer.training_cache_capacity(batch_size=batch, seq_len=seq_len)
                assert capacity == base + slope * (seq_len * batch - 1)
            assert layer.training_cache_capacity(2, 6) == layer.training_cache_capacity(3, 4)


@pytest.mark.parametrize("kind", ["uint8", "bytearray", "memoryview", "misaligned"])
def test_cache_accepts_writable_buffers(backend_name, rng, kind):
    params = cache_params()
    x = rng.standard_normal((4, 2, 3)).astype(np.float32)
    with layer_for(params, backend_name) as layer:
        capacity = layer.training_cache_capacity(2, 4)
        storage = {"uint8": lambda: np.zeros(capacity + 3, np.uint8),
                   "bytearray": lambda: bytearray(capacity),
                   "memoryview": lambda: memoryview(bytearray(capacity + 10)),
                   "misaligned": lambda: memoryview(bytearray(capacity + 3))[3:]}[kind]()
        out = layer.apply(x, training=True, training_cache=storage)
        assert out.training_cache is storage
        dy = np.ones_like(out.output)
        grads = layer.apply_backward(x, dy, training_cache=storage)
        frozen = layer.apply_backward(x, dy, training_cache=bytes(storage))  # read-only is fine for backward
        np.testing.assert_array_equal(grads.input, frozen.input)


def test_cache_mismatches_are_detected(backend_name, rng):
    params = LSTMParameters.random(input_size=2, hidden_size=3, num_layers=2, seed=0, dtype=np.float64)
    x = rng.standard_normal((4, 2, 2))
    dy = np.ones((4, 2, 3))
    with layer_for(params, backend_name) as layer:
        cache = layer.apply(x, sequence_lengths=[4, 2], training=True).training_cache
        with pytest.raises(bf.InvalidParameterError, match="another configuration or other sequence lengths"):
            layer.apply_backward(x, dy, training_cache=cache)  # written with other lengths
        with pytest.raises(bf.InvalidParameterError, match="written for T=3, N=2.*T=4, N=2"):
            layer.apply_backward(x[:3], dy[:3], training_cache=cache)
        other = LSTMParameters.random(input_size=2, hidden_size=3, num_layers=2, seed=0, dtype=np.float64,
                                      peepholes="diagonal")
        # same sizes and capacity, another cell: rejected by the fingerprint
        with layer_for(other, backend_name) as stranger:
            assert stranger.training_cache_capacity(2, 4) == layer.training_cache_capacity(2, 4)
            with pytest.raises(bf.InvalidParameterError, match="another configuration"):
                stranger.apply_backward(x, dy, sequence_lengths=[4, 2], training_cache=cache)
        single = attrs.evolve(params, dtype=np.float32)
        with layer_for(single, backend_name) as narrow:
            big = np.zeros(layer.training_cache_capacity(2, 4), np.uint8)
            layer.apply(x, training=True, training_cache=big)
            with pytest.raises(bf.InvalidParameterError, match="float32 data"):
                narrow.apply_backward(x.astype(np.float32), None, training_cache=big)
        with pytest.raises(bf.InvalidParameterError, match="without an LSTM cache header"):
            blank = np.zeros(layer.training_cache_capacity(2, 4), np.uint8)
            layer.apply_backward(x, dy, training_cache=blank)
        with pytest.raises(bf.InvalidParameterError, match="at least"):
            layer.apply_backward(x, dy, training_cache=bytearray(10))


def test_cache_buffer_errors(backend_name, rng):
    params = LSTMParameters.random(input_size=2, hidden_size=2, seed=0, dtype=np.float64)
    x = rng.standard_normal((2, 1, 2))
    with layer_for(params, backend_name) as layer:
        size = layer.training_cache_capacity(1, 2)
        with pytest.raises(bf.InvalidParameterError, match="a numpy.uint8 array.*float64 array"):
            layer.apply(x, training=True, training_cache=np.zeros(size))
        read_only = np.zeros(size, np.uint8)
        read_only.flags.writeable = False
        with pytest.raises(bf.InvalidParameterError, match="must be writable"):
            layer.apply(x, training=True, training_cache=read_only)
        with pytest.raises(bf.InvalidParameterError, match="must be writable"):
            layer.apply(x, training=True, training_cache=bytes(size))
        with pytest.raises(bf.InvalidParameterError, match="C-contiguous"):
            layer.apply(x, training=True, training_cache=np.zeros(2 * size, np.uint8)[::2])
        with pytest.raises(bf.InvalidParameterError, match="writable buffer"):
            layer.apply(x, training=True, training_cache=[0] * size)
        with pytest.raises(bf.InvalidParameterError, match="None when training=False"):
            layer.apply(x, training_cache=np.zeros(size, np.uint8))


def test_cache_at_an_odd_address_gives_the_same_results(backend_name, rng):
    """The layer stages a misaligned caller buffer through aligned memory, so the backend runs
    the same code path as for an aligned one: bitwise the same results (same code, same
    inputs), and no BLAS write into the step blocks is lost."""
    params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2, bidirectional=True, seed=5)
    x = rng.standard_normal((5, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((5, 3, 8)).astype(np.float32)
    with layer_for(params, backend_name) as layer:
        want = layer.apply(x, training=True)
        want_grads = layer.apply_backward(x, dy, training_cache=want.training_cache)
        odd = memoryview(bytearray(layer.training_cache_capacity(3, 5) + 3))[3:]
        got = layer.apply(x, training=True, training_cache=odd)
        grads = layer.apply_backward(x, dy, training_cache=odd)
    np.testing.assert_array_equal(got.output, want.output)
    np.testing.assert_array_equal(grads.input, want_grads.input)
    for a, b in zip(grads.gates, want_grads.gates):
        np.testing.assert_array_equal(a.hidden_weights, b.hidden_weights)


def test_same_inputs_give_bitwise_the_same_results_on_one_backend(backend_name, rng):
    """One backend, one code path: repeated calls and a second layer agree to the bit."""
    params = LSTMParameters.random(input_size=3, hidden_size=6, num_layers=2, bidirectional=True, seed=4)
    x = rng.standard_normal((7, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((7, 3, 12)).astype(np.float32)
    runs = []
    for _ in range(2):
        with layer_for(params, backend_name) as layer:
            for _ in range(2):
                out = layer.apply(x, training=True)
                grads = layer.apply_backward(x, dy, training_cache=out.training_cache)
                runs.append([out.output, out.hidden, grads.input] + [g.hidden_weights for g in grads.gates])
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            np.testing.assert_array_equal(a, b)


def test_weights_are_packed_once_and_again_only_when_client_weights_change(rng, pack_recorder):
    """The backend packs the weights when the layer is created; with client pointers it is
    asked again (with the next version) only after the caller changed an array."""
    packs = pack_recorder.versions
    params = LSTMParameters.random(input_size=2, hidden_size=3, seed=0, dtype=np.float64)
    x = rng.standard_normal((4, 2, 2))
    with LSTMLayer(params, bf.FilterParameters(backend=pack_recorder)) as copied:
        for _ in range(3):
            copied.apply(x)
    assert packs == [0]
    packs.clear()
    with LSTMLayer(params, bf.FilterParameters(backend=pack_recorder, use_client_pointer=True)) as client:
        before = client.apply(x).output
        client.apply(x, training=True)
        assert packs == [0]
        params.forget_gate.hidden_weights[0, 0, 1, 2] += 0.5  # an optimizer's in-place step
        after = client.apply(x).output
        client.apply(x)
        assert packs == [0, 1]
    assert not np.allclose(before, after)
    with LSTMLayer(params, bf.FilterParameters(backend="numpy", use_client_pointer=True)) as fresh:
        np.testing.assert_array_equal(fresh.apply(x).output, after)


def test_a_cache_serves_every_backend(rng):
    """The cache layout is the layer's, not the backend's: a cache written on one backend
    gives the same gradients on another."""
    params = LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, bidirectional=True, seed=2,
                                   dtype=np.float64)
    x, dy = rng.standard_normal((6, 2, 3)), rng.standard_normal((6, 2, 10))
    layers = {name: layer_for(params, name) for name in bf.available_backends()}
    caches = {name: layer.apply(x, training=True).training_cache for name, layer in layers.items()}
    for reader, layer in layers.items():
        want = layer.apply_backward(x, dy, training_cache=caches[reader])
        for writer, cache in caches.items():
            got = layer.apply_backward(x, dy, training_cache=cache)
            np.testing.assert_allclose(got.input, want.input, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{writer}->{reader}")
            for a, b in zip(got.gates, want.gates):
                np.testing.assert_allclose(a.hidden_weights, b.hidden_weights, rtol=1e-12, atol=1e-12)
    for layer in layers.values():
        layer.close()


# ------------------------------------------------------------------------------------------
# The fast kernels (default cell, scipy-blas) agree with the reference kernels.
# ------------------------------------------------------------------------------------------
FAST_CASES = {
    "one_step_one_sequence": dict(seq_len=1, batch=1, input_size=2, hidden_size=3),
    "one_sequence": dict(seq_len=9, batch=1, input_size=5, hidden_size=7),  # N = 1: the projection-row path
    # N = 1 again, the step products' rows long enough for the numba backend's widest row tiles
    "one_sequence_wide": dict(seq_len=4, batch=1, input_size=3, hidden_size=70),
    "odd_sizes": dict(seq_len=6, batch=3, input_size=5, hidden_size=7),
    "bidirectional_stack": dict(seq_len=5, batch=4, input_size=3, hidden_size=6, num_layers=2,
                                bidirectional=True),
    "batch_first_states": dict(seq_len=4, batch=2, input_size=3, hidden_size=5, num_layers=2,
                               bidirectional=True, batch_first=True, states=True),
    "one_sequence_bidirectional_states": dict(seq_len=7, batch=1, input_size=4, hidden_size=3,
                                              bidirectional=True, states=True),
    "no_bias_three_layers": dict(seq_len=3, batch=5, input_size=2, hidden_size=4, num_layers=3, bias=False),
}


def _all_results(layer, x, states, dy, final_grads):
    inference = layer.apply(x, *states)
    out = layer.apply(x, *states, training=True)
    grads = layer.apply_backward(x, dy, *states, *final_grads, training_cache=out.training_cache)
    no_dy = layer.apply_backward(x, None, *states, *final_grads, training_cache=out.training_cache)
    arrays = [inference.output, inference.hidden, inference.cell, out.output, out.hidden, out.cell]
    for g in (grads, no_dy):
        arrays += [g.input, g.hidden, g.cell]
        for gate in g.gates:
            arrays += [a for a in (*gate.input_weights, gate.hidden_weights, gate.bias) if a is not None]
    return arrays


FAST_BACKENDS = [name for name in ("scipy-blas", "numba") if name in bf.available_backends()]


@pytest.mark.parametrize("fast_backend", FAST_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", sorted(FAST_CASES))
def test_fast_kernels_agree_with_the_reference(case, dtype, fast_backend, rng):
    """The default cell takes each fast backend's own kernels (not the reference ones: the
    compiled ones on ``numba`` in float32, ``scipy-blas``'s otherwise) and agrees with the
    reference within the contract's tolerance."""
    spec = dict(FAST_CASES[case])
    seq_len, batch, states = spec.pop("seq_len"), spec.pop("batch"), spec.pop("states", False)
    params = LSTMParameters.random(seed=11, dtype=dtype, **spec)
    with layer_for(params, fast_backend) as probe:
        plan = probe._packed.payload.plan
        forward = probe.backend._lstm_direction_kernels(plan, None, batch, np.dtype(dtype)).forward
        if isinstance(forward, functools.partial):  # what it wraps: a kernel, or options for one
            kernel = forward.args[0] if forward.args else forward.func
        else:
            kernel = forward
        compiled = fast_backend == "numba" and dtype == np.float32  # numba compiles float32 only
        module = "bnnsfw.backends.numba" if compiled else "bnnsfw.backends.scipy_blas._lstm"
        assert kernel.__module__ == module
    x_shape, y_shape, state_shape = shapes(params, seq_len, batch)
    x, dy = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(y_shape).astype(dtype)
    h0c0 = tuple(rng.standard_normal(state_shape).astype(dtype) for _ in range(2)) if states else (None, None)
    final_grads = tuple(rng.standard_normal(state_shape).astype(dtype) for _ in range(2))
    with layer_for(params, "numpy") as reference, layer_for(params, fast_backend) as fast:
        want = _all_results(reference, x, h0c0, dy, final_grads)
        got = _all_results(fast, x, h0c0, dy, final_grads)
    rtol, atol = TOLERANCE[np.dtype(dtype)]  # the documented agreement between backends
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"array {k}")


def _argument(kernel, args, name):
    """The argument ``name`` of a compiled kernel's call, from its positional ``args``."""
    return args[list(inspect.signature(kernel.py_func).parameters).index(name)]


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_compiles_the_default_cell_with_peepholes_and_lengths_and_leaves_the_rest():
    backend = bf.get_backend("numba")
    from bnnsfw.backends.numba import _compiled_forward

    def served(dtype=np.float32, **options):
        layer = LSTMLayer(LSTMParameters.random(input_size=2, hidden_size=4, seed=0, dtype=dtype, **options),
                          bf.FilterParameters(backend=backend))
        plan = layer._packed.payload.plan
        forward = backend._lstm_direction_kernels(plan, np.array([2, 1]), 2, np.dtype(dtype)).forward
        return getattr(forward, "func", forward) is _compiled_forward

    assert served() and served(peepholes="diagonal") and served(default_activations=True)
    assert served(peepholes="full")
    assert not served(np.float64)  # float64: scipy-blas's kernels
    # full peepholes keep the steps on the calling thread, whatever the size
    big = LSTMLayer(LSTMParameters.random(input_size=2, hidden_size=256, seed=0, peepholes="full"),
                    bf.FilterParameters(backend=backend))
    kernels = backend._lstm_direction_kernels(big._packed.payload.plan, None, 64, np.dtype(np.float32))
    assert kernels.forward.keywords["parts"] == kernels.backward.keywords["parts"] == 1
    big.close()
    relu = bf.Activation(bf.ActivationFunction.relu)
    assert not served(hidden_activation=relu)  # other activations: the kernels of _numba_cells


#: Each per-element activation, with parameters other than the defaults where it takes any.
_ACTIVATION_PARAMETERS = {
    "leaky_relu": (0.05,), "scaled_tanh": (0.9, 1.3), "linear": (1.3,), "clamp": (-0.7, 0.8),
    "gelu_approximation": (0.8, 0.05), "hard_sigmoid": (0.3, 0.45), "softplus": (0.5, 1.2), "elu": (0.7,),
    "clamped_leaky_relu": (0.1, 0.9), "linear_with_bias": (0.8, 0.1), "celu": (0.6,), "hard_shrink": (0.3,),
    "soft_shrink": (0.3,), "threshold": (0.2, -0.1),
}
EVERY_ACTIVATION = [getattr(A, f.name)(*_ACTIVATION_PARAMETERS.get(f.name, ()))
                    for f in bf.ActivationFunction if f.is_elementwise]


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("act", EVERY_ACTIVATION, ids=lambda a: a.function.name)
def test_numba_activation_formulas_match_the_activations(act):
    """The compiled kernels' value and derivative of every per-element activation agree with
    :class:`bnnsfw.Activation`'s, at points off the functions' kinks: in float32 (the compiled
    kernels' dtype) to 1e-5 of the float64 values (float32 rounding in GELU's cubic; the
    rational tanh's error is about 2.6e-7); the derivative from the output alone (the input
    NaN) for the functions whose output determines it; a halved sigmoid gate as σ(2v)."""
    from bnnsfw.backends.numba._cells import activate_run, derivative_run

    assert len(EVERY_ACTIVATION) == 29
    x = np.linspace(-6.0, 6.0, 241) + 0.0137
    y = act.forward(x)
    want = act.derivative(x=x, y=y)
    tol = 1e-5
    code, a, b = int(act.function), np.float32(act.alpha), np.float32(act.beta)
    xs = x.astype(np.float32)
    got_y = np.full_like(xs, np.nan)
    activate_run(code, a, b, False, xs, got_y)
    ys = act.forward(xs)
    x_seen = np.full_like(xs, np.nan) if act.derivative_from_output else xs  # from y alone
    got_d = np.ones_like(xs)
    derivative_run(code, a, b, x_seen, ys, got_d)
    np.testing.assert_allclose(got_y, y, rtol=tol, atol=tol, err_msg="value")
    np.testing.assert_allclose(got_d, want, rtol=tol, atol=tol, err_msg="derivative")
    halved = np.full_like(xs, np.nan)
    activate_run(code, a, b, True, xs / 2, halved)
    np.testing.assert_allclose(halved, A.sigmoid().forward(x), rtol=tol, atol=tol)


def _every_result(layer, x, lengths, states, dy, final_grads):
    """Inference and training outputs and states, and every gradient (peepholes included)."""
    inference = layer.apply(x, *states, lengths)
    out = layer.apply(x, *states, lengths, training=True)
    grads = layer.apply_backward(x, dy, *states, *final_grads, lengths, training_cache=out.training_cache)
    return [inference.output, inference.hidden, inference.cell, out.output, out.hidden, out.cell,
            grads.input, grads.hidden, grads.cell, *_gate_gradients(grads)]


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("act", EVERY_ACTIVATION, ids=lambda a: a.function.name)
def test_numba_compiles_cells_with_any_activation(act, monkeypatch, rng):
    """A cell with ``act`` on every gate and on the cell, with full and diagonal peepholes,
    lengths (one of them 0) and initial states, two bidirectional layers, runs on the
    compiled kernels of ``_numba_cells`` (never on the reference's step kernels) and agrees
    with the reference backend: outputs, states and every gradient, float32 (the compiled
    kernels' dtype)."""
    from bnnsfw.backends._shared.lstm_kernels import LSTMKernels

    def refused(*args, **kwargs):
        raise AssertionError("a reference step kernel ran on the numba backend")

    params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2, bidirectional=True, seed=5,
                                   dtype=np.float32)
    gates = {name: dict(activation=act)
             for name in ("input_gate", "forget_gate", "candidate_gate", "output_gate")}
    def uniform(shape):
        return rng.uniform(-0.2, 0.2, shape).astype(np.float32)

    gates["candidate_gate"]["cell_weights"] = uniform((2, 2, 4, 4))  # full: with U h
    gates["forget_gate"]["cell_weights"] = uniform((2, 2, 4))  # diagonal
    gates["output_gate"]["cell_weights"] = uniform((2, 2, 4, 4))  # full: on the new cell
    params = with_gates(params, **gates)
    params = attrs.evolve(params, hidden_activation=act)
    x_shape, y_shape, state_shape = shapes(params, 5, 3)
    # inputs and states of about ±1: a cell of unbounded activations everywhere stays finite
    x = rng.uniform(-1.0, 1.0, x_shape).astype(np.float32)
    dy = rng.standard_normal(y_shape).astype(np.float32)
    states = tuple(rng.uniform(-1.0, 1.0, state_shape).astype(np.float32) for _ in range(2))
    final_grads = tuple(rng.standard_normal(state_shape).astype(np.float32) for _ in range(2))
    lengths = np.array([5, 2, 0])
    with layer_for(params, "numpy") as reference:
        want = _every_result(reference, x, lengths, states, dy, final_grads)
    for kind in ("forward", "backward"):
        monkeypatch.setattr(LSTMKernels, f"lstm_{kind}_step", refused)
    with layer_for(params, "numba") as compiled:
        got = _every_result(compiled, x, lengths, states, dy, final_grads)
    _assert_all_close(got, want, np.float32)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("peepholes", ["diagonal", "full", "mixed"])
@pytest.mark.parametrize("batch", [3, 11])
def test_numba_chunks_of_steps_agree_with_the_reference(peepholes, batch, monkeypatch, rng):
    """Long sequences run the input projection and the weight gradients a chunk of steps at a
    time; with chunks of 6 columns (2 steps of 3 sequences, the last chunk shorter; one step of
    11) every output and gradient still agrees with the reference, with lengths, diagonal, full
    or mixed peepholes (compiled, not handed on), both directions, initial states and
    final-state gradients. 3 sequences take BLAS for each step's product, 11 the tile product
    (whole vectors and a padded rest)."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    dtype = np.float32  # the compiled kernels' dtype

    monkeypatch.setattr(_numba_lstm, "CHUNK_COLUMNS", 6)
    monkeypatch.setattr(_numba_lstm, "NARROW_CHUNK_COLUMNS", 6)
    params = LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, bidirectional=True,
                                   peepholes="full" if peepholes == "mixed" else peepholes, seed=2,
                                   dtype=dtype)
    if peepholes == "mixed":
        params = mixed_peepholes(params, rng)
    with layer_for(params, "numba") as probe:
        plan = probe._packed.payload.plan
        assert _numba_lstm.serves(plan)
    x = rng.standard_normal((7, batch, 3)).astype(dtype)
    dy = rng.standard_normal((7, batch, 10)).astype(dtype)
    states = tuple(rng.standard_normal((4, batch, 5)).astype(dtype) for _ in range(2))
    final_grads = tuple(rng.standard_normal((4, batch, 5)).astype(dtype) for _ in range(2))
    lengths = np.resize([7, 4, 1], batch)
    results = []
    for name in ("numpy", "numba"):
        with layer_for(params, name) as layer:
            out = layer.apply(x, *states, training=True, sequence_lengths=lengths)
            grads = layer.apply_backward(x, dy, *states, *final_grads, sequence_lengths=lengths,
                                         training_cache=out.training_cache)
            inference = layer.apply(x, *states, sequence_lengths=lengths)
        arrays = [out.output, out.hidden, out.cell, inference.output, grads.input, grads.hidden, grads.cell]
        results.append(arrays + _gate_gradients(grads))
    _assert_all_close(results[1], results[0], dtype)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("peepholes", [None, "diagonal", "full"])
@pytest.mark.parametrize("length", [7, 5, 0])
def test_numba_one_sequence_projects_a_row_a_step(peepholes, length, monkeypatch, rng):
    """One sequence's forward, a kernel of its own (``_forward_one``), lays its input projection
    out a row a step (``projection_shape``: (chunk, 4H)), each step adding its product to its
    row. Over chunks of 3 steps (3, 3 and 1), two layers, both directions, a length of the whole
    sequence, a shorter one or 0, initial states and final-state gradients, with no, diagonal or
    full peepholes, the inference (through a prepared call), the training forward and every
    gradient agree with the reference; 4H = 76 takes whole vectors and a rest."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    dtype = np.float32  # the compiled kernels' dtype

    monkeypatch.setattr(_numba_lstm, "NARROW_CHUNK_COLUMNS", 3)
    seen = _record_calls(monkeypatch, ["_forward", "_forward_one"],
                         lambda name, kernel, args: (name, _argument(kernel, args, "projection").shape))
    hidden = 19
    params = LSTMParameters.random(input_size=3, hidden_size=hidden, num_layers=2, bidirectional=True,
                                   peepholes=peepholes, seed=5, dtype=dtype)
    x = rng.standard_normal((7, 1, 3)).astype(dtype)
    dy = rng.standard_normal((7, 1, 2 * hidden)).astype(dtype)
    states = tuple(rng.standard_normal((4, 1, hidden)).astype(dtype) for _ in range(2))
    final_grads = tuple(rng.standard_normal((4, 1, hidden)).astype(dtype) for _ in range(2))
    lengths = np.array([length])
    results = []
    for name in ("numpy", "numba"):
        with layer_for(params, name) as layer:
            full_length = [layer.apply(x, *states).output for _ in range(2)]
            results.append(_every_result(layer, x, lengths, states, dy, final_grads) + full_length)
    _assert_all_close(results[1], results[0], dtype)
    assert seen and set(seen) == {("_forward_one", (3, 4 * hidden))}


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_one_sequence_shared_out_keeps_the_column_layout(monkeypatch, rng):
    """One sequence's steps shared out over threads (only where ``step_parts`` is made to say
    so) take the column layout of every threaded forward, not the row a step of the calling
    thread's (``projection_shape``): inference, training and every gradient agree with the
    reference."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    dtype = np.float32  # the compiled kernels' dtype

    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: 2)
    seen = _record_calls(monkeypatch, ["_forward_threads"],
                         lambda name, kernel, args: _argument(kernel, args, "projection").shape)
    hidden = 40
    params = LSTMParameters.random(input_size=3, hidden_size=hidden, seed=6, dtype=dtype)
    x = rng.standard_normal((9, 1, 3)).astype(dtype)
    dy = rng.standard_normal((9, 1, hidden)).astype(dtype)
    results = []
    for name in ("numpy", "numba"):
        with layer_for(params, name) as layer:
            results.append(_forward_and_backward(layer, x, dy))
    _assert_all_close(results[1], results[0], dtype)
    assert seen and all(shape[0] == 4 * hidden for shape in seen)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_one_sequence_shared_out_projects_chunks_of_its_own_columns(monkeypatch, rng):
    """One sequence's steps shared out over threads, in chunks of 6 columns (40 steps): each
    chunk's projection fits the column layout's scratch (its steps are counted from the
    columns, not from the rows of one sequence's row layout, which wrote past the scratch and
    corrupted the heap), and the output agrees with the reference."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    dtype = np.float32  # the compiled kernels' dtype

    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: 2)
    monkeypatch.setattr(_numba_lstm, "CHUNK_COLUMNS", 6)
    seen = _record_calls(monkeypatch, ["_forward_threads"],
                         lambda name, kernel, args: _argument(kernel, args, "projection").shape)
    params = LSTMParameters.random(input_size=3, hidden_size=40, seed=6, dtype=dtype)
    x = rng.standard_normal((40, 1, 3)).astype(dtype)
    results = []
    for name in ("numpy", "numba"):
        with layer_for(params, name) as layer:
            results.append([layer.apply(x).output])
    _assert_all_close(results[1], results[0], dtype)
    assert seen and all(shape[0] == 160 for shape in seen)


def _framed(make, shape, dtype):
    """``make(out)`` on an ``out`` of ``shape`` inside a larger array; checks that nothing
    around it was written and returns ``out``."""
    m, n = shape
    frame = np.full((m + 2, n + 5), 7.0, dtype)
    out = frame[1:-1, 2:-3]
    make(out)
    edges = np.ones(frame.shape, bool)
    edges[1:-1, 2:-3] = False
    assert (frame[edges] == 7.0).all(), shape
    return out


def _checked_product(product_into, a, b, add, tolerance):
    """``product_into(add, out)``, which makes ``out = add + a @ b``, checked against a float64
    product inside a frame (:func:`_framed`) and with ``out`` as ``add`` (the same results);
    returns its ``out`` and the scale of the tolerance."""
    dtype = a.dtype
    want = add.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    scale = 1.0 + np.abs(want).max()
    out = _framed(lambda out: product_into(add, out), want.shape, dtype)
    assert np.abs(out - want).max() <= tolerance * scale, (a.shape, b.shape)
    same = add.copy()
    product_into(same, same)
    np.testing.assert_allclose(same, out, rtol=4 * np.finfo(dtype).eps, atol=4 * np.finfo(dtype).eps * scale)
    return out, scale


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_step_product_agrees_with_a_float64_product(rng):
    """``_numba_tiles.product`` (``out = add + a @ b``, each step's ``U h`` and ``Uᵀ dz``) agrees
    with a float64 product for every kind of tile: row counts that leave 0 to 5 rows after
    the 6-row (or 12-row) tiles, column counts of two vectors, one, a padded rest or several
    of each (with AVX-512, 7 narrow vectors' worth is a panel of two wide ones, one wide and
    one narrow, and one narrow or one wide vector's worth with an even shared length is the
    paired tile, whose row counts leave 0 to 11 rows after its 12-row tiles and reach every
    tile of its two-vector form: 8, 4, 2 and 1 rows), an empty sum. It writes
    nothing outside ``out`` (views inside larger arrays), takes ``out`` as ``add``, and
    refuses operands whose rows are not unit-stride. The same with ``b`` paired beforehand
    for several products (``paired``, ``paired_product``), and with ``a`` stored transposed
    (``transposed_product``, whose tiles take ``TRANSPOSED_ROWS`` rows, then 8, 4, 2 and 1)."""
    from bnnsfw.backends.numba._tiles import (PAIR_ROWS, PAIR_WIDE_ROWS, lanes, paired, paired_product,
                                              product, transposed_product)

    dtype = np.float32  # the compiled kernels' dtype

    width = lanes(dtype)
    assert width == 32 // np.dtype(dtype).itemsize
    assert (PAIR_ROWS, PAIR_WIDE_ROWS) == (12, 8)
    tolerance = 1e-5
    for m in (1, 5, 6, 7, 13, 23, 26, 35, 40):
        for k in (0, 1, 2, 17, 40):
            for n in (1, 3, width, width + 1, 2 * width, 2 * width + 3, 3 * width, 5 * width - 1, 7 * width):
                a = rng.standard_normal((m, k)).astype(dtype)
                b = rng.standard_normal((k, n)).astype(dtype)
                add = rng.standard_normal((m, n)).astype(dtype)
                want = add.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
                scale = 1.0 + np.abs(want).max()
                out = _framed(lambda out: product(a, b, add, out), (m, n), dtype)
                assert np.abs(out - want).max() <= tolerance * scale, (m, k, n)
                same = add.copy()
                product(a, b, same, same)
                assert np.abs(same - want).max() <= tolerance * scale, (m, k, n)
                pairs = paired(b)
                assert pairs.shape == ((k // 2, 2 * n) if pairs.size else (0, n)), (m, k, n)
                again = np.empty_like(out)
                paired_product(a, b, pairs, add, again)
                assert np.abs(again - want).max() <= tolerance * scale, (m, k, n)
                a_t = np.ascontiguousarray(a.T)
                out = _framed(lambda out: transposed_product(a_t, b, add, out), (m, n), dtype)
                assert np.abs(out - want).max() <= tolerance * scale, (m, k, n)
                same = add.copy()
                transposed_product(a_t, b, same, same)
                assert np.abs(same - want).max() <= tolerance * scale, (m, k, n)
    a = rng.standard_normal((4, 3)).astype(dtype)
    b = rng.standard_normal((3, 6)).astype(dtype)
    with pytest.raises(ValueError, match="unit-stride rows"):
        product(a, b, np.zeros((4, 12), dtype)[:, ::2], np.zeros((4, 6), dtype))
    with pytest.raises(ValueError, match="unit-stride rows"):
        transposed_product(np.zeros((3, 8), dtype)[:, ::2], b, *np.zeros((2, 4, 6), dtype))


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_steps_of_fewer_sequences_than_a_vector_agree_with_the_reference(rng):
    """One to seven float32 sequences, fewer than a vector holds, take
    the step's product as rows (``row_product``) forward and backward: outputs, final states
    and every gradient agree with the reference, with lengths (one of 0 from three sequences
    on), diagonal peepholes, initial states and final-state gradients, hidden sizes that fill
    no vector."""
    from bnnsfw.backends.numba._tiles import VECTOR_BYTES

    dtype = np.float32  # the compiled kernels' dtype

    for batch in range(1, VECTOR_BYTES // np.dtype(dtype).itemsize):
        for hidden_size in (5, 33):
            params = LSTMParameters.random(input_size=7, hidden_size=hidden_size, peepholes="diagonal",
                                           seed=1, dtype=dtype)
            x = rng.standard_normal((9, batch, 7)).astype(dtype)
            dy = rng.standard_normal((9, batch, hidden_size)).astype(dtype)
            states = tuple(rng.standard_normal((1, batch, hidden_size)).astype(dtype) for _ in range(4))
            lengths = np.resize([9, 4, 0, 8], batch)
            results = []
            for name in ("numpy", "numba"):
                with layer_for(params, name) as layer:
                    out = layer.apply(x, *states[:2], training=True, sequence_lengths=lengths)
                    grads = layer.apply_backward(x, dy, *states, sequence_lengths=lengths,
                                                 training_cache=out.training_cache)
                    results.append([out.output, out.hidden, out.cell, grads.input, grads.hidden, grads.cell]
                                   + _gate_gradients(grads))
            _assert_all_close(results[1], results[0], dtype)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_row_product_agrees_with_a_float64_product(rng):
    """``row_product`` (``out = a @ b`` for one row or a few: a step's product for fewer
    sequences than a vector holds, their states as rows) agrees with a float64 product: one
    to nine rows (tiles of four, two and one), column counts that take tiles of
    ``ROW_VECTORS`` and ``ROWS_VECTORS`` vectors, of one, and columns one by one, or none of
    some; an empty sum; ``b`` a view of the first columns of wider rows (NaN beyond, never
    read) and ``a`` a strided view (the transpose of a step's states, columns of a larger
    array); ``out`` overwritten whatever it held (NaN), nothing written around it.
    ``add_row_product`` adds the same product to what ``out`` holds."""
    from bnnsfw.backends.numba._tiles import (ROW_VECTORS, ROWS_VECTORS, WIDE_BYTES, add_row_product,
                                              row_product)

    dtype = np.float32  # the compiled kernels' dtype

    lane = WIDE_BYTES // np.dtype(dtype).itemsize
    tolerance = 1e-5
    tile, rows_tile = ROW_VECTORS * lane, ROWS_VECTORS * lane
    for m in (1, 2, 3, 4, 7, 9):
        for k in (0, 1, 7, 64, 130):
            for n in (1, lane - 1, lane, rows_tile + lane, 3 * lane + 5, tile, tile + rows_tile + lane + 3,
                      2 * tile, 4 * 64):
                a = rng.standard_normal((k, 2 * m + 1)).astype(dtype)[:, 1::2].T  # (m, k), strided
                wide = np.full((k, n + 9), np.nan, dtype)
                wide[:, :n] = rng.standard_normal((k, n))
                b = wide[:, :n]
                want = a.astype(np.float64) @ b.astype(np.float64)
                frame = np.full((m + 2, n + 2), 7.0, dtype)
                out = frame[1:-1, 1:-1]
                out[:] = np.nan
                row_product(a, b, out)
                edges = np.ones(frame.shape, bool)
                edges[1:-1, 1:-1] = False
                assert (frame[edges] == 7.0).all(), (m, k, n)
                assert np.abs(out - want).max() <= tolerance * (1.0 + np.abs(want).max()), (m, k, n)
                start = rng.standard_normal((m, n)).astype(dtype)
                out[:] = start
                add_row_product(a, b, out)
                assert (frame[edges] == 7.0).all(), (m, k, n)
                want = want + start
                assert np.abs(out - want).max() <= tolerance * (1.0 + np.abs(want).max()), (m, k, n)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_narrow_steps_put_their_operands_between_rows_and_columns(rng):
    """A narrow step's operands go between the columns the fused passes read and the rows
    ``row_product`` takes: ``_columns_from_rows`` writes ``z[r, n] = add[r, first + n] +
    s·rows[n, r]`` and ``_rows_from_columns`` ``rows[n, r] = s·z[r, n]``, ``s`` 1 for the
    first ``h`` rows and ``scale`` after (the halved gates), for one to seven columns (four at a
    time, then one): within two roundings of the dtype (the compiler may fuse the product and
    the sum), the scaling alone exactly (by a power of two); nothing written around the
    outputs, the inputs left as they were."""
    from bnnsfw.backends.numba._lstm_cell import _columns_from_rows, _rows_from_columns

    dtype = np.float32  # the compiled kernels' dtype

    h, first = 5, 3
    scale = dtype(0.5)
    for k in range(1, 8):
        rows = rng.standard_normal((k, 4 * h)).astype(dtype)
        add = rng.standard_normal((4 * h, first + k + 2)).astype(dtype)
        inputs = rows.copy(), add.copy()
        s = np.where(np.arange(4 * h) < h, dtype(1.0), scale)[:, None]
        frame = np.full((4 * h + 2, k + 2), 7.0, dtype)
        z = frame[1:-1, 1:-1]
        _columns_from_rows(z, rows, add, first, h, scale)
        eps = np.finfo(dtype).eps
        np.testing.assert_allclose(z, add[:, first:first + k] + s * rows.T, rtol=2 * eps,
                                   atol=2 * eps * float(np.abs(rows).max()))
        edges = np.ones(frame.shape, bool)
        edges[1:-1, 1:-1] = False
        assert (frame[edges] == 7.0).all(), k
        np.testing.assert_array_equal(rows, inputs[0])
        np.testing.assert_array_equal(add, inputs[1])
        frame = np.full((k + 2, 4 * h + 2), 7.0, dtype)
        back = frame[1:-1, 1:-1]
        z_before = z.copy()
        _rows_from_columns(back, z, h, scale)
        np.testing.assert_array_equal(back, (s * z).T)
        assert (frame[edges.T] == 7.0).all(), k
        np.testing.assert_array_equal(z, z_before)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_numba_gradient_products_by_the_tile_agree_with_a_float64_product(beta, rng):
    """The weight and input gradients of an overlapped backward's piece (float32, the only dtype
    overlapped) made with the register tile
    (``_tile_weight_gradients``: ``dW = dz x``, ``dU = dz h``; ``_tile_input_gradient``:
    ``dX = dzᵀ W``) agree with float64 products: ``beta`` 0 overwrites whatever the
    outputs held (NaN included, as BLAS does), 1 adds to them; gate gradients as a view of
    wider rows (a chunk's first columns); inputs of one feature and sizes that fill no vector;
    a chunk's products shared out over threads (blocks of ``TILE_BLOCK`` along the shared axes,
    the last one shorter, and for the input gradient ``TRANSPOSED_ROWS`` columns of ``dz`` at a
    time, 11 left over); nothing written around the outputs."""
    from bnnsfw.backends.numba._lstm_backward import TILE_BLOCK, _tile_input_gradient, _tile_weight_gradients
    from bnnsfw.backends.numba._tiles import TRANSPOSED_ROWS

    dtype, tolerance = np.float32, 1e-5
    blocked = (2 * TILE_BLOCK + 18, 56 * TRANSPOSED_ROWS + 11, 20, 9)
    for rows, width, size_i, hidden in ((512, 112, 128, 128), (28, 13, 5, 7), (16, 256, 1, 4), blocked):
        gates = rng.standard_normal((rows, width + 9)).astype(dtype)[:, :width]
        x_rows = rng.standard_normal((width, size_i)).astype(dtype)
        states = rng.standard_normal((width, hidden)).astype(dtype)
        wx = rng.standard_normal((rows, size_i)).astype(dtype)
        before = [np.full(shape, np.nan, dtype) if beta == 0.0 else rng.standard_normal(shape).astype(dtype)
                  for shape in ((rows, size_i), (rows, hidden), (width, size_i))]
        g64 = gates.astype(np.float64)
        wants = [g64 @ x_rows.astype(np.float64), g64 @ states.astype(np.float64),
                 g64.T @ wx.astype(np.float64)]
        if beta:
            wants = [want + start.astype(np.float64) for want, start in zip(wants, before)]

        frames = [np.full((start.shape[0] + 2, start.shape[1] + 5), 7.0, dtype) for start in before]
        d_wx, d_u, d_input = (frame[1:-1, 2:-3] for frame in frames)
        for out, start in zip((d_wx, d_u, d_input), before):
            out[:] = start
        _tile_weight_gradients(gates, x_rows, states, d_wx, d_u, beta)
        _tile_input_gradient(wx, gates, d_input, beta)
        for frame in frames:
            edges = np.ones(frame.shape, bool)
            edges[1:-1, 2:-3] = False
            assert (frame[edges] == 7.0).all()
        for got, want in zip((d_wx, d_u, d_input), wants):
            assert np.abs(got - want).max() <= tolerance * (1.0 + np.abs(want).max()), (rows, width, size_i)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_packed_step_product_agrees_with_the_product(rng):
    """``packed_product`` on rows packed by ``pack_rows`` (blocks of ``pack_size`` rows: twelve,
    ``PACK_ROWS``, with AVX-512 and for one vector's worth of columns, else six, ``ROWS``; each
    column's elements side by side) makes the sums ``product`` makes, in the same order: it
    agrees with a float64 product and with ``product`` to the last bits' rounding, for column
    counts that ``packs`` (a whole number of narrow vectors; where the paired tiles serve,
    ``PAIRS``, not one narrow or one wide vector's worth, which they take); it writes nothing
    outside ``out`` and takes ``out`` as ``add``."""
    from bnnsfw.backends.numba._tiles import (COLUMN_ROWS, PACK_ROWS, PAIRS, ROWS, VECTOR_BYTES, WIDE_BYTES,
                                              lanes, pack_rows, pack_size, packed_product, packs, product)

    dtype = np.float32  # the compiled kernels' dtype

    width = lanes(dtype)
    wide = WIDE_BYTES > VECTOR_BYTES
    assert (PACK_ROWS, ROWS) == (12, 6)
    assert not packs(0, dtype) and not packs(width + 1, dtype)
    assert packs(width, dtype) == (not PAIRS)
    one_wide = 2 * width * np.dtype(dtype).itemsize == WIDE_BYTES
    assert packs(2 * width, dtype) == (not (PAIRS and one_wide))
    assert packs(3 * width, dtype)
    assert pack_size(width, dtype) in (PACK_ROWS, COLUMN_ROWS)
    assert pack_size(2 * width, dtype) == (PACK_ROWS if wide else ROWS)
    tolerance = 1e-5
    for blocks in (1, 2, 5):
        for k in (1, 2, 17, 64):
            for n in [c * width for c in (1, 2, 3, 4, 5, 7) if packs(c * width, dtype)]:
                size = ROWS if pack_size(n, dtype) == ROWS else PACK_ROWS  # the column tile's n: twelve
                m = blocks * size
                a = rng.standard_normal((m, k)).astype(dtype)
                b = rng.standard_normal((k, n)).astype(dtype)
                add = rng.standard_normal((m, n)).astype(dtype)
                packed = np.empty((blocks, k, size), dtype)
                pack_rows(a, packed)
                np.testing.assert_array_equal(packed, a.reshape(blocks, size, k).transpose(0, 2, 1))
                out, scale = _checked_product(lambda add, out: packed_product(packed, b, add, out), a, b,
                                              add, tolerance)
                plain = np.empty_like(out)
                product(a, b, add, plain)
                np.testing.assert_allclose(out, plain, rtol=4 * np.finfo(dtype).eps,
                                           atol=4 * np.finfo(dtype).eps * scale)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_packed_rest_product_reads_only_its_rows(rng):
    """``packed_rest_product`` on the first ``rest`` columns of one packed block (1 to 11 rows:
    tiles of 8, 4, 2 and 1 of them) agrees with a float64 product; it reads none of the
    block's other columns (NaN there changes nothing), writes nothing outside ``out`` and
    takes ``out`` as ``add``."""
    from bnnsfw.backends.numba._tiles import PACK_ROWS, lanes, packed_rest_product

    dtype = np.float32  # the compiled kernels' dtype

    width = lanes(dtype)
    tolerance = 1e-5
    for rest in range(1, PACK_ROWS):
        for k in (1, 17, 64):
            for n in (3 * width, 4 * width):
                a = rng.standard_normal((rest, k)).astype(dtype)
                b = rng.standard_normal((k, n)).astype(dtype)
                add = rng.standard_normal((rest, n)).astype(dtype)
                block = np.full((k, PACK_ROWS), np.nan, dtype)
                block[:, :rest] = a.T
                _checked_product(lambda add, out: packed_rest_product(block, b, add, out), a, b, add,
                                 tolerance)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_shared_steps_read_the_packed_rows_of_u_and_w(monkeypatch, rng):
    """The steps shared out over two threads take each piece's gate rows of ``[U W]`` packed
    (``_step_tiles``: made once for the weights and the thread count, kept with them) when the
    batch's columns pack, and make ``U h + W x + b`` in one product: the output agrees with the
    reference, and zeroing the packed rows changes it (the kernels read them, the rows left
    over after the whole blocks too); a batch whose columns do not pack (where the paired tiles
    serve, 8 float32 sequences, which take them and the chunks' projection; 3 sequences
    anywhere) leaves the packed rows unmade. The batch: 24 sequences with AVX-512, one
    vector's worth without; three vectors' worth take blocks of the rows of the tile that
    takes them (``pack_size``: six without AVX-512) and agree as well."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm
    from bnnsfw.backends.numba._tiles import (PACK_ROWS, ROWS, VECTOR_BYTES, WIDE_BYTES, lanes, pack_size,
                                              packs)

    dtype = np.float32
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: 2)
    monkeypatch.setattr(_numba_lstm, "group_sequences", lambda *args: False)  # each step's units shared out
    params = LSTMParameters.random(input_size=3, hidden_size=38, seed=5, dtype=dtype)
    batch = 24 if WIDE_BYTES > VECTOR_BYTES else lanes(dtype)
    assert packs(batch, dtype)
    x = rng.standard_normal((5, batch, 3)).astype(dtype)
    with layer_for(params, "numpy") as layer:
        want = layer.apply(x).output
    with layer_for(params, "numba") as layer:
        got = layer.apply(x).output
        weights = layer._packed_weights().payload.weights[0][0]
        tiles = weights.step_tiles[(2, PACK_ROWS)]
        # pieces of 16 and 22 units (cut at multiples of 16): one block of 12 rows each, and
        # one more for the 4 and 10 rows left, over H + I = 41 columns
        assert tiles.shape == (2, 4, 2, 38 + 3, PACK_ROWS)
        u_w = np.concatenate([weights.u, weights.wx], axis=1)
        np.testing.assert_array_equal(tiles[1, 2, 0], u_w[2 * 38 + 16:2 * 38 + 28].T)
        np.testing.assert_array_equal(tiles[1, 2, 1, :, :10], u_w[2 * 38 + 28:2 * 38 + 38].T)
        np.testing.assert_array_equal(tiles[1, 2, 1, :, 10:], 0.0)
        np.testing.assert_array_equal(tiles[0, 3, 1, :, :4], u_w[3 * 38 + 12:3 * 38 + 16].T)
        _assert_all_close([got], [want], dtype)
        tiles[:, :, 1] = 0.0
        assert np.abs(layer.apply(x).output - want).max() > 1e-3
    for batch in (8, 3):
        with layer_for(params, "numba") as layer:
            layer.apply(rng.standard_normal((5, batch, 3)).astype(dtype))
            made = layer._packed_weights().payload.weights[0][0].step_tiles
            assert (made != {}) == packs(batch, dtype), batch
    # several vectors' worth: blocks of the rows of the tile that takes them (six without AVX-512)
    batch = 3 * lanes(dtype)
    size = pack_size(batch, dtype)
    assert size == (PACK_ROWS if WIDE_BYTES > VECTOR_BYTES else ROWS)
    x = rng.standard_normal((5, batch, 3)).astype(dtype)
    with layer_for(params, "numpy") as layer:
        want = layer.apply(x).output
    with layer_for(params, "numba") as layer:
        got = layer.apply(x).output
        tiles = layer._packed_weights().payload.weights[0][0].step_tiles[(2, size)]
        assert tiles.shape[-1] == size
        _assert_all_close([got], [want], dtype)
        tiles[:, :, 1] = 0.0
        assert np.abs(layer.apply(x).output - want).max() > 1e-3


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_column_product_agrees_with_a_float64_product(rng):
    """``column_product`` (the column tile: vectors along the rows of ``out``, on rows packed in
    blocks of ``COLUMN_ROWS`` by ``pack_rows``) agrees with a float64 product for row counts of
    whole blocks and of a last partial one (whose packed rows past the count hold NaN, which
    nothing reads into ``out``), shared lengths from 0 up; it writes nothing outside ``out``,
    takes ``out`` as ``add``, and refuses operands it does not serve. Float32 only, 8 columns;
    ``column_tiles`` says where the steps take it (AVX-512 without the paired tiles)."""
    from bnnsfw.backends.numba._tiles import (COLUMN_COLUMNS, COLUMN_ROWS, PAIRS, VECTOR_BYTES, WIDE_BYTES,
                                              column_product, column_tiles, pack_rows)

    assert (COLUMN_ROWS, COLUMN_COLUMNS) == (32, 8)
    assert column_tiles(8, np.float32) == (WIDE_BYTES > VECTOR_BYTES and not PAIRS)
    assert not column_tiles(4, np.float64) and not column_tiles(8, np.float64)
    assert not column_tiles(16, np.float32) and not column_tiles(7, np.float32)
    for m in (1, 5, 31, 32, 33, 64, 70):
        blocks = -(-m // COLUMN_ROWS)
        for k in (0, 1, 17, 64):
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, COLUMN_COLUMNS)).astype(np.float32)
            add = rng.standard_normal((m, COLUMN_COLUMNS)).astype(np.float32)
            padded = np.full((blocks * COLUMN_ROWS, k), np.nan, np.float32)
            padded[:m] = a
            packed = np.empty((blocks, k, COLUMN_ROWS), np.float32)
            pack_rows(padded, packed)
            np.testing.assert_array_equal(packed, padded.reshape(blocks, COLUMN_ROWS, k).transpose(0, 2, 1))
            _checked_product(lambda add, out: column_product(packed, b, add, out), a, b, add, 1e-5)
    packed = np.zeros((1, 3, COLUMN_ROWS), np.float32)
    b = np.zeros((3, COLUMN_COLUMNS), np.float32)
    with pytest.raises(ValueError, match="float32, b of COLUMN_COLUMNS columns"):
        column_product(packed, b[:, :4], *np.zeros((2, 4, 4), np.float32))
    with pytest.raises(ValueError, match="float32, b of COLUMN_COLUMNS columns"):
        column_product(packed, b, *np.zeros((2, COLUMN_ROWS + 1, COLUMN_COLUMNS), np.float32))
    with pytest.raises(ValueError, match="unit-stride rows"):
        column_product(packed, b, np.zeros((4, 2 * COLUMN_COLUMNS), np.float32)[:, ::2],
                       np.zeros((4, COLUMN_COLUMNS), np.float32))


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_shared_steps_take_the_column_tile_for_8_sequences(monkeypatch, rng):
    """Where ``column_tiles`` says so, the shared-out steps of 8 float32 sequences take ``[U W]``
    packed in blocks of ``COLUMN_ROWS`` rows (the pieces' rows left after their whole blocks in
    one more block, zeros after them; a piece with fewer blocks than the other leaves the last
    unused) and make ``U h + W x + b`` with the column tile: the
    output, the training forward's and the gradients agree with the reference, zeroing the
    packed rows changes the output; elsewhere no such blocks are made."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm
    from bnnsfw.backends.numba._tiles import COLUMN_ROWS, column_tiles

    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: 2)
    for hidden, pieces in ((38, ((0, 16), (16, 38))), (70, ((0, 32), (32, 70)))):
        params = LSTMParameters.random(input_size=3, hidden_size=hidden, seed=7, dtype=np.float32)
        x = rng.standard_normal((6, 8, 3)).astype(np.float32)
        dy = rng.standard_normal((6, 8, hidden)).astype(np.float32)
        with layer_for(params, "numpy") as layer:
            want = _forward_and_backward(layer, x, dy)
        with layer_for(params, "numba") as layer:
            _assert_all_close(_forward_and_backward(layer, x, dy), want, np.float32)
            weights = layer._packed_weights().payload.weights[0][0]
            made = weights.step_tiles
        if not column_tiles(8, np.float32):
            assert all(size != COLUMN_ROWS for _, size in made), made.keys()
            continue
        tiles = made[(2, COLUMN_ROWS)]
        blocks = max(-(-(j1 - j0) // COLUMN_ROWS) for j0, j1 in pieces)
        assert tiles.shape == (2, 4, blocks, hidden + 3, COLUMN_ROWS)
        u_w = np.concatenate([weights.u, weights.wx], axis=1)
        for p, (j0, j1) in enumerate(pieces):
            for g in range(4):
                rows = u_w[g * hidden + j0:g * hidden + j1]
                used = -(-(j1 - j0) // COLUMN_ROWS)
                packed = tiles[p, g, :used].transpose(0, 2, 1).reshape(used * COLUMN_ROWS, hidden + 3)
                np.testing.assert_array_equal(packed[:j1 - j0], rows)
                np.testing.assert_array_equal(packed[j1 - j0:], 0.0)
        with layer_for(params, "numba") as layer:
            layer.apply(x)
            layer._packed_weights().payload.weights[0][0].step_tiles[(2, COLUMN_ROWS)][:] = 0.0
            assert np.abs(layer.apply(x).output - want[0]).max() > 1e-3


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_tile_takes_wide_vectors_only_where_the_code_is_compiled_for_avx512(monkeypatch):
    """The wide panels are 64 bytes when the features Numba compiles for include AVX-512F
    (``NUMBA_CPU_FEATURES`` when set, which can turn it off on a machine that has it), else
    32, the narrow width."""
    from numba.core import config

    from bnnsfw.backends.numba import _tiles as _numba_tiles

    monkeypatch.setattr(config, "CPU_FEATURES", "+avx,+avx2,+fma,-avx512f")
    assert _numba_tiles._wide_bytes() == _numba_tiles.VECTOR_BYTES == 32
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx,+avx2,+fma,+avx512f,+avx512bw")
    assert _numba_tiles._wide_bytes() == 64


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_paired_tiles_serve_where_the_vector_units_are_wide(monkeypatch):
    """The paired tiles serve with 64-byte vectors, except on the processors whose AVX-512 runs
    on 256-bit units (Zen 4, ``znver4``); the processor is the one Numba compiles for
    (``NUMBA_CPU_NAME`` when set, else the machine's)."""
    from numba.core import config

    from bnnsfw.backends.numba import _tiles as _numba_tiles

    assert _numba_tiles.SPLIT_WIDE_CPUS == {"znver4"}
    assert _numba_tiles._pairs(64, "znver5") and _numba_tiles._pairs(64, "sapphirerapids")
    assert not _numba_tiles._pairs(64, "znver4")
    assert not _numba_tiles._pairs(32, "znver5") and not _numba_tiles._pairs(32, "haswell")
    monkeypatch.setattr(config, "CPU_NAME", "znver4")
    assert _numba_tiles._cpu_name() == "znver4"
    monkeypatch.setattr(config, "CPU_NAME", None)
    import llvmlite.binding

    assert _numba_tiles._cpu_name() == llvmlite.binding.get_host_cpu_name()
    assert _numba_tiles.PAIRS == _numba_tiles._pairs(_numba_tiles.WIDE_BYTES, _numba_tiles._cpu_name())


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_paired_tiles_agree_with_a_float64_product_where_products_do_not_take_them(rng):
    """Where the paired tiles do not serve the products (``PAIRS`` false on a machine with
    AVX-512, so ``product`` never reaches them), they are checked here on their own: the rows of
    ``b`` paired (``_pair_rows``) and the product of one narrow and one wide vector's worth of
    columns (``_pair_blocks``: tiles of 12 or 8 rows, then 4, 2 and 1) agree with a float64
    product and write nothing outside ``out``."""
    import numba

    from bnnsfw.backends.numba import _tiles as _numba_tiles

    dtype = np.float32  # the compiled kernels' dtype

    if _numba_tiles.PAIRS or _numba_tiles.WIDE_BYTES != 2 * _numba_tiles.VECTOR_BYTES:
        pytest.skip("the paired tiles serve the products here (or need 64-byte vectors)")

    pair_rows, pair_blocks, wide_bytes = _numba_tiles._pair_rows, _numba_tiles._pair_blocks, 64

    @numba.njit(fastmath=True, error_model="numpy")
    def paired_product(a, b, add, out):  # pragma: no cover - compiled
        pairs = np.empty((b.shape[0] // 2, 2 * b.shape[1]), b.dtype)
        pair_rows(b, pairs, wide_bytes)
        pair_blocks(a[:, 0:a.shape[1]], pairs[:, 0:pairs.shape[1]], add[:, 0:add.shape[1]],
                    out[:, 0:out.shape[1]])

    width = _numba_tiles.lanes(dtype)
    tolerance = 1e-5
    for n in (width, 2 * width):
        for m in (1, 7, 13, 23, 26, 35):
            for k in (2, 40):
                a = rng.standard_normal((m, k)).astype(dtype)
                b = rng.standard_normal((k, n)).astype(dtype)
                add = rng.standard_normal((m, n)).astype(dtype)
                _checked_product(lambda add, out: paired_product(a, b, add, out), a, b, add, tolerance)


_NARROW_TILES = """
import numpy as np
from bnnsfw.backends.numba._tiles import WIDE_BYTES, product
assert WIDE_BYTES == 32, WIDE_BYTES
rng = np.random.default_rng(0)
worst = 0.0
for m, k, n in ((13, 17, 8), (26, 9, 16), (7, 33, 24), (12, 5, 40), (6, 64, 56)):
    a, b, add = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    out = np.empty((m, n), np.float32)
    product(a, b, add, out)
    want = add.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    worst = max(worst, float(np.abs(out - want).max() / (1.0 + np.abs(want).max())))
print(worst)
"""


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_tile_without_avx512_agrees_with_a_float64_product(tmp_path):
    """Compiled for a machine without AVX-512 (a child process with ``NUMBA_CPU_FEATURES``
    that turns it off, and a cache of its own), the tile takes 32-byte panels only and its
    products still agree with float64 ones, on column counts of one, two, three, five and
    seven such vectors."""
    import os
    import subprocess
    import sys

    from numba.core import codegen

    features = ",".join("-" + f[1:] if f.startswith("+avx512") else f
                        for f in codegen.get_host_cpu_features().split(","))
    if "+avx2" not in features.split(","):
        pytest.skip("the machine has no AVX2 to compile the 32-byte tile for")
    env = dict(os.environ, NUMBA_CPU_FEATURES=features, NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _NARROW_TILES], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) < 1e-5

@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("hidden_size", [5, 38])
@pytest.mark.parametrize("batch", [4, 8, 16, 24, 27])
def test_numba_steps_shared_over_threads_agree_with_the_reference(parts, hidden_size, batch, monkeypatch,
                                                                   rng):
    """Each step's units and each product shared out over threads (a thread may get no unit:
    H = 5 over 2 or 3 parts cut at multiples of 16) agree with the reference, forward and
    backward, inference and training, with lengths (one of 0), diagonal peepholes, both
    directions, two layers, initial states, final-state gradients and chunks of steps, in
    float32 (the compiled kernels' dtype). The step products see every kind of column panel:
    27 sequences are two vectors' worth, one vector's and a padded rest, and 4 are one padded
    vector; 16 are whole cache lines, whose gate gradients the steps store past the caches;
    one narrow vector's worth (8) and one wide vector's worth (16) take the paired tile with
    AVX-512, forward where H is even (38) and backward (4H); 24 take packed rows of ``[U W]``
    forward with AVX-512 (each step's product over ``[h; x]``, no projection), a block of 12
    of each gate's rows of a piece of 16 or 22 units (H = 38) and the rest (4 and 10 rows) in
    one more block. The chunks' gradient products are made by one-thread BLAS calls."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    dtype = np.float32

    used = _record_calls(monkeypatch, ("_forward_threads", "_backward_threads"),
                         lambda name, function, args: (name, args[0]))
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: parts)
    monkeypatch.setattr(_numba_lstm, "group_sequences", lambda *args: False)  # groups: below
    monkeypatch.setattr(_numba_lstm, "CHUNK_COLUMNS", 8)
    monkeypatch.setattr(_numba_lstm, "NARROW_CHUNK_COLUMNS", 8)
    monkeypatch.setattr(_numba_lstm, "OVERLAP_COLUMNS", 0)  # the walk shared out too (overlapped: below)
    directions = 2
    params = LSTMParameters.random(input_size=3, hidden_size=hidden_size, num_layers=2,
                                   bidirectional=True, peepholes="diagonal", seed=4, dtype=dtype)
    x = rng.standard_normal((6, batch, 3)).astype(dtype)
    dy = rng.standard_normal((6, batch, directions * hidden_size)).astype(dtype)
    states = tuple(rng.standard_normal((2 * directions, batch, hidden_size)).astype(dtype) for _ in range(2))
    final_grads = tuple(rng.standard_normal((2 * directions, batch, hidden_size)).astype(dtype)
                        for _ in range(2))
    lengths = np.resize([6, 2, 0, 5], batch)
    results = []
    for name in ("numpy", "numba"):
        with layer_for(params, name) as layer:
            inference = layer.apply(x, *states, sequence_lengths=lengths)
            plain = layer.apply(x)
            out = layer.apply(x, *states, training=True, sequence_lengths=lengths)
            grads = layer.apply_backward(x, dy, *states, *final_grads, sequence_lengths=lengths,
                                         training_cache=out.training_cache)
        arrays = [inference.output, inference.hidden, inference.cell, plain.output, plain.hidden, out.output,
                  out.hidden, out.cell, grads.input, grads.hidden, grads.cell]
        results.append(arrays + _gate_gradients(grads))
    # 3 forward calls and 1 backward, each 2 layers × the directions
    assert sorted(used) == ([("_backward_threads", parts)] * 2 * directions
                            + [("_forward_threads", parts)] * 6 * directions)
    _assert_all_close(results[1], results[0], dtype)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_group_sequences_rules():
    """A float32 inference on threads walks groups of sequences when the batch divides into
    one group a thread, each a whole number of the packed products' columns (``packs``)."""
    from bnnsfw.backends.numba._lstm import group_sequences
    from bnnsfw.backends.numba._tiles import packs

    lane = 8  # a 32-byte vector's worth of float32
    assert not group_sequences(1, 4 * lane, np.float32)  # one thread: nothing to share out
    assert not group_sequences(2, 4 * lane + 2, np.float32)  # groups not a whole number of vectors
    assert not group_sequences(3, 4 * lane, np.float32)  # 4 vectors over 3 threads: no even groups
    for parts, batch in ((2, 2 * lane), (2, 4 * lane), (3, 6 * lane), (2, 8 * lane)):
        assert group_sequences(parts, batch, np.float32) == packs(batch // parts, np.float32)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_group_parts_rules(monkeypatch):
    """An inference too small to share its steps out still walks groups of the sequences on the
    threads in force when the call holds ``GROUP_CALL_MIN`` multiply-adds and each group's step
    ``GROUP_STEP_MIN``, where ``group_sequences`` takes the groups; else one thread."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm
    from bnnsfw.backends.numba._lstm import GROUP_CALL_MIN, GROUP_STEP_MIN, group_parts, group_sequences

    f32 = np.float32
    monkeypatch.setattr(_numba_lstm, "_threads_in_force", lambda: 2)
    takes = group_sequences(2, 32, f32)
    assert group_parts(32, 32, 32, 32, f32) == (2 if takes else 1)  # 8.4 M, a group's step 2¹⁷
    assert group_parts(8, 32, 32, 32, f32) == (2 if takes else 1)  # the call 2²¹: the least
    assert 8 * 32 * 4 * 32 * 64 == GROUP_CALL_MIN
    assert group_parts(7, 32, 32, 32, f32) == 1  # the call below
    assert 4 * 16 * 32 * 32 < 2 * GROUP_STEP_MIN
    assert group_parts(64, 32, 16, 16, f32) == 1  # each group's step below
    assert group_parts(32, 30, 32, 32, f32) == (2 if group_sequences(2, 30, f32) else 1)
    monkeypatch.setattr(_numba_lstm, "_threads_in_force", lambda: 1)
    assert group_parts(32, 32, 32, 32, f32) == 1


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_small_steps_of_a_large_inference_walk_groups_of_sequences(monkeypatch, rng):
    """A float32 inference whose steps are too small to share out (``step_parts`` 1) but whose
    call is large enough (``group_parts``) walks groups of the sequences on the threads, at
    every call (the prepared ones too, each layer of two); it agrees with the reference. Its
    training forward stays on the calling thread, and so does every call in a process forked from
    one running GNU OpenMP threads."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    batch, size = 32, 32
    if _numba_lstm.group_parts(32, batch, size, size, np.float32) < 2:
        pytest.skip("fewer than two cheap threads, or no groups of these sequences on this processor")
    assert _numba_lstm.step_parts(size, batch) == 1
    used = _record_calls(monkeypatch, ("_groups_threads", "_forward", "_forward_threads"))
    params = LSTMParameters.random(input_size=size, hidden_size=size, num_layers=2, seed=7, dtype=np.float32)
    x = rng.standard_normal((32, batch, size)).astype(np.float32)
    with layer_for(params, "numpy") as layer:
        want = layer.apply(x).output
    with layer_for(params, "numba") as layer:
        got = [layer.apply(x).output for _ in range(3)]
        assert used == ["_groups_threads"] * 6
        used.clear()
        layer.apply(x, training=True)
        assert used == ["_forward"] * 2
    _assert_all_close(got, [want] * 3, np.float32)
    # a process forked from one running GNU OpenMP threads starts no parallel region
    from bnnsfw.backends.numba import _tiers

    monkeypatch.setattr(_tiers, "forked_from_openmp", lambda: True)
    used.clear()
    with layer_for(params, "numba") as layer:
        got = [layer.apply(x).output for _ in range(3)]
    assert used and set(used) == {"_forward"}  # on the calling thread
    _assert_all_close(got, [want] * 3, np.float32)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("hidden_size", [5, 38])
def test_numba_inference_in_groups_of_sequences_agrees_with_the_reference(parts, hidden_size, monkeypatch,
                                                                           rng):
    """A float32 inference on threads, each walking its own group of the sequences through every
    step (``_groups_threads``), agrees with the reference, without and with diagonal peepholes: two
    layers, both directions, lengths (one of them 0), initial states or none, groups of one or
    two vectors' worth of columns. A training forward keeps each step's units shared out
    (``_forward_threads``), and its backward agrees too."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm
    from bnnsfw.backends.numba._tiles import packs

    dtype = np.float32  # groups serve float32 only (test_numba_group_sequences_rules)
    lane = 8
    grouped_batches = [b for b in (parts * lane, 2 * parts * lane) if packs(b // parts, dtype)]
    if not grouped_batches:
        pytest.skip("no group of these columns takes packed products on this processor")
    used = _record_calls(monkeypatch, ("_groups_threads", "_forward_threads"))
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: parts)
    directions = 2
    calls = 2 * directions  # forward calls a layer call makes: one per layer and direction
    for batch in grouped_batches:
        x = rng.standard_normal((6, batch, 3)).astype(dtype)
        dy = rng.standard_normal((6, batch, directions * hidden_size)).astype(dtype)
        states = tuple(rng.standard_normal((2 * directions, batch, hidden_size)).astype(dtype)
                       for _ in range(2))
        lengths = np.resize([6, 2, 0, 5], batch)
        for peepholes in (None, "diagonal"):
            params = LSTMParameters.random(input_size=3, hidden_size=hidden_size, num_layers=2, seed=5,
                                           bidirectional=True, peepholes=peepholes, dtype=dtype)
            results = []
            for name in ("numpy", "numba"):
                used.clear()
                with layer_for(params, name) as layer:
                    given = layer.apply(x, *states, sequence_lengths=lengths)
                    plain = layer.apply(x)
                    out = layer.apply(x, *states, training=True, sequence_lengths=lengths)
                    grads = layer.apply_backward(x, dy, *states, sequence_lengths=lengths,
                                                 training_cache=out.training_cache)
                if name == "numba":
                    assert used == ["_groups_threads"] * 2 * calls + ["_forward_threads"] * calls, used
                results.append([given.output, given.hidden, given.cell, plain.output, plain.hidden,
                                plain.cell, out.output, out.hidden, out.cell, grads.input]
                               + _gate_gradients(grads))
            _assert_all_close(results[1], results[0], dtype)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize(("hidden_size", "batch", "seq_len"), [(5, 4, 9), (38, 16, 17), (20, 27, 8)])
def test_numba_overlapped_backward_agrees_with_the_reference(hidden_size, batch, seq_len, monkeypatch, rng):
    """With two threads and small steps the backward walks the steps on one thread while the
    other makes each walked piece's products (``_backward_overlapped``), with the split
    ``overlap_pieces`` gives; the gradients agree with the reference, with lengths (one of 0),
    diagonal peepholes, two layers, initial states, final-state gradients, with and without
    an output gradient, pieces of one step and longer, of unequal lengths. Two backward calls
    from one cache give the same bits."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    dtype = np.float32

    used = []
    original = _numba_lstm._backward_overlapped

    def spy(*args):
        used.append(tuple(_argument(original, args, "bounds")))
        return original(*args)

    monkeypatch.setattr(_numba_lstm, "_backward_overlapped", spy)
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: 2)
    params = LSTMParameters.random(input_size=3, hidden_size=hidden_size, num_layers=2, peepholes="diagonal",
                                   seed=7, dtype=dtype)
    x = rng.standard_normal((seq_len, batch, 3)).astype(dtype)
    dy = rng.standard_normal((seq_len, batch, hidden_size)).astype(dtype)
    states = tuple(rng.standard_normal((2, batch, hidden_size)).astype(dtype) for _ in range(2))
    final_grads = tuple(rng.standard_normal((2, batch, hidden_size)).astype(dtype) for _ in range(2))
    lengths = np.resize([seq_len, 2, 0, seq_len - 1], batch)
    results = []
    for name in ("numpy", "numba"):
        arrays = []
        with layer_for(params, name) as layer:
            out = layer.apply(x, *states, training=True, sequence_lengths=lengths)
            for output_gradient in (dy, None):
                grads = layer.apply_backward(x, output_gradient, *states, *final_grads,
                                             sequence_lengths=lengths, training_cache=out.training_cache)
                arrays += [grads.input, grads.hidden, grads.cell] + _gate_gradients(grads)
            if name == "numba":
                again = layer.apply_backward(x, None, *states, *final_grads, sequence_lengths=lengths,
                                             training_cache=out.training_cache)
                for got, first in zip([again.input, again.hidden, again.cell] + _gate_gradients(again),
                                      arrays[len(arrays) // 2:]):
                    np.testing.assert_array_equal(got, first)
        results.append(arrays)
    lower = tuple(_numba_lstm.overlap_pieces(seq_len, hidden_size, 3))
    upper = tuple(_numba_lstm.overlap_pieces(seq_len, hidden_size, hidden_size))
    assert used == [upper, lower] * 3  # 3 backward calls, the upper layer first
    assert len(set(np.diff(lower))) > 1  # pieces of unequal lengths
    _assert_all_close(results[1], results[0], dtype)


def test_numba_overlaps_the_backward_of_small_steps_on_two_threads():
    """The overlapped backward serves two threads, steps below ``OVERLAP_STEP_MAX``
    (M's 2²⁰ multiply-adds; not the long row's 2²¹ or L's 2²³), at most ``OVERLAP_COLUMNS``
    columns (one chunk), and at least two pieces of steps. The pieces walked first are 2, 4, 8…
    steps long, the rest at most ``⌈T / 8⌉``; the walking thread takes the products of the last
    piece walked, ``(2 + (r − 1)·T + 3) / 2r`` steps, ``r`` a step's products against its
    walk."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    assert _numba_lstm.overlaps(2, 50, 16, 128)  # M
    assert _numba_lstm.overlaps(2, 32, 32, 64)  # 1 024 columns: one chunk
    assert not _numba_lstm.overlaps(2, 40, 32, 64)  # 1 280 columns
    assert not _numba_lstm.overlaps(3, 50, 16, 128)  # three threads: shared out
    assert not _numba_lstm.overlaps(2, 64, 32, 256)  # L
    assert not _numba_lstm.overlaps(2, 100, 8, 256)  # the long row's steps
    assert not _numba_lstm.overlaps(2, 200, 16, 128)  # 3 200 columns
    assert not _numba_lstm.overlaps(2, 1, 16, 128)  # one piece

    def pieces(seq_len: int, hidden_size: int, input_size: int) -> list[int]:
        """The pieces' lengths in the order they are walked (the walker's last)."""
        bounds = _numba_lstm.overlap_pieces(seq_len, hidden_size, input_size)
        assert bounds[0] == 0 and bounds[-1] == seq_len and not bounds.flags.writeable
        return np.diff(bounds)[::-1].tolist()

    assert pieces(50, 128, 128) == [2, 4, 6, 6, 6, 6, 6, 14]  # M: r = 2, (2 + 50 + 3) / 4 = 13.75
    assert pieces(50, 128, 1) == [2, 4, 7, 6, 6, 6, 6, 6, 6, 1]  # products cheaper than the walk
    assert pieces(80, 64, 512) == [2, 4, 8, 10, 10, 9, 37]  # r = 1088/96: 836/22.7 = 36.9
    assert pieces(2, 64, 64) == [1, 1]  # pieces of one step
    assert pieces(17, 38, 3) == [2, 3, 3, 3, 3, 2, 1]  # three steps at most


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("lines", [1, 2])
def test_numba_gate_gradients_stored_past_the_caches_agree_with_the_reference(lines, monkeypatch, rng):
    """With rows of whole cache lines (16 or 32 float32 sequences), each
    step stores its gate gradients into the chunk's columns past the caches; on one thread
    (the steps and BLAS) and shared out over two, over several chunks, with lengths, the
    gradients agree with the reference. The scratch those columns go to starts each row on
    a cache line, rows padded apart."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm
    from bnnsfw.backends.numba._stream import LINE_BYTES

    dtype = np.float32  # the compiled kernels' dtype

    batch = lines * LINE_BYTES // np.dtype(dtype).itemsize

    class Scratch:
        def array(self, name, shape, dtype):
            return np.empty(shape, dtype)[1:]  # an unaligned start

    columns = _numba_lstm._aligned(Scratch(), "d_gates", (5, 3 * batch), np.dtype(dtype))
    assert columns.shape == (5, 3 * batch) and columns.ctypes.data % LINE_BYTES == 0
    assert columns.strides[0] == (3 * batch + _numba_lstm.ROW_PAD) * columns.itemsize
    monkeypatch.setattr(_numba_lstm, "CHUNK_COLUMNS", 2 * batch)
    monkeypatch.setattr(_numba_lstm, "NARROW_CHUNK_COLUMNS", 2 * batch)
    params = LSTMParameters.random(input_size=3, hidden_size=20, num_layers=1, seed=5, dtype=dtype)
    x = rng.standard_normal((5, batch, 3)).astype(dtype)
    dy = rng.standard_normal((5, batch, 20)).astype(dtype)
    lengths = np.resize([5, 2, 0, 4], batch)
    for parts in (1, 2):
        monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch, parts=parts: parts)
        results = []
        for name in ("numpy", "numba"):
            with layer_for(params, name) as layer:
                out = layer.apply(x, training=True, sequence_lengths=lengths)
                grads = layer.apply_backward(x, dy, sequence_lengths=lengths,
                                             training_cache=out.training_cache)
            results.append([grads.input, grads.hidden, grads.cell] + _gate_gradients(grads))
        _assert_all_close(results[1], results[0], dtype)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_fused_passes_agree_in_vector_loops_and_their_remainders(rng):
    """The fused passes, compiled with the kernels' own options and vector width, agree
    whether the vectorized loop or its scalar remainder computes an element (which of the two
    does depends on the run's length, a thread's run of units): the forward pass (training and
    inference) and the backward pass over 4 099 float32 elements at once, against one element
    at a time, within rtol 1e-5 and atol 1e-6, about a hundred times float32's rounding, as two
    loops computing the same formulas must. Not to the bit: two code paths promise no more
    (``docs/conventions.md``); with every fast-math flag LLVM divided by a reciprocal estimate
    in the vector loop only (``arcp``) and, on one machine, reordered the backward's products
    in one loop only (``reassoc``), a difference in the last bit for 1.5 % and 2.8 % of the
    elements. ``FAST_MATH`` leaves both out, so that a call's bits do not follow its thread
    count; the bits of one call repeated are checked elsewhere
    (``test_same_inputs_give_bitwise_the_same_results_on_one_backend``)."""
    import numba

    from bnnsfw.backends.numba import _lstm_cell as kernels
    from bnnsfw.backends.numba._lstm_forward import _recur
    from bnnsfw.backends.numba._tiles import wide_loops

    options = {k: v for k, v in _recur.targetoptions.items() if k in ("fastmath", "error_model")}

    @numba.njit(**options)
    def passes(z, out, lo, hi):
        wide_loops()
        zg, zf, zi, zo, c_prev, pg, pf, pi, po, d_h, d_c = [z[k, lo:hi] for k in range(11)]
        g, f, i, o, a, cell, hid = [out[k, lo:hi] for k in range(7)]
        kernels._gate_run(zg, zf, zi, zo, c_prev, pg, pf, pi, po, g, f, i, o, a, cell, hid)
        kernels._state_run(zg, zf, zi, zo, c_prev, out[7, lo:hi], out[8, lo:hi])
        dz_g, dz_f, dz_i, dz_o = [out[9 + k, lo:hi] for k in range(4)]
        kernels._cell_run(c_prev, g, f, i, o, a, pg, pf, pi, po, d_h, d_c, dz_g, dz_f, dz_i, dz_o)

    m = 4099
    z = (rng.standard_normal((11, m)) * 3).astype(np.float32)
    z[5:9] *= np.float32(0.1)  # peepholes
    whole, z_whole = np.zeros((13, m), np.float32), z.copy()
    passes(z_whole, whole, 0, m)
    one_by_one, z_one = np.zeros((13, m), np.float32), z.copy()
    for e in range(m):
        passes(z_one, one_by_one, e, e + 1)
    assert np.isfinite(whole).all() and np.abs(whole[6]).max() > 0.5
    np.testing.assert_allclose(whole, one_by_one, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z_whole[10], z_one[10], rtol=1e-5, atol=1e-6)  # the cell gradient carried back


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_projection_rows_are_padded_apart_and_agree(monkeypatch, rng):
    """The chunk's input projection, a run of whose every row each step reads, is a contiguous
    array with ``ROW_PAD`` more columns than the chunk's (rows of a multiple of 4 KiB would put
    those runs in one set of the level-1 cache); over several chunks and a last short one, on
    one thread and shared out over two, inference and training agree with the reference (3
    sequences, which no tile takes packed rows for: the shared-out steps read the projection)."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm
    from bnnsfw.backends.numba._tiles import packs

    batch, dtype = 3, np.float32
    assert not packs(batch, dtype)
    monkeypatch.setattr(_numba_lstm, "CHUNK_COLUMNS", 3 * batch)  # chunks of 3 steps: 3, 3, 1
    monkeypatch.setattr(_numba_lstm, "NARROW_CHUNK_COLUMNS", 3 * batch)
    seen: list[tuple[tuple[int, ...], bool]] = []
    for name in ("_forward", "_forward_threads"):
        kernel = getattr(_numba_lstm, name)

        def recorded(*args, kernel=kernel):
            projection = _argument(kernel, args, "projection")
            seen.append((projection.shape, projection.flags.c_contiguous))
            return kernel(*args)

        monkeypatch.setattr(_numba_lstm, name, recorded)
    params = LSTMParameters.random(input_size=3, hidden_size=20, num_layers=1, seed=6, dtype=dtype)
    x = rng.standard_normal((7, batch, 3)).astype(dtype)
    dy = rng.standard_normal((7, batch, 20)).astype(dtype)
    for parts in (1, 2):
        monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch, parts=parts: parts)
        results = []
        for name in ("numpy", "numba"):
            with layer_for(params, name) as layer:
                results.append(_forward_and_backward(layer, x, dy))
        _assert_all_close(results[1], results[0], dtype)
    assert len(seen) == 4 and set(seen) == {((80, 3 * batch + _numba_lstm.ROW_PAD), True)}


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_narrow_forwards_project_fewer_columns_at_a_time(monkeypatch, rng):
    """A forward on the calling thread whose steps are narrow (fewer sequences than a vector
    holds) projects ``NARROW_CHUNK_COLUMNS`` columns at a time, so that the projection its steps
    read a column of each row from stays small; wider steps, and narrow ones shared out over
    threads, ``CHUNK_COLUMNS``. Over several narrow chunks and a short last one, inference and
    training agree with the reference (float32: 4 sequences narrow, 8 not; 300 steps)."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    assert _numba_lstm.narrow(7, np.float32) and not _numba_lstm.narrow(8, np.float32)
    assert _numba_lstm.narrow(3, np.float64) and not _numba_lstm.narrow(4, np.float64)
    seen: list[int] = []
    kernel = _numba_lstm._forward

    def recorded(*args):
        seen.append(_argument(kernel, args, "projection").shape[1] - _numba_lstm.ROW_PAD)
        return kernel(*args)

    monkeypatch.setattr(_numba_lstm, "_forward", recorded)
    params = LSTMParameters.random(input_size=3, hidden_size=5, seed=4, dtype=np.float32)
    for batch in (4, 8):
        x = rng.standard_normal((300, batch, 3)).astype(np.float32)
        dy = rng.standard_normal((300, batch, 5)).astype(np.float32)
        seen.clear()
        results = []
        for name in ("numpy", "numba"):
            with layer_for(params, name) as layer:
                results.append(_forward_and_backward(layer, x, dy))
        _assert_all_close(results[1], results[0], np.float32)
        columns = _numba_lstm.NARROW_CHUNK_COLUMNS if batch == 4 else _numba_lstm.CHUNK_COLUMNS
        assert seen and set(seen) == {columns // batch * batch}
    # shared out over two threads, narrow steps keep the wider chunks
    threaded = _numba_lstm._forward_threads

    def recorded_threads(*args):
        seen.append(_argument(threaded, args, "projection").shape[1] - _numba_lstm.ROW_PAD)
        return threaded(*args)

    monkeypatch.setattr(_numba_lstm, "_forward_threads", recorded_threads)
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: 2)
    seen.clear()
    x = rng.standard_normal((300, 4, 3)).astype(np.float32)
    with layer_for(params, "numpy") as reference, layer_for(params, "numba") as layer:
        _assert_all_close([layer.apply(x).output], [reference.apply(x).output], np.float32)
    assert set(seen) == {_numba_lstm.CHUNK_COLUMNS}


def _compiled_signatures() -> dict[str, int]:
    """How many signatures each compiled LSTM kernel has been compiled for in this process."""
    from bnnsfw.backends.numba import _cells as _numba_cells
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    return {f"{module.__name__}.{name}": len(value.signatures)
            for module in (_numba_lstm, _numba_cells) for name, value in vars(module).items()
            if hasattr(value, "signatures") and hasattr(value, "py_func")}


def _read_only(a: np.ndarray) -> np.ndarray:
    copy = a.copy()
    copy.flags.writeable = False
    return copy


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("hidden_activation", [None, "relu"])
def test_numba_read_only_inputs_run_the_kernels_compiled_for_writable_ones(hidden_activation, rng):
    """Read-only inputs (a memory-mapped file opened for reading, an array over ``bytes``) reach
    the kernels compiled for writable ones, for the default cells and the others: forward,
    backward, inference (prepared from the second call on, as a stream's steps are) and the
    training cache read back, with initial states, lengths and final-state gradients, two
    layers. No kernel is compiled for them (each read-only flag was a signature of its own:
    the demo's model compiled its training step again, 27 s of CPU), and the results agree
    with those of the writable arrays."""
    options = {} if hidden_activation is None else {"hidden_activation": A.relu()}
    params = LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, seed=8, dtype=np.float32,
                                   **options)
    x = rng.standard_normal((6, 4, 3)).astype(np.float32)
    dy = rng.standard_normal((6, 4, 5)).astype(np.float32)
    states = tuple(rng.standard_normal((2, 4, 5)).astype(np.float32) for _ in range(2))
    final_grads = tuple(rng.standard_normal((2, 4, 5)).astype(np.float32) for _ in range(2))
    lengths = np.array([6, 2, 0, 5])

    def run(layer, x, dy, states, final_grads, lengths, read_only_cache=False):
        inferred = [layer.apply(x, *states).output for _ in range(3)]
        out = layer.apply(x, *states, training=True, sequence_lengths=lengths)
        cache = _read_only(out.training_cache) if read_only_cache else out.training_cache
        grads = layer.apply_backward(x, dy, *states, *final_grads, sequence_lengths=lengths,
                                     training_cache=cache)
        return inferred + [out.output, grads.input, grads.hidden, grads.cell] + _gate_gradients(grads)

    with layer_for(params, "numba") as layer:
        want = run(layer, x, dy, states, final_grads, lengths)
        compiled = _compiled_signatures()
        got = run(layer, _read_only(x), _read_only(dy), tuple(map(_read_only, states)),
                  tuple(map(_read_only, final_grads)), _read_only(lengths), read_only_cache=True)
    assert _compiled_signatures() == compiled
    _assert_all_close(got, want, np.float32)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("peepholes", [None, "diagonal"])
def test_numba_runs_the_two_directions_one_after_the_other_and_agrees(peepholes, monkeypatch, rng):
    """With two threads for the steps, each layer of a bidirectional model runs its two
    directions one after the other on the calling thread, each step's units shared out over
    the threads (both directions at the same time, one a thread, made M-2L-bi slower
    forward and no faster a training step); forward, backward, inference and training agree
    with the reference, with lengths (one of 0), initial states, final-state gradients, two
    layers, chunks of steps and 11 sequences (the tile product)."""
    import threading

    from bnnsfw.backends.numba import _lstm as _numba_lstm

    seen = _record_calls(monkeypatch, ("_forward", "_backward", "_forward_threads", "_backward_threads",
                                       "_backward_overlapped"),
                         lambda name, function, args: (name, bool(_argument(function, args, "reverse")),
                                                       threading.get_ident()))
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: 2)
    monkeypatch.setattr(_numba_lstm, "CHUNK_COLUMNS", 24)
    monkeypatch.setattr(_numba_lstm, "NARROW_CHUNK_COLUMNS", 24)
    batch, hidden, dtype = 11, 21, np.float32
    params = LSTMParameters.random(input_size=3, hidden_size=hidden, num_layers=2, bidirectional=True,
                                   peepholes=peepholes, seed=6, dtype=dtype)
    x = rng.standard_normal((7, batch, 3)).astype(dtype)
    dy = rng.standard_normal((7, batch, 2 * hidden)).astype(dtype)
    states = tuple(rng.standard_normal((4, batch, hidden)).astype(dtype) for _ in range(2))
    final_grads = tuple(rng.standard_normal((4, batch, hidden)).astype(dtype) for _ in range(2))
    lengths = np.resize([7, 3, 0, 6], batch)
    results = []
    for name in ("numpy", "numba"):
        seen.clear()
        with layer_for(params, name) as layer:
            inference = layer.apply(x, *states, sequence_lengths=lengths)
            out = layer.apply(x, *states, training=True, sequence_lengths=lengths)
            grads = layer.apply_backward(x, dy, *states, *final_grads, sequence_lengths=lengths,
                                         training_cache=out.training_cache)
        if name == "numba":  # 2 forward calls and 1 backward, 2 layers each, on two threads (the
            # backward of these small steps overlapped)
            kernels = ["_backward_overlapped"] * 4 + ["_forward_threads"] * 8
            assert sorted(k for k, _, _ in seen) == sorted(kernels)
            caller = threading.get_ident()
            assert {(reverse, ident == caller) for _, reverse, ident in seen} == {(False, True), (True, True)}
        arrays = [inference.output, inference.hidden, inference.cell, out.output, out.hidden, out.cell,
                  grads.input, grads.hidden, grads.cell]
        results.append(arrays + _gate_gradients(grads))
    _assert_all_close(results[1], results[0], dtype)


_ON_ONE_THREAD = """
import numba, numpy as np
import bnnsfw as bf
from bnnsfw.backends.numba import _lstm as _numba_lstm
{force}
numba.set_num_threads(1)
params = bf.LSTMParameters.random(input_size=3, seed=3, dtype=np.float32, {shape})
x = np.random.default_rng(0).standard_normal((8, 9, 3)).astype(np.float32)
outputs = []
for name in ("numpy", "numba"):
    with bf.LSTMLayer(params, bf.FilterParameters(backend=name)) as layer:
        out = layer.apply(x, training=True)
        grads = layer.apply_backward(x, np.cos(out.output), training_cache=out.training_cache)
        again = layer.apply(x).output  # inference: the other forward kernels
        outputs.append(np.concatenate([out.output.ravel(), grads.input.ravel(), again.ravel()]))
print(float(np.abs(outputs[0] - outputs[1]).max()))
"""


def _difference_on_one_thread(force: str, shape: str) -> float:
    """A training step and an inference of the numba backend against the reference in a child
    process where Numba has one thread and ``force`` takes a parallel path anyway (a wait that
    never ends would hang it: the timeout fails the test); the largest difference."""
    import subprocess
    import sys

    child = _ON_ONE_THREAD.format(force=force, shape=shape)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_shared_steps_end_on_one_thread():
    """A step's pieces go to whichever thread claims them first, so the parallel loop that
    runs a chunk's steps ends when a single thread runs every iteration: the first iteration
    takes every piece, and no thread waits for a piece nobody has taken."""
    force = "_numba_lstm.step_parts = lambda hidden_size, batch: 2"
    assert _difference_on_one_thread(force, "hidden_size=40") < 1e-5  # float32 reference


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_claims_and_counts_are_atomic_across_threads():
    """:func:`claim` gives each flag to exactly one of the threads racing for it, and
    :func:`count_up` loses no increment. Every round the two threads meet (each counts up,
    then waits for the other's count) and race for the round's flags at the same moment: a
    claim made of a plain load and store gave thousands of flags to both. In a child process
    (a meeting that never ends, as after a lost increment, fails it by the timeout), skipped
    when the parallel loop's two iterations run on one thread."""
    import subprocess
    import sys

    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two Numba threads")
    done = subprocess.run([sys.executable, "-c", _RACE], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    if done.stdout.split() == ["one", "thread"]:
        pytest.skip("the parallel loop's two iterations ran on one thread")
    assert done.stdout.split() == ["40000", "True", "0"]


_RACE = """
import numba, numpy as np
from bnnsfw.backends.numba._progress import claim, count_up, wait_for

@numba.njit(parallel=True)
def race(flags, counter, owners, rounds):
    for p in numba.prange(2):
        for r in range(rounds):
            count_up(counter)
            wait_for(counter, 2 * (r + 1))
            for i in range(r * 8, r * 8 + 8):
                if claim(flags, i):
                    owners[p, i] += 1

@numba.njit(parallel=True)
def threads(ids):
    for p in numba.prange(2):
        ids[p] = numba.get_thread_id()

numba.set_num_threads(2)
ids = np.zeros(2, np.int64)
threads(ids)
if ids[0] == ids[1]:
    print("one thread")
    raise SystemExit
rounds = 20000
flags = np.zeros(8 * rounds, np.int64)
counter = np.zeros(1, np.int64)
owners = np.zeros((2, flags.size), np.int64)
race(flags, counter, owners, rounds)
print(counter[0], bool((flags == 1).all()), int((owners.sum(axis=0) != 1).sum()))
"""


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_packs_the_step_weights_in_wide_rows():
    """The numba backend's packing keeps ``U`` and ``Uᵀ`` once more as the first columns of
    contiguous arrays with ``ROW_PAD`` more columns of zeros, starting on a cache line, for every
    layer and direction (NumPy alone puts an array on a line one time in four)."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    for dtype in (np.float32, np.float64):
        for rows, columns in ((1, 1), (4, 3), (20, 5), (256, 64)):
            narrow = np.arange(rows * columns, dtype=dtype).reshape(rows, columns) + 1
            wide = _numba_lstm.wide_rows(narrow)
            assert wide.dtype == dtype and wide.flags.c_contiguous and wide.ctypes.data % 64 == 0
            assert wide.shape == (rows, columns + _numba_lstm.ROW_PAD)
            np.testing.assert_array_equal(wide[:, :columns], narrow)
            assert not wide[:, columns:].any()

    params = LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, bidirectional=True, seed=1)
    with layer_for(params, "numba") as layer:
        payload = layer._packed_weights().payload
    assert len(payload.weights) == 2 and all(len(row) == 2 for row in payload.weights)
    for row in payload.weights:
        for w in row:
            for wide, narrow in ((w.u_wide, w.u), (w.u_t_wide, w.u_t)):
                rows, columns = narrow.shape
                assert wide.flags.c_contiguous and wide.shape == (rows, columns + _numba_lstm.ROW_PAD)
                assert wide.ctypes.data % 64 == 0
                np.testing.assert_array_equal(wide[:, :columns], narrow)
                assert not wide[:, columns:].any()


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_cells_without_peepholes_share_zeros_nothing_writes(rng):
    """Cells without diagonal peepholes take one shared zero array of each shape for them
    (made once); forward and backward, on one thread and shared out over threads, leave it
    zero."""
    from bnnsfw.backends.numba import _lstm_operands

    for hidden, batch in ((7, 3), (48, 64)):  # one thread; the steps shared out over threads
        params = LSTMParameters.random(input_size=3, hidden_size=hidden, num_layers=2, seed=2)
        x = rng.standard_normal((5, batch, 3)).astype(np.float32)
        with layer_for(params, "numba") as layer:
            out = layer.apply(x, training=True)
            layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
            layer.apply(x)
        zeros = _lstm_operands._no_peepholes(hidden, batch, np.dtype(np.float32))
        assert zeros is _lstm_operands._no_peepholes(hidden, batch, np.dtype(np.float32))
        assert zeros.shape == (4, hidden * batch) and not zeros.any()


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_steps_shared_over_threads_from_several_caller_threads(monkeypatch, rng):
    """Layers whose steps are shared out over Numba's threads, called from three Python threads
    at once (each launching its own parallel regions, each holding BLAS to one thread), all
    train to the reference's results."""
    import threading

    from bnnsfw.backends.numba import _lstm as _numba_lstm

    used = _record_calls(monkeypatch, ("_forward_threads", "_backward_threads", "_backward_overlapped"))
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: 2)
    params = LSTMParameters.random(input_size=4, hidden_size=20, seed=6, dtype=np.float32)
    x = rng.standard_normal((9, 5, 4)).astype(np.float32)
    dy = rng.standard_normal((9, 5, 20)).astype(np.float32)
    with layer_for(params, "numpy") as reference:
        out = reference.apply(x, training=True)
        want = reference.apply_backward(x, dy, training_cache=out.training_cache).input
    results: list[np.ndarray] = []

    def work() -> None:
        with layer_for(params, "numba") as layer:
            for _ in range(20):
                out = layer.apply(x, training=True)
                results.append(layer.apply_backward(x, dy, training_cache=out.training_cache).input)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 60 and used.count("_forward_threads") == 60
    _assert_all_close(results, [want] * 60, np.float32)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_backward_takes_its_columns_in_one_layout_for_every_hidden_size(rng):
    """The backward's scratch columns (a row a unit, rows padded apart) have two rows at least,
    so that one unit's (H = 1) is no contiguous view, which Numba would compile the backward
    for once more; the gradients agree with the reference for H = 1 and 2."""
    import inspect

    from bnnsfw.backends.numba import _lstm_backward

    x = rng.standard_normal((5, 3, 2)).astype(np.float32)
    for hidden_size in (1, 2):
        params = LSTMParameters.random(input_size=2, hidden_size=hidden_size, seed=2, dtype=np.float32)
        dy = rng.standard_normal((5, 3, hidden_size)).astype(np.float32)
        results = []
        for backend in ("numba", "numpy"):
            with layer_for(params, backend) as layer:
                out = layer.apply(x, training=True)
                grads = layer.apply_backward(x, dy, training_cache=out.training_cache)
                results.append([grads.input, grads.hidden, grads.cell] + _gate_gradients(grads))
        _assert_all_close(*results, np.float32)
    kernel = _lstm_backward._backward
    position = list(inspect.signature(kernel.py_func).parameters).index("columns")
    layouts = {signature[position].layout for signature in kernel.signatures}
    assert layouts == {"A"}, layouts


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("parts", [1, 2])
def test_numba_compiles_one_kernel_for_every_output_layout(monkeypatch, rng, parts):
    """A contiguous output, a bidirectional layer's strided halves and an absent output
    gradient (only the final states carry one) reach the same compiled kernels: each takes its
    output, or output gradient, as a 4-D view of layout 'A' (``_numba_lstm._any_layout``),
    never as a layout of its own (on two threads the backward is overlapped). On one thread,
    one sequence's forward kernel (``_forward_one``) too. The results agree with the reference,
    the absent gradient's case included."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm
    from bnnsfw.backends.numba import _lstm_backward, _lstm_forward

    dtype = np.float32

    used = _record_calls(monkeypatch, ("_backward", "_backward_threads", "_backward_overlapped"),
                         lambda name, function, args: name)
    forwards = _record_calls(monkeypatch, ("_forward", "_forward_one"), lambda name, function, args: name)
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: parts)
    for bidirectional, batch in itertools.product((False, True), (3, 1) if parts == 1 else (3,)):
        x = rng.standard_normal((5, batch, 4)).astype(dtype)
        params = LSTMParameters.random(input_size=4, hidden_size=6, bidirectional=bidirectional, seed=3,
                                       dtype=dtype)
        d = 2 if bidirectional else 1
        dy = rng.standard_normal((5, batch, d * 6)).astype(dtype)
        dh = rng.standard_normal((d, batch, 6)).astype(dtype)
        for output_gradient in (dy, None):
            results = []
            for backend in ("numba", "numpy"):
                with layer_for(params, backend) as layer:
                    out = layer.apply(x, training=True)
                    grads = layer.apply_backward(x, output_gradient, hidden_gradient=dh,
                                                 training_cache=out.training_cache)
                    results.append((out.output, grads.input, grads.hidden))
            _assert_all_close(list(results[0]), list(results[1]), dtype)
    assert set(used) == {"_backward" if parts == 1 else "_backward_overlapped"}, used
    assert set(forwards) == ({"_forward", "_forward_one"} if parts == 1 else set()), forwards
    kernels = {_lstm_forward._forward: "outs", _lstm_forward._forward_one: "outs",
               _lstm_forward._forward_threads: "outs", _lstm_backward._backward: "dys",
               _lstm_backward._backward_threads: "dys", _lstm_backward._backward_overlapped: "dys"}
    for kernel, name in kernels.items():
        position = list(inspect.signature(kernel.py_func).parameters).index(name)
        for signature in kernel.signatures:
            kind = signature[position]
            assert (kind.ndim, kind.layout) == (4, "A"), (kernel.py_func.__name__, kind)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("parts", [1, 2])
def test_numba_inference_without_peepholes_writes_no_cache_and_agrees(parts, monkeypatch, rng):
    """Inference of a cell without peepholes takes the light pass (no cache rows), on the
    calling thread and shared out over threads; it agrees with the reference and with the
    same layer's training forward (lengths, one of them 0, initial states, two layers, chunks
    of steps; both directions).
    Training, and inference with peepholes, take the full pass."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    dtype = np.float32

    calls = _record_calls(monkeypatch, ("_forward", "_forward_threads"),
                          lambda name, function, args: (name, bool(_argument(function, args, "light"))))
    monkeypatch.setattr(_numba_lstm, "step_parts", lambda hidden_size, batch: parts)
    monkeypatch.setattr(_numba_lstm, "CHUNK_COLUMNS", 12)
    monkeypatch.setattr(_numba_lstm, "NARROW_CHUNK_COLUMNS", 12)
    kernel = "_forward" if parts == 1 else "_forward_threads"
    directions = 2
    calls_per_apply = 2 * directions  # two layers
    batch, hidden = 11, 37  # 11 sequences: the tile product (a vector and a padded rest)
    x = rng.standard_normal((7, batch, 3)).astype(dtype)
    states = tuple(rng.standard_normal((2 * directions, batch, hidden)).astype(dtype) for _ in range(2))
    lengths = np.resize([7, 3, 0, 5], batch)
    for peepholes, light in ((None, True), ("diagonal", False)):
        params = LSTMParameters.random(input_size=3, hidden_size=hidden, num_layers=2,
                                       bidirectional=True, peepholes=peepholes, seed=5,
                                       dtype=dtype)
        results = []
        for name in ("numpy", "numba"):
            calls.clear()
            with layer_for(params, name) as layer:
                inference = layer.apply(x, *states, sequence_lengths=lengths)
                assert calls == ([(kernel, light)] * calls_per_apply if name == "numba" else [])
                trained = layer.apply(x, *states, training=True, sequence_lengths=lengths)
                assert calls == ([(kernel, light)] * calls_per_apply + [(kernel, False)] * calls_per_apply
                                 if name == "numba" else [])
            results.append([inference.output, inference.hidden, inference.cell, trained.output])
        _assert_all_close(results[1], results[0], dtype)
        _assert_all_close(results[1][:1], results[1][3:], dtype)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_shares_steps_over_threads_only_where_it_pays():
    """Threads share a step only for several sequences and a step product of at least
    ``THREADED_STEP_MIN`` multiply-adds, and only as many as Numba has."""
    import numba

    from bnnsfw.backends.numba import _lstm as _numba_lstm

    threads = numba.get_num_threads()
    assert _numba_lstm.step_parts(64, 1) == 1  # one sequence: one thread
    assert _numba_lstm.step_parts(32, 32) == 1  # the demo's model: 2**17 multiply-adds
    big = _numba_lstm.step_parts(256, 8)  # the long row: 2**21
    cheap = threads > 1 and _numba_lstm._cheap_parallel_regions()
    assert big == (threads if cheap else 1)
    from bnnsfw._threadpool import blas_limit

    with blas_limit(1):  # a layer's n_threads = 1 holds this while it computes
        assert _numba_lstm.step_parts(256, 8) == 1


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("seq_len, chunk", [(7, 3), (6, 6), (5, 1)])
def test_numba_shared_steps_ask_for_the_columns_the_next_step_reads(seq_len, chunk, reverse):
    """Each shared-out forward step asks for the projection columns that the step after it in
    the same chunk reads (``_following``, which ``_steps_threads`` hands to ``_forward_part``):
    for every walking step of every chunk, forward in time and reversed, the columns are those
    of the next walking step's time step, inside the chunk's; the chunk's last step asks for
    none (the next chunk's projection is not made yet)."""
    from bnnsfw.backends.numba._lstm_cell import _chunk
    from bnnsfw.backends.numba._lstm_forward import _following

    batch = 4
    for q in range(-(-seq_len // chunk)):
        k_begin, k_end, first_t = _chunk(seq_len, chunk, q, reverse)
        for k in range(k_begin, k_end):
            t = seq_len - 1 - k if reverse else k
            got = _following(k, k_end, t, first_t, batch, reverse)
            if k == k_end - 1:
                assert got == -1
                continue
            t_next = seq_len - 2 - k if reverse else k + 1  # walking step k + 1
            assert got == (t_next - first_t) * batch
            assert 0 <= got <= (k_end - k_begin - 1) * batch


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_layer_with_one_thread_keeps_its_steps_on_the_calling_thread(monkeypatch, rng):
    """``FilterParameters(n_threads=1)`` keeps a layer on one thread: no step is shared out."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm

    used = []
    original = _numba_lstm._forward_threads
    def spy(*args):
        used.append(args[0])
        return original(*args)

    monkeypatch.setattr(_numba_lstm, "_forward_threads", spy)
    params = LSTMParameters.random(input_size=8, hidden_size=256, seed=0)
    x = rng.standard_normal((3, 8, 8)).astype(np.float32)
    for n_threads, shared in ((1, False), (0, _numba_lstm.step_parts(256, 8) > 1)):
        used.clear()
        with LSTMLayer(params, bf.FilterParameters(backend="numba", n_threads=n_threads)) as layer:
            layer.apply(x)
        assert bool(used) == shared


@pytest.mark.skipif("scipy-blas" not in bf.available_backends(), reason="needs the scipy-blas backend")
def test_fast_kernels_take_the_default_cell_only(monkeypatch, rng):
    """The default cell never reaches the reference step kernels; peepholes, other activations
    and variable lengths do (and still agree, see the tests above on every backend)."""
    from bnnsfw.backends._shared.lstm_kernels import LSTMKernels

    calls = {"forward": 0, "backward": 0}
    for kind in calls:
        original = getattr(LSTMKernels, f"lstm_{kind}_step")

        def counted(self, *args, _original=original, _kind=kind, **kwargs):
            calls[_kind] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(LSTMKernels, f"lstm_{kind}_step", counted)
    plain = LSTMParameters.random(input_size=3, hidden_size=4, seed=0)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)

    def run(params, **options):
        calls.update(forward=0, backward=0)
        with layer_for(params, "scipy-blas") as layer:
            out = layer.apply(x, training=True, **options)
            layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache, **options)
        return dict(calls)

    assert run(plain) == {"forward": 0, "backward": 0}
    assert run(attrs.evolve(plain, default_activations=True)) == {"forward": 0, "backward": 0}
    assert run(plain, sequence_lengths=[5, 3]) == {"forward": 5, "backward": 5}
    peephole = LSTMParameters.random(input_size=3, hidden_size=4, seed=0, peepholes="diagonal")
    assert run(peephole) == {"forward": 5, "backward": 5}
    softsign = with_gates(plain, forget_gate=dict(activation=A.softsign()))
    assert run(softsign) == {"forward": 5, "backward": 5}


# ------------------------------------------------------------------------------------------
# Contracts: inputs untouched, client pointers, lifecycle, parameter objects.
# ------------------------------------------------------------------------------------------
def test_inputs_are_never_modified(backend_name, rng):
    params = LSTMParameters.random(input_size=3, hidden_size=2, num_layers=2, bidirectional=True,
                                   peepholes="diagonal", seed=0, dtype=np.float64, batch_first=True)
    x, dy = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 4))
    h0, c0, dh, dc = (rng.standard_normal((4, 2, 2)) for _ in range(4))
    lengths = np.array([4, 3])
    arrays = [x, dy, h0, c0, dh, dc, lengths] + [a for g in params.gates for a in
                                                 (g.input_weights[0], g.input_weights[1], g.hidden_weights,
                                                  g.cell_weights, g.bias) if a is not None]
    before = [a.copy() for a in arrays]
    for options in ({}, {"use_client_pointer": True}):
        with layer_for(params, backend_name, **options) as layer:
            out = layer.apply(x, h0, c0, lengths, training=True)
            layer.apply_backward(x, dy, h0, c0, dh, dc, lengths, training_cache=out.training_cache)
            layer.apply_backward(x, dy, h0, c0, dh, dc, lengths)
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(a, b)


def test_parameters_keep_arrays_of_the_right_dtype_and_cast_the_others(backend_name):
    hw = np.zeros((1, 1, 2, 2), np.float32)
    gate = LSTMGateDescriptor(input_weights=[np.zeros((1, 2, 3)), None], hidden_weights=hw)
    params = make_params({"input_gate": gate}, dtype=np.float32)
    assert params.input_gate.hidden_weights is hw  # kept: a client-pointer layer sees updates
    assert params.input_gate.input_weights[0].dtype == np.float32  # float64 cast, so a copy
    assert params.input_gate.peephole is None and repr(params.input_gate).startswith("LSTMGateDescriptor(")
    with layer_for(params, backend_name) as layer:  # the layer copies them (no client pointers)
        hw += 1.0
        assert layer.apply(np.zeros((1, 1, 3), np.float32)).output.shape == (1, 1, 2)


@pytest.mark.parametrize("num_layers,bidirectional", [(2, True), (1, False), (3, False)],
                         ids=["stacked", "one-layer", "stacked-one-direction"])
def test_concurrent_calls_get_their_own_scratch_space(backend_name, rng, num_layers, bidirectional,
                                                      direct_calls):
    """Calls from several threads at once, each of its own input: each gets what it gets alone
    (one direction: the prepared forward ``numba`` runs without the stack, its scratch views
    kept for the last workspace buffer it saw)."""
    import threading

    params = LSTMParameters.random(input_size=3, hidden_size=8, num_layers=num_layers,
                                   bidirectional=bidirectional, seed=0, dtype=np.float32)
    inputs = [rng.standard_normal((12, 4, 3)).astype(np.float32) for _ in range(4)]
    with layer_for(params, backend_name) as layer:
        expected = [layer.apply(x).output for x in inputs]
        results: dict[int, np.ndarray] = {}

        def work(k):
            for _ in range(5):
                results[k] = layer.apply(inputs[k]).output

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for k in range(4):
        np.testing.assert_array_equal(results[k], expected[k])
    assert direct_calls is None or bool(direct_calls) == (not bidirectional)


def test_client_pointer_sees_in_place_updates(backend_name, rng):
    params = LSTMParameters.random(input_size=2, hidden_size=2, seed=0, dtype=np.float64)
    x = rng.standard_normal((3, 1, 2))
    copied = layer_for(params, backend_name)
    shared = layer_for(params, backend_name, use_client_pointer=True)
    before = copied.apply(x).output
    weights = params.forget_gate.hidden_weights
    weights *= 2.0  # an optimizer step, in place
    np.testing.assert_array_equal(copied.apply(x).output, before)
    assert not np.allclose(shared.apply(x).output, before)
    rebuilt = layer_for(params, backend_name)
    np.testing.assert_array_equal(shared.apply(x).output, rebuilt.apply(x).output)


def test_lifecycle_and_repr(backend_name):
    params = LSTMParameters.random(input_size=2, hidden_size=3, seed=0)
    layer = layer_for(params, backend_name)
    assert repr(layer) == (f"<LSTMLayer input_size=2, hidden_size=3, num_layers=1, bidirectional=False, "
                           f"dtype=float32, backend='{backend_name}', open>")
    out = layer.apply(np.zeros((1, 1, 2), np.float32))
    assert isinstance(out, LSTMOutput) and out.training_cache is None
    layer.close()
    layer.close()
    for call in (lambda: layer.apply(np.zeros((1, 1, 2), np.float32)),
                 lambda: layer.apply_backward(np.zeros((1, 1, 2), np.float32), None),
                 lambda: layer.training_cache_capacity(1, 1)):
        with pytest.raises(bf.FilterClosedError, match="after close"):
            call()


def test_random_parameters(backend_name):
    params = LSTMParameters.random(input_size=3, hidden_size=16, num_layers=2, bidirectional=True,
                                   peepholes="full", seed=4)
    again = LSTMParameters.random(input_size=3, hidden_size=16, num_layers=2, bidirectional=True,
                                  peepholes="full", seed=4)
    np.testing.assert_array_equal(params.output_gate.cell_weights, again.output_gate.cell_weights)
    assert params.candidate_gate.cell_weights is None and params.input_gate.peephole == "full"
    assert params.dtype == np.float32 and params.input_gate.bias.dtype == np.float32
    everything = np.concatenate([a.ravel() for g in params.gates for a in
                                 (g.input_weights[0], g.input_weights[1], g.hidden_weights, g.bias)])
    assert np.abs(everything).max() <= 0.25 and np.abs(everything).max() > 0.2
    assert LSTMParameters.random(input_size=1, hidden_size=2, peepholes="diagonal",
                                 bias=False).forget_gate.cell_weights.shape == (1, 1, 2)
    assert LSTMParameters.random(input_size=1, hidden_size=2, bias=False).forget_gate.bias is None


def make_gate(size_l=1, size_d=1, h=2, size_i=3, **changes):
    fields = dict(input_weights=(np.zeros((size_d, h, size_i)), np.zeros((size_l - 1, size_d, h, size_d * h))
                                 if size_l > 1 else None),
                  hidden_weights=np.zeros((size_l, size_d, h, h)))
    fields.update(changes)
    return LSTMGateDescriptor(**fields)


def make_params(gate_changes=None, **changes):
    fields = dict(input_size=3, hidden_size=2, num_layers=1)
    fields.update(changes)
    size_l, size_d = fields["num_layers"], 2 if fields.get("bidirectional") else 1
    gate = make_gate(size_l, size_d, fields["hidden_size"], fields["input_size"])
    gates = {name: gate for name in GATES}
    for name, value in (gate_changes or {}).items():
        gates[name] = value
    return LSTMParameters(**fields, **gates)


def test_parameter_errors_name_the_field(backend_name):
    with layer_for(make_params(), backend_name):  # the baseline is valid
        pass
    with pytest.raises(bf.ShapeError, match=re_escape(
            "LSTMParameters.forget_gate.hidden_weights must be of shape (2, 1, 8, 8); "
            "got 'shape (2, 1, 8, 4) float32'.")):
        gate = make_gate(2, 1, 8, 3)
        make_params({"forget_gate": attrs.evolve(gate, hidden_weights=np.zeros((2, 1, 8, 4)))},
                    hidden_size=8, num_layers=2, dtype=np.float32)
    with pytest.raises(bf.ShapeError, match=r"input_gate.input_weights\[0\] must be of shape \(1, 2, 3\)"):
        make_params({"input_gate": make_gate(size_i=4)})
    with pytest.raises(bf.ShapeError,
                       match=r"output_gate.input_weights\[1\] must be an array of shape \(1, 2, 2, 4\)"):
        make_params({"output_gate": make_gate(2, 2, 2, 3, input_weights=(np.zeros((2, 2, 3)), None))},
                    num_layers=2, bidirectional=True)
    with pytest.raises(bf.ShapeError,
                       match=r"input_weights\[1\] must be None \(or of shape \(0, 1, 2, 2\)\)"):
        make_params({"input_gate": make_gate(input_weights=(np.zeros((1, 2, 3)), np.zeros((1, 1, 2, 2))))})
    with pytest.raises(bf.ShapeError,
                       match=r"candidate_gate.cell_weights must be None, of shape \(1, 1, 2, 2\)"):
        make_params({"candidate_gate": make_gate(cell_weights=np.zeros((1, 1, 3)))})
    with pytest.raises(bf.ShapeError, match=r"output_gate.bias must be of shape \(1, 1, 2\)"):
        make_params({"output_gate": make_gate(bias=np.zeros(2))})
    with pytest.raises(bf.InvalidParameterError, match=r"input_gate.bias must be finite"):
        make_params({"input_gate": make_gate(bias=np.full((1, 1, 2), np.nan))})
    with pytest.raises(bf.InvalidParameterError,
                       match="LSTMParameters.forget_gate must be an LSTMGateDescriptor"):
        make_params({"forget_gate": "sigmoid"})
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(bf.InvalidParameterError, match="LSTMParameters.dropout must be"):
            make_params(dropout=bad)
    with pytest.raises(bf.InvalidParameterError, match="LSTMParameters.hidden_size must be an integer >= 1"):
        make_params(hidden_size=0)
    with pytest.raises(bf.InvalidParameterError, match="LSTMParameters.seed must be None or an integer"):
        make_params(seed=-1)
    with pytest.raises(bf.InvalidParameterError, match="LSTMParameters.bidirectional must be True or False"):
        make_params(bidirectional=1)
    with pytest.raises(bf.DTypeError, match="LSTMParameters.dtype must be float32 or float64"):
        make_params(dtype=np.float16)
    with pytest.raises(bf.InvalidParameterError, match="LSTMGateDescriptor.activation must be a per-element"):
        make_gate(activation=A(bf.ActivationFunction.softmax))
    with pytest.raises(bf.InvalidParameterError,
                       match="LSTMParameters.hidden_activation must be an Activation"):
        make_params(hidden_activation="tanh")
    with pytest.raises(bf.InvalidParameterError, match="LSTMGateDescriptor.input_weights must be a pair"):
        LSTMGateDescriptor(input_weights=(np.zeros((1, 2, 3)),), hidden_weights=np.zeros((1, 1, 2, 2)))
    with pytest.raises(bf.InvalidParameterError,
                       match="random\\(peepholes\\) must be None, 'full' or 'diagonal'"):
        LSTMParameters.random(input_size=1, hidden_size=1, peepholes="yes")
    with pytest.raises(bf.InvalidParameterError, match=r"LSTMLayer\(parameters\) must be an LSTMParameters"):
        LSTMLayer("params")


def re_escape(text):
    import re

    return re.escape(text)


def test_apply_errors(backend_name, rng):
    params = LSTMParameters.random(input_size=3, hidden_size=2, num_layers=2, bidirectional=True, seed=0)
    x = rng.standard_normal((4, 2, 3)).astype(np.float32)
    state = np.zeros((4, 2, 2), np.float32)
    with layer_for(params, backend_name) as layer:
        with pytest.raises(bf.ShapeError, match=r"apply\(x\) must be of shape \(T, N, 3\) or unbatched "
                                                r"\(T, 3\); got 'shape \(4, 2, 2\)"):
            layer.apply(x[:, :, :2])
        with pytest.raises(bf.ShapeError, match=r"apply\(x\) must be of shape \(T, N, 3\)"):
            layer.apply(x[0, 0])
        with pytest.raises(bf.ShapeError, match="T >= 1 and N >= 1"):
            layer.apply(x[:0])
        with pytest.raises(bf.DTypeError, match=r"apply\(x\) must be a float32 array .*float64"):
            layer.apply(x.astype(np.float64))
        with pytest.raises(bf.ShapeError,
                           match=r"apply\(hidden\) must be of shape \(L·D, N, H\) = \(4, 2, 2\)"):
            layer.apply(x, hidden=state[:2])
        with pytest.raises(bf.DTypeError, match=r"apply\(cell\) must be a float32 array"):
            layer.apply(x, cell=state.astype(np.float64))
        with pytest.raises(bf.InvalidParameterError, match=r"sequence_lengths\) must be in \[0, 4\]"):
            layer.apply(x, sequence_lengths=[-1, 4])
        with pytest.raises(bf.InvalidParameterError, match=r"sequence_lengths\) must be in \[0, 4\]"):
            layer.apply(x, sequence_lengths=[5, 4])
        with pytest.raises(bf.ShapeError, match=r"sequence_lengths\) must be of shape \(2,\) \(one length"):
            layer.apply(x, sequence_lengths=[4, 4, 4])
        with pytest.raises(bf.InvalidParameterError, match=r"sequence_lengths\) must be integers"):
            layer.apply(x, sequence_lengths=[4.0, 2.0])
        with pytest.raises(bf.InvalidParameterError, match=r"apply\(training\) must be True or False"):
            layer.apply(x, training="yes")
        with pytest.raises(bf.ShapeError,
                           match=r"apply_backward\(output_gradient\) must be of shape \(4, 2, 4\)"):
            layer.apply_backward(x, np.zeros((4, 2, 2), np.float32))
        with pytest.raises(bf.DTypeError, match=r"apply_backward\(hidden_gradient\) must be a float32"):
            layer.apply_backward(x, None, hidden_gradient=state.astype(np.float64))
        with pytest.raises(bf.ShapeError, match=r"apply_backward\(cell_gradient\) must be of shape"):
            layer.apply_backward(x, None, cell_gradient=state[:, :1])
        with pytest.raises(bf.InvalidParameterError, match=r"training_cache_capacity\(batch_size\) must be"):
            layer.training_cache_capacity(0, 3)
    first = attrs.evolve(params, batch_first=True)
    with layer_for(first, backend_name) as layer:
        with pytest.raises(bf.ShapeError, match=r"must be of shape \(N, T, 3\)"):
            layer.apply(x[:, :, :2])


# ------------------------------------------------------------------------------------------
# Optional cross-check against PyTorch (skipped without torch).
# ------------------------------------------------------------------------------------------
def test_matches_pytorch(backend_name, rng):
    try:
        import torch
    except ImportError:  # also a broken install: this cross-check is optional
        pytest.skip("PyTorch is not installed")
    params = LSTMParameters.random(input_size=4, hidden_size=5, num_layers=2, bidirectional=True, seed=8,
                                   dtype=np.float64, batch_first=True)
    net = torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for layer in range(2):
            for d, suffix in enumerate(("", "_reverse")):
                for kind, field in (("ih", "input_weights"), ("hh", "hidden_weights")):
                    rows = []
                    for gate in params.gates:
                        if kind == "hh":
                            rows.append(gate.hidden_weights[layer, d])
                        elif layer == 0:
                            rows.append(gate.input_weights[0][d])
                        else:
                            rows.append(gate.input_weights[1][layer - 1, d])
                    stacked = torch.from_numpy(np.concatenate(rows))
                    getattr(net, f"weight_{kind}_l{layer}{suffix}").copy_(stacked)
                bias = np.concatenate([g.bias[layer, d] for g in params.gates])
                getattr(net, f"bias_ih_l{layer}{suffix}").copy_(torch.from_numpy(0.25 * bias))
                getattr(net, f"bias_hh_l{layer}{suffix}").copy_(torch.from_numpy(0.75 * bias))
    x = rng.standard_normal((3, 6, 4))
    h0, c0 = rng.standard_normal((2, 4, 3, 5))
    dy, dh = rng.standard_normal((3, 6, 10)), rng.standard_normal((4, 3, 5))
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x, h0, c0))
    ty, (thn, tcn) = net(tx, (th, tc))
    ((ty * torch.from_numpy(dy)).sum() + (thn * torch.from_numpy(dh)).sum()).backward()
    with layer_for(params, backend_name) as layer:
        out = layer.apply(x, h0, c0, training=True)
        grads = layer.apply_backward(x, dy, h0, c0, hidden_gradient=dh, training_cache=out.training_cache)
    np.testing.assert_allclose(out.output, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out.cell, tcn.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads.input, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads.hidden, th.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads.cell, tc.grad.numpy(), rtol=1e-9, atol=1e-12)
    h = 5
    for k, gate in enumerate(grads.gates):
        rows = slice(k * h, (k + 1) * h)
        np.testing.assert_allclose(gate.input_weights[1][0, 1], net.weight_ih_l1_reverse.grad.numpy()[rows],
                                   rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gate.hidden_weights[0, 0], net.weight_hh_l0.grad.numpy()[rows],
                                   rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gate.bias[1, 0], net.bias_hh_l1.grad.numpy()[rows], rtol=1e-9, atol=1e-12)


def test_an_open_layer_keeps_a_bounded_scratch_space(backend_name, monkeypatch, rng):
    """Between calls a layer keeps at most ``RETAINED_BYTES`` of scratch memory, however long
    the sequence it last ran."""
    from bnnsfw.layers._lstm_workspace import _Workspace

    monkeypatch.setattr(_Workspace, "RETAINED_BYTES", 1 << 16)
    params = LSTMParameters.random(input_size=8, hidden_size=16, seed=0)
    x = rng.standard_normal((400, 4, 8)).astype(np.float32)
    with layer_for(params, backend_name) as layer:
        out = layer.apply(x, training=True)
        layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
        assert layer._workspace.nbytes <= 1 << 16


def test_the_workspace_hands_out_the_current_memory_of_each_name(monkeypatch, rng):
    """The workspace keeps the typed views it hands out and counts the bytes it holds as
    buffers come and go: after any sequence of requests, growth and trims, a name's array is
    its current buffer (never one it has let go of) and the count is what it holds."""
    from bnnsfw.layers._lstm_workspace import _Workspace

    monkeypatch.setattr(_Workspace, "RETAINED_BYTES", 4096)
    monkeypatch.setattr(_Workspace, "KEPT_VIEWS", 16)
    workspace = _Workspace()
    for _ in range(300):
        name = f"b{rng.integers(4)}"
        dtype = np.dtype(rng.choice([np.float32, np.float64, np.uint8]))
        shape = tuple(int(n) for n in rng.integers(1, 40, size=rng.integers(1, 3)))
        if rng.random() < 0.2:
            workspace.trim()
            assert workspace.nbytes <= _Workspace.RETAINED_BYTES
        if rng.random() < 0.8:
            array = workspace.array(name, shape, dtype)
            assert array.shape == shape and array.dtype == dtype
        else:
            array = workspace.bytes(name, shape[0])
            assert array.shape == shape[:1] and array.dtype == np.uint8
        assert array.flags.c_contiguous and array.flags.writeable
        current = workspace._buffers[name]
        assert np.shares_memory(array, current)
        assert array.ctypes.data == current.ctypes.data
        assert workspace.nbytes == sum(b.nbytes for b in workspace._buffers.values())
        again = workspace.array(name, (2,), np.dtype(np.uint8))
        assert np.shares_memory(again, workspace._buffers[name])
        assert len(workspace._views) <= 16


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_scratch_does_not_grow_with_the_sequence_length(monkeypatch, rng):
    """The compiled kernels work a chunk of steps at a time: ten times the steps, the same
    scratch memory (the reference kernels' grows with T). One layer: a stack also keeps each
    layer's output for the next, which grows with T on every backend."""
    from bnnsfw.backends.numba import _lstm as _numba_lstm
    from bnnsfw.layers._lstm_workspace import _Workspace

    monkeypatch.setattr(_numba_lstm, "CHUNK_COLUMNS", 64)
    monkeypatch.setattr(_numba_lstm, "NARROW_CHUNK_COLUMNS", 64)
    monkeypatch.setattr(_Workspace, "RETAINED_BYTES", 1 << 40)  # keep everything, to measure it
    params = LSTMParameters.random(input_size=8, hidden_size=16, bidirectional=True, seed=0)
    used = []
    for seq_len in (40, 400):
        x = rng.standard_normal((seq_len, 4, 8)).astype(np.float32)
        with layer_for(params, "numba") as layer:
            out = layer.apply(x, training=True)
            layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
            layer.apply(x)
            used.append(layer._workspace.nbytes)
    assert used[0] == used[1]


def test_column_major_weight_arrays_give_the_reference_results(backend_name, rng):
    """Weights given as transposed views (column-major arrays, as converted weights often are)
    compute what row-major copies of them do, on every backend (BLAS reads row strides)."""
    params = LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2, bidirectional=True, seed=6,
                                   dtype=np.float64)

    def column_major(a):
        return None if a is None else np.asfortranarray(a)

    gates = {}
    for name in ("input_gate", "forget_gate", "candidate_gate", "output_gate"):
        gate = getattr(params, name)
        gates[name] = attrs.evolve(gate, input_weights=tuple(column_major(w) for w in gate.input_weights),
                                   hidden_weights=column_major(gate.hidden_weights))
    fortran = attrs.evolve(params, **gates)
    x, dy = rng.standard_normal((5, 3, 3)), rng.standard_normal((5, 3, 8))
    results = []
    for p, name in ((params, "numpy"), (fortran, backend_name)):
        with layer_for(p, name) as layer:
            out = layer.apply(x, training=True)
            grads = layer.apply_backward(x, dy, training_cache=out.training_cache)
        results.append([out.output, grads.input] + [g.hidden_weights for g in grads.gates])
    rtol, atol = TOLERANCE[np.dtype(np.float64)]
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_call_takes_training_as_apply_does(backend_name, rng):
    """``layer(x)`` is the inference forward, ``layer(x, training=True)`` the training one."""
    params = LSTMParameters.random(input_size=2, hidden_size=3, seed=1, dtype=np.float64)
    x = rng.standard_normal((3, 2, 2))
    with layer_for(params, backend_name) as layer:
        assert layer(x).training_cache is None
        called, applied = layer(x, training=True), layer.apply(x, training=True)
        assert called.training_cache is not None
        np.testing.assert_array_equal(called.output, applied.output)
        dy = rng.standard_normal(called.output.shape)
        from_call = layer.apply_backward(x, dy, training_cache=called.training_cache)
        from_apply = layer.apply_backward(x, dy, training_cache=applied.training_cache)
        np.testing.assert_array_equal(from_call.input, from_apply.input)
        with pytest.raises(bf.InvalidParameterError, match=r"apply\(training\) must be True or False"):
            layer(x, training="yes")

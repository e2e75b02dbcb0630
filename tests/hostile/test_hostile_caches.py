"""Family 4: LSTM training caches cannot lie.

A cache carries the identity of the forward that wrote it: a digest of the weights, the
weights' version, a digest of ``x`` and one of the initial states, and the forward's
generation. Each example writes a cache, then hands ``apply_backward`` a cache that is right
or one that would lie — another layer's, another ``x``'s, overwritten by a later forward,
written before an in-place weight update, by a C-style forward with other weights, damaged —
and checks: a right cache gives the gradients of a backward that recomputes the forward, a
lying one is refused with a clear error.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from hostile._hostile import HOSTILE, answered, attempt, c_call, refused, wrong
from hypothesis import given, settings
from hypothesis import strategies as st

import bnnsfw as bf
from bnnsfw import bnns
from bnnsfw.bnns import BNNSNDArrayDescriptor as Desc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the C-style names are deprecated

F32 = np.float32
T, N, IN, H = 4, 3, 3, 5
GATES = ("input_gate", "forget_gate", "candidate_gate", "output_gate")

#: (scenario, whether the backward must accept the cache)
SCENARIOS = {
    "same": True, "same weights, other layer": True, "other backend": True, "states omitted": True,
    "rewritten with the same x": True, "odd address": True,
    "other layer": False, "other x (one element)": False, "other x (reordered)": False,
    "other initial state": False, "overwritten by a later forward": False, "weights updated in place": False,
    "other lengths": False, "truncated": False, "random bytes": False, "header cleared": False,
    "other T": False, "float64 layer": False, "bytes of another format": False,
}


def gradients_equal(a: bf.LSTMGradients, b: bf.LSTMGradients, dtype: Any) -> bool:
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == F32 else dict(rtol=1e-9, atol=1e-11)
    pairs = [(a.input, b.input), (a.hidden, b.hidden), (a.cell, b.cell)]
    for ga, gb in zip(a.gates, b.gates):
        pairs += [(ga.input_weights[0], gb.input_weights[0]), (ga.hidden_weights, gb.hidden_weights),
                  (ga.bias, gb.bias)]
    return all(np.allclose(x, y, **tol) for x, y in pairs)


@settings(HOSTILE, max_examples=120)
@given(scenario=st.sampled_from(sorted(SCENARIOS)), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([F32, np.float64]), client=st.booleans(), lengths=st.booleans())
def test_backward_trusts_only_its_own_cache(backend_name: str, scenario: str, seed: int, dtype: Any,
                                            client: bool, lengths: bool) -> None:
    rng = np.random.default_rng(seed)
    params = bf.LSTMParameters.random(input_size=IN, hidden_size=H, seed=seed, dtype=dtype)
    fp = bf.FilterParameters(backend=backend_name, use_client_pointer=client)
    layer = bf.LSTMLayer(params, fp)
    x = rng.standard_normal((T, N, IN)).astype(dtype)
    h0 = rng.standard_normal((1, N, H)).astype(dtype)
    dy = rng.standard_normal((T, N, H)).astype(dtype)
    seq = np.array([T, T - 1, 2]) if lengths else None
    cache = layer.apply(x, hidden=h0, sequence_lengths=seq, training=True).training_cache
    want = layer.apply_backward(x, dy, hidden=h0, sequence_lengths=seq)  # recomputed: no cache involved
    reader, x_b, h_b, seq_b = layer, x, h0, seq
    if scenario == "same weights, other layer":
        reader = bf.LSTMLayer(params, fp)
    elif scenario == "other backend":
        reader = bf.LSTMLayer(params, bf.FilterParameters(backend="numpy"))
    elif scenario == "states omitted":
        h_b = None
    elif scenario == "rewritten with the same x":
        cache_again = layer.apply(x, hidden=h0, sequence_lengths=seq, training=True, training_cache=cache)
        assert cache_again.training_cache is cache
    elif scenario == "odd address":
        odd = np.zeros(cache.size + 1, np.uint8)[1:]
        odd[...] = cache
        cache = odd
    elif scenario == "other layer":
        other = bf.LSTMParameters.random(input_size=IN, hidden_size=H, seed=seed + 1, dtype=dtype)
        reader = bf.LSTMLayer(other, fp)
    elif scenario == "other x (one element)":
        x_b = x.copy()
        x_b[rng.integers(T if seq is None else 2), rng.integers(N), rng.integers(IN)] += 0.5
    elif scenario == "other x (reordered)":
        x_b = x[::-1].copy()
    elif scenario == "other initial state":
        h_b = h0 + 0.25
    elif scenario == "overwritten by a later forward":
        layer.apply(x + 1, hidden=h0, sequence_lengths=seq, training=True, training_cache=cache)
    elif scenario == "weights updated in place":
        # an optimizer step on the live arrays, whatever the filter options
        layer.parameters()["layer0.forward.forget_gate.hidden_weights"][...] += 0.01
    elif scenario == "other lengths":
        seq_b = np.array([T - 1, T - 1, 1]) if seq is not None else np.array([T, T, 1])
    elif scenario == "truncated":
        cache = cache[: cache.size // 2]
    elif scenario == "random bytes":
        cache = rng.integers(0, 256, cache.size, dtype=np.uint8)
    elif scenario == "header cleared":
        cache = cache.copy()
        cache[:64] = 0
    elif scenario == "other T":
        x_b, dy = x[:-1], dy[:-1]
        seq_b = None
    elif scenario == "float64 layer":
        reader = bf.LSTMLayer(bf.LSTMParameters.random(input_size=IN, hidden_size=H, seed=seed,
                                                       dtype=np.float64 if dtype == F32 else F32), fp)
        x_b, dy, h_b = (a.astype(reader.layer_parameters.dtype) for a in (x, dy, h0))
    elif scenario == "bytes of another format":
        cache = cache.copy()
        cache[8] ^= 0x07  # the header's format version
    call = (reader.apply_backward, x_b, dy)
    kwargs = dict(hidden=h_b, sequence_lengths=seq_b, training_cache=cache)
    if SCENARIOS[scenario]:
        ok, got = attempt("caches", *call, **kwargs)
        if not ok:
            raise wrong("caches", f"{scenario}: a right cache was refused: {got}")
        if not gradients_equal(got, want, dtype):
            raise wrong("caches", f"{scenario}: gradients differ from a recomputed backward")
        answered("caches")
    else:
        refused("caches", *call, **kwargs, match="training_cache")


@pytest.mark.parametrize("overlap", ["x", "hidden", "cell"])
def test_cache_overlapping_an_input_is_refused(overlap: str) -> None:
    """The forward writes the cache: one holding the layer's input would overwrite it."""
    layer = bf.LSTMLayer(bf.LSTMParameters.random(input_size=IN, hidden_size=H, seed=0))
    capacity = layer.training_cache_capacity(batch_size=N, seq_len=T)
    inputs = {"x": np.ones((T, N, IN), F32), "hidden": np.ones((1, N, H), F32),
              "cell": np.ones((1, N, H), F32)}
    backing = np.zeros(capacity + 64, np.uint8)
    inside = backing[32:32 + inputs[overlap].nbytes].view(F32).reshape(inputs[overlap].shape)
    inside[...] = inputs[overlap]
    inputs[overlap] = inside
    before = backing.copy()
    refused("caches", layer.apply, inputs["x"], hidden=inputs["hidden"], cell=inputs["cell"], training=True,
            training_cache=backing[:capacity], match=f"overlapping {overlap}")
    np.testing.assert_array_equal(backing, before)


def c_style(p: bf.LSTMParameters, x: np.ndarray, dx: np.ndarray | None = None,
            dy: np.ndarray | None = None) -> bnns.BNNSLayerParametersLSTM:
    def d(a: np.ndarray) -> Desc:  # the delta structure gets buffers of its own for the weight deltas
        return Desc.from_array(a if dx is None else np.zeros_like(a))

    def gate(g: bf.LSTMGateDescriptor) -> bnns.BNNSLSTMGateDescriptor:
        return bnns.BNNSLSTMGateDescriptor(iw_desc=(d(g.input_weights[0]), None), hw_desc=d(g.hidden_weights),
                                           b_desc=d(g.bias))

    return bnns.BNNSLayerParametersLSTM(
        input_size=IN, hidden_size=H, batch_size=N, num_layers=1, seq_len=T,
        input_descriptor=bnns.BNNSLSTMDataDescriptor(
            data_desc=Desc.from_array(x if dx is None else dx, "sne")),
        output_descriptor=bnns.BNNSLSTMDataDescriptor(
            data_desc=Desc.from_array(np.zeros((T, N, H), F32) if dy is None else dy, "sne")),
        **{name: gate(g) for name, g in zip(GATES, p.gates)})


@pytest.mark.parametrize("weights", ["same", "other"])
def test_c_style_backward_with_a_cache_of_other_weights(weights: str) -> None:
    """BNNSDirectApplyLSTMBatchBackward with the cache of a forward that used other weights
    fails with the reason; with the same weights it gives the recomputed backward's deltas."""
    rng = np.random.default_rng(5)
    p = bf.LSTMParameters.random(input_size=IN, hidden_size=H, seed=3)
    q = p if weights == "same" else bf.LSTMParameters.random(input_size=IN, hidden_size=H, seed=4)
    x = rng.standard_normal((T, N, IN)).astype(F32)
    dy = rng.standard_normal((T, N, H)).astype(F32)
    forward = c_style(q, x)
    capacity = bnns.BNNSComputeLSTMTrainingCacheCapacity(forward)
    cache = np.zeros(capacity, np.uint8)
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(forward, None, cache, capacity) == 0
    dx = np.zeros_like(x)
    ok, _ = c_call("caches", bnns.BNNSDirectApplyLSTMBatchBackward, c_style(p, x), c_style(p, x, dx, dy),
                   None, cache, capacity, match="training_cache")
    if ok != (weights == "same"):
        raise wrong("caches", f"a C-style cache of {weights} weights was {'accepted' if ok else 'refused'}")
    if ok:
        want = bf.LSTMLayer(p).apply_backward(x, dy)
        if not np.allclose(dx, want.input, rtol=2e-4, atol=2e-5):
            raise wrong("caches", "C-style deltas differ from the object API's")
        answered("caches")


def test_a_forward_over_the_cache_during_the_backward() -> None:
    """Another thread's forward writing the cache while a backward reads it: the backward
    completes with the right gradients or is refused; never gradients of a mixed cache."""
    rng = np.random.default_rng(8)
    layer = bf.LSTMLayer(bf.LSTMParameters.random(input_size=IN, hidden_size=64, seed=1))
    x = rng.standard_normal((40, 8, IN)).astype(F32)
    dy = rng.standard_normal((40, 8, 64)).astype(F32)
    cache = layer.apply(x, training=True).training_cache
    want = layer.apply_backward(x, dy)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            layer.apply(x + 1, training=True, training_cache=cache)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(25):
            ok, got = attempt("caches", layer.apply_backward, x, dy, training_cache=cache)
            if ok and not gradients_equal(got, want, F32):
                raise wrong("caches", "a backward over a cache being rewritten returned mixed gradients")
            if ok:
                answered("caches")
    finally:
        stop.set()
        thread.join()

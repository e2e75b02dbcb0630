"""The readable LSTM: its gradients against finite differences, and every backend's layer against it.

The module is the oracle for BNNS's cell in one layer and one direction (default activations,
no or diagonal peepholes): every registered backend's ``LSTMLayer`` must give its outputs, final
states and every gradient, by the layer's parameter names, within the contract's tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.backends.numpy import lstm_bptt as bptt
from bnnsfw.backends.contract import TOLERANCE
from bnnsfw.testing import check_backend
from gradcheck import assert_gradient_close, numerical_gradient

#: The layer's gate and field names (``layer0.forward.<gate>.<field>``) in the module's letters.
GATE_LETTER = {"input_gate": "i", "forget_gate": "f", "candidate_gate": "g", "output_gate": "o"}
FIELD_LETTER = {"input_weights": "W", "hidden_weights": "U", "bias": "b", "cell_weights": "p"}


# ------------------------------------------------------------------------------------------
# The module against finite differences (float64).
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("peepholes", [True, False], ids=["diagonal_peepholes", "no_peepholes"])
def test_the_modules_gradients_match_finite_differences(peepholes):
    rng = np.random.default_rng(7 if peepholes else 8)
    steps, batch, size_i, size_h = 4, 3, 3, 5
    w = bptt.random_weights(size_i, size_h, rng, peepholes=peepholes)
    x = rng.standard_normal((steps, batch, size_i))
    h0, c0 = rng.standard_normal((batch, size_h)), rng.standard_normal((batch, size_h))
    # L = Σ wy ⊙ h_t (every output) + Σ wh ⊙ h_T + Σ wc ⊙ c_T: its gradients are wy, wh and wc.
    wy = rng.standard_normal((steps, batch, size_h))
    wh, wc = rng.standard_normal((batch, size_h)), rng.standard_normal((batch, size_h))

    def loss() -> float:
        out = bptt.forward(x, w, h0, c0)
        return float(np.sum(wy * out.outputs) + np.sum(wh * out.h) + np.sum(wc * out.c))

    grads = bptt.backward(wy, wh, wc, bptt.forward(x, w, h0, c0).steps, w)
    checked = {"x": (x, grads.x), "h0": (h0, grads.h0), "c0": (c0, grads.c0)}
    for field in ("W", "U", "b", "p"):
        for gate, value in getattr(w, field).items():
            checked[f"{field}[{gate}]"] = (value, getattr(grads.weights, field)[gate])
    assert len(checked) == 3 + 4 * 3 + 3
    for name, (value, analytic) in checked.items():
        assert analytic.shape == value.shape and analytic.dtype == np.float64, name
        numeric = numerical_gradient(loss, value)
        assert np.abs(numeric).max() > 1e-3, f"{name}: the check needs a gradient that is not ~0"
        assert_gradient_close(analytic, numeric, rtol=1e-6, atol=1e-8, name=name)


# ------------------------------------------------------------------------------------------
# Every backend's layer against the module.
# ------------------------------------------------------------------------------------------
CASES = {
    "no_peepholes": dict(peepholes=None),
    "diagonal_peepholes": dict(peepholes="diagonal"),
    "no_bias_zero_initial_states": dict(peepholes="diagonal", bias=False, initial_states=False),
    "long_and_wide": dict(peepholes="diagonal", steps=40, batch=8, input_size=5, hidden_size=24),
}


def module_weights(named: dict[str, np.ndarray], hidden_size: int) -> bptt.Weights:
    """The layer's arrays by name as the module's weights, in float64; a missing bias or
    peephole is the module's zero."""
    w = bptt.Weights(W={}, U={}, b={k: np.zeros(hidden_size) for k in bptt.GATES},
                     p={k: np.zeros(hidden_size) for k in bptt.PEEPHOLES})
    for name, array in named.items():
        layer, direction, gate, field = name.split(".")
        assert (layer, direction) == ("layer0", "forward"), name
        getattr(w, FIELD_LETTER[field])[GATE_LETTER[gate]] = array.astype(np.float64)
    assert sorted(w.W) == sorted(w.U) == sorted(bptt.GATES)
    return w


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_layer_agrees_with_the_readable_module(backend_name, case, dtype):
    """Outputs, final states, and the gradients of the input, the initial states and every weight
    by name, within the contract's tolerance for the dtype; the module runs in float64 on the
    layer's own (possibly float32) values."""
    spec = CASES[case]
    steps, batch = spec.get("steps", 6), spec.get("batch", 3)
    size_i, size_h = spec.get("input_size", 3), spec.get("hidden_size", 4)
    rtol, atol = TOLERANCE[np.dtype(dtype)]
    params = bf.LSTMParameters.random(input_size=size_i, hidden_size=size_h, peepholes=spec["peepholes"],
                                      bias=spec.get("bias", True), seed=11, dtype=dtype)
    rng = np.random.default_rng(list(CASES).index(case))

    def draw(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    x, dy = draw(steps, batch, size_i), draw(steps, batch, size_h)
    dh, dc = draw(1, batch, size_h), draw(1, batch, size_h)
    given = spec.get("initial_states", True)
    h0, c0 = (draw(1, batch, size_h), draw(1, batch, size_h)) if given else (None, None)

    with bf.LSTMLayer(params, bf.FilterParameters(backend=backend_name)) as layer:
        out = layer.apply(x, h0, c0, training=True)
        grads = layer.apply_backward(x, dy, h0, c0, dh, dc, training_cache=out.training_cache)
        w = module_weights(layer.parameters(), size_h)
        names = set(layer.parameters())

    def f64(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float64)

    zeros = np.zeros((batch, size_h))
    start_h, start_c = (f64(h0[0]), f64(c0[0])) if given else (zeros, zeros)
    want = bptt.forward(f64(x), w, start_h, start_c)
    want_grads = bptt.backward(f64(dy), f64(dh[0]), f64(dc[0]), want.steps, w)
    compared = {"output": (out.output, want.outputs), "final hidden": (out.hidden[0], want.h),
                "final cell": (out.cell[0], want.c), "d input": (grads.input, want_grads.x),
                "d initial hidden": (grads.hidden[0], want_grads.h0),
                "d initial cell": (grads.cell[0], want_grads.c0)}
    for name, gradient in grads.parameters().items():
        _, _, gate, field = name.split(".")
        expected = getattr(want_grads.weights, FIELD_LETTER[field])[GATE_LETTER[gate]]
        compared[f"d {name}"] = (gradient, expected)
    assert set(grads.parameters()) == names    # every weight the layer has, and nothing else
    assert len(names) == 12 + 3 * (spec["peepholes"] is not None) - 4 * (not spec.get("bias", True))
    for name, (got, expected) in compared.items():
        assert got.dtype == np.dtype(dtype) and got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=f"{backend_name}: {name}")


# ------------------------------------------------------------------------------------------
# The conformance kit compares every backend with the module too.
# ------------------------------------------------------------------------------------------
def test_the_kit_checks_the_reference_backend_against_the_module(monkeypatch):
    """The reference backend agrees with itself, so the kit's comparison with the module is what
    would catch an error the reference and a backend share: a wrong module must fail it."""
    assert check_backend("numpy", quick=True).failures == []
    monkeypatch.setattr(bptt, "tanh", lambda z: np.tanh(1.001 * z))
    report = check_backend("numpy", quick=True, raise_on_failure=False)
    assert report.failures
    assert all(f.startswith("LSTM against the readable module") for f in report.failures), report.failures

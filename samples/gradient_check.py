"""Checking a layer's backward pass against finite differences.

For a scalar loss ``L = Σ w · f(x)`` with fixed random weights ``w``, the analytic gradient
from ``apply_backward`` must match ``(L(x + ε) − L(x − ε)) / 2ε`` element by element. Use
float64: in float32 the rounding of the difference swamps the check. The same recipe works
for any weight array (perturb it in place; the layer must see it — create the layer with
``use_client_pointer=True``). Usage: ``python samples/gradient_check.py``.
"""

from __future__ import annotations

import sys

import numpy as np

import bnnsfw as bf


def numerical_gradient(loss, array: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of ``loss()`` with respect to every element of ``array``."""
    grad = np.zeros_like(array)
    flat, g = array.reshape(-1), grad.reshape(-1)
    for k in range(flat.size):
        old = flat[k]
        flat[k] = old + eps
        up = loss()
        flat[k] = old - eps
        down = loss()
        flat[k] = old
        g[k] = (up - down) / (2 * eps)
    return grad


def check(name: str, analytic: np.ndarray, numeric: np.ndarray) -> bool:
    error = np.max(np.abs(analytic - numeric)) / max(1e-12, np.max(np.abs(numeric)))
    ok = error < 1e-6
    print(f"  {name:<28} relative error {error:.2e}  {'ok' if ok else 'MISMATCH'}")
    return ok


def main(quick: bool = False) -> int:
    rng = np.random.default_rng(0)
    ok = True

    print("LSTM (2 layers, bidirectional, diagonal peepholes):")
    params = bf.LSTMParameters.random(input_size=3, hidden_size=2, num_layers=2, bidirectional=True,
                                      peepholes="diagonal", seed=1, dtype=np.float64)
    lstm = bf.LSTMLayer(params, bf.FilterParameters(use_client_pointer=True))
    x = rng.standard_normal((4, 2, 3))
    w = rng.standard_normal((4, 2, 4))

    def lstm_loss() -> float:
        return float(np.sum(w * lstm.apply(x).output))

    grads = lstm.apply_backward(x, w)
    ok &= check("input", grads.input, numerical_gradient(lstm_loss, x))
    ok &= check("forget gate hidden weights", grads.forget_gate.hidden_weights,
                numerical_gradient(lstm_loss, params.forget_gate.hidden_weights))
    ok &= check("output gate peephole", grads.output_gate.cell_weights,
                numerical_gradient(lstm_loss, params.output_gate.cell_weights))

    print("Group normalization with a fused GELU:")
    norm_params = bf.NormalizationParameters(
        type=bf.NormalizationType.group(group_count=2), input_shape=(4, 3), gamma=rng.uniform(0.5, 1.5, 4),
        beta=rng.standard_normal(4), activation=bf.Activation.gelu(), dtype=np.float64)
    norm = bf.NormalizationLayer(norm_params, bf.FilterParameters(use_client_pointer=True))
    xn = rng.standard_normal((3, 4, 3))
    wn = rng.standard_normal((3, 4, 3))

    def norm_loss() -> float:
        return float(np.sum(wn * norm.apply(xn)))

    g = norm.apply_backward(xn, wn, output=norm.apply(xn))
    ok &= check("input", g.input, numerical_gradient(norm_loss, xn))
    ok &= check("gamma", g.gamma, numerical_gradient(norm_loss, norm.gamma))
    ok &= check("beta", g.beta, numerical_gradient(norm_loss, norm.beta))
    print("all gradients agree" if ok else "SOME GRADIENTS DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))

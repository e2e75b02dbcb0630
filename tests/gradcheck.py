"""Finite-difference gradients for the tests (float64, central differences)."""

from __future__ import annotations

from typing import Callable

import numpy as np


def numerical_gradient(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d f() / d x by central differences, perturbing ``x`` in place and restoring it."""
    grad = np.zeros_like(x, dtype=np.float64)
    flat = x.reshape(-1)  # a view: x must be contiguous
    assert np.shares_memory(flat, x)
    g = grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        g[i] = (up - down) / (2 * eps)
    return grad


def assert_gradient_close(analytic: np.ndarray, numeric: np.ndarray, *, rtol: float = 1e-5,
                          atol: float = 1e-7, name: str = "gradient") -> None:
    """Compare an analytic gradient to a numeric one with a readable failure message."""
    np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol, err_msg=name)

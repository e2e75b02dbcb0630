"""Family 6 (numbers): normalization of large finite values is finite and right on every backend.

Float32 data up to ±3.4e38 (PyTorch's layer norm gives zeros there; the kernels used to give
NaN), and float64 data up to 1e300: forward and backward, every normalization type, in place
or not, with the identity activation (the compiled kernels) or another one (the blocked and
reference kernels), small inputs and inputs large enough for the blocked kernels, against the
test's own float64 computation on data scaled by a power of two.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hostile._hostile import HOSTILE, answered, wrong
from hypothesis import given, settings
from hypothesis import strategies as st

import bnnsfw as bf

KINDS = {
    "layer": (bf.NormalizationType.layer(), lambda s: tuple(range(1, len(s) + 1)), None),
    "layer_axis1": (bf.NormalizationType.layer(normalization_axis=1), lambda s: tuple(range(2, len(s) + 1)),
                    None),
    "instance": (bf.NormalizationType.instance(), lambda s: tuple(range(2, len(s) + 1)), None),
    "batch": (bf.NormalizationType.batch(), lambda s: (0, *range(2, len(s) + 1)), None),
    "group": (bf.NormalizationType.group(group_count=2), None, 2),
}


def sets_of(x: np.ndarray, kind: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """``x`` viewed so that the statistics sets are reduced over the returned axes."""
    _, axes_of, groups = KINDS[kind]
    if groups:
        n, c = x.shape[:2]
        return x.reshape(n, groups, -1), (2,)
    return x, axes_of(x.shape[1:])


def reference(x: np.ndarray, dy: np.ndarray, gamma: np.ndarray, beta: np.ndarray, kind: str,
              eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y and dx in float64, each statistics set first scaled by a power of two, and a mask of
    the elements of constant sets: normalizing those is 0/0 regularized by ε, and once ε·s² is
    below the float range (float64 data beyond 1e249) any rounding of the mean decides it, in
    any implementation; only finiteness is asked of them."""
    view, axes = sets_of(x.astype(np.float64), kind)
    scale = 2.0 ** -np.frexp(np.max(np.abs(view), axis=axes, keepdims=True))[1]
    xs = view * scale
    mean = xs.mean(axis=axes, keepdims=True)
    denominator = np.sqrt(((xs - mean) ** 2).mean(axis=axes, keepdims=True) + eps * scale * scale)
    rstd = np.divide(1.0, denominator, out=np.zeros_like(denominator), where=denominator > 0)  # ε·s² may be 0
    xhat = ((xs - mean) * rstd).reshape(x.shape)
    shape = (1, *gamma.shape) if KINDS[kind][1] is not None and kind.startswith("layer") else \
        (1, gamma.size, *([1] * (x.ndim - 2)))
    g = gamma.reshape(shape).astype(np.float64)
    y = xhat * g + beta.reshape(shape)
    gdy = sets_of(dy.astype(np.float64) * g, kind)[0]
    xh = sets_of(xhat, kind)[0]
    dx = rstd * scale * (gdy - gdy.mean(axis=axes, keepdims=True)
                         - xh * (gdy * xh).mean(axis=axes, keepdims=True))
    constant = np.max(view, axis=axes, keepdims=True) == np.min(view, axis=axes, keepdims=True)
    return y, dx.reshape(x.shape), np.broadcast_to(constant, view.shape).reshape(x.shape)


def close(got: np.ndarray, want: np.ndarray, dtype: Any, skip: np.ndarray) -> bool:
    rtol = 2e-3 if dtype == np.float32 else 1e-8
    tiny = np.finfo(dtype).smallest_subnormal * 64
    got, want = got[~skip], want[~skip]
    return bool(np.all(np.abs(got - want) <= rtol * (np.abs(want) + np.abs(want).max(initial=0)) + tiny))


@st.composite
def data_sets(draw: st.DrawFn, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Values of every size up to the dtype's largest, mixed signs, some rows constant."""
    top = 38 if dtype == np.float32 else 300
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    exponent = rng.integers(-20, top + 1, size=shape[:2] + (1,) * (len(shape) - 2))
    x = rng.uniform(-1, 1, shape) * 10.0 ** exponent
    if draw(st.booleans()):
        x[0] = draw(st.sampled_from([3.4e38, -3.4e38, 1e38, 0.0])) if dtype == np.float32 else 1e300
    if draw(st.booleans()):  # the largest values of both signs in one set
        limit = np.finfo(dtype).max
        flat = x.reshape(x.shape[0], -1)
        flat[0, :2] = [limit, -limit]
    return x.astype(dtype)


@settings(HOSTILE, max_examples=140)
@given(backend=st.sampled_from(bf.available_backends()), kind=st.sampled_from(sorted(KINDS)),
       dtype=st.sampled_from([np.float32, np.float32, np.float64]),
       shape=st.sampled_from([(3, 4, 6), (2, 4, 3, 5), (4, 8)]), in_place=st.booleans(),
       act=st.sampled_from(["identity", "identity", "leaky"]), data=st.data())
def test_large_values(backend: str, kind: str, dtype: Any, shape: tuple[int, ...], in_place: bool, act: str,
                      data: st.DataObject) -> None:
    if kind == "layer_axis1" and len(shape) < 3:
        kind = "layer"
    run(backend, kind, dtype, shape, in_place, act, data.draw(data_sets(shape, dtype), label="x"))


@pytest.mark.parametrize("kind", ["layer", "instance", "batch", "group"])
@pytest.mark.parametrize("act", ["identity", "leaky"])
def test_large_values_on_the_blocked_kernels(backend_name: str, kind: str, act: str) -> None:
    """Inputs of 65 536 elements: the blocked (scipy-blas) and compiled (numba) paths."""
    rng = np.random.default_rng(3)
    shape = (8, 4, 2048)
    x = (rng.uniform(-1, 1, shape) * 10.0 ** rng.integers(0, 39, (8, 4, 1))).astype(np.float32)
    x[0, 0, :2] = [3.4e38, -3.4e38]
    run(backend_name, kind, np.float32, shape, False, act, x)


def run(backend: str, kind: str, dtype: Any, shape: tuple[int, ...], in_place: bool, act: str,
        x: np.ndarray) -> None:
    ntype = KINDS[kind][0]
    per_sample = shape[1:]
    affine = per_sample[ntype.normalization_axis:] if kind.startswith("layer") else (per_sample[0],)
    rng = np.random.default_rng(7)
    gamma = rng.uniform(0.5, 1.5, affine).astype(dtype)
    beta = rng.uniform(-1, 1, affine).astype(dtype)
    activation = bf.Activation.identity() if act == "identity" else bf.Activation.leaky_relu(1.0)
    layer = bf.NormalizationLayer(bf.NormalizationParameters(
        type=ntype, input_shape=per_sample, gamma=gamma, beta=beta, epsilon=1e-5, activation=activation,
        dtype=dtype), bf.FilterParameters(backend=backend))
    dy = rng.standard_normal(shape).astype(dtype)
    want_y, want_dx, constant = reference(x, dy, gamma, beta, kind, 1e-5)
    source = x.copy()
    y = layer.apply(source, output=source if in_place else None)
    if not np.all(np.isfinite(y)) or not close(y, want_y, dtype, constant):
        raise wrong("numerics", f"{backend} {kind} {dtype.__name__} forward: largest error "
                                f"{np.nanmax(np.abs(y - want_y))}")
    grads = layer.apply_backward(x, dy, output=y)
    if not np.all(np.isfinite(grads.input)) or not close(grads.input, want_dx, dtype, constant):
        raise wrong("numerics", f"{backend} {kind} {dtype.__name__} backward: largest error "
                                f"{np.nanmax(np.abs(grads.input - want_dx))}")
    answered("numerics")

"""Compiled (Numba) per-sequence LSTM kernels for the default cell.

:func:`forward_sequence` and :func:`backward_sequence` have the signatures of the reference
kernels (:class:`~bnnsfw.backends._lstm_kernels.LSTMKernels`) and work in the same training
cache layout (``docs/lstm.md``): per step a feature-major ``(6H, N)`` block holding the cell
before the step, the activated gates in the internal order g, f, i, o and ``tanh(c_t)``, and
the hidden state before each step ``(T, H, N)``. The forward weights of the sigmoid gates are
halved (``σ(z) = ½·tanh(z/2) + ½``), so every gate is one ``tanh``.

What is compiled, and why:

- The input projection of all steps stays **one** BLAS product (with the bias folded in),
  outside the loop.
- The time loop is compiled: each step is one BLAS product ``U h_{t−1}`` (``np.dot`` into a
  preallocated buffer; Numba calls the same BLAS as SciPy) and **one** fused pass over the
  ``H·N`` units that adds the step's projection, applies the four gate functions, updates the
  cell and the hidden state and writes the cache block. NumPy needs about ten calls and as
  many passes over memory for the same step.
- Backward is the same: per step one fused pass computing ``dz`` for the four gates and the
  cell gradient from the cached block, then one product ``Uᵀ dz``; ``dz`` goes straight into
  the all-steps ``(4H, T·N)`` matrix the weight gradients are made from.
- float32 uses a rational tanh (an odd polynomial over an even one on ``|x| ≤ 7.9``; largest
  error about 2e-7 absolute, inside the contract's float32 tolerance), which is pure
  multiply-add and one division, so with ``fastmath`` and the NumPy error model (no
  zero-division check) the loop vectorizes. float64 uses ``math.tanh`` (the contract's float64
  tolerance is 1e-9).

Kernels are compiled on first use and cached on disk (``cache=True``; Numba keeps the cache
beside the module, or in ``NUMBA_CACHE_DIR`` when that is set or the package folder is read
only).
"""

from __future__ import annotations

import math
from typing import Sequence

import numba
import numpy as np
from scipy.linalg import blas

from ._lstm_kernels import LSTMKernels, LSTMScratch, LSTMStepPlan, LSTMWeights, gather_output

__all__ = ["forward_sequence", "backward_sequence", "serves"]

_GEMM = {np.dtype(np.float32): blas.sgemm, np.dtype(np.float64): blas.dgemm}
#: Compiled kernels: no GIL, fast math, the NumPy error model (no zero-division check, which
#: would keep the loops from vectorizing), cached on disk.
_kernel = numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True)
_inline = numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True, inline="always")

# The rational tanh's coefficients: numerator odd in x (x·P(x²)), denominator even (Q(x²)),
# as float32 constants so that float32 arithmetic stays float32 (and vectorizes).
_CLAMP = np.float32(7.90531110763549805)
_P0, _P1, _P2, _P3 = (np.float32(4.89352455891786e-03), np.float32(6.37261928875436e-04),
                      np.float32(1.48572235717979e-05), np.float32(5.12229709037114e-08))
_P4, _P5, _P6 = (np.float32(-8.60467152213735e-11), np.float32(2.00018790482477e-13),
                 np.float32(-2.76076847742355e-16))
_Q0, _Q1, _Q2, _Q3 = (np.float32(4.89352518554385e-03), np.float32(2.26843463243900e-03),
                      np.float32(1.18534705686654e-04), np.float32(1.19825839466702e-06))


@_inline
def _tanh(x, rational):
    """tanh(x): the rational approximation (float32) or ``math.tanh`` (float64)."""
    if not rational:
        return math.tanh(x)
    x = min(max(x, -_CLAMP), _CLAMP)
    x2 = x * x
    p = ((((((_P6 * x2 + _P5) * x2 + _P4) * x2 + _P3) * x2 + _P2) * x2 + _P1) * x2 + _P0)
    q = (((_Q3 * x2 + _Q2) * x2 + _Q1) * x2 + _Q0)
    return x * p / q


@_kernel
def _forward_steps(projection, u, steps, hidden, h0, c0, c_last, h_last, reverse, rational):  # noqa: E501
    """The recurrence. ``projection`` holds ``W x_t + b`` (halved rows for the sigmoid gates),
    feature-major ``(≥4H, T·N)`` (column ``t·N + n``); ``u`` (4H, H) the (halved) recurrent
    weights; ``h0``/``c0`` (H, N) or empty (zeros); ``steps`` (T, 6H, N), or (2, 6H, N) in
    inference, where the steps take the two blocks in turn (step t uses block ``t % 2``; a step
    reading and writing one block in place would not vectorize). Writes the step blocks, the
    states before each step, and the last state."""
    seq_len, six_h, batch = hidden.shape[0], steps.shape[1], steps.shape[2]
    blocks = steps.shape[0]
    h = six_h // 6
    z = np.empty((4 * h, batch), steps.dtype)
    half = steps.dtype.type(0.5)
    for k in range(seq_len):
        t = seq_len - 1 - k if reverse else k
        block = steps[t % blocks]
        h_prev = hidden[t]
        if k == 0:
            if h0.size:
                h_prev[:, :] = h0
            else:
                h_prev[:, :] = 0.0
            if c0.size:
                block[:h, :] = c0
            else:
                block[:h, :] = 0.0
        if k == seq_len - 1:
            c_next = c_last
            h_next = h_last
        else:
            following = t - 1 if reverse else t + 1
            c_next = steps[following % blocks, :h]
            h_next = hidden[following]
        if k == 0 and not h0.size:  # U @ 0 adds nothing
            z[:, :] = 0.0
        else:
            np.dot(u, h_prev, z)
        first = t * batch
        for j in range(h):  # one unit's four gates at a time; sequences innermost (unit stride)
            for n in range(batch):
                column = first + n
                g = _tanh(z[j, n] + projection[j, column], rational)
                f = half * _tanh(z[h + j, n] + projection[h + j, column], rational) + half
                i = half * _tanh(z[2 * h + j, n] + projection[2 * h + j, column], rational) + half
                o = half * _tanh(z[3 * h + j, n] + projection[3 * h + j, column], rational) + half
                c = f * block[j, n] + i * g
                a = _tanh(c, rational)
                block[h + j, n] = g
                block[2 * h + j, n] = f
                block[3 * h + j, n] = i
                block[4 * h + j, n] = o
                block[5 * h + j, n] = a
                c_next[j, n] = c
                h_next[j, n] = o * a


@_kernel
def _backward_steps(steps, u_t, dh_all, dh_final, dc, d_gates, dh_first, reverse):
    """Backpropagation through the recurrence. ``dh_all`` (T, H, N) holds the output gradient
    (feature-major; updated in place with the recurrent terms), ``dh_final`` (H, N) or empty,
    ``dc`` (H, N) the cell gradient from after the last step (updated to the one before the
    first), ``u_t`` (H, 4H) the true ``Uᵀ``. Writes ``d_gates`` (4H, T·N) and ``dh_first``."""
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    dz = np.empty((4 * h, batch), steps.dtype)
    recurrent = np.empty((h, batch), steps.dtype)
    one = steps.dtype.type(1.0)
    for k in range(seq_len):
        t = k if reverse else seq_len - 1 - k  # backward walks the forward's steps in reverse
        block = steps[t]
        dh = dh_all[t]
        if k == 0:
            if dh_final.size:
                dh[:, :] += dh_final
        else:
            dh[:, :] += recurrent
        for j in range(h):
            for n in range(batch):
                c_prev = block[j, n]
                g = block[h + j, n]
                f = block[2 * h + j, n]
                i = block[3 * h + j, n]
                o = block[4 * h + j, n]
                a = block[5 * h + j, n]
                d = dh[j, n]
                dz_o = d * a * o * (one - o)
                dcell = dc[j, n] + d * o * (one - a * a)
                dz_g = dcell * i * (one - g * g)
                dz_f = dcell * c_prev * f * (one - f)
                dz_i = dcell * g * i * (one - i)
                dc[j, n] = dcell * f
                dz[j, n] = dz_g
                dz[h + j, n] = dz_f
                dz[2 * h + j, n] = dz_i
                dz[3 * h + j, n] = dz_o
                column = t * batch + n
                d_gates[j, column] = dz_g
                d_gates[h + j, column] = dz_f
                d_gates[2 * h + j, column] = dz_i
                d_gates[3 * h + j, column] = dz_o
        if k == seq_len - 1:
            np.dot(u_t, dz, dh_first)
        else:
            np.dot(u_t, dz, recurrent)


def serves(plan: LSTMStepPlan, lengths: np.ndarray | None) -> bool:
    """True for the default cell with every sequence running the whole length."""
    return plan.default_cell and lengths is None


def _feature_major(state: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """An (N, H) state as a contiguous (H, N) array; an empty one for "zeros"."""
    if state is None:
        return np.empty((0, 0), dtype)
    return np.ascontiguousarray(state.T)


def forward_sequence(
    plan: LSTMStepPlan,
    w: LSTMWeights,
    x2: np.ndarray,
    h0: np.ndarray | None,
    c0: np.ndarray | None,
    steps: np.ndarray,
    pre: np.ndarray | None,
    hidden: np.ndarray | None,
    output: np.ndarray,
    h_final: np.ndarray,
    c_final: np.ndarray,
    *,
    reverse: bool,
    inactive: Sequence[np.ndarray | None],
    scratch: LSTMScratch,
) -> None:
    """The reference kernel's forward (``LSTMKernels.lstm_forward_sequence``), compiled."""
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    size_i = x2.shape[1]
    inputs = scratch.array("lstm_inputs", (seq_len * batch, size_i + 1), dtype)
    np.copyto(inputs[:, :size_i], x2)
    inputs[:, size_i] = 1.0
    # [W | b] @ [X | 1]ᵀ, feature-major (4H + pad, T·N): one product, the bias folded in. SciPy's
    # BLAS, the one the compiled loop calls too: two BLAS libraries would each keep a spinning
    # thread pool and take the cores from each other (measured: 4–20× slower steps).
    projection = scratch.array("lstm_projection", (w.wx_bias.shape[0], seq_len * batch), dtype)
    _GEMM[dtype](1.0, inputs.T, w.wx_bias.T, 0.0, projection.T, 1, 0, 1)
    if hidden is None:  # inference: the states are scratch
        hidden = scratch.array("lstm_hidden", (seq_len, h, batch), dtype)
    c_last = scratch.array("lstm_c_last", (h, batch), dtype)
    h_last = scratch.array("lstm_h_last", (h, batch), dtype)
    blocks = steps if steps.strides[0] else scratch.array("lstm_numba_blocks", (2, six_h, batch), dtype)
    _forward_steps(projection, w.u, blocks, hidden, _feature_major(h0, dtype),
                   _feature_major(c0, dtype), c_last, h_last, reverse, dtype == np.float32)
    np.copyto(h_final, h_last.T)
    np.copyto(c_final, c_last.T)
    gather_output(hidden, h_final, output, reverse)


def backward_sequence(
    plan: LSTMStepPlan,
    w: LSTMWeights,
    steps: np.ndarray,
    pre: np.ndarray | None,
    dy: np.ndarray | None,
    dh_final: np.ndarray | None,
    dc_final: np.ndarray | None,
    dh_initial: np.ndarray,
    dc_initial: np.ndarray,
    d_gates: np.ndarray,
    *,
    reverse: bool,
    active: np.ndarray | None,
    inactive: Sequence[np.ndarray | None],
    c_new: np.ndarray | None,
    scratch: LSTMScratch,
) -> None:
    """The reference kernel's backward (``LSTMKernels.lstm_backward_sequence``), compiled."""
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    dh_all = LSTMKernels._lstm_output_gradient(dy, None, seq_len, h, batch, dtype, scratch)
    dc = scratch.array("lstm_dc", (h, batch), dtype)
    if dc_final is None:
        dc.fill(0.0)
    else:
        np.copyto(dc, dc_final.T)
    dh_first = scratch.array("lstm_dh_first", (h, batch), dtype)
    _backward_steps(steps, w.u_t, dh_all, _feature_major(dh_final, dtype), dc, d_gates, dh_first, reverse)
    np.copyto(dh_initial, dh_first.T)
    np.copyto(dc_initial, dc.T)

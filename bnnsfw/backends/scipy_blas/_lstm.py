"""Faster LSTM kernels for the default cell, calling BLAS ``?gemm`` directly.

:func:`forward_sequence` and :func:`backward_sequence` have the signatures of the
reference kernels (:class:`~bnnsfw.backends._shared.lstm_kernels.LSTMKernels`) and serve the cell
almost every model uses (tanh candidate, sigmoid forget, input and output gates, tanh hidden
activation, no peepholes) when every sequence runs the whole length; the ``scipy-blas``
backend decides that in one place (``ScipyBlasBackend._lstm_sequence_kernels``). The
training cache the layer hands over is aligned to the item size, so BLAS can write into the
step blocks in place. The math and the memory
layout are the reference's, so the training cache is the same on every backend. What
changes is how many Python-level calls a step costs, which is the time at small sizes, and
how much memory a step touches, which is most of the rest once the products are done:

- each product is one call of ``scipy.linalg.blas.?gemm`` with positional arguments on
  Fortran views prepared before the loop (no validation layer, no keyword parsing), and
  every step's array views are taken before the loop too (once only, when inference makes
  all steps share one block);
- the input projection of all steps is one product with the bias folded in (the inputs
  get a column of ones, the weights end in the bias column), row-major ``(T·N, 4H + 16)``;
- a forward step is 1 product and 8 ufunc calls: ``U h`` into the step's gate rows plus
  the step's projection (read transposed; with N = 1 the product accumulates in the
  projection row instead), one ``tanh`` over all four gates (the weights of the sigmoid
  gates are halved), one multiply and one add for the three sigmoid gates,
  ``[c_{t-1}, g] ⊙ [f, i]`` and the sum of its halves written straight into the next
  step's cell rows, ``tanh(c)``, and ``h = o ⊙ tanh(c)`` written feature-major where the
  next product reads it;
- a backward step is 1 product and 4 ufunc calls: what the gradients are multiplied by
  depends only on the cached step (``i(1 − g²)``, ``c_{t-1}·f(1 − f)``, ``g·i(1 − i)``,
  ``tanh(c)·o(1 − o)``, ``o(1 − tanh²(c))``), so it is computed for several steps per call,
  in the row order of ``dz``; then ``[dz_o, dc] = dh ⊙ [·]``, ``dc +=``,
  ``[dz_g, dz_f, dz_i] = dc ⊙ [·]``, ``dc ⊙= f``, and ``Uᵀ dz`` accumulates onto the
  previous step's output gradient (``beta = 1``); ``dz`` is copied into the all-steps
  ``(4H, T·N)`` matrix a few steps at a time, while those steps are still in cache.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy.linalg import blas

from .._shared.lstm_kernels import LSTMKernels, LSTMScratch, LSTMStepPlan, LSTMWeights, gather_output

__all__ = ["forward_sequence", "backward_sequence", "serves"]

_GEMM = {np.dtype(np.float32): blas.sgemm, np.dtype(np.float64): blas.dgemm}

#: Elements of the derivative factors computed per call in backward (a few steps at once
#: when a step is small, so the call count falls; one step when it is large, so they stay
#: in cache).
_FACTOR_CHUNK = 1 << 15
#: Elements of dz copied into the all-steps gradient per call in backward.
_COPY_CHUNK = 1 << 18


def serves(plan: LSTMStepPlan, lengths: np.ndarray | None) -> bool:
    """True when these kernels serve the cell and the lengths: the default cell, float32 or
    float64, every sequence running the whole length."""
    return plan.default_cell and lengths is None


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
    """The reference kernel's forward (``LSTMKernels.lstm_forward_sequence``), for the default cell."""
    gemm = _GEMM[steps.dtype]
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    size_i = x2.shape[1]
    # The inputs with a column of ones, so the projection adds the bias (last column of
    # wx_bias); one product for every step, row-major (T·N, 4H + pad).
    inputs = scratch.array("lstm_inputs", (seq_len * batch, size_i + 1), dtype)
    np.copyto(inputs[:, :size_i], x2)
    inputs[:, size_i] = 1.0
    width = w.wx_bias.shape[0]
    projection = scratch.array("lstm_projection", (seq_len * batch, width), dtype)
    gemm(1.0, w.wx_bias.T, inputs.T, 0.0, projection.T, 1, 0, 1)
    projection_rows = projection.reshape(seq_len, batch, width)  # (N, 4H + pad) per step
    if hidden is None:  # inference: the states are scratch
        hidden = scratch.array("lstm_hidden", (seq_len, h, batch), dtype)
    _steps_forward(gemm, w, projection_rows, h0, c0, steps, hidden, h_final, c_final, reverse,
                   scratch)
    gather_output(hidden, h_final, output, reverse)

def _steps_forward(gemm: Any, w: LSTMWeights, projection_rows: np.ndarray, h0: np.ndarray | None,
                   c0: np.ndarray | None, steps: np.ndarray, hidden: np.ndarray, h_final: np.ndarray,
                   c_final: np.ndarray, reverse: bool, scratch: LSTMScratch) -> None:
    """The recurrence in the cache layout: feature-major step blocks and states."""
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    h2, h4, h5 = 2 * h, 4 * h, 5 * h
    u = w.u.T  # Fortran (H, 4H): the step product is zᵀ = h_prevᵀ · Uᵀ
    pair = scratch.array("lstm_pair", (h2, batch), dtype)
    c_last = scratch.array("lstm_c_last", (h, batch), dtype)
    h_last = scratch.array("lstm_h_last", (h, batch), dtype)
    pair_a, pair_b = pair[:h], pair[h:]
    half = np.array(0.5, dtype)
    tanh, multiply, add, copyto = np.tanh, np.multiply, np.add, np.copyto
    # Every step's views, taken before the loop: lists of T views (of one block when the
    # steps share it, so then they cost nothing).
    reuse = steps.strides[0] == 0

    def per_step(rows: np.ndarray) -> list[np.ndarray]:
        return [rows[0]] * seq_len if reuse else list(rows)

    cell_gate = per_step(steps[:, :h2])  # [c_{t-1}, g]
    gates = per_step(steps[:, h:h5])  # g, f, i, o
    sigmoids = per_step(steps[:, h2:h5])  # f, i, o
    forget_input = per_step(steps[:, h2:h4])
    out_gate = per_step(steps[:, h4:h5])
    cell_act = per_step(steps[:, h5:])
    cells = per_step(steps[:, :h])
    states = list(hidden)
    previous = list(hidden.transpose(0, 2, 1))  # Fortran (H, N) per step, for the product
    if reverse:
        times = range(seq_len - 1, -1, -1)
        next_cell, next_state = [c_last] + cells[:-1], [h_last] + states[:-1]
    else:
        times = range(seq_len)
        next_cell, next_state = cells[1:] + [c_last], states[1:] + [h_last]
    first = times[0]
    if h0 is None:
        states[first].fill(0.0)
    else:
        copyto(states[first], h0.T)
    if c0 is None:
        cells[first].fill(0.0)
    else:
        copyto(cells[first], c0.T)
    skip = first if h0 is None else -1  # U @ 0 adds nothing
    # Two loops that differ in how a step's gates are formed and share the rest: a test
    # of N inside the loop costs 3 % of an N = 1 inference (measured), a helper call more.
    if batch == 1:  # the projection row is contiguous: accumulate there, tanh into the block
        rows = list(projection_rows[:, :, :h4])
        gate_rows = per_step(steps[:, h:h5].transpose(0, 2, 1))
        for t in times:
            if t != skip:
                gemm(1.0, previous[t], u, 1.0, rows[t], 0, 0, 1)
            tanh(rows[t], gate_rows[t])
            s = sigmoids[t]
            multiply(s, half, s)
            add(s, half, s)
            multiply(cell_gate[t], forget_input[t], pair)
            c_next = next_cell[t]
            add(pair_a, pair_b, c_next)
            a = cell_act[t]
            tanh(c_next, a)
            multiply(out_gate[t], a, next_state[t])
    else:  # the product into the block, then the projection, read transposed
        columns = list(projection_rows[:, :, :h4].transpose(0, 2, 1))  # (4H, N) per step
        for t in times:
            z = gates[t]
            if t == skip:
                copyto(z, columns[t])
            else:
                gemm(1.0, previous[t], u, 0.0, z.T, 0, 0, 1)
                add(z, columns[t], z)
            tanh(z, z)
            s = sigmoids[t]
            multiply(s, half, s)
            add(s, half, s)
            multiply(cell_gate[t], forget_input[t], pair)
            c_next = next_cell[t]
            add(pair_a, pair_b, c_next)
            a = cell_act[t]
            tanh(c_next, a)
            multiply(out_gate[t], a, next_state[t])
    copyto(h_final, h_last.T)
    copyto(c_final, c_last.T)


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
    """The reference kernel's backward (``LSTMKernels.lstm_backward_sequence``), for the default cell."""
    gemm = _GEMM[steps.dtype]
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    h2, h3, h4, h5 = 2 * h, 3 * h, 4 * h, 5 * h
    dh_all = LSTMKernels._lstm_output_gradient(dy, None, seq_len, h, batch, dtype, scratch)
    # Per step (5H, N): rows g, f, i, o of dz, then dL/dc through h (scratch).
    d_steps = scratch.array("lstm_d_steps", (seq_len, h5, batch), dtype)
    dc = scratch.array("lstm_dc", (h, batch), dtype)
    dh_first = scratch.array("lstm_dh_first", (h, batch), dtype)
    # What the gradients are multiplied by, from the cached step alone (module docstring),
    # for `chunk` steps at a time: rows i(1−g²), c_{t−1}·f(1−f), g·i(1−i), tanh(c)·o(1−o),
    # o(1−tanh²(c)), in the rows of dz.
    chunk = max(1, min(seq_len, _FACTOR_CHUNK // (h5 * batch)))
    factors = scratch.array("lstm_factors", (chunk, h5, batch), dtype)
    spare = scratch.array("lstm_factors_tmp", (chunk, h3, batch), dtype)
    one = np.array(1.0, dtype)
    times = range(seq_len) if reverse else range(seq_len - 1, -1, -1)
    step = -1 if reverse else 1  # the forward's step
    first, final = times[0], times[-1]
    if dh_final is not None:
        np.add(dh_all[first], dh_final.T, out=dh_all[first])
    if dc_final is None:
        dc.fill(0.0)
    else:
        np.copyto(dc, dc_final.T)
    u = w.u_t.T  # Fortran (4H, H): dhᵀ = dzᵀ · U
    multiply, add, subtract, copyto = np.multiply, np.add, np.subtract, np.copyto
    hn = h * batch
    dc_rows = dc.reshape(1, hn)  # rows of H·N elements: the broadcast products stay 2-D
    # Every step's views, as lists taken before the loop.
    forget = list(steps[:, h2:h3])
    dh_rows = list(dh_all.reshape(seq_len, 1, hn))
    dz_rows = d_steps.reshape(seq_len, 5, hn)
    dz_out = list(dz_rows[:, 3:])  # dz_o, dL/dc through h
    dz_cell_gates = list(dz_rows[:, :3])  # dz_g, dz_f, dz_i
    dz_cell = list(d_steps[:, h4:])
    dz_gates = d_steps[:, :h4]
    dz_product = list(dz_gates.transpose(0, 2, 1))  # Fortran (4H, N) per step
    dh_product = list(dh_all.transpose(0, 2, 1))  # Fortran (H, N) per step
    dh_product = dh_product[1:] + [dh_first.T] if reverse else [dh_first.T] + dh_product[:-1]  # h_{t−1}
    factor_rows = factors.reshape(chunk, 5, hn)
    factor_out, factor_cell_gates = list(factor_rows[:, 3:]), list(factor_rows[:, :3])
    # dz is copied into d_gates (4H, T, N) a few steps at a time, while those steps are in cache.
    d_gates_steps = d_gates.reshape(h4, seq_len, batch)
    copy_every = max(1, _COPY_CHUNK // (h4 * batch))
    start = copied = 0
    for k, t in enumerate(times):
        if k % chunk == 0:
            count = min(chunk, seq_len - k)
            start = t - count + 1 if step == 1 else t
            block = steps[start:start + count]
            fac, sig = factors[:count], spare[:count]
            g, i, o, a = block[:, h:h2], block[:, h3:h4], block[:, h4:h5], block[:, h5:]
            subtract(one, block[:, h2:h5], sig)  # 1 − s for f, i, o
            multiply(sig, block[:, h2:h5], sig)  # s(1 − s)
            multiply(sig[:, :h2], block[:, :h2], fac[:, h:h3])  # f(1−f)·c_{t−1}, i(1−i)·g
            multiply(sig[:, h2:], a, fac[:, h3:h4])  # o(1−o)·tanh(c)
            cell_factor = fac[:, h4:]
            multiply(a, a, cell_factor)
            subtract(one, cell_factor, cell_factor)
            multiply(cell_factor, o, cell_factor)  # o(1 − tanh²(c))
            g_factor = fac[:, :h]
            multiply(g, g, g_factor)
            subtract(one, g_factor, g_factor)
            multiply(g_factor, i, g_factor)  # i(1 − g²)
        j = t - start
        multiply(dh_rows[t], factor_out[j], dz_out[t])  # dz_o, dL/dc through h
        add(dc, dz_cell[t], dc)
        multiply(dc_rows, factor_cell_gates[j], dz_cell_gates[t])  # dz_g, dz_f, dz_i
        multiply(dc, forget[t], dc)  # dL/dc_{t−1}
        gemm(1.0, dz_product[t], u, 0.0 if t == final else 1.0, dh_product[t], 0, 0, 1)
        if k + 1 - copied == copy_every or t == final:
            lo, hi = (t, times[copied] + 1) if step == 1 else (times[copied], t + 1)
            copyto(d_gates_steps[:, lo:hi], dz_gates[lo:hi].transpose(1, 0, 2))
            copied = k + 1
    np.copyto(dh_initial, dh_first.T)
    np.copyto(dc_initial, dc.T)

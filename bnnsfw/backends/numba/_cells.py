"""Compiled (Numba) LSTM kernels for the cells with other activations than the default ones.

:mod:`._lstm_forward` and :mod:`._lstm_backward` compile the cell almost every model uses (tanh
candidate and cell activation, sigmoid forget, input and output gates). These kernels serve
every other cell a layer accepts: any per-element activation (:class:`~bnnsfw.Activation`) on
each gate and on the cell, with its ``alpha`` and ``beta``, with no, diagonal or full peepholes,
over full or variable lengths, in float32 (the backend runs float64 on ``scipy-blas``'s
kernels; these are written for either). They are the reference's per-sequence
kernels (:meth:`~bnnsfw.backends._shared.lstm_kernels.LSTMKernels.lstm_forward_sequence` and
:meth:`~bnnsfw.backends._shared.lstm_kernels.LSTMKernels.lstm_backward_sequence`) compiled: the
same arguments, the same training cache (the step blocks, the hidden states, and the true
pre-activations when a gate's derivative needs its input), the same results up to rounding. So a
cache written by one serves the other, and the weight, bias, peephole and input gradients are
made from the gate gradients of all steps as for every per-sequence kernel: one product each
(:meth:`~bnnsfw.backends._shared.lstm_stack.LSTMStack._lstm_weight_gradients`).

What runs compiled, per layer and direction:

- **forward**: the input projection of all steps as one BLAS product, then per step ``U h``
  (BLAS), the full peepholes' product on the cell before the step when there are any, and
  vectorized passes over the ``H·N`` units of each row block: each gate's pre-activation with
  its diagonal peephole, then its activation; the new cell; the output gate (after its full
  peephole product, which needs every unit's new cell), the cell's activation and the hidden
  state;
- **backward**: per step the same passes in reverse around the full peepholes' products, and
  one product ``Uᵀ dz``; each step's gate gradients go into the all-steps array the weight
  gradients are made from.

Each activation runs in a loop of its own, in which its BNNS number is a constant
(:func:`activate_run`, :func:`derivative_run`; one formula per function, the same as
:mod:`bnnsfw.activation`'s, :func:`_functions` and :func:`_derivatives`), in the dtype of the
arrays: in float32 ``tanh`` and the sigmoid are the default cell's rational ``tanh`` (error
about 2.6e-7), so their loops vectorize. A sigmoid gate, whose forward weights are halved, is
``½·tanh(z/2) + ½`` as in the reference. The fast-math flags are :data:`._lstm_cell.FAST_MATH`
(the same bits in a vectorized loop and its scalar remainder). The kernels are compiled on first
use and cached on disk, as the default cell's are.
"""

from __future__ import annotations

import math
from typing import Sequence

import numba
import numpy as np
from numba import literal_unroll
from numba.core import types
from numba.extending import overload

from ...activation import Activation
from ...enums import ActivationFunction as AF
from . import _cache
from .._shared.lstm_kernels import (LSTMKernels, LSTMScratch, LSTMStepPlan, LSTMWeights, _copy_or_zero,
                                   gather_output)
from ._lstm_cell import FAST_MATH, _mm, _runtime, _tanh
from ._lstm_operands import _EMPTY, _feature_major, _repeated

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry

__all__ = ["activate", "derivative", "activate_run", "derivative_run", "serves", "forward_sequence",
           "backward_sequence"]

_kernel = numba.njit(nogil=True, fastmath=FAST_MATH, error_model="numpy", cache=True)

# The BNNS numbers of the functions, as plain integers: constants in compiled code.
_IDENTITY, _RELU, _LEAKY_RELU, _SIGMOID = int(AF.identity), int(AF.relu), int(AF.leaky_relu), int(AF.sigmoid)
_TANH, _SCALED_TANH, _ABS, _LINEAR = int(AF.tanh), int(AF.scaled_tanh), int(AF.abs), int(AF.linear)
_CLAMP, _GELU_TANH, _HARD_SIGMOID = int(AF.clamp), int(AF.gelu_approximation), int(AF.hard_sigmoid)
_SOFTPLUS, _SOFTSIGN, _ELU = int(AF.softplus), int(AF.softsign), int(AF.elu)
_CLAMPED_LEAKY_RELU, _LINEAR_WITH_BIAS = int(AF.clamped_leaky_relu), int(AF.linear_with_bias)
_LOG_SIGMOID, _SELU, _CELU = int(AF.log_sigmoid), int(AF.selu), int(AF.celu)
_HARD_SHRINK, _SOFT_SHRINK, _TANH_SHRINK = int(AF.hard_shrink), int(AF.soft_shrink), int(AF.tanh_shrink)
_THRESHOLD, _HARD_SWISH, _SILU, _RELU6 = int(AF.threshold), int(AF.hard_swish), int(AF.silu), int(AF.relu6)
_ERF, _GELU, _GELU_SIGMOID = int(AF.erf), int(AF.gelu), int(AF.gelu_approximation_sigmoid)

#: The per-element functions' numbers: :func:`activate_run` and :func:`derivative_run` give
#: each a loop of its own, in which it is a constant. Those made of multiply-adds,
#: comparisons, divisions and tanh (the rational one in float32) vectorize there; the others
#: (exp, expm1, log1p, erf) call the library's scalar functions. One loop choosing the
#: function per element took 42 ns an element for softplus.
_ALL_FUNCTIONS = tuple(int(f) for f in AF if f.is_elementwise)

_SELU_LAMBDA = 1.0507009873554805
_SELU_ALPHA = 1.6732632423543772
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_GELU_SIGMOID_SCALE = 1.702


def serves(plan: LSTMStepPlan) -> bool:
    """True for the cells these kernels compute: every activation per element (a layer
    accepts no other)."""
    return all(a.is_elementwise for a in (*plan.activations, plan.hidden_activation))


# --------------------------------------------------------------------------------------
# The activations, one formula per function.
# --------------------------------------------------------------------------------------
def _constants(x):
    """The constants of the formulas in the type of ``x`` (a Numba type), so that float32
    arithmetic stays float32."""
    real = np.float32 if x == types.float32 else np.float64
    return tuple(real(v) for v in (0.0, 0.5, 1.0, 2.0, 3.0, 6.0, _SELU_LAMBDA, _SELU_ALPHA, _INV_SQRT_2,
                                   _INV_SQRT_2PI, _TWO_OVER_SQRT_PI, _GELU_SIGMOID_SCALE))


def _expit(v):  # pragma: no cover - compiled code takes the overload below
    """The logistic sigmoid, in compiled code."""
    raise TypeError("_expit runs in compiled code only")


@overload(_expit, inline="always", jit_options=dict(fastmath=FAST_MATH, error_model="numpy"))
def _expit_typed(v):
    """σ(v) = ½·tanh(v/2) + ½ in ``v``'s type: the rational tanh in float32, which vectorizes."""
    HALF = _constants(v)[1]
    return lambda v: HALF * _tanh(HALF * v) + HALF


def _log1p_exp(v):  # pragma: no cover - compiled code takes the overload below
    """``log(1 + eᵛ)``, in compiled code."""
    raise TypeError("_log1p_exp runs in compiled code only")


@overload(_log1p_exp, inline="always", jit_options=dict(fastmath=FAST_MATH, error_model="numpy"))
def _log1p_exp_typed(v):
    """``log(1 + eᵛ)`` without overflow, in ``v``'s type."""
    ZERO = _constants(v)[0]
    return lambda v: max(v, ZERO) + math.log1p(math.exp(-abs(v)))


def _functions(x):
    """Each function's formula, by BNNS number, as ``f(code, a, b, x)`` with the constants in
    ``x``'s type (a Numba type): what :func:`activate` compiles for one function."""
    ZERO, HALF, ONE, _, THREE, SIX, SELU_L, SELU_A, INV_SQRT_2, _, _, GELU_K = _constants(x)
    return {
        _IDENTITY: lambda code, a, b, x: x,
        _RELU: lambda code, a, b, x: ZERO if x < ZERO else x,
        _LEAKY_RELU: lambda code, a, b, x: a * x if x < ZERO else x,
        _SIGMOID: lambda code, a, b, x: _expit(x),
        _TANH: lambda code, a, b, x: _tanh(x),
        _SCALED_TANH: lambda code, a, b, x: a * _tanh(b * x),
        _ABS: lambda code, a, b, x: abs(x),
        _LINEAR: lambda code, a, b, x: a * x,
        _CLAMP: lambda code, a, b, x: min(max(x, a), b),
        _GELU_TANH: lambda code, a, b, x: HALF * x * (ONE + _tanh(a * (x + b * x * x * x))),
        _HARD_SIGMOID: lambda code, a, b, x: min(max(a * x + b, ZERO), ONE),
        _SOFTPLUS: lambda code, a, b, x: a * _log1p_exp(b * x),
        _SOFTSIGN: lambda code, a, b, x: x / (ONE + abs(x)),
        _ELU: lambda code, a, b, x: a * math.expm1(x) if x < ZERO else x,
        _CLAMPED_LEAKY_RELU: lambda code, a, b, x: min(a * x if x < ZERO else x, b),
        _LINEAR_WITH_BIAS: lambda code, a, b, x: a * x + b,
        _LOG_SIGMOID: lambda code, a, b, x: -_log1p_exp(-x),
        _SELU: lambda code, a, b, x: SELU_L * (x if x > ZERO else SELU_A * math.expm1(x)),
        _CELU: lambda code, a, b, x: max(x, ZERO) + min(ZERO, a * math.expm1(min(x, ZERO) / a)),
        _HARD_SHRINK: lambda code, a, b, x: x if abs(x) > a else ZERO,
        _SOFT_SHRINK: lambda code, a, b, x: x - a if x > a else (x + a if x < -a else ZERO),
        _TANH_SHRINK: lambda code, a, b, x: x - _tanh(x),
        _THRESHOLD: lambda code, a, b, x: b if x <= a else x,
        _HARD_SWISH: lambda code, a, b, x: x * min(max(x + THREE, ZERO), SIX) / SIX,
        _SILU: lambda code, a, b, x: x * _expit(x),
        _RELU6: lambda code, a, b, x: min(max(x, ZERO), SIX),
        _ERF: lambda code, a, b, x: math.erf(x),
        _GELU: lambda code, a, b, x: HALF * x * (ONE + math.erf(x * INV_SQRT_2)),
        _GELU_SIGMOID: lambda code, a, b, x: x * _expit(GELU_K * x),
    }


def _derivatives(x):
    """Each function's derivative, by BNNS number, as ``d(code, a, b, x, y)`` with ``y`` the
    value at ``x``: from ``y`` for the functions it determines
    (:attr:`Activation.derivative_from_output`; ``x`` may then hold anything), from ``x`` for
    the others."""
    ZERO, HALF, ONE, TWO, THREE, SIX, SELU_L, SELU_A, INV_SQRT_2, INV_SQRT_2PI, TWO_OVER_SQRT_PI, GELU_K = \
        _constants(x)

    def gelu_tanh(code, a, b, x, y):
        t = _tanh(a * (x + b * x * x * x))
        return HALF * (ONE + t) + HALF * x * (ONE - t * t) * a * (ONE + THREE * b * x * x)

    def softsign(code, a, b, x, y):
        d = ONE + abs(x)
        return ONE / (d * d)

    def clamped_leaky_relu(code, a, b, x, y):
        if x < ZERO:
            return a if a * x < b else ZERO
        return ONE if x < b else ZERO

    def silu(code, a, b, x, y):
        s = _expit(x)
        return s + x * s * (ONE - s)

    def gelu_sigmoid(code, a, b, x, y):
        s = _expit(GELU_K * x)
        return s + GELU_K * x * s * (ONE - s)

    return {
        _IDENTITY: lambda code, a, b, x, y: ONE,
        _RELU: lambda code, a, b, x, y: ONE if y > ZERO else ZERO,
        _LEAKY_RELU: lambda code, a, b, x, y: a if x < ZERO else ONE,
        _SIGMOID: lambda code, a, b, x, y: y * (ONE - y),
        _TANH: lambda code, a, b, x, y: ONE - y * y,
        _SCALED_TANH: lambda code, a, b, x, y: ZERO if a == ZERO else a * b * (ONE - (y / a) * (y / a)),
        _ABS: lambda code, a, b, x, y: ONE if x > ZERO else (-ONE if x < ZERO else ZERO),
        _LINEAR: lambda code, a, b, x, y: a,
        _CLAMP: lambda code, a, b, x, y: ONE if a < x < b else ZERO,
        _GELU_TANH: gelu_tanh,
        _HARD_SIGMOID: lambda code, a, b, x, y: a if ZERO < y < ONE else ZERO,
        _SOFTPLUS: lambda code, a, b, x, y: a * b * _expit(b * x),
        _SOFTSIGN: softsign,
        _ELU: lambda code, a, b, x, y: a * math.exp(x) if x < ZERO else ONE,
        _CLAMPED_LEAKY_RELU: clamped_leaky_relu,
        _LINEAR_WITH_BIAS: lambda code, a, b, x, y: a,
        _LOG_SIGMOID: lambda code, a, b, x, y: _expit(-x),
        _SELU: lambda code, a, b, x, y: SELU_L if x > ZERO else SELU_L * SELU_A * math.exp(x),
        _CELU: lambda code, a, b, x, y: ONE if x > ZERO else math.exp(min(x, ZERO) / a),
        _HARD_SHRINK: lambda code, a, b, x, y: ONE if abs(x) > a else ZERO,
        _SOFT_SHRINK: lambda code, a, b, x, y: ONE if abs(x) > a else ZERO,
        _TANH_SHRINK: lambda code, a, b, x, y: _tanh(x) * _tanh(x),
        _THRESHOLD: lambda code, a, b, x, y: ONE if x > a else ZERO,
        _HARD_SWISH: lambda code, a, b, x, y: (ZERO if x < -THREE else
                                               (ONE if x > THREE else (TWO * x + THREE) / SIX)),
        _SILU: silu,
        _RELU6: lambda code, a, b, x, y: ONE if ZERO < y < SIX else ZERO,
        _ERF: lambda code, a, b, x, y: TWO_OVER_SQRT_PI * math.exp(-x * x),
        _GELU: lambda code, a, b, x, y: (HALF * (ONE + math.erf(x * INV_SQRT_2))
                                         + x * math.exp(-HALF * x * x) * INV_SQRT_2PI),
        _GELU_SIGMOID: gelu_sigmoid,
    }


def activate(code, a, b, x):  # pragma: no cover - compiled code takes the overload below
    """Activation ``code`` (its BNNS number, a constant) with parameters ``a``, ``b`` at ``x``,
    in ``x``'s type; in compiled code only (:func:`activate_run` applies it to arrays)."""
    raise TypeError("activate runs in compiled code only")


def derivative(code, a, b, x, y):  # pragma: no cover - compiled code takes the overload below
    """The derivative of activation ``code`` (a constant) at ``x``, whose value is ``y``; in
    compiled code only (:func:`derivative_run`)."""
    raise TypeError("derivative runs in compiled code only")


@overload(activate, prefer_literal=True, jit_options=dict(fastmath=FAST_MATH, error_model="numpy"))
def _activate_typed(code, a, b, x):
    """The formula of the function numbered ``code`` alone, for ``x``'s type (``a`` and ``b``
    in that type too); ``code`` must be a constant."""
    if isinstance(code, types.IntegerLiteral):
        return _functions(x).get(code.literal_value)
    return None


@overload(derivative, prefer_literal=True, jit_options=dict(fastmath=FAST_MATH, error_model="numpy"))
def _derivative_typed(code, a, b, x, y):
    """:func:`activate`'s derivative, as it is typed."""
    if isinstance(code, types.IntegerLiteral):
        return _derivatives(x).get(code.literal_value)
    return None


@_kernel
def activate_run(code, a, b, halved, src, dst):
    """``dst = act(src)`` over two 1-D runs for activation ``code`` with parameters ``a``,
    ``b`` (in the runs' dtype); with ``halved``, the sigmoid of a gate whose forward weights
    are halved: ``½·tanh(src) + ½``. ``dst`` should not be ``src``: a loop whose output is its
    input stays scalar (LLVM's check that the two do not overlap fails: 2.0 ns an element
    against 0.26 for tanh). NaN for a number that is not a per-element function."""
    half = dst.dtype.type(0.5)
    if halved:
        for e in range(src.size):
            dst[e] = half * activate(_TANH, a, b, src[e]) + half
        return
    done = False
    for known in literal_unroll(_ALL_FUNCTIONS):
        if code == known:
            for e in range(src.size):
                dst[e] = activate(known, a, b, src[e])
            done = True
    if not done:
        dst[:] = np.nan


@_kernel
def derivative_run(code, a, b, x, y, grad):
    """``grad *= act'(x)`` over 1-D runs, ``y = act(x)`` (``x`` may be ``y`` itself for the
    functions whose derivative ``y`` determines), a loop per function as in
    :func:`activate_run`."""
    done = False
    for known in literal_unroll(_ALL_FUNCTIONS):
        if code == known:
            for e in range(grad.size):
                grad[e] *= derivative(known, a, b, x[e], y[e])
            done = True
    if not done:
        grad[:] = np.nan


# --------------------------------------------------------------------------------------
# Forward.
# --------------------------------------------------------------------------------------
@_kernel
def _forward(x2, wx, bias, u, full_pre, full_out, pe, codes, alphas, betas, halved, h0, c0, inactive,
             projection, keep, staging, steps, pre, hidden, c_last, h_last, reverse):
    """One layer and direction forward.

    ``x2`` (T·N, I) the layer input; ``wx`` (4H, I), ``bias`` (4H, 1), ``u`` (4H, H) the forward
    weights (rows of sigmoid gates halved), ``full_pre`` (4H, H) the full peepholes of the
    candidate, forget and input gates and ``full_out`` (H, H) the output gate's ((0, 0)
    without), ``pe`` (4, H·N) the diagonal peepholes repeated over the sequences (zeros
    without); ``codes`` (5,) the activations' BNNS numbers, ``alphas`` and ``betas`` (5,) their
    parameters, gates in the internal order then the cell's activation; ``halved`` (4,) the
    sigmoid gates; ``h0``, ``c0`` (H, N) or (0, 0) for zeros; ``inactive`` (T, N), true where a
    sequence is past its length, or (0, 0); ``projection`` (4H, T·N), ``keep`` and
    ``staging`` (H, N) scratch; ``steps`` (T, 6H, N) the step blocks, or (1, 6H, N) for one
    block all steps share (inference); ``pre`` (T, 4H, N) receives the true pre-activations,
    or (0, 0, 0); ``hidden`` (T, H, N) the state before each step; ``c_last``, ``h_last``
    (H, N) receive the final states."""
    seq_len, h, batch = hidden.shape
    blocks = steps.shape[0]
    m = h * batch
    _mm(wx, False, x2, True, projection, 0.0)
    first = seq_len - 1 if reverse else 0
    for j in range(h):
        for n in range(batch):
            hidden[first, j, n] = h0[j, n] if h0.size else 0.0
            steps[first % blocks, j, n] = c0[j, n] if c0.size else 0.0
    for k in range(seq_len):
        t = seq_len - 1 - k if reverse else k
        following = t - 1 if reverse else t + 1
        last = k == seq_len - 1
        block = steps[t % blocks]
        h_prev = hidden[t]
        c_next = c_last if last else steps[following % blocks, :h]
        h_next = h_last if last else hidden[following]
        rows = block.reshape(6 * m)
        c_prev, cell, hid, staged = rows[:m], c_next.reshape(m), h_next.reshape(m), staging.reshape(m)
        z = block[h:5 * h]
        for r in range(4 * h):
            for n in range(batch):
                z[r, n] = projection[r, t * batch + n] + bias[r, 0]
        if k > 0 or h0.size:  # U @ 0 adds nothing
            _mm(u, False, h_prev, False, z, 1.0)
        if full_pre.size:
            _mm(full_pre, False, block[:h], False, z, 1.0)
        held = False
        if inactive.size:  # the cells of sequences past their length, before the step overwrites them
            for n in range(batch):
                if inactive[t, n]:
                    held = True
                    for j in range(h):
                        keep[j, n] = block[j, n]
        for gate in range(3):  # the candidate, forget and input gates
            gate_rows = rows[(gate + 1) * m:(gate + 2) * m]
            _pre_activation(gate_rows, pe[gate], c_prev, pre, t, gate, halved[gate], staged)
            activate_run(codes[gate], alphas[gate], betas[gate], halved[gate], staged, gate_rows)
        g, f, i = rows[m:2 * m], rows[2 * m:3 * m], rows[3 * m:4 * m]
        for e in range(m):
            cell[e] = f[e] * c_prev[e] + i[e] * g[e]
        if held:  # past its length: the state stays
            for n in range(batch):
                if inactive[t, n]:
                    for j in range(h):
                        c_next[j, n] = keep[j, n]
        if full_out.size:  # the output gate sees every unit's new cell
            _mm(full_out, False, c_next, False, z[3 * h:], 1.0)
        o, act = rows[4 * m:5 * m], rows[5 * m:]
        _pre_activation(o, pe[3], cell, pre, t, 3, halved[3], staged)
        activate_run(codes[3], alphas[3], betas[3], halved[3], staged, o)
        activate_run(codes[4], alphas[4], betas[4], _runtime(False), cell, act)  # the gates' specialization
        for e in range(m):
            hid[e] = o[e] * act[e]
        if held:
            for n in range(batch):
                if inactive[t, n]:
                    for j in range(h):
                        h_next[j, n] = h_prev[j, n]


@_kernel
def _pre_activation(z, p, c, pre, t, gate, halved, staged):
    """One gate's pre-activations ``z`` (a run of H·N) plus its diagonal peepholes ``p`` times
    the cell ``c``, into ``staged``; the true ones (twice those of a halved gate) into
    ``pre``'s rows of the gate at step ``t`` when ``pre`` is not empty. The activation then
    reads ``staged`` and writes ``z`` (:func:`activate_run`: not in place)."""
    m = z.size
    for e in range(m):
        staged[e] = z[e] + p[e] * c[e]
    if pre.size:
        scale = z.dtype.type(2.0 if halved else 1.0)
        out = pre[t].reshape(4 * m)[gate * m:(gate + 1) * m]
        for e in range(m):
            out[e] = scale * staged[e]


# --------------------------------------------------------------------------------------
# Backward.
# --------------------------------------------------------------------------------------
@_kernel
def _backward(steps, pre, dh_all, u_t, full_pre_grad, full_out_grad, pe, codes, alphas, betas, inactive,
              d_gates, c_new, dc, dz, work, keep, cell_scratch, dh_first, reverse):
    """One layer and direction backward through time.

    ``steps``, ``pre`` what the training forward left (``pre`` (0, 0, 0) when not kept);
    ``dh_all`` (T, H, N) the gradient with respect to each step's hidden state from the
    output, to which each step adds its recurrent term; ``u_t`` (H, 4H), ``full_pre_grad`` (4H,
    H) or (0, 0), ``full_out_grad`` (H, H) or (0, 0), ``pe`` (4, H·N) the true weights;
    ``codes``, ``alphas``, ``betas``, ``inactive`` as :func:`_forward` takes them; ``d_gates``
    (4H, T·N) receives the gradient with respect to every true gate pre-activation (column
    ``t·N + n``); ``c_new`` (T, H, N) receives each step's new cell, or (0, 0, 0); ``dc`` (H, N)
    holds the gradient with respect to the final cell on entry, that with respect to the
    initial one on exit; ``dz`` (4H, N), ``work``, ``keep`` and ``cell_scratch`` (H, N)
    scratch; ``dh_first`` (H, N) receives the gradient with respect to the initial hidden
    state."""
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    m = h * batch
    dz_rows, carry, dc_rows = dz.reshape(4 * m), work.reshape(m), dc.reshape(m)
    dz_g, dz_f, dz_i, dz_o = dz_rows[:m], dz_rows[m:2 * m], dz_rows[2 * m:3 * m], dz_rows[3 * m:]
    for k in range(seq_len):
        t = k if reverse else seq_len - 1 - k
        last = k == seq_len - 1
        rows = steps[t].reshape(6 * m)
        c_prev, g, f, i, o, act = (rows[:m], rows[m:2 * m], rows[2 * m:3 * m], rows[3 * m:4 * m],
                                   rows[4 * m:5 * m], rows[5 * m:])
        before = pre[t].reshape(4 * m) if pre.size else rows[m:5 * m]  # a gate's input, or its output
        dh = dh_all[t].reshape(m)
        cell = c_new[t].reshape(m) if c_new.size else cell_scratch.reshape(m)
        held = False
        if inactive.size:
            for n in range(batch):
                if inactive[t, n]:
                    held = True
                    for j in range(h):
                        keep[j, n] = dc[j, n]
        for e in range(m):
            cell[e] = f[e] * c_prev[e] + i[e] * g[e]
            dz_o[e] = dh[e] * act[e]
            carry[e] = dh[e] * o[e]
        derivative_run(codes[4], alphas[4], betas[4], cell, act, carry)
        derivative_run(codes[3], alphas[3], betas[3], before[3 * m:], o, dz_o)
        if held:
            _zero_columns(dz, inactive[t], 3 * h, 4 * h)
        p_o = pe[3]
        for e in range(m):
            carry[e] += dc_rows[e] + p_o[e] * dz_o[e]
        if full_out_grad.size:
            _mm(full_out_grad, True, dz[3 * h:], False, work, 1.0)
        for e in range(m):
            dz_g[e] = carry[e] * i[e]
            dz_f[e] = carry[e] * c_prev[e]
            dz_i[e] = carry[e] * g[e]
        derivative_run(codes[0], alphas[0], betas[0], before[:m], g, dz_g)
        derivative_run(codes[1], alphas[1], betas[1], before[m:2 * m], f, dz_f)
        derivative_run(codes[2], alphas[2], betas[2], before[2 * m:3 * m], i, dz_i)
        if held:
            _zero_columns(dz, inactive[t], 0, 3 * h)
        p_g, p_f, p_i = pe[0], pe[1], pe[2]
        for e in range(m):
            dc_rows[e] = carry[e] * f[e] + p_g[e] * dz_g[e] + p_f[e] * dz_f[e] + p_i[e] * dz_i[e]
        if full_pre_grad.size:
            _mm(full_pre_grad, True, dz, False, dc, 1.0)
        target = dh_first if last else dh_all[t + 1 if reverse else t - 1]
        _mm(u_t, False, dz, False, target, 0.0 if last else 1.0)
        if held:  # a sequence past its length passes dh and dc through (its dz is 0)
            for n in range(batch):
                if inactive[t, n]:
                    for j in range(h):
                        target[j, n] += dh_all[t, j, n]
                        dc[j, n] = keep[j, n]
        for r in range(4 * h):
            for n in range(batch):
                d_gates[r, t * batch + n] = dz[r, n]


@_kernel
def _zero_columns(dz, inactive, r0, r1):
    """Rows ``r0 … r1 − 1`` of ``dz`` (4H, N) zero in the columns of the sequences past their
    length."""
    for n in range(dz.shape[1]):
        if inactive[n]:
            for r in range(r0, r1):
                dz[r, n] = 0.0


# --------------------------------------------------------------------------------------
# The per-sequence kernels (the reference's signatures).
# --------------------------------------------------------------------------------------
def _activation_numbers(plan: LSTMStepPlan,
                        dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The activations of the gates (internal order) and of the cell as the kernels take them:
    BNNS numbers, alphas, betas (in ``dtype``); and which gates are halved sigmoids."""
    acts: tuple[Activation, ...] = (*plan.activations, plan.hidden_activation)
    return (np.array([int(a.function) for a in acts], np.int64), np.array([a.alpha for a in acts], dtype),
            np.array([a.beta for a in acts], dtype), np.array(plan.halved, np.bool_))


def _matrix(m: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """``m``, or an empty (0, 0) matrix for none."""
    return _EMPTY[dtype] if m is None else m


def _inactive(inactive: Sequence[np.ndarray | None], batch: int) -> np.ndarray:
    """(T, N): the sequences past their length at each step, or (0, 0) when none is."""
    if all(mask is None for mask in inactive):
        return np.zeros((0, 0), np.bool_)
    out = np.zeros((len(inactive), batch), np.bool_)
    for t, mask in enumerate(inactive):
        if mask is not None:
            out[t] = mask.reshape(batch)
    return out


def forward_sequence(plan: LSTMStepPlan, w: LSTMWeights, x2: np.ndarray, h0: np.ndarray | None,
                     c0: np.ndarray | None, steps: np.ndarray, pre: np.ndarray | None,
                     hidden: np.ndarray | None,
                     output: np.ndarray, h_final: np.ndarray, c_final: np.ndarray, *, reverse: bool,
                     inactive: Sequence[np.ndarray | None], scratch: LSTMScratch) -> None:
    """One layer and direction forward (the arguments of
    :meth:`~bnnsfw.backends._shared.lstm_kernels.LSTMKernels.lstm_forward_sequence`)."""
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    if hidden is None:
        hidden = scratch.array("lstm_hidden", (seq_len, h, batch), dtype)
    if steps.strides[0] == 0:  # one block for every step (inference)
        steps = steps[:1]
    codes, alphas, betas, halved = _activation_numbers(plan, dtype)
    c_last = scratch.array("lstm_c_last", (h, batch), dtype)
    h_last = scratch.array("lstm_h_last", (h, batch), dtype)
    _forward(x2, w.wx, w.bias, w.u, _matrix(w.full_pre, dtype), _matrix(w.peepholes.full_output, dtype),
             _repeated(w.peepholes.diagonal, h, batch, dtype), codes, alphas, betas, halved,
             _feature_major(h0, dtype), _feature_major(c0, dtype), _inactive(inactive, batch),
             scratch.array("lstm_projection", (4 * h, seq_len * batch), dtype),
             scratch.array("lstm_keep", (h, batch), dtype), scratch.array("lstm_tmp", (h, batch), dtype),
             steps,
             np.zeros((0, 0, 0), dtype) if pre is None else pre, hidden, c_last, h_last, reverse)
    np.copyto(h_final, h_last.T)
    np.copyto(c_final, c_last.T)
    gather_output(hidden, h_final, output, reverse)


def backward_sequence(plan: LSTMStepPlan, w: LSTMWeights, steps: np.ndarray, pre: np.ndarray | None,
                      dy: np.ndarray | None, dh_final: np.ndarray | None, dc_final: np.ndarray | None,
                      dh_initial: np.ndarray, dc_initial: np.ndarray, d_gates: np.ndarray, *, reverse: bool,
                      active: np.ndarray | None, inactive: Sequence[np.ndarray | None],
                      c_new: np.ndarray | None,
                      scratch: LSTMScratch) -> None:
    """One layer and direction backward through time (the arguments of
    :meth:`~bnnsfw.backends._shared.lstm_kernels.LSTMKernels.lstm_backward_sequence`)."""
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    dh_all = LSTMKernels._lstm_output_gradient(dy, active, seq_len, h, batch, dtype, scratch)
    if dh_final is not None:
        start = 0 if reverse else seq_len - 1
        np.add(dh_all[start], dh_final.T, out=dh_all[start])
    dc = scratch.array("lstm_dc", (h, batch), dtype)
    _copy_or_zero(dc, None if dc_final is None else dc_final.T)
    dh_first = scratch.array("lstm_dh_first", (h, batch), dtype)
    codes, alphas, betas, _ = _activation_numbers(plan, dtype)
    peep = w.peepholes_grad
    _backward(steps, np.zeros((0, 0, 0), dtype) if pre is None else pre, dh_all, w.u_t,
              _matrix(w.full_pre_grad, dtype), _matrix(peep.full_output, dtype),
              _repeated(peep.diagonal, h, batch, dtype), codes, alphas, betas, _inactive(inactive, batch),
              d_gates,
              np.zeros((0, 0, 0), dtype) if c_new is None else c_new, dc,
              scratch.array("lstm_dz", (4 * h, batch), dtype),
              scratch.array("lstm_tmp", (h, batch), dtype),
              scratch.array("lstm_keep", (h, batch), dtype), scratch.array("lstm_cell", (h, batch), dtype),
              dh_first, reverse)
    np.copyto(dh_initial, dh_first.T)
    np.copyto(dc_initial, dc.T)

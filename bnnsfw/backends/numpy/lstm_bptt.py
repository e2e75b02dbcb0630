"""The LSTM and its backpropagation through time, written to be read top to bottom.

One layer, one direction, the cell of BNNS (and of ``LSTMLayer``) with its default
activations and diagonal peepholes, in plain NumPy: the two activations, the weights, the
forward pass over the steps, then the backward pass over the same steps in reverse, each
gradient beside its equation. The notation is that of the LSTM page of the documentation
(``docs/lstm.md``, sections "Equations" and "Backward (backpropagation through time)"), which
explains each line; this file is also the oracle the backends' fast kernels are tested against.

Read ``forward`` first: each line is one equation of the cell. ``backward`` walks the steps
from the last to the first; at each step it turns δh_t and δc_t into the four gates' δ, adds
each gate's share to the weight gradients, and carries the gradients of h_{t-1} and c_{t-1}
back to the step before.

Conventions, as ``LSTMLayer`` has them:

- ``x`` is ``(T, N, I)``: T steps, N sequences, I input features (BNNS layout SNE). Each row
  of ``x[t]``, ``h`` and ``c`` is one sequence, so the term ``W x_t`` is ``x_t @ W.T`` here.
- Gates in the order i (input), f (forget), g (candidate), o (output). Gate k has input
  weights ``W[k]`` ``(H, I)``, recurrent weights ``U[k]`` ``(H, H)`` (row = output unit, as in
  the layer's ``input_weights`` and ``hidden_weights``) and a bias ``b[k]`` ``(H,)``.
- Peepholes are diagonal, vectors ``p[k]`` ``(H,)`` for i, f and o: i and f see the previous
  cell ``c_{t-1}``, o sees the new cell ``c_t``. A cell without peepholes is the one with
  ``p = 0``; one without bias has ``b = 0``. (The layer also takes full peephole matrices and
  a peephole on g; they are left out here.)

>>> rng = np.random.default_rng(0)
>>> w = random_weights(input_size=3, hidden_size=4, rng=rng)
>>> x = rng.standard_normal((5, 2, 3))                          # T = 5 steps, N = 2 sequences
>>> h0 = c0 = np.zeros((2, 4))
>>> out = forward(x, w, h0, c0)
>>> out.outputs.shape, out.h.shape
((5, 2, 4), (2, 4))
>>> grads = backward(np.ones_like(out.outputs), np.zeros_like(h0), np.zeros_like(c0), out.steps, w)
>>> grads.weights.U["f"].shape, grads.x.shape
((4, 4), (5, 2, 3))
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

GATES = ("i", "f", "g", "o")
PEEPHOLES = ("i", "f", "o")


def sigmoid(z: np.ndarray) -> np.ndarray:
    """σ(z) = 1 / (1 + e^(−z)); its derivative is σ(z)(1 − σ(z))."""
    return 1.0 / (1.0 + np.exp(-z))


def tanh(z: np.ndarray) -> np.ndarray:
    """tanh(z); its derivative is 1 − tanh²(z)."""
    return np.tanh(z)


class Weights(NamedTuple):
    """W[k] (H, I), U[k] (H, H), b[k] (H,) for k in i, f, g, o; p[k] (H,) for k in i, f, o.

    The gradients have the same form: ``grads.weights.W["o"]`` is ∂L/∂W_o.
    """

    W: dict[str, np.ndarray]
    U: dict[str, np.ndarray]
    b: dict[str, np.ndarray]
    p: dict[str, np.ndarray]


def random_weights(input_size: int, hidden_size: int, rng: np.random.Generator,
                   peepholes: bool = True) -> Weights:
    """Weights drawn from U(−1/√H, 1/√H), float64; ``peepholes=False`` sets every p to 0."""
    bound = 1.0 / np.sqrt(hidden_size)

    def draw(*shape: int) -> np.ndarray:
        return rng.uniform(-bound, bound, shape)

    return Weights(W={k: draw(hidden_size, input_size) for k in GATES},
                   U={k: draw(hidden_size, hidden_size) for k in GATES},
                   b={k: draw(hidden_size) for k in GATES},
                   p={k: draw(hidden_size) if peepholes else np.zeros(hidden_size) for k in PEEPHOLES})


class Step(NamedTuple):
    """What the forward pass keeps of one step for the backward pass."""

    x: np.ndarray         # x_t       (N, I)
    h_prev: np.ndarray    # h_{t-1}   (N, H)
    c_prev: np.ndarray    # c_{t-1}   (N, H)
    i: np.ndarray         # the gates after their activations, (N, H) each
    f: np.ndarray
    g: np.ndarray
    o: np.ndarray
    c: np.ndarray         # c_t       (N, H)


class Forward(NamedTuple):
    outputs: np.ndarray   # h_t of every step, (T, N, H)
    h: np.ndarray         # the final states h_T, c_T, (N, H)
    c: np.ndarray
    steps: list[Step]     # what backward needs, one record per step


def forward(x: np.ndarray, w: Weights, h0: np.ndarray, c0: np.ndarray) -> Forward:
    """Run the cell over ``x`` (T, N, I) from the states ``h0``, ``c0`` (N, H)."""

    def affine(k: str, x_t: np.ndarray, h_prev: np.ndarray) -> np.ndarray:
        return x_t @ w.W[k].T + h_prev @ w.U[k].T + w.b[k]         # W_k x_t + U_k h_{t-1} + b_k

    h, c = h0, c0
    outputs, steps = [], []
    for x_t in x:
        h_prev, c_prev = h, c
        i = sigmoid(affine("i", x_t, h_prev) + w.p["i"] * c_prev)  # i_t = σ(… + p_i ⊙ c_{t-1})
        f = sigmoid(affine("f", x_t, h_prev) + w.p["f"] * c_prev)  # f_t = σ(… + p_f ⊙ c_{t-1})
        g = tanh(affine("g", x_t, h_prev))                         # g_t = tanh(…)
        c = f * c_prev + i * g                                     # c_t = f_t ⊙ c_{t-1} + i_t ⊙ g_t
        o = sigmoid(affine("o", x_t, h_prev) + w.p["o"] * c)       # o_t = σ(… + p_o ⊙ c_t)
        h = o * tanh(c)                                            # h_t = o_t ⊙ tanh(c_t)
        outputs.append(h)
        steps.append(Step(x_t, h_prev, c_prev, i, f, g, o, c))
    return Forward(np.stack(outputs), h, c, steps)


class Gradients(NamedTuple):
    weights: Weights      # ∂L/∂W_k, ∂L/∂U_k, ∂L/∂b_k, ∂L/∂p_k, summed over the steps and the sequences
    x: np.ndarray         # ∂L/∂x_t of every step, (T, N, I)
    h0: np.ndarray        # ∂L/∂h_0 and ∂L/∂c_0, (N, H)
    c0: np.ndarray


def backward(dh_out: np.ndarray, dh_T: np.ndarray, dc_T: np.ndarray, steps: list[Step],
             w: Weights) -> Gradients:
    """The gradients of a loss L, from L's gradients with respect to the outputs and final states.

    ``dh_out`` (T, N, H) is ∂L/∂h_t through each step's output; ``dh_T``, ``dc_T`` (N, H) are
    ∂L/∂h_T and ∂L/∂c_T through the final states. δv is the whole gradient ∂L/∂v, along every
    path; for a gate k, δk_t is the gradient of its pre-activation (the argument of σ or tanh).
    """
    grad = Weights(W={k: np.zeros_like(w.W[k]) for k in GATES},
                   U={k: np.zeros_like(w.U[k]) for k in GATES},
                   b={k: np.zeros_like(w.b[k]) for k in GATES},
                   p={k: np.zeros_like(w.p[k]) for k in PEEPHOLES})
    dx = []
    dh_next, dc_next = dh_T, dc_T        # the carried gradients: what step t+1 sends back to h_t, c_t
    for t in reversed(range(len(steps))):
        s = steps[t]
        tanh_c = tanh(s.c)
        # δh_t = ∂L/∂h_t through the output + the carried Σ_k U_kᵀ δk_{t+1}
        dh = dh_out[t] + dh_next
        # δo_t = δh_t ⊙ tanh(c_t) ⊙ o_t(1 − o_t)
        do = dh * tanh_c * s.o * (1 - s.o)
        # δc_t = δh_t ⊙ o_t ⊙ (1 − tanh²(c_t)) + p_o ⊙ δo_t + the carried gradient of c_t
        dc = dh * s.o * (1 - tanh_c**2) + w.p["o"] * do + dc_next
        # δi_t = δc_t ⊙ g_t ⊙ i_t(1 − i_t)
        di = dc * s.g * s.i * (1 - s.i)
        # δf_t = δc_t ⊙ c_{t-1} ⊙ f_t(1 − f_t)
        df = dc * s.c_prev * s.f * (1 - s.f)
        # δg_t = δc_t ⊙ i_t ⊙ (1 − g_t²)
        dg = dc * s.i * (1 - s.g**2)
        delta = {"i": di, "f": df, "g": dg, "o": do}
        for k in GATES:                  # each product sums over the N sequences
            grad.W[k] += delta[k].T @ s.x                       # ∂L/∂W_k += δk_t x_tᵀ
            grad.U[k] += delta[k].T @ s.h_prev                  # ∂L/∂U_k += δk_t h_{t-1}ᵀ
            grad.b[k] += delta[k].sum(axis=0)                   # ∂L/∂b_k += δk_t
        grad.p["i"] += (di * s.c_prev).sum(axis=0)              # ∂L/∂p_i += δi_t ⊙ c_{t-1}
        grad.p["f"] += (df * s.c_prev).sum(axis=0)              # ∂L/∂p_f += δf_t ⊙ c_{t-1}
        grad.p["o"] += (do * s.c).sum(axis=0)                   # ∂L/∂p_o += δo_t ⊙ c_t
        dx.append(sum(delta[k] @ w.W[k] for k in GATES))        # δx_t = Σ_k W_kᵀ δk_t
        # the carried gradients, sent back to h_{t-1} and c_{t-1}:
        dh_next = sum(delta[k] @ w.U[k] for k in GATES)         # Σ_k U_kᵀ δk_t
        dc_next = dc * s.f + w.p["i"] * di + w.p["f"] * df      # δc_t ⊙ f_t + p_i ⊙ δi_t + p_f ⊙ δf_t
    return Gradients(grad, np.stack(dx[::-1]), dh_next, dc_next)  # dx was collected from the last step

"""A plain LSTM for the tests: one sequence, one layer, one direction, one step at a time.

Written from the equations alone, with no code shared with bnnsfw, so that agreement with
:class:`bnnsfw.layers.lstm.LSTMLayer` means something. Slow on purpose: obvious loops over
sequences, layers, directions and time steps, and a vector per step.
"""

from __future__ import annotations

import math

import numpy as np

SELU_LAMBDA = 1.0507009873554805
SELU_ALPHA = 1.6732632423543772


# Activations written out by hand (scalar formulas applied with np.vectorize where branchy).
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def tanh(x):
    return np.tanh(x)


def softsign(x):
    return x / (1.0 + np.abs(x))


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu(x):
    values = [0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in np.ravel(x)]
    return np.array(values).reshape(np.shape(x))


def relu(x):
    return np.where(x > 0, x, 0.0)


def identity(x):
    return np.array(x, dtype=float)


def hard_sigmoid(x):
    return np.clip(0.2 * x + 0.5, 0.0, 1.0)


def make_scaled_tanh(a, b):
    return lambda x: a * np.tanh(b * x)


def make_elu(a):
    return lambda x: np.where(x < 0, a * (np.exp(np.minimum(x, 0.0)) - 1.0), x)


def reference_lstm(x, gates, *, hidden_size, num_layers=1, bidirectional=False, batch_first=False,
                   activations=(sigmoid, sigmoid, tanh, sigmoid), hidden_activation=tanh,
                   hidden=None, cell=None, lengths=None, dropout_scales=None):
    """Run a stacked LSTM the slow way.

    ``gates`` is four dicts (input, forget, candidate, output) with keys ``iw0`` (D, H, I),
    ``iw1`` (L-1, D, H, D*H) or None, ``hw`` (L, D, H, H), ``cw`` None / (L, D, H, H) /
    (L, D, H) and ``b`` None / (L, D, H). ``dropout_scales[l]`` (T, N, D*H), for l >= 1,
    multiplies the input of layer l. Returns ``(output, hidden, cell)`` in the layer's layouts.
    """
    x = np.asarray(x, dtype=np.float64)
    if batch_first:
        x = x.transpose(1, 0, 2)
    steps, batch, _ = x.shape
    dirs = 2 if bidirectional else 1
    hs = hidden_size
    output = np.zeros((steps, batch, dirs * hs))
    final_h = np.zeros((num_layers * dirs, batch, hs))
    final_c = np.zeros((num_layers * dirs, batch, hs))

    for n in range(batch):
        length = steps if lengths is None else int(lengths[n])
        sequence = [x[t, n].copy() for t in range(length)]
        for layer in range(num_layers):
            if layer > 0 and dropout_scales is not None:
                sequence = [sequence[t] * dropout_scales[layer][t, n] for t in range(length)]
            outputs = [np.zeros(dirs * hs) for _ in range(length)]
            for d in range(dirs):
                index = layer * dirs + d
                h = np.zeros(hs) if hidden is None else np.array(hidden[index, n], dtype=np.float64)
                c = np.zeros(hs) if cell is None else np.array(cell[index, n], dtype=np.float64)
                times = list(range(length)) if d == 0 else list(reversed(range(length)))
                for t in times:
                    x_t = sequence[t]
                    pre = []
                    for k in range(4):
                        gate = gates[k]
                        w = gate["iw0"][d] if layer == 0 else gate["iw1"][layer - 1, d]
                        value = w @ x_t + gate["hw"][layer, d] @ h
                        if gate["b"] is not None:
                            value = value + gate["b"][layer, d]
                        if k < 3 and gate["cw"] is not None:
                            value = value + peephole(gate["cw"], layer, d, c)
                        pre.append(value)
                    i = activations[0](pre[0])
                    f = activations[1](pre[1])
                    g = activations[2](pre[2])
                    c = f * c + i * g
                    if gates[3]["cw"] is not None:
                        pre[3] = pre[3] + peephole(gates[3]["cw"], layer, d, c)  # sees the new cell
                    o = activations[3](pre[3])
                    h = o * hidden_activation(c)
                    outputs[t][d * hs:(d + 1) * hs] = h
                final_h[index, n] = h
                final_c[index, n] = c
            sequence = outputs
        for t in range(length):
            output[t, n] = sequence[t]
    if batch_first:
        output = output.transpose(1, 0, 2)
    return output, final_h, final_c


def peephole(weights, layer, d, c):
    p = weights[layer, d]
    if p.ndim == 2:
        return p @ c
    return p * c

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
                   hidden=None, cell=None, lengths=None, dropout_scales=None, reverse=False,
                   direction_activations=None, clip=None, cell_clip=None, proj_clip=None, input_forget=False,
                   projection=None, layer_norm=None):
    """Run a stacked LSTM the slow way.

    ``gates`` is four dicts (input, forget, candidate, output) with keys ``iw0`` (D, H, I),
    ``iw1`` (L-1, D, H, D*P) or None, ``hw`` (L, D, H, P), ``cw`` None / (L, D, H, H) /
    (L, D, H) and ``b`` None / (L, D, H). ``dropout_scales[l]`` (T, N, D*P), for l >= 1,
    multiplies the input of layer l. Returns ``(output, hidden, cell)`` in the layer's layouts.

    The variants of SPEC 4.1: ``reverse`` (one direction, read backwards);
    ``direction_activations`` (per direction, ``(four gate functions, hidden function)``);
    ``clip`` (every activation input clamped: gate pre-activations and the argument of the
    hidden activation); ``cell_clip`` (the cell clamped and carried on clamped);
    ``proj_clip`` (the projected hidden state clamped); ``input_forget`` (f = 1 - i);
    ``projection`` (L, D, P, H): h = W_hr (o * act_h(c)); ``layer_norm``: a dict of ``gx``,
    ``bx``, ``gh``, ``bh`` (L, D, 4H), ``gc``, ``bc`` (L, D, H) and ``eps``:
    z = LN(W x) + LN(U h) + b and h = o * act_h(LN(c)). A sequence of length 0 has zero
    outputs and zero final states.
    """
    x = np.asarray(x, dtype=np.float64)
    if batch_first:
        x = x.transpose(1, 0, 2)
    steps, batch, _ = x.shape
    dirs = 2 if bidirectional else 1
    hs = hidden_size
    ps = hs if projection is None else projection.shape[2]
    output = np.zeros((steps, batch, dirs * ps))
    final_h = np.zeros((num_layers * dirs, batch, ps))
    final_c = np.zeros((num_layers * dirs, batch, hs))

    def kappa(v):  # the ONNX clip of an activation input
        return v if clip is None else np.clip(v, -clip, clip)

    def norm(v, gain, bias):
        centred = v - v.mean()
        return gain * centred / np.sqrt((centred ** 2).mean() + layer_norm["eps"]) + bias

    for n in range(batch):
        length = steps if lengths is None else int(lengths[n])
        sequence = [x[t, n].copy() for t in range(length)]
        for layer in range(num_layers):
            if layer > 0 and dropout_scales is not None:
                sequence = [sequence[t] * dropout_scales[layer][t, n] for t in range(length)]
            outputs = [np.zeros(dirs * ps) for _ in range(length)]
            for d in range(dirs):
                index = layer * dirs + d
                acts, act_h = (activations, hidden_activation) if direction_activations is None \
                    else direction_activations[d]
                h = np.zeros(ps) if hidden is None else np.array(hidden[index, n], dtype=np.float64)
                c = np.zeros(hs) if cell is None else np.array(cell[index, n], dtype=np.float64)
                backwards = d == 1 or reverse
                times = list(reversed(range(length))) if backwards else list(range(length))
                for t in times:
                    x_t = sequence[t]
                    w_x = np.concatenate([(g["iw0"][d] if layer == 0 else g["iw1"][layer - 1, d]) @ x_t
                                          for g in gates])
                    u_h = np.concatenate([g["hw"][layer, d] @ h for g in gates])
                    if layer_norm is not None:
                        ln = layer_norm
                        z = norm(w_x, ln["gx"][layer, d], ln["bx"][layer, d]) + \
                            norm(u_h, ln["gh"][layer, d], ln["bh"][layer, d])
                    else:
                        z = w_x + u_h
                    pre = [z[k * hs:(k + 1) * hs] for k in range(4)]
                    for k in range(4):
                        gate = gates[k]
                        if gate["b"] is not None:
                            pre[k] = pre[k] + gate["b"][layer, d]
                        if k < 3 and gate["cw"] is not None:
                            pre[k] = pre[k] + peephole(gate["cw"], layer, d, c)
                    i = acts[0](kappa(pre[0]))
                    f = 1.0 - i if input_forget else acts[1](kappa(pre[1]))
                    g = acts[2](kappa(pre[2]))
                    c = f * c + i * g
                    if cell_clip is not None:
                        c = np.clip(c, -cell_clip, cell_clip)
                    if gates[3]["cw"] is not None:
                        pre[3] = pre[3] + peephole(gates[3]["cw"], layer, d, c)  # sees the new cell
                    o = acts[3](kappa(pre[3]))
                    m = c
                    if layer_norm is not None:
                        m = norm(c, layer_norm["gc"][layer, d], layer_norm["bc"][layer, d])
                    h = o * act_h(kappa(m))
                    if projection is not None:
                        h = projection[layer, d] @ h
                        if proj_clip is not None:
                            h = np.clip(h, -proj_clip, proj_clip)
                    outputs[t][d * ps:(d + 1) * ps] = h
                if length > 0:
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

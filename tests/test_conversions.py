"""The conversion recipes of docs/conversions.md, checked.

Each recipe below is copied verbatim from a ``python`` block of docs/conversions.md (a test
fails when the two drift apart). The recipes use NumPy only; the checks compare them with
PyTorch when it is installed, and with a NumPy transcription of the ONNX operators' equations
(no onnx package needed).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.bnns import BNNSNDArrayDescriptor

DOCS = Path(__file__).resolve().parent.parent / "docs"


# ------------------------------------------------------------------------------------------
# The recipes (verbatim from docs/conversions.md).
# ------------------------------------------------------------------------------------------
GATES = ("input_gate", "forget_gate", "candidate_gate", "output_gate")  # PyTorch's i, f, g, o


def lstm_parameters_from_pytorch(sd, *, input_size, hidden_size, num_layers=1, bidirectional=False,
                                 **options):
    """bnnsfw LSTMParameters from a torch.nn.LSTM state dict whose tensors are NumPy arrays."""
    h, size_l = hidden_size, num_layers
    suffixes = ("", "_reverse") if bidirectional else ("",)
    has_bias = "bias_ih_l0" in sd                       # torch.nn.LSTM(..., bias=False) has none

    def per_direction(name, layer, rows):               # (D, H, ·): gate k's rows of each direction
        return np.stack([sd[f"{name}_l{layer}{s}"][rows] for s in suffixes])

    gates = {}
    for k, gate in enumerate(GATES):
        rows = slice(k * h, (k + 1) * h)                # gate k is rows k·H … (k+1)·H − 1
        iw0 = per_direction("weight_ih", 0, rows)                                     # (D, H, I)
        iw1 = (np.stack([per_direction("weight_ih", layer, rows) for layer in range(1, size_l)])
               if size_l > 1 else None)                                              # (L−1, D, H, D·H)
        hw = np.stack([per_direction("weight_hh", layer, rows) for layer in range(size_l)])   # (L, D, H, H)
        bias = (np.stack([per_direction("bias_ih", layer, rows) + per_direction("bias_hh", layer, rows)
                          for layer in range(size_l)]) if has_bias else None)             # (L, D, H)
        gates[gate] = bf.LSTMGateDescriptor(input_weights=(iw0, iw1), hidden_weights=hw, bias=bias)
    return bf.LSTMParameters(input_size=input_size, hidden_size=h, num_layers=size_l,
                             bidirectional=bidirectional, **gates, **options)


def lstm_parameters_to_pytorch(params):
    """A torch.nn.LSTM state dict (NumPy arrays) from bnnsfw LSTMParameters without peepholes."""
    assert all(g.cell_weights is None for g in params.gates), "torch.nn.LSTM has no peepholes"
    suffixes = ("", "_reverse")[: params.num_directions]
    sd = {}
    for layer in range(params.num_layers):
        for d, s in enumerate(suffixes):
            iw = [g.input_weights[0][d] if layer == 0 else g.input_weights[1][layer - 1, d]
                  for g in params.gates]
            sd[f"weight_ih_l{layer}{s}"] = np.concatenate(iw)                             # (4H, I_l)
            sd[f"weight_hh_l{layer}{s}"] = np.concatenate([g.hidden_weights[layer, d] for g in params.gates])
            if params.input_gate.bias is not None:
                sd[f"bias_ih_l{layer}{s}"] = np.concatenate([g.bias[layer, d] for g in params.gates])
                sd[f"bias_hh_l{layer}{s}"] = np.zeros_like(sd[f"bias_ih_l{layer}{s}"])   # only the sum counts
    return sd


ONNX_GATES = ("input_gate", "output_gate", "forget_gate", "candidate_gate")   # W, R, B: i, o, f, c
ONNX_PEEPHOLES = ("input_gate", "output_gate", "forget_gate")                  # P: i, o, f


def lstm_parameters_from_onnx(nodes, *, input_size, hidden_size, bidirectional=False, **options):
    """bnnsfw LSTMParameters from stacked ONNX LSTM nodes (layout 0, default activations).

    ``nodes`` has one dict per layer: "W" [D, 4H, I_l], "R" [D, 4H, H], and optionally
    "B" [D, 8H] (Wb then Rb) and "P" [D, 3H]; ``None`` or a missing key means absent.
    """
    h, size_l, size_d = hidden_size, len(nodes), 2 if bidirectional else 1

    def block(array, gate, order):                      # the gate's H rows in every direction
        k = order.index(gate)
        return array[:, k * h:(k + 1) * h]

    def every_layer(key, width):                        # an optional input of each node; zeros if absent
        if all(node.get(key) is None for node in nodes):
            return None
        return [np.zeros((size_d, width)) if node.get(key) is None else node[key] for node in nodes]

    biases, peepholes = every_layer("B", 8 * h), every_layer("P", 3 * h)
    gates = {}
    for gate in GATES:
        iw = [block(node["W"], gate, ONNX_GATES) for node in nodes]                   # [D, H, I_l]
        bias = cell = None
        if biases is not None:                                                          # Wb + Rb
            bias = np.stack([block(b[:, :4 * h], gate, ONNX_GATES) + block(b[:, 4 * h:], gate, ONNX_GATES)
                             for b in biases])                                          # (L, D, H)
        if peepholes is not None and gate in ONNX_PEEPHOLES:
            cell = np.stack([block(p, gate, ONNX_PEEPHOLES) for p in peepholes])      # diagonal (L, D, H)
        gates[gate] = bf.LSTMGateDescriptor(
            input_weights=(iw[0], np.stack(iw[1:]) if size_l > 1 else None),
            hidden_weights=np.stack([block(node["R"], gate, ONNX_GATES) for node in nodes]),
            cell_weights=cell, bias=bias)
    return bf.LSTMParameters(input_size=input_size, hidden_size=h, num_layers=size_l,
                             bidirectional=bidirectional, **gates, **options)


def pytorch_to_onnx(sd, *, hidden_size, num_layers=1, bidirectional=False):
    """ONNX LSTM inputs W, R, B per layer from a torch.nn.LSTM state dict (NumPy arrays)."""
    h = hidden_size
    suffixes = ("", "_reverse") if bidirectional else ("",)
    ifgo_to_iofc = np.concatenate([np.arange(k * h, (k + 1) * h) for k in (0, 3, 1, 2)])
    nodes = []
    for layer in range(num_layers):
        def stacked(name):
            return np.stack([sd[f"{name}_l{layer}{s}"][ifgo_to_iofc] for s in suffixes])
        node = {"W": stacked("weight_ih"), "R": stacked("weight_hh")}
        if f"bias_ih_l{layer}" in sd:
            node["B"] = np.concatenate([stacked("bias_ih"), stacked("bias_hh")], axis=1)   # [D, 8H]
        nodes.append(node)
    return nodes


def states_from_onnx(per_layer):
    """[D, N, H] per layer (ONNX initial_h / Y_h, layout 0) -> bnnsfw (L·D, N, H)."""
    return np.concatenate(per_layer, axis=0)


def states_to_onnx(states, num_layers):
    """bnnsfw (L·D, N, H) -> a list of [D, N, H], one per layer."""
    return np.split(states, num_layers, axis=0)


def output_to_onnx(output, num_directions):
    """bnnsfw output (T, N, D·H) -> ONNX Y [T, D, N, H] (layout 0)."""
    t, n, _ = output.shape
    return output.reshape(t, n, num_directions, -1).transpose(0, 2, 1, 3)


def output_from_onnx(y):
    """ONNX Y [T, D, N, H] (layout 0) -> bnnsfw (T, N, D·H)."""
    t, d, n, h = y.shape
    return y.transpose(0, 2, 1, 3).reshape(t, n, d * h)


def momentum_from_pytorch(momentum_pt):
    """bnnsfw's (and ONNX's, Keras's) momentum weighs the old value; PyTorch's the new one."""
    return 1.0 - momentum_pt


def batch_norm_from_pytorch(sd, *, input_shape, momentum_pt=0.1, eps=1e-5, dtype=np.float32):
    """NormalizationParameters from a torch.nn.BatchNorm{1,2,3}d state dict (NumPy arrays)."""
    return bf.NormalizationParameters(
        type=bf.NormalizationType.batch(moving_mean=sd["running_mean"], moving_variance=sd["running_var"]),
        input_shape=input_shape, gamma=sd["weight"], beta=sd["bias"],
        momentum=momentum_from_pytorch(momentum_pt), epsilon=eps, dtype=dtype)


def variance_to_pytorch(moving_variance, count):
    """bnnsfw's biased running variance -> PyTorch's unbiased one (count values per channel)."""
    return moving_variance * count / (count - 1)


def variance_from_pytorch(running_var, count):
    """PyTorch's unbiased running variance -> bnnsfw's biased one (count values per channel)."""
    return running_var * (count - 1) / count


def bnns_size(shape):
    """NumPy shape (slowest first) -> BNNS size[8] (fastest first, unused entries 0)."""
    return tuple(reversed(shape)) + (0,) * (8 - len(shape))


def numpy_shape(size, rank):
    """BNNS size[8] -> NumPy shape."""
    return tuple(reversed(size[:rank]))


def numpy_view(flat, size, stride, rank):
    """NumPy view of a BNNS buffer: sizes and strides (in elements; 0 = dense) fastest first."""
    if not any(stride[:rank]):
        stride = np.cumprod((1,) + tuple(size[:rank - 1]))
    return np.lib.stride_tricks.as_strided(
        flat, shape=numpy_shape(size, rank),
        strides=tuple(flat.itemsize * int(s) for s in reversed(stride[:rank])))


# ------------------------------------------------------------------------------------------
# The recipes are the documented ones.
# ------------------------------------------------------------------------------------------
def _doc_recipes() -> list[str]:
    text = (DOCS / "conversions.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    return [b for b in blocks if re.match(r"(def |[A-Z_]+ = )", b)]


def test_every_recipe_in_the_docs_is_tested_verbatim():
    recipes = _doc_recipes()
    assert len(recipes) >= 8
    source = inspect.getsource(inspect.getmodule(test_every_recipe_in_the_docs_is_tested_verbatim))
    for block in recipes:
        assert block.strip() in source, f"docs/conversions.md recipe not in this file:\n{block}"


# ------------------------------------------------------------------------------------------
# Helpers of the checks.
# ------------------------------------------------------------------------------------------
def _torch_state(module):
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def _assert_matches_torch(out, ty, th, tc):
    """A bnnsfw LSTMOutput against torch.nn.LSTM's output and final states (float32)."""
    np.testing.assert_allclose(out.output, ty.numpy(), atol=1e-5)
    np.testing.assert_allclose(out.hidden, th.numpy(), atol=1e-5)
    np.testing.assert_allclose(out.cell, tc.numpy(), atol=1e-5)


def _random_pytorch_state(rng, *, input_size, hidden_size, num_layers, bidirectional, bias=True):
    """A torch.nn.LSTM-shaped state dict made with NumPy (no torch needed)."""
    h, d = hidden_size, 2 if bidirectional else 1
    sd = {}
    for layer in range(num_layers):
        for s in ("", "_reverse")[:d]:
            width = input_size if layer == 0 else d * h
            sd[f"weight_ih_l{layer}{s}"] = rng.uniform(-0.5, 0.5, (4 * h, width))
            sd[f"weight_hh_l{layer}{s}"] = rng.uniform(-0.5, 0.5, (4 * h, h))
            if bias:
                sd[f"bias_ih_l{layer}{s}"] = rng.uniform(-0.5, 0.5, 4 * h)
                sd[f"bias_hh_l{layer}{s}"] = rng.uniform(-0.5, 0.5, 4 * h)
    return sd


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _onnx_lstm(x, w, r, b=None, p=None, initial_h=None, initial_c=None, direction="forward"):
    """The ONNX LSTM operator (layout 0, default activations f=Sigmoid, g=Tanh, h=Tanh),
    transcribed from its equations: direction "forward", "reverse" or "bidirectional"."""
    t_len, n, _ = x.shape
    d_len, h = w.shape[0], w.shape[1] // 4
    y = np.zeros((t_len, d_len, n, h))
    y_h, y_c = np.zeros((d_len, n, h)), np.zeros((d_len, n, h))
    for d in range(d_len):
        wi, wo, wf, wc = np.split(w[d], 4)
        ri, ro, rf, rc = np.split(r[d], 4)
        wbi, wbo, wbf, wbc, rbi, rbo, rbf, rbc = np.split(np.zeros(8 * h) if b is None else b[d], 8)
        pi, po, pf = np.split(np.zeros(3 * h) if p is None else p[d], 3)
        ht = np.zeros((n, h)) if initial_h is None else initial_h[d]
        ct = np.zeros((n, h)) if initial_c is None else initial_c[d]
        backwards = d == 1 or direction == "reverse"
        for t in reversed(range(t_len)) if backwards else range(t_len):
            xt = x[t]
            it = _sigmoid(xt @ wi.T + ht @ ri.T + pi * ct + wbi + rbi)
            ft = _sigmoid(xt @ wf.T + ht @ rf.T + pf * ct + wbf + rbf)
            gt = np.tanh(xt @ wc.T + ht @ rc.T + wbc + rbc)
            ct = ft * ct + it * gt
            ot = _sigmoid(xt @ wo.T + ht @ ro.T + po * ct + wbo + rbo)
            ht = ot * np.tanh(ct)
            y[t, d] = ht
        y_h[d], y_c[d] = ht, ct
    return y, y_h, y_c


def _assert_same_parameters(a, b):
    for ga, gb in zip(a.gates, b.gates):
        for xa, xb in [(ga.input_weights[0], gb.input_weights[0]), (ga.input_weights[1], gb.input_weights[1]),
                       (ga.hidden_weights, gb.hidden_weights), (ga.cell_weights, gb.cell_weights),
                       (ga.bias, gb.bias)]:
            if xa is None or xb is None:
                assert xa is None and xb is None
            else:
                np.testing.assert_array_equal(xa, xb)


# ------------------------------------------------------------------------------------------
# LSTM: PyTorch.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_layers, bidirectional, batch_first, bias", [
    (1, False, False, True),
    (2, True, False, True),
    (3, False, True, True),
    (2, True, True, False),
])
def test_pytorch_lstm_to_bnnsfw(rng, num_layers, bidirectional, batch_first, bias):
    torch = pytest.importorskip("torch")
    i, h, t, n = 5, 6, 7, 3
    d = 2 if bidirectional else 1
    torch.manual_seed(0)
    net = torch.nn.LSTM(i, h, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first,
                        bias=bias)
    params = lstm_parameters_from_pytorch(_torch_state(net), input_size=i, hidden_size=h,
                                          num_layers=num_layers, bidirectional=bidirectional,
                                          batch_first=batch_first)
    x = rng.standard_normal((n, t, i) if batch_first else (t, n, i)).astype(np.float32)
    h0, c0 = rng.standard_normal((2, num_layers * d, n, h)).astype(np.float32)   # same layout in both
    with torch.no_grad():
        ty, (th, tc) = net(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    with bf.LSTMLayer(params) as layer:
        out = layer.apply(x, h0, c0)
    _assert_matches_torch(out, ty, th, tc)


def test_pytorch_packed_sequences_are_sequence_lengths(rng):
    torch = pytest.importorskip("torch")
    i, h, t, n = 4, 5, 6, 4
    torch.manual_seed(1)
    net = torch.nn.LSTM(i, h, num_layers=2, bidirectional=True)
    params = lstm_parameters_from_pytorch(_torch_state(net), input_size=i, hidden_size=h, num_layers=2,
                                          bidirectional=True)
    x = rng.standard_normal((t, n, i)).astype(np.float32)
    lengths = np.array([6, 2, 5, 1])
    with torch.no_grad():
        packed = torch.nn.utils.rnn.pack_padded_sequence(torch.from_numpy(x), torch.from_numpy(lengths),
                                                         enforce_sorted=False)
        packed_out, (th, tc) = net(packed)
        ty, _ = torch.nn.utils.rnn.pad_packed_sequence(packed_out, total_length=t)
    with bf.LSTMLayer(params) as layer:
        out = layer.apply(x, sequence_lengths=lengths)
    _assert_matches_torch(out, ty, th, tc)


def test_bnnsfw_lstm_to_pytorch(rng):
    torch = pytest.importorskip("torch")
    i, h, t, n = 3, 4, 5, 2
    params = bf.LSTMParameters.random(input_size=i, hidden_size=h, num_layers=2, bidirectional=True, seed=3)
    net = torch.nn.LSTM(i, h, num_layers=2, bidirectional=True)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in lstm_parameters_to_pytorch(params).items()})
    x = rng.standard_normal((t, n, i)).astype(np.float32)
    with torch.no_grad():
        ty, (th, tc) = net(torch.from_numpy(x))
    with bf.LSTMLayer(params) as layer:
        out = layer.apply(x)
    _assert_matches_torch(out, ty, th, tc)
    # And back: the same weights (the biases were folded into bias_ih).
    again = lstm_parameters_from_pytorch(_torch_state(net), input_size=i, hidden_size=h, num_layers=2,
                                         bidirectional=True)
    _assert_same_parameters(params, again)


# ------------------------------------------------------------------------------------------
# LSTM: ONNX (pure NumPy).
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_layers, bidirectional, bias",
                         [(1, False, True), (2, True, True), (3, True, False)])
def test_onnx_order_round_trip(rng, num_layers, bidirectional, bias):
    i, h = 4, 3
    sd = _random_pytorch_state(rng, input_size=i, hidden_size=h, num_layers=num_layers,
                               bidirectional=bidirectional, bias=bias)
    direct = lstm_parameters_from_pytorch(sd, input_size=i, hidden_size=h, num_layers=num_layers,
                                          bidirectional=bidirectional, dtype=np.float64)
    nodes = pytorch_to_onnx(sd, hidden_size=h, num_layers=num_layers, bidirectional=bidirectional)
    d = 2 if bidirectional else 1
    assert nodes[0]["W"].shape == (d, 4 * h, i) and nodes[-1]["R"].shape == (d, 4 * h, h)
    via_onnx = lstm_parameters_from_onnx(nodes, input_size=i, hidden_size=h, bidirectional=bidirectional,
                                         dtype=np.float64)
    _assert_same_parameters(direct, via_onnx)
    # ONNX's first block is PyTorch's first (i), its second PyTorch's fourth (o).
    np.testing.assert_array_equal(nodes[0]["W"][0, h:2 * h], sd["weight_ih_l0"][3 * h:])
    x = rng.standard_normal((5, 2, i))
    with bf.LSTMLayer(direct) as a, bf.LSTMLayer(via_onnx) as b:
        np.testing.assert_array_equal(a.apply(x).output, b.apply(x).output)


@pytest.mark.parametrize("peepholes", [False, True])
def test_onnx_recipe_matches_the_onnx_equations(rng, peepholes):
    i, h, t, n, layers, d = 3, 4, 6, 2, 2, 2
    nodes = []
    for layer in range(layers):
        width = i if layer == 0 else d * h
        node = {"W": rng.uniform(-0.6, 0.6, (d, 4 * h, width)), "R": rng.uniform(-0.6, 0.6, (d, 4 * h, h)),
                "B": rng.uniform(-0.6, 0.6, (d, 8 * h))}
        if peepholes:
            node["P"] = rng.uniform(-0.6, 0.6, (d, 3 * h))
        nodes.append(node)
    x = rng.standard_normal((t, n, i))
    h0 = [rng.standard_normal((d, n, h)) for _ in range(layers)]
    c0 = [rng.standard_normal((d, n, h)) for _ in range(layers)]
    # An ONNX graph of stacked LSTM nodes: each Y [T, D, N, H] becomes the next X [T, N, D·H].
    layer_input, y_h, y_c = x, [], []
    for layer, node in enumerate(nodes):
        y, yh, yc = _onnx_lstm(layer_input, node["W"], node["R"], node["B"], node.get("P"),
                               h0[layer], c0[layer])
        layer_input = output_from_onnx(y)
        y_h.append(yh)
        y_c.append(yc)
    params = lstm_parameters_from_onnx(nodes, input_size=i, hidden_size=h, bidirectional=True,
                                       dtype=np.float64)
    assert params.output_gate.peephole == ("diagonal" if peepholes else None)
    assert params.candidate_gate.peephole is None
    with bf.LSTMLayer(params) as layer:
        out = layer.apply(x, states_from_onnx(h0), states_from_onnx(c0))
    np.testing.assert_allclose(out.output, layer_input, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(output_to_onnx(out.output, d), y, rtol=1e-10, atol=1e-12)
    for ours, theirs in zip(states_to_onnx(out.hidden, layers), y_h):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    for ours, theirs in zip(states_to_onnx(out.cell, layers), y_c):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_onnx_reverse_direction_is_a_forward_lstm_on_reversed_time(rng):
    i, h, t, n = 3, 4, 5, 2
    node = {"W": rng.uniform(-0.6, 0.6, (1, 4 * h, i)), "R": rng.uniform(-0.6, 0.6, (1, 4 * h, h)),
            "B": rng.uniform(-0.6, 0.6, (1, 8 * h)), "P": rng.uniform(-0.6, 0.6, (1, 3 * h))}
    x = rng.standard_normal((t, n, i))
    y, y_h, y_c = _onnx_lstm(x, node["W"], node["R"], node["B"], node["P"], direction="reverse")
    params = lstm_parameters_from_onnx([node], input_size=i, hidden_size=h, dtype=np.float64)
    with bf.LSTMLayer(params) as layer:
        out = layer.apply(x[::-1])
    np.testing.assert_allclose(out.output[::-1], output_from_onnx(y), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out.hidden, y_h, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out.cell, y_c, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------
# Batch normalization: momentum and variance.
# ------------------------------------------------------------------------------------------
def test_batch_norm_from_pytorch_evaluates_the_same(rng):
    torch = pytest.importorskip("torch")
    c, length = 3, 5
    bn = torch.nn.BatchNorm1d(c, momentum=0.2).double()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
        for _ in range(3):                               # some training, so running stats move
            bn(torch.from_numpy(rng.standard_normal((8, c, length)) * 2 + 1))
        bn.eval()
        x = rng.standard_normal((4, c, length))
        ty = bn(torch.from_numpy(x)).numpy()
    params = batch_norm_from_pytorch(_torch_state(bn), input_shape=(c, length), momentum_pt=0.2,
                                     dtype=np.float64)
    assert params.momentum == pytest.approx(0.8)
    with bf.NormalizationLayer(params) as layer:
        np.testing.assert_allclose(layer.apply(x, phase="inference"), ty, rtol=1e-12, atol=1e-12)


def test_batch_norm_running_statistics_follow_pytorch(rng):
    torch = pytest.importorskip("torch")
    n, c, length, momentum_pt = 6, 4, 3, 0.1
    count = n * length                                   # values per channel in one batch
    bn = torch.nn.BatchNorm1d(c, momentum=momentum_pt).double()
    sd = _torch_state(bn)
    sd["running_var"] = variance_from_pytorch(sd["running_var"], count)   # start on the same track
    params = batch_norm_from_pytorch(sd, input_shape=(c, length), momentum_pt=momentum_pt, dtype=np.float64)
    with bf.NormalizationLayer(params) as layer:
        for _ in range(5):
            x = rng.standard_normal((n, c, length)) * 3 + 2
            y = layer.apply(x, phase="training")
            with torch.no_grad():
                ty = bn(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(y, ty, rtol=1e-10, atol=1e-12)      # batch statistics: the same
            np.testing.assert_allclose(layer.moving_mean, bn.running_mean.numpy(), rtol=1e-12)
            np.testing.assert_allclose(variance_to_pytorch(layer.moving_variance, count),
                                       bn.running_var.numpy(), rtol=1e-12)
            assert not np.allclose(layer.moving_variance, bn.running_var.numpy(), rtol=1e-3)


# ------------------------------------------------------------------------------------------
# BNNS sizes.
# ------------------------------------------------------------------------------------------
def test_bnns_sizes_are_numpy_shapes_reversed(rng):
    x = rng.standard_normal((7, 3, 5)).astype(np.float32)                 # (T, N, I)
    desc = BNNSNDArrayDescriptor.from_array(x, bf.DataLayout.sne)
    assert bnns_size(x.shape) == desc.size == (5, 3, 7, 0, 0, 0, 0, 0)    # (I, N, T) in BNNS
    assert numpy_shape(desc.size, 3) == x.shape
    np.testing.assert_array_equal(numpy_view(x.ravel(), desc.size, desc.stride, 3), x)
    # A strided buffer: the (2, 3) top-left corner of a 4 × 5 row-major matrix.
    big = np.arange(20, dtype=np.float32)
    corner = numpy_view(big, (3, 2, 0, 0, 0, 0, 0, 0), (1, 5, 0, 0, 0, 0, 0, 0), 2)
    np.testing.assert_array_equal(corner, big.reshape(4, 5)[:2, :3])

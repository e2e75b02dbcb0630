"""The reference LSTM for the variants of SPEC §4.1: every formula, one step at a time.

The per-sequence kernels of :mod:`.lstm_kernels` (and the faster kernels of the other
backends) serve BNNS's cell. A configuration that uses any variant of SPEC §4.1 (ONNX
``clip``, ``cell_clip``, ``projection_clip``, ``input_forget``, a reverse-only direction,
activations that differ between the directions, a projection, the layer-normalized cell)
runs here instead, on every backend: :class:`~.lstm_stack.LSTMStack` decides that in one
place, from ``LSTMConfig.variants``. Written for reading rather than speed: batch-major
``(N, ·)`` arrays, the gates in the public order i, f, g, o, one NumPy operation per term of
the math, and backward walking the same terms in reverse. For one layer and direction at
step t, with H cell units and P the size of the hidden state (H without a projection)::

    a_x = W x_t,  a_h = U h_{t−1}                         (4H each)
    z   = LN(a_x; α_x, β_x) + LN(a_h; α_h, β_h) + b       layer norm; else a_x + a_h + b
    z_k += P_k c_{t−1}                                    k = i, f, g (peepholes)
    i = act_i(κ(z_i)),  f = act_f(κ(z_f)),  g = act_g(κ(z_g))     f = 1 − i with input_forget
    s   = f ⊙ c_{t−1} + i ⊙ g
    c_t = clamp(s, cell_clip)                             the cell carried on and returned
    z_o += P_o c_t,  o = act_o(κ(z_o))
    m   = LN(c_t; α_c, β_c)                               layer norm; else c_t
    r   = o ⊙ act_h(κ(m))
    q   = W_hr r                                          projection; else r
    h_t = clamp(q, projection_clip)

``κ`` is the ONNX clip, ``clamp(·, clip)`` (the identity without it), and ``LN`` normalizes
each row over its units, ``LN(a; α, β) = α ⊙ (a − mean(a)) / sqrt(var(a) + ε) + β`` with
the biased variance. A clamp passes the gradient where ``|x| <= limit`` and stops it where
the limit is exceeded.

Training cache (format :data:`GENERAL_CACHE_FORMAT`): the inputs of layers 1…L−1 and
their dropout scales ``(T, N, D·P)`` (as the BNNS-cell layout has them), then per layer and
direction the step record, each field a ``(T, N, width)`` array: ``h_prev`` (P), ``c_prev``
(H), ``z`` (4H, before ``κ``, the output gate's including its peephole), ``gates`` (4H,
activated; f = 1 − i with ``input_forget``), ``s`` (H), ``m`` (H), ``act`` (H, ``act_h(κ(m))``),
then ``q`` (P) with a projection, and with layer norm ``x_hat`` (4H), ``x_rstd`` (1), ``h_hat``
(4H), ``h_rstd`` (1), ``c_hat`` (H), ``c_rstd`` (1): the normalized values and the reciprocal
standard deviations backward needs. In inference every step shares one record (a view with
a zero stride along T).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np

from ...activation import Activation
from ..contract import (
    LSTMBackwardRequest,
    LSTMConfig,
    LSTMForwardRequest,
    LSTMGateArrays,
    LSTMGradientBuffers,
    LSTMPackRequest,
    Workspace,
)
from .lstm_kernels import repeated

__all__ = ["GeneralLSTM", "GeneralPacked", "GeneralCacheLayout", "GENERAL_CACHE_FORMAT", "record_fields"]

#: The name of the payload layout of the general kernels (module docstring).
GENERAL_CACHE_FORMAT = "bnnsfw.lstm.general/1"


def record_fields(config: LSTMConfig) -> tuple[tuple[str, int], ...]:
    """The step record of one layer and direction: ``(name, width)`` per field, in cache order."""
    h, p = config.hidden_size, config.output_size
    fields = [("h_prev", p), ("c_prev", h), ("z", 4 * h), ("gates", 4 * h), ("s", h), ("m", h), ("act", h)]
    if config.projection_size is not None:
        fields.append(("q", p))
    if config.layer_norm:
        fields += [("x_hat", 4 * h), ("x_rstd", 1), ("h_hat", 4 * h), ("h_rstd", 1),
                   ("c_hat", h), ("c_rstd", 1)]
    return tuple(fields)


class StepRecord:
    """The record fields of one layer and direction, each a ``(T, N, width)`` view."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None


class GeneralCacheLayout:
    """Offsets of every cached array of the general kernels for one T and N.

    Every array is a multiple of ``T·N`` elements in training, so the size is exactly
    affine (here: linear) in ``T·N``:
    ``itemsize · T · N · D · (L · F + (L − 1) · P · (1 + m))`` with ``F`` the record width
    (:func:`record_fields`) and ``m = 1`` when dropout masks are kept.
    """

    def __init__(self, config: LSTMConfig, seq_len: int, batch_size: int, *, training: bool) -> None:
        self.seq_len, self.batch_size = seq_len, batch_size
        self.num_layers, self.num_directions = config.num_layers, config.num_directions
        self.width = config.num_directions * config.output_size
        self.dtype = np.dtype(config.dtype)
        self.fields = record_fields(config)
        self.store_masks = training and config.dropout > 0.0
        self.reuse_steps = not training
        record = sum(width for _, width in self.fields)
        per_step = (self.num_layers - 1) * self.width * (2 if self.store_masks else 1)
        per_batch = 0
        if self.reuse_steps:
            per_batch = self.num_layers * self.num_directions * record
        else:
            per_step += self.num_layers * self.num_directions * record
        self.nbytes = self.dtype.itemsize * batch_size * (seq_len * per_step + per_batch)

    def bind(self, payload: np.ndarray) -> tuple[list[np.ndarray | None], list[np.ndarray | None],
                                                 list[list[StepRecord]]]:
        """Views into ``payload``: per layer the input and the dropout scales (``None`` for
        layer 0), and per layer and direction the step record."""
        data = payload[:self.nbytes].view(self.dtype)
        t, n = self.seq_len, self.batch_size
        position = 0

        def take(*shape: int) -> np.ndarray:
            nonlocal position
            size = math.prod(shape)
            view = data[position:position + size].reshape(shape)
            position += size
            return view

        def per_step(width: int) -> np.ndarray:
            if not self.reuse_steps:
                return take(t, n, width)
            return repeated(take(n, width), t)

        inputs: list[np.ndarray | None] = []
        masks: list[np.ndarray | None] = []
        records: list[list[StepRecord]] = []
        for layer in range(self.num_layers):
            inputs.append(take(t, n, self.width) if layer > 0 else None)
            masks.append(take(t, n, self.width) if layer > 0 and self.store_masks else None)
            records.append([StepRecord({name: per_step(width) for name, width in self.fields})
                            for _ in range(self.num_directions)])
        assert position == data.size
        return inputs, masks, records


class GeneralWeights(NamedTuple):
    """One layer and direction for the general kernels: true weights, public gate order."""

    input: np.ndarray  # W (4H, I_l)
    hidden: np.ndarray  # U (4H, P)
    bias: np.ndarray  # b (4H,)
    peepholes: tuple[np.ndarray | None, ...]  # per gate: None, (H,) diagonal or (H, H) full
    projection: np.ndarray | None  # W_hr (P, H)
    layer_norm: tuple[np.ndarray, ...] | None  # α_x, β_x, α_h, β_h (4H,) and α_c, β_c (H,)
    activations: tuple[Activation, Activation, Activation, Activation, Activation]  # i, f, g, o, act_h


class GeneralPacked(NamedTuple):
    """The packed weights of a configuration with variants: ``weights[layer][direction]``."""

    weights: list[list[GeneralWeights]]


def _copy(array: Any) -> np.ndarray:
    return np.array(array, copy=True)


def pack(request: LSTMPackRequest) -> GeneralPacked:
    """Per layer and direction, the gates stacked in the public order (copies)."""
    config = request.config
    h, dtype = config.hidden_size, np.dtype(config.dtype)
    gates: Sequence[LSTMGateArrays] = request.gates
    weights = []
    for layer in range(config.num_layers):
        row = []
        for d in range(config.num_directions):
            w = np.concatenate([g.input_weights[0][d] if layer == 0 else g.input_weights[1][layer - 1, d]
                                for g in gates])
            u = np.concatenate([g.hidden_weights[layer, d] for g in gates])
            bias = np.zeros(4 * h, dtype)
            for k, g in enumerate(gates):
                if g.bias is not None:
                    bias[k * h:(k + 1) * h] = g.bias[layer, d]
            peepholes = tuple(None if g.cell_weights is None else _copy(g.cell_weights[layer, d])
                              for g in gates)
            projection = None if request.projection is None else _copy(request.projection[layer, d])
            norm = None
            if request.layer_norm is not None:
                ln = request.layer_norm
                norm = tuple(_copy(a[layer, d]) for a in (ln.input_gain, ln.input_bias, ln.hidden_gain,
                                                          ln.hidden_bias, ln.cell_gain, ln.cell_bias))
            row.append(GeneralWeights(w, u, bias, peepholes, projection, norm, config.activations(d)))
        weights.append(row)
    return GeneralPacked(weights)


# --------------------------------------------------------------------------------------
# Small pieces of the math, forward and backward side by side.
# --------------------------------------------------------------------------------------
def _clamp(x: np.ndarray, limit: float | None, out: np.ndarray) -> np.ndarray:
    """``out = clamp(x, −limit, limit)`` (a copy without a limit)."""
    if limit is None:
        np.copyto(out, x)
    else:
        np.clip(x, -limit, limit, out=out)
    return out


def _clamp_gradient(grad: np.ndarray, x: np.ndarray, limit: float | None) -> None:
    """``grad`` zeroed where the clamp of ``x`` was active (``|x| > limit``), in place."""
    if limit is not None:
        np.copyto(grad, 0.0, where=np.abs(x) > limit)


def _layer_norm(a: np.ndarray, gain: np.ndarray, bias: np.ndarray, epsilon: float, hat: np.ndarray,
                rstd: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = gain ⊙ â + bias`` with ``â = (a − mean) · rstd`` per row; keeps ``â`` and ``rstd``."""
    mean = a.mean(axis=1, keepdims=True)
    np.subtract(a, mean, out=hat)
    variance = np.mean(hat * hat, axis=1, keepdims=True)
    np.copyto(rstd, 1.0 / np.sqrt(variance + epsilon))
    np.multiply(hat, rstd, out=hat)
    np.multiply(hat, gain, out=out)
    np.add(out, bias, out=out)
    return out


def _layer_norm_backward(dy: np.ndarray, hat: np.ndarray, rstd: np.ndarray, gain: np.ndarray,
                         d_gain: np.ndarray, d_bias: np.ndarray) -> np.ndarray:
    """The gradient with respect to the input of :func:`_layer_norm`; adds the gain and bias
    gradients (summed over the rows) into ``d_gain`` and ``d_bias``.

    With ``g = gain ⊙ dy``: ``da = rstd · (g − mean(g) − â ⊙ mean(g ⊙ â))`` per row.
    """
    d_gain += np.einsum("nk,nk->k", dy, hat)
    d_bias += dy.sum(axis=0)
    g = dy * gain
    return rstd * (g - g.mean(axis=1, keepdims=True) - hat * np.mean(g * hat, axis=1, keepdims=True))


def _activate(act: Activation, x: np.ndarray, out: np.ndarray) -> None:
    act.forward(x, out=out)


def _times_derivative(act: Activation, grad: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """``grad *= act'(x)`` in place (``y = act(x)``)."""
    if not act.is_identity:
        np.multiply(grad, act.derivative(x=x, y=y), out=grad)


def _peephole(weight: np.ndarray | None, cell: np.ndarray, out: np.ndarray) -> None:
    """``out += P c`` for each row (a full ``(H, H)`` matrix or a diagonal ``(H,)``)."""
    if weight is None:
        return
    if weight.ndim == 2:
        out += cell @ weight.T
    else:
        out += cell * weight


def _peephole_backward(weight: np.ndarray | None, dz: np.ndarray, cell: np.ndarray, d_cell: np.ndarray,
                       d_weight: np.ndarray | None) -> None:
    """Of ``z += P c``: ``d_cell += Pᵀ dz`` and ``d_weight += dz cᵀ`` summed over the rows."""
    if weight is None:
        return
    assert d_weight is not None
    if weight.ndim == 2:
        d_cell += dz @ weight
        d_weight += dz.T @ cell
    else:
        d_cell += dz * weight
        d_weight += np.einsum("nh,nh->h", dz, cell)


class GeneralLSTM:
    """The general kernels, as a mixin of :class:`~.lstm_stack.LSTMStack` (which gives
    ``_gemm``, the backend's product)."""

    def _gemm(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *, trans_a: bool = False,
              trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
        raise NotImplementedError

    # ----------------------------------------------------------------------------------
    # The stack.
    # ----------------------------------------------------------------------------------
    def general_forward(self, request: LSTMForwardRequest) -> None:
        """All layers and directions forward; writes the output, final states and cache."""
        config = request.config
        packed: GeneralPacked = request.weights.payload
        seq_len, batch = request.x.shape[:2]
        size_d, p = config.num_directions, config.output_size
        layout = GeneralCacheLayout(config, seq_len, batch, training=request.training)
        workspace = request.workspace
        payload = request.cache if request.training else workspace.bytes("lstm_general_steps", layout.nbytes)
        assert payload is not None
        inputs, masks, records = layout.bind(payload)
        active = _active(request.sequence_lengths, seq_len)
        h0, c0 = request.hidden, request.cell
        layer_input = request.x.reshape(seq_len * batch, config.input_size)
        for layer in range(config.num_layers):
            last = layer == config.num_layers - 1
            target = request.output if last else inputs[layer + 1]
            assert target is not None
            for d in range(size_d):
                index = layer * size_d + d
                self.general_sequence_forward(
                    config, packed.weights[layer][d], layer_input, None if h0 is None else h0[index],
                    None if c0 is None else c0[index], records[layer][d], target[:, :, d * p:(d + 1) * p],
                    request.hidden_out[index], request.cell_out[index],
                    reverse=config.reads_backwards(d), active=active, workspace=workspace)
            finish_layer_output(request, layer, target, active, None if last else masks[layer + 1])
            if not last:
                layer_input = target.reshape(seq_len * batch, size_d * p)

    def general_backward(self, request: LSTMBackwardRequest) -> None:
        """All layers backward, top layer first, from the cache of a training forward."""
        config = request.config
        packed: GeneralPacked = request.weights.payload
        seq_len, batch = request.x.shape[:2]
        size_l, size_d, p = config.num_layers, config.num_directions, config.output_size
        dtype = np.dtype(config.dtype)
        workspace = request.workspace
        inputs, masks, records = GeneralCacheLayout(config, seq_len, batch, training=True).bind(request.cache)
        active = _active(request.sequence_lengths, seq_len)
        grads = request.gradients
        dy = request.output_gradient
        dh_final, dc_final = request.hidden_gradient, request.cell_gradient
        x2 = request.x.reshape(seq_len * batch, config.input_size)
        for layer in range(size_l - 1, -1, -1):
            upper = inputs[layer]
            layer_input = x2 if upper is None else upper.reshape(seq_len * batch, size_d * p)
            d_input = workspace.array(f"lstm_general_d_input{layer % 2}", layer_input.shape, dtype)
            d_input.fill(0.0)
            for d in range(size_d):
                index = layer * size_d + d
                self.general_sequence_backward(
                    config, packed.weights[layer][d], layer, d, layer_input, records[layer][d],
                    None if dy is None else dy[:, :, d * p:(d + 1) * p],
                    None if dh_final is None else dh_final[index],
                    None if dc_final is None else dc_final[index],
                    grads.hidden[index], grads.cell[index], d_input, grads,
                    reverse=config.reads_backwards(d), active=active, workspace=workspace)
            if layer > 0:
                mask = masks[layer]
                if mask is not None:
                    np.multiply(d_input, mask.reshape(d_input.shape), out=d_input)
                dy = d_input.reshape(seq_len, batch, size_d * p)
            else:
                np.copyto(grads.input, d_input.reshape(grads.input.shape))

    # ----------------------------------------------------------------------------------
    # One layer and direction.
    # ----------------------------------------------------------------------------------
    def general_sequence_forward(
        self,
        config: LSTMConfig,
        w: GeneralWeights,
        x2: np.ndarray,
        h0: np.ndarray | None,
        c0: np.ndarray | None,
        rec: StepRecord,
        output: np.ndarray,
        h_final: np.ndarray,
        c_final: np.ndarray,
        *,
        reverse: bool,
        active: np.ndarray | None,
        workspace: Workspace,
    ) -> None:
        """One layer and direction over the whole sequence (equations in the module docstring).

        ``x2`` is the layer's input ``(T·N, I_l)``; ``h0`` ``(N, P)`` and ``c0`` ``(N, H)`` the
        initial states (zeros when ``None``); ``rec`` receives the step records; ``output``
        ``(T, N, P)`` (any strides) the time-aligned hidden states; ``h_final`` and
        ``c_final`` the final states. Sequences inactive at a step (``active[t]`` false) keep
        their state.
        """
        dtype = np.dtype(config.dtype)
        h, p = config.hidden_size, config.output_size
        seq_len, batch = output.shape[:2]
        clip, eps = config.clip, config.layer_norm_epsilon
        act_i, act_f, act_g, act_o, act_h = w.activations
        a_x = workspace.array("lstm_general_ax", (seq_len * batch, 4 * h), dtype)
        self._gemm(x2, w.input, out=a_x, trans_b=True)
        a_x = a_x.reshape(seq_len, batch, 4 * h)
        a_h = workspace.array("lstm_general_ah", (batch, 4 * h), dtype)
        z_h = workspace.array("lstm_general_zh", (batch, 4 * h), dtype)
        kz = workspace.array("lstm_general_kz", (batch, 4 * h), dtype)
        c_new = workspace.array("lstm_general_c_new", (batch, h), dtype)
        km = workspace.array("lstm_general_km", (batch, h), dtype)
        r = workspace.array("lstm_general_r", (batch, h), dtype)
        h_state = workspace.array("lstm_general_h", (batch, p), dtype)
        c_state = workspace.array("lstm_general_c", (batch, h), dtype)
        h_new = workspace.array("lstm_general_h_new", (batch, p), dtype)
        _copy_or_zero(h_state, h0)
        _copy_or_zero(c_state, c0)
        times = range(seq_len - 1, -1, -1) if reverse else range(seq_len)
        for t in times:
            np.copyto(rec.h_prev[t], h_state)
            np.copyto(rec.c_prev[t], c_state)
            z = rec.z[t]
            self._gemm(h_state, w.hidden, out=a_h, trans_b=True)
            if w.layer_norm is not None:  # z = LN(W x) + LN(U h) + b
                gx, bx, gh, bh, gc, bc = w.layer_norm
                _layer_norm(a_x[t], gx, bx, eps, rec.x_hat[t], rec.x_rstd[t], z)
                _layer_norm(a_h, gh, bh, eps, rec.h_hat[t], rec.h_rstd[t], z_h)
                np.add(z, z_h, out=z)
            else:
                np.add(a_x[t], a_h, out=z)
            np.add(z, w.bias, out=z)
            for k in range(3):  # peepholes of i, f, g see the previous cell
                _peephole(w.peepholes[k], c_state, z[:, k * h:(k + 1) * h])
            gates = rec.gates[t]
            i, f, g, o = (gates[:, k * h:(k + 1) * h] for k in range(4))
            _clamp(z[:, :3 * h], clip, kz[:, :3 * h])
            _activate(act_i, kz[:, :h], i)
            if config.input_forget:
                np.subtract(1.0, i, out=f)
            else:
                _activate(act_f, kz[:, h:2 * h], f)
            _activate(act_g, kz[:, 2 * h:3 * h], g)
            s = rec.s[t]
            np.multiply(f, c_state, out=s)  # s = f ⊙ c + i ⊙ g
            s += i * g
            _clamp(s, config.cell_clip, c_new)
            _peephole(w.peepholes[3], c_new, z[:, 3 * h:])  # the output gate sees the new cell
            _activate(act_o, _clamp(z[:, 3 * h:], clip, kz[:, 3 * h:]), o)
            m = rec.m[t]
            if w.layer_norm is not None:
                _layer_norm(c_new, gc, bc, eps, rec.c_hat[t], rec.c_rstd[t], m)
            else:
                np.copyto(m, c_new)
            _activate(act_h, _clamp(m, clip, km), rec.act[t])
            np.multiply(o, rec.act[t], out=r)
            if w.projection is not None:
                q = rec.q[t]
                self._gemm(r, w.projection, out=q, trans_b=True)
                _clamp(q, config.projection_clip, h_new)
            else:
                np.copyto(h_new, r)
            if active is not None and not active[t].all():  # finished sequences keep their state
                keep = ~active[t][:, None]
                np.copyto(h_new, h_state, where=keep)
                np.copyto(c_new, c_state, where=keep)
            np.copyto(output[t], h_new)
            np.copyto(h_state, h_new)
            np.copyto(c_state, c_new)
        np.copyto(h_final, h_state)
        np.copyto(c_final, c_state)

    def general_sequence_backward(
        self,
        config: LSTMConfig,
        w: GeneralWeights,
        layer: int,
        d: int,
        layer_input: np.ndarray,
        rec: StepRecord,
        dy: np.ndarray | None,
        dh_final: np.ndarray | None,
        dc_final: np.ndarray | None,
        dh_initial: np.ndarray,
        dc_initial: np.ndarray,
        d_input: np.ndarray,
        grads: LSTMGradientBuffers,
        *,
        reverse: bool,
        active: np.ndarray | None,
        workspace: Workspace,
    ) -> None:
        """Backpropagation through time of one layer and direction.

        ``dy`` ``(T, N, P)`` is the gradient with respect to this direction's outputs (or
        ``None``), ``dh_final`` / ``dc_final`` those with respect to its final states. Writes
        the initial-state gradients into ``dh_initial`` / ``dc_initial``, adds the input
        gradient into ``d_input`` ``(T·N, I_l)``, and writes this layer and direction's slice
        of every weight gradient in ``grads``.
        """
        dtype = np.dtype(config.dtype)
        h, p = config.hidden_size, config.output_size
        seq_len, batch = rec.h_prev.shape[:2]
        clip = config.clip
        act_i, act_f, act_g, act_o, act_h = w.activations
        d_ax = workspace.array("lstm_general_d_ax", (seq_len, batch, 4 * h), dtype)
        d_ah = workspace.array("lstm_general_d_ah", (seq_len, batch, 4 * h), dtype) if w.layer_norm else d_ax
        d_bias = np.zeros(4 * h, dtype)
        d_peep = [None if pw is None else np.zeros_like(pw) for pw in w.peepholes]
        d_projection = None if w.projection is None else np.zeros_like(w.projection)
        d_norm = None if w.layer_norm is None else [np.zeros_like(a) for a in w.layer_norm]
        dh = np.zeros((batch, p), dtype) if dh_final is None else np.array(dh_final, dtype=dtype)
        dc = np.zeros((batch, h), dtype) if dc_final is None else np.array(dc_final, dtype=dtype)
        dz = np.empty((batch, 4 * h), dtype)
        kz = np.empty((batch, 4 * h), dtype)
        times = range(seq_len) if reverse else range(seq_len - 1, -1, -1)  # the forward's, reversed
        for t in times:
            dh_t = dh if dy is None else dh + dy[t]
            keep = None
            if active is not None and not active[t].all():  # finished: pass dh, dc through
                keep = ~active[t][:, None]
                if dy is not None:
                    dh_t = np.where(keep, dh, dh_t)
                pass_h, pass_c = dh_t.copy(), dc.copy()
                dh_t = np.where(keep, 0.0, dh_t).astype(dtype, copy=False)
                dc = np.where(keep, 0.0, dc).astype(dtype, copy=False)
            gates, z, s = rec.gates[t], rec.z[t], rec.s[t]
            i, f, g, o = (gates[:, k * h:(k + 1) * h] for k in range(4))
            c_prev = rec.c_prev[t]
            c_new = _clamp(s, config.cell_clip, np.empty_like(s))
            act = rec.act[t]
            # h_t = clamp(q, projection_clip), q = W_hr r, r = o ⊙ act_h(κ(m))
            if w.projection is not None:
                assert d_projection is not None
                dq = dh_t.copy()
                _clamp_gradient(dq, rec.q[t], config.projection_clip)
                d_projection += dq.T @ (o * act)
                dr = dq @ w.projection
            else:
                dr = dh_t
            do = dr * act
            dm = dr * o
            km = _clamp(rec.m[t], clip, np.empty_like(act))
            _times_derivative(act_h, dm, km, act)
            _clamp_gradient(dm, rec.m[t], clip)
            # m = LN(c_t) or c_t
            if w.layer_norm is not None:
                assert d_norm is not None
                d_cell = dc + _layer_norm_backward(dm, rec.c_hat[t], rec.c_rstd[t], w.layer_norm[4],
                                                   d_norm[4], d_norm[5])
            else:
                d_cell = dc + dm
            # o = act_o(κ(z_o)), z_o includes P_o c_t
            dz[:, 3 * h:] = do
            _times_derivative(act_o, dz[:, 3 * h:], _clamp(z[:, 3 * h:], clip, kz[:, 3 * h:]), o)
            _clamp_gradient(dz[:, 3 * h:], z[:, 3 * h:], clip)
            _peephole_backward(w.peepholes[3], dz[:, 3 * h:], c_new, d_cell, d_peep[3])
            # c_t = clamp(s, cell_clip), s = f ⊙ c_{t−1} + i ⊙ g
            _clamp_gradient(d_cell, s, config.cell_clip)
            di, df, dg = d_cell * g, d_cell * c_prev, d_cell * i
            if config.input_forget:  # f = 1 − i
                di -= df
                df[...] = 0.0
            dc = d_cell * f
            _clamp(z[:, :3 * h], clip, kz[:, :3 * h])
            for k, (act_k, grad) in enumerate(((act_i, di), (act_f, df), (act_g, dg))):
                rows = slice(k * h, (k + 1) * h)
                dz[:, rows] = grad
                if not (k == 1 and config.input_forget):
                    _times_derivative(act_k, dz[:, rows], kz[:, rows], gates[:, rows])
                _clamp_gradient(dz[:, rows], z[:, rows], clip)
                _peephole_backward(w.peepholes[k], dz[:, rows], c_prev, dc, d_peep[k])
            d_bias += dz.sum(axis=0)
            # z = LN(a_x) + LN(a_h) + b, or a_x + a_h + b
            if w.layer_norm is not None:
                assert d_norm is not None
                d_ax[t] = _layer_norm_backward(dz, rec.x_hat[t], rec.x_rstd[t], w.layer_norm[0],
                                               d_norm[0], d_norm[1])
                d_ah[t] = _layer_norm_backward(dz, rec.h_hat[t], rec.h_rstd[t], w.layer_norm[2],
                                               d_norm[2], d_norm[3])
            else:
                d_ax[t] = dz
            dh = self._gemm(d_ah[t], w.hidden)  # U h_{t−1}: dh_{t−1} = Uᵀ da_h
            if keep is not None:
                np.copyto(dh, pass_h, where=keep)
                np.copyto(dc, pass_c, where=keep)
        np.copyto(dh_initial, dh)
        np.copyto(dc_initial, dc)
        # The products over all T·N rows: input, weight and recurrent-weight gradients.
        columns = seq_len * batch
        d_ax2, d_ah2 = d_ax.reshape(columns, 4 * h), d_ah.reshape(columns, 4 * h)
        self._gemm(d_ax2, w.input, out=d_input, beta=1.0)
        d_w = self._gemm(d_ax2, layer_input, trans_a=True)
        d_u = self._gemm(d_ah2, rec.h_prev.reshape(columns, p), trans_a=True)
        _scatter(grads, layer, d, h, d_w, d_u, d_bias, d_peep, d_projection, d_norm)


def finish_layer_output(request: LSTMForwardRequest, layer: int, target: np.ndarray,
                        active: np.ndarray | None, mask: np.ndarray | None) -> None:
    """Make layer ``layer``'s output ``target`` (T, N, features) what the next layer reads:
    zeros past each sequence's length (``active`` (T, N), None when all run), then, in
    training and below the last layer, the dropout mask drawn for the next layer applied and
    kept in the cache's ``mask``."""
    finish_output(request.config.num_layers, layer, target, active, mask,
                  request.dropout_masks if request.training else None)


def finish_output(num_layers: int, layer: int, target: np.ndarray, active: np.ndarray | None,
                  mask: np.ndarray | None, dropout_masks: tuple[np.ndarray | None, ...] | None) -> None:
    """:func:`finish_layer_output` from the request's parts (``dropout_masks`` None outside
    training)."""
    if active is not None:
        target[~active] = 0.0
    if layer < num_layers - 1 and dropout_masks is not None:
        drawn = dropout_masks[layer + 1]
        assert mask is not None and drawn is not None
        np.copyto(mask, drawn)
        np.multiply(target, mask, out=target)


def _active(lengths: np.ndarray | None, seq_len: int) -> np.ndarray | None:
    """``(T, N)``: which sequences run at each step (``None`` when all run every step)."""
    if lengths is None:
        return None
    return np.arange(seq_len)[:, None] < lengths[None, :]


def _copy_or_zero(target: np.ndarray, source: np.ndarray | None) -> None:
    if source is None:
        target.fill(0.0)
    else:
        np.copyto(target, source)


def _scatter(grads: LSTMGradientBuffers, layer: int, d: int, h: int, d_w: np.ndarray, d_u: np.ndarray,
             d_bias: np.ndarray, d_peep: list[np.ndarray | None], d_projection: np.ndarray | None,
             d_norm: list[np.ndarray] | None) -> None:
    """One layer and direction's gradients into the public per-gate (and projection,
    layer-norm) arrays."""
    for k, g in enumerate(grads.gates):
        rows = slice(k * h, (k + 1) * h)
        if layer == 0:
            g.input_weights[0][d] = d_w[rows]
        else:
            g.input_weights[1][layer - 1, d] = d_w[rows]
        g.hidden_weights[layer, d] = d_u[rows]
        if g.bias is not None:
            g.bias[layer, d] = d_bias[rows]
        if g.cell_weights is not None:
            g.cell_weights[layer, d] = d_peep[k]
    if d_projection is not None:
        assert grads.projection is not None
        grads.projection[layer, d] = d_projection
    if d_norm is not None:
        ln = grads.layer_norm
        assert ln is not None
        for target, value in zip((ln.input_gain, ln.input_bias, ln.hidden_gain, ln.hidden_bias, ln.cell_gain,
                                  ln.cell_bias), d_norm):
            target[layer, d] = value

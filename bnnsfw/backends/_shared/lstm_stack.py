"""The LSTM operations of the contract for the built-in backends: packing, cache, stack.

:class:`LSTMStack` implements ``lstm_pack_weights``, ``lstm_cache_layout``,
``lstm_forward`` and ``lstm_backward`` on top of two per-sequence kernels (one layer, one
direction), which it takes from :meth:`LSTMStack._lstm_sequence_kernels`: the reference
kernels of :mod:`.lstm_kernels` here, and the one dispatcher of a faster backend there.

Everything about memory layout lives here, behind the contract:

- **Packed weights** (:class:`LSTMWeights`, one per layer and direction): the gates stacked
  in the internal order candidate, forget, input, output, the rows of sigmoid gates halved
  for the forward (``σ(z) = ½·tanh(z/2) + ½``), the bias as the last column of the input
  weights, ``PROJECTION_PAD`` zero rows after them, and the transposes backward reads.
- **The training cache payload** (:class:`CacheLayout`): the inputs of layers 1…L−1 and
  their dropout masks, then per layer and direction the step blocks ``(T, 6H, N)``, the
  pre-activations ``(T, 4H, N)`` when a gate's derivative needs them, and the hidden state
  before each step ``(T, H, N)`` (``docs/lstm.md`` describes the rows).
- **The weight gradients**: one product each over all ``T·N`` columns of the gate
  gradients, scattered into the public per-gate arrays.

All of that is for BNNS's cell. A configuration that uses a variant of SPEC §4.1
(``LSTMConfig.variants`` not empty) runs the general kernels of :mod:`.lstm_general`
instead, with their own packing and cache layout: the choice is made in
:meth:`LSTMStack._lstm_general_serves`, the one place for it, so no faster kernel (which all
hang off :meth:`LSTMStack._lstm_sequence_kernels`) ever sees such a configuration.
Sequences of length 0 are handled here for both: zero outputs, zero final states and zero
gradients with respect to their initial states.

:meth:`LSTMStack.lstm_forward` runs a :class:`PreparedForward` made for its request; the
contract's optional ``lstm_prepare_forward`` hands one out for every request of a kind, so
what a forward works out from the request alone (the cache layout, the step masks, which
kernels run) is worked out once for calls that repeat.

The directions of a layer run one after the other.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..contract import (
    LSTMBackwardRequest,
    LSTMBackwardResult,
    LSTMCacheLayout,
    LSTMCacheRequest,
    LSTMConfig,
    LSTMForwardCall,
    LSTMForwardRequest,
    LSTMForwardResult,
    call_prepared,
    LSTMGateArrays,
    LSTMPackedWeights,
    LSTMPackRequest,
    Workspace,
)
from . import lstm_general
from .lstm_general import (
    GENERAL_CACHE_FORMAT,
    GeneralCacheLayout,
    GeneralLSTM,
    GeneralPacked,
    finish_output,
)
from .lstm_kernels import (
    INTERNAL_ORDER,
    PROJECTION_PAD,
    LSTMKernels,
    LSTMPeepholes,
    LSTMStepPlan,
    LSTMWeights,
    repeated,
)

__all__ = ["LSTMStack", "PreparedForward", "CacheLayout", "CACHE_FORMAT", "DirectionKernels",
           "scatter_gradients"]

#: The name of the payload layout below; backends that share it share caches.
CACHE_FORMAT = "bnnsfw.lstm.steps/2"

ForwardKernel = Callable[..., None]
BackwardKernel = Callable[..., None]


class DirectionKernels(NamedTuple):
    """What runs one layer and direction: ``forward`` and ``backward`` take the arguments of
    :meth:`LSTMStack._sequence_forward` and :meth:`LSTMStack._sequence_backward` after their
    first (the per-sequence kernel those two wrap)."""

    forward: Callable[..., None]
    backward: Callable[..., None]


class CacheViews(NamedTuple):
    """Views into a cache payload; per-layer lists, per-(layer, direction) nested lists."""

    inputs: list[np.ndarray | None]
    masks: list[np.ndarray | None]
    steps: list[list[np.ndarray]]
    pre: list[list[np.ndarray | None]]
    hidden: list[list[np.ndarray | None]]


class CacheLayout:
    """Offsets of every cached array for one configuration, sequence length and batch size.

    Every array is a multiple of ``T·N`` elements, so the size is exactly affine in ``T·N``.
    With ``reuse_steps`` (the inference scratch space, never a training cache) every step
    shares one step block, a view with a zero stride along T, so the step loop stays the
    same and its working set stays in cache, and no hidden states are kept.
    """

    def __init__(self, plan: LSTMStepPlan, config: LSTMConfig, seq_len: int, batch_size: int, *,
                 training: bool) -> None:
        self.seq_len, self.batch_size = seq_len, batch_size
        self.hidden_size, self.num_layers = config.hidden_size, config.num_layers
        self.num_directions = config.num_directions
        self.dtype = np.dtype(config.dtype)
        self.store_pre = training and plan.store_pre
        self.store_masks = training and config.dropout > 0.0
        self.reuse_steps = not training
        h, dirs = self.hidden_size, self.num_directions
        per_step = 0  # elements per (time step, batch row)
        per_batch = 0  # elements per batch row, for arrays that one step's buffer serves
        for layer in range(self.num_layers):
            if layer > 0:
                per_step += dirs * h * (2 if self.store_masks else 1)
            per_step += dirs * 4 * h * (1 if self.store_pre else 0)
            if self.reuse_steps:
                per_batch += dirs * 6 * h
            else:
                per_step += dirs * 7 * h  # the step blocks and the hidden states
        self.nbytes = self.dtype.itemsize * batch_size * (seq_len * per_step + per_batch)

    def bind(self, payload: np.ndarray) -> CacheViews:
        """Views of the arrays inside ``payload`` (a 1-D uint8 array of at least ``nbytes``)."""
        data = payload[:self.nbytes].view(self.dtype)
        t, n, h, dirs = self.seq_len, self.batch_size, self.hidden_size, self.num_directions
        position = 0

        def take(*shape: int) -> np.ndarray:
            nonlocal position
            size = math.prod(shape)
            view = data[position:position + size].reshape(shape)
            position += size
            return view

        def per_step(*shape: int) -> np.ndarray:
            if not self.reuse_steps:
                return take(t, *shape)
            return repeated(take(*shape), t)

        views = CacheViews([], [], [], [], [])
        for layer in range(self.num_layers):
            views.inputs.append(take(t, n, dirs * h) if layer > 0 else None)
            views.masks.append(take(t, n, dirs * h) if layer > 0 and self.store_masks else None)
            views.steps.append([])
            views.pre.append([])
            views.hidden.append([])
            for _ in range(dirs):
                views.steps[layer].append(per_step(6 * h, n))
                views.pre[layer].append(take(t, 4 * h, n) if self.store_pre else None)
                views.hidden[layer].append(None if self.reuse_steps else take(t, h, n))
        assert position == data.size
        return views


class _Packed(NamedTuple):
    """The payload of :class:`LSTMPackedWeights` for the built-in backends."""

    plan: LSTMStepPlan
    weights: list[list[LSTMWeights]]


def _plan(config: LSTMConfig) -> LSTMStepPlan:
    return LSTMStepPlan.build(config.hidden_size, config.gate_activations, config.hidden_activation,
                              config.peepholes)


def _step_masks(lengths: np.ndarray | None,
                seq_len: int) -> tuple[np.ndarray | None, list[np.ndarray | None]]:
    """``active`` (T, N) and, per step, a (1, N) mask of the sequences past their length
    (None when all run), for the feature-major ``(·, N)`` step arrays."""
    if lengths is None:
        return None, [None] * seq_len
    active = np.arange(seq_len)[:, None] < lengths[None, :]
    inactive = [None if active[t].all() else ~active[t][None, :] for t in range(seq_len)]
    return active, inactive


def _columns(per_step: np.ndarray, out: np.ndarray) -> np.ndarray:
    """A (T, F, N) per-step feature-major array as one (F, T·N) matrix (column t·N + n)."""
    seq_len, features, batch = per_step.shape
    np.copyto(out.reshape(features, seq_len, batch), per_step.transpose(1, 0, 2))
    return out


def _stack(config: LSTMConfig, plan: LSTMStepPlan,
           gates_public: Sequence[LSTMGateArrays]) -> list[list[LSTMWeights]]:
    """Per layer and direction, the gates' weights stacked in the internal gate order
    (copies); the forward ones with the rows of sigmoid gates halved (``LSTMWeights``)."""
    h, dtype = config.hidden_size, np.dtype(config.dtype)
    gates = [gates_public[k] for k in INTERNAL_ORDER]
    kinds = plan.peepholes
    scale = plan.row_scale(dtype)
    halve = any(plan.halved)
    stacked = []
    for layer in range(config.num_layers):
        row = []
        for d in range(config.num_directions):
            # Row-major whatever the caller's arrays are (a transposed view concatenates to a
            # column-major array), as every product below and the compiled kernels expect.
            wx = np.ascontiguousarray(np.concatenate(
                [g.input_weights[0][d] if layer == 0 else g.input_weights[1][layer - 1, d] for g in gates]))
            u = np.ascontiguousarray(np.concatenate([g.hidden_weights[layer, d] for g in gates]))
            bias = np.zeros((4 * h, 1), dtype)
            for k, g in enumerate(gates):
                if g.bias is not None:
                    bias[k * h:(k + 1) * h, 0] = g.bias[layer, d]
            full_pre = None
            if any(kind == "full" for kind in kinds[:3]):
                full_pre = np.zeros((4 * h, h), dtype)
                for k in range(3):
                    if kinds[k] == "full":
                        full_pre[k * h:(k + 1) * h] = gates[k].cell_weights[layer, d]
            diagonal = tuple(  # columns (H, 1): they scale the rows of an (H, N) state
                np.array(g.cell_weights[layer, d]).reshape(h, 1) if kind == "diagonal" else None
                for g, kind in zip(gates, kinds)
            )
            full_output = np.array(gates[3].cell_weights[layer, d]) if kinds[3] == "full" else None
            peepholes = LSTMPeepholes.of(diagonal, full_output)
            wx_bias = np.zeros((4 * h + PROJECTION_PAD, wx.shape[1] + 1), dtype)
            wx_bias[:4 * h, :-1] = wx
            wx_bias[:4 * h, -1:] = bias
            if halve:
                rows = [scale[k * h:(k + 1) * h] for k in range(4)]
                wx_bias[:4 * h] *= scale
                halved = tuple(None if c is None else c * rows[k] for k, c in enumerate(diagonal))
                forward = (wx_bias, u * scale, None if full_pre is None else full_pre * scale,
                           LSTMPeepholes.of(halved, None if full_output is None else full_output * rows[3]))
            else:
                forward = (wx_bias, u, full_pre, peepholes)
            row.append(LSTMWeights(*forward, wx_t=np.ascontiguousarray(wx.T),
                                   u_t=np.ascontiguousarray(u.T), full_pre_grad=full_pre,
                                   peepholes_grad=peepholes))
        stacked.append(row)
    return stacked


def _zero_length_states(lengths: np.ndarray | None, *states: np.ndarray) -> None:
    """Zero the ``(L·D, N, ·)`` states of the sequences of length 0 (SPEC §4.1: ONNX Runtime
    returns zeros for them, not the initial states; their gradients are zero too)."""
    if lengths is None:
        return
    empty = lengths == 0
    if empty.any():
        for state in states:
            state[:, empty] = 0.0


class PreparedForward:
    """The forward of every request of one kind (:class:`~..contract.LSTMForwardCall`): what
    each call of :meth:`LSTMStack.lstm_forward` works out from the configuration, shapes and
    lengths (the cache layout, the step masks, which kernels run) is worked out once here.

    Per layer and direction the forward kernel runs the input projection and the recurrence
    and writes that direction's columns of the output (or of the next layer's input, kept in
    the cache). ``kernels`` None asks the backend for them at each call.
    """

    def __init__(self, backend: LSTMStack, request: LSTMForwardRequest,
                 kernels: DirectionKernels | None) -> None:
        config = request.config
        packed: _Packed = request.weights.payload
        self._backend = backend
        self._plan, self._weights = packed.plan, packed.weights
        self._seq_len, self._batch = request.x.shape[:2]
        self._num_layers, self._size_d = config.num_layers, config.num_directions
        self._h, self._input_size = config.hidden_size, config.input_size
        self._dtype = np.dtype(config.dtype)
        self._training = request.training
        self._layout = CacheLayout(self._plan, config, self._seq_len, self._batch, training=request.training)
        lengths = request.sequence_lengths
        self._lengths = None if lengths is None else np.array(lengths)
        self._active, self._inactive = _step_masks(self._lengths, self._seq_len)
        self._kernels = kernels
        #: Whether the kernels were chosen here (else at each call).
        self.kernels_fixed = kernels is not None
        self._bound: tuple[np.ndarray | None, CacheViews | None] = (None, None)  # inference scratch

    def _views(self, cache: np.ndarray | None, workspace: Workspace) -> CacheViews:
        if self._training:
            assert cache is not None
            return self._layout.bind(cache)
        scratch = workspace.bytes("lstm_forward_steps", self._layout.nbytes)
        base, views = self._bound  # the workspace hands back the same memory from call to call
        if views is None or scratch.base is not base or base is None:
            views = self._layout.bind(scratch)
            self._bound = (scratch.base, views)
        return views

    def __call__(self, x: np.ndarray, hidden: np.ndarray | None, cell: np.ndarray | None, output: np.ndarray,
                 hidden_out: np.ndarray, cell_out: np.ndarray, cache: np.ndarray | None,
                 dropout_masks: tuple[np.ndarray | None, ...] | None, workspace: Workspace) -> None:
        plan, weights, lengths, inactive = self._plan, self._weights, self._lengths, self._inactive
        seq_len, batch, size_d, h = self._seq_len, self._batch, self._size_d, self._h
        views = self._views(cache, workspace)
        kernels = self._kernels
        if kernels is None:
            kernels = self._backend._lstm_direction_kernels(plan, lengths, batch, self._dtype)
        forward = kernels.forward
        last = self._num_layers - 1
        masks = dropout_masks if self._training else None
        layer_input = x.reshape(seq_len * batch, self._input_size)
        for layer in range(self._num_layers):
            target = output if layer == last else views.inputs[layer + 1]
            assert target is not None
            for d in range(size_d):
                index = layer * size_d + d
                forward(plan, weights[layer][d], layer_input, None if hidden is None else hidden[index],
                    None if cell is None else cell[index], views.steps[layer][d], views.pre[layer][d],
                    views.hidden[layer][d], target[:, :, d * h:(d + 1) * h],
                    hidden_out[index], cell_out[index], reverse=d == 1, lengths=lengths, inactive=inactive,
                    workspace=workspace)
            finish_output(self._num_layers, layer, target, self._active,
                          None if layer == last else views.masks[layer + 1], masks)
            if layer < last:
                layer_input = target.reshape(seq_len * batch, size_d * h)
        _zero_length_states(lengths, hidden_out, cell_out)


class LSTMStack(LSTMKernels, GeneralLSTM):
    """The contract's LSTM operations, built on per-sequence kernels."""

    # ----------------------------------------------------------------------------------
    # The one place that picks the implementation: the general kernels for the variants
    # of SPEC §4.1, else the per-sequence kernels (a faster backend overrides those).
    # ----------------------------------------------------------------------------------
    @staticmethod
    def _lstm_general_serves(config: LSTMConfig) -> bool:
        """True when the configuration uses a variant of SPEC §4.1: the general reference
        kernels (:mod:`.lstm_general`) run it, on every backend."""
        return bool(config.variants)

    def _lstm_sequence_kernels(self, plan: LSTMStepPlan, lengths: np.ndarray | None,
                               batch: int) -> tuple[ForwardKernel, BackwardKernel]:
        """The forward and backward kernels that serve this cell, these lengths and ``batch``
        sequences."""
        return self.lstm_forward_sequence, self.lstm_backward_sequence

    # ----------------------------------------------------------------------------------
    # Contract operations.
    # ----------------------------------------------------------------------------------
    def lstm_pack_weights(self, request: LSTMPackRequest) -> LSTMPackedWeights:
        """Stack, halve and transpose the public weights (module docstring)."""
        if self._lstm_general_serves(request.config):
            return LSTMPackedWeights(config=request.config, version=request.version,
                                     payload=lstm_general.pack(request))
        plan = _plan(request.config)
        return LSTMPackedWeights(config=request.config, version=request.version,
                                 payload=_Packed(plan, _stack(request.config, plan, request.gates)))

    def lstm_cache_layout(self, request: LSTMCacheRequest) -> LSTMCacheLayout:
        """The size of the payload described in the module docstring."""
        if self._lstm_general_serves(request.config):
            general = GeneralCacheLayout(request.config, request.seq_len, request.batch_size, training=True)
            return LSTMCacheLayout(nbytes=general.nbytes, format=GENERAL_CACHE_FORMAT)
        layout = CacheLayout(_plan(request.config), request.config, request.seq_len, request.batch_size,
                             training=True)
        return LSTMCacheLayout(nbytes=layout.nbytes, format=CACHE_FORMAT)

    def lstm_forward(self, request: LSTMForwardRequest) -> LSTMForwardResult:
        """All layers forward; writes the cache, the output and the final states
        (:class:`PreparedForward`, made for this one request)."""
        if isinstance(request.weights.payload, GeneralPacked):
            self.general_forward(request)
            _zero_length_states(request.sequence_lengths, request.hidden_out, request.cell_out)
        else:
            call_prepared(self._prepared_forward(request), request)
        return LSTMForwardResult(output=request.output, hidden=request.hidden_out, cell=request.cell_out)

    def lstm_prepare_forward(self, request: LSTMForwardRequest) -> LSTMForwardCall | None:
        """:class:`PreparedForward` for requests of this kind (the contract's optional
        operation); None for the variants of SPEC §4.1, whose general kernels have nothing
        to choose ahead."""
        if isinstance(request.weights.payload, GeneralPacked):
            return None
        return self._prepared_forward(request)

    def _prepared_forward(self, request: LSTMForwardRequest) -> PreparedForward:
        packed: _Packed = request.weights.payload
        seq_len, batch = request.x.shape[:2]
        kernels = None
        if self._lstm_kernels_fixed(packed.plan, batch):
            kernels = self._lstm_direction_kernels(packed.plan, request.sequence_lengths, batch,
                                                   np.dtype(request.config.dtype))
        return PreparedForward(self, request, kernels)

    def _lstm_kernels_fixed(self, plan: LSTMStepPlan, batch: int) -> bool:
        """Whether :meth:`_lstm_direction_kernels` gives the same kernels to every call of this
        cell and batch (a backend whose choice depends on the threads in force says no)."""
        return True

    def lstm_backward(self, request: LSTMBackwardRequest) -> LSTMBackwardResult:
        """All layers backward, top layer first: per layer and direction the backward kernel
        leaves the gate gradients feature-major ``(4H, T·N)``, then the weight and input
        gradients are one product each."""
        config = request.config
        if isinstance(request.weights.payload, GeneralPacked):
            self.general_backward(request)
            grads = request.gradients
            _zero_length_states(request.sequence_lengths, grads.hidden, grads.cell)
            return LSTMBackwardResult(gradients=grads)
        packed: _Packed = request.weights.payload
        plan, weights = packed.plan, packed.weights
        seq_len, batch = request.x.shape[:2]
        size_l, size_d, h = config.num_layers, config.num_directions, config.hidden_size
        dtype = np.dtype(config.dtype)
        workspace = request.workspace
        views = CacheLayout(plan, config, seq_len, batch, training=True).bind(request.cache)
        lengths = request.sequence_lengths
        kernels = self._lstm_direction_kernels(plan, lengths, batch, dtype)
        backward = kernels.backward
        active, inactive = _step_masks(lengths, seq_len)
        grads = request.gradients
        dy, dh_final, dc_final = request.output_gradient, request.hidden_gradient, request.cell_gradient
        x2 = request.x.reshape(seq_len * batch, config.input_size)

        def input_of(layer: int) -> np.ndarray:
            upper = views.inputs[layer]
            return x2 if upper is None else upper.reshape(seq_len * batch, size_d * h)

        def input_gradient(layer: int) -> np.ndarray:
            if layer == 0 and grads.input.flags.c_contiguous:  # write the input gradient in place
                return grads.input.reshape(x2.shape)
            return workspace.array(f"lstm_d_input{layer % 2}", input_of(layer).shape, dtype)

        for layer in range(size_l - 1, -1, -1):
            d_input = input_gradient(layer)
            for d in range(size_d):
                index = layer * size_d + d
                backward(plan, weights[layer][d], layer, d, input_of(layer), views,
                         None if dy is None else dy[:, :, d * h:(d + 1) * h],
                         None if dh_final is None else dh_final[index],
                         None if dc_final is None else dc_final[index],
                         grads.hidden[index], grads.cell[index], d_input, grads.gates,
                         lengths=lengths, active=active, inactive=inactive, workspace=workspace)
            if layer > 0:
                mask = views.masks[layer]
                if mask is not None:
                    np.multiply(d_input, mask.reshape(d_input.shape), out=d_input)
                dy = d_input.reshape(seq_len, batch, size_d * h)
            elif not np.shares_memory(d_input, grads.input):
                np.copyto(grads.input, d_input.reshape(grads.input.shape))
        _zero_length_states(lengths, grads.hidden, grads.cell)
        return LSTMBackwardResult(gradients=grads)

    def _lstm_direction_kernels(self, plan: LSTMStepPlan, lengths: np.ndarray | None, batch: int,
                                dtype: np.dtype | None = None) -> DirectionKernels:
        """What runs each layer and direction of ``batch`` sequences in ``dtype``: the
        per-sequence kernels of :meth:`_lstm_sequence_kernels`, with the weight gradients made
        from the all-steps gate gradients they leave. A backend that runs whole directions
        itself overrides this."""
        forward, backward = self._lstm_sequence_kernels(plan, lengths, batch)
        return DirectionKernels(functools.partial(self._sequence_forward, forward),
                                functools.partial(self._sequence_backward, backward))

    @staticmethod
    def _sequence_forward(kernel: ForwardKernel, plan: LSTMStepPlan, w: LSTMWeights, layer_input: np.ndarray,
                          h0: np.ndarray | None, c0: np.ndarray | None, steps: np.ndarray,
                          pre: np.ndarray | None, hidden: np.ndarray | None, output: np.ndarray,
                          h_final: np.ndarray, c_final: np.ndarray, *, reverse: bool,
                          lengths: np.ndarray | None, inactive: Sequence[np.ndarray | None],
                          workspace: Workspace) -> None:
        """One layer and direction forward through a per-sequence kernel."""
        kernel(plan, w, layer_input, h0, c0, steps, pre, hidden, output, h_final, c_final, reverse=reverse,
               inactive=inactive, scratch=workspace)

    def _sequence_backward(self, kernel: BackwardKernel, plan: LSTMStepPlan, w: LSTMWeights, layer: int,
                           d: int,
                           layer_input: np.ndarray, views: CacheViews, dy: np.ndarray | None,
                           dh_final: np.ndarray | None, dc_final: np.ndarray | None, dh_initial: np.ndarray,
                           dc_initial: np.ndarray, d_input: np.ndarray, gates: Sequence[LSTMGateArrays], *,
                           lengths: np.ndarray | None, active: np.ndarray | None,
                           inactive: Sequence[np.ndarray | None], workspace: Workspace) -> None:
        """One layer and direction backward through a per-sequence kernel, which leaves the
        gate gradients of all steps ``(4H, T·N)``; then the weight and input gradients."""
        seq_len, _, batch = views.steps[layer][d].shape
        h, dtype = plan.hidden_size, d_input.dtype
        d_gates = workspace.array("lstm_d_gates", (4 * h, seq_len * batch), dtype)
        c_new = workspace.array("lstm_cell_new", (seq_len, h, batch), dtype) if plan.needs_cell else None
        kernel(plan, w, views.steps[layer][d], views.pre[layer][d], dy, dh_final, dc_final, dh_initial,
               dc_initial, d_gates, reverse=d == 1, active=active, inactive=inactive, c_new=c_new,
               scratch=workspace)
        self._lstm_weight_gradients(plan, w, layer, d, layer_input, views, d_gates, c_new, d_input, gates,
                                    workspace)

    def _lstm_weight_gradients(self, plan: LSTMStepPlan, w: LSTMWeights, layer: int, d: int,
                               layer_input: np.ndarray, views: CacheViews, d_gates: np.ndarray,
                               c_new: np.ndarray | None, d_input: np.ndarray,
                               gates: Sequence[LSTMGateArrays], workspace: Workspace) -> None:
        """Weight, bias, peephole and input gradients of one layer and direction: one product
        each over all T·N columns of ``d_gates`` (4H, T·N), scattered into the public gates."""
        gemm = self._gemm
        four_h, columns = d_gates.shape
        h = four_h // 4
        dtype = d_gates.dtype
        d_wx = gemm(d_gates, layer_input)
        before = views.hidden[layer][d]
        assert before is not None  # a training cache keeps the states
        hidden = _columns(before, workspace.array("lstm_hidden_columns", (h, columns), dtype))
        d_u = gemm(d_gates, hidden, trans_b=True)
        d_bias = d_gates.sum(axis=1)
        d_peep: list[np.ndarray | None] = [None] * 4
        if any(plan.peepholes):
            cell_prev = _columns(views.steps[layer][d][:, :h],
                                 workspace.array("lstm_cell_columns", (h, columns), dtype))
            d_full_pre = None
            if w.full_pre_grad is not None:
                d_full_pre = gemm(d_gates, cell_prev, trans_b=True)
            for gate, kind in enumerate(plan.peepholes):
                if kind is None:
                    continue
                block = d_gates[gate * h:(gate + 1) * h]
                if gate < 3:
                    source = cell_prev
                else:  # the output gate sees the new cell
                    assert c_new is not None
                    source = _columns(c_new, workspace.array("lstm_cell_new_columns", (h, columns), dtype))
                if kind == "full" and gate < 3:
                    assert d_full_pre is not None
                    d_peep[gate] = d_full_pre[gate * h:(gate + 1) * h]
                elif kind == "full":
                    d_peep[gate] = gemm(block, source, trans_b=True)
                else:
                    d_peep[gate] = np.einsum("hr,hr->h", block, source)
        gemm(d_gates, w.wx_t, out=d_input, trans_a=True, trans_b=True, beta=0.0 if d == 0 else 1.0)
        scatter_gradients(layer, d, d_wx, d_u, d_bias, d_peep, gates)


def scatter_gradients(layer: int, d: int, d_wx: np.ndarray, d_u: np.ndarray, d_bias: np.ndarray,
                      d_peep: Sequence[np.ndarray | None], gates: Sequence[LSTMGateArrays]) -> None:
    """Write one layer and direction's stacked gradients (rows in the internal gate order) into
    the public per-gate arrays; ``d_peep[k]`` is internal gate ``k``'s peephole gradient."""
    h = d_u.shape[1]
    for k, public in enumerate(INTERNAL_ORDER):
        g = gates[public]
        rows = slice(k * h, (k + 1) * h)
        if layer == 0:
            g.input_weights[0][d] = d_wx[rows]
        else:
            g.input_weights[1][layer - 1, d] = d_wx[rows]
        g.hidden_weights[layer, d] = d_u[rows]
        if g.bias is not None:
            g.bias[layer, d] = d_bias[rows]
        if g.cell_weights is not None:
            g.cell_weights[layer, d] = d_peep[k]

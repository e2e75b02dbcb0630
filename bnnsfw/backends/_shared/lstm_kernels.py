"""Reference (NumPy) per-sequence kernels of the LSTM, for one layer and one direction.

:class:`bnnsfw.backends._shared.lstm_stack.LSTMStack` runs the stack (the contract's
``lstm_forward`` and ``lstm_backward``) on two kernels per layer and direction:
:meth:`LSTMKernels.lstm_forward_sequence` (the input projection of every time step, then the
recurrence) and :meth:`LSTMKernels.lstm_backward_sequence` (the recurrence in reverse,
leaving the gradient with respect to every gate pre-activation); the stack then computes
the weight and input gradients as single products. The versions here handle every cell (any
per-gate activation, peepholes of either kind, variable lengths) with in-place ufuncs on
preallocated buffers. They are the reference; a faster backend picks its own kernels for the
cells it specialises in one place (``_lstm_sequence_kernels``).

Internal layout (what the training cache holds, see ``docs/lstm.md``). Gates are stored in
the **internal order candidate, forget, input, output** (``g, f, i, o``), so that the three
sigmoid gates are one contiguous block and the two products of the cell update are one call.
Each time step owns one feature-major block of ``6H`` rows and ``N`` columns (one column per
sequence)::

    rows [0:H]    c_{t-1}        the cell before the step
    rows [H:2H]   g              activated gates (internal order)
    rows [2H:3H]  f
    rows [3H:4H]  i
    rows [4H:5H]  o
    rows [5H:6H]  act_h(c_t)     the hidden activation of the new cell

so ``[c_{t-1}, g] ⊙ [f, i]`` is one product and the new cell ``c_t`` is written straight into
the next step's first rows. The hidden state before each step is kept feature-major too,
``(T, H, N)``, and the forward kernel writes the time-aligned output (row-major, one
direction's columns of the layer output) from it in one copy at the end. A forward step
writes the gate pre-activations into the block's gate rows, adds ``U h_{t-1}`` with one
product and finishes in place.

Forward weights have the rows of sigmoid gates **halved** (``W/2``, ``U/2``, ``b/2``, and the
peepholes of those gates), so a step holds ``z/2`` for those gates and
``σ(z) = ½·tanh(z/2) + ½`` costs one ``tanh`` and one multiply-add, with no exp and no
overflow. Scaling by ½ is exact in floating point, so this changes no result.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, Sequence

import numpy as np

from ...activation import Activation
from ...enums import ActivationFunction as AF

__all__ = [
    "LSTMKernels",
    "LSTMStepPlan",
    "LSTMPeepholes",
    "LSTMWeights",
    "LSTMScratch",
    "INTERNAL_ORDER",
    "PROJECTION_PAD",
    "gather_output",
    "repeated",
]

#: Internal gate positions (candidate, forget, input, output) and, for each, the public gate
#: index (public order: input, forget, candidate, output).
CANDIDATE, FORGET, INPUT, OUTPUT = 0, 1, 2, 3
INTERNAL_ORDER = (2, 1, 0, 3)
#: Zero rows after the 4H gate rows of ``LSTMWeights.wx_bias``: a row-major projection made
#: with them has rows 4H + 16 elements apart, not a power of two, so reading a step's rows
#: transposed does not make every access collide in the same cache set.
PROJECTION_PAD = 16


class LSTMStepPlan(NamedTuple):
    """What the kernels need to know about the cell, fixed at layer creation.

    ``activations`` and ``peepholes`` are per gate in the internal order (candidate, forget,
    input, output); ``peepholes[k]`` is ``None``, ``"full"`` or ``"diagonal"``. ``halved[k]``
    says the forward weights of gate ``k`` are halved (its activation is sigmoid).
    ``pre_cell_runs`` groups the rows of the candidate, forget and input gates into runs
    sharing one activation, ``(start, stop, activation, halved)`` in gate-row units of the
    ``4H`` gate block.
    """

    hidden_size: int
    activations: tuple[Activation, Activation, Activation, Activation]
    hidden_activation: Activation
    peepholes: tuple[str | None, str | None, str | None, str | None]
    halved: tuple[bool, bool, bool, bool]
    pre_cell_runs: tuple[tuple[int, int, Activation, bool], ...]
    store_pre: bool
    needs_cell: bool

    @classmethod
    def build(
        cls,
        hidden_size: int,
        activations: Sequence[Activation],
        hidden_activation: Activation,
        peepholes: Sequence[str | None],
    ) -> "LSTMStepPlan":
        """The plan of a cell from its public-order gate activations and peephole kinds."""
        h = hidden_size
        acts = tuple(activations[k] for k in INTERNAL_ORDER)
        peeps = tuple(peepholes[k] for k in INTERNAL_ORDER)
        halved = tuple(a.function is AF.sigmoid for a in acts)
        runs: list[tuple[int, int, Activation, bool]] = []
        for gate in (CANDIDATE, FORGET, INPUT):
            act = acts[gate]
            if runs and runs[-1][2] == act:
                runs[-1] = (runs[-1][0], (gate + 1) * h, act, halved[gate])
            else:
                runs.append((gate * h, (gate + 1) * h, act, halved[gate]))
        store_pre = not all(a.derivative_from_output for a in acts)
        needs_cell = peeps[OUTPUT] is not None or not hidden_activation.derivative_from_output
        return cls(h, (acts[0], acts[1], acts[2], acts[3]), hidden_activation,
                   (peeps[0], peeps[1], peeps[2], peeps[3]), (halved[0], halved[1], halved[2], halved[3]),
                   tuple(runs), store_pre, needs_cell)

    @property
    def default_cell(self) -> bool:
        """tanh candidate, sigmoid forget, input and output gates, tanh hidden activation and
        no peepholes: the cell almost every model uses."""
        return (self.activations[CANDIDATE].function is AF.tanh and all(self.halved[1:])
                and self.hidden_activation.function is AF.tanh and all(p is None for p in self.peepholes))

    def row_scale(self, dtype: np.dtype) -> np.ndarray:
        """``(4H, 1)``: ½ on the rows of halved gates, 1 elsewhere (internal order)."""
        h = self.hidden_size
        scale = np.ones((4 * h, 1), dtype)
        for k, half in enumerate(self.halved):
            if half:
                scale[k * h:(k + 1) * h] = 0.5
        return scale


class LSTMPeepholes(NamedTuple):
    """The peephole weights of one layer and direction, as the kernels use them.

    ``diagonal[k]`` is the ``(H, 1)`` column of internal gate ``k`` (or ``None``);
    ``full_output`` the ``(H, H)`` matrix of the output gate (or ``None``). Full peepholes of
    the other gates are stacked into one ``(4H, H)`` matrix (``LSTMWeights.full_pre``).
    """

    diagonal: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None]
    full_output: np.ndarray | None

    @classmethod
    def of(cls, diagonal: Sequence[np.ndarray | None], full_output: np.ndarray | None) -> "LSTMPeepholes":
        """From the four internal-order diagonal columns (any sequence) and the output matrix."""
        return cls((diagonal[0], diagonal[1], diagonal[2], diagonal[3]), full_output)


class LSTMWeights(NamedTuple):
    """One layer and direction, rows in the internal gate order, stacked for single products.

    The forward copies (``wx_bias``, ``u``, ``full_pre``, ``peepholes``) have the rows of
    halved gates multiplied by ½; ``wx_t``, ``u_t`` and the ``*_grad`` ones are the true
    weights backward needs.
    The bias is the last column of ``wx_bias``, so a product with inputs that end in a column
    of ones adds it for free.
    """

    wx_bias: np.ndarray  # (4H + PROJECTION_PAD, I_l + 1): [W | b], then zero rows
    u: np.ndarray  # (4H, H): each step's U @ h
    full_pre: np.ndarray | None  # (4H, H): full peepholes of g, f, i on c_{t-1}; zero rows elsewhere
    peepholes: LSTMPeepholes  # diagonal ones, and the output gate's full one
    wx_t: np.ndarray  # (I_l, 4H): Wᵀ stored contiguous, the faster layout for dX = dZᵀ W
    u_t: np.ndarray  # (H, 4H): Uᵀ stored contiguous, for backward's Uᵀ dz
    full_pre_grad: np.ndarray | None  # (4H, H)
    peepholes_grad: LSTMPeepholes
    # U and Uᵀ in rows padded to C + 16 elements, for the compiled step products (a backend that
    # wants them packs them: ``NumbaBackend.lstm_pack_weights``); None elsewhere.
    u_wide: np.ndarray | None = None
    u_t_wide: np.ndarray | None = None
    # W true (4H, I_l), stored contiguous, for a backend whose input gradient reads its rows
    # (``NumbaBackend.lstm_pack_weights``); None elsewhere.
    wx_rows: np.ndarray | None = None
    # [U W]'s rows packed for threads' step products, by thread count and rows a block, made when
    # first needed (a dict to fill for a backend that packs them: ``NumbaBackend.lstm_pack_weights``).
    step_tiles: dict[tuple[int, int], np.ndarray] | None = None
    # What a compiled forward reads from these weights for one input width, batch and kind of
    # call, made when first needed (a dict to fill, as ``step_tiles``).
    forward_args: dict[tuple, Any] | None = None

    @property
    def wx(self) -> np.ndarray:
        """(4H, I_l): the forward input weights (a view)."""
        return self.wx_bias[:-PROJECTION_PAD, :-1]

    @property
    def bias(self) -> np.ndarray:
        """(4H, 1): the forward bias (a view)."""
        return self.wx_bias[:-PROJECTION_PAD, -1:]


class LSTMScratch(Protocol):
    """Scratch space the kernels borrow: named arrays reused across calls."""

    def array(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        ...


def repeated(one: np.ndarray, count: int) -> np.ndarray:
    """A C-contiguous ``one`` seen ``count`` times along a new leading axis of stride 0: a view,
    writable when ``one`` is (how an inference's steps share one step's memory). Made with the
    ``ndarray`` constructor, which took 0.7 µs where ``as_strided`` took 2.9; an inference call
    makes two such views, and on the S row and the demo's model taking them this way and the
    BLAS thread counts set directly (:mod:`bnnsfw._threadpool`) made the call 4–8 % faster."""
    assert one.flags.c_contiguous, "a view of a contiguous array"
    return np.ndarray((count, *one.shape), one.dtype, buffer=one, strides=(0, *one.strides))


def gather_output(hidden: np.ndarray, h_final: np.ndarray, output: np.ndarray, reverse: bool) -> None:
    """The time-aligned output (the state after consuming ``x[t]``), from the feature-major
    states before each step, ``hidden`` (T, H, N), and the final one, ``h_final`` (N, H)."""
    seq_len = hidden.shape[0]
    if not reverse:  # after step t is the "before" of t + 1
        np.copyto(output[:seq_len - 1], hidden[1:].transpose(0, 2, 1))
        np.copyto(output[seq_len - 1], h_final)
    else:  # the reverse direction's "before" of t - 1
        np.copyto(output[1:], hidden[:seq_len - 1].transpose(0, 2, 1))
        np.copyto(output[0], h_final)


def _copy_or_zero(target: np.ndarray, source: np.ndarray | None) -> None:
    if source is None:
        target.fill(0.0)
    else:
        np.copyto(target, source)


class LSTMKernels:
    """The reference per-sequence LSTM kernels, in plain NumPy.

    Each writes only into the buffers it is given and the scratch arrays it borrows (names
    starting with ``lstm_``). Products go through :meth:`_gemm`, which the backend provides.
    """

    def _gemm(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *, trans_a: bool = False,
              trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
        """``out = alpha · op(a) @ op(b) + beta · out`` (the backend's product, unchecked)."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------------
    # Activations in place, and their derivatives multiplied into a gradient.
    # ----------------------------------------------------------------------------------
    def lstm_activate(self, act: Activation, block: np.ndarray, out: np.ndarray | None = None,
                      halved: bool = False) -> None:
        """``out = act(block)`` (in place when ``out`` is omitted). With ``halved`` the block
        holds ``x/2`` and the activation is sigmoid: ``σ(x) = ½·tanh(x/2) + ½``."""
        function = act.function
        if out is None:
            out = block
        if halved:
            np.tanh(block, out=out)
            np.multiply(out, 0.5, out=out)
            np.add(out, 0.5, out=out)
        elif function is AF.tanh:
            np.tanh(block, out=out)
        elif function is AF.identity:
            if out is not block:
                np.copyto(out, block)
        else:
            act.forward(block, out=out)

    def lstm_times_derivative(
        self, act: Activation, grad: np.ndarray, y: np.ndarray, x: np.ndarray | None, tmp: np.ndarray
    ) -> None:
        """``grad *= act'(x)`` in place, from the output ``y = act(x)`` where that suffices."""
        function = act.function
        if function is AF.sigmoid:
            np.subtract(1.0, y, out=tmp)
            np.multiply(tmp, y, out=tmp)
            np.multiply(grad, tmp, out=grad)
        elif function is AF.tanh:
            np.multiply(y, y, out=tmp)
            np.subtract(1.0, tmp, out=tmp)
            np.multiply(grad, tmp, out=grad)
        elif function is not AF.identity:
            np.multiply(grad, act.derivative(x=x, y=y), out=grad)

    # ----------------------------------------------------------------------------------
    # One layer and direction, forward.
    # ----------------------------------------------------------------------------------
    def lstm_forward_sequence(
        self,
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
        """Run one layer and direction over the whole sequence.

        Parameters
        ----------
        x2 : (T·N, I_l)
            The layer's input, time-major rows.
        h0, c0 : (N, H) or None
            Initial states (zeros when ``None``).
        steps : (T, 6H, N)
            The step blocks (layout in the module docstring); one block repeated along T
            (stride 0) in inference, where nothing needs to be kept.
        pre : (T, 4H, N) or None
            Receives the true gate pre-activations (internal order) when given.
        hidden : (T, H, N) or None
            Receives the hidden state before each step (a training forward); ``None`` in
            inference.
        output : (T, N, H)
            Receives the time-aligned output, the state after consuming ``x[t]`` (any
            strides: a direction's columns of the layer output).
        h_final, c_final : (N, H)
            Receive the final states.
        reverse : bool
            Walk the sequence from ``T − 1`` down to 0.
        inactive : T entries, each a (1, N) boolean mask or None
            Sequences already past their length at that step: they keep their state.
        """
        dtype = steps.dtype
        seq_len, six_h, batch = steps.shape
        h = six_h // 6
        four_h = 4 * h
        if hidden is None:
            hidden = scratch.array("lstm_hidden", (seq_len, h, batch), dtype)
        projection = scratch.array("lstm_projection", (seq_len * batch, four_h), dtype)
        self._gemm(x2, w.wx, out=projection, trans_b=True)
        projection = projection.reshape(seq_len, batch, four_h)
        c_last = scratch.array("lstm_c_last", (h, batch), dtype)
        h_last = scratch.array("lstm_h_last", (h, batch), dtype)
        times = range(seq_len - 1, -1, -1) if reverse else range(seq_len)
        step = -1 if reverse else 1
        first = times[0]
        _copy_or_zero(hidden[first], None if h0 is None else h0.T)
        _copy_or_zero(steps[first, :h], None if c0 is None else c0.T)
        unscale = None if pre is None else 1.0 / plan.row_scale(dtype)  # the true pre-activations
        for k, t in enumerate(times):
            last = k == seq_len - 1
            block = steps[t]
            z = block[h:5 * h]
            np.add(projection[t].T, w.bias, out=z)
            if k > 0 or h0 is not None:  # U @ 0 adds nothing
                self._gemm(w.u, hidden[t], out=z, beta=1.0)
            if w.full_pre is not None:
                self._gemm(w.full_pre, block[:h], out=z, beta=1.0)
            self.lstm_forward_step(
                plan, w, block, c_last if last else steps[t + step, :h], hidden[t],
                h_last if last else hidden[t + step], scratch,
                pre=None if pre is None else pre[t], unscale=unscale, inactive=inactive[t])
        np.copyto(h_final, h_last.T)
        np.copyto(c_final, c_last.T)
        gather_output(hidden, h_final, output, reverse)

    def lstm_forward_step(
        self,
        plan: LSTMStepPlan,
        w: LSTMWeights,
        block: np.ndarray,
        c_next: np.ndarray,
        h_prev: np.ndarray,
        h_next: np.ndarray,
        scratch: LSTMScratch,
        pre: np.ndarray | None = None,
        unscale: np.ndarray | None = None,
        inactive: np.ndarray | None = None,
    ) -> None:
        """Finish one step from its pre-activations.

        On entry the gate rows of ``block`` (6H, N) hold ``W x_t + U h_{t-1} + b`` (halved
        rows for halved gates) plus the full peephole terms of the candidate, forget and
        input gates; its first rows hold ``c_{t-1}``. On exit the gate rows hold the
        activated gates, ``c_next`` (H, N) the new cell (it may be ``block[:H]`` itself),
        the last rows its hidden activation and ``h_next`` (H, N) the new hidden state.
        ``pre`` (4H, N), if given, receives the true pre-activations: the gate rows times
        ``unscale`` (4H, 1), 2 on halved rows and 1 elsewhere. Columns flagged in
        ``inactive`` (1, N) keep ``h_prev`` and ``c_{t-1}``.
        """
        hs = plan.hidden_size
        dtype = block.dtype
        batch = block.shape[1]
        acts = plan.activations
        peep = w.peepholes
        tmp = scratch.array("lstm_tmp", (hs, batch), dtype)
        pair = scratch.array("lstm_pair", (2 * hs, batch), dtype)
        c_prev = block[:hs]
        z = block[hs:5 * hs]
        keep = None
        if inactive is not None:
            keep = scratch.array("lstm_keep", (hs, batch), dtype)
            np.copyto(keep, c_prev)
        # Diagonal peepholes of the gates that see the previous cell.
        for gate in (CANDIDATE, FORGET, INPUT):
            p = peep.diagonal[gate]
            if p is not None:
                rows = z[gate * hs:(gate + 1) * hs]
                np.multiply(c_prev, p, out=tmp)
                np.add(rows, tmp, out=rows)
        if pre is not None:
            assert unscale is not None
            np.multiply(z[:3 * hs], unscale[:3 * hs], out=pre[:3 * hs])
        for start, stop, act, halved in plan.pre_cell_runs:
            self.lstm_activate(act, z[start:stop], halved=halved)
        # c_t = f ⊙ c_{t-1} + i ⊙ g: one product of [c_{t-1}, g] and [f, i].
        np.multiply(block[:2 * hs], block[2 * hs:4 * hs], out=pair)
        np.add(pair[:hs], pair[hs:], out=c_next)
        if keep is not None:
            np.copyto(c_next, keep, where=inactive)
        # The output gate's peephole sees the new cell.
        o = block[4 * hs:5 * hs]
        p_out = peep.diagonal[OUTPUT]
        if peep.full_output is not None:
            self._gemm(peep.full_output, c_next, out=o, beta=1.0)
        elif p_out is not None:
            np.multiply(c_next, p_out, out=tmp)
            np.add(o, tmp, out=o)
        if pre is not None:
            assert unscale is not None
            np.multiply(o, unscale[3 * hs:], out=pre[3 * hs:])
        self.lstm_activate(acts[OUTPUT], o, halved=plan.halved[OUTPUT])
        # h_t = o ⊙ act_h(c_t)
        c_act = block[5 * hs:]
        self.lstm_activate(plan.hidden_activation, c_next, out=c_act)
        np.multiply(o, c_act, out=h_next)
        if inactive is not None:
            np.copyto(h_next, h_prev, where=inactive)

    # ----------------------------------------------------------------------------------
    # The same, backward.
    # ----------------------------------------------------------------------------------
    def lstm_backward_sequence(
        self,
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
        """Backpropagate one layer and direction through time.

        Parameters
        ----------
        steps, pre
            What the training forward left (``pre`` only when the plan stores it).
        dy : (T, N, H) or None
            Gradient with respect to this direction's outputs (time-aligned).
        dh_final, dc_final : (N, H) or None
            Gradients with respect to the final states.
        dh_initial, dc_initial : (N, H)
            Receive the gradients with respect to the initial states.
        d_gates : (4H, T·N)
            Receives the gradient with respect to every true gate pre-activation, internal
            order, feature-major over all steps (column ``t·N + n``): what the all-steps
            weight and input products need.
        reverse : bool
            The direction walked the sequence backwards (so backward walks it forwards).
        active : (T, N) or None; inactive : T entries of (1, N) or None
            Which sequences run at each step (variable lengths).
        c_new : (T, H, N) or None
            Receives each step's new cell when ``plan.needs_cell``.
        """
        dtype = steps.dtype
        seq_len, six_h, batch = steps.shape
        h = six_h // 6
        four_h = 4 * h
        d_steps = scratch.array("lstm_d_steps", (seq_len, 5 * h, batch), dtype)
        dh_all = self._lstm_output_gradient(dy, active, seq_len, h, batch, dtype, scratch)
        dc = scratch.array("lstm_dc", (h, batch), dtype)  # updated in place, step by step
        dh_first = scratch.array("lstm_dh_first", (h, batch), dtype)
        times = range(seq_len) if reverse else range(seq_len - 1, -1, -1)
        step = -1 if reverse else 1  # the forward's step
        if dh_final is not None:
            np.add(dh_all[times[0]], dh_final.T, out=dh_all[times[0]])
        _copy_or_zero(dc, None if dc_final is None else dc_final.T)
        for k, t in enumerate(times):
            last = k == seq_len - 1
            dz = d_steps[t]
            self.lstm_backward_step(
                plan, w, steps[t], dh_all[t], dc, dz, scratch,
                pre=None if pre is None else pre[t], c_out=None if c_new is None else c_new[t],
                inactive=inactive[t])
            target = dh_first if last else dh_all[t - step]
            self._gemm(w.u_t, dz[:four_h], out=target, beta=0.0 if last else 1.0)
            if inactive[t] is not None:  # a sequence past its length passes dh through (its dz is 0)
                np.add(target, dh_all[t], out=target, where=inactive[t])
        np.copyto(d_gates.reshape(four_h, seq_len, batch), d_steps[:, :four_h].transpose(1, 0, 2))
        np.copyto(dh_initial, dh_first.T)
        np.copyto(dc_initial, dc.T)

    @staticmethod
    def _lstm_output_gradient(dy: np.ndarray | None, active: np.ndarray | None, seq_len: int, h: int,
                              batch: int, dtype: np.dtype, scratch: LSTMScratch) -> np.ndarray:
        """``dy`` feature-major, (T, H, N), zero where there is none or the step is past a
        sequence's length; each step's recurrent gradient is added into it in place."""
        dh_all = scratch.array("lstm_dh_all", (seq_len, h, batch), dtype)
        if dy is None:
            dh_all.fill(0.0)
        else:
            np.copyto(dh_all, dy.transpose(0, 2, 1))
            if active is not None:
                np.copyto(dh_all, 0.0, where=~active[:, None, :])
        return dh_all

    def lstm_backward_step(
        self,
        plan: LSTMStepPlan,
        w: LSTMWeights,
        block: np.ndarray,
        dh: np.ndarray,
        dc: np.ndarray,
        dz: np.ndarray,
        scratch: LSTMScratch,
        pre: np.ndarray | None = None,
        c_out: np.ndarray | None = None,
        inactive: np.ndarray | None = None,
    ) -> None:
        """Gradient of one step with respect to its gate pre-activations and previous cell.

        ``dh`` (H, N) is the gradient with respect to ``h_t`` (output and recurrent terms),
        ``dc`` (H, N) that with respect to ``c_t`` from later steps; ``block`` and ``pre``
        are what the forward step left. On exit ``dz[:4H]`` holds the gradient with respect
        to the true pre-activations (internal order; ``dz`` is (5H, N), its last rows scratch)
        and ``dc`` the one with respect to ``c_{t-1}`` (the caller then computes ``Uᵀ dz``
        for ``h_{t-1}``). When the plan needs the new cell (output peephole, or a hidden
        activation whose derivative needs its input) it is recomputed into ``c_out``.
        Columns flagged in ``inactive`` get ``dz = 0`` and pass ``dc`` through.
        """
        hs = plan.hidden_size
        dtype = block.dtype
        batch = block.shape[1]
        acts = plan.activations
        peep = w.peepholes_grad
        tmp = scratch.array("lstm_tmp", (hs, batch), dtype)
        wide = scratch.array("lstm_wide", (3 * hs, batch), dtype)
        c_prev, g, f, i = block[:hs], block[hs:2 * hs], block[2 * hs:3 * hs], block[3 * hs:4 * hs]
        o, c_act = block[4 * hs:5 * hs], block[5 * hs:]
        dz_o, d_act = dz[3 * hs:4 * hs], dz[4 * hs:]
        keep = None
        if inactive is not None:
            keep = scratch.array("lstm_keep", (hs, batch), dtype)
            np.copyto(keep, dc)
        cell = None
        if plan.needs_cell:
            cell = scratch.array("lstm_cell", (hs, batch), dtype) if c_out is None else c_out
            np.multiply(f, c_prev, out=cell)
            np.multiply(i, g, out=tmp)
            np.add(cell, tmp, out=cell)
        # h_t = o ⊙ act_h(c_t)
        np.multiply(dh, c_act, out=dz_o)
        np.multiply(dh, o, out=d_act)
        self.lstm_times_derivative(plan.hidden_activation, d_act, c_act, cell, tmp)
        np.add(dc, d_act, out=dc)
        self.lstm_times_derivative(acts[OUTPUT], dz_o, o, None if pre is None else pre[3 * hs:], tmp)
        if inactive is not None:
            np.copyto(dz_o, 0.0, where=inactive)
        if peep.full_output is not None:
            self._gemm(peep.full_output, dz_o, out=dc, trans_a=True, beta=1.0)
        elif (p_out := peep.diagonal[OUTPUT]) is not None:
            np.multiply(dz_o, p_out, out=tmp)
            np.add(dc, tmp, out=dc)
        # c_t = f ⊙ c_{t-1} + i ⊙ g: [dL/df, dL/di] = dc ⊙ [c_{t-1}, g] in one product.
        np.multiply(block[:2 * hs].reshape(2, hs, batch), dc, out=dz[hs:3 * hs].reshape(2, hs, batch))
        np.multiply(dc, i, out=dz[:hs])
        for start, stop, act, _ in plan.pre_cell_runs:
            self.lstm_times_derivative(act, dz[start:stop], block[hs + start:hs + stop],
                                       None if pre is None else pre[start:stop], wide[start:stop])
        if inactive is not None:
            np.copyto(dz[:3 * hs], 0.0, where=inactive)
        np.multiply(dc, f, out=dc)
        for gate in (CANDIDATE, FORGET, INPUT):
            p = peep.diagonal[gate]
            if p is not None:
                np.multiply(dz[gate * hs:(gate + 1) * hs], p, out=tmp)
                np.add(dc, tmp, out=dc)
        if w.full_pre_grad is not None:
            self._gemm(w.full_pre_grad, dz[:4 * hs], out=dc, trans_a=True, beta=1.0)
        if keep is not None:
            np.copyto(dc, keep, where=inactive)

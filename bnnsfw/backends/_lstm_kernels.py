"""Reference (NumPy) kernels of the LSTM layer, mixed into every backend.

:class:`bnnsfw.LSTMLayer` runs each layer and direction as: one matrix product for the
input projection of every time step, then per step one recurrent product into the step's
gate buffer and one call of :meth:`LSTMKernels.lstm_forward_step`; backward calls
:meth:`LSTMKernels.lstm_backward_step` and one recurrent product per step. The kernels here
are the fused elementwise passes of one step, written with in-place ufuncs into
preallocated buffers (no allocation in the step loop on the default-activation path).

Inside a step the layer works feature-major: a step's gates are a C-contiguous ``(4H, N)``
array and its states ``(H, N)`` (one column per sequence), so every gate is a contiguous
block of rows (``[0:H]`` input, ``[H:2H]`` forget, ``[2H:3H]`` candidate, ``[3H:4H]``
output, the public order) and every ufunc runs on contiguous memory. (The recurrent product
``U @ h`` is also faster in this orientation with OpenBLAS.)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..activation import Activation
from ..enums import ActivationFunction as AF

__all__ = ["LSTMKernels", "LSTMStepPlan", "LSTMPeepholes", "LSTMStepWork"]

#: Gate indices in the public (and internal) order.
INPUT, FORGET, CANDIDATE, OUTPUT = 0, 1, 2, 3


class LSTMStepPlan(NamedTuple):
    """What a step kernel needs to know about the cell, fixed at layer creation.

    ``activations`` are the resolved gate activations (defaults applied), ``peepholes`` the
    peephole kind of each gate (``None``, ``"full"`` or ``"diagonal"``).
    ``pre_cell_runs`` groups the input, forget and candidate gate rows into contiguous
    runs sharing one activation, so the default cell does one sigmoid call on ``[0:2H]``.
    """

    hidden_size: int
    activations: tuple[Activation, Activation, Activation, Activation]
    hidden_activation: Activation
    peepholes: tuple[str | None, str | None, str | None, str | None]
    pre_cell_runs: tuple[tuple[int, int, Activation], ...]
    store_pre: bool
    needs_cell: bool

    @classmethod
    def build(
        cls,
        hidden_size: int,
        activations: tuple[Activation, Activation, Activation, Activation],
        hidden_activation: Activation,
        peepholes: tuple[str | None, str | None, str | None, str | None],
    ) -> "LSTMStepPlan":
        h = hidden_size
        runs: list[tuple[int, int, Activation]] = []
        for gate in (INPUT, FORGET, CANDIDATE):
            act = activations[gate]
            if runs and runs[-1][2] == act:
                runs[-1] = (runs[-1][0], (gate + 1) * h, act)
            else:
                runs.append((gate * h, (gate + 1) * h, act))
        store_pre = not all(a.derivative_from_output for a in activations)
        needs_cell = peepholes[OUTPUT] is not None or not hidden_activation.derivative_from_output
        return cls(h, activations, hidden_activation, peepholes, tuple(runs), store_pre, needs_cell)


class LSTMPeepholes(NamedTuple):
    """The peephole weights of one layer and direction, as the kernels use them.

    ``diagonal[k]`` is the ``(H, 1)`` column of gate ``k`` (or ``None``); ``full_output``
    the ``(H, H)`` matrix of the output gate (or ``None``). Full peepholes of the other
    gates are one product done by the layer before the step kernel.
    """

    diagonal: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None]
    full_output: np.ndarray | None


class LSTMStepWork(NamedTuple):
    """Scratch buffers of the step kernels, allocated once per call: ``a``, ``b``, ``keep``
    and ``cell`` are ``(H, N)``, ``wide`` is ``(4H, N)``; all C-contiguous."""

    a: np.ndarray
    b: np.ndarray
    keep: np.ndarray
    cell: np.ndarray
    wide: np.ndarray

    @classmethod
    def allocate(cls, n: int, hidden_size: int, dtype: np.dtype) -> "LSTMStepWork":
        def state() -> np.ndarray:
            return np.empty((hidden_size, n), dtype)

        return cls(state(), state(), state(), state(), np.empty((4 * hidden_size, n), dtype))


class LSTMKernels:
    """Fused per-step passes of :class:`bnnsfw.LSTMLayer`.

    A backend may override any of these; each writes only into the buffers it is given.
    """

    # Activations in place, and their derivatives multiplied into a gradient.
    def lstm_activate(self, act: Activation, block: np.ndarray, out: np.ndarray | None = None) -> None:
        """``out = act(block)`` (in place when ``out`` is omitted); sigmoid as
        ``0.5·tanh(0.5·x) + 0.5``: stable, no exp, no overflow warnings."""
        function = act.function
        if out is None:
            out = block
        if function is AF.sigmoid:
            np.multiply(block, 0.5, out=out)
            np.tanh(out, out=out)
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

    # One time step, forward.
    def lstm_forward_step(
        self,
        plan: LSTMStepPlan,
        peepholes: LSTMPeepholes,
        z: np.ndarray,
        h_prev: np.ndarray,
        c_prev: np.ndarray,
        h: np.ndarray,
        c: np.ndarray,
        c_act: np.ndarray,
        work: LSTMStepWork,
        pre: np.ndarray | None = None,
        inactive: np.ndarray | None = None,
    ) -> None:
        """Finish one step from the gate pre-activations ``z``.

        On entry ``z`` (4H, N) holds ``W x_t + U h_{t-1} + b`` plus any full peephole terms
        of the input, forget and candidate gates. On exit ``z`` holds the activated gates,
        ``c`` (H, N) the new cell, ``c_act`` the hidden activation of it and ``h`` the new
        hidden state; ``pre`` (if given) receives every gate's pre-activation. Columns
        flagged in ``inactive`` (1, N) keep ``h_prev`` and ``c_prev``.
        """
        hs = plan.hidden_size
        acts = plan.activations
        tmp = work.a
        # Diagonal peepholes of the gates that see the previous cell.
        for gate in (INPUT, FORGET, CANDIDATE):
            p = peepholes.diagonal[gate]
            if p is not None:
                block = z[gate * hs:(gate + 1) * hs]
                np.multiply(c_prev, p, out=tmp)
                np.add(block, tmp, out=block)
        if pre is not None:
            np.copyto(pre[:3 * hs], z[:3 * hs])
        for start, stop, act in plan.pre_cell_runs:
            self.lstm_activate(act, z[start:stop])
        i = z[:hs]
        f = z[hs:2 * hs]
        g = z[2 * hs:3 * hs]
        o = z[3 * hs:]
        # c_t = f ⊙ c_{t-1} + i ⊙ g
        np.multiply(f, c_prev, out=c)
        np.multiply(i, g, out=tmp)
        np.add(c, tmp, out=c)
        # The output gate's peephole sees the new cell.
        p_out = peepholes.diagonal[OUTPUT]
        if peepholes.full_output is not None:
            self.gemm(peepholes.full_output, c, out=o, beta=1.0)  # type: ignore[attr-defined]
        elif p_out is not None:
            np.multiply(c, p_out, out=tmp)
            np.add(o, tmp, out=o)
        if pre is not None:
            np.copyto(pre[3 * hs:], o)
        self.lstm_activate(acts[OUTPUT], o)
        # h_t = o ⊙ act_h(c_t)
        self.lstm_activate(plan.hidden_activation, c, out=c_act)
        np.multiply(o, c_act, out=h)
        if inactive is not None:
            np.copyto(h, h_prev, where=inactive)
            np.copyto(c, c_prev, where=inactive)

    # The same step, backward.
    def lstm_backward_step(
        self,
        plan: LSTMStepPlan,
        peepholes: LSTMPeepholes,
        full_pre: np.ndarray | None,
        dh: np.ndarray,
        dc: np.ndarray,
        gates: np.ndarray,
        c_prev: np.ndarray,
        c_act: np.ndarray,
        dz: np.ndarray,
        work: LSTMStepWork,
        pre: np.ndarray | None = None,
        c_out: np.ndarray | None = None,
        inactive: np.ndarray | None = None,
    ) -> None:
        """Gradient of one step with respect to its gate pre-activations and previous cell.

        ``dh`` (H, N) is the gradient with respect to ``h_t`` (output and recurrent terms),
        ``dc`` (H, N) that with respect to ``c_t`` from later steps; on exit ``dz`` (4H, N)
        holds the gradient with respect to the pre-activations and ``dc`` that with respect
        to ``c_{t-1}`` (the layer then computes ``Uᵀ dz`` for ``h_{t-1}``). ``gates``,
        ``c_prev``, ``c_act`` and ``pre`` are what the forward step left. When the plan needs
        the new cell (output peephole, or a hidden activation whose derivative needs its
        input) it is recomputed into ``c_out``. ``full_pre`` is the stacked ``(4H, H)`` full
        peephole matrix of the input, forget and candidate gates (zero rows elsewhere) or
        ``None``. Columns flagged in ``inactive`` get ``dz = 0`` and pass ``dc`` through.
        """
        hs = plan.hidden_size
        acts = plan.activations
        a, b, wide = work.a, work.b, work.wide
        i = gates[:hs]
        f = gates[hs:2 * hs]
        g = gates[2 * hs:3 * hs]
        o = gates[3 * hs:]
        dzo = dz[3 * hs:]
        if inactive is not None:
            np.copyto(work.keep, dc)
        cell = None
        if plan.needs_cell:
            cell = work.cell if c_out is None else c_out
            np.multiply(f, c_prev, out=cell)
            np.multiply(i, g, out=b)
            np.add(cell, b, out=cell)
        # h_t = o ⊙ act_h(c_t)
        np.multiply(dh, c_act, out=dzo)
        np.multiply(dh, o, out=a)
        self.lstm_times_derivative(plan.hidden_activation, a, c_act, cell, b)
        np.add(dc, a, out=dc)
        self.lstm_times_derivative(acts[OUTPUT], dzo, o, None if pre is None else pre[3 * hs:], b)
        if inactive is not None:
            np.copyto(dzo, 0.0, where=inactive)
        p_out = peepholes.diagonal[OUTPUT]
        if peepholes.full_output is not None:
            gemm = self.gemm  # type: ignore[attr-defined]
            gemm(peepholes.full_output, dzo, out=dc, trans_a=True, beta=1.0)
        elif p_out is not None:
            np.multiply(dzo, p_out, out=a)
            np.add(dc, a, out=dc)
        # c_t = f ⊙ c_{t-1} + i ⊙ g
        np.multiply(dc, g, out=dz[:hs])
        np.multiply(dc, c_prev, out=dz[hs:2 * hs])
        np.multiply(dc, i, out=dz[2 * hs:3 * hs])
        for start, stop, act in plan.pre_cell_runs:
            self.lstm_times_derivative(act, dz[start:stop], gates[start:stop],
                                       None if pre is None else pre[start:stop], wide[start:stop])
        if inactive is not None:
            np.copyto(dz[:3 * hs], 0.0, where=inactive)
        np.multiply(dc, f, out=dc)
        for gate in (INPUT, FORGET, CANDIDATE):
            p = peepholes.diagonal[gate]
            if p is not None:
                np.multiply(dz[gate * hs:(gate + 1) * hs], p, out=a)
                np.add(dc, a, out=dc)
        if full_pre is not None:
            self.gemm(full_pre, dz, out=dc, trans_a=True, beta=1.0)  # type: ignore[attr-defined]
        if inactive is not None:
            np.copyto(dc, work.keep, where=inactive)

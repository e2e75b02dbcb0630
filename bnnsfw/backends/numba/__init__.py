"""A backend with compiled (Numba) kernels, on top of the ``scipy-blas`` backend.

It runs each layer and direction of the LSTM as compiled loops (:mod:`._lstm`, which picks the
path and calls :mod:`._lstm_forward` and :mod:`._lstm_backward`: per step one product and one
fused, vectorized pass, forward and backward, or for larger steps one parallel region per chunk
of steps, whose threads each take a run of units of every step; the input projection and the
weight gradients one product per chunk of steps) for the cell almost
every model uses, with no, diagonal or full peepholes, over full or variable lengths, in float32
(float64 runs as ``scipy-blas`` runs it: :data:`COMPILED_DTYPE`); the cells
with other per-element activations as compiled per-sequence loops of their own
(:mod:`._cells`); and normalization with the statistics of the batch and the identity
activation with compiled, multithreaded row kernels (:mod:`._normalization`; statistics sets
too large for their arithmetic go to the reference kernels it inherits). Every other request
goes to what ``scipy-blas`` does with it. Which implementation serves a request is decided in
the section "Which implementation serves a request" below, and nowhere else.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence, TypeVar

import attrs
import numpy as np

from . import _cache, _cells, _lstm, _normalization, _tiers
from .._shared.lstm_kernels import LSTMStepPlan, LSTMWeights
from .._shared.lstm_stack import (BackwardKernel, CacheViews, DirectionKernels, ForwardKernel,
                                  PreparedForward, _Packed, scatter_gradients)
from ..contract import (
    LSTMBackwardRequest,
    LSTMBackwardResult,
    LSTMForwardCall,
    LSTMForwardRequest,
    LSTMForwardResult,
    LSTMGateArrays,
    LSTMPackedWeights,
    LSTMPackRequest,
    NormalizationBackwardRequest,
    NormalizationBackwardResult,
    NormalizationForwardRequest,
    NormalizationForwardResult,
    Workspace,
)
from ..scipy_blas import ScipyBlasBackend

__all__ = ["NumbaBackend", "COMPILED_DTYPE", "CompileStatus", "compile_mode", "set_compile_mode"]

# Every kernel is defined by now (the modules above import the others): their saves to the disk
# cache hold a lock of the cache folder, so processes compiling at once keep each other's entries.
_cache.lock_saves()

compile_mode = _tiers.compile_mode
set_compile_mode = _tiers.set_compile_mode
CompileStatus = _tiers.CompileStatus

_Request = TypeVar("_Request", LSTMForwardRequest, LSTMBackwardRequest)
_Result = TypeVar("_Result", LSTMForwardResult, LSTMBackwardResult)

#: The one dtype the compiled kernels serve. float64 serves checks (gradient checks against
#: finite differences, golden values), and ``scipy-blas``'s kernels run it about as fast:
#: float64 calls took 0.52-1.01 times as long there as in compiled kernels of their own on the
#: bench's shapes (S, S4, demo, M, L; forward and training), S's training step 1.21 times,
#: while compiling those kernels took 40 % of the compiled kernels' CPU time in the suite.
COMPILED_DTYPE = np.dtype(np.float32)


def _compiles(config: Any, payload: Any) -> bool:
    """Whether compiled kernels serve this LSTM configuration and packed cell: float32, and a
    cell that :func:`._lstm.serves` or :func:`._cells.serves` names."""
    return (np.dtype(config.dtype) == COMPILED_DTYPE and isinstance(payload, _Packed)
            and (_lstm.serves(payload.plan) or _cells.serves(payload.plan)))


def _compiled_forward(plan: LSTMStepPlan, w: LSTMWeights, layer_input: np.ndarray, h0: np.ndarray | None,
                      c0: np.ndarray | None, steps: np.ndarray, pre: np.ndarray | None,
                      hidden: np.ndarray | None,
                      output: np.ndarray, h_final: np.ndarray, c_final: np.ndarray, *, reverse: bool,
                      lengths: np.ndarray | None, inactive: Sequence[np.ndarray | None],
                      workspace: Workspace, parts: int = 1) -> None:
    """One layer and direction forward, compiled (``DirectionKernels.forward``); ``parts``
    threads share out each step's units when it is above 1."""
    _lstm.forward(w, layer_input, h0, c0, lengths, steps, hidden, output, h_final, c_final,
                  reverse=reverse, scratch=workspace, parts=parts)


def _backward_keywords(plan: LSTMStepPlan, w: LSTMWeights, layer: int, d: int, layer_input: np.ndarray,
                       views: CacheViews, dy: np.ndarray | None, dh_final: np.ndarray | None,
                       dc_final: np.ndarray | None, dh_initial: np.ndarray, dc_initial: np.ndarray,
                       d_input: np.ndarray, gates: Sequence[LSTMGateArrays], *, lengths: np.ndarray | None,
                       active: np.ndarray | None, inactive: Sequence[np.ndarray | None],
                       workspace: Workspace) -> dict:
    """The arguments of a ``DirectionKernels.backward`` call as :func:`._lstm.backward`
    takes them, without ``reverse`` and ``parts``."""
    hidden = views.hidden[layer][d]
    assert hidden is not None  # a training cache keeps the states
    return dict(w=w, x2=layer_input, lengths=lengths, steps=views.steps[layer][d], hidden=hidden, dy=dy,
                dh_final=dh_final, dc_final=dc_final, dh_initial=dh_initial, dc_initial=dc_initial,
                d_input=d_input, accumulate_input=d > 0, scratch=workspace)


def _scatter(plan: LSTMStepPlan, layer: int, d: int, stacked: tuple, gates: Sequence[LSTMGateArrays]) -> None:
    """The stacked weight gradients :func:`._lstm.backward` returns, into the public
    per-gate arrays."""
    d_wx, d_u, d_bias, d_diagonal, d_full_pre, d_full_out = stacked
    h = plan.hidden_size
    d_peep: list[np.ndarray | None] = [None] * 4
    for k, kind in enumerate(plan.peepholes):  # internal order; the output gate's full one on its own
        if kind == "diagonal" and d_diagonal is not None:
            d_peep[k] = d_diagonal[k]
        elif kind == "full" and k < 3 and d_full_pre is not None:
            d_peep[k] = d_full_pre[k * h:(k + 1) * h]
        elif kind == "full":
            d_peep[k] = d_full_out
    scatter_gradients(layer, d, d_wx, d_u, d_bias, d_peep, gates)


def _compiled_backward(plan: LSTMStepPlan, w: LSTMWeights, layer: int, d: int, layer_input: np.ndarray,
                       views: CacheViews, dy: np.ndarray | None, dh_final: np.ndarray | None,
                       dc_final: np.ndarray | None, dh_initial: np.ndarray, dc_initial: np.ndarray,
                       d_input: np.ndarray, gates: Sequence[LSTMGateArrays], *, lengths: np.ndarray | None,
                       active: np.ndarray | None, inactive: Sequence[np.ndarray | None],
                       workspace: Workspace, parts: int = 1) -> None:
    """One layer and direction backward, compiled, weight gradients included
    (``DirectionKernels.backward``); ``parts`` threads share out each step and each product
    when it is above 1."""
    stacked = _lstm.backward(
        **_backward_keywords(plan, w, layer, d, layer_input, views, dy, dh_final, dc_final, dh_initial,
                             dc_initial, d_input, gates, lengths=lengths, active=active, inactive=inactive,
                             workspace=workspace), reverse=d == 1, parts=parts)
    _scatter(plan, layer, d, stacked, gates)


@functools.cache
def _compiled_kernels(parts: int) -> DirectionKernels:
    """The compiled kernels with ``parts`` threads for each step's units
    (:meth:`NumbaBackend._lstm_direction_kernels` says when). Made once for each choice: a
    call of a small layer asks for them twice."""
    return DirectionKernels(functools.partial(_compiled_forward, parts=parts),
                            functools.partial(_compiled_backward, parts=parts))


#: The fields of each request whose arrays, a caller's, the compiled kernels only read.
_READ_FIELDS = {"lstm_forward": ("x", "hidden", "cell", "sequence_lengths"),
                "lstm_backward": ("x", "cache", "output_gradient", "hidden_gradient", "cell_gradient",
                                  "sequence_lengths"),
                "normalization_forward": ("x", "gamma", "beta"),
                "normalization_backward": ("x", "dy", "gamma")}
_Read = TypeVar("_Read", LSTMForwardRequest, LSTMBackwardRequest, NormalizationForwardRequest,
                NormalizationBackwardRequest)
_Norm = TypeVar("_Norm", NormalizationForwardRequest, NormalizationBackwardRequest)


def _writable(a: np.ndarray) -> np.ndarray:
    """``a``, or a writable copy of it when it is read-only. Numba compiles a kernel once per
    read-only flag of each of its array arguments: a read-only input (a memory-mapped file
    opened for reading, an array over ``bytes``) compiled the LSTM's forward and backward
    families, or normalization's passes, a second time (the demo's model's first training
    step: 36.7 s of CPU from cold for writable ``x`` and ``dy``, then 27.2 s more for
    read-only ones). The copy costs one pass over that input."""
    return a if a.flags.writeable else a.copy(order="K")


def _writable_inputs(operation: str, request: _Read) -> _Read:
    """``request`` with each array the kernels only read :func:`_writable`."""
    given = {name: getattr(request, name) for name in _READ_FIELDS[operation]}
    copies: dict[str, Any] = {name: _writable(a) for name, a in given.items()
                              if a is not None and not a.flags.writeable}
    return attrs.evolve(request, **copies) if copies else request


class _TieredForward:
    """``lstm_forward`` prepared for one kind of request (``lstm_prepare_forward``), compiled or
    not as :class:`._tiers.Tiers` decides: one :class:`PreparedForward` for each tier, each
    with the kernels that tier runs. The tiers are asked at each call until they say
    compiled (then that kind's kernels are ready for good and nothing is asked again); in the
    modes that compile in the process the first call compiles them for good and no request
    is made at all."""

    def __init__(self, backend: NumbaBackend, request: LSTMForwardRequest,
                 stack: _lstm.StackInference | None) -> None:
        self._backend = backend
        self._config, self._weights = request.config, request.weights
        lengths = request.sequence_lengths  # values, part of the kind: kept as a copy
        self._lengths = None if lengths is None else np.array(lengths)
        self._training = request.training
        self._threads = request.threads
        self._prepared: dict[bool, PreparedForward] = {}
        for compiled in (True, False):
            with _tiers.compiled_as(compiled):
                self._prepared[compiled] = backend._prepared_forward(request)
        self._ready_for: _tiers.Tiers | None = None  # the tiers that said compiled for good
        self._stack = stack  # (_stack_inference)

    def _decide(self, x: np.ndarray, hidden: np.ndarray | None, cell: np.ndarray | None, output: np.ndarray,
                hidden_out: np.ndarray, cell_out: np.ndarray, cache: np.ndarray | None,
                dropout_masks: tuple[np.ndarray | None, ...] | None, workspace: Workspace) -> bool:
        """The tiers' decision for this call, remembered once it is compiled for good."""
        tiers = self._backend._tiers
        request = LSTMForwardRequest(
            config=self._config, weights=self._weights, x=x, hidden=hidden, cell=cell,
            sequence_lengths=self._lengths, output=output, hidden_out=hidden_out, cell_out=cell_out,
            training=self._training, cache=cache, dropout_masks=dropout_masks, workspace=workspace,
            threads=self._threads)
        if tiers.decide("lstm_forward", request):
            self._ready_for = tiers
            return True
        return False

    def __call__(self, x: np.ndarray, hidden: np.ndarray | None, cell: np.ndarray | None, output: np.ndarray,
                 hidden_out: np.ndarray, cell_out: np.ndarray, cache: np.ndarray | None,
                 dropout_masks: tuple[np.ndarray | None, ...] | None, workspace: Workspace) -> None:
        tiers = self._backend._tiers
        compiled = self._ready_for is tiers
        if not compiled and tiers.compiles_in_process():  # this call compiles them, for good
            compiled, self._ready_for = True, tiers
        x = _writable(x)  # as _writable_inputs
        hidden = None if hidden is None else _writable(hidden)
        cell = None if cell is None else _writable(cell)
        arrays = (x, hidden, cell, output, hidden_out, cell_out, cache, dropout_masks, workspace)
        compiled = compiled or self._decide(*arrays)
        if compiled and self._stack is not None:
            self._stack(x, hidden, cell, output, hidden_out, cell_out, None, None, workspace)
            return
        prepared = self._prepared[compiled]
        if compiled and prepared.kernels_fixed:
            prepared(*arrays)
            return
        with tiers.running(compiled):  # the kernels are chosen in the call, in its tier
            prepared(*arrays)


def _stack_inference(backend: NumbaBackend, request: LSTMForwardRequest) -> _lstm.StackInference | None:
    """The compiled forward of ``request``'s kind without the stack's layers of calls
    (:class:`._lstm.StackInference`), for an inference of full-length sequences through one
    direction of any number of layers of the cells :func:`._lstm.serves` names whose steps
    :meth:`NumbaBackend._lstm_direction_kernels` keeps on the calling thread for every call of
    the kind (no layer output to mask then) and whose layers do not walk groups of the
    sequences on threads instead (:func:`._lstm.group_parts`); None for every other kind."""
    config, payload = request.config, request.weights.payload
    if (request.training or request.sequence_lengths is not None or config.num_directions != 1
            or not isinstance(payload, _Packed) or not _lstm.serves(payload.plan)):
        return None
    seq_len, batch = request.x.shape[:2]
    dtype = np.dtype(config.dtype)
    if not backend._lstm_kernels_fixed(payload.plan, batch):
        return None
    with _tiers.compiled_as(True):
        if backend._lstm_direction_kernels(payload.plan, None, batch, dtype) is not _compiled_kernels(1):
            return None
    h = config.hidden_size
    inputs = {config.input_size, h} if config.num_layers > 1 else {config.input_size}
    if any(_lstm.group_parts(seq_len, batch, h, size_i, dtype) > 1 for size_i in inputs):
        return None  # its layers walk groups of the sequences on threads (in the stack's calls)
    return _lstm.StackInference([row[0] for row in payload.weights], seq_len, batch, config.input_size,
                                config.hidden_size, dtype)


class NumbaBackend(ScipyBlasBackend):
    """Compiled LSTM time loops and normalization row kernels; ``scipy-blas`` for the rest."""

    name = "numba"
    #: The dtype its compiled kernels serve (:data:`COMPILED_DTYPE`).
    compiled_dtype = COMPILED_DTYPE

    def __init__(self) -> None:
        super().__init__()
        self._tiers = _tiers.Tiers()

    # ----------------------------------------------------------------------------------
    # Which implementation serves a request: decided here and nowhere else.
    # ----------------------------------------------------------------------------------
    def _lstm_direction_kernels(self, plan: LSTMStepPlan, lengths: np.ndarray | None, batch: int,
                                dtype: np.dtype | None = None) -> DirectionKernels:
        """The compiled kernels for the cells :func:`._lstm.serves` names (the default
        activations, any peepholes, any lengths) in float32 (:data:`COMPILED_DTYPE`);
        otherwise the per-sequence kernels of :meth:`_lstm_sequence_kernels`, with the weight
        gradients made from their gate gradients (in float64 ``scipy-blas``'s). Full peepholes
        keep the steps on the calling thread: their products need every unit's cell, and so
        does a process forked from one running Numba's GNU OpenMP threads, which cannot start
        a parallel region: no threads are in force there (:func:`._lstm.step_parts`,
        :func:`._tiers.forked_from_openmp`).

        The two directions of a bidirectional layer run one after the other, each step's units
        shared out: the two directions at the same time, each on one of two threads, took
        M-2L-bi's shape (T 50, N 16, I = H = 128, two layers, float32) 1.08-1.09 times as long
        forward and 0.94-1.03 times as long a training step (the rounds' medians of three runs,
        alternated in one process, on 2 vCPUs of a Zen 4 EPYC).

        The layers of a stack run one after the other: two layers at the same time, the upper
        following the lower step by step on a second thread, took the demo's model (T 32, N 32,
        H 32, two layers, float32) 1.06-1.07 times as long forward and 1.17-1.34 times as long
        a training step (blocks alternated in one process, two runs, on 2 vCPUs of a Zen 4
        EPYC), and their kernels took about 32 s of the 82 s its first training step compiled."""
        compiled = _tiers.compiled_now() and dtype == COMPILED_DTYPE
        if compiled and _lstm.serves(plan):
            full = "full" in plan.peepholes  # full peepholes: their products need every unit each step
            parts = 1 if full else _lstm.step_parts(plan.hidden_size, batch)
            return _compiled_kernels(parts)
        with _tiers.compiled_as(compiled):  # read by _lstm_sequence_kernels
            return super()._lstm_direction_kernels(plan, lengths, batch, dtype)

    def _lstm_sequence_kernels(self, plan: LSTMStepPlan, lengths: np.ndarray | None,
                               batch: int) -> tuple[ForwardKernel, BackwardKernel]:
        """For the cells :func:`._lstm.serves` leaves (other activations), the compiled
        per-sequence kernels of :mod:`._cells` (any per-element activations, any
        peepholes, any lengths); the weight gradients are then made as for every per-sequence
        kernel."""
        if _cells.serves(plan) and _tiers.compiled_now():
            return _cells.forward_sequence, _cells.backward_sequence
        return super()._lstm_sequence_kernels(plan, lengths, batch)

    def compile_status(self) -> _tiers.CompileStatus:
        """Where the compiled kernels are, how many kinds of call have them ready, for which CPU,
        and whether a background compile is under way (``docs/performance.md``)."""
        return self._tiers.status()

    def lstm_forward(self, request: LSTMForwardRequest) -> LSTMForwardResult:
        """Compiled when :class:`._tiers.Tiers` says so for this kind of call, else as
        ``scipy-blas`` runs it (the same training cache either way)."""
        return self._lstm_call("lstm_forward", super().lstm_forward, request)

    def lstm_backward(self, request: LSTMBackwardRequest) -> LSTMBackwardResult:
        """Compiled when :class:`._tiers.Tiers` says so for this kind of call, else as
        ``scipy-blas`` runs it."""
        return self._lstm_call("lstm_backward", super().lstm_backward, request)

    def _lstm_call(self, operation: str, run: Callable[[_Request], _Result], request: _Request) -> _Result:
        """``run(request)`` with the compiled kernels allowed or not (:func:`._tiers.compiled_now`,
        which :meth:`_lstm_direction_kernels` and :meth:`_lstm_sequence_kernels` read), as the
        tiers decide for a call the compiled kernels would serve."""
        if not _compiles(request.config, request.weights.payload):
            return run(request)
        request = _writable_inputs(operation, request)
        with self._tiers.serving(operation, request):
            return run(request)

    def lstm_prepare_forward(self, request: LSTMForwardRequest) -> LSTMForwardCall | None:
        """For the cells the compiled kernels serve, a forward that asks the tiers only until
        its kind runs compiled for good (:class:`_TieredForward`), or, for a kind that already
        does and that :class:`._lstm.StackInference` serves with its inputs as they come
        (writable), that forward itself; ``scipy-blas``'s otherwise."""
        if not _compiles(request.config, request.weights.payload):
            return super().lstm_prepare_forward(request)
        stack = _stack_inference(self, request)
        writable = all(a is None or a.flags.writeable for a in (request.x, request.hidden, request.cell))
        if stack is not None and writable and self._tiers.decide("lstm_forward", request):
            return stack  # compiled for good already: the stack's kernels without the tiers' call around
        return _TieredForward(self, request, stack)

    def _lstm_kernels_fixed(self, plan: LSTMStepPlan, batch: int) -> bool:
        """The compiled kernels share large steps out over the threads in force
        (:func:`._lstm.step_parts`): those are chosen at each call."""
        return not _lstm.threads_matter(plan.hidden_size, batch)

    def lstm_pack_weights(self, request: LSTMPackRequest) -> LSTMPackedWeights:
        """``scipy-blas``'s packing; for the cells the compiled kernels serve, with ``U`` and
        ``Uᵀ`` once more in the wider rows those kernels read (:func:`._lstm.wide_rows`),
        made once per packing instead of at every call, ``W`` as rows (the backward's input
        gradient reads them, :func:`._lstm_backward._tile_input_gradient`), and a place for the rows
        of ``[U W]`` packed for the steps shared out over threads
        (:func:`._lstm._step_tiles`, made when first needed) and for the forward's arguments
        taken from the weights (:func:`._lstm._forward_weights`)."""
        packed = super().lstm_pack_weights(request)
        payload = packed.payload
        if not (_compiles(request.config, payload) and _lstm.serves(payload.plan)):
            return packed
        weights = [[w._replace(u_wide=_lstm.wide_rows(w.u), u_t_wide=_lstm.wide_rows(w.u_t),
                               wx_rows=np.ascontiguousarray(w.wx_t.T), step_tiles={},
                               forward_args={}) for w in row]
                   for row in payload.weights]
        return LSTMPackedWeights(config=packed.config, version=packed.version,
                                 payload=_Packed(payload.plan, weights))

    def _compiled_normalization(self, operation: str, request: _Norm) -> _Norm | None:
        """``request`` with its read-only inputs copied (:func:`_writable_inputs`) when the
        compiled kernels serve it: float32, the statistics of the batch, the identity
        activation, not RMS normalization, not a forked process, and the tiers say so for this
        kind of call; None when ``scipy-blas``'s kernels serve it (with its inputs as given)."""
        if not (request.centered and request.x.dtype == COMPILED_DTYPE
                and _normalization.serves(request.x, request.activation.is_identity, request.mean is not None)
                and not _tiers.forked_from_openmp()):
            return None
        request = _writable_inputs(operation, request)
        return request if self._tiers.decide(operation, request) else None

    def normalization_forward(self, request: NormalizationForwardRequest) -> NormalizationForwardResult:
        """Compiled for float32 with the statistics of the batch and the identity activation (not
        for RMS normalization), when :class:`._tiers.Tiers` says so for this kind of call, except in a
        process forked from one running GNU OpenMP threads (every compiled normalization kernel
        is a parallel region: :func:`._tiers.forked_from_openmp`)."""
        r = self._compiled_normalization("normalization_forward", request)
        if r is None:
            return super().normalization_forward(request)
        def redo(sets: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return self.normalization_forward_sets(r.x, r.gamma, r.beta, epsilon=r.epsilon,
                                                   batch_statistics=r.batch_statistics,
                                                   activation=r.activation, out=target, sets=sets)

        out, mean, variance = _normalization.forward(
            r.x, r.gamma, r.beta, epsilon=r.epsilon, batch_statistics=r.batch_statistics, out=r.out,
            threads=r.threads, redo=redo)
        return NormalizationForwardResult(output=out, mean=mean, variance=variance)

    def normalization_backward(self, request: NormalizationBackwardRequest) -> NormalizationBackwardResult:
        """Compiled for float32 with the statistics of the batch and the identity activation (not
        for RMS normalization), when :class:`._tiers.Tiers` says so for this kind of call, except in a
        forked process as :meth:`normalization_forward` says."""
        r = self._compiled_normalization("normalization_backward", request)
        if r is None:
            return super().normalization_backward(request)
        def redo(sets: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return self.normalization_backward_sets(
                r.x, r.dy, r.gamma, r.beta, epsilon=r.epsilon, batch_statistics=r.batch_statistics,
                activation=r.activation, output=r.output, out=target, sets=sets)

        dx, d_gamma, d_beta = _normalization.backward(
            r.x, r.dy, r.gamma, epsilon=r.epsilon, batch_statistics=r.batch_statistics, out=r.out,
            threads=r.threads, redo=redo)
        return NormalizationBackwardResult(input=dx, gamma=d_gamma, beta=d_beta)

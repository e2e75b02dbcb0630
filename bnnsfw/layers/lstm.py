"""The LSTM layer: stacked, bidirectional, peepholes, variable lengths, forward and backward.

Re-creates BNNS ``BNNSDirectApplyLSTMBatchTrainingCaching``,
``BNNSDirectApplyLSTMBatchBackward`` and ``BNNSComputeLSTMTrainingCacheCapacity`` as a
layer object. The math, shapes and every decision are in ``docs/lstm.md``; in short, for one
layer and direction at step t (gates in the order input, forget, candidate, output)::

    i = act_i(W_i x + U_i h + P_i c + b_i)      f = act_f(…)      g = act_g(…)
    c' = f ⊙ c + i ⊙ g
    o = act_o(W_o x + U_o h + P_o c' + b_o)     h' = o ⊙ act_h(c')

The object API also offers the variants of SPEC §4.1 (``docs/lstm.md``): ONNX ``clip``,
TensorFlow's ``cell_clip`` and ``projection_clip``, ``input_forget``, a reverse-only
direction, per-direction activations (:class:`LSTMActivations`), a projection
(``projection_size``, PyTorch's ``proj_size``), and the layer-normalized cell
(:class:`LSTMLayerNorm`).

How it runs: the layer validates, keeps the parameters and the training-cache frame, and
hands each call to its backend through the contract (:mod:`bnnsfw.backends.contract`):
``lstm_pack_weights`` once (again only when client-pointer weights change),
``lstm_forward`` for the whole stack (or the forward the backend prepared for that kind of
call, ``lstm_prepare_forward``), and ``lstm_backward``, which returns the input, state and
weight gradients. How the built-in backends compute is in ``docs/lstm.md``.

This module is the layer. Its pieces sit beside it: the parameter objects and their
validation (``_lstm_parameters.py``), the weight arrays in order and by name
(``_lstm_weights.py``), the results of ``apply`` and ``apply_backward`` (``_lstm_results.py``),
the training cache's frame (``_lstm_cache.py``), the layer's scratch memory
(``_lstm_workspace.py``), the prepared forwards it keeps (``_lstm_prepared.py``) and the
stepper of :meth:`LSTMLayer.stream` (``_lstm_stream.py``); every public name is importable
from here.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import warnings
from typing import Any, Iterator, NamedTuple, cast

import numpy as np

from .._named import read_only
from .._validation import as_input, describe, overlap, positive_int
from ..backends.contract import (
    LSTMForwardCall,
    LSTMBackwardRequest,
    LSTMCacheRequest,
    LSTMConfig,
    LSTMForwardRequest,
    LSTMGradientBuffers,
    LSTMPackedWeights,
    LSTMPackRequest,
)
from ..errors import InvalidParameterError, ShapeError, must_be
from ..filter import Filter, FilterParameters, guarded
from ._lstm_cache import (
    HEADER_BYTES,
    CacheHeader,
    CacheIdentity,
    as_byte_buffer,
    clear_header,
    digest,
    next_generation,
    read_header,
    write_header,
)
from ._lstm_prepared import CheckedKinds, PreparedForwards, array_kind, inference_kind
from ._lstm_parameters import (
    _LAYER_NORM_FIELDS,
    GATE_FIELDS,
    LSTMActivations,
    LSTMGateDescriptor,
    LSTMLayerNorm,
    LSTMParameters,
)
from ._lstm_results import LSTMGateGradients, LSTMGradients, LSTMLayerNormGradients, LSTMOutput
from ._lstm_stream import LSTMStream
from ._lstm_weights import (
    DIRECTION_NAMES,
    _copied,
    _named_layer_arrays,
    _packing_copy,
    _parameter_arrays,
    _WatchedBits,
    _WeightsWatch,
    _with_arrays,
)
from ._lstm_workspace import _Workspace

__all__ = [
    "GATE_FIELDS",
    "DIRECTION_NAMES",
    "LSTMGateDescriptor",
    "LSTMActivations",
    "LSTMLayerNorm",
    "LSTMParameters",
    "LSTMLayer",
    "LSTMStream",
    "LSTMOutput",
    "LSTMGateGradients",
    "LSTMLayerNormGradients",
    "LSTMGradients",
]


class _CacheSize(NamedTuple):
    payload: int
    format: str

    @property
    def nbytes(self) -> int:
        return HEADER_BYTES + self.payload


def _configuration(p: LSTMParameters) -> LSTMConfig:
    """The backend's view of the parameters (the contract's ``LSTMConfig``)."""
    sets = [p.activations(d) for d in range(p.num_directions)]
    differ = any(a != sets[0] for a in sets[1:])
    norm = p.layer_norm
    return LSTMConfig(
        input_size=p.input_size, hidden_size=p.hidden_size, num_layers=p.num_layers,
        num_directions=p.num_directions, dtype=p.dtype, gate_activations=sets[0].gates,
        hidden_activation=sets[0].hidden_activation,
        peepholes=(p.input_gate.peephole, p.forget_gate.peephole, p.candidate_gate.peephole,
                   p.output_gate.peephole),
        dropout=p.dropout if p.num_layers > 1 else 0.0,
        reverse=p.reverse,
        direction_activations=tuple((*a.gates, a.hidden_activation) for a in sets) if differ else None,
        clip=p.clip, cell_clip=p.cell_clip, projection_clip=p.projection_clip, input_forget=p.input_forget,
        projection_size=p.projection_size, layer_norm=norm is not None,
        layer_norm_epsilon=1e-5 if norm is None else norm.epsilon,
    )


class _CheckedInference:
    """What the checks of ``apply`` found for one kind of arguments: how ``x`` and the states
    are seen time-major with a batch axis, and the shapes of the results (kept per kind of
    inference call in :class:`~._lstm_prepared.CheckedKinds`); once known, the backend's
    forward prepared for the kind."""

    __slots__ = ("unbatched", "batch_first", "output", "hidden", "cell", "prepared")

    def __init__(self, *, unbatched: bool, batch_first: bool, output: tuple[int, ...],
                 hidden: tuple[int, ...], cell: tuple[int, ...]) -> None:
        self.unbatched, self.batch_first = unbatched, batch_first
        self.output, self.hidden, self.cell = output, hidden, cell
        #: the packing's version and the backend's forward prepared for the kind (None: not yet)
        self.prepared: tuple[int, LSTMForwardCall | None] = (-1, None)

    def views(self, x: np.ndarray, hidden: np.ndarray | None,
              cell: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``x`` as (T, N, I) and the states as (L·D, N, ·), as the checks return them."""
        if self.unbatched:  # a batch of one, in either layout
            return (x[:, None], None if hidden is None else hidden[:, None],
                    None if cell is None else cell[:, None])
        return x.transpose(1, 0, 2) if self.batch_first else x, hidden, cell

    def results(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """New output and final states, and the output seen time-major."""
        output = np.empty(self.output, dtype)
        return (output, np.empty(self.hidden, dtype), np.empty(self.cell, dtype),
                output.transpose(1, 0, 2) if self.batch_first else output)

    def output_of(self, output: np.ndarray, h_out: np.ndarray, c_out: np.ndarray,
                  cache: Any) -> LSTMOutput:
        """What ``apply`` returns, without the batch axis of an unbatched ``x``."""
        if self.unbatched:
            output = output[0] if self.batch_first else output[:, 0]
            h_out, c_out = h_out[:, 0], c_out[:, 0]
        return LSTMOutput(output=output, hidden=h_out, cell=c_out, training_cache=cache)


class _Running:
    """``with _Running(layer) as workspace``: one call's BLAS thread limit (the layer's) and
    scratch space (the layer's, trimmed when the block ends, or a private one while another
    thread is using it). A class: a generator-based context manager cost a small call about a
    microsecond more, and a block of its own for the thread limit about 0.2 µs more."""

    __slots__ = ("_layer", "_held", "_limit")

    def __init__(self, layer: LSTMLayer) -> None:
        self._layer = layer
        self._held: _Workspace | None = None  # the layer's workspace, while this call holds it
        self._limit: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> _Workspace:
        layer = self._layer
        if layer._filter_parameters.n_threads:
            self._limit = layer._threads()
            self._limit.__enter__()
        if layer._workspace_lock.acquire(blocking=False):
            held = self._held = layer._workspace
            assert held is not None  # (released only once no call is in flight)
            return held
        return _Workspace()

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        try:
            if self._held is not None:
                try:
                    self._held.trim()
                finally:
                    self._layer._workspace_lock.release()
        finally:
            if self._limit is not None:
                self._limit.__exit__(None, None, None)


class LSTMLayer(Filter):
    """A stacked (optionally bidirectional) LSTM with forward, training cache and backward.

    Parameters
    ----------
    parameters : LSTMParameters
    filter_parameters : FilterParameters, optional
        Backend, BLAS thread limit, and ``use_client_pointer`` (keep the weight arrays held
        by ``parameters`` and see in-place updates to them, instead of copying them once).

    Notes
    -----
    Training: :meth:`parameters` names the live weight arrays (copies made at creation, or
    the caller's with ``use_client_pointer``) and :meth:`LSTMGradients.parameters` their
    gradients, so ``optimizer.step(layer.parameters(), grads.parameters())`` trains the
    layer whatever the filter parameters. Once its arrays have been handed out, the layer
    compares them before each call with a copy taken when the backend last packed them and
    has them packed again when any element changed (``docs/conventions.md``).

    ``layer(x)`` is ``layer.apply(x)`` (inference). An unbatched ``x`` of shape ``(T, I)``
    (in either layout) is a batch of one: the states are then ``(L·D, H)`` and the output
    ``(T, D·H)``, as in PyTorch. ``dropout`` with one layer has no effect and warns once.

    Examples
    --------
    >>> import numpy as np
    >>> params = LSTMParameters.random(input_size=3, hidden_size=4, seed=0, dtype=np.float64)
    >>> layer = LSTMLayer(params)
    >>> x = np.ones((5, 2, 3))                    # (T, N, I)
    >>> out = layer.apply(x, training=True)
    >>> out.output.shape, out.hidden.shape
    ((5, 2, 4), (1, 2, 4))
    >>> grads = layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
    >>> grads.input.shape, grads.forget_gate.hidden_weights.shape
    ((5, 2, 3), (1, 1, 4, 4))
    >>> layer.close()
    """

    _parameters_class = LSTMParameters

    def __init__(self, parameters: LSTMParameters, filter_parameters: FilterParameters | None = None) -> None:
        if not isinstance(parameters, LSTMParameters):
            raise InvalidParameterError(
                must_be("LSTMLayer(parameters)", "an LSTMParameters", type(parameters).__name__))
        super().__init__(filter_parameters)
        if parameters.dropout > 0.0 and parameters.num_layers == 1:
            warnings.warn(
                f"LSTMParameters.dropout={parameters.dropout} has no effect with num_layers=1: dropout "
                "applies to the inputs of layers 1…L−1, between stacked layers, never after the last one.",
                UserWarning, stacklevel=2)
        client = self.filter_parameters.use_client_pointer
        public = parameters
        # The arrays to compare when the weights are watched (see _packed_weights).
        watched = _parameter_arrays(parameters)
        if not client:  # BNNS copies the weights at creation
            parameters, flat = _copied(parameters)
            watched = [flat]
            public = _with_arrays(parameters, read_only)
        self._watch = _WeightsWatch(watched, flat=not client)
        self._params = parameters
        self._public = public
        # Whether the weight arrays may change outside the layer: the caller's (client
        # pointers) from the start, the layer's own copies once parameters() handed them out.
        self._watched = client
        self._written = 0  # how many times the layer itself wrote new weights (load_state_dict)
        self._dtype = parameters.dtype
        self._config = _configuration(parameters)
        self._pack_lock = threading.Lock()
        self._weights_digests: dict[int, int] = {}  # by packed version
        # The backend's packing, the count of writes it saw and the snapshot of the watched
        # weights it was made from (None when they are not watched): one tuple, which calls
        # read whole (_packed_weights).
        self._published: tuple[LSTMPackedWeights, int, _WatchedBits | None] | None = None
        self._prepared = PreparedForwards()  # the backend's forward per kind of call, these weights
        self._checked = CheckedKinds()  # what the checks found per kind of inference call
        self._packed_weights()
        self._rng: np.random.Generator | None = np.random.default_rng(parameters.seed)
        self._workspace: _Workspace | None = _Workspace()
        self._workspace_lock = threading.Lock()
        self._cache_sizes: dict[tuple[int, int], _CacheSize] = {}
        self._fingerprints: dict[tuple[int, int], int] = {}
        self._zero_state_digests: dict[int, int] = {}
        self._config_key = self._configuration_key()

    # ----------------------------------------------------------------------------------
    # Public API.
    # ----------------------------------------------------------------------------------
    @property
    def layer_parameters(self) -> LSTMParameters:
        """The parameters the layer computes with, holding its live weight arrays.

        With ``use_client_pointer`` the caller's parameter object; otherwise the copy made at
        creation, with read-only views of the layer's arrays (they show the current values;
        train through :meth:`parameters`).
        """
        self._check_open("layer_parameters")
        return self._public

    def _named_parameters(self) -> dict[str, np.ndarray]:
        p = self._params
        return _named_layer_arrays(p.gates, p.projection_weights, p.layer_norm)

    def _share_arrays(self) -> None:
        with self._pack_lock:
            if not self._watched:  # the arrays are as the last packing read them until now
                self._watched = True
                if self._published is not None:
                    packed, written, _ = self._published
                    self._published = (packed, written, self._watch.take(_packing_copy(self._params)))

    def _state_written(self) -> None:
        with self._pack_lock:  # after a packing under way, which then packs again at the next call
            self._written += 1
        self._checked.clear()

    @property
    def _packed(self) -> LSTMPackedWeights | None:
        """The backend's packing of the weights, as last made."""
        published = self._published
        return None if published is None else published[0]

    def _live_parameters(self) -> LSTMParameters:
        return self._public

    def _runtime_state(self) -> dict[str, Any]:
        assert self._rng is not None  # released by close() only
        return {"dropout_generator": self._rng.bit_generator.state}

    def _set_runtime_state(self, state: Any) -> None:
        assert self._rng is not None
        self._rng.bit_generator.state = state["dropout_generator"]

    def __call__(self, x: np.ndarray, hidden: np.ndarray | None = None, cell: np.ndarray | None = None,
                 sequence_lengths: Any = None, training: bool = False) -> LSTMOutput:
        """``layer(x)`` is ``layer.apply(x)``, an inference forward; ``layer(x, training=True)``
        the training one."""
        return self.apply(x, hidden, cell, sequence_lengths, training=training)

    @guarded
    def training_cache_capacity(self, batch_size: int, seq_len: int) -> int:
        """Bytes a training forward of ``batch_size`` sequences of ``seq_len`` steps writes.

        ``64 + payload``, where the backend's payload is affine in ``seq_len · batch_size``
        (``BNNSComputeLSTMTrainingCacheCapacity``; the built-in backends' layout is in
        ``docs/lstm.md``).
        """
        self._check_open("training_cache_capacity")
        n = positive_int("LSTMLayer.training_cache_capacity(batch_size)", batch_size)
        t = positive_int("LSTMLayer.training_cache_capacity(seq_len)", seq_len)
        return self._cache_size(t, n).nbytes

    @guarded
    def apply(
        self,
        x: np.ndarray,
        hidden: np.ndarray | None = None,
        cell: np.ndarray | None = None,
        sequence_lengths: Any = None,
        training: bool = False,
        training_cache: Any = None,
    ) -> LSTMOutput:
        """Run the LSTM forward (``BNNSDirectApplyLSTMBatchTrainingCaching``).

        Parameters
        ----------
        x : array (T, N, I), or (N, T, I) when batch-first; or unbatched (T, I)
            An unbatched sequence is a batch of one: the output is then (T, D·P) and the
            states (L·D, P) and (L·D, H).
        hidden, cell : arrays (L·D, N, P) and (L·D, N, H), without N for an unbatched x, optional
            Initial states, layer-major then direction; zeros when omitted. P is
            ``parameters.output_size`` (H without a projection).
        sequence_lengths : N integers in [0, T], optional
            Steps at or past a sequence's length output zeros and keep its state; the reverse
            direction starts at the last valid step. A sequence of length 0 has zero outputs
            and zero final states (as ONNX Runtime gives).
        training : bool
            Apply dropout and write a training cache for :meth:`apply_backward`.
        training_cache : writable buffer, optional
            Where a training forward writes its cache (a ``numpy.uint8`` array, ``bytearray``
            or any writable buffer of at least :meth:`training_cache_capacity` bytes);
            allocated and returned when omitted.
        """
        self._check_open("apply")
        kind = None
        if training is False and training_cache is None and sequence_lengths is None:
            # An inference of a kind whose checks passed before skips them (_CheckedInference).
            kind = inference_kind(x, hidden, cell)
            checked = self._checked.get(kind)
            if checked is not None:
                return self._infer(checked, *checked.views(x, hidden, cell))
        if not isinstance(training, (bool, np.bool_)):
            raise InvalidParameterError(must_be("LSTMLayer.apply(training)", "True or False", training))
        x_tm, seq_len, batch, unbatched = self._check_x("LSTMLayer.apply(x)", x)
        h0 = self._check_state("LSTMLayer.apply(hidden)", hidden, batch, unbatched, hidden=True)
        c0 = self._check_state("LSTMLayer.apply(cell)", cell, batch, unbatched)
        lengths = self._check_lengths("LSTMLayer.apply(sequence_lengths)", sequence_lengths, seq_len, batch,
                                      unbatched)
        p = self._params
        size_ld, width = p.num_layers * p.num_directions, p.num_directions * p.output_size
        checked = _CheckedInference(
            unbatched=unbatched, batch_first=p.batch_first,
            output=(batch, seq_len, width) if p.batch_first else (seq_len, batch, width),
            hidden=(size_ld, batch, p.output_size), cell=(size_ld, batch, p.hidden_size))
        if not training:
            if training_cache is not None:
                raise InvalidParameterError(must_be(
                    "LSTMLayer.apply(training_cache)",
                    "None when training=False (only a training forward writes a cache)",
                    type(training_cache).__name__))
            result = self._infer(checked, x_tm, h0, c0, lengths)
            if kind is not None:  # (after the call, which may have packed new weights and forgotten)
                self._checked.remember(kind, checked)
            return result
        size = self._cache_size(seq_len, batch)
        if training_cache is None:
            buffer = cache_object = np.empty(size.nbytes, dtype=np.uint8)
        else:
            where = "LSTMLayer.apply(training_cache)"
            buffer = as_byte_buffer(where, training_cache, writable=True)
            self._check_cache_size(where, buffer, size, seq_len, batch)
            for name, array in (("x", x_tm), ("hidden", h0), ("cell", c0)):
                if array is not None and overlap(buffer[:size.nbytes], array):
                    raise InvalidParameterError(must_be(
                        where, f"memory apart from {name} (the forward writes the cache)",
                        f"a buffer overlapping {name}"))
            cache_object = training_cache
        output, h_out, c_out, output_tm = checked.results(self._dtype)
        with _Running(self) as workspace:
            weights = self._packed_weights()
            x_prepared = self._prepared_input(x_tm, lengths, workspace)
            clear_header(buffer)
            with self._payload(buffer, size, workspace, write=True) as payload:
                self._forward(weights, x_prepared, h0, c0, lengths, output_tm, h_out, c_out, payload,
                              workspace)
            write_header(buffer, fingerprint=self._fingerprint(size, seq_len, batch, lengths),
                         payload_bytes=size.payload, seq_len=seq_len, batch_size=batch,
                         itemsize=self._dtype.itemsize,
                         identity=CacheIdentity(self._weights_digests[weights.version],
                                                weights.version & 0xFFFFFFFF, next_generation(),
                                                digest(x_prepared), self._state_digest(h0, c0, batch)))
        return checked.output_of(output, h_out, c_out, cache_object)

    @guarded
    def stream(self, batch_size: int | None = None, hidden: np.ndarray | None = None,
               cell: np.ndarray | None = None) -> LSTMStream:
        """A stepper that runs the LSTM one time step at a time, for real-time inference.

        Stepping through a sequence gives what :meth:`apply` over the whole of it gives. The
        layer must read forward in time only: a bidirectional or reverse layer needs the whole
        sequence and is refused. The stepper takes the layer's weights now and at each
        :meth:`LSTMStream.reset`, and sees later changes only then. Dropout is an inference
        no-op here as in :meth:`apply`; ``batch_first`` does not matter (a step has no T axis).

        Parameters
        ----------
        batch_size : int, optional
            N, the number of streams stepped together: each step then takes ``(N, I)`` and
            returns ``(N, P)``. ``None`` (the default) makes an unbatched stream: steps of
            ``(I,)``, states without the N axis, as :meth:`apply` treats an unbatched ``x``.
        hidden, cell : arrays (L, N, P) and (L, N, H), without N when unbatched, optional
            The initial states (zeros when omitted), which :meth:`LSTMStream.reset` returns to.
        """
        self._check_open("stream")
        p = self._params
        if p.num_directions != 1 or p.reverse:
            raise InvalidParameterError(must_be(
                "LSTMLayer.stream()",
                "called on a layer that reads forward in time only (a direction that reads the "
                "sequence backward needs the whole sequence: use apply)",
                f"a {p.direction} layer"))
        unbatched = batch_size is None
        batch = 1 if batch_size is None else positive_int("LSTMLayer.stream(batch_size)", batch_size)
        h0 = self._check_state("LSTMLayer.stream(hidden)", hidden, batch, unbatched, hidden=True)
        c0 = self._check_state("LSTMLayer.stream(cell)", cell, batch, unbatched)
        return LSTMStream(self, batch, unbatched, h0, c0)

    @guarded
    def apply_backward(
        self,
        x: np.ndarray,
        output_gradient: np.ndarray | None,
        hidden: np.ndarray | None = None,
        cell: np.ndarray | None = None,
        hidden_gradient: np.ndarray | None = None,
        cell_gradient: np.ndarray | None = None,
        sequence_lengths: Any = None,
        training_cache: Any = None,
    ) -> LSTMGradients:
        """Backpropagate through time (``BNNSDirectApplyLSTMBatchBackward``).

        Parameters
        ----------
        x, hidden, cell, sequence_lengths
            As given to the training forward. With a cache, ``hidden`` and ``cell`` are only
            checked (the cache holds them); without one the forward is recomputed from them.
        output_gradient : array like the output, or None
            ``None`` when only the final states carry gradient.
        hidden_gradient, cell_gradient : array (L·D, N, H), optional
            Gradients with respect to the final states; zeros when omitted.
        training_cache : buffer, optional
            The cache of the training forward. Without one the forward is recomputed, which
            is refused when the layer has dropout (the masks live in the cache).
        """
        self._check_open("apply_backward")
        x_tm, seq_len, batch, unbatched = self._check_x("LSTMLayer.apply_backward(x)", x)
        p = self._params
        width = p.num_directions * p.output_size
        dy = None
        if output_gradient is not None:
            where = "LSTMLayer.apply_backward(output_gradient)"
            if unbatched:
                dy = as_input(where, output_gradient, self._dtype, (seq_len, width))[:, None]
            else:
                shape = (batch, seq_len, width) if p.batch_first else (seq_len, batch, width)
                dy = as_input(where, output_gradient, self._dtype, shape)
                if p.batch_first:
                    dy = dy.transpose(1, 0, 2)
        h0 = self._check_state("LSTMLayer.apply_backward(hidden)", hidden, batch, unbatched, hidden=True)
        c0 = self._check_state("LSTMLayer.apply_backward(cell)", cell, batch, unbatched)
        dh_final = self._check_state("LSTMLayer.apply_backward(hidden_gradient)", hidden_gradient, batch,
                                     unbatched, hidden=True)
        dc_final = self._check_state("LSTMLayer.apply_backward(cell_gradient)", cell_gradient, batch,
                                     unbatched)
        lengths = self._check_lengths("LSTMLayer.apply_backward(sequence_lengths)", sequence_lengths,
                                      seq_len, batch, unbatched)
        size = self._cache_size(seq_len, batch)
        where = "LSTMLayer.apply_backward(training_cache)"
        buffer = header = None
        if training_cache is None:
            if self._config.dropout > 0.0:
                raise InvalidParameterError(must_be(
                    where, "the cache of the training forward when dropout > 0 (it holds the dropout masks)",
                    None))
        else:
            buffer = as_byte_buffer(where, training_cache, writable=False)
            self._check_cache_size(where, buffer, size, seq_len, batch)
            header = self._check_cache_header(where, buffer, size, seq_len, batch, lengths)
        gradients = self._gradient_buffers(seq_len, batch)
        with _Running(self) as workspace:
            weights = self._packed_weights()
            x_prepared = self._prepared_input(x_tm, lengths, workspace)
            if header is not None:
                self._check_cache_identity(where, header.identity, weights, x_prepared, h0, c0, batch)
            with self._payload(buffer, size, workspace, write=False) as payload:
                assert payload is not None  # without a cache: the recomputed forward's
                if buffer is None:  # recompute the forward, as BNNS does without a cache
                    size_ld, h = p.num_layers * p.num_directions, p.hidden_size
                    output_tm = workspace.array("recompute_output", (seq_len, batch, width), self._dtype)
                    h_out = workspace.array("recompute_hidden", (size_ld, batch, p.output_size), self._dtype)
                    c_out = workspace.array("recompute_cell", (size_ld, batch, h), self._dtype)
                    self._forward(weights, x_prepared, h0, c0, lengths, output_tm, h_out, c_out, payload,
                                  workspace)
                self.backend.lstm_backward(LSTMBackwardRequest(
                    config=self._config, weights=weights, x=x_prepared, cache=payload, output_gradient=dy,
                    hidden_gradient=dh_final, cell_gradient=dc_final, sequence_lengths=lengths,
                    gradients=gradients, workspace=workspace, threads=self.filter_parameters.n_threads))
        if buffer is not None and read_header(where, buffer) != header:
            raise InvalidParameterError(must_be(
                where, "left alone while apply_backward reads it",
                "a cache overwritten by another forward during the backward"))
        return self._gradients_result(gradients, unbatched)

    # ----------------------------------------------------------------------------------
    # Orchestration: the backend computes, the layer prepares and hands over.
    # ----------------------------------------------------------------------------------
    def _infer(self, checked: _CheckedInference, x_tm: np.ndarray, h0: np.ndarray | None,
               c0: np.ndarray | None, lengths: np.ndarray | None = None) -> LSTMOutput:
        """An inference forward of checked arguments: ``x_tm`` time-major (T, N, I), the
        states (L·D, N, ·) or None. Full-length sequences go through the backend's forward
        prepared for the kind (:meth:`_forward`), which ``checked`` keeps with the packing it
        serves."""
        output, h_out, c_out, output_tm = checked.results(self._dtype)
        with _Running(self) as workspace:
            weights = self._packed_weights()
            x_prepared = self._prepared_input(x_tm, lengths, workspace)
            version, call = checked.prepared
            if call is not None and version == weights.version:
                call(x_prepared, h0, c0, output_tm, h_out, c_out, None, None, workspace)
            else:
                call = self._forward(weights, x_prepared, h0, c0, lengths, output_tm, h_out, c_out, None,
                                     workspace)
                if call is not None:  # one assignment: other threads read the pair whole
                    checked.prepared = (weights.version, call)
        return checked.output_of(output, h_out, c_out, None)

    def _forward(self, weights: LSTMPackedWeights, x: np.ndarray, h0: np.ndarray | None,
                 c0: np.ndarray | None, lengths: np.ndarray | None, output_tm: np.ndarray,
                 h_out: np.ndarray, c_out: np.ndarray, payload: np.ndarray | None,
                 workspace: _Workspace) -> LSTMForwardCall | None:
        """One forward through the backend; a training forward when ``payload`` is given.

        Full-length sequences go through the forward the backend prepared for their kind of
        call (``lstm_prepare_forward``, made at the second call of that kind, kept in
        :attr:`_prepared` until the weights are packed again), which is returned; other calls,
        and backends without it, through ``lstm_forward``."""
        training = payload is not None
        masks = self._dropout_masks(x.shape[0], x.shape[1], workspace) if training else None
        key = call = None
        if lengths is None:  # (lengths are values: each would be a kind of its own)
            # The outputs, the cache's payload and the masks are the layer's own, made alike
            # for each T and N, which x's kind holds.
            key = (weights.version, training, array_kind(x), array_kind(h0), array_kind(c0))
            call = self._prepared.get(key)
            if call is not None:
                call(x, h0, c0, output_tm, h_out, c_out, payload, masks, workspace)
                return call
        request = LSTMForwardRequest(
            config=self._config, weights=weights, x=x, hidden=h0, cell=c0, sequence_lengths=lengths,
            output=output_tm, hidden_out=h_out, cell_out=c_out, training=training, cache=payload,
            dropout_masks=masks, workspace=workspace, threads=self.filter_parameters.n_threads)
        if key is not None and self._prepared.wanted(key):
            call = self._prepared.prepare(key, self.backend, request)
        if call is not None:
            call(x, h0, c0, output_tm, h_out, c_out, payload, masks, workspace)
        else:
            self.backend.lstm_forward(request)
        return call

    def _dropout_masks(self, seq_len: int, batch: int,
                       workspace: _Workspace) -> tuple[np.ndarray | None, ...] | None:
        """Inverted-dropout scales for the inputs of layers 1…L−1: 0 with probability p, else
        1/(1−p); drawn from the layer's generator in layer order."""
        config = self._config
        if config.dropout <= 0.0:
            return None
        assert self._rng is not None
        p = config.dropout
        masks: list[np.ndarray | None] = [None]
        for layer in range(1, config.num_layers):
            width = config.num_directions * config.output_size
            mask = workspace.array(f"dropout{layer}", (seq_len, batch, width), self._dtype)
            self._rng.random(dtype=self._dtype, out=mask)
            np.greater_equal(mask, p, out=mask)
            np.multiply(mask, 1.0 / (1.0 - p), out=mask)
            masks.append(mask)
        return tuple(masks)

    @contextlib.contextmanager
    def _payload(self, buffer: np.ndarray | None, size: _CacheSize, workspace: _Workspace, *,
                 write: bool) -> Iterator[np.ndarray | None]:
        """The cache payload the backend works on.

        The contract promises backends a payload aligned to the item size, so a caller's
        buffer at an odd address is staged through aligned workspace memory (copied in for
        backward, out for a forward): the backend then runs the same code wherever the
        caller's buffer lies. Without a buffer: ``None`` for a forward (inference), aligned
        workspace memory for backward (the recomputed forward).
        """
        if buffer is None:
            yield None if write else workspace.bytes("recompute", size.payload)
            return
        payload = buffer[HEADER_BYTES:size.nbytes]
        if payload.ctypes.data % self._dtype.itemsize == 0:
            yield payload
            return
        staged = workspace.bytes("staged_cache", size.payload)
        if not write:
            np.copyto(staged, payload)
        yield staged
        if write:
            np.copyto(payload, staged)

    def _packed_weights(self) -> LSTMPackedWeights:
        """The backend's packed weights, packed again only when the weights changed.

        Weights that may change outside the layer (client pointers, or arrays handed out by
        :meth:`parameters`) are compared with a snapshot taken when they were last packed: one
        read of the weights per call, stopping at the first array that differs (packing also
        writes and transposes them). When any differs, or :meth:`load_state_dict` wrote new
        ones since, the backend packs them again with the next ``version``. A layer whose
        arrays never left it pays nothing.

        The backend packs a copy of the weights (:func:`_packing_copy`), and the snapshot is
        that copy's bits; the count of writes is read before the copy is taken; the packing,
        the count and the snapshot are published as one tuple. So a call never pairs a packing
        with a newer count or snapshot, and a write or change during a packing, even one undone
        before the next call, is packed by the next call.
        """
        packed = self._current_packing()
        if packed is not None:
            return packed
        with self._pack_lock:
            packed = self._current_packing()
            if packed is not None:
                return packed
            published = self._published
            written = self._written
            weights = _packing_copy(self._params)  # what the backend reads: no write reaches it
            snapshot = self._watch.take(weights) if self._watched else None
            version = 0 if published is None else published[0].version + 1
            packed = self.backend.lstm_pack_weights(LSTMPackRequest(
                config=self._config, gates=weights.gates, version=version,
                projection=weights.projection, layer_norm=weights.layer_norm))
            self._prepared.clear()
            self._checked.clear()
            # What a training cache is stamped with: the weights it was computed from.
            self._weights_digests = {v: d for v, d in self._weights_digests.items() if v > version - 4}
            self._weights_digests[version] = digest(*weights.arrays, size=8)
            self._published = (packed, written, snapshot)
            return packed

    def _current_packing(self) -> LSTMPackedWeights | None:
        """The published packing while no write or change came since it, else None."""
        published = self._published
        if published is None:
            return None
        packed, written, snapshot = published
        return packed if written == self._written and (snapshot is None or not snapshot.changed()) else None

    def _gradient_buffers(self, seq_len: int, batch: int) -> LSTMGradientBuffers:
        """Gradients in the public structure (written by the backend), ``input`` time-major."""
        p = self._params
        size_l, size_d, h, size_i = p.num_layers, p.num_directions, p.hidden_size, p.input_size
        size_p = p.output_size
        dtype = self._dtype
        gates = []
        for gate in p.gates:
            iw1 = np.empty((size_l - 1, size_d, h, size_d * size_p), dtype) if size_l > 1 else None
            cw = None if gate.cell_weights is None else np.empty(np.shape(gate.cell_weights), dtype)
            bias = None if gate.bias is None else np.empty((size_l, size_d, h), dtype)
            gates.append(LSTMGateGradients(input_weights=(np.empty((size_d, h, size_i), dtype), iw1),
                                           hidden_weights=np.empty((size_l, size_d, h, size_p), dtype),
                                           cell_weights=cw, bias=bias))
        d_x = np.empty((batch, seq_len, size_i) if p.batch_first else (seq_len, batch, size_i), dtype)
        norm = None
        if p.layer_norm is not None:
            norm = LSTMLayerNormGradients(**{name: np.empty(np.shape(getattr(p.layer_norm, name)), dtype)
                                             for name in _LAYER_NORM_FIELDS})
        return LSTMGradientBuffers(
            input=d_x.transpose(1, 0, 2) if p.batch_first else d_x,
            hidden=np.empty((size_l * size_d, batch, size_p), dtype),
            cell=np.empty((size_l * size_d, batch, h), dtype),
            gates=(gates[0], gates[1], gates[2], gates[3]),
            projection=None if p.projection_size is None else np.empty((size_l, size_d, size_p, h), dtype),
            layer_norm=norm)

    def _gradients_result(self, buffers: LSTMGradientBuffers, unbatched: bool) -> LSTMGradients:
        gates = buffers.gates
        d_x = buffers.input.transpose(1, 0, 2) if self._params.batch_first else buffers.input
        d_h, d_c = buffers.hidden, buffers.cell
        if unbatched:
            d_x = buffers.input[:, 0]
            d_h, d_c = d_h[:, 0], d_c[:, 0]
        return LSTMGradients(input=d_x, hidden=d_h, cell=d_c,
                             input_gate=cast(LSTMGateGradients, gates[0]),
                             forget_gate=cast(LSTMGateGradients, gates[1]),
                             candidate_gate=cast(LSTMGateGradients, gates[2]),
                             output_gate=cast(LSTMGateGradients, gates[3]),
                             projection_weights=buffers.projection,
                             layer_norm=cast("LSTMLayerNormGradients | None", buffers.layer_norm))

    # ----------------------------------------------------------------------------------
    # Helpers.
    # ----------------------------------------------------------------------------------
    def _prepared_input(self, x_tm: np.ndarray, lengths: np.ndarray | None,
                        workspace: _Workspace) -> np.ndarray:
        """``x`` as a C-contiguous (T, N, I) array; steps past a sequence's end are zeroed, so
        whatever the caller padded with (even NaN) cannot reach the gradients."""
        if lengths is None and x_tm.flags.c_contiguous:
            return x_tm
        seq_len, batch, size_i = x_tm.shape
        x = workspace.array("input", (seq_len, batch, size_i), self._dtype)
        np.copyto(x, x_tm)
        if lengths is not None:
            x[np.arange(seq_len)[:, None] >= lengths[None, :]] = 0.0
        return x

    def _cache_size(self, seq_len: int, batch: int) -> _CacheSize:
        """The backend's payload for T and N; the last few are kept (a call's fixed cost matters
        when the sequences are short)."""
        key = (seq_len, batch)
        size = self._cache_sizes.get(key)
        if size is None:
            layout = self.backend.lstm_cache_layout(LSTMCacheRequest(config=self._config, seq_len=seq_len,
                                                                     batch_size=batch))
            size = _CacheSize(int(layout.nbytes), str(layout.format))
            if len(self._cache_sizes) >= 8:
                self._cache_sizes.clear()
            self._cache_sizes[key] = size
        return size

    def _configuration_key(self) -> bytes:
        c = self._config
        acts = [[(a.function.value, a.alpha, a.beta) for a in c.activations(d)]
                for d in range(c.num_directions)]
        variants = (c.reverse, c.clip, c.cell_clip, c.projection_clip, c.input_forget, c.projection_size,
                    c.layer_norm, c.layer_norm_epsilon)
        return repr(("bnnsfw.LSTMLayer", c.input_size, c.hidden_size, c.num_layers, c.num_directions,
                     self._dtype.str, c.peepholes, acts, c.dropout > 0.0, variants)).encode()

    def _fingerprint(self, size: _CacheSize, seq_len: int, batch: int, lengths: np.ndarray | None) -> int:
        """64-bit digest of the configuration, the payload format and size, T, N and the lengths
        (kept per T and N for full-length sequences: a call's fixed cost matters when they are short)."""
        key = (seq_len, batch)
        if lengths is None and key in self._fingerprints:
            return self._fingerprints[key]
        digest = hashlib.blake2b(self._config_key, digest_size=8)
        digest.update(repr((size.format, size.payload, seq_len, batch)).encode())
        if lengths is not None:
            digest.update(lengths.astype("<i8").tobytes())
        value = int.from_bytes(digest.digest(), "little")
        if lengths is None:
            if len(self._fingerprints) >= 8:
                self._fingerprints.clear()
            self._fingerprints[key] = value
        return value

    def _check_cache_size(self, where: str, buffer: np.ndarray, size: _CacheSize, seq_len: int,
                          batch: int) -> None:
        if buffer.size < size.nbytes:
            call = f"training_cache_capacity(batch_size={batch}, seq_len={seq_len})"
            raise InvalidParameterError(
                must_be(where, f"at least {size.nbytes} bytes ({call})", f"{buffer.size} bytes"))

    def _check_cache_header(self, where: str, buffer: np.ndarray, size: _CacheSize, seq_len: int, batch: int,
                            lengths: np.ndarray | None) -> CacheHeader:
        header = read_header(where, buffer)
        if (header.seq_len, header.batch_size) != (seq_len, batch):
            raise InvalidParameterError(must_be(
                where, f"a cache written for T={seq_len}, N={batch}",
                f"a cache for T={header.seq_len}, N={header.batch_size}"))
        if header.itemsize != self._dtype.itemsize:
            raise InvalidParameterError(must_be(where, f"a cache of {self._dtype.name} data",
                                                f"a cache of {header.itemsize}-byte items"))
        if header.fingerprint != self._fingerprint(size, seq_len, batch, lengths):
            raise InvalidParameterError(must_be(
                where,
                "the cache of a training forward with this layer configuration and these sequence_lengths",
                "a cache written for another configuration or other sequence lengths"))
        return header

    def _state_digest(self, h0: np.ndarray | None, c0: np.ndarray | None, batch: int) -> int:
        """digest(h0, c0), zeros standing for a missing state (kept per N when both are missing)."""
        if h0 is None and c0 is None and batch in self._zero_state_digests:
            return self._zero_state_digests[batch]
        p = self._params
        zeros = np.zeros((p.num_layers * p.num_directions, batch, p.hidden_size), self._dtype)
        value = digest(zeros if h0 is None else h0, zeros if c0 is None else c0)
        if h0 is None and c0 is None:
            if len(self._zero_state_digests) >= 8:
                self._zero_state_digests.clear()
            self._zero_state_digests[batch] = value
        return value

    def _check_cache_identity(self, where: str, identity: CacheIdentity, weights: LSTMPackedWeights,
                              x: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None,
                              batch: int) -> None:
        """A cache is trusted only for the layer, weights and inputs of the forward that wrote it
        (the initial states are compared when the backward is given any)."""
        if identity.weights != self._weights_digests[weights.version]:
            changed = "" if identity.weights_version == weights.version & 0xFFFFFFFF else (
                f" (this layer's weights changed since: version {identity.weights_version} then, "
                f"{weights.version} now)")
            raise InvalidParameterError(must_be(
                where, "a cache written with the weights this layer computes with",
                f"a cache written by a layer with other weights{changed}"))
        if identity.x_digest != digest(x):
            raise InvalidParameterError(must_be(where, "the cache of the forward of this x",
                                                "a cache written for another x"))
        states_given = h0 is not None or c0 is not None
        if states_given and identity.state_digest != self._state_digest(h0, c0, batch):
            raise InvalidParameterError(must_be(
                where, "the cache of the forward from these initial hidden and cell states",
                "a cache written from other initial states"))

    def _check_x(self, where: str, x: object) -> tuple[np.ndarray, int, int, bool]:
        """``x`` as a time-major (T, N, I) view, T, N, and whether it came unbatched ``(T, I)``."""
        p = self._params
        size_i = p.input_size
        array = as_input(where, x, self._dtype)
        if array.ndim not in (2, 3) or array.shape[-1] != size_i or 0 in array.shape[:-1]:
            batched = f"(N, T, {size_i})" if p.batch_first else f"(T, N, {size_i})"
            text = f"of shape {batched} or unbatched (T, {size_i})"
            if array.ndim in (2, 3) and array.shape[-1] == size_i:
                text += " with T >= 1 and N >= 1"
            raise ShapeError(must_be(where, text, describe(array)))
        unbatched = array.ndim == 2
        if unbatched:  # PyTorch's rule: a batch of one, in either layout
            array = array[:, None]
        elif p.batch_first:
            array = array.transpose(1, 0, 2)
        return array, array.shape[0], array.shape[1], unbatched

    def _check_state(self, where: str, value: object, batch: int, unbatched: bool, *,
                     hidden: bool = False) -> np.ndarray | None:
        """A hidden state (``hidden=True``: ``(L·D, N, P)``) or a cell state (``(L·D, N, H)``);
        without the N axis for an unbatched x, as in PyTorch."""
        if value is None:
            return None
        p = self._params
        projected = hidden and p.projection_size is not None
        size, name = (p.output_size, "P") if projected else (p.hidden_size, "H")
        size_ld = p.num_layers * p.num_directions
        if unbatched:  # states of an unbatched input are unbatched too, as in PyTorch
            text = f"(L·D, {name}) = {(size_ld, size)} for an unbatched x"
            return as_input(where, value, self._dtype, (size_ld, size), shape_text=text)[:, None]
        shape = (size_ld, batch, size)
        return as_input(where, value, self._dtype, shape, shape_text=f"(L·D, N, {name}) = {shape}")

    @staticmethod
    def _check_lengths(where: str, value: object, seq_len: int, batch: int,
                       unbatched: bool) -> np.ndarray | None:
        if value is None:
            return None
        lengths = np.asarray(value)
        if unbatched and lengths.ndim == 0:  # the one sequence's length
            lengths = lengths.reshape(1)
        if lengths.shape != (batch,):
            raise ShapeError(must_be(where, f"of shape ({batch},) (one length per sequence)",
                                     f"shape {tuple(lengths.shape)}"))
        if lengths.dtype.kind not in "iu":
            raise InvalidParameterError(must_be(where, "integers", lengths.dtype.name))
        if lengths.min() < 0 or lengths.max() > seq_len:
            raise InvalidParameterError(
                must_be(where, f"in [0, {seq_len}] (T = {seq_len})", lengths.tolist()))
        lengths = lengths.astype(np.int64)
        return None if (lengths == seq_len).all() else lengths

    # Filter hooks.
    def _release(self) -> None:
        self._published = None
        self._prepared.clear()
        self._checked.clear()
        self._watch.release()
        self._workspace = None
        self._rng = None

    def _describe(self) -> str:
        p = self._params
        text = (f"input_size={p.input_size}, hidden_size={p.hidden_size}, num_layers={p.num_layers}, "
                f"bidirectional={p.bidirectional}, dtype={self._dtype.name}")
        if self._config.variants:
            text += f", variants={'+'.join(self._config.variants)}"
        return text

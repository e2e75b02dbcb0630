"""Streaming: an LSTM run one step at a time, its states carried from call to call (inference).

:meth:`LSTMLayer.stream <bnnsfw.LSTMLayer.stream>` makes an :class:`LSTMStream`. Each
:meth:`~LSTMStream.step` is one forward of the whole stack over one time step, asked of the
layer's backend through the contract like any other (an ``LSTMForwardRequest`` with T = 1 and
the states passed in), so every backend and every causal variant streams as it applies.

What the stepper owns, made once: a copy of the weights, packed by the backend (taken again by
:meth:`~LSTMStream.reset`, packed again only when they changed) with the backend's forward
prepared for each kind of step (``lstm_prepare_forward``, when it has one), two sets of state
buffers that the steps write in turn (a request's outputs may not overlap its inputs), an input
buffer and a workspace. A step with ``out`` given therefore allocates no array.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from .._validation import as_input, as_output, overlap
from ..backends.contract import LSTMForwardRequest, LSTMPackedWeights, LSTMPackRequest
from ..errors import InvalidParameterError, ShapeError, must_be
from ._lstm_prepared import PreparedForwards, array_kind
from ._lstm_weights import _copied, _parameter_arrays
from ._lstm_workspace import _Workspace

if TYPE_CHECKING:
    from .lstm import LSTMLayer

__all__ = ["LSTMStream"]


class _WeightsSnapshot:
    """The stepper's own copy of a layer's weights and the backend's packing of that copy.

    Packing a copy (not the layer's live arrays) keeps the snapshot whatever a backend's
    packing does with the arrays it is given: a backend may keep references to them.
    """

    def __init__(self, layer: LSTMLayer) -> None:
        self._layer = layer
        self._params, _ = _copied(layer._params)
        self._copies = _parameter_arrays(self._params)
        self._version = 0
        self.packed = self._pack()
        #: The backend's forward prepared for each kind of step on this packing.
        self.prepared = PreparedForwards()

    def _pack(self) -> LSTMPackedWeights:
        params = self._params
        return self._layer.backend.lstm_pack_weights(LSTMPackRequest(
            config=self._layer._config, gates=params.gates, version=self._version,
            projection=params.projection_weights, layer_norm=params.layer_norm))

    def refresh(self) -> None:
        """Take the layer's weights again; pack them only when any bit changed."""
        live = _parameter_arrays(self._layer._params)
        bits = np.dtype(f"u{self._params.dtype.itemsize}")
        if all(np.array_equal(a.view(bits), b.view(bits)) for a, b in zip(live, self._copies)):
            return
        for copy, array in zip(self._copies, live):
            np.copyto(copy, array)
        self._version += 1
        self.prepared = PreparedForwards()
        self.packed = self._pack()


class LSTMStream:
    """An LSTM run one time step at a time, carrying every layer's states (inference only).

    Made by :meth:`LSTMLayer.stream <bnnsfw.LSTMLayer.stream>`, never directly. Stepping
    through a sequence gives what one :meth:`~bnnsfw.LSTMLayer.apply` over it gives (within
    the backend contract's tolerance), for stacked layers and every variant that reads
    forward in time.

    The stepper computes with the weights the layer had when it was made, or when
    :meth:`reset` last ran: an optimizer's step or ``load_state_dict`` after that reaches it
    at the next :meth:`reset` (or a new stream), never in the middle of a stream.

    Examples
    --------
    >>> import numpy as np
    >>> import bnnsfw as bf
    >>> params = bf.LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2, seed=0)
    >>> layer = bf.LSTMLayer(params)
    >>> stream = layer.stream(batch_size=2)
    >>> y = stream.step(np.ones((2, 3), np.float32))        # (N, I) -> (N, H)
    >>> y.shape, stream.hidden.shape
    ((2, 4), (2, 2, 4))
    >>> stream.reset(rows=[1])                                # stream 1 starts again
    >>> layer.close()
    """

    def __init__(self, layer: LSTMLayer, batch_size: int, unbatched: bool, hidden: np.ndarray | None,
                 cell: np.ndarray | None) -> None:
        config = layer._config
        dtype = np.dtype(config.dtype)
        size_ld = config.num_layers * config.num_directions
        size_h, size_p = config.hidden_size, config.output_size
        self._layer = layer
        self._batch = batch_size
        self._unbatched = unbatched
        self._dtype = dtype
        self._lock = threading.Lock()
        # The initial states reset() returns to: copies of those given, or zeros.
        self._initial_hidden = np.zeros((size_ld, batch_size, size_p), dtype)
        self._initial_cell = np.zeros((size_ld, batch_size, size_h), dtype)
        if hidden is not None:
            np.copyto(self._initial_hidden, hidden)
        if cell is not None:
            np.copyto(self._initial_cell, cell)
        # Two sets of states: a step reads one and writes the other, then they swap roles.
        self._hidden = (self._initial_hidden.copy(), np.empty_like(self._initial_hidden))
        self._cell = (self._initial_cell.copy(), np.empty_like(self._initial_cell))
        self._current = 0
        size_i = config.input_size
        self._x = np.empty((1, batch_size, size_i), dtype)  # a step's input, when it must be copied
        self._x_shape = (size_i,) if unbatched else (batch_size, size_i)
        self._x_text = (f"(I,) = ({size_i},) for an unbatched stream" if unbatched
                        else f"(N, I) = {self._x_shape}")
        self._out_shape = (size_p,) if unbatched else (batch_size, size_p)
        self._workspace = _Workspace()
        self._weights = _WeightsSnapshot(layer)

    # ----------------------------------------------------------------------------------
    # Public API.
    # ----------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int | None:
        """N, the number of streams stepped together; ``None`` for an unbatched stream."""
        return None if self._unbatched else self._batch

    def step(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Run one time step of every layer and return the top layer's output.

        Parameters
        ----------
        x : array (N, I), or (I,) for an unbatched stream
            This step's input, of the layer's dtype (whatever the layer's ``batch_first``).
        out : array (N, P), or (P,) for an unbatched stream, optional
            Where the output is written (then returned); any strides. With ``out`` a step
            allocates no array. Without it the output is a new array.

        Returns
        -------
        array (N, P), or (P,)
            The top layer's hidden state after this step (P is ``output_size``: H without a
            projection).
        """
        layer = self._layer
        layer._begin_call("stream().step")
        try:
            with self._lock:
                return self._step(x, out)
        finally:
            layer._end_call()

    def reset(self, rows: Any = None) -> None:
        """Return every stream (``rows=None``) or some of them to the initial states, and take
        the layer's current weights.

        The weights are taken for every row, whichever rows are reset: changes made to the
        layer's weights since the stream was made (or last reset) are seen from the next step.

        Parameters
        ----------
        rows : int, sequence of ints in [0, N), or N booleans, optional
            The batch rows that start again (independent streams end at different times);
            the others carry on with their states. An unbatched stream has no rows to choose.
        """
        layer = self._layer
        layer._begin_call("stream().reset")
        try:
            with self._lock:
                index = self._rows(rows)
                self._weights.refresh()
                hidden, cell = self._hidden[self._current], self._cell[self._current]
                if index is None:
                    np.copyto(hidden, self._initial_hidden)
                    np.copyto(cell, self._initial_cell)
                else:
                    hidden[:, index] = self._initial_hidden[:, index]
                    cell[:, index] = self._initial_cell[:, index]
        finally:
            layer._end_call()

    @property
    def hidden(self) -> np.ndarray:
        """A copy of every layer's hidden state, ``(L, N, P)`` (``(L, P)`` unbatched); settable."""
        return self._get_state("hidden", self._hidden)

    @hidden.setter
    def hidden(self, value: np.ndarray) -> None:
        self._set_state("hidden", self._hidden, value)

    @property
    def cell(self) -> np.ndarray:
        """A copy of every layer's cell state, ``(L, N, H)`` (``(L, H)`` unbatched); settable."""
        return self._get_state("cell", self._cell)

    @cell.setter
    def cell(self, value: np.ndarray) -> None:
        self._set_state("cell", self._cell, value)

    def __repr__(self) -> str:
        n = "unbatched" if self._unbatched else f"batch_size={self._batch}"
        return f"<LSTMStream {n} of {self._layer!r}>"

    # ----------------------------------------------------------------------------------
    # Helpers.
    # ----------------------------------------------------------------------------------
    def _step(self, x: Any, out: np.ndarray | None) -> np.ndarray:
        x = as_input("LSTMStream.step(x)", x, self._dtype, self._x_shape, shape_text=self._x_text)
        checked = as_output("LSTMStream.step(out)", out, self._dtype, self._out_shape)
        result = np.empty(self._out_shape, self._dtype) if checked is None else checked
        # (T = 1, N, ·) views: indexing with None never copies, whatever the strides.
        target = result[None, None] if self._unbatched else result[None]
        x3 = x[None, None] if self._unbatched else x[None]
        if not x3.flags.c_contiguous or (out is not None and overlap(x, result)):
            np.copyto(self._x, x3)
            x3 = self._x
        current, following = self._current, 1 - self._current
        layer = self._layer
        weights = self._weights
        # The states, the workspace and the weights are the stepper's own: x and out make the kind.
        key = (array_kind(x3), array_kind(target))
        call = weights.prepared.get(key)
        request = None
        if call is None:
            request = LSTMForwardRequest(
                config=layer._config, weights=weights.packed, x=x3, hidden=self._hidden[current],
                cell=self._cell[current], sequence_lengths=None, output=target,
                hidden_out=self._hidden[following], cell_out=self._cell[following], training=False,
                cache=None, dropout_masks=None, workspace=self._workspace,
                threads=layer.filter_parameters.n_threads)
            if weights.prepared.wanted(key):
                call = weights.prepared.prepare(key, layer.backend, request)
        with layer._threads():
            if call is not None:
                call(x3, self._hidden[current], self._cell[current], target, self._hidden[following],
                     self._cell[following], None, None, self._workspace)
            else:
                assert request is not None
                layer.backend.lstm_forward(request)
        self._current = following  # the workspace is not trimmed: the next step reuses all of it
        return result

    def _get_state(self, name: str, states: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        layer = self._layer
        layer._begin_call(f"stream().{name}")
        try:
            with self._lock:
                copy = states[self._current].copy()
        finally:
            layer._end_call()
        return copy[:, 0] if self._unbatched else copy

    def _set_state(self, name: str, states: tuple[np.ndarray, np.ndarray], value: object) -> None:
        layer = self._layer
        layer._begin_call(f"stream().{name}")
        try:
            where = f"LSTMStream.{name}"
            if value is None:
                raise InvalidParameterError(must_be(where, "an array (reset() returns to the initial states)",
                                                    None))
            checked = layer._check_state(where, value, self._batch, self._unbatched, hidden=name == "hidden")
            assert checked is not None
            with self._lock:
                np.copyto(states[self._current], checked)
        finally:
            layer._end_call()

    def _rows(self, rows: Any) -> np.ndarray | None:
        """The row indices of ``reset(rows)`` (``None``: every row)."""
        if rows is None:
            return None
        where, n = "LSTMStream.reset(rows)", self._batch
        if self._unbatched:
            raise InvalidParameterError(must_be(where, "None for an unbatched stream (it has one row)", rows))
        rule = f"row numbers in [0, {n}) or {n} booleans"
        if isinstance(rows, (bool, np.bool_)):
            raise InvalidParameterError(must_be(where, rule, rows))
        try:
            index = np.asarray(rows)
        except (TypeError, ValueError):
            what = f"a ragged or unreadable {type(rows).__name__}"
            raise InvalidParameterError(must_be(where, rule, what)) from None
        if index.size == 0:
            return np.zeros(0, np.intp)
        if index.dtype == np.bool_:
            if index.shape != (n,):
                raise ShapeError(must_be(where, f"of shape ({n},) when booleans (one per row)",
                                         f"shape {index.shape}"))
            return np.flatnonzero(index)
        if index.dtype.kind not in "iu" or index.ndim > 1:
            raise InvalidParameterError(must_be(where, rule, rows))
        index = index.reshape(-1)
        if index.min() < 0 or index.max() >= n:
            raise InvalidParameterError(must_be(where, rule, index.tolist()))
        return index.astype(np.intp)

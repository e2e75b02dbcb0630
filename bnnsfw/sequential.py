"""A container that chains layers: forward in order, backward in reverse, parameters by name.

::

    model = bf.Sequential(
        bf.LSTMLayer(bf.LSTMParameters.random(input_size=1, hidden_size=32, num_layers=2, seed=0)),
        bf.LastStep(),
        bf.NormalizationLayer(bf.NormalizationParameters(type=bf.NormalizationType.layer(),
                                                         input_shape=(32,))),
        bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=32, output_size=8, seed=1)),
    )
    prediction = model.apply(x, training=True)         # keeps what the backward needs
    grads = model.apply_backward(loss_gradient)         # every layer, in reverse
    optimizer.step(model.parameters(), grads.parameters())

Each element is a layer (:class:`~bnnsfw.LSTMLayer`, :class:`~bnnsfw.NormalizationLayer`,
:class:`~bnnsfw.FullyConnectedLayer`), :class:`LastStep`, :class:`FinalState`, :class:`Softmax` or
:class:`Dropout`. Between them flows one array:
an LSTM passes its ``output`` (every step: "all steps"), :class:`LastStep` keeps the last
step (each sequence's last valid step, given lengths), :class:`FinalState` each direction's final
state, :class:`Softmax` normalizes the last axis, :class:`Dropout` zeros some features in
training, a normalization of per-sample shape ``(C,)`` given a sequence normalizes every step
(each ``(t, n)`` is a sample), and a fully connected layer works on any leading axes. The
container checks at creation that the sizes and dtypes chain. ``sequence_lengths`` given to
:meth:`Sequential.apply` reach every LSTM, :class:`LastStep` and :class:`FinalState`; initial
states reach the LSTMs.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from typing import Any, Literal, NamedTuple, Union, overload

import attrs
import numpy as np

from ._validation import as_input, finite_float, positive_int
from .enums import LearningPhase
from .errors import FilterClosedError, InvalidParameterError, ShapeError, must_be
from .filter import Filter, IncompatibleKeys, load_named_state
from .layers.fully_connected import FullyConnectedGradients, FullyConnectedLayer
from .layers.lstm import LSTMGradients, LSTMLayer
from .layers.normalization import NormalizationGradients, NormalizationLayer

__all__ = ["Dropout", "FinalState", "LastStep", "Sequential", "SequentialGradients", "SequentialOutput",
           "Softmax"]


class LastStep:
    """A :class:`Sequential` element that keeps the last time step of a sequence.

    ``(T, N, F)`` becomes ``(N, F)`` — ``(N, T, F)`` when the LSTM before it is batch-first,
    and an unbatched ``(T, F)`` becomes ``(F,)`` — as ``output[-1]`` does in PyTorch. With
    ``sequence_lengths`` given to :meth:`Sequential.apply` it keeps each sequence's last
    valid step, ``length − 1`` (zeros for a sequence of length 0). Its backward puts the
    gradient at that step and zeros elsewhere. For a bidirectional LSTM the step holds the
    forward direction's final state beside the reverse direction's first step (the state
    after reading that step alone, as the reverse direction starts at the last valid step).
    It has no weights.
    """

    def __repr__(self) -> str:
        return "LastStep()"


class FinalState:
    """A :class:`Sequential` element that keeps each direction's final state of an LSTM's output.

    The forward direction's final state is its output at the last time step; the reverse
    direction of a bidirectional LSTM runs from the last step to the first, so its final state
    is its output at step 0. ``(T, N, 2·H)`` becomes ``(N, 2·H)`` (``(N, T, 2·H)`` when the
    LSTM is batch-first; an unbatched ``(T, 2·H)`` becomes ``(2·H,)``): the last layer's
    ``hidden`` states side by side, what Keras's ``Bidirectional(LSTM(…))`` returns without
    ``return_sequences``. Its backward puts each half of the gradient at its step and zeros
    elsewhere. With ``num_directions=1`` it is :class:`LastStep`. Given ``sequence_lengths``
    (:meth:`Sequential.apply`), the forward direction's final state is each sequence's step
    ``length − 1``, the reverse direction's still step 0 (it starts at the last valid step),
    and a sequence of length 0 gives zeros, as the LSTM's ``hidden`` does.

    Parameters
    ----------
    num_directions : int
        1 or 2, that of the LSTM directly before it (checked when the container is created).
    """

    def __init__(self, num_directions: int = 2) -> None:
        if isinstance(num_directions, bool) or num_directions not in (1, 2):
            raise InvalidParameterError(must_be("FinalState.num_directions", "1 or 2", num_directions))
        self.num_directions = int(num_directions)

    def __repr__(self) -> str:
        return f"FinalState(num_directions={self.num_directions})"


class Softmax:
    """A :class:`Sequential` element: softmax along the last axis, ``exp(x) / Σ exp(x)``.

    Not a per-element activation (each output depends on the whole last axis), so it is an
    element of its own with its own backward, ``dx = y · (dy − Σ dy·y)`` over the last axis.
    A classifier trained with :class:`~bnnsfw.losses.SoftmaxCrossEntropy` ends at the logits
    instead (the loss takes them and applies the softmax itself). It has no weights.
    """

    def __repr__(self) -> str:
        return "Softmax()"



class Dropout:
    """A :class:`Sequential` element that zeros features at random while training.

    Inverted dropout, as ``torch.nn.Dropout`` and ``keras.layers.Dropout``: in a training
    forward each element is zeroed with probability ``rate`` and the kept ones are scaled by
    ``1 / (1 − rate)``, so an inference forward is the identity. The backward uses the mask
    of the training forward. It has no weights.

    Parameters
    ----------
    rate : float in [0, 1)
        The probability of zeroing an element.
    seed : int >= 0, optional
        Seeds the element's own generator (``numpy.random.default_rng(seed)``): the same seed
        draws the same masks. The generator's state travels with a pickled or copied element.
    """

    def __init__(self, rate: float, seed: int | None = None) -> None:
        self._rate = finite_float("Dropout(rate)", rate, low=0.0, high=1.0, high_open=True)
        self._seed = None if seed is None else positive_int("Dropout(seed)", seed, minimum=0)
        self._rng = np.random.default_rng(self._seed)

    @property
    def rate(self) -> float:
        """The probability of zeroing an element in a training forward."""
        return self._rate

    @property
    def seed(self) -> int | None:
        """The seed the element was created with."""
        return self._seed

    def __repr__(self) -> str:
        seed = "" if self._seed is None else f", seed={self._seed}"
        return f"Dropout({self._rate}{seed})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and deep-copy as the rate, the seed and the generator's state (the copy draws
        the masks the original would draw next)."""
        return _dropout, (self._rate, self._seed, self._rng.bit_generator.state)

    def _scale(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A new mask: 0 with probability ``rate``, else ``1 / (1 − rate)``."""
        kept = self._rng.random(shape, dtype=dtype) >= self._rate
        return np.multiply(kept, 1.0 / (1.0 - self._rate), dtype=dtype)


def _dropout(rate: float, seed: int | None, state: dict[str, Any]) -> Dropout:
    element = Dropout(rate, seed)
    element._rng.bit_generator.state = state
    return element


#: What a :class:`Sequential` may hold.
Element = Union[LSTMLayer, NormalizationLayer, FullyConnectedLayer, LastStep, FinalState, Softmax, Dropout]
_LAYERS = (LSTMLayer, NormalizationLayer, FullyConnectedLayer)
#: The elements without weights.
_WEIGHTLESS = (LastStep, FinalState, Softmax, Dropout)
LayerGradients = Union[LSTMGradients, NormalizationGradients, FullyConnectedGradients]


@attrs.frozen(kw_only=True, eq=False)
class SequentialGradients:
    """What :meth:`Sequential.apply_backward` returns.

    Attributes
    ----------
    input : ndarray
        Gradient with respect to the model's input, shaped like it.
    layers : Mapping[str, gradients]
        Each layer's gradients result by the layer's name (elements without weights have
        none).
    hidden, cell : Mapping[str, ndarray]
        The gradients with respect to each LSTM's initial hidden and cell states, by the
        LSTM's name, shaped like the states (given also when the states were zeros); the
        same arrays as ``layers[name].hidden`` and ``layers[name].cell``.
    """

    input: np.ndarray
    layers: Mapping[str, LayerGradients]
    hidden: Mapping[str, np.ndarray] = attrs.field(factory=dict)
    cell: Mapping[str, np.ndarray] = attrs.field(factory=dict)

    def parameters(self) -> dict[str, np.ndarray]:
        """The weight gradients under the names of :meth:`Sequential.parameters`
        (``"<layer name>.<name in the layer>"``)."""
        return {f"{name}.{key}": array for name, grads in self.layers.items()
                for key, array in grads.parameters().items()}


@attrs.frozen(kw_only=True, eq=False)
class SequentialOutput:
    """What :meth:`Sequential.apply` returns with ``return_states=True``.

    Attributes
    ----------
    output : ndarray
        The last element's output (what ``apply`` returns otherwise).
    hidden, cell : Mapping[str, ndarray]
        Each LSTM's final hidden and cell states by the LSTM's name, ``(L·D, N, P)`` and
        ``(L·D, N, H)`` (without N for an unbatched input): the states to start the next
        chunk of a long sequence from.
    """

    output: np.ndarray
    hidden: Mapping[str, np.ndarray]
    cell: Mapping[str, np.ndarray]


#: What reaches a layer or takes state gradients: an array for a model with one LSTM, or a
#: mapping of LSTM name to array.
States = Union[np.ndarray, Mapping[str, Any], None]


class _LSTMRun(NamedTuple):
    """One LSTM's forward in a container: what its backward needs, and its final states."""

    x: Any
    cache: Any
    lengths: np.ndarray | None
    hidden: np.ndarray | None
    cell: np.ndarray | None
    final_hidden: np.ndarray
    final_cell: np.ndarray


@attrs.frozen
class _Route:
    """What the caller gave one element beside the flowing array: lengths, and an LSTM's
    initial states (forward) or the gradients of its final states (backward)."""

    lengths: np.ndarray | None = None
    hidden: np.ndarray | None = None
    cell: np.ndarray | None = None


_NO_ROUTE = _Route()


@attrs.frozen
class _Pending:
    """A training forward kept for the backward."""

    contexts: list[Any]
    shape: tuple[int, ...]
    batch: int
    unbatched: bool


@attrs.frozen
class _Flow:
    """What flows between two elements, as far as the container knows at creation."""

    sequence: bool | None  # None: unknown (the model's input)
    width: int | None      # the feature size, when known
    time_axis: int = 0     # 1 after a batch-first LSTM


class Sequential:
    """Layers applied one after the other, differentiated in reverse, trained by name.

    Parameters
    ----------
    *layers : layer, LastStep, FinalState, Softmax or Dropout
        The elements in order, named ``"0"``, ``"1"``, … Or a single mapping of name to
        element (names without ``"."`` or ``"/"``), e.g. ``{"lstm": …, "last": LastStep(),
        "norm": …, "head": …}``.

    Notes
    -----
    The container owns its layers: :meth:`close` closes them. It keeps the intermediate
    arrays of the last training :meth:`apply` for :meth:`apply_backward` (one forward at a
    time: a container is not for concurrent training from several threads); inference
    forwards in between leave it alone. ``sequence_lengths`` reach every LSTM and
    :class:`LastStep`; initial states reach the LSTMs (an array when the model has one LSTM,
    else a mapping by LSTM name). It pickles and deep-copies with its layers
    (:meth:`__reduce__`), without a pending training forward.

    Examples
    --------
    >>> import numpy as np
    >>> import bnnsfw as bf
    >>> model = bf.Sequential(
    ...     bf.LSTMLayer(bf.LSTMParameters.random(input_size=2, hidden_size=4, seed=0, dtype=np.float64)),
    ...     bf.LastStep(),
    ...     bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=4, output_size=1,
    ...                                                              dtype=np.float64)))
    >>> x = np.ones((5, 3, 2))                        # (T, N, I)
    >>> model.apply(x, training=True).shape
    (3, 1)
    >>> grads = model.apply_backward(np.ones((3, 1)))
    >>> grads.input.shape, sorted(grads.parameters()) == sorted(model.parameters())
    ((5, 3, 2), True)
    >>> model.close()
    """

    def __init__(self, *layers: Element | Mapping[str, Element]) -> None:
        self._closed = True
        named: dict[Any, Any] = (dict(layers[0]) if len(layers) == 1 and isinstance(layers[0], Mapping)
                                 else {str(i): layer for i, layer in enumerate(layers)})
        if not named:
            raise InvalidParameterError(must_be("Sequential(layers)", "at least one layer", "none"))
        for name, element in named.items():
            where = f"Sequential(layers[{name!r}])"
            if not isinstance(name, str) or not name or "." in name or "/" in name:
                raise InvalidParameterError(must_be("Sequential(layers) names", "non-empty names without "
                                                    "'.' or '/'", name))
            if isinstance(element, Mapping):
                raise InvalidParameterError(must_be(where, "a layer (a mapping of them only alone)",
                                                    type(element).__name__))
            if not isinstance(element, (*_LAYERS, *_WEIGHTLESS)):
                rule = ("an LSTMLayer, NormalizationLayer, FullyConnectedLayer, LastStep, FinalState, "
                        "Softmax or Dropout")
                raise InvalidParameterError(must_be(where, rule, type(element).__name__))
            if isinstance(element, Filter) and element.closed:
                raise FilterClosedError(must_be(where, "an open layer", f"a closed {type(element).__name__}"))
            others = [other for other, layer in named.items() if layer is element and other != name]
            if isinstance(element, Filter) and others:
                rule = "a layer of its own (an optimizer would step a shared one twice)"
                raise InvalidParameterError(must_be(where, rule, f"the layer also named {others[0]!r}"))
        self._layers: dict[str, Element] = named
        self._dtype = self._check_chain()
        self._saved: _Pending | None = None
        self._closed = False

    # ----------------------------------------------------------------------------------
    # Description.
    # ----------------------------------------------------------------------------------
    @property
    def layers(self) -> Mapping[str, Element]:
        """The elements by name, in order (read-only)."""
        return types.MappingProxyType(self._layers)

    @property
    def dtype(self) -> np.dtype:
        """The dtype every layer of the container shares."""
        return self._dtype

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    def __iter__(self) -> Iterator[Element]:
        return iter(self._layers.values())

    def __len__(self) -> int:
        return len(self._layers)

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={type(layer).__name__}" for name, layer in self._layers.items())
        return f"<Sequential {parts}{', closed' if self._closed else ''}>"

    # ----------------------------------------------------------------------------------
    # Arrays by name.
    # ----------------------------------------------------------------------------------
    def parameters(self) -> dict[str, np.ndarray]:
        """Every layer's live trainable arrays, named ``"<layer name>.<name in the layer>"``.

        The union of the layers' :meth:`~bnnsfw.Filter.parameters`, in order; updating an
        array in place changes what the next call computes.
        """
        self._check_open("parameters")
        return {f"{name}.{key}": array for name, layer in self._named_layers()
                for key, array in layer.parameters().items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every layer's state, named like :meth:`parameters` (moving statistics too)."""
        self._check_open("state_dict")
        return {f"{name}.{key}": array for name, layer in self._named_layers()
                for key, array in layer.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, object], strict: bool = True) -> IncompatibleKeys:
        """Copy ``state`` into the layers; strict by default, checked entirely before any write.

        See :meth:`bnnsfw.Filter.load_state_dict`; the names are those of :meth:`state_dict`.
        """
        self._check_open("load_state_dict")
        members = [(f"{name}.", layer) for name, layer in self._named_layers()]
        return load_named_state("Sequential", members, state, strict)

    # ----------------------------------------------------------------------------------
    # Forward and backward.
    # ----------------------------------------------------------------------------------
    @overload
    def apply(self, x: Any, training: bool = ..., *, sequence_lengths: Any = ..., hidden: States = ...,
              cell: States = ..., return_states: Literal[False] = ...) -> np.ndarray: ...

    @overload
    def apply(self, x: Any, training: bool = ..., *, sequence_lengths: Any = ..., hidden: States = ...,
              cell: States = ..., return_states: Literal[True]) -> SequentialOutput: ...

    def apply(self, x: Any, training: bool = False, *, sequence_lengths: Any = None, hidden: States = None,
              cell: States = None, return_states: bool = False) -> np.ndarray | SequentialOutput:
        """Run every element in order and return the last one's output.

        Parameters
        ----------
        x : ndarray
            What the first layer takes (an LSTM: ``(T, N, I)``, ``(N, T, I)`` when batch-first,
            or unbatched ``(T, I)``).
        training : bool
            Training forward: LSTMs write their training caches and apply dropout,
            :class:`Dropout` elements draw their masks, normalizations use (and update) batch
            statistics, and the container keeps what :meth:`apply_backward` needs, until the
            next training forward. Otherwise an inference forward, which leaves a kept
            training forward alone.
        sequence_lengths : N integers in [0, T], optional
            Each sequence's length (one integer for an unbatched ``x``), for every LSTM (see
            :meth:`LSTMLayer.apply <bnnsfw.LSTMLayer.apply>`) and every :class:`LastStep`,
            which then keeps each sequence's last valid step. The backward uses them too.
        hidden, cell : array or mapping of LSTM name to array, optional
            Initial states, ``(L·D, N, P)`` and ``(L·D, N, H)`` (without N for an unbatched
            ``x``): an array when the model has one LSTM, else a mapping from LSTM names to
            arrays (an LSTM it leaves out starts from zeros).
        return_states : bool
            Return a :class:`SequentialOutput`, which also holds each LSTM's final states.
        """
        self._check_open("apply")
        if not isinstance(training, (bool, np.bool_)):
            raise InvalidParameterError(must_be("Sequential.apply(training)", "True or False", training))
        routes, batch, unbatched = self._routes(x, sequence_lengths, hidden, cell)
        if training:
            self._saved = None
        contexts: list[Any] = []
        flow = _Flow(sequence=None, width=None)
        for name, layer in self._layers.items():
            x, context, flow = _forward(layer, x, bool(training), flow, routes.get(name, _NO_ROUTE))
            contexts.append(context)
        output = np.asarray(x)
        if training:
            self._saved = _Pending(contexts, output.shape, batch, unbatched)
        if not return_states:
            return output
        runs = {name: run for name, run in zip(self._layers, contexts) if isinstance(run, _LSTMRun)}
        hidden_out = {name: run.final_hidden for name, run in runs.items()}
        cell_out = {name: run.final_cell for name, run in runs.items()}
        return SequentialOutput(output=output, hidden=types.MappingProxyType(hidden_out),
                                cell=types.MappingProxyType(cell_out))

    def __call__(self, x: Any, training: bool = False, *, sequence_lengths: Any = None,
                 hidden: States = None, cell: States = None) -> np.ndarray:
        """``model(x, ...)`` is ``model.apply(x, ...)``: an inference forward (``training=True``:
        the training one), with the same ``sequence_lengths`` and initial states."""
        return self.apply(x, training=training, sequence_lengths=sequence_lengths, hidden=hidden, cell=cell)

    def apply_backward(self, output_gradient: Any, hidden_gradient: States = None,
                       cell_gradient: States = None) -> SequentialGradients:
        """Backpropagate ``output_gradient`` (shaped like the last :meth:`apply` output) through
        every element in reverse, using what the last training :meth:`apply` kept (its
        ``sequence_lengths`` and initial states included).

        Parameters
        ----------
        output_gradient : array like the output, or None
            ``None`` when only the final states carry gradient.
        hidden_gradient, cell_gradient : array or mapping of LSTM name to array, optional
            Gradients with respect to the LSTMs' final states (as :class:`SequentialOutput`
            gives them), in the forms :meth:`apply` takes initial states; zeros when omitted.

        Returns
        -------
        SequentialGradients
            The input gradient, every layer's gradients (``grads.parameters()`` names them
            like :meth:`parameters`) and the gradients of the LSTMs' initial states.
        """
        self._check_open("apply_backward")
        if self._saved is None:
            raise InvalidParameterError(must_be(
                "Sequential.apply_backward()", "called after a training forward, apply(x, training=True)",
                "no training forward yet (a copy has none)"))
        pending = self._saved
        where = "Sequential.apply_backward"
        final_hidden = self._states(f"{where}(hidden_gradient)", hidden_gradient, pending.batch,
                                    pending.unbatched, hidden=True)
        final_cell = self._states(f"{where}(cell_gradient)", cell_gradient, pending.batch, pending.unbatched)
        if output_gradient is None:
            dy = np.zeros(pending.shape, self._dtype)
        else:
            dy = as_input(f"{where}(output_gradient)", output_gradient, self._dtype, pending.shape)
        grads: dict[str, LayerGradients] = {}
        for (name, layer), context in zip(reversed(self._layers.items()), reversed(pending.contexts)):
            route = _Route(hidden=final_hidden.get(name), cell=final_cell.get(name))
            dy, layer_grads = _backward(layer, dy, context, route)
            if layer_grads is not None:
                grads[name] = layer_grads
        ordered = {name: grads[name] for name in self._layers if name in grads}
        lstms = {name: g for name, g in ordered.items() if isinstance(g, LSTMGradients)}
        return SequentialGradients(
            input=np.asarray(dy), layers=types.MappingProxyType(ordered),
            hidden=types.MappingProxyType({name: g.hidden for name, g in lstms.items()}),
            cell=types.MappingProxyType({name: g.cell for name, g in lstms.items()}))

    # ----------------------------------------------------------------------------------
    # What the caller gives beside x: lengths and states, checked before any layer runs.
    # ----------------------------------------------------------------------------------
    def _routes(self, x: Any, lengths: Any, hidden: States,
                cell: States) -> tuple[dict[str, _Route], int, bool]:
        """The lengths and initial states for each element by name, N, and whether ``x`` is
        unbatched (``(T, F)``)."""
        where = "Sequential.apply"
        lstm_names = [name for name, layer in self._layers.items() if isinstance(layer, LSTMLayer)]
        first = self._layers[lstm_names[0]] if lstm_names else None
        time_axis = 1 if isinstance(first, LSTMLayer) and first.layer_parameters.batch_first else 0
        try:
            shape = np.shape(x)
        except ValueError:  # ragged: the first layer says so
            shape = ()
        unbatched = len(shape) == 2
        if len(shape) == 3:
            seq_len, batch = shape[time_axis], shape[1 - time_axis]
        else:
            seq_len, batch = (shape[0] if shape else 0), 1
        given = lengths is not None or hidden is not None or cell is not None
        if given and len(shape) not in (2, 3):
            rule = ("of shape (T, N, F), (N, T, F) when batch-first, or unbatched (T, F) "
                    "with sequence_lengths or states")
            raise ShapeError(must_be(f"{where}(x)", rule, f"shape {tuple(shape)}"))
        checked = self._lengths(f"{where}(sequence_lengths)", lengths, seq_len, batch, unbatched)
        if checked is not None and not lstm_names and not any(
                isinstance(layer, (LastStep, FinalState)) for layer in self._layers.values()):
            raise InvalidParameterError(must_be(f"{where}(sequence_lengths)",
                                                "None for a model without an LSTMLayer or LastStep",
                                                checked.tolist()))
        h0 = self._states(f"{where}(hidden)", hidden, batch, unbatched, hidden=True)
        c0 = self._states(f"{where}(cell)", cell, batch, unbatched)
        routes = {name: _Route(lengths=checked, hidden=h0.get(name), cell=c0.get(name))
                  for name, layer in self._layers.items()
                  if isinstance(layer, (LSTMLayer, LastStep, FinalState))}
        return routes, batch, unbatched

    @staticmethod
    def _lengths(where: str, value: Any, seq_len: int, batch: int, unbatched: bool) -> np.ndarray | None:
        """The lengths as N int64 values in [0, T] (N = 1 for an unbatched ``x``)."""
        if value is None:
            return None
        lengths = np.asarray(value)
        if unbatched and lengths.ndim == 0:
            lengths = lengths.reshape(1)
        if lengths.shape != (batch,):
            text = "one integer for an unbatched x" if unbatched else "one length per sequence"
            raise ShapeError(must_be(where, f"of shape ({batch},) ({text})", f"shape {tuple(lengths.shape)}"))
        if lengths.dtype.kind not in "iu":
            raise InvalidParameterError(must_be(where, "integers", lengths.dtype.name))
        if np.any(lengths < 0) or np.any(lengths > seq_len):
            rule = f"in [0, {seq_len}] (T = {seq_len})"
            raise InvalidParameterError(must_be(where, rule, lengths.tolist()))
        return lengths.astype(np.int64)

    def _states(self, where: str, value: States, batch: int, unbatched: bool, *,
                hidden: bool = False) -> dict[str, np.ndarray]:
        """States (or their gradients) by LSTM name, each checked against its LSTM: an array
        for a model with one LSTM, or a mapping of LSTM name to array."""
        if value is None:
            return {}
        lstms = {name: layer for name, layer in self._layers.items() if isinstance(layer, LSTMLayer)}
        if isinstance(value, Mapping):
            unknown = [name for name in value if name not in lstms]
            if unknown:
                rule = f"names of the model's LSTMs {list(lstms)}"
                raise InvalidParameterError(must_be(f"{where} names", rule, unknown))
            named = {name: (f"{where[:-1]}[{name!r}])", array) for name, array in value.items()
                     if array is not None}
        elif len(lstms) == 1:
            named = {next(iter(lstms)): (where, value)}
        else:
            rule = f"a mapping of LSTM name ({list(lstms)}) to array for a model with {len(lstms)} LSTMs"
            raise InvalidParameterError(must_be(where, rule, type(value).__name__))
        checked = {}
        for name, (place, array) in named.items():
            p = lstms[name].layer_parameters
            size, letter = (p.output_size, "P") if hidden else (p.hidden_size, "H")
            size_ld = p.num_layers * p.num_directions
            shape = (size_ld, size) if unbatched else (size_ld, batch, size)
            text = (f"(L·D, {letter}) = {shape} for an unbatched x" if unbatched
                    else f"(L·D, N, {letter}) = {shape}")
            checked[name] = as_input(place, array, self._dtype, shape, shape_text=text)
        return checked

    # ----------------------------------------------------------------------------------
    # Lifecycle.
    # ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every layer and forget the saved forward. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._saved = None
        for layer in self._layers.values():
            if isinstance(layer, Filter):
                layer.close()

    def __enter__(self) -> "Sequential":
        self._check_open("__enter__")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def check_open(self, method: str) -> None:
        """Raise :class:`~bnnsfw.FilterClosedError` naming ``method`` if the container or one of its
        layers is closed (as :meth:`bnnsfw.Filter.check_open` does for a layer)."""
        if self._closed:
            raise FilterClosedError(f"Sequential.{method}() was called after close(); "
                                    "create a new Sequential (and its layers) to compute again.")
        for name, layer in self._named_layers():
            if layer.closed:
                raise FilterClosedError(f"Sequential.{method}(): the layer {name!r} was closed; "
                                        "a container needs all of its layers open.")

    #: The spelling the container uses inside its own methods.
    _check_open = check_open

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and deep-copy the container as its elements by name, made again with
        ``Sequential(layers)`` (each layer as :meth:`bnnsfw.Filter.__reduce__` says).

        A training forward kept for :meth:`apply_backward` does not travel: the copy has no
        pending step (its ``apply_backward`` asks for a training forward first), and the
        original's backward still works. Every layer must be open
        (:class:`~bnnsfw.FilterClosedError` otherwise).
        """
        if self._closed:
            raise FilterClosedError("Sequential was closed: close() closed its layers, so it cannot be "
                                    "pickled or copied; pickle or copy the Sequential before closing it.")
        for name, layer in self._named_layers():
            if layer.closed:
                raise FilterClosedError(f"Sequential: the layer {name!r} was closed, so the container "
                                        "cannot be pickled or copied; a container travels with all of its "
                                        "layers open.")
        return Sequential, (dict(self._layers),)

    def _named_layers(self) -> Iterator[tuple[str, Filter]]:
        for name, layer in self._layers.items():
            if isinstance(layer, Filter):
                yield name, layer

    # ----------------------------------------------------------------------------------
    # Checks at creation.
    # ----------------------------------------------------------------------------------
    def _check_chain(self) -> np.dtype:
        """The sizes and dtypes chain from one element to the next; returns the shared dtype."""
        dtypes = {name: layer.layer_parameters.dtype for name, layer in self._layers.items()
                  if isinstance(layer, _LAYERS)}
        if not dtypes:
            raise InvalidParameterError(must_be("Sequential(layers)", "at least one layer with weights",
                                                "only elements without weights"))
        if len(set(dtypes.values())) > 1:
            listed = ", ".join(f"{name}: {dtype.name}" for name, dtype in dtypes.items())
            raise InvalidParameterError(must_be("Sequential(layers)", "layers of one dtype", listed))
        flow = _Flow(sequence=None, width=None)
        previous = "the input"
        for name, layer in self._layers.items():
            flow = _next_flow(f"Sequential(layers[{name!r}])", previous, layer, flow)
            previous = f"layer {name!r}"
        _check_final_states(self._layers)
        return next(iter(dtypes.values()))


def _check_final_states(layers: Mapping[str, Element]) -> None:
    """A FinalState directly follows a forward-running LSTM of its number of directions."""
    before: Element | None = None
    for name, layer in layers.items():
        if isinstance(layer, FinalState):
            where = f"Sequential(layers[{name!r}])"
            if not isinstance(before, LSTMLayer):
                got = "the input" if before is None else f"a {type(before).__name__}"
                raise InvalidParameterError(must_be(where, "a FinalState directly after an LSTMLayer", got))
            p = before.layer_parameters
            if p.reverse:
                rule = "after a forward-running LSTM (a reverse LSTM's final state is its output at step 0)"
                raise InvalidParameterError(must_be(where, rule, "reverse=True"))
            if p.num_directions != layer.num_directions:
                rule = f"a FinalState(num_directions={p.num_directions}), as the LSTM before it"
                raise InvalidParameterError(must_be(where, rule, layer.num_directions))
        before = layer


def _next_flow(where: str, previous: str, layer: Element, flow: _Flow) -> _Flow:
    """What leaves ``layer`` given what reaches it; refuses what cannot chain."""
    def need_width(expected: int, what: str) -> None:
        if flow.width is not None and flow.width != expected:
            rule = f"{what} equal to what {previous} gives ({flow.width})"
            raise ShapeError(must_be(where, rule, expected))

    if isinstance(layer, LSTMLayer):
        p = layer.layer_parameters
        if flow.sequence is False:
            rule = "given a sequence (not after a LastStep)"
            raise InvalidParameterError(must_be(where, rule, "an LSTMLayer"))
        need_width(p.input_size, "an input_size")
        width = p.num_directions * p.hidden_size
        return _Flow(sequence=True, width=width, time_axis=1 if p.batch_first else 0)
    if isinstance(layer, LastStep):
        if flow.sequence is False:
            raise InvalidParameterError(must_be(where, "given a sequence", "a LastStep after the time axis "
                                                "was already removed"))
        return _Flow(sequence=False, width=flow.width)
    if isinstance(layer, FinalState):
        if flow.sequence is False:
            raise InvalidParameterError(must_be(where, "given a sequence", "a FinalState after the time axis "
                                                "was already removed"))
        return _Flow(sequence=False, width=flow.width)
    if isinstance(layer, (Softmax, Dropout)):
        return flow
    if isinstance(layer, NormalizationLayer):
        shape = layer.input_shape
        if flow.width is not None:
            if len(shape) != 1:
                raise ShapeError(must_be(where, f"a normalization of input_shape ({flow.width},), the "
                                         f"features {previous} gives", f"input_shape {shape}"))
            need_width(layer.layer_parameters.channels, "a channel count")
        return _Flow(sequence=flow.sequence, width=shape[0] if len(shape) == 1 else None,
                     time_axis=flow.time_axis)
    assert isinstance(layer, FullyConnectedLayer)
    need_width(layer.input_size, "an input_size")
    return _Flow(sequence=flow.sequence, width=layer.output_size, time_axis=flow.time_axis)


# --------------------------------------------------------------------------------------
# One element forward and backward. The context is what the backward needs.
# --------------------------------------------------------------------------------------
def _forward(layer: Element, x: Any, training: bool, flow: _Flow, route: _Route) -> tuple[Any, Any, _Flow]:
    if isinstance(layer, LSTMLayer):
        p = layer.layer_parameters
        out = layer.apply(x, route.hidden, route.cell, route.lengths, training=training)
        run = _LSTMRun(x, out.training_cache, route.lengths, route.hidden, route.cell, out.hidden, out.cell)
        return out.output, run, _Flow(sequence=True, width=None, time_axis=1 if p.batch_first else 0)
    if isinstance(layer, LastStep):
        array = np.asarray(x)
        if route.lengths is not None:
            return _valid_steps(array, route.lengths, flow)
        if array.ndim == 2 or flow.time_axis == 0:  # unbatched (T, F), or time-major (T, N, F)
            last = array[-1]
            index: Any = -1
        else:
            last = array[:, -1]
            index = (slice(None), -1)
        context = (array.shape, array.dtype, index, None)
        return np.ascontiguousarray(last), context, _Flow(sequence=False, width=None)
    if isinstance(layer, FinalState):
        array = np.asarray(x)
        axis = 0 if array.ndim == 2 or flow.time_axis == 0 else 1
        # Given lengths, an unbatched (T, F) is a batch of one.
        rows = array[:, None] if array.ndim == 2 and route.lengths is not None else array
        indexes, valid = _final_state_indexes(rows.shape, axis, layer.num_directions, route.lengths)
        final = np.concatenate([rows[index] for index in indexes], axis=-1)
        if valid is not None:  # a sequence of length 0 has no state but the zeros it started from
            final = np.where(valid[:, None], final, 0.0).astype(array.dtype, copy=False)
        kept = (array.shape, rows.shape, array.dtype, indexes, valid)
        return (final[0] if rows is not array else final), kept, _Flow(sequence=False, width=None)
    if isinstance(layer, Softmax):
        array = np.asarray(x)
        shifted = np.exp(array - array.max(axis=-1, keepdims=True))
        y = shifted / shifted.sum(axis=-1, keepdims=True)
        return y, y, flow
    if isinstance(layer, Dropout):
        if not training or layer.rate == 0.0:
            return x, None, flow
        array = np.asarray(x)
        scale = layer._scale(array.shape, array.dtype)
        return array * scale, scale, flow
    if isinstance(layer, NormalizationLayer):
        array = np.asarray(x)
        rank = len(layer.input_shape)
        flat = array.reshape(-1, *array.shape[2:]) if array.ndim == rank + 2 else array
        phase = LearningPhase.training if training else LearningPhase.inference
        y = layer.apply(flat, phase=phase)
        return y.reshape(array.shape), (flat, y, phase), flow
    y = layer.apply(x)
    return y, (x, y), flow


def _backward(layer: Element, dy: Any, context: Any, route: _Route) -> tuple[Any, LayerGradients | None]:
    if isinstance(layer, LSTMLayer):
        run = context
        lstm_grads = layer.apply_backward(run.x, dy, hidden=run.hidden, cell=run.cell,
                                          hidden_gradient=route.hidden, cell_gradient=route.cell,
                                          sequence_lengths=run.lengths, training_cache=run.cache)
        return lstm_grads.input, lstm_grads
    if isinstance(layer, LastStep):
        shape, dtype, index, valid = context
        dx = np.zeros(shape, dtype)
        if valid is None:
            dx[index] = dy
        else:  # each sequence's last valid step; nothing reaches a sequence of length 0
            rows = dx if len(shape) == 3 else dx[:, None]
            rows[index] = np.where(valid[:, None], np.reshape(dy, (len(valid), -1)), 0.0)
        return dx, None
    if isinstance(layer, FinalState):
        shape, rows_shape, dtype, indexes, valid = context
        dx = np.zeros(rows_shape, dtype)
        parts = np.split(np.reshape(dy, (-1, shape[-1]) if rows_shape != shape else np.shape(dy)),
                         len(indexes), axis=-1)
        for index, part in zip(indexes, parts):
            dx[index] = part if valid is None else np.where(valid[:, None], part, 0.0)
        return dx.reshape(shape), None
    if isinstance(layer, Softmax):
        y = context
        dy = np.asarray(dy)
        return y * (dy - (dy * y).sum(axis=-1, keepdims=True)), None
    if isinstance(layer, Dropout):
        return (dy if context is None else dy * context), None
    if isinstance(layer, NormalizationLayer):
        flat, y, phase = context
        array = np.asarray(dy)
        norm_grads = layer.apply_backward(flat, array.reshape(flat.shape), output=y, phase=phase)
        return norm_grads.input.reshape(array.shape), norm_grads
    x, y = context
    dense_grads = layer.apply_backward(x, dy, output=y)
    return dense_grads.input, dense_grads


def _final_state_indexes(shape: tuple[int, ...], time_axis: int, num_directions: int,
                         lengths: np.ndarray | None) -> tuple[list[Any], np.ndarray | None]:
    """Where each direction's final state sits in an LSTM output of ``shape``: the last step
    (each sequence's step ``length − 1``, given lengths) of the first ``H`` features, then step
    0 of the reverse direction's ``H``; and which sequences have any step (None: all)."""
    h = shape[-1] // num_directions
    lead: tuple[slice, ...] = (slice(None),) * time_axis
    if lengths is None:
        indexes: list[Any] = [(*lead, -1, Ellipsis, slice(0, h))]
        valid = None
    else:
        last, valid = _last_valid_steps(lengths, time_axis)
        indexes = [(*last, slice(0, h))]
    if num_directions == 2:
        indexes.append((*lead, 0, Ellipsis, slice(h, 2 * h)))
    return indexes, valid


def _last_valid_steps(lengths: np.ndarray, time_axis: int) -> tuple[tuple[Any, Any], np.ndarray]:
    """Each sequence's step ``length − 1`` as an index of the (time, batch) axes in the order
    ``time_axis`` gives (step 0 for a sequence of length 0), and which sequences have a step."""
    steps, batch = np.maximum(lengths - 1, 0), np.arange(len(lengths))
    return ((steps, batch) if time_axis == 0 else (batch, steps)), lengths > 0


def _valid_steps(array: np.ndarray, lengths: np.ndarray, flow: _Flow) -> tuple[np.ndarray, Any, _Flow]:
    """:class:`LastStep` with lengths: each sequence's step ``length − 1`` (zeros for a
    sequence of length 0), from ``(T, N, F)``, ``(N, T, F)`` or an unbatched ``(T, F)``."""
    if array.ndim not in (2, 3):
        raise ShapeError(must_be("LastStep with sequence_lengths", "given (T, N, F), (N, T, F) or (T, F)",
                                 f"shape {array.shape}"))
    rows = array if array.ndim == 3 else array[:, None]  # an unbatched sequence as a batch of one
    time_axis = 0 if array.ndim == 2 else flow.time_axis
    if rows.shape[1 - time_axis] != len(lengths) or lengths.max(initial=0) > rows.shape[time_axis]:
        rule = f"given {len(lengths)} sequences of at least {lengths.max(initial=0)} steps (the lengths)"
        raise ShapeError(must_be("LastStep with sequence_lengths", rule, f"shape {array.shape}"))
    index, valid = _last_valid_steps(lengths, time_axis)
    last = np.where(valid[:, None], rows[index], 0.0).astype(array.dtype, copy=False)
    context = (array.shape, array.dtype, index, valid)
    return (last if array.ndim == 3 else last[0]), context, _Flow(sequence=False, width=None)

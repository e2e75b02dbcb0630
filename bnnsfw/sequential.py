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
:class:`~bnnsfw.FullyConnectedLayer`), :class:`LastStep`, :class:`FinalState` or
:class:`Softmax`. Between them flows one array:
an LSTM passes its ``output`` (every step: "all steps"), :class:`LastStep` keeps the last
step, :class:`FinalState` each direction's final state, :class:`Softmax` normalizes the last
axis, a normalization of per-sample shape ``(C,)`` given a sequence normalizes every step
(each ``(t, n)`` is a sample), and a fully connected layer works on any leading axes. The
container checks at creation that the sizes and dtypes chain.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from typing import Any, Union

import attrs
import numpy as np

from ._validation import as_input
from .enums import LearningPhase
from .errors import FilterClosedError, InvalidParameterError, ShapeError, must_be
from .filter import Filter, IncompatibleKeys, load_named_state
from .layers.fully_connected import FullyConnectedGradients, FullyConnectedLayer
from .layers.lstm import LSTMGradients, LSTMLayer
from .layers.normalization import NormalizationGradients, NormalizationLayer

__all__ = ["FinalState", "LastStep", "Sequential", "SequentialGradients", "Softmax"]


class LastStep:
    """A :class:`Sequential` element that keeps the last time step of a sequence.

    ``(T, N, F)`` becomes ``(N, F)`` — ``(N, T, F)`` when the LSTM before it is batch-first,
    and an unbatched ``(T, F)`` becomes ``(F,)`` — as ``output[-1]`` does in PyTorch. Its
    backward puts the gradient at that step and zeros elsewhere. For a bidirectional LSTM the
    last step holds the forward direction's final state beside the reverse direction's first.
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
    elsewhere. With ``num_directions=1`` it is :class:`LastStep`.

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


#: What a :class:`Sequential` may hold.
Element = Union[LSTMLayer, NormalizationLayer, FullyConnectedLayer, LastStep, FinalState, Softmax]
_LAYERS = (LSTMLayer, NormalizationLayer, FullyConnectedLayer)
#: The elements without weights.
_WEIGHTLESS = (LastStep, FinalState, Softmax)
LayerGradients = Union[LSTMGradients, NormalizationGradients, FullyConnectedGradients]


@attrs.frozen(kw_only=True, eq=False)
class SequentialGradients:
    """What :meth:`Sequential.apply_backward` returns.

    Attributes
    ----------
    input : ndarray
        Gradient with respect to the model's input, shaped like it.
    layers : Mapping[str, gradients]
        Each layer's gradients result by the layer's name (:class:`LastStep` elements have
        none).
    """

    input: np.ndarray
    layers: Mapping[str, LayerGradients]

    def parameters(self) -> dict[str, np.ndarray]:
        """The weight gradients under the names of :meth:`Sequential.parameters`
        (``"<layer name>.<name in the layer>"``)."""
        return {f"{name}.{key}": array for name, grads in self.layers.items()
                for key, array in grads.parameters().items()}


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
    *layers : layer or LastStep
        The elements in order, named ``"0"``, ``"1"``, … Or a single mapping of name to
        element (names without ``"."`` or ``"/"``), e.g. ``{"lstm": …, "last": LastStep(),
        "norm": …, "head": …}``.

    Notes
    -----
    The container owns its layers: :meth:`close` closes them. It keeps the intermediate
    arrays of the last training :meth:`apply` for :meth:`apply_backward` (one forward at a
    time: a container is not for concurrent training from several threads); inference
    forwards in between leave it alone. LSTMs inside
    start from zero states and take full-length sequences; for initial states or
    ``sequence_lengths`` use the layers directly. It pickles and deep-copies with its layers
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
                rule = ("an LSTMLayer, NormalizationLayer, FullyConnectedLayer, LastStep, FinalState "
                        "or Softmax")
                raise InvalidParameterError(must_be(where, rule, type(element).__name__))
            if isinstance(element, Filter) and element.closed:
                raise FilterClosedError(must_be(where, "an open layer", f"a closed {type(element).__name__}"))
            others = [other for other, layer in named.items() if layer is element and other != name]
            if isinstance(element, Filter) and others:
                rule = "a layer of its own (an optimizer would step a shared one twice)"
                raise InvalidParameterError(must_be(where, rule, f"the layer also named {others[0]!r}"))
        self._layers: dict[str, Element] = named
        self._dtype = self._check_chain()
        self._saved: tuple[list[Any], tuple[int, ...]] | None = None  # contexts, output shape
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
    def apply(self, x: Any, training: bool = False) -> np.ndarray:
        """Run every element in order and return the last one's output.

        Parameters
        ----------
        x : ndarray
            What the first layer takes (an LSTM: ``(T, N, I)``, ``(N, T, I)`` when batch-first,
            or unbatched ``(T, I)``).
        training : bool
            Training forward: LSTMs write their training caches and apply dropout,
            normalizations use (and update) batch statistics, and the container keeps what
            :meth:`apply_backward` needs, until the next training forward. Otherwise an
            inference forward, which leaves a kept training forward alone.
        """
        self._check_open("apply")
        if not isinstance(training, (bool, np.bool_)):
            raise InvalidParameterError(must_be("Sequential.apply(training)", "True or False", training))
        if training:
            self._saved = None
        contexts: list[Any] = []
        flow = _Flow(sequence=None, width=None)
        for layer in self._layers.values():
            x, context, flow = _forward(layer, x, bool(training), flow)
            contexts.append(context)
        output = np.asarray(x)
        if training:
            self._saved = (contexts, output.shape)
        return output

    def __call__(self, x: Any) -> np.ndarray:
        """``model(x)`` is ``model.apply(x)``: an inference forward."""
        return self.apply(x)

    def apply_backward(self, output_gradient: Any) -> SequentialGradients:
        """Backpropagate ``output_gradient`` (shaped like the last :meth:`apply` output) through
        every element in reverse, using what the last training :meth:`apply` kept.

        Returns the input gradient and every layer's gradients; ``grads.parameters()`` names
        them like :meth:`parameters`.
        """
        self._check_open("apply_backward")
        if self._saved is None:
            raise InvalidParameterError(must_be(
                "Sequential.apply_backward()", "called after a training forward, apply(x, training=True)",
                "no training forward yet (a copy has none)"))
        contexts, shape = self._saved
        dy = as_input("Sequential.apply_backward(output_gradient)", output_gradient, self._dtype, shape)
        grads: dict[str, LayerGradients] = {}
        for (name, layer), context in zip(reversed(self._layers.items()), reversed(contexts)):
            dy, layer_grads = _backward(layer, dy, context)
            if layer_grads is not None:
                grads[name] = layer_grads
        ordered = {name: grads[name] for name in self._layers if name in grads}
        return SequentialGradients(input=np.asarray(dy), layers=types.MappingProxyType(ordered))

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
                  if not isinstance(layer, _WEIGHTLESS)}
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
    if isinstance(layer, Softmax):
        return flow
    if isinstance(layer, NormalizationLayer):
        shape = layer.input_shape
        if flow.width is not None:
            if len(shape) != 1:
                raise ShapeError(must_be(where, f"a normalization of input_shape ({flow.width},), the "
                                         f"features {previous} gives", f"input_shape {shape}"))
            need_width(shape[0], "a channel count")
        return _Flow(sequence=flow.sequence, width=shape[0] if len(shape) == 1 else None,
                     time_axis=flow.time_axis)
    assert isinstance(layer, FullyConnectedLayer)
    need_width(layer.input_size, "an input_size")
    return _Flow(sequence=flow.sequence, width=layer.output_size, time_axis=flow.time_axis)


# --------------------------------------------------------------------------------------
# One element forward and backward. The context is what the backward needs.
# --------------------------------------------------------------------------------------
def _forward(layer: Element, x: Any, training: bool, flow: _Flow) -> tuple[Any, Any, _Flow]:
    if isinstance(layer, LSTMLayer):
        p = layer.layer_parameters
        out = layer.apply(x, training=training)
        return out.output, (x, out.training_cache), _Flow(sequence=True, width=None,
                                                          time_axis=1 if p.batch_first else 0)
    if isinstance(layer, LastStep):
        array = np.asarray(x)
        if array.ndim == 2 or flow.time_axis == 0:  # unbatched (T, F), or time-major (T, N, F)
            last = array[-1]
            index: Any = -1
        else:
            last = array[:, -1]
            index = (slice(None), -1)
        context = (array.shape, array.dtype, index)
        return np.ascontiguousarray(last), context, _Flow(sequence=False, width=None)
    if isinstance(layer, FinalState):
        array = np.asarray(x)
        axis = 0 if array.ndim == 2 or flow.time_axis == 0 else 1
        indexes = _final_state_indexes(array.shape, axis, layer.num_directions)
        final = np.concatenate([array[index] for index in indexes], axis=-1)
        return final, (array.shape, array.dtype, indexes), _Flow(sequence=False, width=None)
    if isinstance(layer, Softmax):
        array = np.asarray(x)
        shifted = np.exp(array - array.max(axis=-1, keepdims=True))
        y = shifted / shifted.sum(axis=-1, keepdims=True)
        return y, y, flow
    if isinstance(layer, NormalizationLayer):
        array = np.asarray(x)
        rank = len(layer.input_shape)
        flat = array.reshape(-1, *layer.input_shape) if array.ndim == rank + 2 else array
        phase = LearningPhase.training if training else LearningPhase.inference
        y = layer.apply(flat, phase=phase)
        return y.reshape(array.shape), (flat, y, phase), flow
    y = layer.apply(x)
    return y, (x, y), flow


def _backward(layer: Element, dy: Any, context: Any) -> tuple[Any, LayerGradients | None]:
    if isinstance(layer, LSTMLayer):
        x, cache = context
        lstm_grads = layer.apply_backward(x, dy, training_cache=cache)
        return lstm_grads.input, lstm_grads
    if isinstance(layer, LastStep):
        shape, dtype, index = context
        dx = np.zeros(shape, dtype)
        dx[index] = dy
        return dx, None
    if isinstance(layer, FinalState):
        shape, dtype, indexes = context
        dx = np.zeros(shape, dtype)
        for index, part in zip(indexes, np.split(np.asarray(dy), len(indexes), axis=-1)):
            dx[index] = part
        return dx, None
    if isinstance(layer, Softmax):
        y = context
        dy = np.asarray(dy)
        return y * (dy - (dy * y).sum(axis=-1, keepdims=True)), None
    if isinstance(layer, NormalizationLayer):
        flat, y, phase = context
        array = np.asarray(dy)
        norm_grads = layer.apply_backward(flat, array.reshape(flat.shape), output=y, phase=phase)
        return norm_grads.input.reshape(array.shape), norm_grads
    x, y = context
    dense_grads = layer.apply_backward(x, dy, output=y)
    return dense_grads.input, dense_grads


def _final_state_indexes(shape: tuple[int, ...], time_axis: int, num_directions: int) -> list[Any]:
    """Where each direction's final state sits in an LSTM output of ``shape``: the last step
    of the first ``H`` features, then step 0 of the reverse direction's ``H``."""
    h = shape[-1] // num_directions
    lead: tuple[slice, ...] = (slice(None),) * time_axis
    indexes: list[Any] = [(*lead, -1, Ellipsis, slice(0, h))]
    if num_directions == 2:
        indexes.append((*lead, 0, Ellipsis, slice(h, 2 * h)))
    return indexes

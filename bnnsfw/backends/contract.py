"""The backend contract: every operation a layer asks of a compute backend.

A backend is any object with a ``name`` and the seven operations listed in
:data:`OPERATIONS`. Each operation takes **one** frozen request object and returns one
result object; layers call nothing else and never look inside a backend. A new option of
a layer (a clip value, a projection) becomes a new field of a request, not a new argument.

==========================  =======================================  =======================================
operation                   request                                  result
==========================  =======================================  =======================================
``gemm``                    :class:`GemmRequest`                     :class:`GemmResult`
``lstm_pack_weights``       :class:`LSTMPackRequest`                 :class:`LSTMPackedWeights`
``lstm_cache_layout``       :class:`LSTMCacheRequest`                :class:`LSTMCacheLayout`
``lstm_forward``            :class:`LSTMForwardRequest`              :class:`LSTMForwardResult`
``lstm_backward``           :class:`LSTMBackwardRequest`             :class:`LSTMBackwardResult`
``normalization_forward``   :class:`NormalizationForwardRequest`     :class:`NormalizationForwardResult`
``normalization_backward``  :class:`NormalizationBackwardRequest`    :class:`NormalizationBackwardResult`
==========================  =======================================  =======================================

What the layer guarantees in every request: arrays have the layer's dtype (float32 or
float64) and the documented shapes; inputs are never to be modified; outputs are
writable, do not overlap inputs unless a field says so; the LSTM training cache is aligned
to the dtype's item size. What a backend guarantees: it writes only the outputs and
workspace arrays it is given, agrees with the reference backend (``numpy``) within
:data:`TOLERANCE` for the dtype, and gives bitwise the same results for the same inputs on
the same machine and thread count.

One operation is optional (:data:`OPTIONAL_OPERATIONS`): ``lstm_prepare_forward`` takes an
:class:`LSTMForwardRequest` as a template and returns an :class:`LSTMForwardCall`, the same
forward made ready for every request of that kind (or ``None``). A layer that calls with
the same shapes again and again (one step at a time) then pays the backend's choices once;
a backend without it is called through ``lstm_forward`` as before.

``docs/backends.md`` is the guide for backend authors; :func:`bnnsfw.testing.check_backend`
checks a backend against the reference.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any, Mapping, Protocol

import attrs
import numpy as np

from ..activation import Activation
from ..errors import BackendError, InvalidParameterError, ShapeError, must_be

__all__ = [
    "Backend",
    "OPERATIONS",
    "OPTIONAL_OPERATIONS",
    "TOLERANCE",
    "Workspace",
    "contract_problems",
    "check_contract",
    "GemmRequest",
    "GemmResult",
    "LSTMConfig",
    "LSTMGateArrays",
    "LSTMLayerNormArrays",
    "LSTMPackRequest",
    "LSTMPackedWeights",
    "LSTMCacheRequest",
    "LSTMCacheLayout",
    "LSTMForwardRequest",
    "LSTMForwardResult",
    "LSTMForwardCall",
    "call_prepared",
    "LSTMGradientBuffers",
    "LSTMBackwardRequest",
    "LSTMBackwardResult",
    "NormalizationForwardRequest",
    "NormalizationForwardResult",
    "NormalizationBackwardRequest",
    "NormalizationBackwardResult",
]

Array = np.ndarray

#: How far two backends may disagree, per dtype: ``(rtol, atol)`` for
#: ``numpy.testing.assert_allclose`` on every output and gradient of every layer.
#: Different code paths round differently (BLAS blocking, fused or split operations, the
#: order of a sum); on the conformance configurations the built-in backends stay below a
#: tenth of these bounds.
TOLERANCE: Mapping[np.dtype, tuple[float, float]] = {
    np.dtype(np.float32): (2e-4, 2e-5),
    np.dtype(np.float64): (1e-9, 1e-11),
}


class Workspace(Protocol):
    """Scratch memory a backend may borrow for one call: named arrays, reused across calls.

    The same name returns the same memory on later calls (grown when too small), so a
    backend must not keep a name's contents across calls, nor use one name for two arrays
    that are alive at once.
    """

    def array(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        """A C-contiguous array of ``shape`` and ``dtype`` (uninitialised)."""
        ...

    def bytes(self, name: str, nbytes: int) -> Array:
        """A 1-D ``uint8`` array of ``nbytes`` bytes (uninitialised)."""
        ...


# --------------------------------------------------------------------------------------
# The matrix product.
# --------------------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class GemmRequest:
    """``out = alpha · op(a) @ op(b) + beta · out`` on 2-D arrays of one float dtype.

    ``op(m)`` is ``m.T`` when the matching ``trans_`` flag is set. With ``out=None`` the
    backend returns a new C-contiguous array and ``beta`` must be 0. Operands may have any
    strides; ``out`` may too. The shapes are checked when the request is made.
    """

    a: Array
    b: Array
    out: Array | None = None
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 0.0

    def __attrs_post_init__(self) -> None:
        self.dimensions()

    def dimensions(self) -> tuple[int, int, int]:
        """``(m, n, k)``: ``op(a)`` is ``(m, k)``, ``op(b)`` is ``(k, n)``."""
        a, b = self.a, self.b
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.ndim != 2 or b.ndim != 2:
            raise ShapeError(must_be("gemm(a, b)", "2-D arrays", (np.shape(a), np.shape(b))))
        m, k = (a.shape[1], a.shape[0]) if self.trans_a else a.shape
        kb, n = (b.shape[1], b.shape[0]) if self.trans_b else b.shape
        if k != kb:
            raise ShapeError(must_be("gemm(a, b)", "operands with matching inner dimensions",
                                     f"op(a) {(m, k)} and op(b) {(kb, n)}"))
        if self.out is None:
            if self.beta != 0.0:
                raise InvalidParameterError(must_be("gemm(beta)", "0 when out is None", self.beta))
        elif self.out.shape != (m, n):
            raise ShapeError(must_be("gemm(out)", f"of shape {(m, n)}", self.out.shape))
        return m, n, k


@attrs.frozen
class GemmResult:
    """The product: ``request.out`` when one was given, else a new array."""

    out: Array


# --------------------------------------------------------------------------------------
# LSTM.
# --------------------------------------------------------------------------------------
#: The activations of one direction: input, forget, candidate and output gate, then ``act_h``.
DirectionActivations = tuple[Activation, Activation, Activation, Activation, Activation]


@attrs.frozen(kw_only=True)
class LSTMConfig:
    """The shape of an LSTM stack and its cell, fixed when the layer is created.

    Gates are in the public order input, forget, candidate, output (SPEC §4); every
    activation is the one really used (defaults applied). ``peepholes`` gives each gate's
    kind: ``None``, ``"full"`` (an ``(H, H)`` matrix per layer and direction) or
    ``"diagonal"`` (an ``(H,)`` vector). ``dropout`` is the probability of the inverted
    dropout between layers (0 when the stack has one layer or no dropout).

    The fields after ``dropout`` are the variants of SPEC §4.1, each off by default (then
    the cell is BNNS's): ``reverse`` (one direction reading the sequence backwards),
    ``direction_activations`` (one set of five activations per direction, given only when
    the directions differ; ``gate_activations`` and ``hidden_activation`` are then those of
    direction 0), ``clip`` (ONNX: every activation input clamped to [−clip, clip]),
    ``cell_clip`` (the carried cell clamped), ``projection_clip`` (the projected hidden state
    clamped), ``input_forget`` (f = 1 − i), ``projection_size`` (P: h = W_hr (o ⊙ act_h(c)))
    and ``layer_norm`` with ``layer_norm_epsilon`` (the layer-normalized cell). A backend
    that does not know a variant must not serve a configuration that uses it:
    :attr:`variants` names the ones in use.
    """

    input_size: int
    hidden_size: int
    num_layers: int
    num_directions: int
    dtype: np.dtype = attrs.field(converter=np.dtype)
    gate_activations: tuple[Activation, Activation, Activation, Activation]
    hidden_activation: Activation
    peepholes: tuple[str | None, str | None, str | None, str | None]
    dropout: float = 0.0
    reverse: bool = False
    direction_activations: tuple[DirectionActivations, ...] | None = None
    clip: float | None = None
    cell_clip: float | None = None
    projection_clip: float | None = None
    input_forget: bool = False
    projection_size: int | None = None
    layer_norm: bool = False
    layer_norm_epsilon: float = 1e-5

    @property
    def output_size(self) -> int:
        """The hidden state's size: ``projection_size`` (P) with a projection, else H."""
        return self.hidden_size if self.projection_size is None else self.projection_size

    def layer_input_size(self, layer: int) -> int:
        """``I`` for layer 0, ``D·P`` above it (``D·H`` without a projection)."""
        return self.input_size if layer == 0 else self.num_directions * self.output_size

    def reads_backwards(self, direction: int) -> bool:
        """True for the direction that walks the sequence from its last step to its first."""
        return direction == 1 or self.reverse

    def activations(self, direction: int) -> DirectionActivations:
        """The five activations of ``direction``: the four gates', then ``act_h``."""
        if self.direction_activations is not None:
            return self.direction_activations[direction]
        gates = self.gate_activations
        return (gates[0], gates[1], gates[2], gates[3], self.hidden_activation)

    @property
    def variants(self) -> tuple[str, ...]:
        """The SPEC §4.1 variants this configuration uses, by field name (``"projection"``
        for ``projection_size``); empty for BNNS's cell."""
        used = {
            "reverse": self.reverse,
            "direction_activations": self.direction_activations is not None,
            "clip": self.clip is not None,
            "cell_clip": self.cell_clip is not None,
            "projection_clip": self.projection_clip is not None,
            "input_forget": self.input_forget,
            "projection": self.projection_size is not None,
            "layer_norm": self.layer_norm,
        }
        return tuple(name for name, on in used.items() if on)


class LSTMGateArrays(Protocol):
    """One gate's weight arrays in the public layout (SPEC §4; ``LSTMGateDescriptor``).

    ``input_weights`` is ``(iw0 (D, H, I), iw1 (L−1, D, H, D·H) or None)``;
    ``hidden_weights`` is ``(L, D, H, H)``; ``cell_weights`` is ``None``, ``(L, D, H, H)`` or
    ``(L, D, H)``; ``bias`` is ``None`` or ``(L, D, H)``. Gradients use the same layout.
    """

    @property
    def input_weights(self) -> tuple[Any, Any]: ...

    @property
    def hidden_weights(self) -> Any: ...

    @property
    def cell_weights(self) -> Any: ...

    @property
    def bias(self) -> Any: ...


class LSTMLayerNormArrays(Protocol):
    """The gains and biases of a layer-normalized LSTM (SPEC §4.1), per layer and direction.

    ``input_gain``, ``input_bias`` (``α_x``, ``β_x``: ``LN(W x)``) and ``hidden_gain``,
    ``hidden_bias`` (``α_h``, ``β_h``: ``LN(U h)``) are ``(L, D, 4H)``, the 4H pre-activation
    units in the public gate order; ``cell_gain``, ``cell_bias`` (``α_c``, ``β_c``:
    ``LN(c)``) are ``(L, D, H)``. Gradients use the same layout.
    """

    @property
    def input_gain(self) -> Any: ...

    @property
    def input_bias(self) -> Any: ...

    @property
    def hidden_gain(self) -> Any: ...

    @property
    def hidden_bias(self) -> Any: ...

    @property
    def cell_gain(self) -> Any: ...

    @property
    def cell_bias(self) -> Any: ...


@attrs.frozen(kw_only=True)
class LSTMPackRequest:
    """Turn the public weights into whatever layout the backend computes with.

    ``gates`` are the four gates in public order, arrays of ``config.dtype`` (with a
    projection, ``hidden_weights`` are ``(L, D, H, P)`` and ``iw1`` ``(L−1, D, H, D·P)``);
    ``projection`` is ``W_hr`` ``(L, D, P, H)`` when ``config.projection_size`` is set, and
    ``layer_norm`` the gains and biases when ``config.layer_norm`` is. The layer asks again
    only when the weights changed (``version`` grows by one each time), so a backend may
    spend time here (stacking, transposing, padding) to save it in every step.
    """

    config: LSTMConfig
    gates: tuple[LSTMGateArrays, LSTMGateArrays, LSTMGateArrays, LSTMGateArrays]
    version: int = 0
    projection: Array | None = None
    layer_norm: LSTMLayerNormArrays | None = None


@attrs.frozen(kw_only=True, eq=False)
class LSTMPackedWeights:
    """Weights in a backend's own layout; layers hand them back without looking inside."""

    config: LSTMConfig
    version: int
    payload: Any


@attrs.frozen(kw_only=True)
class LSTMCacheRequest:
    """How much training cache a forward of ``seq_len`` steps and ``batch_size`` sequences needs."""

    config: LSTMConfig
    seq_len: int
    batch_size: int


@attrs.frozen(kw_only=True)
class LSTMCacheLayout:
    """The size of a backend's training cache and the name of its format.

    ``nbytes`` must be affine in ``seq_len · batch_size`` (BNNS documents the capacity
    that way). Backends that give the same ``format`` string write interchangeable caches:
    a cache written by one can be read by another.
    """

    nbytes: int
    format: str


@attrs.frozen(kw_only=True, eq=False)
class LSTMForwardRequest:
    """The whole stack forward, every layer and direction.

    Attributes
    ----------
    x : (T, N, I), C-contiguous
        Time-major input; steps at or past a sequence's length are zeros.
    hidden, cell : (L·D, N, P) and (L·D, N, H), or None
        Initial states, layer-major then direction; ``None`` is zeros. P is
        ``config.output_size`` (H without a projection).
    sequence_lengths : (N,) int64 or None
        Lengths in [0, T]; ``None`` when every sequence runs all T steps.
    output : (T, N, D·P), any strides
        Receives the time-aligned output of the last layer (zeros past each length).
    hidden_out, cell_out : (L·D, N, P) and (L·D, N, H)
        Receive the final states (each sequence's state at its length; zeros for a
        sequence of length 0, as ONNX Runtime gives).
    training : bool
        Write ``cache`` for backward, and apply ``dropout_masks``.
    cache : 1-D uint8 or None
        In training, at least :class:`LSTMCacheLayout` ``nbytes`` bytes; ``None`` otherwise.
    dropout_masks : tuple or None
        In training with dropout, one array per layer: ``None`` for layer 0, then
        ``(T, N, D·H)`` scales (0 or 1/(1−p)) to multiply the input of that layer by.
    workspace : Workspace
        Scratch memory for this call.
    threads : int
        Threads the backend may use (0: its default).
    """

    config: LSTMConfig
    weights: LSTMPackedWeights
    x: Array
    hidden: Array | None
    cell: Array | None
    sequence_lengths: Array | None
    output: Array
    hidden_out: Array
    cell_out: Array
    training: bool
    cache: Array | None
    dropout_masks: tuple[Array | None, ...] | None
    workspace: Workspace
    threads: int = 0


@attrs.frozen(kw_only=True, eq=False)
class LSTMForwardResult:
    """The arrays the forward wrote: the request's ``output``, ``hidden_out``, ``cell_out``."""

    output: Array
    hidden: Array
    cell: Array


class LSTMForwardCall(Protocol):
    """``lstm_forward`` made ready for one kind of request (``lstm_prepare_forward``).

    The kind is the template request's ``config``, ``weights`` (that very packing),
    ``sequence_lengths`` (their values), ``training`` and ``threads``, and for every array
    field whether it is given and its shape, dtype, strides and flags. The layer calls it only
    with arrays of that kind (and, in training, a cache and dropout masks as the template
    had them), each time with the workspace of that call; the call writes what
    ``lstm_forward`` writes for the request made of these arrays and returns nothing. It must
    not keep the template's arrays: they belong to the call that made it.
    """

    def __call__(self, x: Array, hidden: Array | None, cell: Array | None, output: Array,
                 hidden_out: Array, cell_out: Array, cache: Array | None,
                 dropout_masks: tuple[Array | None, ...] | None, workspace: Workspace) -> None: ...


def call_prepared(call: LSTMForwardCall, request: LSTMForwardRequest) -> None:
    """Run a prepared forward on the arrays of ``request`` (a request of the call's kind)."""
    r = request
    call(r.x, r.hidden, r.cell, r.output, r.hidden_out, r.cell_out, r.cache, r.dropout_masks, r.workspace)


@attrs.frozen(kw_only=True, eq=False)
class LSTMGradientBuffers:
    """Where backward writes (overwrites) every gradient.

    ``input`` is ``(T, N, I)`` (any strides); ``hidden`` and ``cell`` ``(L·D, N, P)`` and
    ``(L·D, N, H)``; ``gates`` the four gates in public order, each shaped like the weights
    (no array where the weights have none), ``projection`` and ``layer_norm`` shaped like
    the request's (``None`` without those variants), all summed over batch and time.
    """

    input: Array
    hidden: Array
    cell: Array
    gates: tuple[LSTMGateArrays, LSTMGateArrays, LSTMGateArrays, LSTMGateArrays]
    projection: Array | None = None
    layer_norm: LSTMLayerNormArrays | None = None


@attrs.frozen(kw_only=True, eq=False)
class LSTMBackwardRequest:
    """Backpropagation through time of the whole stack, from a training cache.

    ``x`` and ``sequence_lengths`` are those of the training forward that wrote ``cache``
    (read only); ``output_gradient`` is ``(T, N, D·P)`` or ``None`` (only the final states
    carry gradient); ``hidden_gradient`` and ``cell_gradient`` are ``(L·D, N, P)`` and
    ``(L·D, N, H)`` or ``None`` (zeros).
    """

    config: LSTMConfig
    weights: LSTMPackedWeights
    x: Array
    cache: Array
    output_gradient: Array | None
    hidden_gradient: Array | None
    cell_gradient: Array | None
    sequence_lengths: Array | None
    gradients: LSTMGradientBuffers
    workspace: Workspace
    threads: int = 0


@attrs.frozen(kw_only=True, eq=False)
class LSTMBackwardResult:
    """The request's gradient buffers, written."""

    gradients: LSTMGradientBuffers


# --------------------------------------------------------------------------------------
# Normalization.
# --------------------------------------------------------------------------------------
@attrs.frozen(kw_only=True, eq=False)
class NormalizationForwardRequest:
    """``out = act(gamma · (x − mean) / sqrt(variance + epsilon) + beta)`` on a canonical view.

    Every normalization type is one view ``(N, G, K, S)`` of its ``(N, C, *spatial)`` data
    (``docs/backends.md`` lists them): statistics are constant over ``K`` and ``S``, gamma
    and beta over ``N`` and ``S``. With ``centered=False`` (RMSNorm, SPEC §4.1) the mean is
    0: ``variance`` is the mean of the squares, ``out = act(gamma · x / sqrt(mean(x²) +
    epsilon) + beta)`` (the layer passes a zero beta), and the result's mean is zeros.

    Attributes
    ----------
    x : (N, G, K, S), C-contiguous
    gamma, beta : (1, 1 or G, K, 1)
    epsilon : float
    batch_statistics : bool
        Statistics over ``N, K, S`` per ``G`` (batch norm) instead of over ``K, S`` per
        ``(N, G)``.
    activation : Activation
        Per-element, applied last.
    out : (N, G, K, S), C-contiguous; may be ``x`` itself (in place)
    mean, variance : (1, G, 1, 1) or None
        Statistics to use instead of computing them (moving statistics in inference).
    threads : int
        Threads the backend may use (0: its default).
    centered : bool
        False for RMS normalization (no mean subtracted; never with given statistics).
    """

    x: Array
    gamma: Array
    beta: Array
    epsilon: float
    batch_statistics: bool
    activation: Activation
    out: Array
    mean: Array | None = None
    variance: Array | None = None
    threads: int = 0
    centered: bool = True


@attrs.frozen(kw_only=True, eq=False)
class NormalizationForwardResult:
    """The output (the request's ``out``) and the statistics used, ``(1 or N, G, 1, 1)``;
    the variance is the biased one (the mean of the squares, and a zero mean, when not
    ``centered``)."""

    output: Array
    mean: Array
    variance: Array


@attrs.frozen(kw_only=True, eq=False)
class NormalizationBackwardRequest:
    """Gradients of a forward with respect to ``x``, ``gamma`` and ``beta``.

    Fields as in :class:`NormalizationForwardRequest`, plus ``dy`` (the gradient of the
    forward's output), ``output`` (the forward's output, given when the activation is not
    the identity), ``out`` (receives ``dx``; may be ``dy`` itself, never ``x`` or
    ``output``; ``None``: a new array) and ``scratch`` (arrays shaped like ``x`` the backend
    may overwrite). With ``mean`` and ``variance`` given the statistics are constants;
    otherwise the gradient flows through them too (with ``centered=False``, RMS
    normalization, through the mean of the squares only).
    """

    x: Array
    dy: Array
    gamma: Array
    beta: Array
    epsilon: float
    batch_statistics: bool
    activation: Activation
    output: Array | None = None
    out: Array | None = None
    mean: Array | None = None
    variance: Array | None = None
    scratch: tuple[Array, ...] = ()
    threads: int = 0
    centered: bool = True


@attrs.frozen(kw_only=True, eq=False)
class NormalizationBackwardResult:
    """``input`` (N, G, K, S), ``gamma`` and ``beta`` shaped like the request's gamma."""

    input: Array
    gamma: Array
    beta: Array


# --------------------------------------------------------------------------------------
# The contract as a type, and its check.
# --------------------------------------------------------------------------------------
class Backend(Protocol):
    """What a layer needs from a compute backend: a name and seven operations.

    Implement it from scratch or subclass :class:`bnnsfw.backends.NumpyBackend` (the
    reference) and override what you speed up.
    """

    #: Registered name, e.g. ``"numpy"``.
    name: str

    def gemm(self, request: GemmRequest) -> GemmResult:
        """The matrix product (:class:`GemmRequest`)."""
        ...

    def lstm_pack_weights(self, request: LSTMPackRequest) -> LSTMPackedWeights:
        """Weights in the backend's layout (:class:`LSTMPackRequest`)."""
        ...

    def lstm_cache_layout(self, request: LSTMCacheRequest) -> LSTMCacheLayout:
        """Training-cache size and format (:class:`LSTMCacheRequest`)."""
        ...

    def lstm_forward(self, request: LSTMForwardRequest) -> LSTMForwardResult:
        """The LSTM stack forward (:class:`LSTMForwardRequest`)."""
        ...

    def lstm_backward(self, request: LSTMBackwardRequest) -> LSTMBackwardResult:
        """The LSTM stack backward (:class:`LSTMBackwardRequest`)."""
        ...

    # Optional (OPTIONAL_OPERATIONS): a backend may leave it out.
    # def lstm_prepare_forward(self, request: LSTMForwardRequest) -> LSTMForwardCall | None:
    #     """The forward made ready for every request of the template's kind, or None."""

    def normalization_forward(self, request: NormalizationForwardRequest) -> NormalizationForwardResult:
        """A normalization forward (:class:`NormalizationForwardRequest`)."""
        ...

    def normalization_backward(self, request: NormalizationBackwardRequest) -> NormalizationBackwardResult:
        """A normalization backward (:class:`NormalizationBackwardRequest`)."""
        ...


#: Every operation of the contract: name → (request type, result type).
OPERATIONS: Mapping[str, tuple[type, type]] = {
    "gemm": (GemmRequest, GemmResult),
    "lstm_pack_weights": (LSTMPackRequest, LSTMPackedWeights),
    "lstm_cache_layout": (LSTMCacheRequest, LSTMCacheLayout),
    "lstm_forward": (LSTMForwardRequest, LSTMForwardResult),
    "lstm_backward": (LSTMBackwardRequest, LSTMBackwardResult),
    "normalization_forward": (NormalizationForwardRequest, NormalizationForwardResult),
    "normalization_backward": (NormalizationBackwardRequest, NormalizationBackwardResult),
}

#: Operations a backend may offer, checked like the others when it does: name → (request
#: type, what it returns). ``lstm_prepare_forward`` returns an :class:`LSTMForwardCall` or
#: ``None`` (nothing quicker than ``lstm_forward`` for that kind of request).
OPTIONAL_OPERATIONS: Mapping[str, tuple[type, Any]] = {
    "lstm_prepare_forward": (LSTMForwardRequest, LSTMForwardCall),
}


def _not_subclass(kind: type, expected: Any) -> bool:
    try:
        return not issubclass(kind, expected)
    except TypeError:  # a protocol (LSTMForwardCall): what a class offers is not checked here
        return False


def _annotation_problem(operation: str, method: Any, request_type: type, result_type: Any) -> str | None:
    """What is wrong with the annotations of ``method``, if it has any."""
    try:
        hints = typing.get_type_hints(method)
    except Exception:  # unresolvable annotations: nothing to hold against the method
        return None
    hints = {k: v for k, v in hints.items() if v is not Any}
    returned = hints.pop("return", None)
    for annotation in hints.values():  # the one parameter left
        if isinstance(annotation, type) and not issubclass(request_type, annotation):
            return f"{operation} takes a {annotation.__name__}, not a {request_type.__name__}"
    if isinstance(returned, type) and returned is not result_type and _not_subclass(returned, result_type):
        return f"{operation} returns a {returned.__name__}, not a {result_type.__name__}"
    return None


def contract_problems(candidate: object) -> list[str]:
    """Everything that keeps ``candidate`` from being a backend (empty when it is one).

    Checks the ``name`` and, for every operation in :data:`OPERATIONS` (and each one of
    :data:`OPTIONAL_OPERATIONS` the candidate has), that it exists, is callable with exactly
    one positional argument, and, where it is annotated, takes the operation's request type
    and returns its result type.
    """
    if isinstance(candidate, type):
        return [f"an instance, not the class {candidate.__name__} (register a class with register_backend)"]
    problems = []
    name = getattr(candidate, "name", None)
    if not isinstance(name, str) or not name:
        problems.append(f"name must be a non-empty string (got {name!r})")
    for operation, (request_type, result_type) in (*OPERATIONS.items(), *OPTIONAL_OPERATIONS.items()):
        wanted = f"{operation}({request_type.__name__}) -> {result_type.__name__}"
        method = getattr(candidate, operation, None)
        if method is None:
            if operation not in OPTIONAL_OPERATIONS:
                problems.append(f"missing {wanted}")
            continue
        if not callable(method):
            problems.append(f"{operation} must be a method {wanted} (got {type(method).__name__})")
            continue
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):  # a builtin without a signature: cannot tell
            continue
        try:
            signature.bind(object())
        except TypeError:
            problems.append(
                f"{operation} must take one request argument, as {wanted} (it is {operation}{signature})")
            continue
        problem = _annotation_problem(operation, method, request_type, result_type)
        if problem is not None:
            problems.append(problem)
    return problems


def check_contract(candidate: object, where: str = "backend") -> None:
    """Raise :class:`~bnnsfw.BackendError` listing every problem :func:`contract_problems` finds."""
    problems = contract_problems(candidate)
    if problems:
        label = type(candidate).__name__
        raise BackendError(
            f"{where} must implement the backend contract (bnnsfw.backends.contract); "
            f"got a {label} that breaks it: " + "; ".join(problems) + ".")

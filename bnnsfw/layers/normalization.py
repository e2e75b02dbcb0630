"""Batch, instance, layer, group and RMS normalization (BNNS ``BNNSFilterCreateLayerNormalization``).

:class:`NormalizationType` says which statistics to take (and carries the options of that
kind), :class:`NormalizationParameters` is the validated description of a layer, and
:class:`NormalizationLayer` runs it forward (``apply``, or ``apply_with_statistics``, which
also returns the mean and inverse standard deviation as :class:`NormalizationOutput`) and
backward (``apply_backward``, returning :class:`NormalizationGradients`). RMS normalization
(SPEC §4.1, PyTorch's ``RMSNorm``, ONNX's ``RMSNormalization``) is not a BNNS filter type:
it is a layer norm without centring and without beta, :meth:`NormalizationType.rms`. The
math lives in the backend, reached through the contract's ``normalization_forward`` and
``normalization_backward`` (:mod:`bnnsfw.backends.contract`); this module checks arguments,
reshapes the data to the contract's canonical ``(N, G, K, S)`` view and keeps the moving
statistics.
The semantics are those of ``docs/normalization.md``.
"""

from __future__ import annotations

import math
import threading
import warnings
from typing import Any

import attrs
import numpy as np

from .._named import read_only
from .._validation import (
    as_input,
    as_output,
    describe,
    finite_float,
    layer_dtype,
    parameter_array,
    positive_int,
    real_array,
    separate_outputs,
)
from ..activation import Activation
from ..backends.contract import NormalizationBackwardRequest, NormalizationForwardRequest
from ..enums import FilterType, LearningPhase
from ..errors import InvalidParameterError, ShapeError, must_be
from ..filter import Filter, FilterParameters, guarded

__all__ = [
    "NormalizationType",
    "NormalizationParameters",
    "NormalizationOutput",
    "NormalizationGradients",
    "NormalizationLayer",
]

Array = np.ndarray

_KINDS = (FilterType.batch_norm, FilterType.instance_norm, FilterType.layer_norm, FilterType.group_norm)
_WITH_MOVING = (FilterType.batch_norm, FilterType.instance_norm)


# --- small converters and validators (one rule each) -------------------------------------


def _array_eq(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return bool(np.array_equal(a, b))


def _array_repr(value: Any) -> str:
    return "None" if value is None else f"<array {describe(value)}>"


def _array_field(**kwargs: Any) -> Any:
    """An optional array field: compared by value, left out of the hash, shown by shape."""
    return attrs.field(default=None, eq=attrs.cmp_using(eq=_array_eq), hash=False, repr=_array_repr, **kwargs)


def _to_kind(value: object) -> FilterType:
    kind = FilterType.parse(value, "NormalizationType.kind")
    if kind not in _KINDS:
        names = ", ".join(k.name for k in _KINDS)
        raise InvalidParameterError(must_be("NormalizationType.kind", f"one of {names}", kind.name))
    return kind


def _optional_array(where: str, value: object) -> Array | None:
    """Keep ndarrays as they are (client pointers), turn other array-likes into arrays."""
    if value is None or isinstance(value, np.ndarray):
        return value
    return real_array(where, value, np.dtype(np.float64), rule="None or an array of real numbers")


def _to_moving_mean(value: object) -> Array | None:
    return _optional_array("NormalizationType.moving_mean", value)


def _to_moving_variance(value: object) -> Array | None:
    return _optional_array("NormalizationType.moving_variance", value)


def _to_shape(value: object) -> tuple[int | None, ...]:
    where = "NormalizationParameters.input_shape"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not value:
        raise InvalidParameterError(
            must_be(where, "a tuple of positive extents (C, *spatial), rank >= 1", value))
    return tuple(None if v is None else positive_int(f"{where}[{i}]", v) for i, v in enumerate(value))


def _shape_text(shape: tuple[int | None, ...]) -> str:
    """``(6, any, any)``: a per-sample shape with its open sizes spelled ``any``."""
    return f"({', '.join('any' if s is None else str(s) for s in shape)}{',' if len(shape) == 1 else ''})"


def _to_momentum(value: object) -> float:
    return finite_float("NormalizationParameters.momentum", value)


def _to_epsilon(value: object) -> float:
    return finite_float("NormalizationParameters.epsilon", value)


def _to_activation(value: object) -> object:
    return Activation.identity() if value is None else value


def _check_activation(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, Activation):
        raise InvalidParameterError(must_be("NormalizationParameters.activation", "an Activation", value))
    value.require_elementwise("NormalizationParameters.activation")


def _check_type(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, NormalizationType):
        raise InvalidParameterError(
            must_be("NormalizationParameters.type", "a NormalizationType (e.g. NormalizationType.batch())",
                    value)
        )


def _in_unit_interval(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise InvalidParameterError(must_be(f"NormalizationParameters.{attribute.name}", "in [0, 1]", value))


def _non_negative(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if value < 0.0:
        raise InvalidParameterError(must_be(f"NormalizationParameters.{attribute.name}", ">= 0", value))


def _to_dtype(value: object) -> np.dtype:
    return layer_dtype(value, "NormalizationParameters.dtype")


def _check_flag(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParameterError(must_be(f"NormalizationType.{attribute.name}", "True or False", value))


def _fixed(shape: tuple[int | None, ...]) -> tuple[int, ...]:
    """``shape`` known to hold no open size (checked by the caller)."""
    assert None not in shape
    return tuple(int(s) for s in shape if s is not None)


# --- the values ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class NormalizationType:
    """Which normalization, with the options of that kind (Swift ``BNNS.NormalizationType``).

    Build it with one of the constructors: :meth:`batch`, :meth:`instance`, :meth:`layer`,
    :meth:`group`.

    Parameters
    ----------
    kind : FilterType
        ``batch_norm`` (2), ``instance_norm`` (3), ``layer_norm`` (4) or ``group_norm`` (5).
    moving_mean, moving_variance : array-like of shape (C,), optional
        Running statistics of batch and instance norm: both or neither. The layer updates
        its copies (or, with client pointers, these arrays) in place in training forwards
        and normalizes with them in inference.
    normalization_axis : int, optional
        Layer norm only: the first per-sample axis normalized (0 = all of ``(C, *spatial)``).
    group_count : int, optional
        Group norm only: the number of channel groups ``G``.
    root_mean_square : bool
        Layer norm only: RMS normalization, ``x / sqrt(mean(x²) + ε)`` (no centring, no
        beta); :meth:`rms` makes one. ``kind`` stays ``layer_norm``, the BNNS type it varies.

    Examples
    --------
    >>> t = NormalizationType.group(group_count=2)
    >>> t.kind, t.group_count
    (<FilterType.group_norm: 5>, 2)
    >>> NormalizationType.batch(moving_mean=[0.0, 0.0], moving_variance=[1.0, 1.0]).has_moving_statistics
    True
    >>> NormalizationType.rms(normalization_axis=1).root_mean_square
    True
    """

    kind: FilterType = attrs.field(converter=_to_kind)
    moving_mean: Array | None = _array_field(converter=_to_moving_mean)
    moving_variance: Array | None = _array_field(converter=_to_moving_variance)
    normalization_axis: int | None = attrs.field(default=None)
    group_count: int | None = attrs.field(default=None)
    root_mean_square: bool = attrs.field(default=False, validator=_check_flag)

    def __attrs_post_init__(self) -> None:
        kind = self.kind
        if kind in _WITH_MOVING:
            if (self.moving_mean is None) != (self.moving_variance is None):
                raise InvalidParameterError(
                    must_be("NormalizationType.moving_mean and moving_variance",
                            "given together or not at all",
                            "only " + ("moving_mean" if self.moving_variance is None else "moving_variance"))
                )
        else:
            for name in ("moving_mean", "moving_variance"):
                if getattr(self, name) is not None:
                    raise InvalidParameterError(
                        must_be(f"NormalizationType.{name}",
                                f"None for {kind.name} (only batch and instance norm keep moving "
                                "statistics)",
                                "an array")
                    )
        if kind is FilterType.layer_norm:
            axis = positive_int("NormalizationType.normalization_axis", self.normalization_axis, minimum=0)
            object.__setattr__(self, "normalization_axis", axis)
        elif self.normalization_axis is not None:
            raise InvalidParameterError(
                must_be("NormalizationType.normalization_axis", f"None for {kind.name}",
                        self.normalization_axis)
            )
        if kind is FilterType.group_norm:
            groups = positive_int("NormalizationType.group_count", self.group_count)
            object.__setattr__(self, "group_count", groups)
        elif self.group_count is not None:
            raise InvalidParameterError(
                must_be("NormalizationType.group_count", f"None for {kind.name}", self.group_count))
        if self.root_mean_square and kind is not FilterType.layer_norm:
            raise InvalidParameterError(must_be(
                "NormalizationType.root_mean_square",
                f"False for {kind.name} (RMS normalization is a layer norm)", True))

    @classmethod
    def batch(cls, moving_mean: Any = None, moving_variance: Any = None) -> "NormalizationType":
        """Batch norm: statistics per channel over the batch and every spatial position."""
        return cls(kind=FilterType.batch_norm, moving_mean=moving_mean, moving_variance=moving_variance)

    @classmethod
    def instance(cls, moving_mean: Any = None, moving_variance: Any = None) -> "NormalizationType":
        """Instance norm: statistics per sample and channel over the spatial positions."""
        return cls(kind=FilterType.instance_norm, moving_mean=moving_mean, moving_variance=moving_variance)

    @classmethod
    def layer(cls, normalization_axis: int = 0) -> "NormalizationType":
        """Layer norm: statistics per sample over per-sample axes ``normalization_axis`` … end."""
        return cls(kind=FilterType.layer_norm, normalization_axis=normalization_axis)

    @classmethod
    def group(cls, group_count: int) -> "NormalizationType":
        """Group norm: statistics per sample and group of ``C / group_count`` channels."""
        return cls(kind=FilterType.group_norm, group_count=group_count)

    @classmethod
    def rms(cls, normalization_axis: int = 0) -> "NormalizationType":
        """RMS normalization (PyTorch ``RMSNorm``, ONNX ``RMSNormalization``): per sample over
        the axes ``normalization_axis`` … end, ``y = gamma · x / sqrt(mean(x²) + ε)``.

        ONNX's ``axis`` counts the batch axis and may be negative: ``normalization_axis`` is
        ``axis − 1``, or ``rank + axis − 1`` for a negative one, with ``rank`` that of the
        whole input, batch axis included (ONNX's default −1 is the last axis). PyTorch's
        ``normalized_shape`` is the trailing shape from that axis on.
        """
        return cls(kind=FilterType.layer_norm, normalization_axis=normalization_axis,
                   root_mean_square=True)

    @property
    def has_moving_statistics(self) -> bool:
        """True when moving statistics were given (batch and instance norm only)."""
        return self.moving_mean is not None

    @property
    def axis(self) -> int:
        """``normalization_axis`` of a layer norm (an error for the other kinds)."""
        if self.normalization_axis is None:
            raise InvalidParameterError(
                must_be("NormalizationType.axis", "asked of a layer norm", self.kind.name))
        return self.normalization_axis

    @property
    def groups(self) -> int:
        """``group_count`` of a group norm (an error for the other kinds)."""
        if self.group_count is None:
            raise InvalidParameterError(
                must_be("NormalizationType.groups", "asked of a group norm", self.kind.name))
        return self.group_count


@attrs.frozen(kw_only=True)
class NormalizationParameters:
    """Everything that describes a normalization layer (``BNNSLayerParametersNormalization``).

    Parameters
    ----------
    type : NormalizationType
        The kind of normalization and its options (moving statistics, axis, groups).
    input_shape : tuple of int or None
        Per-sample shape ``(C, *spatial)``, channels first, rank >= 1. Batch, instance and
        group norm may leave spatial sizes open as ``None`` (``(C, None, None)``: any height
        and width, one rank); the channel count and a layer norm's sizes are fixed (a layer
        norm takes any number of leading axes instead).
    gamma, beta : array-like, optional
        Scale and shift: shape ``(C,)``, or for layer norm the normalized trailing shape
        ``input_shape[normalization_axis:]``. ``None`` means ones and zeros. RMS normalization
        has no shift: its ``beta`` must be ``None``.
    momentum : float
        Weight of the old moving statistics in ``moving = momentum·moving +
        (1 − momentum)·batch_statistic``; in ``[0, 1]``.
    epsilon : float
        Added to the variance; ``>= 0``.
    activation : Activation
        Per-element activation fused after the affine step (default identity).
    dtype : numpy dtype
        ``float32`` (default) or ``float64``; gamma, beta and the moving statistics are
        converted to it (ndarrays already of this dtype are kept, not copied).

    Raises
    ------
    InvalidParameterError, ShapeError, DTypeError
        For any rule broken (see ``docs/normalization.md``).

    Examples
    --------
    >>> import numpy as np
    >>> p = NormalizationParameters(type=NormalizationType.layer(normalization_axis=1),
    ...                             input_shape=(2, 3), gamma=[1.0, 2.0, 3.0])
    >>> p.gamma
    array([1., 2., 3.], dtype=float32)
    >>> p.channels, p.affine_shape
    (2, (3,))
    """

    type: NormalizationType = attrs.field(validator=_check_type)
    input_shape: tuple[int | None, ...] = attrs.field(converter=_to_shape)
    gamma: Array | None = _array_field()
    beta: Array | None = _array_field()
    momentum: float = attrs.field(default=0.0, converter=_to_momentum,
                                  validator=_in_unit_interval)
    epsilon: float = attrs.field(default=1e-5, converter=_to_epsilon,
                                 validator=_non_negative)
    activation: Activation = attrs.field(factory=Activation.identity, converter=_to_activation,
                                         validator=_check_activation)
    dtype: np.dtype = attrs.field(default=np.dtype(np.float32), converter=_to_dtype)

    def __attrs_post_init__(self) -> None:
        """The cross-field rules, in one place: sizes against the type, arrays to the dtype."""
        where = "NormalizationParameters"
        kind, shape, dtype = self.type.kind, self.input_shape, self.dtype
        if shape[0] is None:
            raise InvalidParameterError(must_be(
                f"{where}.input_shape[0] (channels)", "a positive int (only spatial sizes may be None)",
                None))
        if kind is FilterType.layer_norm and None in shape:
            raise InvalidParameterError(must_be(
                f"{where}.input_shape",
                "fixed sizes for layer and RMS norm (they take any number of leading axes: give the "
                "normalized trailing shape)", shape))
        channels = shape[0]
        if kind is FilterType.group_norm and channels % self.type.groups:
            raise InvalidParameterError(
                must_be(f"{where}.input_shape[0] (channels)",
                        f"divisible by NormalizationType.group_count = {self.type.group_count}", channels)
            )
        if kind is FilterType.layer_norm and self.type.axis >= len(shape):
            raise InvalidParameterError(
                must_be(f"{where}.type.normalization_axis",
                        f"in [0, {len(shape) - 1}] for input_shape {shape}", self.type.normalization_axis)
            )
        if self.type.root_mean_square and self.beta is not None:
            raise InvalidParameterError(
                must_be(f"{where}.beta", "None for RMS normalization (it has no shift)",
                        type(self.beta).__name__))
        affine = self.affine_shape
        for name in ("gamma", "beta"):
            value = getattr(self, name)
            if value is not None:
                array = parameter_array(f"{where}.{name}", value, dtype, affine, copy=False)
                object.__setattr__(self, name, array)
        if self.type.has_moving_statistics:
            mean = parameter_array(f"{where}.type.moving_mean", self.type.moving_mean, dtype, (channels,),
                                   copy=False)
            var = parameter_array(f"{where}.type.moving_variance", self.type.moving_variance, dtype,
                                  (channels,), copy=False)
            if (var < 0).any():
                raise InvalidParameterError(
                    must_be(f"{where}.type.moving_variance", ">= 0 everywhere",
                            "an array with negative values")
                )
            if mean is not self.type.moving_mean or var is not self.type.moving_variance:
                with_arrays = attrs.evolve(self.type, moving_mean=mean, moving_variance=var)
                object.__setattr__(self, "type", with_arrays)

    @property
    def channels(self) -> int:
        """``C``, the first per-sample extent."""
        channels = self.input_shape[0]
        assert channels is not None  # checked at creation
        return channels

    @property
    def open_sizes(self) -> bool:
        """True when some spatial size is ``None`` (any size; batch, instance and group norm)."""
        return None in self.input_shape

    @property
    def affine_shape(self) -> tuple[int, ...]:
        """Shape of gamma, beta and their gradients: ``(C,)``, or for layer norm the
        normalized trailing shape ``input_shape[normalization_axis:]``."""
        if self.type.kind is FilterType.layer_norm:
            return _fixed(self.input_shape[self.type.axis:])
        return (self.channels,)

    def to_state(self) -> dict[str, Any]:
        """The parameters as plain data: the type's kind and options, the sizes and options
        as numbers, strings and lists, and the arrays ``gamma``, ``beta``, ``moving_mean``
        and ``moving_variance`` (the arrays themselves, not copies; ``None`` where absent).

        Every value but the arrays is JSON-ready; :meth:`from_state` reads it back.

        >>> p = NormalizationParameters(type=NormalizationType.group(group_count=2), input_shape=(4, 3))
        >>> state = p.to_state()
        >>> state["kind"], state["group_count"], state["gamma"]
        ('group_norm', 2, None)
        """
        state = {
            "kind": self.type.kind.name,
            "input_shape": list(self.input_shape),
            "normalization_axis": self.type.normalization_axis,
            "group_count": self.type.group_count,
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "activation": self.activation.to_state(),
            "dtype": self.dtype.name,
            "gamma": self.gamma,
            "beta": self.beta,
            "moving_mean": self.type.moving_mean,
            "moving_variance": self.type.moving_variance,
        }
        if self.type.root_mean_square:  # only then, so that the other types' states are unchanged
            state["root_mean_square"] = True
            del state["beta"]  # it has none (not even a live one of zeros, as the others have)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "NormalizationParameters":
        """The parameters that :meth:`to_state` described; absent arrays are ``None``."""
        from .._state import StateReader

        reader = StateReader("NormalizationParameters", state)
        kind = NormalizationType(**reader.required_entries("kind", "normalization_axis", "group_count"),
                                 **reader.optional_entries("moving_mean", "moving_variance"),
                                 root_mean_square=reader.optional("root_mean_square") or False)
        parameters = cls(
            type=kind,
            input_shape=tuple(reader.required("input_shape")),
            **reader.optional_entries("gamma", "beta"),
            **reader.required_entries("momentum", "epsilon", "dtype"),
            activation=Activation.from_state(reader.required("activation")),
        )
        reader.finish()
        return parameters


@attrs.frozen(kw_only=True, eq=False)
class NormalizationOutput:
    """What :meth:`NormalizationLayer.apply_with_statistics` returns (ONNX
    ``LayerNormalization``'s ``Y``, ``Mean`` and ``InvStdDev``).

    Attributes
    ----------
    output : ndarray, shape (N, *input_shape)
        What :meth:`NormalizationLayer.apply` returns.
    mean : ndarray or None
        The mean the forward subtracted, the reduced axes kept as size 1 (shapes in
        ``docs/normalization.md``: ``(N, *input_shape[:axis], 1, …)`` for layer norm); the
        moving mean in inference with moving statistics; ``None`` for RMS normalization.
    inv_std_dev : ndarray, shaped like ``mean``
        ``1 / sqrt(variance + epsilon)`` (the root mean square's reciprocal for RMS
        normalization), with the variance the forward used.
    """

    output: Array = attrs.field(repr=_array_repr)
    mean: Array | None = attrs.field(repr=_array_repr)
    inv_std_dev: Array = attrs.field(repr=_array_repr)


@attrs.frozen(eq=False)
class NormalizationGradients:
    """What :meth:`NormalizationLayer.apply_backward` returns.

    Attributes
    ----------
    input : ndarray, shape (N, *input_shape)
        Gradient of the loss with respect to the layer's input.
    beta, gamma : ndarray, shaped like the layer's gamma
        Gradients with respect to beta and gamma, summed over the batch and every position;
        ``beta`` is ``None`` for RMS normalization, which has no beta.
    """

    input: Array
    beta: Array | None
    gamma: Array

    def parameters(self) -> dict[str, Array]:
        """``gamma`` and ``beta`` gradients under the names of :meth:`NormalizationLayer.parameters`
        (``gamma`` alone for RMS normalization, which has no shift)."""
        if self.beta is None:
            return {"gamma": self.gamma}
        return {"gamma": self.gamma, "beta": self.beta}


# --- the layer -------------------------------------------------------------------------


def _same_memory(a: Array, b: Array) -> bool:
    """True when ``a`` and ``b`` are the same elements (same start, shape and strides)."""
    return (a is b) or (
        a.shape == b.shape
        and a.strides == b.strides
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


class NormalizationLayer(Filter):
    """A batch, instance, layer or group normalization layer with a fused activation.

    ``y = act(gamma · (x − μ) / sqrt(σ² + ε) + beta)``, with the mean ``μ`` and biased
    variance ``σ²`` taken over the reduction set of the type (``docs/normalization.md``).

    Parameters
    ----------
    parameters : NormalizationParameters
        The layer description.
    filter_parameters : FilterParameters, optional
        Backend, BLAS thread limit and client-pointer flag. With
        ``use_client_pointer=True`` the layer works on the parameter object's arrays (the
        caller's own ndarrays when they already had the layer's dtype) instead of copies.

    Notes
    -----
    The layer's :attr:`gamma`, :attr:`beta`, :attr:`moving_mean` and :attr:`moving_variance`
    are live arrays: an optimizer may update them in place between calls. Training forwards
    of batch and instance norm with moving statistics update those in place.
    :meth:`parameters` names the trainable ones (``gamma``, ``beta``); :meth:`state_dict`
    adds the moving statistics.

    ``layer(x)`` is ``layer.apply(x)``: inference, as every call of a layer unless given
    ``training=True``. An unbatched ``x`` of shape ``input_shape`` gives a result of that
    shape (a batch axis is added and removed); layer and RMS norm take any leading axes,
    batch, instance and group norm any size where ``input_shape`` has ``None``.

    NaN or infinity in the weights is refused at creation; NaN in the input data is not
    checked (that would cost a pass over memory) and propagates to the outputs of the
    affected statistics set. ``epsilon = 0`` with a constant statistics set gives NaN
    there, as ``0 / 0`` does.

    Examples
    --------
    Apple's instance-norm example: three channels holding 1…9, 10…90 and 100…900 all
    normalize to the same values.

    >>> import numpy as np
    >>> from bnnsfw.layers.normalization import (
    ...     NormalizationLayer, NormalizationParameters, NormalizationType)
    >>> x = np.arange(1, 10, dtype=np.float32) * np.array([1, 10, 100], np.float32)[:, None]
    >>> x = x.reshape(1, 3, 1, 9)
    >>> params = NormalizationParameters(type=NormalizationType.instance(),
    ...                                  input_shape=(3, 1, 9), epsilon=0.0)
    >>> with NormalizationLayer(params) as layer:
    ...     y = layer.apply(x, phase="inference")
    ...     g = layer.apply_backward(x, np.ones_like(y), phase="inference")
    >>> print(np.round(y[0, :, 0], 3))
    [[-1.549 -1.162 -0.775 -0.387  0.     0.387  0.775  1.162  1.549]
     [-1.549 -1.162 -0.775 -0.387  0.     0.387  0.775  1.162  1.549]
     [-1.549 -1.162 -0.775 -0.387  0.     0.387  0.775  1.162  1.549]]
    >>> g.beta
    array([9., 9., 9.], dtype=float32)
    """

    _parameters_class = NormalizationParameters

    def __init__(self, parameters: NormalizationParameters,
                 filter_parameters: FilterParameters | None = None) -> None:
        if not isinstance(parameters, NormalizationParameters):
            raise InvalidParameterError(
                must_be("NormalizationLayer(parameters)", "a NormalizationParameters",
                        type(parameters).__name__)
            )
        super().__init__(filter_parameters)
        self._parameters = parameters
        client = self.filter_parameters.use_client_pointer
        dtype, affine = parameters.dtype, parameters.affine_shape

        def own(array: Array | None, fill: float | None = None) -> Array | None:
            if array is None:
                return None if fill is None else np.full(affine, fill, dtype=dtype)
            return array if client else array.copy()

        self._gamma: Array | None = own(parameters.gamma, 1.0)
        self._beta: Array | None = own(parameters.beta, 0.0)
        self._moving_mean: Array | None = own(parameters.type.moving_mean)
        self._moving_variance: Array | None = own(parameters.type.moving_variance)
        for name in ("moving_mean", "moving_variance"):
            array = getattr(self, f"_{name}")
            if array is not None and not array.flags.writeable:
                raise InvalidParameterError(
                    must_be(f"NormalizationType.{name}", "writable (training updates it in place)",
                            "a read-only array")
                )
        view = (lambda a: a) if client else read_only
        kind = parameters.type
        if kind.has_moving_statistics:
            kind = attrs.evolve(kind, moving_mean=view(self._moving_mean),
                                moving_variance=view(self._moving_variance))
        beta = None if kind.root_mean_square else view(self._beta)  # RMS normalization has no shift
        self._public = attrs.evolve(parameters, type=kind, gamma=view(self._gamma), beta=beta)
        # The kernels' view of a sample (made again for each call's sizes when some are open).
        self._layout = _Layout.of(parameters, None if not parameters.open_sizes
                                  else (parameters.channels, *(1 for _ in parameters.input_shape[1:])))
        # Workspaces reused by apply_backward (two x-sized arrays at most); a call finding
        # them in use by another thread allocates its own.
        self._scratch: list[Array] = []
        self._scratch_lock = threading.Lock()
        self._moving_lock = threading.Lock()

    # Properties.
    @property
    def layer_parameters(self) -> NormalizationParameters:
        """The parameters the layer computes with, holding its live arrays.

        Gamma and beta are always arrays here (ones and zeros when none were given). With
        ``use_client_pointer`` they are the arrays the layer uses; otherwise read-only views
        of the layer's own copies (they show the current values; train through
        :meth:`parameters`).
        """
        self._check_open("layer_parameters")
        return self._public

    @property
    def input_shape(self) -> tuple[int | None, ...]:
        """Per-sample input shape ``(C, *spatial)``; ``None`` where a spatial size is open."""
        return self._parameters.input_shape

    @property
    def dtype(self) -> np.dtype:
        """The layer's dtype (float32 or float64)."""
        return self._parameters.dtype

    @property
    @guarded
    def gamma(self) -> Array:
        """The live scale array (ones if none was given).

        Assigning to it copies the values into the live array (``layer.gamma -= lr * g``
        works), checked like the parameter: the same shape, finite.
        """
        self._check_open("gamma")
        assert self._gamma is not None  # released by close() only
        return self._gamma

    @gamma.setter
    @guarded
    def gamma(self, value: Any) -> None:
        self._assign("gamma", value)

    @property
    @guarded
    def beta(self) -> Array:
        """The live shift array (zeros if none was given); assignable like :attr:`gamma`.

        RMS normalization has none: asking for it raises ``InvalidParameterError``.
        """
        self._check_open("beta")
        self._check_has_beta()
        assert self._beta is not None  # released by close() only
        return self._beta

    @beta.setter
    @guarded
    def beta(self, value: Any) -> None:
        self._assign("beta", value)

    def _check_has_beta(self) -> None:
        if self._parameters.type.root_mean_square:
            raise InvalidParameterError(must_be("NormalizationLayer.beta", "asked of a layer with a shift",
                                                "RMS normalization, which has none"))

    @property
    @guarded
    def moving_mean(self) -> Array | None:
        """The live moving mean ``(C,)``, or ``None`` without moving statistics."""
        self._check_open("moving_mean")
        return self._moving_mean

    @property
    @guarded
    def moving_variance(self) -> Array | None:
        """The live moving (biased) variance ``(C,)``, or ``None`` without moving statistics."""
        self._check_open("moving_variance")
        return self._moving_variance

    def _assign(self, name: str, value: Any) -> None:
        self._check_open(name)
        if name == "beta":
            self._check_has_beta()
        live = getattr(self, f"_{name}")
        if value is live:  # an in-place update such as ``layer.gamma -= step``
            return
        array = parameter_array(f"NormalizationLayer.{name}", value, self.dtype, live.shape, copy=False)
        np.copyto(live, array)

    def _live_parameters(self) -> NormalizationParameters:
        return self._public

    def _named_parameters(self) -> dict[str, Array]:
        assert self._gamma is not None and self._beta is not None  # released by close() only
        if self._parameters.type.root_mean_square:  # no shift to train
            return {"gamma": self._gamma}
        return {"gamma": self._gamma, "beta": self._beta}

    def _named_buffers(self) -> dict[str, Array]:
        if self._moving_mean is None or self._moving_variance is None:
            return {}
        return {"moving_mean": self._moving_mean, "moving_variance": self._moving_variance}

    def _check_state_values(self, where: str, values: Any) -> None:
        variance = values.get("moving_variance")
        if variance is not None and (variance < 0).any():
            raise InvalidParameterError(must_be(f"{where}['moving_variance']", ">= 0 everywhere",
                                                "an array with negative values"))

    def __call__(self, x: Any, output: Array | None = None, *, training: bool = False) -> Array:
        """``layer(x)`` is ``layer.apply(x)``, the inference forward; ``layer(x, training=True)``
        the training one."""
        if not isinstance(training, (bool, np.bool_)):
            raise InvalidParameterError(must_be("NormalizationLayer.__call__(training)", "True or False",
                                                training))
        return self.apply(x, output=output, training=training)

    def _phase(self, where: str, training: object, phase: object) -> LearningPhase:
        """The phase a call asked for: ``training=`` or ``phase=`` (which must agree when both
        are given), inference when neither is.

        In bnnsfw 0.1 ``apply``, ``apply_with_statistics`` and ``apply_backward`` trained by
        default. A call giving neither keyword to a layer with moving statistics (the only
        layers whose two phases compute differently) is warned for one release that it now
        runs inference. Called from a public method, itself wrapped by ``guarded``: the
        warning's stack level points at the caller's line.
        """
        if training is not None and not isinstance(training, (bool, np.bool_)):
            raise InvalidParameterError(must_be(f"{where}(training)", "True or False", training))
        if phase is not None:
            parsed = LearningPhase.parse(phase, f"{where}(phase)")
            if training is not None and bool(training) != (parsed is LearningPhase.training):
                raise InvalidParameterError(must_be(
                    f"{where}(training, phase)",
                    "the same phase when both are given (training=True is phase='training')",
                    f"training={bool(training)} and phase={parsed.name!r}"))
            return parsed
        if training is not None:
            return LearningPhase.training if training else LearningPhase.inference
        if self._moving_mean is not None:
            warnings.warn(
                f"{where}() without training= or phase= runs inference (normalizes with the moving "
                "statistics and leaves them unchanged); bnnsfw 0.1 trained by default. Pass training=True "
                "to train, or training=False for inference, to silence this warning.",
                DeprecationWarning, stacklevel=4)
        return LearningPhase.inference

    # Forward.
    @guarded
    def apply(self, x: Any, phase: LearningPhase | str | None = None, output: Array | None = None, *,
              training: bool | None = None) -> Array:
        """Normalize a batch (``BNNSNormalizationFilterApplyBatch``); inference unless asked to train.

        Parameters
        ----------
        x : ndarray, shape (N, *input_shape), the layer's dtype
            The batch (N >= 1). Never modified, unless it is also ``output``. An unbatched
            sample of shape ``input_shape`` is taken as a batch of one and gives a result of
            its shape. Layer and RMS norm take any number of leading axes,
            ``(*leading, *input_shape)``; batch, instance and group norm take any size where
            ``input_shape`` has ``None``.
        phase : LearningPhase or {"training", "inference"}, optional
            BNNS's spelling of ``training``; both may be given if they agree.
        output : ndarray, shaped like x, optional
            Buffer for the result; may be ``x`` itself (in place).
        training : bool, optional
            Training normalizes with the batch statistics and updates the moving statistics
            in place; inference (the default) uses the moving statistics when the layer has
            them and changes nothing.

        Returns
        -------
        ndarray, shaped like x
            ``output`` when given, else a new array.
        """
        where = "NormalizationLayer.apply"
        return self._forward(where, x, self._phase(where, training, phase), output)[0]

    @guarded
    def apply_with_statistics(self, x: Any, phase: LearningPhase | str | None = None,
                              output: Array | None = None, *,
                              training: bool | None = None) -> NormalizationOutput:
        """:meth:`apply`, also returning the statistics it normalized with (ONNX
        ``LayerNormalization``'s ``Mean`` and ``InvStdDev`` outputs).

        Arguments as for :meth:`apply`. The statistics keep the reduced axes as size 1:
        ``(N, *input_shape[:axis], 1, …)`` for layer norm (and RMS normalization, whose mean
        is ``None``; with leading axes, ``(*leading, *input_shape[:axis], 1, …)``),
        ``(N, C, 1, …)`` for instance norm, ``(1, C, 1, …)`` for batch norm and
        ``(N, G, 1, …)`` for group norm (one value per group of channels).

        >>> import numpy as np
        >>> params = NormalizationParameters(type=NormalizationType.layer(normalization_axis=1),
        ...                                  input_shape=(2, 4), epsilon=0.0, dtype=np.float64)
        >>> with NormalizationLayer(params) as layer:
        ...     result = layer.apply_with_statistics(np.arange(8.0).reshape(1, 2, 4))
        >>> result.mean.shape, result.mean.ravel(), result.inv_std_dev.ravel()
        ((1, 2, 1), array([1.5, 5.5]), array([0.89442719, 0.89442719]))
        """
        where = "NormalizationLayer.apply_with_statistics"
        result, mean, variance = self._forward(where, x, self._phase(where, training, phase), output)
        shape = _Layout.statistics_shape_of(self._parameters, mean.shape[0])
        leading = result.shape[:result.ndim - len(self.input_shape)]
        if len(leading) > 1:  # a layer norm's leading axes, flattened for the kernels
            shape = (*leading, *shape[1:])
        inv_std_dev = (1.0 / np.sqrt(variance + self._parameters.epsilon)).astype(self.dtype, copy=False)
        rms = self._parameters.type.root_mean_square
        return NormalizationOutput(output=result, mean=None if rms else mean.reshape(shape).copy(),
                                   inv_std_dev=inv_std_dev.reshape(shape))

    def _forward(self, where: str, x: Any, phase: LearningPhase,
                 output: Array | None) -> tuple[Array, Array, Array]:
        """The forward: the result, and the mean and variance used (canonical ``(1 or N, G, 1, 1)``)."""
        self._check_open(where.rpartition(".")[2])
        x = self._batch(f"{where}(x)", x)
        out = as_output(f"{where}(output)", output, self.dtype, x.shape)
        rank = len(self.input_shape)
        if x.ndim == rank:  # unbatched: a batch of one, through views
            batched = self._forward(where, x[None], phase, None if out is None else out[None])
            return (out if out is not None else batched[0][0]), batched[1], batched[2]
        if out is not None and np.may_share_memory(out, x) and not _same_memory(out, x):
            raise InvalidParameterError(
                must_be(f"{where}(output)", "x itself or an array that does not overlap x",
                        "an array overlapping x")
            )
        if x.ndim > rank + 1:  # a layer norm's leading axes: one batch axis, through views where they exist
            flat = (-1, *x.shape[x.ndim - rank:])
            direct = out is not None and out.flags.c_contiguous
            result, flat_mean, flat_variance = self._forward(
                where, x.reshape(flat), phase, out.reshape(flat) if direct and out is not None else None)
            if out is None:
                return result.reshape(x.shape), flat_mean, flat_variance
            if not direct:
                np.copyto(out, result.reshape(x.shape))
            return out, flat_mean, flat_variance
        layout, n = self._layout_of(x.shape[1:]), x.shape[0]
        x4 = np.ascontiguousarray(x).reshape(layout.view(n))
        result = out if out is not None else np.empty_like(x4)
        direct = result.flags.c_contiguous
        out4 = result.reshape(x4.shape) if direct else np.empty_like(x4)
        mean: Array | None = None
        variance: Array | None = None
        use_moving = phase is LearningPhase.inference and self._moving_mean is not None
        if use_moving:
            mean, variance = self._moving_view()
        gamma, beta = self._affine_views()
        with self._threads(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            computed = self.backend.normalization_forward(NormalizationForwardRequest(
                x=x4, gamma=gamma, beta=beta, epsilon=self._parameters.epsilon,
                batch_statistics=layout.batch_statistics, activation=self._parameters.activation, out=out4,
                mean=mean, variance=variance, threads=self.filter_parameters.n_threads,
                centered=not self._parameters.type.root_mean_square))
            mean, variance = computed.mean, computed.variance
            if phase is LearningPhase.training and self._moving_mean is not None:
                with self._moving_lock:
                    self._update_moving(mean, variance)
        if not direct:
            np.copyto(result, out4.reshape(result.shape))
        return (result.reshape(x.shape) if out is None else out), mean, variance

    # Backward.
    @guarded
    def apply_backward(
        self,
        x: Any,
        dy: Any,
        output: Array | None = None,
        phase: LearningPhase | str | None = None,
        input_gradient: Array | None = None,
        beta_gradient: Array | None = None,
        gamma_gradient: Array | None = None,
        accumulate: bool = False,
        *,
        training: bool | None = None,
    ) -> NormalizationGradients:
        """Gradients of a forward (``BNNSNormalizationFilterApplyBackwardBatch``).

        The gradients are those of the forward run in ``phase``: in inference with moving
        statistics the statistics are constants (``dx = dz · gamma / sqrt(moving_variance +
        ε)``); otherwise (training, inference without moving statistics, layer and group
        norm) the gradient also flows through the batch statistics. ``dz`` is ``dy`` times the
        activation's derivative. The moving statistics are not touched.

        Parameters
        ----------
        x : ndarray, shape (N, *input_shape) (or as :meth:`apply` takes it)
            The forward's input.
        dy : ndarray, shaped like x
            Gradient of the loss with respect to the forward's output.
        output : ndarray, shaped like x, optional
            The forward's output; required for a non-identity activation (as in BNNS).
            The derivative is taken from it when the activation allows that, otherwise from
            the pre-activation recomputed from ``x``.
        phase : LearningPhase or {"training", "inference"}, optional
            BNNS's spelling of ``training``; both may be given if they agree.
        input_gradient : ndarray, shaped like x, optional
            Buffer for the input gradient. It may be ``dy`` itself (unless ``accumulate``)
            but must not overlap ``x`` or ``output``.
        beta_gradient, gamma_gradient : ndarray, shaped like gamma, optional
            Buffers for the beta and gamma gradients.
        accumulate : bool
            Add into the given buffers instead of overwriting them (BNNS
            ``BNNSNDArrayFlagBackpropAccumulate``); gradients without a buffer are returned
            as new arrays either way.
        training : bool, optional
            The phase of the forward being differentiated: pass what the forward was given
            (the default is inference, as :meth:`apply`'s).

        Returns
        -------
        NormalizationGradients
            ``input``, ``beta`` and ``gamma`` (the given buffers when there are some).
        """
        self._check_open("apply_backward")
        where = "NormalizationLayer.apply_backward"
        return self._backward(where, x, dy, output, self._phase(where, training, phase), input_gradient,
                              beta_gradient, gamma_gradient, accumulate)

    def _backward(self, where: str, x: Any, dy: Any, output: Any, phase: LearningPhase,
                  input_gradient: Array | None, beta_gradient: Array | None,
                  gamma_gradient: Array | None, accumulate: Any) -> NormalizationGradients:
        """:meth:`apply_backward` in the phase it resolved."""
        if not isinstance(accumulate, (bool, np.bool_)):
            raise InvalidParameterError(must_be(f"{where}(accumulate)", "True or False", accumulate))
        x = self._batch(f"{where}(x)", x)
        dtype = self.dtype
        dy = as_input(f"{where}(dy)", dy, dtype, x.shape)
        activation = self._parameters.activation
        if output is not None:
            output = as_input(f"{where}(output)", output, dtype, x.shape)
        elif not activation.is_identity:
            raise InvalidParameterError(
                must_be(f"{where}(output)",
                        f"the forward output (the fused {activation.function.name} activation needs it, "
                        "as in BNNS)",
                        None)
            )
        rank = len(self.input_shape)
        if x.ndim == rank:  # unbatched: a batch of one, through views
            dx_buffer = as_output(f"{where}(input_gradient)", input_gradient, dtype, x.shape)
            batched = self._backward(
                where, x[None], dy[None], None if output is None else output[None], phase,
                None if dx_buffer is None else dx_buffer[None], beta_gradient, gamma_gradient, accumulate)
            return NormalizationGradients(input=dx_buffer if dx_buffer is not None else batched.input[0],
                                          beta=batched.beta, gamma=batched.gamma)
        if x.ndim > rank + 1:  # a layer norm's leading axes: one batch axis
            flat = (-1, *x.shape[x.ndim - rank:])
            dx_buffer = as_output(f"{where}(input_gradient)", input_gradient, dtype, x.shape)
            if dx_buffer is not None:
                self._check_input_gradient(dx_buffer, x, dy, output, bool(accumulate))
            direct = dx_buffer is not None and dx_buffer.flags.c_contiguous
            batched = self._backward(
                where, x.reshape(flat), dy.reshape(flat), None if output is None else output.reshape(flat),
                phase, dx_buffer.reshape(flat) if direct and dx_buffer is not None else None,
                beta_gradient, gamma_gradient, accumulate)
            dx = batched.input.reshape(x.shape)
            if dx_buffer is not None and not direct:
                dx = _deliver(dx, dx_buffer, bool(accumulate), False)
            elif dx_buffer is not None:
                dx = dx_buffer
            return NormalizationGradients(input=dx, beta=batched.beta, gamma=batched.gamma)
        affine = self._parameters.affine_shape
        dx_buffer = as_output(f"{where}(input_gradient)", input_gradient, dtype, x.shape)
        dbeta_buffer = as_output(f"{where}(beta_gradient)", beta_gradient, dtype, affine)
        dgamma_buffer = as_output(f"{where}(gamma_gradient)", gamma_gradient, dtype, affine)
        separate_outputs(where, {"input_gradient": dx_buffer, "beta_gradient": dbeta_buffer,
                                 "gamma_gradient": dgamma_buffer})
        if dx_buffer is not None:
            self._check_input_gradient(dx_buffer, x, dy, output, bool(accumulate))

        layout, n = self._layout_of(x.shape[1:]), x.shape[0]
        view = layout.view(n)
        x4, dy4 = np.ascontiguousarray(x).reshape(view), np.ascontiguousarray(dy).reshape(view)
        output4 = None if output is None else np.ascontiguousarray(output).reshape(view)
        direct = dx_buffer is not None and not accumulate and dx_buffer.flags.c_contiguous
        work = dx_buffer.reshape(view) if dx_buffer is not None and direct else None
        mean = variance = None
        if phase is LearningPhase.inference and self._moving_mean is not None:
            mean, variance = self._moving_view()
        owns_scratch = self._scratch_lock.acquire(blocking=False)
        try:
            scratch = self._scratch_for(x4) if owns_scratch else ()
            gamma, beta = self._affine_views()
            with self._threads(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                grads = self.backend.normalization_backward(NormalizationBackwardRequest(
                    x=x4, dy=dy4, gamma=gamma, beta=beta, epsilon=self._parameters.epsilon,
                    batch_statistics=layout.batch_statistics, activation=activation, output=output4, out=work,
                    mean=mean, variance=variance, scratch=tuple(scratch),
                    threads=self.filter_parameters.n_threads,
                    centered=not self._parameters.type.root_mean_square))
            dx4, dgamma4, dbeta4 = grads.input, grads.gamma, grads.beta
        finally:
            if owns_scratch:
                self._scratch_lock.release()
        dx = _deliver(dx4.reshape(x.shape), dx_buffer, bool(accumulate), direct)
        dbeta = None
        if not self._parameters.type.root_mean_square:  # RMS normalization has no beta
            dbeta = _deliver(dbeta4.reshape(affine), dbeta_buffer, bool(accumulate), False)
        dgamma = _deliver(dgamma4.reshape(affine), dgamma_buffer, bool(accumulate), False)
        return NormalizationGradients(input=dx, beta=dbeta, gamma=dgamma)

    # Helpers.
    def _batch(self, where: str, x: Any) -> Array:
        """``x`` checked: ``(N, *input_shape)``, or one unbatched sample of ``input_shape``;
        a layer norm also takes ``(*leading, *input_shape)``, and an open size (``None``) is
        any size of at least one."""
        shape = self.input_shape
        rank = len(shape)
        leading = self._parameters.type.kind is FilterType.layer_norm
        array = as_input(where, x, self.dtype)
        sample = array.shape[array.ndim - rank:] if array.ndim >= rank else ()
        fits = array.ndim >= rank and all(s is None or s == a for s, a in zip(shape, sample))
        if not fits or array.ndim > rank + 1 and not leading:
            dims = _shape_text(shape)[1:-1].rstrip(",")
            text = (f"(*leading, {dims}) with any number of leading axes" if leading
                    else f"(N, {dims}) or unbatched {_shape_text(shape)}")
            raise ShapeError(must_be(where, f"of shape {text}", describe(array)))
        if any(a < 1 for a in array.shape[:array.ndim - rank]):
            raise ShapeError(must_be(where, "a batch of at least one sample", describe(array)))
        if any(s is None and a < 1 for s, a in zip(shape, sample)):
            raise ShapeError(must_be(where, "of sizes >= 1 where input_shape leaves them open",
                                     describe(array)))
        return array

    def _layout_of(self, sample: tuple[int, ...]) -> "_Layout":
        """The kernels' view for samples of shape ``sample`` (the layer's own, unless some
        spatial size is open)."""
        if not self._parameters.open_sizes:
            return self._layout
        return _Layout.of(self._parameters, sample)

    def _check_input_gradient(self, buffer: Array, x: Array, dy: Array, output: Array | None,
                              accumulate: bool) -> None:
        where = "NormalizationLayer.apply_backward(input_gradient)"
        for name, other in (("x", x), ("output", output)):
            if other is not None and np.may_share_memory(buffer, other):
                raise InvalidParameterError(
                    must_be(where, f"an array that does not overlap {name}", f"one overlapping {name}"))
        if np.may_share_memory(buffer, dy) and (accumulate or not _same_memory(buffer, dy)):
            rule = ("an array that does not overlap dy when accumulate=True" if accumulate
                    else "dy itself or an array that does not overlap dy")
            raise InvalidParameterError(must_be(where, rule, "one overlapping dy"))

    def _scratch_for(self, like: Array) -> list[Array]:
        """The layer's two workspaces, (re)allocated to ``like``'s shape when it changed."""
        if not self._scratch or self._scratch[0].shape != like.shape:
            self._scratch = [np.empty_like(like), np.empty_like(like)]
        return self._scratch

    def _affine_views(self) -> tuple[Array, Array]:
        shape = self._layout.affine_view
        assert self._gamma is not None and self._beta is not None  # released by close() only
        return self._gamma.reshape(shape), self._beta.reshape(shape)

    def _moving_view(self) -> tuple[Array, Array]:
        shape = (1, self._parameters.channels, 1, 1)
        assert self._moving_mean is not None and self._moving_variance is not None  # the caller checks
        return self._moving_mean.reshape(shape), self._moving_variance.reshape(shape)

    def _update_moving(self, mean: Array, variance: Array) -> None:
        """``moving = momentum·moving + (1 − momentum)·batch_statistic``, in place.

        Instance norm's batch statistic is the mean over the batch of the per-instance ones.
        """
        momentum = self._parameters.momentum
        channels = self._parameters.channels
        for moving, stat in ((self._moving_mean, mean), (self._moving_variance, variance)):
            assert moving is not None
            batch = stat.reshape(-1, channels).mean(axis=0)
            np.multiply(moving, momentum, out=moving)
            np.add(moving, (1.0 - momentum) * batch, out=moving)

    def _release(self) -> None:
        self._gamma = self._beta = self._moving_mean = self._moving_variance = None
        self._scratch = []

    def _describe(self) -> str:
        p = self._parameters
        options = ""
        if p.type.kind is FilterType.layer_norm:
            options = f", normalization_axis={p.type.normalization_axis}"
        elif p.type.kind is FilterType.group_norm:
            options = f", group_count={p.type.group_count}"
        return (f"type={p.type.kind.name}{options}, input_shape={p.input_shape}, dtype={p.dtype.name}, "
                f"activation={p.activation.function.name}")


def _deliver(result: Array, buffer: Array | None, accumulate: bool, written: bool) -> Array:
    """Put a gradient where the caller asked: a new array, a buffer, or added to a buffer."""
    if buffer is None:
        return result
    if accumulate:
        np.add(buffer, result, out=buffer)
    elif not written:
        np.copyto(buffer, result)
    return buffer


@attrs.frozen
class _Layout:
    """How a kind maps ``(N, C, *spatial)`` onto the kernels' ``(N, G, K, S)`` view."""

    groups: int
    per_group: int
    positions: int
    batch_statistics: bool
    affine_view: tuple[int, int, int, int]

    def view(self, n: int) -> tuple[int, int, int, int]:
        return (n, self.groups, self.per_group, self.positions)

    @staticmethod
    def statistics_shape_of(p: NormalizationParameters, n: int) -> tuple[int, ...]:
        """The canonical ``(n, G, 1, 1)`` statistics in the input's rank: the axes they vary
        over kept (``N`` or 1, then layer norm's per-sample axes before ``normalization_axis``,
        or the channels, or the groups), the reduced ones as size 1."""
        rank = len(p.input_shape)
        if p.type.kind is FilterType.layer_norm:
            kept = _fixed(p.input_shape[:p.type.axis])
            return (n, *kept, *(1,) * (rank - len(kept)))
        groups = p.type.groups if p.type.kind is FilterType.group_norm else p.channels
        return (n, groups, *(1,) * (rank - 1))

    @classmethod
    def of(cls, p: NormalizationParameters, sample: tuple[int, ...] | None = None) -> "_Layout":
        """The view of samples of shape ``sample`` (by default ``input_shape``, then fixed)."""
        kind, shape = p.type.kind, _fixed(p.input_shape) if sample is None else sample
        channels, positions = shape[0], math.prod(shape[1:])
        if kind is FilterType.layer_norm:
            axis = p.type.axis
            outer, inner = math.prod(shape[:axis]), math.prod(shape[axis:])
            return cls(outer, inner, 1, False, (1, 1, inner, 1))
        if kind is FilterType.group_norm:
            groups = p.type.groups
            per_group = channels // groups
            return cls(groups, per_group, positions, False, (1, groups, per_group, 1))
        return cls(channels, 1, positions, kind is FilterType.batch_norm, (1, channels, 1, 1))

"""Per-element activation functions (``BNNSActivation``) with their derivatives.

An :class:`Activation` is a frozen value: a BNNS function number plus its ``alpha`` and
``beta`` parameters. ``forward`` evaluates it; ``backward`` multiplies an upstream gradient by
its derivative, computed from the forward output where that determines it (sigmoid, tanh,
ReLU, …) and from the forward input otherwise.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import attrs
import numpy as np
from scipy import special

from .enums import ActivationFunction as AF
from ._validation import describe, dtype_text, real_number
from .errors import DTypeError, InvalidParameterError, ShapeError, must_be

__all__ = ["Activation"]

_SELU_LAMBDA = 1.0507009873554805
_SELU_ALPHA = 1.6732632423543772
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)

Array = np.ndarray


class _Kernel(NamedTuple):
    """Forward ``f(x, a, b)`` and derivative, from the input ``d(x, a, b)`` and, when the
    output alone determines it, from the output ``dy(y, a, b)``."""

    forward: Callable[[Array, float, float], Array]
    from_input: Callable[[Array, float, float], Array]
    from_output: Callable[[Array, float, float], Array] | None = None


def _one(x: Array) -> Array:
    return np.ones_like(x)


def _scaled_tanh_from_output(y: Array, a: float, b: float) -> Array:
    if a == 0.0:
        return np.zeros_like(y)
    t = y / a
    return a * b * (1.0 - t * t)


def _gelu_tanh(x: Array, a: float, b: float) -> Array:
    return 0.5 * x * (1.0 + np.tanh(a * (x + b * x**3)))


def _gelu_tanh_d(x: Array, a: float, b: float) -> Array:
    t = np.tanh(a * (x + b * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * a * (1.0 + 3.0 * b * x * x)


def _softplus_d(x: Array, a: float, b: float) -> Array:
    return a * b * special.expit(b * x)


def _celu(x: Array, a: float, b: float) -> Array:
    return np.maximum(x, 0) + np.minimum(0, a * np.expm1(np.minimum(x, 0) / a))


def _celu_d(x: Array, a: float, b: float) -> Array:
    return np.where(x > 0, 1.0, np.exp(np.minimum(x, 0) / a)).astype(x.dtype, copy=False)


def _hard_swish(x: Array, a: float, b: float) -> Array:
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


def _hard_swish_d(x: Array, a: float, b: float) -> Array:
    d = np.where(x < -3.0, 0.0, np.where(x > 3.0, 1.0, (2.0 * x + 3.0) / 6.0))
    return d.astype(x.dtype, copy=False)


def _sigmoid_scaled(x: Array, k: float) -> Array:
    return x * special.expit(k * x)


def _sigmoid_scaled_d(x: Array, k: float) -> Array:
    s = special.expit(k * x)
    return s + k * x * s * (1.0 - s)


def _gelu_erf(x: Array, a: float, b: float) -> Array:
    return 0.5 * x * (1.0 + special.erf(x * _INV_SQRT_2))


def _gelu_erf_d(x: Array, a: float, b: float) -> Array:
    cdf = 0.5 * (1.0 + special.erf(x * _INV_SQRT_2))
    pdf = np.exp(-0.5 * x * x) * (_INV_SQRT_2 * _INV_SQRT_PI)
    return cdf + x * pdf


def _mask(condition: Array, dtype: np.dtype) -> Array:
    return condition.astype(dtype)


def _where(condition: Array, a: Array | float, b: Array | float, dtype: np.dtype) -> Array:
    return np.where(condition, a, b).astype(dtype, copy=False)


_KERNELS: dict[AF, _Kernel] = {
    AF.identity: _Kernel(
        lambda x, a, b: x.copy(), lambda x, a, b: _one(x), lambda y, a, b: _one(y)
    ),
    AF.relu: _Kernel(
        lambda x, a, b: np.maximum(x, 0),
        lambda x, a, b: _mask(x > 0, x.dtype),
        lambda y, a, b: _mask(y > 0, y.dtype),
    ),
    AF.leaky_relu: _Kernel(
        lambda x, a, b: np.where(x < 0, a * x, x),
        lambda x, a, b: _where(x < 0, a, 1.0, x.dtype),
    ),
    AF.sigmoid: _Kernel(
        lambda x, a, b: special.expit(x),
        lambda x, a, b: special.expit(x) * special.expit(-x),
        lambda y, a, b: y * (1.0 - y),
    ),
    AF.tanh: _Kernel(
        lambda x, a, b: np.tanh(x),
        lambda x, a, b: 1.0 - np.tanh(x) ** 2,
        lambda y, a, b: 1.0 - y * y,
    ),
    AF.scaled_tanh: _Kernel(
        lambda x, a, b: a * np.tanh(b * x),
        lambda x, a, b: a * b * (1.0 - np.tanh(b * x) ** 2),
        _scaled_tanh_from_output,
    ),
    AF.abs: _Kernel(lambda x, a, b: np.abs(x), lambda x, a, b: np.sign(x)),
    AF.linear: _Kernel(
        lambda x, a, b: a * x,
        lambda x, a, b: np.full_like(x, a),
        lambda y, a, b: np.full_like(y, a),
    ),
    AF.clamp: _Kernel(
        lambda x, a, b: np.minimum(np.maximum(x, a), b),
        lambda x, a, b: _mask((x > a) & (x < b), x.dtype),
    ),
    AF.gelu_approximation: _Kernel(_gelu_tanh, _gelu_tanh_d),
    AF.hard_sigmoid: _Kernel(
        lambda x, a, b: np.clip(a * x + b, 0.0, 1.0),
        lambda x, a, b: a * _mask((a * x + b > 0) & (a * x + b < 1), x.dtype),
        lambda y, a, b: a * _mask((y > 0) & (y < 1), y.dtype),
    ),
    AF.softplus: _Kernel(lambda x, a, b: a * np.logaddexp(0, b * x), _softplus_d),
    AF.softsign: _Kernel(
        lambda x, a, b: x / (1.0 + np.abs(x)), lambda x, a, b: 1.0 / (1.0 + np.abs(x)) ** 2
    ),
    AF.elu: _Kernel(
        lambda x, a, b: np.where(x < 0, a * np.expm1(np.minimum(x, 0)), x),
        lambda x, a, b: _where(x < 0, a * np.exp(np.minimum(x, 0)), 1.0, x.dtype),
    ),
    AF.clamped_leaky_relu: _Kernel(
        lambda x, a, b: np.minimum(np.where(x < 0, a * x, x), b),
        lambda x, a, b: _where(x < 0, _where(a * x < b, a, 0.0, x.dtype), _mask(x < b, x.dtype), x.dtype),
    ),
    AF.linear_with_bias: _Kernel(
        lambda x, a, b: a * x + b,
        lambda x, a, b: np.full_like(x, a),
        lambda y, a, b: np.full_like(y, a),
    ),
    AF.log_sigmoid: _Kernel(
        lambda x, a, b: -np.logaddexp(0, -x), lambda x, a, b: special.expit(-x)
    ),
    AF.selu: _Kernel(
        lambda x, a, b: _SELU_LAMBDA * np.where(x > 0, x, _SELU_ALPHA * np.expm1(np.minimum(x, 0))),
        lambda x, a, b: _where(x > 0, _SELU_LAMBDA, _SELU_LAMBDA * _SELU_ALPHA * np.exp(np.minimum(x, 0)),
                               x.dtype),
    ),
    AF.celu: _Kernel(_celu, _celu_d),
    AF.hard_shrink: _Kernel(
        lambda x, a, b: np.where(np.abs(x) > a, x, 0.0).astype(x.dtype, copy=False),
        lambda x, a, b: _mask(np.abs(x) > a, x.dtype),
    ),
    AF.soft_shrink: _Kernel(
        lambda x, a, b: np.where(x > a, x - a, np.where(x < -a, x + a, 0.0)).astype(x.dtype, copy=False),
        lambda x, a, b: _mask(np.abs(x) > a, x.dtype),
    ),
    AF.tanh_shrink: _Kernel(lambda x, a, b: x - np.tanh(x), lambda x, a, b: np.tanh(x) ** 2),
    AF.threshold: _Kernel(
        lambda x, a, b: np.where(x <= a, b, x).astype(x.dtype, copy=False),
        lambda x, a, b: _mask(x > a, x.dtype),
    ),
    AF.hard_swish: _Kernel(_hard_swish, _hard_swish_d),
    AF.silu: _Kernel(lambda x, a, b: _sigmoid_scaled(x, 1.0), lambda x, a, b: _sigmoid_scaled_d(x, 1.0)),
    AF.relu6: _Kernel(
        lambda x, a, b: np.clip(x, 0.0, 6.0),
        lambda x, a, b: _mask((x > 0) & (x < 6), x.dtype),
        lambda y, a, b: _mask((y > 0) & (y < 6), y.dtype),
    ),
    AF.erf: _Kernel(
        lambda x, a, b: special.erf(x),
        lambda x, a, b: (2.0 * _INV_SQRT_PI) * np.exp(-x * x),
    ),
    AF.gelu: _Kernel(_gelu_erf, _gelu_erf_d),
    AF.gelu_approximation_sigmoid: _Kernel(
        lambda x, a, b: _sigmoid_scaled(x, 1.702), lambda x, a, b: _sigmoid_scaled_d(x, 1.702)
    ),
}


class _OnnxFunction(NamedTuple):
    """How an ONNX RNN activation maps onto a BNNS one: the function, and the defaults of the
    parameters it takes (``None``: it takes none)."""

    function: AF
    alpha: float | None = None
    beta: float | None = None


#: The activations an ONNX ``LSTM`` / ``GRU`` / ``RNN`` node may name, by lower-case name.
#: Defaults are those of the ONNX operators of the same name (``Affine`` and ``ScaledTanh``,
#: operators no longer in ONNX, get the identity's 1 and 0, and 1 and 1).
_ONNX_FUNCTIONS: dict[str, _OnnxFunction] = {
    "relu": _OnnxFunction(AF.relu),
    "tanh": _OnnxFunction(AF.tanh),
    "sigmoid": _OnnxFunction(AF.sigmoid),
    "affine": _OnnxFunction(AF.linear_with_bias, 1.0, 0.0),
    "leakyrelu": _OnnxFunction(AF.leaky_relu, 0.01),
    "thresholdedrelu": _OnnxFunction(AF.threshold, 1.0),
    "scaledtanh": _OnnxFunction(AF.scaled_tanh, 1.0, 1.0),
    "hardsigmoid": _OnnxFunction(AF.hard_sigmoid, 0.2, 0.5),
    "elu": _OnnxFunction(AF.elu, 1.0),
    "softsign": _OnnxFunction(AF.softsign),
    "softplus": _OnnxFunction(AF.softplus),
}
_ONNX_NAMES = ("Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
               "HardSigmoid", "Elu", "Softsign", "Softplus")


def _to_function(value: object) -> AF:
    return AF.parse(value, "Activation.function")


def _alpha(value: object) -> float:
    return real_number("Activation.alpha", value, "a finite number")


def _beta(value: object) -> float:
    return real_number("Activation.beta", value, "a finite number")


def _finite_float(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidParameterError(must_be(f"Activation.{attribute.name}", "a finite number", value))


def _floats(where: str, value: object) -> Array:
    """An activation's data: a floating-point ndarray (float16, float32 or float64).

    The functions compute in the data's dtype and return it; an integer, boolean or complex
    array has no such dtype to keep (``tanh`` of integers would come back as float64, of
    complex numbers as complex), so it is refused rather than converted.
    """
    if not isinstance(value, np.ndarray):
        raise InvalidParameterError(must_be(where, "a NumPy array of floats", type(value).__name__))
    if value.dtype.kind != "f":
        rule = "a floating-point array (float32 or float64)"
        raise DTypeError(must_be(where, rule, dtype_text(value.dtype)))
    return value


@attrs.frozen
class Activation:
    """A BNNS activation: ``function`` with its ``alpha`` and ``beta`` parameters.

    Parameters
    ----------
    function : ActivationFunction, int or str
        The BNNS function (``3``, ``"sigmoid"`` and ``ActivationFunction.sigmoid`` agree).
    alpha, beta : float
        The function's parameters; their meaning is listed in ``docs/activations.md``.

    Examples
    --------
    >>> import numpy as np
    >>> act = Activation.relu()
    >>> act.forward(np.array([-1.0, 2.0]))
    array([0., 2.])
    >>> act.backward(np.ones(2), y=np.array([0.0, 2.0]))
    array([0., 1.])
    """

    function: AF = attrs.field(converter=_to_function)
    alpha: float = attrs.field(default=0.0, converter=_alpha, validator=_finite_float)
    beta: float = attrs.field(default=0.0, converter=_beta, validator=_finite_float)

    @function.validator
    def _check_parameters(self, attribute: attrs.Attribute, value: AF) -> None:
        if value in (AF.celu,) and self.alpha == 0.0:
            raise InvalidParameterError(must_be("Activation.alpha", "non-zero for CELU", self.alpha))

    # Readable constructors, one per per-element function.
    @classmethod
    def identity(cls) -> "Activation":
        """``x``."""
        return cls(AF.identity)

    @classmethod
    def relu(cls) -> "Activation":
        """``max(x, 0)``."""
        return cls(AF.relu)

    @classmethod
    def leaky_relu(cls, alpha: float = 0.01) -> "Activation":
        """``alpha·x`` for ``x < 0``, else ``x``."""
        return cls(AF.leaky_relu, alpha=alpha)

    @classmethod
    def sigmoid(cls) -> "Activation":
        """``1 / (1 + exp(−x))``."""
        return cls(AF.sigmoid)

    @classmethod
    def tanh(cls) -> "Activation":
        """``tanh(x)``."""
        return cls(AF.tanh)

    @classmethod
    def scaled_tanh(cls, alpha: float = 1.0, beta: float = 1.0) -> "Activation":
        """``alpha·tanh(beta·x)``."""
        return cls(AF.scaled_tanh, alpha=alpha, beta=beta)

    @classmethod
    def abs(cls) -> "Activation":
        """``|x|``."""
        return cls(AF.abs)

    @classmethod
    def linear(cls, alpha: float = 1.0) -> "Activation":
        """``alpha·x``."""
        return cls(AF.linear, alpha=alpha)

    @classmethod
    def clamp(cls, low: float, high: float) -> "Activation":
        """``min(max(x, low), high)``."""
        if low > high:
            raise InvalidParameterError(must_be("Activation.clamp(low, high)", "low <= high", (low, high)))
        return cls(AF.clamp, alpha=low, beta=high)

    @classmethod
    def gelu_approximation(cls, alpha: float = _SQRT_2_OVER_PI, beta: float = 0.044715) -> "Activation":
        """``0.5·x·(1 + tanh(alpha·(x + beta·x³)))``, the tanh form of GELU."""
        return cls(AF.gelu_approximation, alpha=alpha, beta=beta)

    @classmethod
    def hard_sigmoid(cls, alpha: float = 0.2, beta: float = 0.5) -> "Activation":
        """``max(0, min(1, alpha·x + beta))``."""
        return cls(AF.hard_sigmoid, alpha=alpha, beta=beta)

    @classmethod
    def softplus(cls, alpha: float = 1.0, beta: float = 1.0) -> "Activation":
        """``alpha·log(1 + exp(beta·x))``."""
        return cls(AF.softplus, alpha=alpha, beta=beta)

    @classmethod
    def softsign(cls) -> "Activation":
        """``x / (1 + |x|)``."""
        return cls(AF.softsign)

    @classmethod
    def elu(cls, alpha: float = 1.0) -> "Activation":
        """``alpha·(exp(x) − 1)`` for ``x < 0``, else ``x``."""
        return cls(AF.elu, alpha=alpha)

    @classmethod
    def clamped_leaky_relu(cls, alpha: float, beta: float) -> "Activation":
        """``min(alpha·x, beta)`` for ``x < 0``, else ``min(x, beta)``."""
        return cls(AF.clamped_leaky_relu, alpha=alpha, beta=beta)

    @classmethod
    def linear_with_bias(cls, alpha: float = 1.0, beta: float = 0.0) -> "Activation":
        """``alpha·x + beta``."""
        return cls(AF.linear_with_bias, alpha=alpha, beta=beta)

    @classmethod
    def log_sigmoid(cls) -> "Activation":
        """``log(1 / (1 + exp(−x)))``."""
        return cls(AF.log_sigmoid)

    @classmethod
    def selu(cls) -> "Activation":
        """``λ·x`` for ``x > 0``, else ``λ·a·(exp(x) − 1)`` with the standard λ and a."""
        return cls(AF.selu)

    @classmethod
    def celu(cls, alpha: float = 1.0) -> "Activation":
        """``max(0, x) + min(0, alpha·(exp(x/alpha) − 1))``."""
        return cls(AF.celu, alpha=alpha)

    @classmethod
    def hard_shrink(cls, alpha: float = 0.5) -> "Activation":
        """``x`` where ``|x| > alpha``, else 0."""
        return cls(AF.hard_shrink, alpha=alpha)

    @classmethod
    def soft_shrink(cls, alpha: float = 0.5) -> "Activation":
        """``x − alpha`` above ``alpha``, ``x + alpha`` below ``−alpha``, else 0."""
        return cls(AF.soft_shrink, alpha=alpha)

    @classmethod
    def tanh_shrink(cls) -> "Activation":
        """``x − tanh(x)``."""
        return cls(AF.tanh_shrink)

    @classmethod
    def threshold(cls, alpha: float = 0.0, beta: float = 0.0) -> "Activation":
        """``beta`` where ``x <= alpha``, else ``x``."""
        return cls(AF.threshold, alpha=alpha, beta=beta)

    @classmethod
    def hard_swish(cls) -> "Activation":
        """``x·ReLU6(x + 3)/6``."""
        return cls(AF.hard_swish)

    @classmethod
    def silu(cls) -> "Activation":
        """``x·sigmoid(x)``."""
        return cls(AF.silu)

    @classmethod
    def relu6(cls) -> "Activation":
        """``min(max(x, 0), 6)``."""
        return cls(AF.relu6)

    @classmethod
    def erf(cls) -> "Activation":
        """The error function."""
        return cls(AF.erf)

    @classmethod
    def gelu(cls) -> "Activation":
        """``0.5·x·(1 + erf(x/√2))``, the exact GELU."""
        return cls(AF.gelu)

    @classmethod
    def gelu_approximation_sigmoid(cls) -> "Activation":
        """``x·sigmoid(1.702·x)``."""
        return cls(AF.gelu_approximation_sigmoid)

    @classmethod
    def onnx(cls, name: str, alpha: float | None = None, beta: float | None = None) -> "Activation":
        """The activation an ONNX recurrent node names (``"Sigmoid"``, ``"LeakyRelu"``, …).

        ``alpha`` and ``beta`` are used by the functions that take them (``Affine``,
        ``LeakyRelu``, ``ThresholdedRelu``, ``ScaledTanh``, ``HardSigmoid``, ``Elu``) and
        default to the ONNX operators' values; giving one to a function that takes none is
        an error. Names are matched without regard to case.

        ==================  ======================================  =================
        ONNX                bnnsfw                                  defaults
        ==================  ======================================  =================
        Relu                ``relu()``
        Tanh                ``tanh()``
        Sigmoid             ``sigmoid()``
        Affine              ``linear_with_bias(α, β)``: α·x + β     α = 1, β = 0
        LeakyRelu           ``leaky_relu(α)``                       α = 0.01
        ThresholdedRelu     ``threshold(α, 0)``: x if x > α else 0  α = 1
        ScaledTanh          ``scaled_tanh(α, β)``: α·tanh(β·x)      α = 1, β = 1
        HardSigmoid         ``hard_sigmoid(α, β)``                  α = 0.2, β = 0.5
        Elu                 ``elu(α)``                              α = 1
        Softsign            ``softsign()``
        Softplus            ``softplus(1, 1)``: log(1 + eˣ)
        ==================  ======================================  =================

        >>> Activation.onnx("HardSigmoid")
        Activation(function=<ActivationFunction.hard_sigmoid: 15>, alpha=0.2, beta=0.5)
        >>> Activation.onnx("LeakyRelu", alpha=0.1).alpha
        0.1
        """
        where = "Activation.onnx(name)"
        entry = _ONNX_FUNCTIONS.get(name.lower()) if isinstance(name, str) else None
        if entry is None:
            raise InvalidParameterError(must_be(where, "one of " + ", ".join(_ONNX_NAMES), name))
        for label, given, default in (("alpha", alpha, entry.alpha), ("beta", beta, entry.beta)):
            if given is not None and default is None:
                raise InvalidParameterError(must_be(
                    f"Activation.onnx({label})", f"None for {name} (it takes no {label})", given))
        if entry.function is AF.softplus:  # ONNX's Softplus is log(1 + eˣ): BNNS's with α = β = 1
            return cls(AF.softplus, alpha=1.0, beta=1.0)

        def parameter(given: float | None, default: float | None) -> float:
            if default is None:
                return 0.0
            return default if given is None else given

        return cls(entry.function, alpha=parameter(alpha, entry.alpha), beta=parameter(beta, entry.beta))

    @staticmethod
    def onnx_takes(name: str) -> tuple[bool, bool]:
        """Whether the ONNX activation ``name`` takes an ``alpha`` and a ``beta``: what decides
        which values of a node's ``activation_alpha`` / ``activation_beta`` it consumes."""
        entry = _ONNX_FUNCTIONS.get(name.lower()) if isinstance(name, str) else None
        if entry is None:
            rule = "one of " + ", ".join(_ONNX_NAMES)
            raise InvalidParameterError(must_be("Activation.onnx_takes(name)", rule, name))
        return entry.alpha is not None, entry.beta is not None

    # Properties.
    @property
    def is_identity(self) -> bool:
        """True for the identity (layers skip the activation pass entirely)."""
        return self.function is AF.identity

    @property
    def is_elementwise(self) -> bool:
        """True when the function maps each element on its own, deterministically."""
        return self.function.is_elementwise

    @property
    def derivative_from_output(self) -> bool:
        """True when the forward output alone determines the derivative."""
        kernel = _KERNELS.get(self.function)
        return kernel is not None and kernel.from_output is not None

    def require_elementwise(self, where: str) -> "Activation":
        """Return ``self``, or raise when the function is not per-element."""
        if not self.is_elementwise:
            raise InvalidParameterError(
                must_be(where, "a per-element activation (not softmax, log-softmax, PReLU, "
                        "integer or random ones)", self.function.name)
            )
        return self

    def _kernel(self) -> _Kernel:
        return _KERNELS[self.require_elementwise(f"Activation.function ({self.function.name})").function]

    def forward(self, x: Array, out: Array | None = None) -> Array:
        """Evaluate the activation on ``x`` (any shape, float dtype), into ``out`` if given.

        ``out`` may be ``x`` itself for an in-place evaluation.
        """
        x = _floats("Activation.forward(x)", x)
        if out is not None:
            out = _floats("Activation.forward(out)", out)
            if out.shape != x.shape or out.dtype != x.dtype or not out.flags.writeable:
                raise ShapeError(must_be("Activation.forward(out)",
                                         f"a writable array like x ({describe(x)})", describe(out)))
        y = self._kernel().forward(x, self.alpha, self.beta)
        if out is None:
            return np.asarray(y, dtype=x.dtype)
        np.copyto(out, y)
        return out

    def derivative(self, x: Array | None = None, y: Array | None = None) -> Array:
        """``f'`` at the forward point, from ``y = f(x)`` when that suffices, else from ``x``."""
        x = None if x is None else _floats("Activation.derivative(x)", x)
        y = None if y is None else _floats("Activation.derivative(y)", y)
        kernel = self._kernel()
        if y is not None and kernel.from_output is not None:
            return np.asarray(kernel.from_output(y, self.alpha, self.beta), dtype=y.dtype)
        if x is None:
            needs = "the forward input x" if kernel.from_output is None else "x or the forward output y"
            raise InvalidParameterError(
                must_be(f"Activation.derivative for {self.function.name}", f"given {needs}", None)
            )
        return np.asarray(kernel.from_input(x, self.alpha, self.beta), dtype=x.dtype)

    def backward(self, dy: Array, x: Array | None = None, y: Array | None = None) -> Array:
        """Gradient with respect to the activation's input: ``dy · f'(x)``.

        Parameters
        ----------
        dy : ndarray
            Gradient with respect to the output, same shape as the forward data.
        x, y : ndarray, optional
            The forward input and output; ``y`` suffices for functions whose derivative it
            determines (:attr:`derivative_from_output`), ``x`` is needed for the others.
        """
        dy = _floats("Activation.backward(dy)", dy)
        for name, value in (("x", x), ("y", y)):
            if value is not None and np.shape(value) != dy.shape:
                raise ShapeError(must_be(f"Activation.backward({name})", f"of dy's shape {dy.shape}",
                                         describe(_floats(f"Activation.backward({name})", value))))
        if self.is_identity:
            return dy.copy()
        return dy * self.derivative(x=x, y=y)

    # Plain state (what a weights file stores).
    def to_state(self) -> list[float]:
        """``[function, alpha, beta]``: the activation as plain numbers, for files and JSON.

        >>> Activation.leaky_relu(0.2).to_state()
        [2, 0.2, 0.0]
        """
        return [int(self.function), self.alpha, self.beta]

    @classmethod
    def from_state(cls, state: object) -> "Activation":
        """The activation that :meth:`to_state` wrote as ``[function, alpha, beta]``."""
        if not isinstance(state, (list, tuple)) or len(state) != 3:
            rule = "[function, alpha, beta]"
            raise InvalidParameterError(must_be("Activation.from_state(state)", rule, state))
        function, alpha, beta = state
        return cls(function, alpha, beta)

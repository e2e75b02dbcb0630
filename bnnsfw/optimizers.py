"""Optimizers that update parameter arrays in place: SGD (with momentum), Adam and RMSProp.

These correspond to BNNS's ``BNNSOptimizerStep`` with ``BNNSOptimizerFunctionSGDMomentum``,
``…Adam`` and ``…RMSProp``. As in BNNS, one call updates several parameters at once: the
caller passes a list of parameter arrays and a list of their gradients, and every parameter
array is updated **in place** (the array object is never replaced), so a layer created with
``FilterParameters(use_client_pointer=True)``, or a layer whose live ``weights`` array was
passed, sees the new values at its next ``apply``. Gradients are never modified.

Each step, for the gradients ``g`` of all parameters ``p``, in this order:

1. ``g ← g · gradient_scale``;
2. clip by value: each element to ``[−clip_value, clip_value]`` (when ``clip_value`` is set);
3. clip by global norm (when ``clip_norm`` is set): with ``n`` the L2 norm of all the
   gradients together, multiply every gradient by ``min(1, clip_norm / (n + 1e-6))``, as
   ``torch.nn.utils.clip_grad_norm_`` does;
4. L2 weight decay: ``g ← g + weight_decay · p``;
5. the optimizer's update rule (see each class), which follows PyTorch's formulation.

The order is bnnsfw's decision: Apple does not document the order of these operations
inside ``BNNSOptimizerStep``, so results correspond to BNNS's options without a claim of
bit-exact equality.

The state each rule needs (momentum buffers, moment estimates: BNNS's *accumulators*, which
BNNS callers allocate) is kept by the optimizer, one entry per parameter position, created
at the first step. Later steps must pass the same number of parameters, in the same order,
with the same shapes and dtypes. :meth:`Optimizer.state_dict` returns that state as a flat
dict of NumPy arrays and integers (``np.savez(path, **state)`` saves it) and
:meth:`Optimizer.load_state_dict` restores it, so a resumed run continues exactly as an
uninterrupted one. Hyperparameters are not part of the state: create the optimizer with the
same ones (or the ones you want to continue with) before loading.

BNNS names of the options (fields of ``BNNSOptimizerSGDMomentumFields``,
``BNNSOptimizerAdamFields`` and ``BNNSOptimizerRMSPropFields``):

- ``learning_rate`` and ``gradient_scale``: the fields of the same names.
- ``weight_decay``: ``regularization_scale`` with ``regularization_func =
  BNNSOptimizerRegularizationL2`` (L1 regularization is not offered).
- ``clip_value``: ``clip_gradients = true`` with ``clip_gradients_min = −clip_value`` and
  ``clip_gradients_max = clip_value`` (BNNS also allows asymmetric bounds).
- ``clip_norm``: in the ``…WithClippingFields`` structures (such as
  ``BNNSOptimizerAdamWithClippingFields``), ``clipping_func =
  BNNSOptimizerClippingByGlobalNorm`` with ``clip_gradients_max_norm =
  clip_norm`` and ``clip_gradients_use_norm = 0`` (compute the norm).
- ``SGD(momentum=, nesterov=)``: ``BNNSOptimizerSGDMomentumFields.momentum`` and ``.nesterov``.
- ``Adam(beta1=, beta2=, epsilon=)``: the fields of the same names. Adam's ``time_step``,
  which BNNS leaves to the caller to advance after updating all parameters, corresponds to
  :attr:`Optimizer.step_count`: :meth:`Optimizer.step` advances it and uses the new value as
  ``t`` in the bias corrections.
- ``RMSProp(alpha=, epsilon=, centered=, momentum=)``: the fields of the same names.

Not offered: BNNS's ``sgd_momentum_variant`` choices (bnnsfw implements the PyTorch form of
SGD with momentum), AMSGrad, AdamW, and clipping each tensor by its own norm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ._validation import SUPPORTED_DTYPES, as_input, describe, finite_float
from .errors import DTypeError, InvalidParameterError, ShapeError, must_be

__all__ = ["Optimizer", "SGD", "Adam", "RMSProp"]

#: Added to the global norm before dividing, as torch.nn.utils.clip_grad_norm_ does.
_NORM_EPSILON = 1e-6


def _positive(where: str, value: object) -> float:
    number = finite_float(where, value)
    if number <= 0.0:
        raise InvalidParameterError(must_be(where, "a finite number > 0", value))
    return number


def _optional_positive(where: str, value: object) -> float | None:
    return None if value is None else _positive(where, value)


def _unit_interval(where: str, value: object) -> float:
    """A number in [0, 1)."""
    return finite_float(where, value, low=0.0, high=1.0, high_open=True)


def _flag(where: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParameterError(must_be(where, "True or False", value))
    return bool(value)


def _count(where: str, value: object) -> int:
    """An integer >= 0 from a Python int or a 0-d integer array (as ``np.load`` returns)."""
    array = np.asarray(value)
    if isinstance(value, bool) or array.ndim != 0 or array.dtype.kind not in "iu" or int(array) < 0:
        raise InvalidParameterError(must_be(where, "an integer >= 0", value))
    return int(array)


class Optimizer:
    """Base class: hyperparameters shared by every optimizer, the step pipeline and the state.

    Subclasses name their per-parameter state arrays in :meth:`_state_names` and apply their
    rule in :meth:`_update`.
    """

    def __init__(
        self,
        *,
        learning_rate: float,
        weight_decay: float,
        clip_value: float | None,
        clip_norm: float | None,
        gradient_scale: float,
    ) -> None:
        name = type(self).__name__
        self._learning_rate = _positive(f"{name}.learning_rate", learning_rate)
        self._weight_decay = finite_float(f"{name}.weight_decay", weight_decay, low=0.0)
        self._clip_value = _optional_positive(f"{name}.clip_value", clip_value)
        self._clip_norm = _optional_positive(f"{name}.clip_norm", clip_norm)
        self._gradient_scale = _positive(f"{name}.gradient_scale", gradient_scale)
        self._step_count = 0
        self._shapes: list[tuple[int, ...]] | None = None
        self._dtypes: list[np.dtype | None] = []
        self._state: list[dict[str, np.ndarray]] = []

    # Hyperparameters.
    @property
    def learning_rate(self) -> float:
        """The step size; may be changed between steps (a schedule), and must stay > 0."""
        return self._learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._learning_rate = _positive(f"{type(self).__name__}.learning_rate", value)

    @property
    def weight_decay(self) -> float:
        """L2 regularization, adding ``weight_decay · p`` to each gradient."""
        return self._weight_decay

    @property
    def clip_value(self) -> float | None:
        """Bound for clipping gradients elementwise to ``[−clip_value, clip_value]`` (``None`` is off)."""
        return self._clip_value

    @property
    def clip_norm(self) -> float | None:
        """Maximum global L2 norm of all the gradients of a step (``None`` is off)."""
        return self._clip_norm

    @property
    def gradient_scale(self) -> float:
        """Factor applied to every gradient first."""
        return self._gradient_scale

    @property
    def step_count(self) -> int:
        """How many steps have been taken (restored by :meth:`load_state_dict`)."""
        return self._step_count

    def _hyperparameters(self) -> dict[str, object]:
        return {
            "learning_rate": self._learning_rate,
            "weight_decay": self._weight_decay,
            "clip_value": self._clip_value,
            "clip_norm": self._clip_norm,
            "gradient_scale": self._gradient_scale,
        }

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self._hyperparameters().items())
        return f"{type(self).__name__}({options}; step_count={self._step_count})"

    # The step.
    def step(self, parameters: Sequence[np.ndarray], gradients: Sequence[object]) -> None:
        """Update every parameter array in place from its gradient.

        Parameters
        ----------
        parameters : list or tuple of ndarray (float32 or float64, writable)
            Updated in place; never replaced.
        gradients : list or tuple of ndarray
            One per parameter, of its shape and dtype. Not modified.
        """
        params, grads = self._check_step(parameters, gradients)
        work = self._prepare(params, grads)
        if self._shapes is None:
            self._shapes = [p.shape for p in params]
            self._dtypes = [p.dtype for p in params]
            self._state = [
                {name: np.zeros(p.shape, dtype=p.dtype) for name in self._state_names()} for p in params
            ]
        else:
            self._dtypes = [p.dtype for p in params]
        self._step_count += 1
        for parameter, gradient, state in zip(params, work, self._state):
            self._update(parameter, gradient, state)

    def _check_step(self, parameters: object, gradients: object) -> tuple[list[np.ndarray], list[np.ndarray]]:
        where = f"{type(self).__name__}.step"
        params = self._sequence(f"{where}(parameters)", parameters)
        grads = self._sequence(f"{where}(gradients)", gradients)
        if not params:
            raise InvalidParameterError(must_be(f"{where}(parameters)", "at least one array", []))
        if len(grads) != len(params):
            raise InvalidParameterError(must_be(
                f"{where}(gradients)", f"{len(params)} arrays, one per parameter", f"{len(grads)} arrays"))
        if self._shapes is not None and len(params) != len(self._shapes):
            raise InvalidParameterError(must_be(
                f"{where}(parameters)",
                f"the {len(self._shapes)} arrays of the earlier steps (same count, order and shapes)",
                f"{len(params)} arrays"))
        for i, p in enumerate(params):
            name = f"{where}(parameters[{i}])"
            if not isinstance(p, np.ndarray):
                raise InvalidParameterError(must_be(
                    name, "a NumPy array (updated in place)", type(p).__name__))
            if p.dtype not in SUPPORTED_DTYPES:
                raise DTypeError(must_be(name, "a float32 or float64 array", p.dtype.name))
            if not p.flags.writeable:
                raise InvalidParameterError(must_be(name, "a writable array", "a read-only array"))
            if self._shapes is not None:
                if p.shape != self._shapes[i]:
                    raise ShapeError(must_be(
                        name, f"of shape {self._shapes[i]}, as in the earlier steps", describe(p)))
                known = self._dtypes[i]
                if known is not None and p.dtype != known:
                    raise DTypeError(must_be(name, f"{known.name}, as in the earlier steps", p.dtype.name))
        checked = [as_input(f"{where}(gradients[{i}])", g, p.dtype, p.shape)
                   for i, (p, g) in enumerate(zip(params, grads))]
        return params, checked

    @staticmethod
    def _sequence(where: str, value: object) -> list:
        if isinstance(value, np.ndarray) or not isinstance(value, Sequence) or isinstance(value, str):
            raise InvalidParameterError(must_be(
                where, "a list or tuple of arrays (wrap a single array in a list)", type(value).__name__))
        return list(value)

    def _prepare(self, params: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
        """Steps 1–4: scaled, clipped, decayed copies of the gradients."""
        scale = self._gradient_scale
        work = [g * scale if scale != 1.0 else g.copy() for g in grads]
        if self._clip_value is not None:
            for w in work:
                np.clip(w, -self._clip_value, self._clip_value, out=w)
        if self._clip_norm is not None:
            norm = math.sqrt(sum(float(np.sum(np.square(w, dtype=np.float64))) for w in work))
            factor = self._clip_norm / (norm + _NORM_EPSILON)
            if factor < 1.0:
                for w in work:
                    w *= factor
        if self._weight_decay != 0.0:
            for w, p in zip(work, params):
                w += self._weight_decay * p
        return work

    # Hooks.
    def _state_names(self) -> tuple[str, ...]:
        """Names of the state arrays kept per parameter (shape and dtype of the parameter)."""
        return ()

    def _update(self, parameter: np.ndarray, gradient: np.ndarray, state: dict[str, np.ndarray]) -> None:
        """Apply the rule to one parameter; ``gradient`` is a scratch copy that may be overwritten."""
        raise NotImplementedError

    # State.
    def state_dict(self) -> dict[str, object]:
        """The optimizer's state as a flat dict of NumPy arrays and integers.

        Keys: ``step_count``, ``parameter_count``, and per parameter position ``i``:
        ``shape.i`` (the parameter's shape, int64) and one array per state name, e.g.
        ``exp_avg.i``. The arrays are copies. ``np.savez(file, **optimizer.state_dict())``
        saves it; ``optimizer.load_state_dict(np.load(file))`` restores it.
        """
        state: dict[str, object] = {
            "step_count": self._step_count,
            "parameter_count": 0 if self._shapes is None else len(self._shapes),
        }
        for i, shape in enumerate(self._shapes or []):
            state[f"shape.{i}"] = np.array(shape, dtype=np.int64)
            for name, array in self._state[i].items():
                state[f"{name}.{i}"] = array.copy()
        return state

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore a state returned by :meth:`state_dict` (of an optimizer of this kind and options).

        Everything is validated before anything changes: the keys (which depend on the optimizer
        and on options such as ``momentum`` or ``centered``), the counts, the shapes and the
        dtypes.
        """
        where = f"{type(self).__name__}.load_state_dict(state)"
        if not isinstance(state, Mapping):
            raise InvalidParameterError(must_be(
                where, "a mapping from state_dict() or np.load", type(state).__name__))
        for key in ("step_count", "parameter_count"):
            if key not in state:
                raise InvalidParameterError(must_be(
                    where, f"a state with the key {key!r}", sorted(state.keys())))
        step_count = _count(f"{where}['step_count']", state["step_count"])
        count = _count(f"{where}['parameter_count']", state["parameter_count"])
        if (step_count == 0) != (count == 0):
            raise InvalidParameterError(must_be(
                where, "a state where parameter_count is 0 exactly when step_count is 0",
                f"step_count={step_count}, parameter_count={count}"))
        names = self._state_names()
        expected = {"step_count", "parameter_count"}
        for i in range(count):
            expected.add(f"shape.{i}")
            expected.update(f"{name}.{i}" for name in names)
        keys = set(state.keys())
        if keys != expected:
            missing, unexpected = sorted(expected - keys), sorted(keys - expected)
            raise InvalidParameterError(must_be(
                where, f"a {type(self).__name__} state with these options",
                f"missing keys {missing}, unexpected keys {unexpected}"))
        shapes: list[tuple[int, ...]] = []
        dtypes: list[np.dtype | None] = []
        arrays: list[dict[str, np.ndarray]] = []
        for i in range(count):
            raw = np.asarray(state[f"shape.{i}"])
            if raw.ndim != 1 or raw.dtype.kind not in "iu" or (raw.size and raw.min() < 0):
                raise InvalidParameterError(must_be(
                    f"{where}['shape.{i}']", "a 1-D array of integers >= 0", raw))
            shape = tuple(int(s) for s in raw)
            entry: dict[str, np.ndarray] = {}
            dtype: np.dtype | None = None
            for name in names:
                key = f"{where}['{name}.{i}']"
                value = state[f"{name}.{i}"]
                if not isinstance(value, np.ndarray):
                    raise InvalidParameterError(must_be(key, "a NumPy array", type(value).__name__))
                if value.dtype not in SUPPORTED_DTYPES or (dtype is not None and value.dtype != dtype):
                    rule = ("float32 or float64" if dtype is None
                            else f"{dtype.name}, like the other arrays of position {i}")
                    raise DTypeError(must_be(key, rule, value.dtype.name))
                if value.shape != shape:
                    raise ShapeError(must_be(key, f"of shape {shape} (shape.{i})", describe(value)))
                dtype = value.dtype
                entry[name] = np.array(value, copy=True, order="C")
            shapes.append(shape)
            dtypes.append(dtype)
            arrays.append(entry)
        self._step_count = step_count
        self._shapes = shapes if count else None
        self._dtypes = dtypes
        self._state = arrays


class SGD(Optimizer):
    """Stochastic gradient descent, optionally with (Nesterov) momentum.

    With ``g`` the prepared gradient (see the module docstring) and ``v`` the momentum buffer
    (zeros before the first step)::

        v ← momentum · v + g
        p ← p − learning_rate · (g + momentum · v)     if nesterov
        p ← p − learning_rate · v                      otherwise

    With ``momentum = 0`` this is ``p ← p − learning_rate · g`` and no state is kept.

    Parameters
    ----------
    learning_rate : float
        > 0 (BNNS ``learning_rate``).
    momentum : float
        In [0, 1) (``BNNSOptimizerSGDMomentumFields.momentum``).
    nesterov : bool
        Nesterov momentum (``BNNSOptimizerSGDMomentumFields.nesterov``); needs ``momentum > 0``.
    weight_decay, clip_value, clip_norm, gradient_scale
        See :class:`Optimizer` and the module docstring.

    Examples
    --------
    >>> import numpy as np
    >>> w = np.array([1.0, 2.0])
    >>> opt = SGD(0.1, momentum=0.9)
    >>> opt.step([w], [np.array([1.0, -1.0])])
    >>> opt.step([w], [np.array([1.0, -1.0])])
    >>> w, opt.step_count
    (array([0.71, 2.29]), 2)
    """

    def __init__(
        self,
        learning_rate: float,
        *,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        clip_value: float | None = None,
        clip_norm: float | None = None,
        gradient_scale: float = 1.0,
    ) -> None:
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay, clip_value=clip_value,
                         clip_norm=clip_norm, gradient_scale=gradient_scale)
        self._momentum = _unit_interval("SGD.momentum", momentum)
        self._nesterov = _flag("SGD.nesterov", nesterov)
        if self._nesterov and self._momentum == 0.0:
            raise InvalidParameterError(must_be("SGD.momentum", "> 0 when nesterov=True", momentum))

    @property
    def momentum(self) -> float:
        return self._momentum

    @property
    def nesterov(self) -> bool:
        return self._nesterov

    def _hyperparameters(self) -> dict[str, object]:
        return {"learning_rate": self._learning_rate, "momentum": self._momentum, "nesterov": self._nesterov,
                **{k: v for k, v in super()._hyperparameters().items() if k != "learning_rate"}}

    def _state_names(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self._momentum != 0.0 else ()

    def _update(self, parameter: np.ndarray, gradient: np.ndarray, state: dict[str, np.ndarray]) -> None:
        lr = self._learning_rate
        if self._momentum == 0.0:
            gradient *= lr
            parameter -= gradient
            return
        velocity = state["momentum_buffer"]
        velocity *= self._momentum
        velocity += gradient
        if self._nesterov:
            gradient += self._momentum * velocity
            gradient *= lr
            parameter -= gradient
        else:
            parameter -= lr * velocity


class Adam(Optimizer):
    """Adam, with bias-corrected moment estimates.

    With ``g`` the prepared gradient, ``t`` the step count including this step, and ``m``,
    ``v`` zeros before the first step::

        m ← beta1 · m + (1 − beta1) · g
        v ← beta2 · v + (1 − beta2) · g²
        m̂ = m / (1 − beta1ᵗ),   v̂ = v / (1 − beta2ᵗ)
        p ← p − learning_rate · m̂ / (√v̂ + epsilon)

    ``weight_decay`` is L2 regularization added to the gradient (Adam, not AdamW).

    Parameters
    ----------
    learning_rate : float
        > 0 (default 1e-3).
    beta1, beta2 : float
        In [0, 1) (BNNS ``beta1``, ``beta2``; defaults 0.9, 0.999).
    epsilon : float
        > 0 (BNNS ``epsilon``; default 1e-8).
    weight_decay, clip_value, clip_norm, gradient_scale
        See :class:`Optimizer` and the module docstring.

    Examples
    --------
    >>> import numpy as np
    >>> w = np.array([1.0, 2.0])
    >>> Adam(learning_rate=0.1).step([w], [np.array([0.5, -3.0])])
    >>> w   # the first Adam step moves each element by about learning_rate
    array([0.9, 2.1])
    """

    def __init__(
        self,
        learning_rate: float = 1e-3,
        *,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        weight_decay: float = 0.0,
        clip_value: float | None = None,
        clip_norm: float | None = None,
        gradient_scale: float = 1.0,
    ) -> None:
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay, clip_value=clip_value,
                         clip_norm=clip_norm, gradient_scale=gradient_scale)
        self._beta1 = _unit_interval("Adam.beta1", beta1)
        self._beta2 = _unit_interval("Adam.beta2", beta2)
        self._epsilon = _positive("Adam.epsilon", epsilon)

    @property
    def beta1(self) -> float:
        return self._beta1

    @property
    def beta2(self) -> float:
        return self._beta2

    @property
    def epsilon(self) -> float:
        return self._epsilon

    def _hyperparameters(self) -> dict[str, object]:
        return {"learning_rate": self._learning_rate, "beta1": self._beta1, "beta2": self._beta2,
                "epsilon": self._epsilon,
                **{k: v for k, v in super()._hyperparameters().items() if k != "learning_rate"}}

    def _state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _update(self, parameter: np.ndarray, gradient: np.ndarray, state: dict[str, np.ndarray]) -> None:
        t = self._step_count
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= self._beta1
        m += (1.0 - self._beta1) * gradient
        v *= self._beta2
        gradient *= gradient
        gradient *= 1.0 - self._beta2
        v += gradient
        correction1 = 1.0 - self._beta1**t
        correction2 = 1.0 - self._beta2**t
        denominator = np.sqrt(v)
        denominator *= 1.0 / math.sqrt(correction2)  # √v̂
        denominator += self._epsilon
        update = np.divide(m, denominator, out=denominator)
        update *= self._learning_rate / correction1  # m̂ = m / correction1
        parameter -= update


class RMSProp(Optimizer):
    """RMSProp, as PyTorch's ``RMSprop``, with the centered and momentum variants.

    With ``g`` the prepared gradient and ``s``, ``a``, ``b`` zeros before the first step::

        s ← alpha · s + (1 − alpha) · g²
        a ← alpha · a + (1 − alpha) · g                 (centered only)
        d = √(s − a²) + epsilon   if centered,   else √s + epsilon
        b ← momentum · b + g / d;  p ← p − learning_rate · b     if momentum > 0
        p ← p − learning_rate · g / d                            otherwise

    ``s − a²`` is clamped at 0 before the square root, against rounding.

    Parameters
    ----------
    learning_rate : float
        > 0 (default 1e-2).
    alpha : float
        Smoothing constant in [0, 1) (BNNS ``alpha``; default 0.99).
    epsilon : float
        > 0, added to the denominator (BNNS ``epsilon``; default 1e-8).
    momentum : float
        In [0, 1) (BNNS ``momentum``; default 0).
    centered : bool
        Normalize by an estimate of the gradient's variance (BNNS ``centered``).
    weight_decay, clip_value, clip_norm, gradient_scale
        See :class:`Optimizer` and the module docstring.

    Examples
    --------
    >>> import numpy as np
    >>> w = np.array([1.0])
    >>> RMSProp(learning_rate=0.01, alpha=0.75).step([w], [np.array([2.0])])
    >>> w   # s = 0.25·4 = 1, so p ← 1 − 0.01·2/(1 + 1e-8)
    array([0.98])
    """

    def __init__(
        self,
        learning_rate: float = 1e-2,
        *,
        alpha: float = 0.99,
        epsilon: float = 1e-8,
        momentum: float = 0.0,
        centered: bool = False,
        weight_decay: float = 0.0,
        clip_value: float | None = None,
        clip_norm: float | None = None,
        gradient_scale: float = 1.0,
    ) -> None:
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay, clip_value=clip_value,
                         clip_norm=clip_norm, gradient_scale=gradient_scale)
        self._alpha = _unit_interval("RMSProp.alpha", alpha)
        self._epsilon = _positive("RMSProp.epsilon", epsilon)
        self._momentum = _unit_interval("RMSProp.momentum", momentum)
        self._centered = _flag("RMSProp.centered", centered)

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def epsilon(self) -> float:
        return self._epsilon

    @property
    def momentum(self) -> float:
        return self._momentum

    @property
    def centered(self) -> bool:
        return self._centered

    def _hyperparameters(self) -> dict[str, object]:
        return {"learning_rate": self._learning_rate, "alpha": self._alpha, "epsilon": self._epsilon,
                "momentum": self._momentum, "centered": self._centered,
                **{k: v for k, v in super()._hyperparameters().items() if k != "learning_rate"}}

    def _state_names(self) -> tuple[str, ...]:
        names = ["square_avg"]
        if self._centered:
            names.append("grad_avg")
        if self._momentum != 0.0:
            names.append("momentum_buffer")
        return tuple(names)

    def _update(self, parameter: np.ndarray, gradient: np.ndarray, state: dict[str, np.ndarray]) -> None:
        alpha = self._alpha
        square_avg = state["square_avg"]
        square_avg *= alpha
        square_avg += (1.0 - alpha) * (gradient * gradient)
        if self._centered:
            grad_avg = state["grad_avg"]
            grad_avg *= alpha
            grad_avg += (1.0 - alpha) * gradient
            denominator = square_avg - grad_avg * grad_avg
            np.maximum(denominator, 0.0, out=denominator)
            np.sqrt(denominator, out=denominator)
        else:
            denominator = np.sqrt(square_avg)
        denominator += self._epsilon
        ratio = np.divide(gradient, denominator, out=denominator)
        if self._momentum != 0.0:
            buffer = state["momentum_buffer"]
            buffer *= self._momentum
            buffer += ratio
            parameter -= self._learning_rate * buffer
        else:
            ratio *= self._learning_rate
            parameter -= ratio

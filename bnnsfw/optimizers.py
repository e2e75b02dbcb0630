"""Optimizers that update parameter arrays in place: SGD (with momentum), Adam and RMSProp.

These correspond to BNNS's ``BNNSOptimizerStep`` with ``BNNSOptimizerFunctionSGDMomentum``,
``…Adam`` and ``…RMSProp``. As in BNNS, one call updates several parameters at once. The
caller passes the parameters and their gradients either **by name**, as two mappings —
``optimizer.step(model.parameters(), grads.parameters())``, paired by name, so no order
has to be kept by hand — or as two lists in the same order. Every parameter array is updated
**in place** (the array object is never replaced), so the layer that handed it out by
``parameters()`` sees the new values at its next ``apply``. Gradients are never modified.

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
BNNS callers allocate) is kept by the optimizer, one entry per parameter, created at the
first step. Later steps must pass the same parameters with the same shapes and dtypes: the
same names (in any order) when the first step passed mappings, else the same number of
arrays in the same order. :meth:`Optimizer.state_dict` returns that state as a flat
dict of NumPy arrays and integers (``np.savez(path, **state)`` saves it) and
:meth:`Optimizer.load_state_dict` restores it, so a resumed run continues exactly as an
uninterrupted one. Hyperparameters are not part of the state: create the optimizer with the
same ones (or the ones you want to continue with) before loading. ``pickle`` and
``copy.deepcopy`` carry both, the hyperparameters and that state (:meth:`Optimizer.__reduce__`).

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

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np

from ._named import describe_differences, name_differences
from ._validation import SUPPORTED_DTYPES, as_input, describe, finite_float
from .errors import DTypeError, InvalidParameterError, ShapeError, must_be

__all__ = ["Optimizer", "SGD", "Adam", "RMSProp", "clip_gradients"]

_O = TypeVar("_O", bound="Optimizer")

#: Added to the global norm before dividing, as torch.nn.utils.clip_grad_norm_ does.
_NORM_EPSILON = 1e-6


def _positive(where: str, value: object) -> float:
    number = finite_float(where, value)
    if number <= 0.0:
        raise InvalidParameterError(must_be(where, "a finite number > 0", value))
    return number


def _optional_positive(where: str, value: object) -> float | None:
    return None if value is None else _positive(where, value)


def _non_negative(where: str, value: object) -> float:
    return finite_float(where, value, low=0.0)


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


#: Field metadata key of a hyperparameter's check: ``check(where, value)`` rejects a bad value
#: and returns the value kept.
_CHECK = "bnnsfw.optimizers.check"


def _hyperparameter(check: Callable[[str, Any], Any], default: Any = attrs.NOTHING, *,
                    positional: bool = False, settable: bool = False) -> Any:
    """Declare one hyperparameter: its check, its default, and whether it may change later.

    The check runs when the optimizer is created (:meth:`Optimizer.__attrs_post_init__`) and,
    for a ``settable`` one, on every assignment; the others cannot be assigned, since the
    state kept between steps depends on them.
    """

    def checked(instance: object, attribute: attrs.Attribute, value: object) -> Any:
        return check(f"{type(instance).__name__}.{attribute.name}", value)

    return attrs.field(default=default, kw_only=not positional, metadata={_CHECK: check},
                       on_setattr=checked if settable else attrs.setters.frozen)


def _step_size(where: str, value: object) -> float:
    """A learning rate: finite and >= 0 (0 leaves the parameters as they are, where a schedule
    ends)."""
    number = finite_float(where, value)
    if number < 0.0:
        raise InvalidParameterError(must_be(where, "a finite number >= 0", value))
    return number


def _learning_rate(default: Any = attrs.NOTHING) -> Any:
    """The step size: the first argument, >= 0; may be changed between steps (a schedule)."""
    return _hyperparameter(_step_size, default, positional=True, settable=True)


def _global_norm(arrays: Sequence[np.ndarray]) -> float:
    """The L2 norm of all the elements of ``arrays`` together, computed in float64 (infinite
    when the squares overflow)."""
    with np.errstate(over="ignore"):
        return math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays))


def _clip_factor(norm: float, max_norm: float) -> float:
    """The factor that brings gradients of global norm ``norm`` to at most ``max_norm``: below 1
    only when the norm exceeds the bound (1 means leave them as they are)."""
    factor = max_norm / (norm + _NORM_EPSILON)
    return factor if factor < 1.0 else 1.0


def clip_gradients(gradients: Mapping[str, np.ndarray], max_norm: float, *,
                   error_if_nonfinite: bool = True) -> float:
    """Scale named gradients in place so that their global L2 norm is at most ``max_norm``;
    return the norm they had.

    The rule is ``torch.nn.utils.clip_grad_norm_``'s: with ``n`` the L2 norm of all the
    elements of all the arrays together (computed in float64), every array is multiplied by
    ``max_norm / (n + 1e-6)`` when that factor is below 1, and left as it is otherwise. The
    norm returned is ``n``, before clipping: what a training loop logs.

    Parameters
    ----------
    gradients : mapping of name to ndarray
        Float32 or float64, writable arrays, such as ``grads.parameters()`` of a
        :class:`~bnnsfw.SequentialGradients` or an ``LSTMGradients`` (views of the gradients
        result, which therefore sees the clipped values). Scaled in place.
    max_norm : float
        The bound, finite and >= 0.
    error_if_nonfinite : bool
        When the norm is NaN or infinite (some gradient holds a NaN or an infinity): raise
        (the default), naming the first such array; with ``False``, return the non-finite
        norm and leave every array as it is, so that the caller can skip the step.

    Returns
    -------
    float
        The global norm before clipping.

    Examples
    --------
    >>> import numpy as np
    >>> grads = {"w": np.array([3.0, 0.0]), "b": np.array([4.0])}
    >>> clip_gradients(grads, max_norm=1.0)
    5.0
    >>> grads["w"], grads["b"]
    (array([0.59999988, 0.        ]), array([0.79999984]))
    """
    where = "clip_gradients"
    bound = finite_float(f"{where}(max_norm)", max_norm, low=0.0)
    nonfinite_check = _flag(f"{where}(error_if_nonfinite)", error_if_nonfinite)
    if not isinstance(gradients, Mapping):
        rule = "a mapping of name to gradient array (grads.parameters())"
        raise InvalidParameterError(must_be(f"{where}(gradients)", rule, type(gradients).__name__))
    for name, array in gradients.items():
        label = f"{where}(gradients[{name!r}])"
        if not isinstance(array, np.ndarray):
            rule = "a NumPy array (scaled in place)"
            raise InvalidParameterError(must_be(label, rule, type(array).__name__))
        if array.dtype not in SUPPORTED_DTYPES:
            raise DTypeError(must_be(label, "a float32 or float64 array", array.dtype.name))
        if not array.flags.writeable:
            rule = "a writable array (scaled in place)"
            raise InvalidParameterError(must_be(label, rule, "a read-only array"))
    arrays = list(gradients.values())
    norm = _global_norm(arrays)
    if not math.isfinite(norm):
        if nonfinite_check:
            bad = [name for name, array in gradients.items() if not np.all(np.isfinite(array))]
            label = f"{where}(gradients[{bad[0]!r}])" if bad else f"{where}(gradients)"
            got = "an array holding NaN or infinite values" if bad else f"a global norm of {norm}"
            rule = "finite (error_if_nonfinite=False returns the norm and leaves the gradients as they are)"
            raise InvalidParameterError(must_be(label, rule, got))
        return norm
    factor = _clip_factor(norm, bound)
    if factor < 1.0:
        for array in arrays:
            array *= factor
    return norm


def _accepting_lr(cls: type[_O]) -> type[_O]:
    """Let ``cls(lr=...)`` spell ``learning_rate`` as PyTorch does (Keras spells it
    ``learning_rate``); giving both is refused."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if "lr" in kwargs:
            lr = kwargs.pop("lr")
            if args or "learning_rate" in kwargs:
                given = args[0] if args else kwargs["learning_rate"]
                raise InvalidParameterError(must_be(
                    f"{cls.__name__}(lr)", "left out when learning_rate is given (both name the step size)",
                    f"lr={lr!r} and learning_rate={given!r}"))
            kwargs["learning_rate"] = lr
        init(self, *args, **kwargs)

    setattr(cls, "__init__", __init__)
    return cls


@attrs.define(eq=False, repr=False)
class Optimizer:
    """Base class: hyperparameters shared by every optimizer, the step pipeline and the state.

    Subclasses are attrs classes too: each declares its own hyperparameters once, as fields
    (the check, the default, whether it may be assigned), names its per-parameter state
    arrays in :meth:`_state_names` and applies its rule in :meth:`_update`.

    Parameters
    ----------
    learning_rate : float
        The step size, >= 0 (also spelled ``lr``, as in PyTorch); the only hyperparameter
        that may be assigned between steps (a schedule), checked like at creation.
    weight_decay : float
        L2 regularization, >= 0, adding ``weight_decay · p`` to each gradient.
    clip_value : float or None
        Bound for clipping gradients elementwise to ``[−clip_value, clip_value]`` (``None``
        is off).
    clip_norm : float or None
        Maximum global L2 norm of all the gradients of a step (``None`` is off).
    gradient_scale : float
        Factor applied to every gradient first, > 0.
    """

    learning_rate: float = _learning_rate()
    weight_decay: float = _hyperparameter(_non_negative, 0.0)
    clip_value: float | None = _hyperparameter(_optional_positive, None)
    clip_norm: float | None = _hyperparameter(_optional_positive, None)
    gradient_scale: float = _hyperparameter(_positive, 1.0)
    _step_count: int = attrs.field(default=0, init=False)
    _shapes: list[tuple[int, ...]] | None = attrs.field(default=None, init=False)
    _dtypes: list[np.dtype | None] = attrs.field(factory=list, init=False)
    _state: list[dict[str, np.ndarray]] = attrs.field(factory=list, init=False)
    _names: list[str] | None = attrs.field(default=None, init=False)  # when stepped by name
    _last_gradient_norm: float | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        """Check every hyperparameter, in the order :func:`repr` lists them."""
        for field in self._hyperparameter_fields():
            where = f"{type(self).__name__}.{field.name}"
            object.__setattr__(self, field.name, field.metadata[_CHECK](where, getattr(self, field.name)))

    @classmethod
    def _hyperparameter_fields(cls) -> list[attrs.Attribute]:
        """``learning_rate``, then the optimizer's own hyperparameters, then the shared ones."""
        shared = {field.name for field in attrs.fields(Optimizer)}
        fields = [field for field in attrs.fields(cls) if _CHECK in field.metadata]
        return sorted(fields, key=lambda field: (field.name != "learning_rate", field.name in shared))

    @property
    def step_count(self) -> int:
        """How many steps have been taken (restored by :meth:`load_state_dict`)."""
        return self._step_count

    @property
    def last_gradient_norm(self) -> float | None:
        """With ``clip_norm`` set, the global L2 norm of the gradients that the last step clipped
        (after ``gradient_scale`` and ``clip_value``, before the norm clipping; in float64):
        what a training loop logs. ``None`` before the first such step and without
        ``clip_norm``. Not part of the state: a copied or restored optimizer has ``None``."""
        return self._last_gradient_norm

    def __repr__(self) -> str:
        fields = self._hyperparameter_fields()
        options = ", ".join(f"{field.name}={getattr(self, field.name)!r}" for field in fields)
        return f"{type(self).__name__}({options}; step_count={self._step_count})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and deep-copy the optimizer as its hyperparameters and :meth:`state_dict`
        (moments by parameter name or position, and the step count), made again by creating it
        with those hyperparameters and loading that state. The copy steps the parameters it is
        given, such as those of a copied model (``model_copy.parameters()``): the arrays are never
        part of an optimizer, only their names, shapes and dtypes."""
        hyperparameters = {field.name: getattr(self, field.name) for field in self._hyperparameter_fields()}
        return _unpickled, (type(self), hyperparameters, self.state_dict())

    # The step.
    def step(self, parameters: Mapping[str, np.ndarray] | Sequence[np.ndarray],
             gradients: Mapping[str, object] | Sequence[object]) -> None:
        """Update every parameter array in place from its gradient.

        Parameters
        ----------
        parameters : mapping of name to ndarray, or list or tuple of ndarray
            Float32 or float64, writable; updated in place, never replaced. A mapping such as
            ``layer.parameters()`` pairs each array with the gradient of the same name.
        gradients : mapping of name to ndarray, or list or tuple of ndarray
            One per parameter, of its shape and dtype (by name: exactly the parameters'
            names, as ``grads.parameters()`` gives them; by position: in the same order).
            Not modified.

        Raises
        ------
        InvalidParameterError
            Names that do not match (all the missing and unexpected ones are listed), counts
            that differ, or parameters other than those of the earlier steps.
        ShapeError, DTypeError
            A gradient unlike its parameter, or a parameter unlike the earlier steps'.
        """
        params, grads, names = self._check_step(parameters, gradients)
        work = self._prepare(params, grads)
        if self._shapes is None:
            self._shapes = [p.shape for p in params]
            self._dtypes = [p.dtype for p in params]
            self._state = [
                {name: np.zeros(p.shape, dtype=p.dtype) for name in self._state_names()} for p in params
            ]
            self._names = names
        else:
            self._dtypes = [p.dtype for p in params]
        self._step_count += 1
        for parameter, gradient, state in zip(params, work, self._state):
            self._update(parameter, gradient, state)

    def _check_step(self, parameters: object, gradients: object
                    ) -> tuple[list[np.ndarray], list[np.ndarray], list[str] | None]:
        where = f"{type(self).__name__}.step"
        names: list[str] | None = None
        if isinstance(parameters, Mapping):
            params, grads, names = self._by_name(where, parameters, gradients)
            labels = [repr(name) for name in names]
        else:
            if self._names is not None:
                raise InvalidParameterError(must_be(
                    f"{where}(parameters)", "a mapping of name to array, as in the earlier steps",
                    type(parameters).__name__))
            params = self._sequence(f"{where}(parameters)", parameters)
            grads = self._sequence(f"{where}(gradients)", gradients)
            labels = [str(i) for i in range(len(params))]
        if not params:
            raise InvalidParameterError(must_be(f"{where}(parameters)", "at least one array", parameters))
        if len(grads) != len(params):
            raise InvalidParameterError(must_be(
                f"{where}(gradients)", f"{len(params)} arrays, one per parameter", f"{len(grads)} arrays"))
        if self._shapes is not None and len(params) != len(self._shapes):
            raise InvalidParameterError(must_be(
                f"{where}(parameters)",
                f"the {len(self._shapes)} arrays of the earlier steps (same count, order and shapes)",
                f"{len(params)} arrays"))
        for i, (label, p) in enumerate(zip(labels, params)):
            name = f"{where}(parameters[{label}])"
            if not isinstance(p, np.ndarray):
                rule = ("a NumPy array (updated in place; layer.parameters() and grads.parameters() give "
                        "every array of a layer and its gradient by name)")
                raise InvalidParameterError(must_be(name, rule, type(p).__name__))
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
        checked = [as_input(f"{where}(gradients[{label}])", g, p.dtype, p.shape)
                   for label, p, g in zip(labels, params, grads)]
        return params, checked, names

    def _by_name(self, where: str, parameters: Mapping[Any, Any], gradients: object
                 ) -> tuple[list[Any], list[Any], list[str]]:
        """The parameters and gradients paired by name, in the order of the first step."""
        if not isinstance(gradients, Mapping):
            raise InvalidParameterError(must_be(
                f"{where}(gradients)", "a mapping of name to gradient, like parameters (grads.parameters())",
                type(gradients).__name__))
        for name in parameters:
            if not isinstance(name, str):
                raise InvalidParameterError(must_be(f"{where}(parameters)", "a mapping with str names", name))
        if self._shapes is not None and self._names is None:
            rule = "a list or tuple, as in the earlier steps (their state is by position)"
            raise InvalidParameterError(must_be(f"{where}(parameters)", rule, type(parameters).__name__))
        keys = name_differences(parameters, gradients)
        if keys.missing_keys or keys.unexpected_keys:
            rule = "the gradients of exactly the parameters' names"
            raise InvalidParameterError(must_be(f"{where}(gradients)", rule, describe_differences(keys)))
        names = list(parameters)
        if self._names is not None:
            known = name_differences(dict.fromkeys(self._names), parameters)
            if known.missing_keys or known.unexpected_keys:
                raise InvalidParameterError(must_be(
                    f"{where}(parameters)", "the parameters of the earlier steps, by name",
                    describe_differences(known)))
            names = self._names
        return [parameters[n] for n in names], [gradients[n] for n in names], list(names)

    @staticmethod
    def _sequence(where: str, value: object) -> list:
        if isinstance(value, np.ndarray) or not isinstance(value, Sequence) or isinstance(value, str):
            raise InvalidParameterError(must_be(
                where, "a list or tuple of arrays (wrap a single array in a list)", type(value).__name__))
        return list(value)

    def _prepare(self, params: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
        """Steps 1–4: scaled, clipped, decayed copies of the gradients."""
        scale = self.gradient_scale
        work = [g * scale if scale != 1.0 else g.copy() for g in grads]
        if self.clip_value is not None:
            for w in work:
                np.clip(w, -self.clip_value, self.clip_value, out=w)
        if self.clip_norm is not None:
            norm = _global_norm(work)
            self._last_gradient_norm = norm
            factor = _clip_factor(norm, self.clip_norm)
            if factor < 1.0:
                for w in work:
                    w *= factor
        if self.weight_decay != 0.0:
            for w, p in zip(work, params):
                w += self.weight_decay * p
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
        ``exp_avg.i``; when the steps passed parameters by name, ``parameter_names`` (a string
        array, position ``i`` holding the name of parameter ``i``). The arrays are copies.
        ``np.savez(file, **optimizer.state_dict())`` saves it;
        ``optimizer.load_state_dict(np.load(file))`` restores it.
        """
        state: dict[str, object] = {
            "step_count": self._step_count,
            "parameter_count": 0 if self._shapes is None else len(self._shapes),
        }
        if self._names is not None:
            state["parameter_names"] = np.array(self._names, dtype=str)
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
        parameter_names = None
        if "parameter_names" in state and count:
            expected.add("parameter_names")
            raw_names = np.asarray(state["parameter_names"])
            distinct = len(set(raw_names.tolist())) if raw_names.ndim == 1 else 0
            if raw_names.shape != (count,) or raw_names.dtype.kind != "U" or distinct != count:
                raise InvalidParameterError(must_be(
                    f"{where}['parameter_names']", f"{count} distinct names (parameter_count)", raw_names))
            parameter_names = [str(name) for name in raw_names]
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
        self._names = parameter_names


def _unpickled(optimizer_class: type[Optimizer], hyperparameters: Mapping[str, Any],
               state: Mapping[str, object]) -> Optimizer:
    """A pickled optimizer made again (:meth:`Optimizer.__reduce__`)."""
    optimizer = optimizer_class(**hyperparameters)
    optimizer.load_state_dict(state)
    return optimizer


@_accepting_lr
@attrs.define(eq=False, repr=False)
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
        >= 0 (BNNS ``learning_rate``); ``lr=`` is the same argument.
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

    momentum: float = _hyperparameter(_unit_interval, 0.0)
    nesterov: bool = _hyperparameter(_flag, False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.nesterov and self.momentum == 0.0:
            raise InvalidParameterError(must_be("SGD.momentum", "> 0 when nesterov=True", self.momentum))

    def _state_names(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum != 0.0 else ()

    def _update(self, parameter: np.ndarray, gradient: np.ndarray, state: dict[str, np.ndarray]) -> None:
        lr = self.learning_rate
        if self.momentum == 0.0:
            gradient *= lr
            parameter -= gradient
            return
        velocity = state["momentum_buffer"]
        velocity *= self.momentum
        velocity += gradient
        if self.nesterov:
            gradient += self.momentum * velocity
            gradient *= lr
            parameter -= gradient
        else:
            parameter -= lr * velocity


@_accepting_lr
@attrs.define(eq=False, repr=False)
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
        >= 0 (default 1e-3); ``lr=`` is the same argument.
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

    learning_rate: float = _learning_rate(1e-3)
    beta1: float = _hyperparameter(_unit_interval, 0.9)
    beta2: float = _hyperparameter(_unit_interval, 0.999)
    epsilon: float = _hyperparameter(_positive, 1e-8)

    def _state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _update(self, parameter: np.ndarray, gradient: np.ndarray, state: dict[str, np.ndarray]) -> None:
        t = self._step_count
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= self.beta1
        m += (1.0 - self.beta1) * gradient
        v *= self.beta2
        gradient *= gradient
        gradient *= 1.0 - self.beta2
        v += gradient
        correction1 = 1.0 - self.beta1**t
        correction2 = 1.0 - self.beta2**t
        denominator = np.sqrt(v)
        denominator *= 1.0 / math.sqrt(correction2)  # √v̂
        denominator += self.epsilon
        update = np.divide(m, denominator, out=denominator)
        update *= self.learning_rate / correction1  # m̂ = m / correction1
        parameter -= update


@_accepting_lr
@attrs.define(eq=False, repr=False)
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
        >= 0 (default 1e-2); ``lr=`` is the same argument.
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

    learning_rate: float = _learning_rate(1e-2)
    alpha: float = _hyperparameter(_unit_interval, 0.99)
    epsilon: float = _hyperparameter(_positive, 1e-8)
    momentum: float = _hyperparameter(_unit_interval, 0.0)
    centered: bool = _hyperparameter(_flag, False)

    def _state_names(self) -> tuple[str, ...]:
        names = ["square_avg"]
        if self.centered:
            names.append("grad_avg")
        if self.momentum != 0.0:
            names.append("momentum_buffer")
        return tuple(names)

    def _update(self, parameter: np.ndarray, gradient: np.ndarray, state: dict[str, np.ndarray]) -> None:
        alpha = self.alpha
        square_avg = state["square_avg"]
        square_avg *= alpha
        square_avg += (1.0 - alpha) * (gradient * gradient)
        if self.centered:
            grad_avg = state["grad_avg"]
            grad_avg *= alpha
            grad_avg += (1.0 - alpha) * gradient
            denominator = square_avg - grad_avg * grad_avg
            np.maximum(denominator, 0.0, out=denominator)
            np.sqrt(denominator, out=denominator)
        else:
            denominator = np.sqrt(square_avg)
        denominator += self.epsilon
        ratio = np.divide(gradient, denominator, out=denominator)
        if self.momentum != 0.0:
            buffer = state["momentum_buffer"]
            buffer *= self.momentum
            buffer += ratio
            parameter -= self.learning_rate * buffer
        else:
            ratio *= self.learning_rate
            parameter -= ratio

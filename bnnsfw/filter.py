"""The lifecycle shared by every layer, and the options every layer takes.

A layer is created from a parameter object and an optional :class:`FilterParameters`, used
any number of times, then closed. ``close()`` is idempotent; any use after it raises
:class:`~bnnsfw.FilterClosedError`. Layers are context managers and release their buffers
when garbage-collected.

Every layer names its arrays: :meth:`Filter.parameters` hands out the live trainable arrays
by stable name, :meth:`Filter.state_dict` copies of everything that defines its results, and
:meth:`Filter.load_state_dict` writes such a state back, checked name by name.

An open layer pickles and deep-copies as what it is (:meth:`Filter.__reduce__`): its
parameter object's state, its filter parameters with the backend by name, and its random
generator's state; it is created again through ``__init__`` where it lands.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Callable, ClassVar, TypeVar

import attrs
import numpy as np

from . import backends
from ._threadpool import blas_limit
from .backends import Backend, BackendSpec
from .backends.contract import check_contract
from ._named import IncompatibleKeys, checked_state
from .errors import FilterClosedError, InvalidParameterError, must_be

__all__ = ["FilterParameters", "Filter", "IncompatibleKeys"]

_Layer = TypeVar("_Layer", bound="Filter")
_Method = TypeVar("_Method", bound=Callable[..., Any])
_log = logging.getLogger("bnnsfw")


def _check_backend(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, str):
        check_contract(value, "FilterParameters.backend")


def _check_threads(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        rule = "an integer >= 0 (0: library default)"
        raise InvalidParameterError(must_be("FilterParameters.n_threads", rule, value))


def _check_bool(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidParameterError(must_be(f"FilterParameters.{attribute.name}", "True or False", value))


@attrs.frozen(kw_only=True)
class FilterParameters:
    """Options of a layer that are not part of its math (``BNNSFilterParameters``).

    Parameters
    ----------
    backend : str or Backend
        A registered backend name, ``"auto"`` (the compiled ``numba`` backend when Numba
        imports), or a backend object. ``None`` means the current default (see
        :func:`bnnsfw.use_backend`).
    n_threads : int
        BLAS threads while this layer runs; 0 leaves the library default.
    use_client_pointer : bool
        Keep references to the caller's weight arrays instead of copying them
        (``BNNSFlagsUseClientPtr``): in-place updates to them are seen by the next call.
    """

    backend: BackendSpec | None = attrs.field(default=None,
                                              validator=attrs.validators.optional(_check_backend))
    n_threads: int = attrs.field(default=0, validator=_check_threads)
    use_client_pointer: bool = attrs.field(default=False, validator=_check_bool)


def guarded(method: _Method) -> _Method:
    """Mark a public method (or property getter or setter) of a layer as a *call*.

    A call starts only on an open layer (else :class:`~bnnsfw.FilterClosedError`), and a
    :meth:`Filter.close` that races it from another thread releases the layer's arrays only
    when the last call in flight has returned: a call either completes or is refused with
    ``FilterClosedError``, never fails halfway on a released array.
    """
    name = method.__name__

    @functools.wraps(method)
    def call(self: "Filter", *args: Any, **kwargs: Any) -> Any:
        self._begin_call(name)
        try:
            return method(self, *args, **kwargs)
        finally:
            self._end_call()

    return call  # type: ignore[return-value]  # same signature as ``method``


class Filter:
    """Base class of every layer: backend, thread limit, lifecycle, arrays by name and ``repr``.

    Subclasses call ``super().__init__(filter_parameters)``, mark each public method that
    touches the layer's arrays with :func:`guarded` (and start it with
    ``self.check_open("method")``), name their arrays in :meth:`_named_parameters` (and
    :meth:`_named_buffers`), release their arrays in :meth:`_release`, and describe
    themselves in :meth:`_describe`. For pickling and copying they name their parameter class
    (:attr:`_parameters_class`) and hand out the parameter object holding their live arrays
    (:meth:`_live_parameters`).
    """

    #: The class of the parameter object a layer is created from: a pickled layer carries that
    #: object's ``to_state()`` and is created again from ``from_state()`` of it.
    _parameters_class: ClassVar[Any] = None

    def __init__(self, filter_parameters: FilterParameters | None = None) -> None:
        self._lifecycle_lock = threading.Lock()
        self._calls = 0  # guarded calls in flight
        self._released = True
        if filter_parameters is None:
            filter_parameters = FilterParameters()
        if not isinstance(filter_parameters, FilterParameters):
            where = f"{type(self).__name__}(filter_parameters)"
            raise InvalidParameterError(must_be(where, "a FilterParameters or None", filter_parameters))
        self._closed = True  # until the backend resolves, so __del__ has nothing to do
        self._filter_parameters = filter_parameters
        self._backend: Backend = backends.get_backend(filter_parameters.backend)
        self._closed = False
        self._released = False

    # Lifecycle.
    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    @property
    def backend(self) -> Backend:
        """The backend this layer computes with, fixed at creation."""
        return self._backend

    @property
    def filter_parameters(self) -> FilterParameters:
        """The options this layer was created with."""
        return self._filter_parameters

    def close(self) -> None:
        """Release the layer's buffers (``BNNSFilterDestroy``). Calling it again does nothing.

        Safe to call while other threads are in a call on the layer: new calls are refused
        from now on, and the buffers are released when the calls in flight have returned.
        """
        lock = getattr(self, "_lifecycle_lock", None)
        if lock is None:  # __init__ did not get that far
            return
        with lock:
            if self._closed:
                return
            self._closed = True
            release = self._calls == 0 and not self._released
            self._released = self._released or release
        if release:
            self._release()

    def _begin_call(self, method: str) -> None:
        with self._lifecycle_lock:
            self.check_open(method)
            self._calls += 1

    def _end_call(self) -> None:
        with self._lifecycle_lock:
            self._calls -= 1
            release = self._closed and self._calls == 0 and not self._released
            self._released = self._released or release
        if release:
            self._release()

    def __enter__(self: _Layer) -> _Layer:
        self._check_open("__enter__")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - never raise from a finalizer
            pass

    def check_open(self, method: str) -> None:
        """Raise :class:`~bnnsfw.FilterClosedError` naming ``method`` if the layer is closed.

        Every public method of a layer starts with it, and so does code that works on a
        layer from outside (``save_weights``), so a closed layer is refused the same way.
        """
        if self._closed:
            raise FilterClosedError(
                f"{type(self).__name__}.{method}() was called after close(); "
                f"create a new {type(self).__name__} to compute again."
            )

    #: The spelling the layer modules use inside their own methods.
    _check_open = check_open

    # Pickling and copying.
    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and deep-copy the layer as what it is, never as its internals.

        What travels: the parameter object's ``to_state()`` holding the live arrays (trained
        weights, moving statistics), the filter parameters with the backend by its registered
        name, and the state of the layer's random generator (an LSTM's dropout). Where it
        lands the layer is created again through ``__init__``, so it owns its arrays and
        packs its weights for the CPU it runs on; the backend is the one of that name there,
        or the current default (said on the ``bnnsfw`` logger) when no backend has it.
        ``copy.deepcopy(layer)`` is the same round trip: an independent layer.

        Raises
        ------
        FilterClosedError
            The layer was closed (its arrays are released).
        InvalidParameterError
            Its backend is an object the registry does not give by name.
        """
        name = type(self).__name__
        if self._closed:
            raise FilterClosedError(
                f"{name} was closed: close() released its weights, so it cannot be pickled or copied; "
                f"pickle or copy the {name} before closing it.")
        backend = backends._registered_name(self._backend)
        if backend is None:
            rule = ("a backend the registry gives by name (FilterParameters(backend=\"<name>\"), after "
                    "register_backend(name, factory) where it is loaded too): its name is what travels")
            got = f"a {type(self._backend).__name__} object named {self._backend.name!r}, not registered"
            raise InvalidParameterError(must_be(f"pickle.dumps({name}) backend", rule, got))
        self._begin_call("__reduce__")
        try:
            state = {
                "parameters": self._live_parameters().to_state(),
                "backend": backend,
                "n_threads": self._filter_parameters.n_threads,
                "use_client_pointer": self._filter_parameters.use_client_pointer,
                "runtime": self._runtime_state(),
            }
        finally:
            self._end_call()
        return _unpickled, (type(self), state)

    # Arrays by name.
    @guarded
    def parameters(self) -> dict[str, np.ndarray]:
        """The trainable arrays by stable name: the live arrays the layer computes with.

        Updating one in place (an optimizer's step, ``array -= lr * grad``) changes what the
        next call computes, whatever the filter parameters. The gradients of
        ``apply_backward`` offer the same names (``grads.parameters()``), so
        ``optimizer.step(layer.parameters(), grads.parameters())`` pairs them by name. A new
        dict each call, in a fixed order; the arrays are never replaced.
        """
        self._check_open("parameters")
        self._share_arrays()
        return dict(self._named_parameters())

    @guarded
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every array that defines the layer's results, by name.

        The names of :meth:`parameters`, plus the arrays that are not trained but still
        determine the results (a normalization's moving statistics). The copies do not change
        when the layer trains; :meth:`load_state_dict` writes them back.
        """
        self._check_open("state_dict")
        return {name: array.copy() for name, array in self._state_targets().items()}

    @guarded
    def load_state_dict(self, state: Mapping[str, object], strict: bool = True) -> IncompatibleKeys:
        """Copy the arrays of ``state`` (name → array, as :meth:`state_dict` returns) into the layer.

        With ``strict`` (the default) the names must be exactly those of :meth:`state_dict`;
        otherwise :class:`~bnnsfw.InvalidParameterError` lists the missing and the
        unexpected names. Each array must have the shape of the layer's and finite values; it
        is converted to the layer's dtype. Everything is checked before anything is written.
        With ``strict=False`` the names in common are loaded and the others reported.
        """
        self._check_open("load_state_dict")
        return load_named_state(type(self).__name__, [("", self)], state, strict)

    def _state_targets(self) -> dict[str, np.ndarray]:
        """The live arrays :meth:`state_dict` copies and :meth:`load_state_dict` writes."""
        return {**self._named_parameters(), **self._named_buffers()}

    def _threads(self) -> contextlib.AbstractContextManager[None]:
        """Context manager applying this layer's BLAS thread limit."""
        return blas_limit(self._filter_parameters.n_threads)

    # Hooks for subclasses.
    def _release(self) -> None:
        """Drop every array the layer holds (weights, workspaces)."""

    def _named_parameters(self) -> dict[str, np.ndarray]:
        """The live trainable arrays by name (without side effects)."""
        return {}

    def _named_buffers(self) -> dict[str, np.ndarray]:
        """Live arrays of the state that are not trained (moving statistics)."""
        return {}

    def _share_arrays(self) -> None:
        """Called before live arrays leave the layer: from now on they may change outside it."""

    def _check_state_values(self, where: str, values: Mapping[str, np.ndarray]) -> None:
        """Refuse loaded values (by the layer's own names) that break a rule beyond shape and
        finiteness; ``where`` names the call in messages."""

    def _state_written(self) -> None:
        """Called after :meth:`load_state_dict` wrote into the live arrays."""

    def _live_parameters(self) -> Any:
        """The parameter object holding the live arrays (``layer_parameters``), which
        :meth:`__reduce__` carries as its ``to_state()``."""
        raise NotImplementedError

    def _runtime_state(self) -> dict[str, Any]:
        """What a pickled layer carries beyond its parameters (plain data), given back to
        :meth:`_set_runtime_state` of the layer made again."""
        return {}

    def _set_runtime_state(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`_runtime_state` gave, on a layer just created."""

    def _describe(self) -> str:
        """Shapes and options for :func:`repr`, e.g. ``"input_shape=(3, 4), dtype=float32"``."""
        return ""

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        details = "" if self._closed else self._describe()
        parts = [p for p in (details, f"backend={self._backend.name!r}", state) if p]
        return f"<{type(self).__name__} {', '.join(parts)}>"


def _unpickled(layer_class: type[_Layer], state: Mapping[str, Any]) -> _Layer:
    """A pickled layer made again (:meth:`Filter.__reduce__`), through ``__init__``.

    The backend is the one registered under the name the layer carried; when no backend has
    that name in this process, the current default, said in one line on the ``bnnsfw`` logger.
    """
    backend: str | None = state["backend"]
    if backend not in backends.available_backends():
        _log.warning("%s: backend %r, which it was pickled with, is not available here; it uses the current "
                     "default, %r", layer_class.__name__, backend, backends.current_backend().name)
        backend = None
    options = FilterParameters(backend=backend, n_threads=state["n_threads"],
                               use_client_pointer=state["use_client_pointer"])
    create: Callable[..., _Layer] = layer_class  # a layer's __init__ takes its parameters first
    layer = create(layer_class._parameters_class.from_state(state["parameters"]), options)
    layer._set_runtime_state(state["runtime"])
    return layer


def load_named_state(owner: str, members: Sequence[tuple[str, Filter]], state: object,
                     strict: object, where: str | None = None) -> IncompatibleKeys:
    """Load ``state`` into the layers ``members`` (name prefix, layer), checking all before writing.

    ``owner`` names the class in messages (or ``where`` the whole call). Used by
    :meth:`Filter.load_state_dict` (one member, no prefix) and by containers (one member per
    layer, prefix ``"<name>."``).
    """
    live = [(prefix, layer, layer._state_targets()) for prefix, layer in members]
    targets = {prefix + name: array for prefix, _, arrays in live for name, array in arrays.items()}
    values, keys = checked_state(owner, state, targets, strict=strict, where=where)
    where = where or f"{owner}.load_state_dict(state)"
    for prefix, layer, arrays in live:
        layer._check_state_values(where, {name: values[prefix + name] for name in arrays
                                          if prefix + name in values})
    for prefix, layer, arrays in live:
        for name, array in arrays.items():
            if prefix + name in values:
                np.copyto(array, values[prefix + name])
        layer._state_written()
    return keys

"""Compute backends: the contract, a registry by name, and a context manager for the default.

A backend implements the contract in :mod:`bnnsfw.backends.contract` (``docs/backends.md``).
Layers take their backend when they are created: ``FilterParameters(backend=...)`` names one
(or hands over a backend object); otherwise the current default is used, which
:func:`use_backend` changes inside a ``with`` block. Third-party packages register factories
under the entry-point group ``bnnsfw.backends`` or call :func:`register_backend`. Every
backend is checked against the contract before a layer can use it: at registration, when
an entry point is first loaded, and when an object is handed over directly.
"""

from __future__ import annotations

import contextlib
import importlib.util
import contextvars
import logging
import threading
from importlib import metadata
from typing import Callable, Iterator, Union, cast

from ..errors import BackendError, InvalidParameterError, UnknownBackendError, must_be
from . import contract
from ._shared.compiling import compile_mode, set_compile_mode
from .contract import Backend, check_contract
from .numpy import NumpyBackend

__all__ = [
    "Backend",
    "BackendError",
    "NumpyBackend",
    "contract",
    "ENTRY_POINT_GROUP",
    "register_backend",
    "get_backend",
    "available_backends",
    "use_backend",
    "current_backend",
    "compile_mode",
    "set_compile_mode",
]

ENTRY_POINT_GROUP = "bnnsfw.backends"
_log = logging.getLogger("bnnsfw")

BackendSpec = Union[str, Backend]

_lock = threading.RLock()
_factories: dict[str, Callable[[], Backend]] = {}
_instances: dict[str, Backend] = {}
_entry_points_loaded = False
_conforming_types: set[type] = set()  # classes whose instances passed the contract check
_default: contextvars.ContextVar[BackendSpec] = contextvars.ContextVar("bnnsfw_backend", default="auto")


def _scipy_blas() -> Backend:
    from .scipy_blas import ScipyBlasBackend

    return ScipyBlasBackend()


def _numba() -> Backend:
    from .numba import NumbaBackend

    return NumbaBackend()


def _checked(backend: object, where: str) -> Backend:
    """``backend`` once it passes the contract check (remembered per class)."""
    kind = type(backend)
    if kind not in _conforming_types:
        check_contract(backend, where)
        own = getattr(backend, "__dict__", {})
        if not any(member in own for member in ("name", *contract.OPERATIONS)):
            _conforming_types.add(kind)  # the class alone makes it a backend
    return cast(Backend, backend)


def register_backend(name: str, factory: Callable[[], Backend], *, replace: bool = False) -> None:
    """Register ``factory`` (a class or a zero-argument callable) under ``name``.

    The factory is called once here and its backend checked against the contract, so a
    factory that does not make a backend is refused now, with a
    :class:`~bnnsfw.BackendError` that names every missing or wrongly-typed operation.
    Raises :class:`~bnnsfw.InvalidParameterError` when the name is taken (unless
    ``replace=True``) or is ``"auto"``.
    """
    if not isinstance(name, str) or not name or name == "auto":
        raise InvalidParameterError(
            must_be("register_backend(name)", "a non-empty string other than 'auto'", name))
    if not callable(factory):
        raise InvalidParameterError(must_be("register_backend(factory)", "callable", factory))
    with _lock:
        if name in _factories and not replace:
            raise InvalidParameterError(
                must_be("register_backend(name)", "not yet registered (pass replace=True to override)", name)
            )
    instance = _checked(factory(), f"register_backend({name!r}, factory): the factory's result")
    with _lock:
        _factories[name] = factory
        _instances[name] = instance


def _register_builtin(name: str, factory: Callable[[], Backend]) -> None:
    """A built-in backend, made (and checked) when first asked for."""
    _factories[name] = factory


def _load_entry_points() -> None:
    global _entry_points_loaded
    with _lock:
        if _entry_points_loaded:
            return
        _entry_points_loaded = True
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry.name in _factories:
                continue
            try:
                _factories[entry.name] = entry.load()
            except Exception as exc:  # a broken plug-in must not break bnnsfw
                _log.warning("backend entry point %r could not be loaded: %s", entry.name, exc)


def available_backends() -> list[str]:
    """Names of every registered backend (built-in, registered, and entry points)."""
    _load_entry_points()
    with _lock:
        return sorted(_factories)


_auto_choice: str | None = None


def _auto() -> str:
    """``numba`` when Numba imports, else ``scipy-blas`` (saying why, once, on the ``bnnsfw``
    logger), else ``numpy``. Decided once per process."""
    global _auto_choice
    if _auto_choice is None:
        choice = "numpy"
        try:
            import scipy.linalg.blas  # noqa: F401
            choice = "scipy-blas"
            import numba  # noqa: F401
            choice = "numba" if "numba" in _factories else choice
        except Exception as exc:  # an unsupported Python or platform: the fallback still works
            _log.warning("backend 'auto' uses %r: %s: %s", choice, type(exc).__name__, exc)
        _auto_choice = choice
    return _auto_choice


def get_backend(spec: BackendSpec | None = None) -> Backend:
    """The backend for ``spec``: a registered name, ``"auto"``, a backend object, or
    ``None`` for the current default (see :func:`use_backend`)."""
    if spec is None:
        spec = _default.get()
    if not isinstance(spec, str):
        return _checked(spec, "backend")
    name = _auto() if spec == "auto" else spec
    with _lock:
        if name not in _factories:
            _load_entry_points()
        if name not in _factories:
            names = ", ".join(["auto", *sorted(_factories)])
            raise UnknownBackendError(must_be("backend", f"one of {names}", spec))
        if name not in _instances:
            _instances[name] = _checked(_factories[name](), f"backend {name!r}")
        return _instances[name]


def _registered_name(backend: object) -> str | None:
    """The name under which :func:`get_backend` gives this very object, or ``None``.

    A pickled layer carries its backend by this name (``docs/conventions.md``): a backend
    object made outside the registry, even of a registered class, has none, since its own
    settings would not travel with a name.
    """
    with _lock:
        return next((name for name, instance in _instances.items() if instance is backend), None)


def current_backend() -> Backend:
    """The backend new layers get when they do not name one."""
    return get_backend(None)


@contextlib.contextmanager
def use_backend(spec: BackendSpec) -> Iterator[Backend]:
    """Within the block, layers created without a backend use ``spec``.

    The default lives in a :class:`contextvars.ContextVar`, so blocks nest and threads or
    asyncio tasks do not see each other's choice. The name is checked on entry.

    >>> from bnnsfw.backends import use_backend, current_backend
    >>> with use_backend("numpy"):
    ...     current_backend().name
    'numpy'
    """
    backend = get_backend(spec)
    token = _default.set(spec)
    try:
        yield backend
    finally:
        _default.reset(token)


_register_builtin("numpy", NumpyBackend)
_register_builtin("scipy-blas", _scipy_blas)
if importlib.util.find_spec("numba") is not None:  # the compiled backend needs Numba
    _register_builtin("numba", _numba)

"""The BLAS thread pools of the process, as threadpoolctl sees them, and the one limit on them.

One ``threadpoolctl.ThreadpoolController`` serves every thread limit bnnsfw applies (a
layer's ``n_threads``, the normalization kernels' one-thread BLAS); making one scans the
loaded libraries, so it is made once, on first use.

BLAS libraries have one thread count per process, not one per calling thread, so limits that
overlap in time (several layers running on several threads) cannot each save and restore it:
the second would save the first one's limit as "original" and put it back last.
:func:`blas_limit` keeps one shared record instead: the first block to start saves the
libraries' own settings, every block in force contributes its limit (the smallest applies),
and the last block to end restores the saved settings exactly, whatever the interleaving.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, NamedTuple

__all__ = ["blas_controller", "blas_limit", "current_limit", "set_blas_threads"]

_controller: Any = None
_lock = threading.Lock()
_blas: list[_Switch] | None = None  # how to set each of the controller's BLAS libraries, made once

_limit_lock = threading.Lock()
_active: list[int] = []  # the limits of the blocks running now (one entry per block)
_saved: list[tuple[_Switch, int]] = []  # (library, its own thread count) while any block runs
_now: list[int] = []  # each saved library's thread count as the blocks have set it


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says it)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return max(1, len(affinity(0))) if affinity is not None else max(1, os.cpu_count() or 1)


def blas_controller() -> Any:
    """The shared ``threadpoolctl.ThreadpoolController``."""
    global _controller
    with _lock:
        if _controller is None:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        return _controller


class _Switch(NamedTuple):
    """How to read and set one library's thread count."""

    get: Callable[[], int]
    set: Callable[[int], object]


def _switch(library: Any) -> _Switch:
    """OpenBLAS's own getter and setter for a pthreads OpenBLAS, as threadpoolctl resolves
    them (symbol prefix and suffix included), called directly; the controller's methods for
    every other library, or when threadpoolctl resolves no symbols. Each method call runs a
    few dozen lines of Python, and a layer reads and sets the counts right after a kernel has
    emptied the caches: on the M row's inference call, entering and leaving the kernel's
    one-thread limit took 37 µs with the methods and 27 with the functions (the rest is
    OpenBLAS's own work). Called directly, the settings also follow the shared record below
    whichever thread makes them (threadpoolctl 3.8's methods ignore an OpenBLAS setting from
    any thread but the first one to make one, while it lives)."""
    resolve = getattr(library, "_get_symbol", None)
    if getattr(library, "internal_api", None) == "openblas" and getattr(
            library, "threading_layer", None) == "pthreads" and resolve is not None:
        get, put = resolve("openblas_get_num_threads"), resolve("openblas_set_num_threads")
        if get is not None and put is not None:
            return _Switch(get, put)
    return _Switch(library.get_num_threads, library.set_num_threads)


def _libraries() -> list[_Switch]:
    """The BLAS libraries of :func:`blas_controller` (a fixed list, as the controller is)."""
    global _blas
    if _blas is None:
        _blas = [_switch(library) for library in blas_controller().select(user_api="blas").lib_controllers]
    return _blas


def _apply(limit: int) -> None:
    """Every saved library to ``limit`` threads, or to its own count when ``limit`` is 0;
    a library already there is left alone (each setting is a call into the library)."""
    for index, (library, count) in enumerate(_saved):
        target = limit or count
        if _now[index] != target:
            library.set(target)
            _now[index] = target


class _Limit(contextlib.AbstractContextManager):
    """The context manager :func:`blas_limit` returns for a positive limit."""

    __slots__ = ("_n_threads",)

    def __init__(self, n_threads: int) -> None:
        self._n_threads = n_threads

    def __enter__(self) -> None:
        n_threads = self._n_threads
        with _limit_lock:
            if not _active:
                _saved[:] = [(library, int(library.get())) for library in _libraries()]
                _now[:] = [count for _, count in _saved]
            if not _active or n_threads < min(_active):
                _apply(n_threads)
            _active.append(n_threads)

    def __exit__(self, *exc: object) -> None:
        n_threads = self._n_threads
        with _limit_lock:
            _active.remove(n_threads)
            if not _active:
                _apply(0)
                _saved.clear()
                _now.clear()
            elif n_threads < min(_active):
                _apply(min(_active))


_NO_LIMIT = contextlib.nullcontext()


def blas_limit(n_threads: int) -> contextlib.AbstractContextManager[None]:
    """Run BLAS on at most ``n_threads`` threads inside the block (no-op for ``n_threads <= 0``).

    Blocks may overlap on any threads: while several run, the smallest of their limits is in
    force; when the last one ends the libraries get back exactly the thread counts they had
    before the first one began. A library already at the count a block needs is not set
    again: a layer call enters several blocks, and each setting costs about a microsecond.
    """
    if n_threads <= 0:
        return _NO_LIMIT
    return _Limit(n_threads)


def current_limit() -> int:
    """The BLAS thread limit :func:`blas_limit` blocks hold now (the smallest), 0 for none."""
    with _limit_lock:
        return min(_active) if _active else 0


def set_blas_threads(n_threads: int) -> None:
    """Set every BLAS library loaded now to ``n_threads`` threads, as the process's own count
    (what :func:`blas_limit` blocks return to). The libraries are looked up afresh, not kept:
    a worker's initializer calls it before the backends have loaded theirs."""
    from threadpoolctl import ThreadpoolController

    with _limit_lock:
        for library in ThreadpoolController().select(user_api="blas").lib_controllers:
            _switch(library).set(n_threads)

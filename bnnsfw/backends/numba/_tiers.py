"""When the compiled kernels serve a call: at once, after a compile in the background, or never.

Numba compiles a kernel the first time it is called with a new kind of argument, and the
LSTM's kernels take tens of seconds to compile from cold. So that no call waits for that,
:class:`Tiers` decides, once at the start of each top-level call of the backend (one
``lstm_forward``, ``lstm_backward``, ``normalization_forward`` or ``normalization_backward``),
whether the compiled kernels serve it; when they do not, the call runs on ``scipy-blas``'s
kernels, which need no compiler and give the same results within the contract's tolerance,
and write the same training cache. The compile mode (:func:`compile_mode`) says how:

- ``background`` (the default): a call of a kind whose kernels are not on disk yet runs on
  ``scipy-blas``'s kernels and asks a separate, fresh Python process to compile them. That
  process replays the call — the same operation, configuration, shapes, dtypes, memory
  layouts and read-only flags, on zeros (integer arrays such as sequence lengths keep their
  values) — with the compiled kernels, which writes them to Numba's disk cache, and then
  leaves a marker beside that cache. From the next top-level call on, calls of that kind
  find the marker and run compiled, loading the kernels from disk. The process outlives the
  one that started it, so a short script leaves the kernels for the next one; these processes
  take turns at a lock in the markers' folder (``compile.lock``), so two of them compile each
  kind once. (Every process saves each kernel under the cache folder's own lock, ``index.lock``:
  :func:`._cache.lock_saves`.)
- ``wait``: every call runs compiled, compiling in this process when it must (bit-for-bit
  repeatable runs; the test suite, ``bnnsfw bench`` and ``bnnsfw compile`` use it).
- ``off``: nothing is compiled; only kinds of call with a marker run compiled.

The kind of a call (:func:`kind_of`) is everything that decides which kernels it runs and
with which argument types: the operation, the configuration, and each array's shape, dtype,
layout and read-only flag, with the thread counts in force.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import hashlib
import io
import logging
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import attrs
import llvmlite.binding
import numba
import numpy as np
from numba.core import config

from ..._threadpool import blas_limit, usable_cores
from .._shared.compiling import compile_mode, set_compile_mode
from ..contract import call_prepared
from . import _cache, _lstm_forward

__all__ = ["CompileStatus", "Tiers", "kind_of", "run_jobs"]

_log = logging.getLogger("bnnsfw")

#: Whether the call under way runs the compiled kernels (True outside any call).
_compiled: contextvars.ContextVar[bool] = contextvars.ContextVar("bnnsfw_compiled", default=True)
#: Integer arrays up to this size keep their values in a replayed call (sequence lengths).
_KEPT_BYTES = 1 << 16
#: A frozen application (PyInstaller and the like): its ``sys.executable`` is the application,
#: which cannot run a compiling interpreter, so ``background`` compiles in the process there.
_FROZEN = bool(getattr(sys, "frozen", False))
#: NumPy's C-contiguous, F-contiguous and writeable flags (``ndarray.flags.num``).
_FLAGS = 0x1 | 0x2 | 0x400


_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(kind: type) -> tuple[str, ...]:
    """The fields of a request class that make up a call's kind, in order."""
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f.name for f in attrs.fields(kind) if f.name != "workspace")
    return names


def _array_kind(a: np.ndarray) -> tuple:
    """What of an array decides a compiled kernel's argument type: its shape, dtype, and
    layout and write flags (a few hundred nanoseconds)."""
    return a.shape, a.dtype, a.flags.num & _FLAGS


def compiled_now() -> bool:
    """Whether the call under way runs the compiled kernels."""
    return _compiled.get()


@contextlib.contextmanager
def compiled_as(compiled: bool) -> Iterator[None]:
    """Within the block :func:`compiled_now` is ``compiled`` (the tiers decided it already)."""
    token = _compiled.set(compiled)
    try:
        yield
    finally:
        _compiled.reset(token)


@contextlib.contextmanager
def _uncompiled_beside_compile(blas_threads: int) -> Iterator[None]:
    """An uncompiled call with BLAS on at most ``blas_threads`` threads (:meth:`Tiers.running`)."""
    with compiled_as(False), blas_limit(blas_threads):
        yield


# --------------------------------------------------------------------------------------
# The kind of a call.
# --------------------------------------------------------------------------------------
def _kind(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _array_kind(value)
    if value is None or isinstance(value, (bool, int, float, str, np.dtype, np.generic)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_kind(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _kind(v)) for k, v in sorted(value.items(), key=lambda item: repr(item[0])))
    if attrs.has(type(value)):
        return (type(value).__qualname__,
                tuple(_kind(getattr(value, f.name)) for f in attrs.fields(type(value))))
    return type(value).__qualname__  # a workspace, packed weights: made by the backend alike


def kind_of(operation: str, request: Any) -> str:
    """A digest of what decides the kernels a call runs and their argument types (module
    docstring): the operation, every field of ``request`` but its contents, the thread
    counts, and the package's sources (:func:`._cache.package_digest`)."""
    fields = {f.name: getattr(request, f.name) for f in attrs.fields(type(request))}
    fields.pop("weights", None)  # packed by this backend from the configuration, which is here
    fields.pop("workspace", None)
    described = (operation, _kind(fields), numba.get_num_threads(), _cache.package_digest(),
                 numba.__version__, _cpu_name(), sys.version_info[:2])
    return hashlib.sha256(repr(described).encode()).hexdigest()[:32]


def _cpu_name() -> str:
    return str(getattr(config, "CPU_NAME", None) or llvmlite.binding.get_host_cpu_name())


# --------------------------------------------------------------------------------------
# A call as a job: its arrays as descriptions, rebuilt as zeros in the worker.
# --------------------------------------------------------------------------------------
def _zeros(shape: tuple[int, ...], dtype: str, layout: str, writeable: bool,
           values: bytes | None) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` with ``layout`` (``"A"``: neither C nor F
    contiguous), ``values`` or zeros, read-only unless ``writeable``."""
    dt = np.dtype(dtype)
    if values is not None:
        a = np.frombuffer(values, dtype=dt).reshape(shape).copy()
    elif layout == "A":
        base = np.zeros(tuple(2 * n for n in shape), dt)
        a = base[tuple(slice(None, None, 2) for _ in shape)]
    else:
        a = np.zeros(shape, dt, order="F" if layout == "F" else "C")
    if not writeable:
        a.setflags(write=False)
    return a


class _Workspace:
    """The worker's scratch memory (the contract's ``Workspace``), kept for one job."""

    def __init__(self) -> None:
        self._arrays: dict[tuple, np.ndarray] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        key = (name, tuple(shape), np.dtype(dtype))
        if key not in self._arrays:
            self._arrays[key] = np.empty(shape, dtype)
        return self._arrays[key]

    def bytes(self, name: str, nbytes: int) -> np.ndarray:
        return self.array(name, (nbytes,), np.dtype(np.uint8))


class _JobPickler(pickle.Pickler):
    """Pickles a request with every array as its description (integer arrays up to
    :data:`_KEPT_BYTES` with their values) and the workspace as a fresh one."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            shape, dtype, flags = _array_kind(obj)
            layout = "C" if flags & 0x1 else "F" if flags & 0x2 else "A"
            keep = dtype.kind in "iub" and obj.nbytes <= _KEPT_BYTES and dtype != np.uint8
            values = np.ascontiguousarray(obj).tobytes() if keep else None
            return _zeros, (shape, dtype.str, layout, bool(flags & 0x400), values)
        if hasattr(obj, "array") and hasattr(obj, "bytes") and not isinstance(obj, type):
            return _Workspace, ()
        return NotImplemented


def job_bytes(operation: str, request: Any) -> bytes:
    """``request`` for ``operation`` as :func:`run_jobs` replays it."""
    buffer = io.BytesIO()
    _JobPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((operation, request))
    return buffer.getvalue()


# --------------------------------------------------------------------------------------
# The worker: replays jobs with the compiled kernels and leaves their markers.
# --------------------------------------------------------------------------------------
def _write_marker(marker: Path, text: str) -> None:
    partial = marker.with_name(f"{marker.name}.{os.getpid()}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, marker)


def run_jobs(backend: Any, paths: list[Path]) -> int:
    """Replay each job file's call on ``backend`` (the numba backend) with the compiled kernels
    (compile mode ``wait``), then write its marker (or ``<marker>.failed`` with the error);
    the number that failed."""
    set_compile_mode("wait")
    failures = 0
    for path in paths:
        with open(path, "rb") as fh:
            marker, threads, job = pickle.load(fh)
        marker = Path(marker)
        try:
            if marker.exists():
                continue
            numba.set_num_threads(threads)
            with _cache.locked(marker.parent / "compile.lock"):
                operation, request = pickle.loads(job)
                getattr(backend, operation)(request)
                if operation == "lstm_forward":
                    _replay_prepared(backend, request)
            _write_marker(marker, f"{operation}\n")
        except Exception as exc:  # recorded for the process that asked; it keeps to scipy-blas
            failures += 1
            with contextlib.suppress(OSError):
                _write_marker(marker.with_name(marker.name + ".failed"), f"{type(exc).__name__}: {exc}\n")
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
    return failures


def _replay_prepared(backend: Any, request: Any) -> None:
    """The forward a layer prepares for ``request``'s kind (``lstm_prepare_forward``), run
    once: a layer runs the second and later calls of a kind through it, and its compiled path
    may pass the kernels other kinds of argument than ``lstm_forward`` does."""
    call = backend.lstm_prepare_forward(request)
    if call is not None:
        call_prepared(call, request)


# --------------------------------------------------------------------------------------
# The decision, at the start of each top-level call.
# --------------------------------------------------------------------------------------
def ready_folder() -> Path:
    """Where the markers live: a folder beside the compiled kernels' disk cache."""
    cache: Any = getattr(_lstm_forward._recur, "_cache")
    return Path(cache._cache_path) / "bnnsfw-ready"


@attrs.frozen(kw_only=True)
class CompileStatus:
    """The compiled kernels as a process finds them (:meth:`NumbaBackend.compile_status`)."""

    #: The mode in force: ``background``, ``wait`` or ``off``.
    mode: str
    #: Numba's cache folder for the kernels, and the folder of the markers beside it.
    cache: Path
    markers: Path
    #: How many kinds of call have their kernels ready, and why any failed to compile.
    ready: int
    failed: tuple[str, ...]
    #: Whether a background compile of this process is under way or waiting to start.
    pending: bool
    #: The CPU the kernels are compiled for (another CPU compiles its own) and Numba's version.
    cpu: str
    numba_version: str


# --------------------------------------------------------------------------------------
# A process forked from one whose parallel regions ran on GNU OpenMP.
# --------------------------------------------------------------------------------------
#: Whether this process is a ``fork`` (``multiprocessing``'s default start method on Linux up
#: to Python 3.13) of a process whose compiled kernels had started Numba's GNU OpenMP threads.
#: GNU OpenMP cannot start a parallel region in such a child (its pool names threads the
#: child does not have), and Numba ends the child with SIGTERM at its first parallel region,
#: which leaves a ``multiprocessing`` pool waiting for ever. In such a child no compiled call
#: starts a parallel region (``NumbaBackend`` decides so): the LSTM's steps stay on the calling
#: thread, and normalization, whose compiled kernels are all parallel regions, runs on
#: ``scipy-blas``'s kernels. A child forked before the threads started, or from a process on
#: Numba's ``tbb`` or ``workqueue`` layer, runs as any process.
_forked_from_openmp = False
_said_forked = False


def _gnu_openmp_started() -> bool:
    """Whether Numba's threading layer has started in this process and is GNU OpenMP."""
    try:
        if numba.threading_layer() != "omp":  # ValueError: no parallel region has run yet
            return False
        from numba.np.ufunc import omppool  # type: ignore[attr-defined]  # a C extension
    except (ValueError, ImportError):
        return False
    return bool(getattr(omppool, "openmp_vendor", "GNU") == "GNU")


def _after_fork_in_child() -> None:
    global _forked_from_openmp
    _forked_from_openmp = _forked_from_openmp or _gnu_openmp_started()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_from_openmp() -> bool:
    """Whether this process is a fork of one running Numba's GNU OpenMP threads, where no
    parallel region can start (:data:`_forked_from_openmp`); the first time it is, one line on
    the ``bnnsfw`` logger says what to do instead."""
    global _said_forked
    if _forked_from_openmp and not _said_forked:
        _said_forked = True
        _log.warning("backend 'numba': this process was forked from one whose compiled kernels ran on "
                     "Numba's GNU OpenMP threads, which a forked process cannot use; its LSTMs run on "
                     "one thread and its normalization on scipy-blas's kernels. Start worker processes "
                     "with the 'spawn' or 'forkserver' method (multiprocessing.get_context('spawn')) "
                     "to use the threads.")
    return _forked_from_openmp


class Tiers:
    """Which kinds of call run compiled in this process, and the background compiles asked
    for the others (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: set[str] = set()
        self._failed: set[str] = set()
        self._queued: dict[str, bytes] = {}
        self._worker: subprocess.Popen | None = None
        self._running: list[str] = []
        self._said = False
        self._handing_over = False
        self._kinds: dict[tuple, tuple[tuple, str]] = {}

    def folder(self) -> Path:
        return ready_folder()

    def marker(self, kind: str) -> Path:
        return self.folder() / kind

    def _kind(self, operation: str, request: Any) -> str:
        """:func:`kind_of` the call, remembered by a key that is quick to make (a few
        microseconds): each array's shape, dtype and layout and write flags, the identity of
        everything else (for packed weights, of their configuration: they are packed anew
        whenever the weights change)."""
        key: list[Any] = [operation, numba.get_num_threads()]
        objects: list[Any] = []
        for name in _fields(type(request)):
            value = getattr(request, name)
            if name == "weights":
                value = value.config
            elif name == "gradients":
                value = (value.input, value.hidden, value.cell)
            if isinstance(value, np.ndarray):
                key.append(_array_kind(value))
            elif value is None or isinstance(value, (bool, int, float, str)):
                key.append(value)
            elif isinstance(value, tuple) and all(v is None or isinstance(v, np.ndarray) for v in value):
                key.append(tuple(None if v is None else _array_kind(v) for v in value))
            else:
                key.append(id(value))
                objects.append(value)
        found = self._kinds.get(tuple(key))
        if found is not None and all(a is b for a, b in zip(found[0], objects)):
            return found[1]
        kind = kind_of(operation, request)
        if len(self._kinds) >= 256:
            self._kinds.clear()
        self._kinds[tuple(key)] = (tuple(objects), kind)
        return kind

    @contextlib.contextmanager
    def serving(self, operation: str, request: Any) -> Iterator[None]:
        """Within the block the call runs compiled or not (:func:`compiled_now`), as
        :meth:`decide` says."""
        with self.running(self.decide(operation, request)):
            yield

    def running(self, compiled: bool) -> contextlib.AbstractContextManager[None]:
        """Within the block the call runs compiled or not (:func:`compiled_as`). An uncompiled
        call, while this process's background compile runs, keeps BLAS on one thread fewer
        than the cores this process may use (at least one), off the core the compile takes:
        every thread of a BLAS product must run for the product to end, and with the compile
        on one of two cores the demo's products took 30-70 times as long on two threads as
        on one."""
        if compiled or self._worker is None:
            return compiled_as(compiled)
        return _uncompiled_beside_compile(max(1, usable_cores() - 1))

    @staticmethod
    def compiles_in_process() -> bool:
        """Whether every call runs compiled, compiling in this process when it must (``wait``
        mode, or ``background`` in a frozen application)."""
        mode = compile_mode()
        return mode == "wait" or (mode == "background" and _FROZEN)

    def decide(self, operation: str, request: Any) -> bool:
        """Whether this call runs compiled: always in ``wait`` mode, else when its kind has a
        marker; in ``background`` mode, a compile asked for when it has none. Outside the
        modes of :meth:`compiles_in_process`, a kind that runs compiled once always does."""
        if self.compiles_in_process():
            return True
        mode = compile_mode()
        kind = self._kind(operation, request)
        if kind in self._ready:
            return True
        with self._lock:
            self._poll()
            if self.marker(kind).exists():
                self._ready.add(kind)
                return True
            if mode == "background" and kind not in self._failed and kind not in self._queued \
                    and kind not in self._running:
                self._queued[kind] = job_bytes(operation, request)
                self._start()
        return False

    def status(self) -> CompileStatus:
        """What :class:`CompileStatus` says, now."""
        folder = self.folder()
        ready = len(list(folder.glob("?" * 32))) if folder.exists() else 0
        failed = tuple(p.read_text(encoding="utf-8").strip() for p in sorted(folder.glob("*.failed"))) \
            if folder.exists() else ()
        return CompileStatus(mode=compile_mode(), cache=folder.parent, markers=folder, ready=ready,
                             failed=failed, pending=self.poll(), cpu=_cpu_name(),
                             numba_version=numba.__version__)

    def _hand_over(self) -> None:
        """At this process's exit, start a worker for the jobs still waiting: it outlives the
        process, and takes its turn at the markers' folder's lock after the one running now, so
        that the next process finds every kind of call this one made ready."""
        with self._lock:
            if self._queued:
                self._worker = None
                self._start()

    def poll(self) -> bool:
        """Whether a background compile is still under way (or waiting to start)."""
        with self._lock:
            self._poll()
            return self._worker is not None or bool(self._queued)

    def _poll(self) -> None:
        """Collect a finished worker's results and start the next (the lock is held)."""
        if self._worker is not None and self._worker.poll() is not None:
            for kind in self._running:
                if self.marker(kind).exists():
                    self._ready.add(kind)
                else:
                    self._failed.add(kind)
                    failed = self.marker(kind).with_name(kind + ".failed")
                    reason = failed.read_text(encoding="utf-8").strip() if failed.exists() else \
                        f"the compiling process exited with status {self._worker.returncode}"
                    _log.warning("compiling the numba kernels in the background failed (%s); these calls "
                                 "keep running on scipy-blas's kernels", reason)
            self._worker, self._running = None, []
        self._start()

    def _start(self) -> None:
        """Start a worker for the queued jobs unless one runs (the lock is held). While one
        runs, the jobs wait for it; should this process exit first, :meth:`_hand_over` gives
        them a worker of their own."""
        if not self._queued:
            return
        if self._worker is not None:
            if not self._handing_over:
                self._handing_over = True
                atexit.register(self._hand_over)
            return
        folder = self.folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            paths = []
            for kind, job in self._queued.items():
                handle, name = tempfile.mkstemp(prefix="job-", suffix=".pickle", dir=folder)
                with os.fdopen(handle, "wb") as fh:
                    pickle.dump((str(self.marker(kind)), numba.get_num_threads(), job), fh)
                paths.append(name)
        except OSError as exc:
            _log.warning("cannot compile the numba kernels in the background (%s); calls run on "
                         "scipy-blas's kernels (BNNSFW_COMPILE=wait compiles in this process)", exc)
            self._failed.update(self._queued)
            self._queued.clear()
            return
        # A fresh interpreter, not a fork (a fork would inherit this process's threads and
        # locks), in a session of its own, so that it finishes when this process exits first.
        # It imports this very copy of bnnsfw, wherever this process found it.
        package_parent = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (package_parent, os.environ.get("PYTHONPATH")) if p))
        self._worker = subprocess.Popen(
            [sys.executable, "-c", "import sys; from bnnsfw.backends.numba._worker import main; "
             "sys.exit(main(sys.argv[1:]))", *paths], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env, start_new_session=platform.system() != "Windows",
            close_fds=True)
        self._running = list(self._queued)
        self._queued.clear()
        if not self._said:
            self._said = True
            _log.info("compiling the numba kernels in a background process (folder %s); calls run on "
                      "scipy-blas's kernels until they are ready", folder)



"""Worker processes: each worker's share of the cores, for Numba's threads and BLAS's.

A pool of ``k`` worker processes on ``c`` cores, each running the default thread counts, starts
``k·c`` threads for Numba and as many for BLAS, and they compete for the cores. Give each worker
``c // k`` instead (:func:`worker_threads`): as environment variables read when the libraries
load (:func:`worker_environment`, for a worker started with them, such as a Dask worker's), or
from the pool's initializer (:func:`init_worker`), which also sets the libraries loaded already.
``docs/scaling.md`` has the recipes.
"""

from __future__ import annotations

import os
import sys

from ._threadpool import set_blas_threads, usable_cores
from .errors import InvalidParameterError, must_be

__all__ = ["worker_threads", "worker_environment", "init_worker"]

#: The environment variables that size Numba's pool and the BLAS and OpenMP libraries' pools
#: when they load.
THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS")


def _positive_int(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError(must_be(where, "an integer >= 1", value))
    return value


def worker_threads(workers: int, cores: int | None = None) -> int:
    """Each of ``workers`` processes' share of ``cores`` (default: the cores this process may
    run on): ``cores // workers``, at least 1.

    >>> worker_threads(4, cores=16), worker_threads(3, cores=8), worker_threads(4, cores=2)
    (4, 2, 1)
    """
    workers = _positive_int("worker_threads(workers)", workers)
    cores = usable_cores() if cores is None else _positive_int("worker_threads(cores)", cores)
    return max(1, cores // workers)


def worker_environment(threads: int) -> dict[str, str]:
    """The environment variables that give a process started with them ``threads`` threads for
    Numba and for BLAS (and OpenMP): pass them to the process's environment.

    >>> worker_environment(2)["NUMBA_NUM_THREADS"]
    '2'
    """
    threads = _positive_int("worker_environment(threads)", threads)
    return dict.fromkeys(THREAD_VARIABLES, str(threads))


def init_worker(threads: int) -> None:
    """Give this worker process ``threads`` threads for Numba and for BLAS: a pool's initializer.

    Sets :func:`worker_environment` in ``os.environ`` (what a library that loads later reads,
    Numba included when it is not imported yet); when Numba is already imported, sets its
    count for the calling thread (``numba.set_num_threads`` holds for the thread that calls
    it: a ``multiprocessing`` or ``concurrent.futures`` worker runs its tasks on that thread),
    at most the size of the pool it has started; and loads SciPy's BLAS and sets every loaded
    BLAS library to ``threads``.

    >>> import multiprocessing, bnnsfw
    >>> context = multiprocessing.get_context("spawn")
    >>> pool = context.Pool(2, initializer=bnnsfw.init_worker,
    ...                     initargs=(bnnsfw.worker_threads(2),))  # doctest: +SKIP
    """
    threads = _positive_int("init_worker(threads)", threads)
    os.environ.update(worker_environment(threads))
    numba = sys.modules.get("numba")
    if numba is not None:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    import scipy.linalg.blas  # noqa: F401  (the backends' BLAS, loaded now with the variables above)

    set_blas_threads(threads)

"""Worker processes: each worker's share of the threads, seen from inside a task."""

from __future__ import annotations

import multiprocessing

import pytest

import bnnsfw as bf

#: A pool whose worker died waits for ever; a task taking this long has failed.
TIMEOUT = 120


def _threads_seen(_: object) -> tuple[int, int]:
    """Numba's thread count for the task's thread and the smallest BLAS library's count."""
    import numba
    from threadpoolctl import threadpool_info

    blas = [library["num_threads"] for library in threadpool_info() if library["user_api"] == "blas"]
    return numba.get_num_threads(), min(blas)


def test_a_spawned_worker_gets_its_share_of_the_threads():
    """``init_worker`` as a spawned pool's initializer, before the worker imported Numba: each
    task sees the given counts for Numba (its pool's size too) and for BLAS."""
    threads = bf.worker_threads(2, cores=2)
    context = multiprocessing.get_context("spawn")
    with context.Pool(2, initializer=bf.init_worker, initargs=(threads,)) as pool:
        seen = pool.map_async(_threads_and_pool, [0, 1], chunksize=1).get(TIMEOUT)
    assert seen == [(1, 1, 1), (1, 1, 1)]


def _threads_and_pool(_: object) -> tuple[int, int, int]:
    """:func:`_threads_seen` and the size of Numba's pool."""
    import numba

    return (*_threads_seen(None), numba.config.NUMBA_NUM_THREADS)


def test_worker_threads_is_the_share_of_the_cores():
    assert [bf.worker_threads(k, cores=8) for k in (1, 2, 3, 8, 9)] == [8, 4, 2, 1, 1]
    assert bf.worker_threads(1) >= 1
    assert set(bf.worker_environment(3).values()) == {"3"}


@pytest.mark.parametrize("call, message", [
    (lambda: bf.worker_threads(0), r"worker_threads\(workers\) must be an integer >= 1; got 0"),
    (lambda: bf.worker_threads(2, cores=2.5), r"worker_threads\(cores\) must be an integer >= 1; got 2.5"),
    (lambda: bf.worker_environment(True), r"worker_environment\(threads\) must be .* got True"),
    (lambda: bf.init_worker(-1), r"init_worker\(threads\) must be an integer >= 1; got -1"),
])
def test_bad_counts_are_refused_naming_the_argument(call, message):
    with pytest.raises(bf.InvalidParameterError, match=message):
        call()

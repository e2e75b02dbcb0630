"""Worker processes: a forked pool after the parent ran every layer kind, and each worker's
share of the threads, seen from inside a task."""

from __future__ import annotations

import multiprocessing
import warnings

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

#: A pool whose worker died waits for ever; a task taking this long has failed.
TIMEOUT = 120


def _every_layer_kind(seed: int) -> list[np.ndarray]:
    """Every layer kind forward and backward on the default backend, tiny: the LSTM with the
    default cell and with other activations (the compiled backend's two kinds of LSTM kernel),
    each normalization with the statistics of the batch, and the fully connected layer."""
    rng = np.random.default_rng(seed)
    results = []
    x = rng.standard_normal((5, 3, 4)).astype(np.float32)
    lengths = np.array([5, 2, 4])
    for options in ({}, {"hidden_activation": bf.Activation.relu()}):
        params = bf.LSTMParameters.random(input_size=4, hidden_size=6, seed=seed, **options)
        with bf.LSTMLayer(params) as lstm:
            y = lstm.apply(x, sequence_lengths=lengths, training=True)
            grads = lstm.apply_backward(x, np.ones_like(y.output), sequence_lengths=lengths)
            results += [y.output, y.hidden, grads.input, grads.input_gate.hidden_weights]
    images = rng.standard_normal((4, 6, 3, 3)).astype(np.float32)
    for kind in (NormalizationType.batch(), NormalizationType.instance(), NormalizationType.layer(),
                 NormalizationType.group(2)):
        params = NormalizationParameters(type=kind, input_shape=(6, 3, 3), dtype=np.float32)
        with NormalizationLayer(params) as norm:
            out = norm.apply(images, phase="training")
            results += [out, norm.apply_backward(images, np.cos(images), output=out).input]
    dense = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=4, output_size=2, seed=seed))
    with dense:
        out = dense.apply(x[0])
        results += [out, dense.apply_backward(x[0], np.ones_like(out), output=out).input]
    return results


def _threads_seen(_: object) -> tuple[int, int]:
    """Numba's thread count for the task's thread and the smallest BLAS library's count."""
    import numba
    from threadpoolctl import threadpool_info

    blas = [library["num_threads"] for library in threadpool_info() if library["user_api"] == "blas"]
    return numba.get_num_threads(), min(blas)


def _every_layer_kind_noting_compiled_calls(seed: int) -> tuple[list[np.ndarray], set[str]]:
    """:func:`_every_layer_kind`, and which of the compiled backend's entry points it called."""
    calls: set[str] = set()
    try:
        from bnnsfw.backends.numba import _lstm, _normalization
    except ImportError:  # no Numba: the default backend is not the compiled one
        return _every_layer_kind(seed), calls
    for module, prefix in ((_lstm, "lstm"), (_normalization, "norm")):
        for name in ("forward", "backward"):
            def spy(*args, _original=getattr(module, name), _name=f"{prefix}_{name}", **kwargs):
                calls.add(_name)
                return _original(*args, **kwargs)

            setattr(module, name, spy)  # in the worker only, which the pool ends
    return _every_layer_kind(seed), calls


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this system")
def test_a_forked_pool_runs_every_layer_kind_after_the_parent_did():
    """The parent's compiled kernels have started Numba's threads (GNU OpenMP on Linux, where a
    forked child that starts a parallel region is killed and the pool waits for ever): the
    forked workers compute every layer kind, the LSTMs with the same compiled kernels as the
    parent (the same bits) and, on GNU OpenMP, the normalization on the reference kernels
    (within the tolerance); each worker sees the one thread its initializer gave it."""
    expected = _every_layer_kind(0)
    layer = _threading_layer()
    with warnings.catch_warnings():  # Python 3.12 warns of a fork from a process with threads
        warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
        with multiprocessing.get_context("fork").Pool(2, initializer=bf.init_worker, initargs=(1,)) as pool:
            done = pool.map_async(_every_layer_kind_noting_compiled_calls, [0, 0], chunksize=1).get(TIMEOUT)
            threads = pool.map_async(_threads_seen, [0, 1], chunksize=1).get(TIMEOUT)
    for results, calls in done:
        assert len(results) == len(expected)
        for got, want in zip(results[:8], expected[:8]):  # the LSTMs
            np.testing.assert_array_equal(got, want)
        for got, want in zip(results[8:], expected[8:]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if layer is not None:
            assert {"lstm_forward", "lstm_backward"} <= calls
            assert ("norm_forward" in calls) == (layer != "omp")
    assert threads == [(1, 1), (1, 1)]


def _threading_layer() -> str | None:
    """Numba's threading layer in this process, or None without Numba or before it chose one."""
    try:
        import numba

        return numba.threading_layer()
    except (ImportError, ValueError):
        return None


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

"""Family 5: threads. ``close()`` racing other threads' calls, and BLAS thread limits.

A call racing ``close()`` either completes (with the right answer) or is refused with
``FilterClosedError``; and however layers with different ``n_threads`` interleave on several
threads, the process's BLAS thread counts are exactly what they were before.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest
from hostile._hostile import answered, attempt, wrong
from threadpoolctl import threadpool_info

import bnnsfw as bf
from bnnsfw.layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

F32 = np.float32


def lstm_layer(backend: str, **options: Any) -> tuple[Any, Callable[[Any], Any], Any]:
    layer = bf.LSTMLayer(bf.LSTMParameters.random(input_size=6, hidden_size=8, seed=1),
                         bf.FilterParameters(backend=backend, **options))
    x = np.random.default_rng(0).standard_normal((5, 3, 6)).astype(F32)
    return layer, lambda lay: lay.apply(x, training=True).output, x


def normalization_layer(backend: str, **options: Any) -> tuple[Any, Callable[[Any], Any], Any]:
    layer = NormalizationLayer(NormalizationParameters(type=NormalizationType.layer(), input_shape=(4, 64)),
                               bf.FilterParameters(backend=backend, **options))
    x = np.random.default_rng(0).standard_normal((8, 4, 64)).astype(F32)
    return layer, lambda lay: lay.apply_backward(x, x, phase="training").input, x


def dense_layer(backend: str, **options: Any) -> tuple[Any, Callable[[Any], Any], Any]:
    layer = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=16, output_size=8, seed=0),
                                   bf.FilterParameters(backend=backend, **options))
    x = np.random.default_rng(0).standard_normal((32, 16)).astype(F32)
    return layer, lambda lay: lay.apply(x), x


MAKERS = {"lstm": lstm_layer, "normalization": normalization_layer, "fully_connected": dense_layer}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_close_racing_calls(kind: str, backend_name: str) -> None:
    """8 threads call the layer while the main thread closes it at a random moment."""
    random.seed(18)
    for trial in range(10):
        layer, call, _ = MAKERS[kind](backend_name)
        expected = np.array(call(layer), copy=True)
        start = threading.Barrier(9)
        outcomes: list[tuple[bool, Any]] = []
        lock = threading.Lock()

        def worker() -> None:
            start.wait()
            for _ in range(3):
                outcome = attempt("threads", call, layer)
                with lock:
                    outcomes.append(outcome)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(random.uniform(0, 0.002))
        layer.close()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a call hung after close()"
        for ok, value in outcomes:
            if not ok:
                assert isinstance(value, bf.FilterClosedError)
            elif not np.array_equal(value, expected):
                raise wrong("threads", f"{kind}: a call racing close() gave another answer")
            else:
                answered("threads")


def blas_counts() -> list[int]:
    return [int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_thread_limits_are_restored_exactly(kind: str, backend_name: str) -> None:
    """Layers limited to 1 and 2 BLAS threads and unlimited ones, from 4 threads at once."""
    before = blas_counts()
    for run in range(4):
        made = [MAKERS[kind](backend_name, n_threads=n) for n in (1, 2, 1, 0)]
        expected = [np.array(call(layer), copy=True) for layer, call, _ in made]
        start = threading.Barrier(len(made))
        errors: list[BaseException] = []
        results: list[tuple[int, Any]] = []

        def worker(index: int) -> None:
            layer, call, _ = made[index]
            start.wait()
            try:
                for _ in range(4):
                    results.append((index, call(layer)))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(made))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        for index, value in results:
            if not np.allclose(value, expected[index], rtol=1e-6, atol=1e-6):
                raise wrong("threads", "a result under a thread limit differs")
        if blas_counts() != before:
            raise wrong("threads", f"BLAS thread counts {blas_counts()} after the run, {before} before")
        answered("threads")

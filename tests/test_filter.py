import gc
import weakref

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import bnnsfw as bf
from bnnsfw.backends.contract import GemmRequest


class ScaleLayer(bf.Filter):
    """A minimal layer for lifecycle tests: y = w · x through the backend's gemm."""

    def __init__(self, weights, filter_parameters=None):
        super().__init__(filter_parameters)
        self.weights = weights if self.filter_parameters.use_client_pointer else weights.copy()
        self.blas_threads_seen = None

    def apply(self, x):
        self._check_open("apply")
        with self._threads():
            self.blas_threads_seen = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
            return self.backend.gemm(GemmRequest(a=x, b=self.weights, trans_b=True)).out

    def _release(self):
        self.weights = None

    def _describe(self):
        return f"weights={self.weights.shape}"


def test_close_is_idempotent_and_blocks_further_use():
    layer = ScaleLayer(np.eye(2))
    assert not layer.closed
    layer.close()
    layer.close()
    assert layer.closed and layer.weights is None
    with pytest.raises(bf.FilterClosedError,
                       match=r"ScaleLayer.apply\(\) was called after close\(\); create a new ScaleLayer"):
        layer.apply(np.ones((1, 2)))
    assert issubclass(bf.FilterClosedError, ValueError)


def test_check_open_is_public_and_names_the_caller():
    layer = ScaleLayer(np.eye(2))
    layer.check_open("save_weights")  # open: nothing happens
    layer.close()
    with pytest.raises(bf.FilterClosedError, match=r"ScaleLayer.save_weights\(\) was called after close\(\)"):
        layer.check_open("save_weights")


def test_context_manager_closes():
    with ScaleLayer(np.eye(2)) as layer:
        np.testing.assert_array_equal(layer.apply(np.ones((1, 2))), [[1.0, 1.0]])
    assert layer.closed
    with pytest.raises(bf.FilterClosedError):
        with layer:
            pass  # pragma: no cover


def test_garbage_collection_releases_buffers():
    weights = np.eye(3)
    layer = ScaleLayer(weights)
    held = weakref.ref(layer)
    del layer
    gc.collect()
    assert held() is None


def test_repr_shows_type_shapes_backend_and_state():
    layer = ScaleLayer(np.eye(3), bf.FilterParameters(backend="numpy"))
    assert repr(layer) == "<ScaleLayer weights=(3, 3), backend='numpy', open>"
    layer.close()
    assert repr(layer) == "<ScaleLayer backend='numpy', closed>"


def test_backend_captured_at_creation():
    with bf.use_backend("numpy"):
        layer = ScaleLayer(np.eye(2))
    assert layer.backend.name == "numpy"
    assert ScaleLayer(np.eye(2)).backend.name == bf.get_backend("auto").name
    assert ScaleLayer(np.eye(2), bf.FilterParameters(backend="numpy")).backend.name == "numpy"


def test_client_pointer_keeps_callers_array():
    w = np.eye(2)
    shared = ScaleLayer(w, bf.FilterParameters(use_client_pointer=True))
    copied = ScaleLayer(w)
    w *= 3.0
    np.testing.assert_array_equal(shared.apply(np.ones((1, 2))), [[3.0, 3.0]])
    np.testing.assert_array_equal(copied.apply(np.ones((1, 2))), [[1.0, 1.0]])


def test_n_threads_limits_blas_only_while_running():
    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    layer = ScaleLayer(np.eye(2), bf.FilterParameters(n_threads=1))
    layer.apply(np.ones((1, 2)))
    assert layer.blas_threads_seen and set(layer.blas_threads_seen) == {1}
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_threads": -1},
         r"FilterParameters.n_threads must be an integer >= 0 \(0: library default\); got -1"),
        ({"n_threads": 1.5}, "n_threads must be"),
        ({"use_client_pointer": 1}, "FilterParameters.use_client_pointer must be True or False; got 1"),
        ({"backend": 3.0}, "FilterParameters.backend must implement the backend contract"),
    ],
)
def test_filter_parameters_validate(kwargs, message):
    with pytest.raises(bf.InvalidParameterError, match=message):
        bf.FilterParameters(**kwargs)


def test_filter_parameters_are_frozen_keyword_only():
    with pytest.raises(TypeError):
        bf.FilterParameters("numpy")  # type: ignore[misc]
    fp = bf.FilterParameters()
    with pytest.raises(AttributeError):
        fp.n_threads = 2  # type: ignore[misc]


def test_unknown_backend_name_fails_at_creation():
    with pytest.raises(bf.UnknownBackendError, match="'nope'"):
        ScaleLayer(np.eye(2), bf.FilterParameters(backend="nope"))


def test_wrong_filter_parameters_type():
    with pytest.raises(bf.InvalidParameterError,
                       match=r"ScaleLayer\(filter_parameters\) must be a FilterParameters"):
        ScaleLayer(np.eye(2), {"backend": "numpy"})


def test_blas_limits_nest_overlap_and_restore_exactly():
    """Limits in force together: the smallest applies, a block of 0 changes nothing, blocks may
    end in any order, and the last to end restores every library's own count."""
    from bnnsfw._threadpool import blas_limit, current_limit

    def counts() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = counts()
    if not before:
        pytest.skip("no BLAS library that threadpoolctl can control")
    with blas_limit(2):
        assert set(counts()) == {2} and current_limit() == 2
        with blas_limit(1):
            assert set(counts()) == {1} and current_limit() == 1
            with blas_limit(3), blas_limit(0):
                assert set(counts()) == {1} and current_limit() == 1
            assert set(counts()) == {1}
        assert set(counts()) == {2} and current_limit() == 2
    assert counts() == before and current_limit() == 0
    wide, narrow = blas_limit(2), blas_limit(1)  # overlapping, not nested (two threads' calls)
    wide.__enter__()
    narrow.__enter__()
    wide.__exit__(None, None, None)
    assert set(counts()) == {1} and current_limit() == 1
    narrow.__exit__(None, None, None)
    assert counts() == before and current_limit() == 0


def test_blas_limits_apply_on_any_thread():
    """A limit entered on a thread other than the first one to set the counts applies there
    too, and ends restoring them (pthreads OpenBLAS, whose own functions bnnsfw calls)."""
    import threading

    from bnnsfw._threadpool import blas_limit

    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    if not blas or any(i["internal_api"] != "openblas" or i.get("threading_layer") != "pthreads"
                       for i in blas):
        pytest.skip("needs every BLAS library to be a pthreads OpenBLAS")

    def counts() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = counts()
    limit = 2 if set(before) == {1} else 1  # a count that differs from some library's own
    with blas_limit(limit):  # this thread sets the counts first
        assert set(counts()) == {limit}
    seen: list[list[int]] = []

    def elsewhere() -> None:
        with blas_limit(limit):
            seen.append(counts())
        seen.append(counts())

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [[limit] * len(before), before]

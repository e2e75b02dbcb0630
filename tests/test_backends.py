import itertools
import sys
import threading

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import backends


def test_builtin_backends_are_registered():
    names = bf.available_backends()
    assert "numpy" in names and "scipy-blas" in names
    assert bf.get_backend("auto").name == "scipy-blas"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a, trans_b", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (1.0, 1.0), (-0.5, 2.0), (2.0, 0.0)])
def test_gemm_matches_matmul(backend_name, dtype, trans_a, trans_b, alpha, beta, rng):
    backend = bf.get_backend(backend_name)
    m, n, k = 5, 7, 3
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    out = c0.copy()
    a_before, b_before = a.copy(), b.copy()
    result = backend.gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    opa = a.T if trans_a else a
    opb = b.T if trans_b else b
    expected = alpha * (opa.astype(np.float64) @ opb.astype(np.float64)) + beta * c0
    assert result is out
    assert out.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)


def test_gemm_accumulates_repeatedly_into_the_same_output(backend_name, rng):
    backend = bf.get_backend(backend_name)
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((6, 2))
    out = np.zeros((4, 2))
    for _ in range(3):
        backend.gemm(a, b, out, beta=1.0)
    np.testing.assert_allclose(out, 3 * (a @ b), rtol=1e-12)


def test_gemm_without_out_returns_new_array(backend_name, rng):
    backend = bf.get_backend(backend_name)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    got = backend.gemm(a, b)
    assert got.shape == (3, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got, a @ b, rtol=1e-5)


def test_gemm_on_views_and_fortran_inputs(backend_name, rng):
    backend = bf.get_backend(backend_name)
    big = rng.standard_normal((8, 10))
    a = big[1:6, ::2]            # neither C nor F contiguous
    b = np.asfortranarray(rng.standard_normal((5, 4)))
    out = np.ones((5, 4))
    backend.gemm(a, b, out, beta=1.0)
    np.testing.assert_allclose(out, a @ b + 1.0, rtol=1e-12)
    col_block = np.zeros((5, 8))[:, 2:6]   # a non-contiguous output is still written in place
    backend.gemm(a, b, col_block)
    np.testing.assert_allclose(col_block, a @ b, rtol=1e-12)


def test_scipy_gemm_writes_into_out_without_copies(rng):
    backend = bf.get_backend("scipy-blas")
    a, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((48, 32)).astype(np.float32)
    out = np.zeros((64, 48), np.float32)
    address = out.__array_interface__["data"][0]
    backend.gemm(a, b, out, trans_b=True, beta=1.0)
    assert out.__array_interface__["data"][0] == address
    np.testing.assert_allclose(out, a @ b.T, rtol=1e-5, atol=1e-5)


def test_gemm_rejects_bad_shapes(backend_name):
    backend = bf.get_backend(backend_name)
    with pytest.raises(bf.ShapeError, match="matching inner dimensions"):
        backend.gemm(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(bf.ShapeError, match=r"gemm\(out\) must be of shape \(2, 2\)"):
        backend.gemm(np.ones((2, 3)), np.ones((3, 2)), np.ones((2, 3)))
    with pytest.raises(bf.ShapeError, match="2-D"):
        backend.gemm(np.ones(3), np.ones((3, 2)))
    with pytest.raises(bf.InvalidParameterError, match="0 when out is None"):
        backend.gemm(np.ones((2, 3)), np.ones((3, 2)), beta=1.0)


def test_unknown_backend_lists_registered_names():
    with pytest.raises(bf.UnknownBackendError,
                       match=r"backend must be one of auto, .*numpy.*scipy-blas.*; got 'cuda'"):
        bf.get_backend("cuda")
    with pytest.raises(bf.UnknownBackendError):
        with bf.use_backend("cuda"):
            pass  # pragma: no cover


@pytest.fixture
def isolated_registry(monkeypatch):
    monkeypatch.setattr(backends, "_factories", dict(backends._factories))
    monkeypatch.setattr(backends, "_instances", dict(backends._instances))


class CountingBackend(backends.NumpyBackend):
    name = "counting"

    def __init__(self):
        self.calls = 0

    def gemm(self, a, b, out=None, **kw):
        self.calls += 1
        return super().gemm(a, b, out, **kw)


def test_third_party_backend_registered_and_used_by_name(isolated_registry):
    bf.register_backend("counting", CountingBackend)
    assert "counting" in bf.available_backends()
    backend = bf.get_backend("counting")
    backend.gemm(np.ones((2, 2)), np.ones((2, 2)))
    assert backend.calls == 1
    assert bf.get_backend("counting") is backend  # one instance per name
    with pytest.raises(bf.InvalidParameterError, match="not yet registered"):
        bf.register_backend("counting", CountingBackend)
    bf.register_backend("counting", CountingBackend, replace=True)
    assert bf.get_backend("counting") is not backend


def test_register_backend_validates(isolated_registry):
    with pytest.raises(bf.InvalidParameterError, match="other than 'auto'"):
        bf.register_backend("auto", CountingBackend)
    with pytest.raises(bf.InvalidParameterError, match="callable"):
        bf.register_backend("x", 3)


def test_entry_point_discovery(isolated_registry, tmp_path, monkeypatch):
    (tmp_path / "plugin_backend_mod.py").write_text(
        "from bnnsfw.backends import NumpyBackend\n"
        "class PluginBackend(NumpyBackend):\n    name = 'plugin'\n"
    )
    dist = tmp_path / "bnnsfw_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bnnsfw-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[bnnsfw.backends]\nplugin = plugin_backend_mod:PluginBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "_entry_points_loaded", False)
    assert "plugin" in bf.available_backends()
    assert bf.get_backend("plugin").name == "plugin"
    monkeypatch.delitem(sys.modules, "plugin_backend_mod", raising=False)


def test_use_backend_nests_and_restores():
    assert bf.current_backend().name == "scipy-blas"
    with bf.use_backend("numpy") as outer:
        assert outer.name == "numpy" and bf.current_backend() is outer
        with bf.use_backend("scipy-blas"):
            assert bf.current_backend().name == "scipy-blas"
        assert bf.current_backend().name == "numpy"
    assert bf.current_backend().name == "scipy-blas"


def test_use_backend_is_per_thread():
    seen = {}
    inside = threading.Event()
    release = threading.Event()

    def worker():
        with bf.use_backend("numpy"):
            seen["worker"] = bf.current_backend().name
            inside.set()
            release.wait(5)

    t = threading.Thread(target=worker)
    t.start()
    inside.wait(5)
    seen["main"] = bf.current_backend().name
    release.set()
    t.join()
    assert seen == {"worker": "numpy", "main": "scipy-blas"}


def test_backend_object_is_accepted_directly():
    backend = CountingBackend()
    assert bf.get_backend(backend) is backend
    with pytest.raises(bf.InvalidParameterError, match="backend must be"):
        bf.get_backend(42)

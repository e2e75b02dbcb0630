import functools
import itertools
import sys
import threading

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import backends
from bnnsfw.backends.contract import OPERATIONS, GemmRequest, GemmResult
from bnnsfw.testing import ConformanceError, _check_prepared_lstm, _Comparison, _prepared_cases, check_backend


def gemm(backend, a, b, out=None, **options):
    """The contract's product as a call with loose arguments."""
    return backend.gemm(GemmRequest(a=a, b=b, out=out, **options)).out


def test_builtin_backends_are_registered():
    names = bf.available_backends()
    assert "numpy" in names and "scipy-blas" in names
    assert bf.get_backend("auto").name == ("numba" if "numba" in names else "scipy-blas")


def test_auto_falls_back_to_scipy_blas_with_one_log_line_when_numba_cannot_import(monkeypatch, caplog):
    monkeypatch.setattr(backends, "_auto_choice", None)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    with caplog.at_level("WARNING", logger="bnnsfw"):
        assert bf.get_backend("auto").name == "scipy-blas"
        assert bf.get_backend("auto").name == "scipy-blas"
    lines = [r.getMessage() for r in caplog.records if r.name == "bnnsfw"]
    assert len(lines) == 1 and "backend 'auto' uses 'scipy-blas': ModuleNotFoundError" in lines[0]
    monkeypatch.setattr(backends, "_auto_choice", None)


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
    result = gemm(backend, a, b, out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
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
        gemm(backend, a, b, out, beta=1.0)
    np.testing.assert_allclose(out, 3 * (a @ b), rtol=1e-12)


def test_gemm_without_out_returns_new_array(backend_name, rng):
    backend = bf.get_backend(backend_name)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    got = gemm(backend, a, b)
    assert got.shape == (3, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got, a @ b, rtol=1e-5)


def test_gemm_on_views_and_fortran_inputs(backend_name, rng):
    backend = bf.get_backend(backend_name)
    big = rng.standard_normal((8, 10))
    a = big[1:6, ::2]            # neither C nor F contiguous
    b = np.asfortranarray(rng.standard_normal((5, 4)))
    out = np.ones((5, 4))
    gemm(backend, a, b, out, beta=1.0)
    np.testing.assert_allclose(out, a @ b + 1.0, rtol=1e-12)
    col_block = np.zeros((5, 8))[:, 2:6]   # a non-contiguous output is still written in place
    gemm(backend, a, b, col_block)
    np.testing.assert_allclose(col_block, a @ b, rtol=1e-12)


def test_scipy_gemm_writes_into_out_without_copies(rng):
    backend = bf.get_backend("scipy-blas")
    a, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((48, 32)).astype(np.float32)
    out = np.zeros((64, 48), np.float32)
    address = out.__array_interface__["data"][0]
    gemm(backend, a, b, out, trans_b=True, beta=1.0)
    assert out.__array_interface__["data"][0] == address
    np.testing.assert_allclose(out, a @ b.T, rtol=1e-5, atol=1e-5)


def test_gemm_rejects_bad_shapes(backend_name):
    backend = bf.get_backend(backend_name)
    with pytest.raises(bf.ShapeError, match="matching inner dimensions"):
        gemm(backend, np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(bf.ShapeError, match=r"gemm\(out\) must be of shape \(2, 2\)"):
        gemm(backend, np.ones((2, 3)), np.ones((3, 2)), np.ones((2, 3)))
    with pytest.raises(bf.ShapeError, match="2-D"):
        gemm(backend, np.ones(3), np.ones((3, 2)))
    with pytest.raises(bf.InvalidParameterError, match="0 when out is None"):
        gemm(backend, np.ones((2, 3)), np.ones((3, 2)), beta=1.0)


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

    def gemm(self, request: GemmRequest) -> GemmResult:
        self.calls += 1
        return super().gemm(request)


def test_third_party_backend_registered_and_used_by_name(isolated_registry):
    bf.register_backend("counting", CountingBackend)
    assert "counting" in bf.available_backends()
    backend = bf.get_backend("counting")
    gemm(backend, np.ones((2, 2)), np.ones((2, 2)))
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


# ------------------------------------------------------------------------------------------
# The contract is checked at the door.
# ------------------------------------------------------------------------------------------
class ProductOnly:
    """What the old protocol asked for: a name and a matrix product."""

    name = "product-only"

    def gemm(self, request):
        return backends.NumpyBackend().gemm(request)


def test_a_backend_with_only_a_product_is_refused_naming_every_missing_operation(isolated_registry):
    with pytest.raises(bf.BackendError) as caught:
        bf.register_backend("product-only", ProductOnly)
    message = str(caught.value)
    for operation in OPERATIONS:
        if operation != "gemm":
            assert f"missing {operation}(" in message
    assert "missing gemm" not in message
    assert "product-only" not in bf.available_backends()
    with pytest.raises(bf.BackendError, match="missing lstm_forward"):
        bf.FilterParameters(backend=ProductOnly())
    with pytest.raises(bf.BackendError, match="missing normalization_forward"):
        bf.get_backend(ProductOnly())


def test_a_backend_class_handed_over_as_an_object_is_refused_with_advice():
    with pytest.raises(bf.BackendError, match="an instance, not the class NumpyBackend"):
        bf.FilterParameters(backend=backends.NumpyBackend)


def test_a_factory_that_makes_no_backend_is_refused_at_registration(isolated_registry):
    with pytest.raises(bf.BackendError,
                       match=r"register_backend\('answer', factory\).*got a int.*name must be"):
        bf.register_backend("answer", lambda: 42)
    assert "answer" not in bf.available_backends()


class Miswritten(backends.NumpyBackend):
    name = "miswritten"
    lstm_forward = 42  # not a method

    def lstm_backward(self, request, extra):  # two arguments
        raise AssertionError("never called")

    def normalization_forward(self, request: GemmRequest) -> GemmResult:  # the wrong types
        raise AssertionError("never called")


def test_wrongly_typed_operations_are_named(isolated_registry):
    with pytest.raises(bf.BackendError) as caught:
        bf.register_backend("miswritten", Miswritten)
    message = str(caught.value)
    wanted = "lstm_forward(LSTMForwardRequest) -> LSTMForwardResult"
    assert f"lstm_forward must be a method {wanted} (got int)" in message
    assert "lstm_backward must take one request argument" in message
    assert "normalization_forward takes a GemmRequest, not a NormalizationForwardRequest" in message
    assert "gemm" not in message.split("breaks it:")[1]  # the inherited ones are fine


class Delegating:
    """A backend written from docs/backends.md alone: no base class, every operation its own
    method, each handing the request to a reference instance it holds (and counting)."""

    name = "delegating"

    def __init__(self):
        self._reference = backends.NumpyBackend()
        self.calls = {operation: 0 for operation in OPERATIONS}

    def _call(self, operation, request):
        self.calls[operation] += 1
        return getattr(self._reference, operation)(request)

    def gemm(self, request):
        return self._call("gemm", request)

    def lstm_pack_weights(self, request):
        return self._call("lstm_pack_weights", request)

    def lstm_cache_layout(self, request):
        return self._call("lstm_cache_layout", request)

    def lstm_forward(self, request):
        return self._call("lstm_forward", request)

    def lstm_backward(self, request):
        return self._call("lstm_backward", request)

    def normalization_forward(self, request):
        return self._call("normalization_forward", request)

    def normalization_backward(self, request):
        return self._call("normalization_backward", request)


def test_a_backend_written_from_the_contract_alone_runs_every_layer(isolated_registry):
    bf.register_backend("delegating", Delegating)
    backend = bf.get_backend("delegating")
    report = check_backend("delegating", quick=True)
    assert report.failures == [] and report.checked > 50
    assert all(count > 0 for count in backend.calls.values()), backend.calls


class Perturbed(Delegating):
    """Right shape, wrong numbers: the LSTM output off by 1e-3."""

    name = "perturbed"

    def lstm_forward(self, request):
        result = super().lstm_forward(request)
        result.output[...] += 1e-3
        return result


def test_the_kit_reports_each_disagreement_with_its_configuration():
    report = check_backend(Perturbed(), quick=True, raise_on_failure=False)
    assert report.failures
    assert all(f.startswith("LSTM ") for f in report.failures)
    assert any("num_layers=2, bidirectional=True, peepholes=full" in f and "output differs" in f
               for f in report.failures)
    with pytest.raises(ConformanceError, match="backend 'perturbed' disagrees with the reference"):
        check_backend(Perturbed(), quick=True)


class IgnoresVariants(bf.backends.NumpyBackend):
    """A backend that predates SPEC 4.1: it runs every configuration as BNNS's cell."""

    name = "ignores-variants"

    @staticmethod
    def _lstm_general_serves(config):
        return False


def test_the_kit_catches_a_backend_that_ignores_the_lstm_variants():
    report = check_backend(IgnoresVariants(), quick=True, raise_on_failure=False)
    variants = {"clip", "cell_clip_input_forget", "reverse", "direction_activations", "projection_clip",
                "layer_norm"}
    failing = {v for v in variants if any(f"variant={v}" in f for f in report.failures)}
    assert failing == variants, report.failures
    assert not any("variant=plain" in f for f in report.failures)


@pytest.mark.slow
def test_every_registered_backend_passes_the_conformance_kit(backend_name):
    report = check_backend(backend_name)
    assert report.failures == []
    assert report.checked > 100 and report.compared > 1000


def test_entry_point_discovery(isolated_registry, tmp_path, monkeypatch):
    """An installed distribution (a dist-info folder on the path) declares two backends: one
    that keeps the contract is found and used, one that breaks it is refused by name."""
    (tmp_path / "plugin_backend_mod.py").write_text(
        "from bnnsfw.backends import NumpyBackend\n"
        "class PluginBackend(NumpyBackend):\n    name = 'plugin'\n"
        "class BrokenBackend:\n    name = 'broken'\n"
    )
    dist = tmp_path / "bnnsfw_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bnnsfw-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[bnnsfw.backends]\nplugin = plugin_backend_mod:PluginBackend\n"
        "broken = plugin_backend_mod:BrokenBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "_entry_points_loaded", False)
    assert {"plugin", "broken"} <= set(bf.available_backends())
    assert bf.get_backend("plugin").name == "plugin"
    with bf.use_backend("plugin"):
        layer = bf.LSTMLayer(bf.LSTMParameters.random(input_size=2, hidden_size=3, seed=0))
    assert layer.backend.name == "plugin"
    layer.apply(np.ones((2, 1, 2), np.float32))
    with pytest.raises(bf.BackendError,
                       match=r"backend 'broken' must implement the backend contract.*missing gemm"):
        bf.get_backend("broken")
    monkeypatch.delitem(sys.modules, "plugin_backend_mod", raising=False)


AUTO = backends._auto()


def test_use_backend_nests_and_restores():
    assert bf.current_backend().name == AUTO
    with bf.use_backend("numpy") as outer:
        assert outer.name == "numpy" and bf.current_backend() is outer
        with bf.use_backend("scipy-blas"):
            assert bf.current_backend().name == "scipy-blas"
        assert bf.current_backend().name == "numpy"
    assert bf.current_backend().name == AUTO


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
    assert seen == {"worker": "numpy", "main": AUTO}


def test_backend_object_is_accepted_directly():
    backend = CountingBackend()
    assert bf.get_backend(backend) is backend
    with pytest.raises(bf.InvalidParameterError, match="backend must implement the backend contract"):
        bf.get_backend(42)


@functools.cache
def _fresh(kernel):
    """``kernel`` with its own options but without the disk cache (whose code cannot be
    inspected): it compiles anew, once per process for each signature, the tests that read the
    same signature's assembly sharing the compilation."""
    import numba

    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
    return numba.njit(**options)(kernel.py_func)


def _fresh_asm(kernel, *args) -> str:
    """The assembly of ``kernel`` compiled anew (:func:`_fresh`) for ``args``, after calling it
    with them."""
    fresh = _fresh(kernel)
    fresh(*args)
    return fresh.inspect_asm(tuple(fresh.typeof_pyval(a) for a in args))


def _forward_step_asm(block: np.ndarray) -> str:
    """The assembly of a shared-out forward step (``_forward_part``) compiled anew, in float32,
    for one piece of all ``H = block.shape[0] // 6`` units of ``block.shape[1]`` sequences
    (random weights, projection and state; no packed rows, no lengths; a training step, its
    gate rows written into ``block``)."""
    from bnnsfw.backends.numba import _lstm_forward, _tiles

    h, batch, f32 = block.shape[0] // 6, block.shape[1], np.float32
    rng = np.random.default_rng(0)
    return _fresh_asm(_lstm_forward._forward_part, 0, h, rng.standard_normal((4 * h, h)).astype(f32),
                      np.empty((4, 0, 0, _tiles.PACK_ROWS), f32),
                      rng.standard_normal((4 * h, 2 * batch)).astype(f32), 0, batch,
                      np.zeros((4, h * batch), f32), block, rng.standard_normal((h, batch)).astype(f32),
                      np.zeros((h, batch), f32), np.zeros((h, batch), f32), np.zeros((batch, h), f32),
                      np.empty(0, np.int64), 0, True, False, np.zeros((1, 1), f32),
                      np.zeros((0, 0), f32), np.zeros((0, 0), f32), np.zeros((0, 0), f32), -1)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_kernel_loops_take_the_wide_vectors():
    """The loops LLVM vectorizes by itself (the fused LSTM passes, the normalization passes) use
    vectors of ``WIDE_BYTES`` (64 bytes where the kernels are compiled for AVX-512; LLVM's own
    tuning for those machines stops at 32): in the assembly of the LSTM's backward pass, of
    the layer norm's forward pass and of the batch norm's backward, packed arithmetic on 64-byte
    registers (``zmm``) outnumbers that on 32-byte ones (``ymm``); in the forward pass (whose
    products may be inlined from the tile, which takes 64-byte vectors anyway) the gates'
    divisions (the rational tanh's) are on 64-byte registers, none on 32-byte ones.

    The widths are the vectorizer's choice under LLVM's tuning for the CPU it compiles for; an
    LLVM that does not know the processor compiles for "generic", whose cost model keeps most
    of these loops scalar whatever the preferred width (Numba 0.59's LLVM 14 on an AMD Zen 5:
    24 scalar operations in the backward pass, 5 on 32-byte registers and 2 on 64-byte ones),
    so the test needs a named CPU."""
    import re

    import llvmlite.binding
    from numba.core import config

    from bnnsfw.backends.numba import _lstm_backward
    from bnnsfw.backends.numba import _normalization as _numba_normalization
    from bnnsfw.backends.numba import _tiles as _numba_tiles

    if _numba_tiles.WIDE_BYTES != 64:
        pytest.skip("the kernels are not compiled for AVX-512 here")
    if (config.CPU_NAME or llvmlite.binding.get_host_cpu_name()) == "generic":
        pytest.skip("LLVM compiles for a generic CPU here: its cost model chooses the vector widths")
    arithmetic = re.compile(r"^\s+v(?:fn?m(?:add|sub)\w*|mul|add|sub)p[sd]\s[^\n]*%([yz]mm)", re.M)
    divisions = re.compile(r"^\s+v(?:div|rcp\w*)ps\s[^\n]*%([xyz]mm)", re.M)

    def wide(asm: str) -> bool:
        registers = arithmetic.findall(asm)
        return registers.count("zmm") > registers.count("ymm")

    rng = np.random.default_rng(0)
    h, batch, f32 = 32, 16, np.float32

    def arrays(*shape):
        return rng.standard_normal(shape).astype(f32)

    no_lengths = np.empty(0, np.int64)
    forward = _forward_step_asm(np.zeros((6 * h, batch), f32))
    registers = divisions.findall(forward)
    assert "ymm" not in registers, registers
    if registers:  # an LLVM may leave this pass scalar (Numba 0.59's did)
        assert "zmm" in registers, registers
    backward = _fresh_asm(_lstm_backward._backward_part, 0, h, arrays(6 * h, batch), arrays(2, batch, h), 0,
                          no_lengths, np.zeros((4, h * batch), f32), np.zeros((h, batch), f32),
                          np.zeros((h, batch), f32), np.zeros((h, batch), f32), np.zeros((4 * h, batch), f32),
                          np.zeros((4 * h, 2 * batch), f32), 0)
    assert wide(backward)
    x = arrays(8, 256)
    layer_norm = _fresh_asm(_numba_normalization._flat_forward, x, np.ones(256, f32), np.zeros(256, f32),
                            1e-5, np.empty_like(x), np.empty(8), np.empty(8), 1e30, np.zeros(8, np.bool_),
                            2, False)
    assert wide(layer_norm)
    x3 = arrays(4, 2, 128)
    batch_norm = _fresh_asm(_numba_normalization._channel_backward, x3, arrays(4, 2, 128), np.ones(2, f32),
                            1e-5, np.empty_like(x3), np.empty(2), np.empty(2), 1e30, np.zeros(2, np.bool_))
    assert wide(batch_norm)


@pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")
def test_numba_prefetch_asks_without_reading():
    """``prefetch`` compiles to the processor's prefetch hint on x86-64 (``prefetcht1``) and
    changes nothing a kernel computes; a shared-out forward step (``_forward_part``) asks for
    the next step's projection columns with it."""
    import platform

    import numba

    from bnnsfw.backends.numba._stream import prefetch

    @numba.njit
    def asked_sum(a, step):
        total = 0.0
        for i in range(0, a.size, step):
            prefetch(a, i)
            total += a[i]
        return total

    a = np.arange(1000, dtype=np.float32)
    assert asked_sum(a, 16) == pytest.approx(sum(range(0, 1000, 16)), rel=1e-12, abs=0)
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the hint's instruction is named here for x86-64 only")
    assert "prefetcht1" in asked_sum.inspect_asm(asked_sum.signatures[0])
    assert "prefetcht1" in _forward_step_asm(np.zeros((6 * 32, 16), np.float32))


# ------------------------------------------------------------------------------------------
# The optional prepared forward: the kit compares it with the backend's own lstm_forward.
# ------------------------------------------------------------------------------------------
def test_the_kit_compares_each_built_in_prepared_forward_with_the_unprepared_one(backend_name):
    compare = _Comparison(None, None)
    for case in _prepared_cases(quick=True):
        _check_prepared_lstm(compare, bf.backends.get_backend(backend_name), case)
    assert compare.failures == [] and compare.compared > 50


class LeaksTheFirstCall(bf.backends.NumpyBackend):
    """A prepared forward that keeps the first call's output: the second gets it again."""

    name = "leaks"

    def lstm_prepare_forward(self, request):
        inner = super().lstm_prepare_forward(request)
        if inner is None:
            return None
        kept = []

        def call(x, hidden, cell, output, *rest):
            inner(x, hidden, cell, output, *rest)
            if kept:
                output[...] = kept[0]
            kept.append(output.copy())

        return call


def test_the_kit_catches_a_prepared_forward_that_keeps_a_call_s_values():
    compare = _Comparison(None, None)
    for case in _prepared_cases(quick=True):
        _check_prepared_lstm(compare, LeaksTheFirstCall(), case)
    assert compare.failures and all("call 2: output differs" in f for f in compare.failures)

"""The compile modes of the numba backend: calls served by the kernels that need no compiler
while the compiled ones are built by a separate process, and the switch between calls."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import attrs
import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.backends._shared import compiling
from bnnsfw.backends.contract import TOLERANCE

pytestmark = pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")

WAIT_SECONDS = 900  # a cold compile of a small model on a busy 2-core machine takes a minute or two


@pytest.fixture
def tiers(monkeypatch, tmp_path):
    """The ``_tiers`` module in ``background`` mode, its markers in a fresh folder."""
    from bnnsfw.backends.numba import _tiers

    monkeypatch.setattr(_tiers, "ready_folder", lambda: tmp_path / "ready")
    monkeypatch.setattr(compiling, "_mode", "background")
    monkeypatch.setattr(bf.backends.get_backend("numba"), "_tiers", _tiers.Tiers())  # nothing ready yet
    return _tiers


@pytest.fixture
def compiled_calls(monkeypatch):
    """The names of the compiled entry points called so far (LSTM forward and backward,
    normalization forward and backward)."""
    from bnnsfw.backends.numba import _lstm, _normalization

    calls: list[str] = []
    for module, prefix in ((_lstm, "lstm"), (_normalization, "norm")):
        for name in ("forward", "backward"):
            original = getattr(module, name)

            def spy(*args, _original=original, _name=f"{prefix}_{name}", **kwargs):
                calls.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(module, name, spy)
    return calls


def _wait_for(backend) -> None:
    start = time.monotonic()
    while backend._tiers.poll():
        assert time.monotonic() - start < WAIT_SECONDS, "the background compile did not finish"
        time.sleep(0.2)


def _close(a, b, dtype) -> None:
    rtol, atol = TOLERANCE[np.dtype(dtype)]
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_the_mode_comes_from_the_environment_or_from_python(monkeypatch):
    from bnnsfw.backends import compile_mode, set_compile_mode

    monkeypatch.setattr(compiling, "_mode", None)
    monkeypatch.setenv("BNNSFW_COMPILE", "off")
    assert compile_mode() == "off"
    monkeypatch.delenv("BNNSFW_COMPILE")
    assert compile_mode() == "background"
    set_compile_mode("wait")
    assert compile_mode() == "wait"
    set_compile_mode(None)
    monkeypatch.setenv("BNNSFW_COMPILE", "sometimes")
    with pytest.raises(bf.InvalidParameterError, match="BNNSFW_COMPILE.*background, wait, off.*sometimes"):
        compile_mode()
    with pytest.raises(bf.InvalidParameterError, match=r"set_compile_mode\(mode\).*'never'"):
        set_compile_mode("never")


def _requests(monkeypatch, x, lengths=None):
    """The requests a two-layer LSTM's training forward and backward hand the numba backend."""
    from bnnsfw.backends.numba import _tiers

    seen = {}
    original = _tiers.Tiers.decide

    def spy(self, operation, request):
        seen[operation] = request
        return original(self, operation, request)

    monkeypatch.setattr(_tiers.Tiers, "decide", spy)
    monkeypatch.setattr(compiling, "_mode", "off")
    params = bf.LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, seed=0, dtype=x.dtype)
    layer = bf.LSTMLayer(params, bf.FilterParameters(backend="numba"))
    out = layer.apply(x, training=True, sequence_lengths=lengths)
    layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache,
                         sequence_lengths=lengths)
    return seen


def _arrays(value, path="request"):
    """Every array inside ``value`` with where it is."""
    if isinstance(value, np.ndarray):
        yield path, value
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _arrays(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _arrays(item, f"{path}[{key!r}]")
    elif attrs.has(type(value)):
        for field in attrs.fields(type(value)):
            yield from _arrays(getattr(value, field.name), f"{path}.{field.name}")
    elif hasattr(value, "_fields"):
        for name in value._fields:
            yield from _arrays(getattr(value, name), f"{path}.{name}")


def test_a_job_replays_the_call_with_the_same_kinds_of_array_on_zeros(monkeypatch):
    """A job carries every array as its shape, dtype, layout and write flag (read-only ones
    stay read-only); integer arrays keep their values (sequence lengths), the others are zeros;
    the workspace is a fresh one."""
    from numba import typeof

    from bnnsfw.backends.numba import _tiers

    x = np.random.default_rng(0).standard_normal((4, 3, 3)).astype(np.float32)
    x.setflags(write=False)
    lengths = np.array([4, 2, 3], np.int32)
    seen = _requests(monkeypatch, x, lengths)
    assert set(seen) == {"lstm_forward", "lstm_backward"}
    for operation, request in seen.items():
        again_operation, again = pickle.loads(_tiers.job_bytes(operation, request))
        assert again_operation == operation
        before, after = dict(_arrays(request)), dict(_arrays(again))
        assert before.keys() == after.keys() and len(before) > 10
        for path, a in before.items():
            b = after[path]
            assert typeof(a) == typeof(b), path
            assert b.flags.writeable == a.flags.writeable, path
            if a.dtype.kind in "iu" and a.dtype != np.uint8:
                np.testing.assert_array_equal(a, b, err_msg=path)
            else:
                assert not b.any(), path
        np.testing.assert_array_equal(again.sequence_lengths, lengths)
        assert isinstance(again.workspace, _tiers._Workspace)
        assert _tiers.kind_of(operation, again) == _tiers.kind_of(operation, request)


def test_a_forward_job_also_runs_the_forward_a_layer_prepares_for_its_kind(monkeypatch, tmp_path):
    """A layer runs the second and later calls of a kind through the forward it prepared
    (``lstm_prepare_forward``), whose compiled path may take other kinds of argument: the job
    runs that too, so that the switch finds its kernels on disk."""
    from bnnsfw.backends.numba import NumbaBackend, _tiers

    x = np.random.default_rng(0).standard_normal((4, 3, 3)).astype(np.float32)
    request = _requests(monkeypatch, x)["lstm_forward"]
    ran: list[bool] = []
    original = NumbaBackend.lstm_prepare_forward

    def spy(self, req):
        call = original(self, req)

        def counted(*args):
            ran.append(True)
            return call(*args)

        return None if call is None else counted

    monkeypatch.setattr(NumbaBackend, "lstm_prepare_forward", spy)
    job = tmp_path / "job.pickle"
    marker = tmp_path / ("0" * 32)
    job.write_bytes(pickle.dumps((str(marker), 1, _tiers.job_bytes("lstm_forward", request))))
    assert _tiers.run_jobs(NumbaBackend(), [job]) == 0
    assert ran == [True] and marker.exists() and not job.exists()


@pytest.mark.parametrize("writeable", [True, False])
@pytest.mark.parametrize("layout", ["C", "F", "A"])
def test_the_arrays_of_a_job_keep_their_layout_and_write_flag(layout, writeable):
    from numba import typeof

    from bnnsfw.backends.numba import _tiers

    base = np.arange(24.0).reshape(2, 3, 4)
    a = {"C": base, "F": np.asfortranarray(base), "A": base[:, ::2, ::3]}[layout]
    a.setflags(write=writeable)
    again = pickle.loads(_tiers.job_bytes("x", a))[1]
    assert typeof(again) == typeof(a) and again.shape == a.shape and not again.any()
    assert again.flags.writeable == writeable


def test_calls_run_without_the_compiler_until_the_background_compile_is_done(tiers, compiled_calls, rng):
    """Cold, an LSTM's training forward and backward run on scipy-blas's kernels and the
    compile goes to another process; once it is done, the next calls run compiled, and the
    training cache written before the switch is consumed by a backward after it, with the
    same results within the contract's tolerance. A layer norm switches the same way."""
    dtype = np.float32
    params = bf.LSTMParameters.random(input_size=3, hidden_size=6, num_layers=2, seed=1, dtype=dtype)
    layer = bf.LSTMLayer(params, bf.FilterParameters(backend="numba"))
    norm = bf.NormalizationLayer(bf.NormalizationParameters(type=bf.NormalizationType.layer(),
                                                            input_shape=(6,), dtype=dtype),
                                 bf.FilterParameters(backend="numba"))
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    dy = rng.standard_normal((5, 4, 6)).astype(np.float32)
    started = time.monotonic()
    out = layer.apply(x, training=True)
    before = layer.apply_backward(x, dy, training_cache=out.training_cache)
    normed = norm.apply(out.output[-1])
    norm_before = norm.apply_backward(out.output[-1], np.ones_like(normed), output=normed)
    assert time.monotonic() - started < 5.0  # nothing waited for the compiler
    assert compiled_calls == []
    assert layer.backend is norm.backend and layer.backend.name == "numba"

    _wait_for(layer.backend)
    folder = tiers.ready_folder()
    assert len([p for p in folder.iterdir() if len(p.name) == 32]) == 4, sorted(folder.iterdir())

    after = layer.apply_backward(x, dy, training_cache=out.training_cache)  # the cache from before
    assert compiled_calls == ["lstm_backward"] * 2  # one per layer
    for name, grad in before.parameters().items():
        _close(after.parameters()[name], grad, dtype)
    _close(after.input, before.input, dtype)
    again = layer.apply(x, training=True)
    assert "lstm_forward" in compiled_calls
    _close(again.output, out.output, dtype)
    normed_again = norm.apply(out.output[-1])
    norm_after = norm.apply_backward(out.output[-1], np.ones_like(normed_again), output=normed_again)
    assert {"norm_forward", "norm_backward"} <= set(compiled_calls)
    _close(normed_again, normed, dtype)
    _close(norm_after.input, norm_before.input, dtype)


def test_off_never_compiles(tiers, compiled_calls, monkeypatch, rng):
    monkeypatch.setattr(compiling, "_mode", "off")
    params = bf.LSTMParameters.random(input_size=2, hidden_size=3, seed=2, dtype=np.float32)
    layer = bf.LSTMLayer(params, bf.FilterParameters(backend="numba"))
    reference = bf.LSTMLayer(params, bf.FilterParameters(backend="numpy"))
    x = rng.standard_normal((3, 2, 2)).astype(np.float32)
    _close(layer.apply(x).output, reference.apply(x).output, np.float32)
    assert compiled_calls == [] and not layer.backend._tiers.poll()
    assert not tiers.ready_folder().exists()


def test_float64_runs_scipy_blas_kernels_and_sends_nothing_to_compile(tiers, compiled_calls, monkeypatch,
                                                                      rng):
    """The compiled kernels serve float32 only: in every mode an LSTM's float64 inference
    (the second one prepared), training forward and backward, the same for a cell with another
    activation (``_cells``' kernels otherwise), and a layer norm's forward and backward run
    ``scipy-blas``'s kernels, agree with that backend and send nothing to compile."""
    from bnnsfw.backends.numba import _cells

    def refused(*args, **kwargs):
        raise AssertionError("a compiled per-sequence kernel ran in float64")

    monkeypatch.setattr(_cells, "forward_sequence", refused)
    monkeypatch.setattr(_cells, "backward_sequence", refused)
    default = bf.LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, seed=2, dtype=np.float64)
    relu = attrs.evolve(default, hidden_activation=bf.Activation(bf.ActivationFunction.relu))
    norm = bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(5,), dtype=np.float64)
    x, dy = rng.standard_normal((4, 3, 3)), rng.standard_normal((4, 3, 5))
    results = {}
    for backend in ("scipy-blas", "numba"):
        for mode in ("background", "wait", "off"):
            monkeypatch.setattr(compiling, "_mode", mode)
            got = []
            for lstm in (default, relu):
                with bf.LSTMLayer(lstm, bf.FilterParameters(backend=backend)) as layer:
                    got += [layer.apply(x).output for _ in range(2)]
                    out = layer.apply(x, training=True)
                    grads = layer.apply_backward(x, dy, training_cache=out.training_cache)
                    got += [out.output, grads.input, *grads.parameters().values()]
            with bf.NormalizationLayer(norm, bf.FilterParameters(backend=backend)) as normalization:
                normed = normalization.apply(out.output, training=True)
                got += [normed, normalization.apply_backward(out.output, dy, output=normed).input]
            results[backend, mode] = got
    for key, got in results.items():
        for a, b in zip(got, results["scipy-blas", "background"], strict=True):
            _close(a, b, np.float64)
    assert compiled_calls == [] and not bf.backends.get_backend("numba")._tiers.poll()
    assert not tiers.ready_folder().exists()


def test_a_frozen_application_compiles_in_its_own_process(tiers, compiled_calls, monkeypatch, rng):
    """Where ``sys.executable`` is the application itself, no interpreter can be started to
    compile: ``background`` compiles in the process, as ``wait`` does."""
    monkeypatch.setattr(tiers, "_FROZEN", True)
    params = bf.LSTMParameters.random(input_size=2, hidden_size=3, seed=2, dtype=np.float32)
    layer = bf.LSTMLayer(params, bf.FilterParameters(backend="numba"))
    layer.apply(rng.standard_normal((3, 2, 2)).astype(np.float32))
    assert compiled_calls == ["lstm_forward"] and not layer.backend._tiers.poll()


def test_a_job_that_fails_leaves_the_reason(tmp_path):
    """The worker records why a replay failed, for the process that asked, which then keeps
    to the kernels that need no compiler."""
    from bnnsfw.backends.numba import NumbaBackend, _tiers

    job = tmp_path / "job.pickle"
    marker = tmp_path / ("0" * 32)
    with open(job, "wb") as fh:
        pickle.dump((str(marker), 1, pickle.dumps(("lstm_forward", "not a request"))), fh)
    try:
        assert _tiers.run_jobs(NumbaBackend(), [job]) == 1
    finally:
        _tiers.set_compile_mode(None)
    assert not marker.exists() and not job.exists()
    assert "AttributeError" in marker.with_name(marker.name + ".failed").read_text()


_SHORT_SCRIPT = """
import sys
from pathlib import Path
import numpy as np
import bnnsfw as bf
from bnnsfw.backends.numba import _tiers
_tiers.ready_folder = lambda: Path(sys.argv[1])
params = bf.LSTMParameters.random(input_size=2, hidden_size=4, seed=3, dtype=np.float32)
layer = bf.LSTMLayer(params, bf.FilterParameters(backend="numba"))
layer.apply(np.ones((3, 2, 2), np.float32))
layer.apply(np.ones((3, 5, 2), np.float32))  # another kind of call, while the first one compiles
tiers = layer.backend._tiers
print(len(tiers._running), len(tiers._queued))
"""


def test_a_short_script_leaves_the_compile_running_after_it_exits(tmp_path):
    """The compiling process outlives the script that started it, and the kinds of call still
    waiting for it when the script exits get a compiling process of their own: the next script
    finds every kind ready."""
    folder = tmp_path / "ready"
    env = dict(os.environ, BNNSFW_COMPILE="background")
    done = subprocess.run([sys.executable, "-c", _SHORT_SCRIPT, str(folder)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]  # one kind sent to the compiling process, one waiting
    start = time.monotonic()
    while len([p for p in folder.glob("*") if len(p.name) == 32]) < 2:
        assert time.monotonic() - start < WAIT_SECONDS, sorted(folder.glob("*"))
        time.sleep(0.5)
    assert not list(folder.glob("*.failed"))


_SAME_CALLS = """
import sys, time
import numpy as np
import bnnsfw as bf
from bnnsfw.backends import set_compile_mode
from bnnsfw.backends.numba import _cells, _lstm_backward, _lstm_cell, _lstm_forward, _normalization, _tiles
set_compile_mode("background")
model = bf.Sequential(
    bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=7, num_layers=2, seed=5,
                                          dtype=np.float32), bf.FilterParameters(backend="numba")),
    bf.LastStep(),
    bf.NormalizationLayer(bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(7,),
                                                     dtype=np.float32), bf.FilterParameters(backend="numba")),
)
x = np.random.default_rng(0).standard_normal((4, 3, 3)).astype(np.float32)
for _ in range(2):  # the second call of each kind runs the forward the layer prepared for it
    model.apply_backward(np.ones((3, 7), np.float32) * model.apply(x, training=True))
    model(x)
backend = bf.get_backend("numba")
if sys.argv[1] == "first":
    while backend.compile_status().pending:
        time.sleep(0.1)
else:
    modules = (_cells, _lstm_cell, _lstm_forward, _lstm_backward, _normalization, _tiles)
    dispatchers = {getattr(m, name) for m in modules for name in dir(m) if hasattr(getattr(m, name), "stats")}
    misses = sum(sum(d.stats.cache_misses.values()) for d in dispatchers)
    hits = sum(sum(d.stats.cache_hits.values()) for d in dispatchers)
    print(misses, hits, backend.compile_status().pending)
"""


def test_after_the_background_compile_a_fresh_process_runs_compiled_without_compiling():
    """Once the compiling process has replayed a program's calls, the same program in a fresh
    process runs them compiled from the first call, loading every kernel from disk: no Numba
    cache miss (nothing compiled in that process), some hits, nothing sent to compile."""
    env = dict(os.environ, BNNSFW_COMPILE="background")
    for which in ("first", "again"):
        done = subprocess.run([sys.executable, "-c", _SAME_CALLS, which], capture_output=True, text=True,
                              timeout=WAIT_SECONDS, env=env)
        assert done.returncode == 0, done.stderr
    misses, hits, pending = done.stdout.split()
    assert (int(misses), pending) == (0, "False") and int(hits) > 0, done.stdout


class _Compiling:
    """A background compile that never ends (what :meth:`Tiers.poll` sees of a running one)."""

    returncode = None

    def poll(self):
        return None


def test_uncompiled_calls_keep_blas_off_the_core_a_background_compile_takes(tiers, compiled_calls,
                                                                            monkeypatch, rng):
    """While this process's background compile runs, every BLAS product of an uncompiled LSTM
    call (training forward and backward, inference twice, the second one prepared) runs on
    one thread fewer than the process's cores, at least one; with no compile under way, BLAS
    keeps its own threads."""
    from bnnsfw._threadpool import current_limit
    from bnnsfw.backends.numba import NumbaBackend

    limits: list[int] = []
    original = NumbaBackend._gemm

    def spy(self, *args, **kwargs):
        limits.append(current_limit())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(NumbaBackend, "_gemm", spy)
    backend = bf.backends.get_backend("numba")
    monkeypatch.setattr(backend._tiers, "_start", lambda: None)  # the jobs stay queued: no worker
    params = bf.LSTMParameters.random(input_size=3, hidden_size=5, num_layers=2, seed=4, dtype=np.float32)
    layer = bf.LSTMLayer(params, bf.FilterParameters(backend="numba"))
    x = rng.standard_normal((4, 3, 3)).astype(np.float32)

    def calls() -> None:
        out = layer.apply(x, training=True)
        dy = rng.standard_normal(out.output.shape).astype(np.float32)
        layer.apply_backward(x, dy, training_cache=out.training_cache)
        layer.apply(x)
        layer.apply(x)

    calls()
    assert limits and set(limits) == {0}  # no compile under way: BLAS as it was
    limits.clear()
    monkeypatch.setattr(backend._tiers, "_worker", _Compiling())
    calls()
    assert compiled_calls == []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert limits and set(limits) == {max(1, cores - 1)}
    assert current_limit() == 0  # given back after each call

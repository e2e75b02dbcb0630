"""Smoke test of the benchmark command (figures are printed, never asserted)."""

import argparse
import builtins
import json
import os

import attrs
import numpy as np
import pytest

from bnnsfw.cli import bench


def test_quick_bench_prints_every_row_and_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    for case in bench.LSTM_CASES:
        assert f"lstm {case.name} " in out
    for case in bench.STREAM_CASES:
        assert f"lstm step {case.name} " in out
    for case in bench.NORMALIZATION_CASES:
        assert f"norm {case.name} " in out
    figures = json.loads(path.read_text())
    fresh = sum(case.fresh for case in bench.LSTM_CASES)
    assert fresh == 1
    assert len(figures["rows"]) == (2 * len(bench.LSTM_CASES) + fresh + len(bench.STREAM_CASES)
                                    + len(bench.NORMALIZATION_CASES))
    assert all(row["median_ms"] > 0 for row in figures["rows"])
    assert figures["openblas_coretype"] == os.environ.get("OPENBLAS_CORETYPE")
    assert out.splitlines()[1] == bench.describe_blas(figures["blas"], figures["openblas_coretype"])


def test_compare_without_torch_and_onnxruntime_says_so_and_carries_on(monkeypatch, capsys):
    real_import = builtins.__import__

    def missing(name, *args, **kwargs):
        if name.split(".")[0] in ("torch", "onnxruntime"):
            raise ImportError(f"no {name} here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", missing)
    assert bench.main(["--quick", "--compare", "torch,onnxruntime", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "--compare torch: PyTorch is not installed; carrying on without it" in out
    assert "--compare onnxruntime: ONNX Runtime is not installed; carrying on without it" in out
    assert "lstm XL" in out and "lstm step I32 H64 2L" in out
    assert "torch ms" not in out and "ORT ms" not in out


def test_the_compare_option_takes_one_library_or_several(capsys):
    parse = bench.parser().parse_args
    assert parse(["--compare", "onnxruntime"]).compare == ("onnxruntime",)
    assert parse(["--compare", "torch,onnxruntime"]).compare == ("torch", "onnxruntime")
    assert parse([]).compare is None
    for wrong in ("tensorflow", "torch,ort", ""):
        with pytest.raises(SystemExit) as exc:
            parse(["--compare", wrong])
        assert exc.value.code == 2
        expected = f"must be torch, onnxruntime or several separated by commas; got {wrong!r}"
        assert f"argument --compare: {expected}" in capsys.readouterr().err


def test_a_library_that_computes_something_else_is_not_timed(monkeypatch, capsys):
    ours = np.array([[1.0, -2.0], [0.5, 0.0]], np.float32)
    bench._check_agreement("lstm X", "ONNX Runtime", ours * (1 + 5e-4) + 5e-5, ours)  # within tolerance
    with pytest.raises(bench.ComparisonMismatch, match=r"lstm X: ONNX Runtime's output differs from "
                                                       r"bnnsfw's by up to 0\.01 \(allowed"):
        bench._check_agreement("lstm X", "ONNX Runtime", ours + [[0, 0], [0, 0.01]], ours)

    def mismatch(opts):
        raise bench.ComparisonMismatch("lstm S: PyTorch's output differs")

    monkeypatch.setattr(bench, "run", mismatch)
    assert bench.main(["--quick"]) == 1
    assert capsys.readouterr().err == "bnnsfw bench: error: lstm S: PyTorch's output differs\n"


def test_onnxruntime_compares_the_inference_rows_and_a_streaming_step(monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    monkeypatch.setattr(bench, "BLOCK_LEAD_IN_S", 0.0)  # one untimed call opens each block
    opts = argparse.Namespace(backend="numpy", threads=1, repeats=2, budget=0.0, quick=True)
    peers = bench.Peers(ort=ort)
    case = bench.LSTMCase(name="tiny", seq_len=3, batch=2, input_size=3, hidden_size=4, num_layers=2,
                          fresh=True)
    forward, fresh, train = bench._bench_lstm(case, opts, 1.0, peers)
    step = bench._bench_stream(attrs.evolve(case, seq_len=1, batch=1), opts, 1.0, peers)
    for row in (forward, step):
        assert row.ort_median_ms > 0 and row.ort_ratio == row.median_ms / row.ort_median_ms
        assert row.ort_round_ratios[0] <= row.ort_round_ratios[1] <= row.ort_round_ratios[2]
    assert (fresh.work, fresh.ort_ratio, train.ort_ratio) == ("fwd, fresh", None, None)
    table = bench.format_table([forward, train], with_torch=False, with_ort=True).splitlines()
    assert table[0].split()[-5:] == ["ORT", "ms", "ratio", "rounds", "q1-q3"]
    assert table[2].split()[-2] == f"{forward.ort_ratio:.2f}"
    assert table[3].split()[-1] == "—"


def test_a_comparison_gives_each_rounds_ratio_of_its_two_blocks(monkeypatch):
    # a fake clock: fn's calls take 3 units and other's 1, times the machine's speed in each
    # block; in round 3 the machine slows down between fn's block and other's
    now = [0.0]
    blocks = [0]
    speed = {1: 1.0, 2: 1.0, 3: 2.0, 4: 2.0, 5: 1.0, 6: 2.0, 7: 1.0, 8: 1.0}  # block → speed

    def make(cost):
        def f():
            now[0] += cost * speed.get(blocks[0], 1.0)
        return f

    def lead_in(f):
        blocks[0] += 1

    fn, other = make(3.0), make(1.0)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(bench, "_lead_in", lead_in)
    timing = bench._time(fn, warmup=0, repeats=4, budget=0.0, others=[other])
    # rounds' ratios 3, 3, 1.5, 3; fn's calls 3, 6, 3, 3 and other's 1, 2, 2, 1
    (peer,) = timing.peers
    assert peer.round_ratios == (2.625, 3.0, 3.0)
    assert (timing.median, peer.median, timing.minimum) == (3.0, 1.5, 3.0)
    assert bench._time(fn, warmup=0, repeats=2, budget=0.0).peers == ()
    assert bench._quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    assert bench._quartiles([0.9]) == (0.9, 0.9, 0.9)


def test_the_table_shows_the_rounds_spread_beside_the_ratio():
    row = bench.BenchRow(name="lstm X", work="fwd", backend="numba", median_ms=2.0, min_ms=1.5,
                         torch_median_ms=4.0, round_ratios=(0.45, 0.5, 0.56))
    table = bench.format_table([row], with_torch=True).splitlines()
    assert table[0].split()[-3:] == ["ratio", "rounds", "q1-q3"]
    assert table[2].split()[-2:] == ["0.50", "0.45-0.56"]
    assert row.as_dict()["round_ratios"] == (0.45, 0.5, 0.56)


def test_flop_count_formula():
    case = bench.LSTMCase(name="t", seq_len=2, batch=3, input_size=4, hidden_size=5, num_layers=2,
                          bidirectional=True)
    # layer 0: 2 directions · 8·T·N·H·(I+H); layer 1 reads 2H features
    assert case.flops() == 2 * 8 * 2 * 3 * 5 * (4 + 5) + 2 * 8 * 2 * 3 * 5 * (10 + 5)


def test_fresh_process_probes_measure_step_memory_and_first_call_latency():
    case = bench.LSTMCase(name="probe", seq_len=64, batch=4, input_size=8, hidden_size=16)
    figures = bench.peak_training_memory(case, "auto")
    cache = bench._lstm_layer(case, "auto", 0)[1].training_cache_capacity(batch_size=4, seq_len=64)
    inputs = 4 * (64 * 4 * 8 + 64 * 4 * 16)
    assert figures["cache_and_inputs_bytes"] == cache + inputs
    # the peak above the memory held before the step: 0 when the step's few arrays fit in pages
    # the process had freed already (loading the kernels frees many), as a run of the suite saw
    assert 0 <= figures["step_bytes"] < 1 << 30
    imported, first_step = bench.first_call_latency("auto", None)
    assert imported > 0 and first_step > 0


def test_the_switch_over_probe_times_each_training_step(tmp_path):
    """Timed in the ``off`` mode, which never compiles (nothing is left running)."""
    seen = bench.switch_over("numpy", str(tmp_path), mode="off", limit=60.0, after=3)
    assert seen.ready_after == 1 and len(seen.steps) == 4
    assert seen.longest == max(seen.steps) > 0 and seen.median(slice(1, None)) > 0


def test_the_blas_line_names_each_library_its_kernels_and_a_forced_core_type():
    libraries = [
        {"package": "scipy", "implementation": "openblas", "version": "0.3.30", "kernels": "Haswell"},
        {"package": "numpy", "implementation": "mkl", "version": "2025.1", "kernels": None},
    ]
    line = bench.describe_blas(libraries, None)
    assert line == "BLAS: openblas 0.3.30 from scipy (Haswell kernels), mkl 2025.1 from numpy"
    forced = bench.describe_blas(libraries, "Haswell")
    assert forced.startswith(line + "; OPENBLAS_CORETYPE=Haswell is set")
    assert bench.describe_blas([], None) == "BLAS: none found"


def test_the_blas_libraries_are_those_threadpoolctl_finds():
    from threadpoolctl import threadpool_info

    found = bench.blas_libraries()
    expected = [info for info in threadpool_info() if info["user_api"] == "blas"]
    # the shared controller scanned the process once; a library loaded since is not in it
    assert {lib["version"] for lib in found} <= {info["version"] for info in expected}
    assert found or not expected
    for lib in found:
        assert set(lib) == {"package", "implementation", "version", "kernels"}
        assert lib["package"] and not lib["package"].endswith(".libs")

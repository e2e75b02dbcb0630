"""Smoke test of the benchmark command (figures are printed, never asserted)."""

import builtins
import json
import os

from bnnsfw.cli import bench


def test_quick_bench_prints_every_row_and_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    for case in bench.LSTM_CASES:
        assert f"lstm {case.name} " in out
    for case in bench.NORMALIZATION_CASES:
        assert f"norm {case.name} " in out
    figures = json.loads(path.read_text())
    assert len(figures["rows"]) == 2 * len(bench.LSTM_CASES) + len(bench.NORMALIZATION_CASES)
    assert all(row["median_ms"] > 0 for row in figures["rows"])
    assert figures["openblas_coretype"] == os.environ.get("OPENBLAS_CORETYPE")
    assert out.splitlines()[1] == bench.describe_blas(figures["blas"], figures["openblas_coretype"])


def test_compare_without_torch_says_so_and_carries_on(monkeypatch, capsys):
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert bench.main(["--quick", "--compare", "torch", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "PyTorch is not installed; carrying on without it" in out
    assert "lstm XL" in out


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
    timing = bench._time(fn, warmup=0, repeats=4, budget=0.0, other=other)
    # rounds' ratios 3, 3, 1.5, 3; fn's calls 3, 6, 3, 3 and other's 1, 2, 2, 1
    assert timing.round_ratios == (2.625, 3.0, 3.0)
    assert (timing.median, timing.other_median, timing.minimum) == (3.0, 1.5, 3.0)
    assert bench._time(fn, warmup=0, repeats=2, budget=0.0).round_ratios is None
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
    assert figures["step_bytes"] > 0
    imported, first_step = bench.first_call_latency("auto", None)
    assert imported > 0 and first_step > 0


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

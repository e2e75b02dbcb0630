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

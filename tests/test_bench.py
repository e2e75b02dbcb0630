"""Smoke test of the benchmark command (figures are printed, never asserted)."""

import builtins
import json

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

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

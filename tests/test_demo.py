"""The main job: the demo model learns and beats both baselines; its command line."""

import io
import re
import sys

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.cli import demo


def test_task_is_deterministic_and_split_by_series():
    a, b = demo.make_sine_task(seed=3), demo.make_sine_task(seed=3)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.x_train.shape[0] == 32 and a.x_train.shape[2] == 1 and a.y_train.shape[1] == 8
    assert not np.array_equal(a.x_train, demo.make_sine_task(seed=4).x_train)


def test_baselines_by_hand():
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], np.float32)[:, None, None]
    np.testing.assert_array_equal(demo.repeat_last_baseline(x, 3), [[7, 7, 7]])
    np.testing.assert_allclose(demo.linear_fit_baseline(x, 3), [[8, 9, 10]], atol=1e-5)


def test_the_model_is_the_six_line_container():
    model = demo.build_model(input_size=1, hidden_size=4, output_size=2)
    assert list(model.layers) == ["lstm", "last", "norm", "head"]
    assert isinstance(model.layers["last"], bf.LastStep)
    model.close()


def test_default_demo_beats_both_baselines(capsys):
    """What the README's first command runs; errors are RMSE throughout."""
    assert demo.main(["--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "the model beats both baselines" in out
    assert re.search(r"epoch  30/30  train RMSE \d\.\d{4}  validation RMSE \d\.\d{4}", out)
    assert "validation RMSE over the 8-step horizon" in out
    assert not re.search(r"(?<!R)MSE|loss", out)          # one metric name, RMSE


def test_save_and_plot_options(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    result = demo.run_forecast(epochs=1, hidden=8, save=str(tmp_path / "w"), plot=str(tmp_path / "p.png"))
    out = capsys.readouterr().out
    assert f"weights saved to {tmp_path / 'w.safetensors'}" in out
    assert f"plot written to {tmp_path / 'p.png'}" in out
    model = bf.load_weights(tmp_path / "w")
    assert isinstance(model, bf.Sequential) and list(model.layers) == ["lstm", "last", "norm", "head"]
    task = demo.make_sine_task(seed=0)
    np.testing.assert_allclose(demo.rmse(model(task.x_val), task.y_val), result.model_rmse, rtol=1e-6)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(result.train_rmse) == len(result.validation_rmse) == 1


def test_same_seed_same_result():
    a = demo.run_forecast(epochs=1, hidden=8, out=io.StringIO())
    b = demo.run_forecast(epochs=1, hidden=8, out=io.StringIO())
    assert a.model_rmse == b.model_rmse


def test_digits_task_reports_a_baseline_and_a_verdict(capsys):
    pytest.importorskip("sklearn")
    result = demo.run_digits(epochs=2, hidden=16)
    out = capsys.readouterr().out
    assert result.model_accuracy > 0.5 and result.baseline_accuracy > 0.9
    assert f"logistic regression on the 64 pixels   {result.baseline_accuracy:.3f}" in out
    assert re.search(r"the model (beats|does NOT beat) the logistic-regression baseline", out)


# ------------------------------------------------------------------------------------------
# Misuse: a usage error (status 2), one line naming the option, before any work.
# ------------------------------------------------------------------------------------------
def _usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        demo.main(argv)
    captured = capsys.readouterr()
    assert exc.value.code == 2
    assert captured.out == ""                                # no work was done
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in captured.err
    return errors[0]


@pytest.mark.parametrize("argv, message", [
    (["--backend", "nope"], "argument --backend: invalid choice: 'nope' (choose from "),
    (["--seed", "-1"], "argument --seed: must be an integer >= 0; got -1"),
    (["--epochs", "0"], "argument --epochs: must be an integer >= 1; got 0"),
    (["--hidden", "many"], "argument --hidden: must be an integer >= 1; got 'many'"),
    (["--task", "speech"], "argument --task: invalid choice: 'speech' (choose from 'sine', 'digits')"),
    (["--task", "digits", "--plot", "p.png"], "argument --plot: goes with --task sine"),
])
def test_bad_options_are_usage_errors(argv, message, capsys):
    line = _usage_error(argv, capsys)
    assert message in line
    if "--backend" in argv:
        assert all(f"'{name}'" in line for name in [*bf.available_backends(), "auto"])


def test_output_paths_are_checked_before_the_work(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "folder"
    assert "argument --save: the folder" in _usage_error(["--save", str(missing / "w.npz")], capsys)
    (tmp_path / "w.safetensors").mkdir()
    assert "argument --save: " in _usage_error(["--save", str(tmp_path / "w")], capsys)   # a folder is there
    pytest.importorskip("matplotlib")                  # without it, --plot is refused for that first
    assert "does not exist" in _usage_error(["--plot", str(missing / "p.png")], capsys)
    (tmp_path / "p.png").mkdir()
    assert "is a folder; give a file name" in _usage_error(["--plot", str(tmp_path / "p.png")], capsys)
    line = _usage_error(["--plot", str(tmp_path / "p.graph")], capsys)
    assert "must end in an image format matplotlib" in line and ".png" in line


def test_the_plot_extra_is_checked_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # as if it were not installed
    line = _usage_error(["--plot", str(tmp_path / "p.png")], capsys)
    assert "argument --plot: needs matplotlib, which is not installed" in line


def test_progress_bars_only_on_a_terminal(capsys, monkeypatch):
    argv = ["--epochs", "1", "--hidden", "4"]
    demo.main(argv)                                             # stderr is not a terminal here
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    demo.main(argv)
    assert "epoch 1/1" in capsys.readouterr().err               # a tqdm bar
    demo.main([*argv, "--no-progress"])
    assert capsys.readouterr().err == ""

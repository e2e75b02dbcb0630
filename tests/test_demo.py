"""The main job: the demo model learns and beats both baselines."""

import io

import numpy as np
import pytest

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


def test_default_demo_beats_both_baselines(capsys):
    """What the README's first command runs (without progress bars)."""
    assert demo.main(["--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "the model beats both baselines" in out
    assert "epoch  30/30" in out


def test_save_and_plot_options(tmp_path, capsys):
    result = demo.run_forecast(epochs=1, hidden=8, save=str(tmp_path / "w.npz"), plot=str(tmp_path / "p.png"),
                               progress=False)
    out = capsys.readouterr().out
    assert (tmp_path / "w.npz").exists()
    from bnnsfw.serialization import load_weights

    layers = load_weights(tmp_path / "w.npz")
    assert set(layers) == {"lstm", "norm", "head"}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out
    else:
        assert (tmp_path / "p.png").stat().st_size > 0
    assert len(result.train_losses) == 1


def test_same_seed_same_result():
    a = demo.run_forecast(epochs=1, hidden=8, progress=False, out=io.StringIO())
    b = demo.run_forecast(epochs=1, hidden=8, progress=False, out=io.StringIO())
    assert a.model_rmse == b.model_rmse


def test_digits_task(capsys):
    pytest.importorskip("sklearn")
    accuracy = demo.run_digits(epochs=2, hidden=16, progress=False)
    assert accuracy is not None and accuracy > 0.5


def test_bad_options_exit_2():
    with pytest.raises(SystemExit) as exc:
        demo.main(["--epochs", "0"])
    assert exc.value.code == 2

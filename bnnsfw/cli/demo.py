"""``bnnsfw demo``: train a small sequence model with bnnsfw alone, and show that it learns.

The default task forecasts a noisy sum of sines: from a window of past values, predict the
next few. The model is a 2-layer LSTM, layer normalization of its last hidden state and a
fully connected head, trained with Adam on the mean squared error. Errors are reported as
RMSE (root mean squared error) throughout; at the end the model's validation RMSE is set
beside two baselines — repeating the last value, and extending a straight line fitted to
the last few values — which the model must beat.

``--task digits`` instead classifies scikit-learn's 8×8 digits, read row by row as a
sequence of 8 steps of 8 pixels, beside a logistic regression on the same 64 pixels (when
scikit-learn is installed).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
import warnings
from typing import Any, Iterator, Sequence

import attrs
import numpy as np

from ..filter import FilterParameters
from ..layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
from ..layers.lstm import LSTMLayer, LSTMParameters
from ..layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType
from ..losses import MeanSquaredError, SoftmaxCrossEntropy
from ..optimizers import Adam
from ..sequential import LastStep, Sequential
from ._options import backend_names, check_output_path, integer

__all__ = ["SineTask", "make_sine_task", "build_model", "run_forecast", "run_digits", "main"]


# ------------------------------------------------------------------ the data -----------


@attrs.frozen(kw_only=True)
class SineTask:
    """Windows cut from noisy multi-frequency sine series.

    ``x`` is ``(T, N, 1)`` (sequence first, as the LSTM takes it); ``y`` is ``(N, horizon)``,
    the observed next ``horizon`` values (noise included).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray


def _series(rng: np.random.Generator, length: int, noise: float) -> np.ndarray:
    t = np.arange(length, dtype=np.float64)
    components = rng.integers(2, 4)
    signal = np.zeros(length)
    for _ in range(components):
        period = rng.uniform(6.0, 40.0)
        signal += rng.uniform(0.3, 1.0) * np.sin(2 * math.pi * t / period + rng.uniform(0, 2 * math.pi))
    return signal + noise * rng.standard_normal(length)


def make_sine_task(*, n_series: int = 96, series_length: int = 160, window: int = 32, horizon: int = 8,
                   stride: int = 4, noise: float = 0.1, validation_fraction: float = 0.25,
                   seed: int = 0, dtype: Any = np.float32) -> SineTask:
    """Generate the forecasting task: whole series go to training or to validation."""
    rng = np.random.default_rng(seed)
    xs, ys, owners = [], [], []
    for s in range(n_series):
        series = _series(rng, series_length, noise)
        for start in range(0, series_length - window - horizon + 1, stride):
            xs.append(series[start:start + window])
            ys.append(series[start + window:start + window + horizon])
            owners.append(s)
    x, y, owner = np.array(xs), np.array(ys), np.array(owners)
    val = owner >= int(round(n_series * (1 - validation_fraction)))

    def seq(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.T[:, :, None], dtype=dtype)

    return SineTask(x_train=seq(x[~val]), y_train=y[~val].astype(dtype), x_val=seq(x[val]),
                    y_val=y[val].astype(dtype))


def repeat_last_baseline(x: np.ndarray, horizon: int) -> np.ndarray:
    """Predict every future value as the last observed one."""
    return np.repeat(x[-1, :, 0][:, None], horizon, axis=1)


def linear_fit_baseline(x: np.ndarray, horizon: int, points: int = 8) -> np.ndarray:
    """Extend the least-squares line through the last ``points`` observed values."""
    t = np.arange(points, dtype=np.float64)
    recent = x[-points:, :, 0].astype(np.float64)               # (points, N)
    slope, intercept = np.polyfit(t, recent, 1)
    future = np.arange(points, points + horizon, dtype=np.float64)
    return (intercept[:, None] + slope[:, None] * future[None, :]).astype(x.dtype)


def rmse(prediction: np.ndarray, target: np.ndarray) -> float:
    """Root mean squared error over every value."""
    return float(np.sqrt(np.mean((prediction.astype(np.float64) - target) ** 2)))


# ------------------------------------------------------------------ the model ----------


def build_model(*, input_size: int, hidden_size: int, output_size: int, num_layers: int = 2, seed: int = 0,
                backend: str | None = None, dtype: Any = np.float32) -> Sequential:
    """LSTM → its last step → layer normalization → fully connected head, as one container."""
    fp = FilterParameters(backend=backend)
    return Sequential({
        "lstm": LSTMLayer(LSTMParameters.random(input_size=input_size, hidden_size=hidden_size,
                                                num_layers=num_layers, seed=seed, dtype=dtype), fp),
        "last": LastStep(),
        "norm": NormalizationLayer(NormalizationParameters(type=NormalizationType.layer(),
                                                           input_shape=(hidden_size,), dtype=dtype), fp),
        "head": FullyConnectedLayer(FullyConnectedParameters.random(
            input_size=hidden_size, output_size=output_size, seed=seed + 1, dtype=dtype), fp),
    })


def _batches(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    order = rng.permutation(n)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


def _progress(iterable: Any, *, total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, unit="batch", file=sys.stderr)


@attrs.frozen(kw_only=True)
class ForecastResult:
    """What :func:`run_forecast` measured: RMSE per epoch, and at the end beside the baselines."""

    train_rmse: list[float]
    validation_rmse: list[float]
    model_rmse: float
    repeat_last_rmse: float
    linear_fit_rmse: float
    seconds: float

    @property
    def beats_baselines(self) -> bool:
        return self.model_rmse < min(self.repeat_last_rmse, self.linear_fit_rmse)


def _save(path: str, model: Sequential, out: Any) -> None:
    """Write the trained model where ``--save`` says, and say where it went."""
    from ..serialization import save_weights, weights_path

    save_weights(path, model)
    print(f"weights saved to {weights_path(path)} (bnnsfw.load_weights reads them back)", file=out)


def _compiling_note(layer: LSTMLayer, epoch: int) -> str:
    """After the first epoch, a word when the compiled kernels are still being built in the
    background (``docs/performance.md``: the compile modes)."""
    status = getattr(layer.backend, "compile_status", None)
    if epoch != 1 or status is None or not status().pending:
        return ""
    return "  (compiling the kernels in the background; scipy-blas's kernels run meanwhile)"


def run_forecast(*, epochs: int = 30, hidden: int = 32, batch_size: int = 64, learning_rate: float = 1e-2,
                 seed: int = 0, backend: str | None = None, save: str | None = None, plot: str | None = None,
                 progress: bool = False, out: Any = None) -> ForecastResult:
    """Train the forecaster and report its validation RMSE beside the baselines.

    The training loop is the one a user writes: forward in training mode, the loss, the
    container's backward, and one optimizer step by name. ``train RMSE`` per epoch is the
    root of the mean of the batches' mean squared errors while the epoch trained.
    """
    out = sys.stdout if out is None else out
    start = time.perf_counter()
    task = make_sine_task(seed=seed)
    horizon = task.y_train.shape[1]
    model = build_model(input_size=1, hidden_size=hidden, output_size=horizon, seed=seed, backend=backend)
    loss = MeanSquaredError()
    optimizer = Adam(learning_rate, clip_norm=1.0)
    rng = np.random.default_rng(seed)
    n_train = task.x_train.shape[1]
    lstm = model.layers["lstm"]
    assert isinstance(lstm, LSTMLayer)
    print(f"forecasting {horizon} steps from {task.x_train.shape[0]}: {n_train} training and "
          f"{task.x_val.shape[1]} validation windows; 2-layer LSTM ({hidden} hidden) -> layer norm -> "
          f"fully connected; backend {lstm.backend.name}", file=out)
    train_rmse, validation_rmse = [], []
    for epoch in range(1, epochs + 1):
        total, count = 0.0, 0
        batches = _batches(n_train, batch_size, rng)
        for idx in _progress(batches, total=math.ceil(n_train / batch_size), desc=f"epoch {epoch}/{epochs}",
                             enabled=progress):
            batch_loss = loss.apply(model.apply(task.x_train[:, idx], training=True), task.y_train[idx])
            optimizer.step(model.parameters(), model.apply_backward(batch_loss.gradient).parameters())
            total += batch_loss.loss * len(idx)
            count += len(idx)
        train_rmse.append(math.sqrt(total / count))
        validation_rmse.append(rmse(model(task.x_val), task.y_val))
        print(f"epoch {epoch:3d}/{epochs}  train RMSE {train_rmse[-1]:.4f}  validation RMSE "
              f"{validation_rmse[-1]:.4f}{_compiling_note(lstm, epoch)}", file=out)
    prediction = model(task.x_val)
    result = ForecastResult(
        train_rmse=train_rmse, validation_rmse=validation_rmse, model_rmse=rmse(prediction, task.y_val),
        repeat_last_rmse=rmse(repeat_last_baseline(task.x_val, horizon), task.y_val),
        linear_fit_rmse=rmse(linear_fit_baseline(task.x_val, horizon), task.y_val),
        seconds=time.perf_counter() - start)
    print(f"\nvalidation RMSE over the {horizon}-step horizon (lower is better):", file=out)
    print(f"  bnnsfw model          {result.model_rmse:.4f}", file=out)
    print(f"  repeat last value     {result.repeat_last_rmse:.4f}", file=out)
    print(f"  linear fit (last 8)   {result.linear_fit_rmse:.4f}", file=out)
    verdict = "beats both baselines" if result.beats_baselines else "does NOT beat both baselines"
    print(f"the model {verdict} ({result.seconds:.1f} s)", file=out)
    if save:
        _save(save, model, out)
    if plot:
        _plot(plot, result, task, prediction, epochs=epochs, hidden=hidden)
        print(f"plot written to {plot}", file=out)
    model.close()
    return result


def _plot(path: str, result: ForecastResult, task: SineTask, prediction: np.ndarray, *, epochs: int,
          hidden: int) -> None:
    """Learning curves against the baselines, and a typical validation window, in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizon, window = task.y_val.shape[1], task.x_val.shape[0]
    repeat = repeat_last_baseline(task.x_val, horizon)
    linear = linear_fit_baseline(task.x_val, horizon)
    labels = {"model": f"bnnsfw LSTM (RMSE {result.model_rmse:.3f})",
              "repeat": f"repeat last value (RMSE {result.repeat_last_rmse:.3f})",
              "linear": f"linear fit, last 8 (RMSE {result.linear_fit_rmse:.3f})"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    verdict = "beats both baselines" if result.beats_baselines else "does not beat both baselines"
    fig.suptitle(f"bnnsfw demo: a 2-layer LSTM ({hidden} hidden) forecasts {horizon} steps of a noisy sum "
                 f"of sines — {verdict}", fontsize=12)

    epoch_axis = np.arange(1, len(result.train_rmse) + 1)
    left.plot(epoch_axis, result.train_rmse, "o-", ms=3, label="model: training batches")
    left.plot(epoch_axis, result.validation_rmse, "o-", ms=3, label="model: validation")
    left.axhline(result.repeat_last_rmse, color="0.45", ls="--", label=f"validation, {labels['repeat']}")
    left.axhline(result.linear_fit_rmse, color="0.45", ls=":", label=f"validation, {labels['linear']}")
    highest = max(*result.train_rmse, *result.validation_rmse, result.repeat_last_rmse,
                  result.linear_fit_rmse)
    left.set_ylim(0.0, 1.6 * highest)  # room for the legend above every line
    left.set_title(f"RMSE per epoch ({epochs} epochs, Adam)")
    left.set_xlabel("epoch")
    left.set_ylabel("RMSE (lower is better)")
    left.legend(fontsize=8, loc="upper right", ncol=2)

    errors = np.sqrt(np.mean((prediction.astype(np.float64) - task.y_val) ** 2, axis=1))
    k = int(np.argsort(errors)[len(errors) // 2])          # the window of median error: a typical one
    past, future = np.arange(window), np.arange(window, window + horizon)
    right.plot(past, task.x_val[:, k, 0], color="0.55", label="input window")
    right.plot(future, task.y_val[k], "o-", color="k", label="what followed")
    right.plot(future, prediction[k], "s-", color="C1", label=labels["model"])
    right.plot(future, repeat[k], "--", color="0.45", label=labels["repeat"])
    right.plot(future, linear[k], ":", color="0.45", label=labels["linear"])
    right.axvline(window - 0.5, color="0.8", lw=1)
    right.set_title("a typical validation window (the model's median error)")
    right.set_xlabel("time step")
    right.set_ylabel("value")
    right.legend(fontsize=8, loc="best", title="RMSE over the whole validation set", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------ digits -------------


@attrs.frozen(kw_only=True)
class DigitsResult:
    """What :func:`run_digits` measured: test accuracies of the model and of the baseline."""

    model_accuracy: float
    baseline_accuracy: float

    @property
    def beats_baseline(self) -> bool:
        return self.model_accuracy > self.baseline_accuracy


def run_digits(*, epochs: int = 15, hidden: int = 64, batch_size: int = 32, learning_rate: float = 1e-2,
               seed: int = 0, backend: str | None = None, save: str | None = None, progress: bool = False,
               out: Any = None) -> DigitsResult:
    """Classify the 8×8 digits read row by row, beside a logistic regression on the same pixels.

    The learning rate follows a cosine from ``learning_rate`` down to 0 over the epochs (set
    on the optimizer before each epoch), which settles the accuracy at the end.
    """
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    out = sys.stdout if out is None else out
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)        # (n, 8, 8)
    labels = digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    split = int(0.8 * len(labels))
    train, test = order[:split], order[split:]
    seq = np.ascontiguousarray(images.transpose(1, 0, 2))      # (8 steps, n, 8 pixels)
    model = build_model(input_size=8, hidden_size=hidden, output_size=10, seed=seed, backend=backend)
    loss = SoftmaxCrossEntropy()
    optimizer = Adam(learning_rate, clip_norm=1.0)
    print(f"digits: {len(train)} training and {len(test)} test images, read as 8 steps of 8 pixels; "
          f"2-layer LSTM ({hidden} hidden) -> layer norm -> fully connected", file=out)
    accuracy = 0.0
    for epoch in range(1, epochs + 1):
        optimizer.learning_rate = learning_rate * 0.5 * (1.0 + math.cos(math.pi * (epoch - 1) / epochs))
        total = 0.0
        for idx in _progress(_batches(len(train), batch_size, rng), total=math.ceil(len(train) / batch_size),
                             desc=f"epoch {epoch}/{epochs}", enabled=progress):
            batch = train[idx]
            batch_loss = loss.apply(model.apply(seq[:, batch], training=True), labels[batch])
            optimizer.step(model.parameters(), model.apply_backward(batch_loss.gradient).parameters())
            total += batch_loss.loss * len(batch)
        accuracy = float(np.mean(model(seq[:, test]).argmax(axis=1) == labels[test]))
        print(f"epoch {epoch:3d}/{epochs}  train cross-entropy {total / len(train):.4f}  test accuracy "
              f"{accuracy:.3f}", file=out)
    pixels = images.reshape(len(labels), -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a solver's convergence notice is not the demo's business
        baseline = LogisticRegression(max_iter=2000).fit(pixels[train], labels[train])
    result = DigitsResult(model_accuracy=accuracy,
                          baseline_accuracy=float(baseline.score(pixels[test], labels[test])))
    print("\ntest accuracy (higher is better):", file=out)
    print(f"  bnnsfw LSTM                            {result.model_accuracy:.3f}", file=out)
    print(f"  logistic regression on the 64 pixels   {result.baseline_accuracy:.3f}", file=out)
    verdict = "beats" if result.beats_baseline else "does NOT beat"
    print(f"the model {verdict} the logistic-regression baseline", file=out)
    if save:
        _save(save, model, out)
    model.close()
    return result


# ------------------------------------------------------------------ the command ---------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bnnsfw demo", description=__doc__.split("\n\n")[1],
        epilog="Exit status: 0 when the model beats the baselines, 1 when it does not, 2 for a usage error.")
    p.add_argument("--task", choices=["sine", "digits"], default="sine", help="what to learn (default: sine)")
    p.add_argument("--epochs", type=integer(1), default=None,
                   help="training epochs (default: 30 sine, 15 digits)")
    p.add_argument("--hidden", type=integer(1), default=None,
                   help="LSTM hidden units (default: 32 sine, 64 digits)")
    p.add_argument("--seed", type=integer(0), default=0,
                   help="seed of data, weights and batch order, an integer >= 0 (default: 0)")
    p.add_argument("--backend", choices=backend_names(), default=None, help="bnnsfw backend (default: auto)")
    p.add_argument("--save", metavar="PATH",
                   help="save the trained model (.safetensors added unless it ends in .safetensors or .npz)")
    p.add_argument("--plot", metavar="PATH",
                   help="sine task: write the learning curves and a forecast as an image (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (they are shown only when stderr is a terminal)")
    return p


def _check(p: argparse.ArgumentParser, opts: argparse.Namespace) -> None:
    """Every check that can fail, before any work: extras, options that do not combine, paths."""
    if opts.task == "digits":
        if opts.plot:
            p.error("argument --plot: goes with --task sine (the digits task draws no plot)")
        if importlib.util.find_spec("sklearn") is None:
            p.error("argument --task: 'digits' needs scikit-learn, which is not installed "
                    "(pip install 'bnnsfw[demo]')")
    if opts.save:
        from ..serialization import weights_path

        check_output_path(p, "--save", weights_path(opts.save))
    if opts.plot:
        try:
            import matplotlib
        except ImportError:
            p.error("argument --plot: needs matplotlib, which is not installed (pip install 'bnnsfw[demo]')")
        from matplotlib.backend_bases import FigureCanvasBase

        formats = sorted(FigureCanvasBase.get_supported_filetypes())
        suffix = os.path.splitext(opts.plot)[1].lstrip(".").lower()
        if suffix not in formats:
            p.error(f"argument --plot: {opts.plot!r} must end in an image format matplotlib "
                    f"{matplotlib.__version__} writes: {', '.join('.' + f for f in formats)}")
        check_output_path(p, "--plot", opts.plot)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bnnsfw demo``; returns the exit status (usage errors exit with status 2)."""
    p = parser()
    opts = p.parse_args(argv)
    _check(p, opts)
    progress = not opts.no_progress and sys.stderr.isatty()
    common = dict(seed=opts.seed, backend=opts.backend, save=opts.save, progress=progress)
    if opts.task == "digits":
        digits = run_digits(epochs=opts.epochs or 15, hidden=opts.hidden or 64, **common)
        return 0 if digits.beats_baseline else 1
    result = run_forecast(epochs=opts.epochs or 30, hidden=opts.hidden or 32, plot=opts.plot, **common)
    return 0 if result.beats_baselines else 1

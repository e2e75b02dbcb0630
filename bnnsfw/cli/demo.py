"""``bnnsfw demo``: train a small sequence model with bnnsfw alone, and show that it learns.

The default task forecasts a noisy sum of sines: from a window of past values, predict the
next few. The model is a 2-layer LSTM, layer normalization of its last hidden state and a
fully connected head, trained with Adam on the mean squared error. At the end the
validation error is set beside two baselines — repeating the last value, and extending a
straight line fitted to the last few values — which the model must beat.

``--task digits`` instead classifies scikit-learn's 8×8 digits, read row by row as a
sequence of 8 steps of 8 pixels (when scikit-learn is installed).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any, Iterator, Sequence

import attrs
import numpy as np

from ..filter import FilterParameters
from ..layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
from ..layers.lstm import LSTMLayer, LSTMParameters
from ..layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType
from ..losses import MeanSquaredError, SoftmaxCrossEntropy
from ..optimizers import Adam

__all__ = ["SineTask", "make_sine_task", "SequenceModel", "run_forecast", "run_digits", "main"]


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
    return float(np.sqrt(np.mean((prediction.astype(np.float64) - target) ** 2)))


# ------------------------------------------------------------------ the model ----------


class SequenceModel:
    """LSTM → layer normalization of the last hidden state → fully connected head.

    Every layer is built with ``use_client_pointer=True``, so the optimizer's in-place
    updates of the parameter arrays are what the next forward computes with.
    """

    def __init__(self, *, input_size: int, hidden_size: int, output_size: int, num_layers: int = 2,
                 seed: int = 0, backend: str | None = None, dtype: Any = np.float32) -> None:
        fp = FilterParameters(backend=backend, use_client_pointer=True)
        self.lstm_parameters = LSTMParameters.random(input_size=input_size, hidden_size=hidden_size,
                                                     num_layers=num_layers, seed=seed, dtype=dtype)
        self.lstm = LSTMLayer(self.lstm_parameters, fp)
        self.norm = NormalizationLayer(NormalizationParameters(
            type=NormalizationType.layer(normalization_axis=0), input_shape=(hidden_size,), dtype=dtype), fp)
        self.head = FullyConnectedLayer(FullyConnectedParameters.random(
            input_size=hidden_size, output_size=output_size, seed=seed + 1, dtype=dtype), fp)
        self._forward_state: tuple[Any, ...] | None = None

    def parameters(self) -> list[np.ndarray]:
        """Every trainable array, in the order :meth:`backward` returns the gradients."""
        arrays: list[np.ndarray] = []
        for gate in self.lstm_parameters.gates:
            arrays += [a for a in (*gate.input_weights, gate.hidden_weights, gate.cell_weights, gate.bias)
                       if a is not None]
        arrays += [self.norm.gamma, self.norm.beta, self.head.weights]
        if self.head.bias is not None:
            arrays.append(self.head.bias)
        return arrays

    def forward(self, x: np.ndarray, *, training: bool) -> np.ndarray:
        """``x`` is ``(T, N, input_size)``; returns ``(N, output_size)``."""
        out = self.lstm.apply(x, training=training)
        last = np.ascontiguousarray(out.output[-1])
        phase = "training" if training else "inference"
        normed = self.norm.apply(last, phase=phase)
        prediction = self.head.apply(normed)
        self._forward_state = (x, out, last, normed, phase)
        return prediction

    def backward(self, prediction_gradient: np.ndarray) -> list[np.ndarray]:
        """Gradients of every :meth:`parameters` array, after a training :meth:`forward`."""
        if self._forward_state is None:
            raise RuntimeError("SequenceModel.backward needs a training forward first")
        x, out, last, normed, phase = self._forward_state
        g_head = self.head.apply_backward(normed, prediction_gradient)
        g_norm = self.norm.apply_backward(last, g_head.input, phase=phase)
        d_output = np.zeros_like(out.output)
        d_output[-1] = g_norm.input
        g_lstm = self.lstm.apply_backward(x, d_output, training_cache=out.training_cache)
        grads: list[np.ndarray] = []
        for gate, g in zip(self.lstm_parameters.gates, g_lstm.gates):
            pairs = zip((*gate.input_weights, gate.hidden_weights, gate.cell_weights, gate.bias),
                        (*g.input_weights, g.hidden_weights, g.cell_weights, g.bias))
            for array, grad in pairs:
                if array is not None:
                    assert grad is not None, "the LSTM returns a gradient for every weight it has"
                    grads.append(grad)
        assert g_norm.beta is not None, "a layer norm has a beta"
        grads += [g_norm.gamma, g_norm.beta, g_head.weights]
        if g_head.bias is not None:
            grads.append(g_head.bias)
        return grads

    def layers(self) -> dict[str, Any]:
        return {"lstm": self.lstm, "norm": self.norm, "head": self.head}

    def close(self) -> None:
        for layer in self.layers().values():
            layer.close()


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
    """What :func:`run_forecast` measured."""

    train_losses: list[float]
    validation_losses: list[float]
    model_rmse: float
    repeat_last_rmse: float
    linear_fit_rmse: float
    seconds: float

    @property
    def beats_baselines(self) -> bool:
        return self.model_rmse < min(self.repeat_last_rmse, self.linear_fit_rmse)


def run_forecast(*, epochs: int = 30, hidden: int = 32, batch_size: int = 64, learning_rate: float = 1e-2,
                 seed: int = 0, backend: str | None = None, save: str | None = None, plot: str | None = None,
                 progress: bool = True, out: Any = None) -> ForecastResult:
    """Train the forecaster and report its validation error beside the baselines."""
    out = sys.stdout if out is None else out
    start = time.perf_counter()
    task = make_sine_task(seed=seed)
    horizon = task.y_train.shape[1]
    model = SequenceModel(input_size=1, hidden_size=hidden, output_size=horizon, seed=seed, backend=backend)
    loss = MeanSquaredError()
    optimizer = Adam(learning_rate, clip_norm=1.0)
    rng = np.random.default_rng(seed)
    n_train = task.x_train.shape[1]
    print(f"forecasting {horizon} steps from {task.x_train.shape[0]}: {n_train} training and "
          f"{task.x_val.shape[1]} validation windows; 2-layer LSTM ({hidden} hidden) -> layer norm -> "
          f"fully connected; backend {model.lstm.backend.name}", file=out)
    train_losses, val_losses = [], []
    params = model.parameters()
    for epoch in range(1, epochs + 1):
        total, count = 0.0, 0
        batches = _batches(n_train, batch_size, rng)
        for idx in _progress(batches, total=math.ceil(n_train / batch_size), desc=f"epoch {epoch}/{epochs}",
                             enabled=progress):
            x = np.ascontiguousarray(task.x_train[:, idx])
            batch_loss = loss.apply(model.forward(x, training=True), task.y_train[idx])
            optimizer.step(params, model.backward(batch_loss.gradient))
            total += batch_loss.loss * len(idx)
            count += len(idx)
        val = loss.apply(model.forward(task.x_val, training=False), task.y_val).loss
        train_losses.append(total / count)
        val_losses.append(val)
        print(f"epoch {epoch:3d}/{epochs}  train loss {total / count:.4f}  validation loss {val:.4f}",
              file=out)
    prediction = model.forward(task.x_val, training=False)
    result = ForecastResult(
        train_losses=train_losses, validation_losses=val_losses, model_rmse=rmse(prediction, task.y_val),
        repeat_last_rmse=rmse(repeat_last_baseline(task.x_val, horizon), task.y_val),
        linear_fit_rmse=rmse(linear_fit_baseline(task.x_val, horizon), task.y_val),
        seconds=time.perf_counter() - start)
    print("\nvalidation RMSE over the forecast horizon:", file=out)
    print(f"  bnnsfw model          {result.model_rmse:.4f}", file=out)
    print(f"  repeat last value     {result.repeat_last_rmse:.4f}", file=out)
    print(f"  linear fit (last 8)   {result.linear_fit_rmse:.4f}", file=out)
    verdict = "beats both baselines" if result.beats_baselines else "does NOT beat both baselines"
    print(f"the model {verdict} ({result.seconds:.1f} s)", file=out)
    if save:
        from ..serialization import save_weights

        save_weights(save, model.layers())
        print(f"weights saved to {save}", file=out)
    if plot:
        _plot(plot, result, task, prediction, out)
    model.close()
    return result


def _plot(path: str, result: ForecastResult, task: SineTask, prediction: np.ndarray, out: Any) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot written.",
              file=out)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    epochs = np.arange(1, len(result.train_losses) + 1)
    left.plot(epochs, result.train_losses, "o-", ms=3, label="train")
    left.plot(epochs, result.validation_losses, "o-", ms=3, label="validation")
    left.set_xlabel("epoch")
    left.set_ylabel("MSE")
    left.set_yscale("log")
    left.legend()
    window = task.x_val.shape[0]
    horizon = task.y_val.shape[1]
    past = np.arange(window)
    future = np.arange(window, window + horizon)
    right.plot(past, task.x_val[:, 0, 0], color="0.5", label="input window")
    right.plot(future, task.y_val[0], "o-", color="k", label="truth")
    right.plot(future, prediction[0], "s--", label="bnnsfw forecast")
    right.set_xlabel("step")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot written to {path}", file=out)


# ------------------------------------------------------------------ digits -------------


def run_digits(*, epochs: int = 15, hidden: int = 64, batch_size: int = 32, learning_rate: float = 1e-2,
               seed: int = 0, backend: str | None = None, progress: bool = True,
               out: Any = None) -> float | None:
    """Classify the 8×8 digits read row by row; returns test accuracy (``None`` without sklearn)."""
    out = sys.stdout if out is None else out
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        print("--task digits needs scikit-learn (pip install scikit-learn).", file=out)
        return None
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)        # (n, 8, 8)
    labels = digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    split = int(0.8 * len(labels))
    train, test = order[:split], order[split:]
    seq = np.ascontiguousarray(images.transpose(1, 0, 2))      # (8 steps, n, 8 pixels)
    model = SequenceModel(input_size=8, hidden_size=hidden, output_size=10, num_layers=2, seed=seed,
                          backend=backend)
    loss = SoftmaxCrossEntropy()
    optimizer = Adam(learning_rate, clip_norm=1.0)
    params = model.parameters()
    print(f"digits: {len(train)} training and {len(test)} test images, read as 8 steps of 8 pixels", file=out)
    for epoch in range(1, epochs + 1):
        total = 0.0
        for idx in _progress(_batches(len(train), batch_size, rng), total=math.ceil(len(train) / batch_size),
                             desc=f"epoch {epoch}/{epochs}", enabled=progress):
            batch = train[idx]
            logits = model.forward(np.ascontiguousarray(seq[:, batch]), training=True)
            result = loss.apply(logits, labels[batch])
            optimizer.step(params, model.backward(result.gradient))
            total += result.loss * len(batch)
        logits = model.forward(np.ascontiguousarray(seq[:, test]), training=False)
        accuracy = float(np.mean(logits.argmax(axis=1) == labels[test]))
        print(f"epoch {epoch:3d}/{epochs}  train loss {total / len(train):.4f}  test accuracy {accuracy:.3f}",
              file=out)
    model.close()
    print(f"test accuracy {accuracy:.3f}", file=out)
    return accuracy


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bnnsfw demo", description=__doc__.split("\n\n")[1])
    p.add_argument("--task", choices=["sine", "digits"], default="sine", help="what to learn (default: sine)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default: 30 sine, 15 digits)")
    p.add_argument("--hidden", type=int, default=None, help="LSTM hidden units (default: 32 sine, 64 digits)")
    p.add_argument("--seed", type=int, default=0, help="seed of data, weights and batch order (default: 0)")
    p.add_argument("--backend", default=None, help="bnnsfw backend (default: auto)")
    p.add_argument("--save", metavar="PATH", help="save the trained weights (.npz)")
    p.add_argument("--plot", metavar="PATH",
                   help="write loss curves and a forecast as a PNG (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    for name in ("epochs", "hidden"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            parser().error(f"--{name} must be at least 1")
    common = dict(seed=opts.seed, backend=opts.backend, progress=not opts.no_progress)
    if opts.task == "digits":
        if opts.save or opts.plot:
            parser().error("--save and --plot go with the sine task")
        accuracy = run_digits(epochs=opts.epochs or 15, hidden=opts.hidden or 64, **common)
        return 0 if accuracy is not None else 1
    result = run_forecast(epochs=opts.epochs or 30, hidden=opts.hidden or 32, save=opts.save, plot=opts.plot,
                          **common)
    return 0 if result.beats_baselines else 1

"""The ``bnnsfw demo`` model as a plain script: a 2-layer LSTM, layer normalization and a
fully connected head, trained with Adam to forecast a noisy sum of sines.

Copy it and change the data, the sizes or the loss. Usage:
``python samples/train_forecaster.py [--quick]``.
"""

from __future__ import annotations

import sys

import numpy as np

import bnnsfw as bf
from bnnsfw import (FullyConnectedLayer, FullyConnectedParameters, LastStep, LSTMLayer, LSTMParameters,
                    NormalizationLayer, NormalizationParameters, NormalizationType, Sequential)
from bnnsfw.cli.demo import make_sine_task, repeat_last_baseline, rmse


def main(quick: bool = False) -> int:
    epochs, hidden, batch_size = (2, 8, 64) if quick else (30, 32, 32)
    task = make_sine_task(n_series=16 if quick else 96, seed=0)
    horizon = task.y_train.shape[1]

    # The model: LSTM -> its last time step -> layer normalization -> fully connected head.
    model = Sequential(
        LSTMLayer(LSTMParameters.random(input_size=1, hidden_size=hidden, num_layers=2, seed=0)),
        LastStep(),
        NormalizationLayer(NormalizationParameters(type=NormalizationType.layer(), input_shape=(hidden,))),
        FullyConnectedLayer(FullyConnectedParameters.random(input_size=hidden, output_size=horizon, seed=1)),
    )
    loss = bf.losses.MeanSquaredError()
    optimizer = bf.optimizers.Adam(1e-2, clip_norm=1.0)

    rng = np.random.default_rng(0)
    n = task.x_train.shape[1]
    baseline = rmse(repeat_last_baseline(task.x_val, horizon), task.y_val)
    for epoch in range(1, epochs + 1):
        order = rng.permutation(n)                                     # a new batch order each epoch
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            prediction = model.apply(task.x_train[:, idx], training=True)     # x: (T, N, 1)
            result = loss.apply(prediction, task.y_train[idx])
            grads = model.apply_backward(result.gradient)                     # every layer, in reverse
            optimizer.step(model.parameters(), grads.parameters())            # paired by name
        print(f"epoch {epoch:2d}: validation RMSE {rmse(model(task.x_val), task.y_val):.4f} "
              f"(repeat-last baseline {baseline:.4f})")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))

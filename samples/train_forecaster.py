"""The ``bnnsfw demo`` model as a plain script: a 2-layer LSTM, layer normalization and a
fully connected head, trained with Adam to forecast a noisy sum of sines.

Copy it and change the data, the sizes or the loss. Usage:
``python samples/train_forecaster.py [--quick]``.
"""

from __future__ import annotations

import sys

import numpy as np

import bnnsfw as bf
from bnnsfw.cli.demo import make_sine_task, repeat_last_baseline, rmse


def main(quick: bool = False) -> int:
    epochs, hidden, batch_size = (2, 8, 64) if quick else (30, 32, 32)
    task = make_sine_task(n_series=16 if quick else 96, seed=0)
    horizon = task.y_train.shape[1]

    # Layers keep references to these arrays (use_client_pointer), so the optimizer's
    # in-place updates are what the next forward computes with.
    client = bf.FilterParameters(use_client_pointer=True)
    lstm_params = bf.LSTMParameters.random(input_size=1, hidden_size=hidden, num_layers=2, seed=0)
    lstm = bf.LSTMLayer(lstm_params, client)
    norm = bf.NormalizationLayer(bf.NormalizationParameters(
        type=bf.NormalizationType.layer(normalization_axis=0), input_shape=(hidden,)), client)
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(
        input_size=hidden, output_size=horizon, seed=1), client)

    weights = []                                       # every trainable array, in a fixed order
    for gate in lstm_params.gates:
        weights += [gate.input_weights[0], gate.input_weights[1], gate.hidden_weights, gate.bias]
    weights += [norm.gamma, norm.beta, head.weights, head.bias]

    loss = bf.losses.MeanSquaredError()
    optimizer = bf.optimizers.Adam(1e-2, clip_norm=1.0)
    rng = np.random.default_rng(0)
    n = task.x_train.shape[1]
    for epoch in range(1, epochs + 1):
        order = rng.permutation(n)                                     # a new batch order each epoch
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            x = np.ascontiguousarray(task.x_train[:, idx])             # (T, N, 1)
            # forward: LSTM -> last hidden state -> layer norm -> head
            out = lstm.apply(x, training=True)
            last = np.ascontiguousarray(out.output[-1])
            normed = norm.apply(last, phase="training")
            prediction = head.apply(normed)
            result = loss.apply(prediction, task.y_train[idx])
            # backward, in the reverse order
            g_head = head.apply_backward(normed, result.gradient)
            g_norm = norm.apply_backward(last, g_head.input, phase="training")
            d_output = np.zeros_like(out.output)
            d_output[-1] = g_norm.input                              # only the last step feeds the head
            g_lstm = lstm.apply_backward(x, d_output, training_cache=out.training_cache)
            grads = []
            for g in g_lstm.gates:
                grads += [g.input_weights[0], g.input_weights[1], g.hidden_weights, g.bias]
            grads += [g_norm.gamma, g_norm.beta, g_head.weights, g_head.bias]
            optimizer.step(weights, grads)
        val = head.apply(norm.apply(np.ascontiguousarray(lstm.apply(task.x_val).output[-1]),
                                    phase="inference"))
        print(f"epoch {epoch:2d}: validation RMSE {rmse(val, task.y_val):.4f} "
              f"(repeat-last baseline {rmse(repeat_last_baseline(task.x_val, horizon), task.y_val):.4f})")
    for layer in (lstm, norm, head):
        layer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))

"""From BNNS filters to BNNSGraph: train in bnnsfw, then export to ONNX and to Core ML.

Apple deprecated the BNNS filter API (macOS 15 / iOS 18) for BNNSGraph, which runs compiled
Core ML models and cannot train. This sample trains a small forecaster (LSTM -> layer norm ->
fully connected head) in bnnsfw, saves its weights (safetensors), exports it

- to ONNX (``bnnsfw.onnx.export``), loads the file back in bnnsfw and, when ONNX Runtime is
  installed, runs it there, comparing both with the trained layers;
- to a Core ML ML Program (``bnnsfw.coreml.export``), the format BNNSGraph compiles, and prints
  what survived and what did not.

Each export needs its package (``pip install 'bnnsfw[onnx,coreml]'``); without one the sample
says so and goes on. Usage: ``python samples/export_for_bnnsgraph.py [--quick]``.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np

import bnnsfw as bf
from bnnsfw.cli.demo import make_sine_task, rmse


def train(quick: bool) -> tuple[list[bf.Filter], np.ndarray, np.ndarray]:
    """Train LSTM -> layer norm -> head on the demo's sine task; return the layers and validation data."""
    epochs, hidden = (2, 8) if quick else (20, 24)
    task = make_sine_task(n_series=16 if quick else 96, seed=0)
    horizon = task.y_train.shape[1]
    client = bf.FilterParameters(use_client_pointer=True)     # the optimizer updates these arrays in place
    lstm_params = bf.LSTMParameters.random(input_size=1, hidden_size=hidden, seed=0)
    lstm = bf.LSTMLayer(lstm_params, client)
    norm = bf.NormalizationLayer(bf.NormalizationParameters(type=bf.NormalizationType.layer(),
                                                            input_shape=(hidden,)), client)
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=hidden, output_size=horizon,
                                                                     seed=1), client)
    weights = [a for g in lstm_params.gates for a in (g.input_weights[0], g.hidden_weights, g.bias)]
    weights += [norm.gamma, norm.beta, head.weights, head.bias]
    loss, optimizer = bf.losses.MeanSquaredError(), bf.optimizers.Adam(1e-2, clip_norm=1.0)
    x = np.ascontiguousarray(task.x_train)                     # (T, N, 1)
    for epoch in range(1, epochs + 1):
        out = lstm.apply(x, training=True)
        last = np.ascontiguousarray(out.output[-1])
        normed = norm.apply(last, phase="training")
        result = loss.apply(head.apply(normed), task.y_train)
        g_head = head.apply_backward(normed, result.gradient)
        g_norm = norm.apply_backward(last, g_head.input, phase="training")
        d_output = np.zeros_like(out.output)
        d_output[-1] = g_norm.input
        g_lstm = lstm.apply_backward(x, d_output, training_cache=out.training_cache)
        grads = [a for g in g_lstm.gates for a in (g.input_weights[0], g.hidden_weights, g.bias)]
        optimizer.step(weights, grads + [g_norm.gamma, g_norm.beta, g_head.weights, g_head.bias])
    print(f"trained {epochs} epochs: training loss {result.loss:.4f}")
    return [lstm, norm, head], np.ascontiguousarray(task.x_val), task.y_val


def forecast(layers: list[bf.Filter], x: np.ndarray) -> np.ndarray:
    """What the exported graphs compute: every step through the layers (the forecast is the last)."""
    lstm, norm, head = layers
    assert isinstance(lstm, bf.LSTMLayer) and isinstance(norm, bf.NormalizationLayer)
    assert isinstance(head, bf.FullyConnectedLayer)
    y = lstm.apply(x).output
    t, n, h = y.shape
    y = norm.apply(y.reshape(-1, h), phase="inference")
    return head.apply(y).reshape(t, n, -1)


def main(quick: bool = False) -> int:
    layers, x_val, y_val = train(quick)
    reference = forecast(layers, x_val)
    print(f"bnnsfw:       validation RMSE {rmse(reference[-1], y_val):.4f}")
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        bf.save_weights(folder / "forecaster.safetensors", dict(zip(("lstm", "norm", "head"), layers)))
        size = (folder / "forecaster.safetensors").stat().st_size
        print(f"weights:      forecaster.safetensors, {size} bytes")

        if importlib.util.find_spec("onnx") is None:
            print("ONNX:         skipped (pip install 'bnnsfw[onnx]')")
        else:
            import bnnsfw.onnx

            bnnsfw.onnx.export(layers, folder / "forecaster.onnx")
            with bnnsfw.onnx.load(folder / "forecaster.onnx") as session:
                (again,) = session.run(["output"], {"input": x_val})
            print(f"ONNX:         forecaster.onnx loads back in bnnsfw, largest difference "
                  f"{np.abs(again - reference).max():.2e}")
            if importlib.util.find_spec("onnxruntime") is not None:
                import onnxruntime

                ort = onnxruntime.InferenceSession(str(folder / "forecaster.onnx"),
                                                   providers=["CPUExecutionProvider"])
                (theirs,) = ort.run(["output"], {"input": x_val})
                difference = np.abs(theirs - reference).max()
                print(f"              ONNX Runtime runs it, largest difference {difference:.2e}")

        if importlib.util.find_spec("coremltools") is None:
            print("Core ML:      skipped (pip install 'bnnsfw[coreml]')")
        else:
            import bnnsfw.coreml

            report = bnnsfw.coreml.export(layers, folder / "forecaster")
            text = str(report).replace(str(folder) + "/", "")
            print("Core ML:      " + text.replace("\n", "\n              "))
            print("              (predictions from the .mlpackage need macOS, or BNNSGraph on a device)")
    for layer in layers:
        layer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))

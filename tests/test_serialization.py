import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.serialization import load_weights, save_weights


def test_round_trip_reproduces_outputs_exactly(tmp_path, rng, backend_name):
    fp = bf.FilterParameters(backend=backend_name)
    lstm = bf.LSTMLayer(bf.LSTMParameters.random(
        input_size=3, hidden_size=4, num_layers=2, bidirectional=True, peepholes="diagonal", seed=1,
        hidden_activation=bf.Activation.scaled_tanh(1.5, 0.8)), fp)
    norm = bf.NormalizationLayer(bf.NormalizationParameters(
        type=bf.NormalizationType.batch(moving_mean=np.zeros(8), moving_variance=np.ones(8)),
        input_shape=(8,), momentum=0.5, gamma=rng.uniform(0.5, 2, 8), beta=rng.standard_normal(8),
        activation=bf.Activation.leaky_relu(0.2)), fp)
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=8, output_size=2, seed=2), fp)
    x = rng.standard_normal((5, 3, 3)).astype(np.float32)
    features = lstm.apply(x).output[-1]
    norm.apply(features, phase="training")           # moves the moving statistics away from 0 / 1

    def predict(layers):
        h = layers["lstm"].apply(x).output[-1]
        return layers["head"].apply(layers["norm"].apply(h, phase="inference"))

    path = tmp_path / "model.npz"
    original = {"lstm": lstm, "norm": norm, "head": head}
    save_weights(path, original)
    loaded = load_weights(path, fp)
    assert {k: type(v) for k, v in loaded.items()} == {k: type(v) for k, v in original.items()}
    np.testing.assert_array_equal(predict(loaded), predict(original))
    np.testing.assert_array_equal(loaded["norm"].moving_mean, norm.moving_mean)
    assert loaded["lstm"].parameters.input_gate.cell_weights.shape == (2, 2, 4)


def test_save_refuses_bad_input(tmp_path):
    with pytest.raises(bf.InvalidParameterError, match="non-empty mapping"):
        save_weights(tmp_path / "x.npz", {})
    with pytest.raises(bf.InvalidParameterError, match="a bnnsfw layer"):
        save_weights(tmp_path / "x.npz", {"a": object()})
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=2, output_size=2))
    with pytest.raises(bf.InvalidParameterError, match="without '/'"):
        save_weights(tmp_path / "x.npz", {"a/b": head})
    head.close()
    with pytest.raises(bf.FilterClosedError):
        save_weights(tmp_path / "x.npz", {"head": head})


def test_load_refuses_foreign_files(tmp_path):
    np.savez(tmp_path / "other.npz", a=np.zeros(2))
    with pytest.raises(bf.InvalidParameterError, match="a file written by save_weights"):
        load_weights(tmp_path / "other.npz")

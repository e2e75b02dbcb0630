"""save_weights / load_weights in the safetensors form, and .npz files still loading."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bnnsfw as bf


def _layers(rng, fp=None):
    lstm = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2,
                                                 bidirectional=True,
                                                 peepholes="diagonal", seed=1), fp)
    norm = bf.NormalizationLayer(bf.NormalizationParameters(
        type=bf.NormalizationType.batch(moving_mean=rng.standard_normal(8), moving_variance=rng.uniform(1, 2,
                                                                                                        8)),
        input_shape=(8,), gamma=rng.uniform(0.5, 2, 8), beta=rng.standard_normal(8), momentum=0.5), fp)
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=8, output_size=2, seed=2,
                                                                     dtype=np.float32), fp)
    return {"lstm": lstm, "norm": norm, "head": head}


def _predict(layers, x):
    h = layers["lstm"].apply(x).output[-1]
    return layers["head"].apply(layers["norm"].apply(h, phase="inference"))


@pytest.mark.parametrize("name", ["model.safetensors", "model.weights"])
def test_safetensors_round_trip_is_exact(tmp_path, rng, backend_name, name):
    fp = bf.FilterParameters(backend=backend_name)
    layers = _layers(rng, fp)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    path = tmp_path / name
    bf.save_weights(path, layers)
    written = tmp_path / bf.serialization.weights_path(name)  # model.weights.safetensors for the second
    assert written.read_bytes()[8:9] == b"{"                  # a safetensors header
    loaded = bf.load_weights(path, fp)
    assert list(loaded) == list(layers)
    np.testing.assert_array_equal(_predict(loaded, x), _predict(layers, x))
    np.testing.assert_array_equal(loaded["norm"].moving_variance, layers["norm"].moving_variance)


def test_the_file_is_plain_safetensors_with_bnnsfw_metadata(tmp_path, rng):
    safetensors = pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    layers = _layers(rng)
    path = tmp_path / "model.safetensors"
    bf.save_weights(path, layers)
    arrays = load_file(str(path))
    np.testing.assert_array_equal(arrays["head/weights"], layers["head"].weights)
    np.testing.assert_array_equal(arrays["lstm/forget_gate/hidden_weights"],
                                  layers["lstm"].layer_parameters.forget_gate.hidden_weights)
    with safetensors.safe_open(str(path), framework="np") as f:
        meta = json.loads(f.metadata()["bnnsfw"])
    assert meta["format"] == "bnnsfw-weights-1"
    assert meta["layers"]["norm"]["type"] == "normalization" and meta["layers"]["norm"]["momentum"] == 0.5


def test_npz_files_still_load_and_match(tmp_path, rng):
    layers = _layers(rng)
    x = rng.standard_normal((4, 3, 3)).astype(np.float32)
    bf.save_weights(tmp_path / "old.npz", layers)
    assert (tmp_path / "old.npz").read_bytes()[:2] == b"PK"    # the NumPy archive form
    bf.save_weights(tmp_path / "new.safetensors", layers)
    old, new = bf.load_weights(tmp_path / "old.npz"), bf.load_weights(tmp_path / "new.safetensors")
    np.testing.assert_array_equal(_predict(old, x), _predict(new, x))


def test_foreign_or_broken_safetensors_files_are_refused(tmp_path):
    from safetensors.numpy import save_file

    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(bf.InvalidParameterError, match="written by save_weights"):
        bf.load_weights(tmp_path / "other.safetensors")
    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "bad.safetensors"), metadata={"bnnsfw": "{"})
    with pytest.raises(bf.InvalidParameterError, match="JSON"):
        bf.load_weights(tmp_path / "bad.safetensors")
    layers = _layers(np.random.default_rng(0))
    bf.save_weights(tmp_path / "cut.safetensors", layers)
    data = (tmp_path / "cut.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(bf.InvalidParameterError, match="safetensors"):
        bf.load_weights(tmp_path / "cut.safetensors")

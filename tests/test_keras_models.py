"""load_keras: Keras models load as a Sequential whose apply(x) is Keras's predict(x).

The ``.keras`` files and Keras's predictions in tests/data/keras were written by
tests/data/keras/make_models.py (Keras 3 on its torch backend); these tests read the files
only, so they need h5py but neither Keras nor PyTorch.
"""

from __future__ import annotations

import io
import json
import pathlib
import zipfile

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import interop

from gradcheck import assert_gradient_close, numerical_gradient

pytest.importorskip("h5py")

DATA = pathlib.Path(__file__).parent / "data" / "keras"

# Each model's container elements (name: type), in order; ":last" and ":softmax" are added.
LOADED = {
    "sequential_softmax": {"encoder": bf.LSTMLayer, "encoder:last": bf.LastStep,
                           "classes": bf.FullyConnectedLayer, "classes:softmax": bf.Softmax},
    "any_length_stacked": {"lstm_a": bf.LSTMLayer, "lstm_b": bf.LSTMLayer, "lstm_c": bf.LSTMLayer,
                           "lstm_c:last": bf.LastStep, "head": bf.FullyConnectedLayer},
    "sequence_norm_relu": {"encoder": bf.LSTMLayer, "norm": bf.NormalizationLayer,
                           "head": bf.FullyConnectedLayer},
    "bidirectional_final": {"bi": bf.LSTMLayer, "bi:last": bf.FinalState, "head": bf.FullyConnectedLayer},
    "functional_linear": {"encoder": bf.LSTMLayer, "batch_norm": bf.NormalizationLayer,
                          "bi": bf.LSTMLayer, "summary": bf.LSTMLayer, "summary:last": bf.LastStep,
                          "head": bf.FullyConnectedLayer},
    "pass_through": {"encoder": bf.LSTMLayer, "head": bf.FullyConnectedLayer},
    "group_norm_features": {"encoder": bf.LSTMLayer, "encoder:last": bf.LastStep,
                            "groups": bf.NormalizationLayer, "head": bf.FullyConnectedLayer},
}


@pytest.fixture(scope="module")
def predictions():
    with np.load(DATA / "predictions.npz") as data:
        return dict(data)


def _load(name, backend_name, dtype=None):
    return interop.load_keras(DATA / f"{name}.keras", dtype=dtype,
                              filter_parameters=bf.FilterParameters(backend=backend_name))


@pytest.mark.parametrize("name", list(LOADED))
def test_a_loaded_model_predicts_what_keras_predicts(name, backend_name, predictions):
    """Keras computes in float32: float32 within its rounding, float64 within 1e-6."""
    x, expected = predictions[f"{name}/x"], predictions[f"{name}/y"]
    with _load(name, backend_name) as model:
        assert {key: type(element) for key, element in model.layers.items()} == LOADED[name]
        assert model.dtype == np.float32
        np.testing.assert_allclose(model.apply(x), expected, rtol=1e-5, atol=1e-6)
    with _load(name, backend_name, dtype=np.float64) as model:
        np.testing.assert_allclose(model.apply(x.astype(np.float64)), expected, rtol=0, atol=1e-6)
        if f"{name}/x_longer" in predictions:  # Input((None, F)): any length
            np.testing.assert_allclose(model.apply(predictions[f"{name}/x_longer"].astype(np.float64)),
                                       predictions[f"{name}/y_longer"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["bidirectional_final", "sequential_softmax"])
def test_a_loaded_model_trains(name, backend_name, predictions):
    """The added elements (FinalState, LastStep, Softmax) backpropagate: finite differences."""
    x = predictions[f"{name}/x"].astype(np.float64)
    with _load(name, backend_name, dtype=np.float64) as model:
        weights = np.random.default_rng(3).standard_normal(model.apply(x).shape)

        def loss() -> float:
            return float((model.apply(x) * weights).sum())

        model.apply(x, training=True)
        grads = model.apply_backward(weights)
        assert_gradient_close(grads.input, numerical_gradient(loss, x), rtol=1e-6, atol=1e-9, name="input")
        lstm = next(iter(model.layers))
        for key in (f"{lstm}.layer0.forward.output_gate.bias", *[k for k in model.parameters()
                                                                 if k.endswith(".bias")][-1:]):
            assert_gradient_close(grads.parameters()[key], numerical_gradient(loss, model.parameters()[key]),
                                  rtol=1e-6, atol=1e-9, name=key)


@pytest.mark.parametrize("name, match", [
    ("branching", r"layer 'encoder' must be used by one layer \(the graph branches here.*"
                  r"got \"used by \['left', 'right'\]\""),
    ("masking", r"layer 'mask' must be a layer bnnsfw computes \(Masking .*sequence_lengths.*got 'Masking'"),
    ("gru", r"layer 'recurrent' must be .*no GRU.*got 'GRU'"),
    ("group_norm_sequence", r"layer 'groups'.*whole sequence"),
])
def test_what_cannot_load_is_refused_by_name(name, match):
    with pytest.raises(bf.UnsupportedError, match=match):
        interop.load_keras(DATA / f"{name}.keras")


def _edited(tmp_path, name, edit):
    """A copy of a model file whose config.json ``edit`` changed in place."""
    with zipfile.ZipFile(DATA / f"{name}.keras") as archive:
        members = {info.filename: archive.read(info.filename) for info in archive.infolist()}
    config = json.loads(members["config.json"])
    edit(config["config"]["layers"])
    members["config.json"] = json.dumps(config).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for filename, data in members.items():
            archive.writestr(filename, data)
    path = tmp_path / f"{name}.keras"
    path.write_bytes(buffer.getvalue())
    return path


def _set(class_name, **config):
    def edit(layers):
        layer = next(layer for layer in layers if layer["class_name"] == class_name)
        layer["config"].update(config)
    return edit


def _rename(old, new):
    def edit(layers):
        next(layer for layer in layers if layer["class_name"] == old)["class_name"] = new
    return edit


@pytest.mark.parametrize("name, edit, error, match", [
    ("bidirectional_final", _set("Bidirectional", merge_mode="sum"), bf.UnsupportedError,
     r"merge_mode must be .*'concat'.*got 'sum'"),
    ("sequential_softmax", _set("LSTM", return_state=True), bf.UnsupportedError, r"'encoder' return_state"),
    ("sequence_norm_relu", _set("LayerNormalization", axis=[1, 2]), bf.UnsupportedError,
     r"'norm' axis must be .*the last axis \(-1 or 2\).*got \[1, 2\]"),
    ("sequence_norm_relu", _set("Dense", activation="log_softmax"), bf.UnsupportedError,
     r"activation must be .*got 'log_softmax'"),
    ("pass_through", _rename("Dropout", "Flatten"), bf.UnsupportedError,
     r"layer 'dropout' must be a layer bnnsfw computes \(LSTM, .*got 'Flatten'"),
    ("pass_through", _rename("Identity", "Activation"), bf.UnsupportedError,
     r"layer 'identity' must be .*give the activation to the Dense layer.*got 'Activation'"),
])
def test_options_without_a_counterpart_are_refused(tmp_path, name, edit, error, match):
    with pytest.raises(error, match=match):
        interop.load_keras(_edited(tmp_path, name, edit))


def test_a_functional_model_must_be_a_chain(tmp_path):
    def called_twice(layers):
        head = next(layer for layer in layers if layer["name"] == "head")
        head["inbound_nodes"] = head["inbound_nodes"] * 2

    with pytest.raises(bf.UnsupportedError, match=r"layer 'head' must be called once.*got 'called 2 times'"):
        interop.load_keras(_edited(tmp_path, "functional_linear", called_twice))

    def with_initial_state(layers):
        summary = next(layer for layer in layers if layer["name"] == "summary")
        summary["inbound_nodes"][0]["kwargs"]["initial_state"] = [0.0]

    with pytest.raises(bf.UnsupportedError, match=r"'summary' must be called on its input alone"):
        interop.load_keras(_edited(tmp_path, "functional_linear", with_initial_state))

"""Write the Keras models of tests/test_keras_models.py and Keras's predictions for them.

Run with Keras 3 on its torch backend (no TensorFlow needed) and h5py::

    KERAS_BACKEND=torch python tests/data/keras/make_models.py

It writes ``<name>.keras`` beside this script for every model below and ``predictions.npz``
with ``<name>/x`` (the input, float32, batch first) and ``<name>/y`` (``model.predict(x)``)
for the models that load; the refused ones have no prediction. Weights (biases and moving
statistics included) are drawn from a seeded generator, so the files are reproducible given
the Keras version; the tests read only the files, so CI needs neither Keras nor PyTorch.
"""

from __future__ import annotations

import io
import os
import pathlib
import zipfile

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras import layers  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


def sequential_softmax() -> keras.Model:
    """Keras's default LSTM (the last step only) into a softmax classifier."""
    return keras.Sequential([keras.Input((6, 3)), layers.LSTM(5, name="encoder"),
                             layers.Dense(3, activation="softmax", name="classes")])


def any_length_stacked() -> keras.Model:
    """Input((None, F)): three stacked LSTMs, the last one returning its last step."""
    return keras.Sequential([keras.Input((None, 3)),
                             layers.LSTM(5, return_sequences=True, name="lstm_a"),
                             layers.LSTM(4, return_sequences=True, name="lstm_b"),
                             layers.LSTM(3, name="lstm_c"), layers.Dense(2, name="head")])


def sequence_norm_relu() -> keras.Model:
    """Every step through a layer norm and a ReLU head."""
    return keras.Sequential([keras.Input((7, 3)), layers.LSTM(6, return_sequences=True, name="encoder"),
                             layers.LayerNormalization(name="norm"),
                             layers.Dense(2, activation="relu", name="head")])


def bidirectional_final() -> keras.Model:
    """Bidirectional without return_sequences: each direction's final state, concatenated."""
    return keras.Sequential([keras.Input((5, 3)), layers.Bidirectional(layers.LSTM(4), name="bi"),
                             layers.Dense(2, name="head")])


def functional_linear() -> keras.Model:
    """A functional chain: batch norm on every step, a bidirectional sequence, a last step."""
    x = keras.Input((5, 3), name="series")
    y = layers.LSTM(4, return_sequences=True, name="encoder")(x)
    y = layers.BatchNormalization(name="batch_norm")(y)
    y = layers.Bidirectional(layers.LSTM(3, return_sequences=True), name="bi")(y)
    y = layers.LSTM(2, activation="relu", name="summary")(y)
    y = layers.Dense(2, activation="tanh", name="head")(y)
    return keras.Model(x, y, name="functional_linear")


def pass_through() -> keras.Model:
    """The layers that compute nothing at inference, around an LSTM and a Dense."""
    return keras.Sequential([
        keras.Input((6, 3)), layers.GaussianNoise(0.1, name="noise"),
        layers.LSTM(4, return_sequences=True, name="encoder"), layers.Dropout(0.2, name="dropout"),
        layers.SpatialDropout1D(0.2, name="spatial"), layers.GaussianDropout(0.1, name="gaussian_dropout"),
        layers.AlphaDropout(0.1, name="alpha_dropout"), layers.ActivityRegularization(l2=0.01, name="reg"),
        layers.Identity(name="identity"), layers.Dense(2, name="head")])


def group_norm_features() -> keras.Model:
    """GroupNormalization once the time axis is gone: per sample and group of channels."""
    return keras.Sequential([keras.Input((5, 3)), layers.LSTM(4, name="encoder"),
                             layers.GroupNormalization(groups=2, name="groups"),
                             layers.Dense(2, name="head")])


def branching() -> keras.Model:
    """Refused: the encoder's output feeds two layers."""
    x = keras.Input((5, 3))
    y = layers.LSTM(4, return_sequences=True, name="encoder")(x)
    a, b = layers.Dense(2, name="left")(y), layers.Dense(2, name="right")(y)
    return keras.Model(x, layers.Add(name="sum")([a, b]))


def masking() -> keras.Model:
    """Refused: Masking changes what the LSTM computes."""
    return keras.Sequential([keras.Input((5, 3)), layers.Masking(0.0, name="mask"),
                             layers.LSTM(4, name="encoder")])


def gru() -> keras.Model:
    """Refused: no GRU in bnnsfw."""
    return keras.Sequential([keras.Input((5, 3)), layers.GRU(4, name="recurrent")])


def group_norm_sequence() -> keras.Model:
    """Refused: Keras's group norm on (N, T, C) takes statistics over the whole sequence."""
    return keras.Sequential([keras.Input((5, 3)), layers.LSTM(4, return_sequences=True, name="encoder"),
                             layers.GroupNormalization(groups=2, name="groups")])


MODELS = {"sequential_softmax": sequential_softmax, "any_length_stacked": any_length_stacked,
          "sequence_norm_relu": sequence_norm_relu, "bidirectional_final": bidirectional_final,
          "functional_linear": functional_linear, "pass_through": pass_through,
          "group_norm_features": group_norm_features}
REFUSED = {"branching": branching, "masking": masking, "gru": gru, "group_norm_sequence": group_norm_sequence}


def randomize(model: keras.Model, rng: np.random.Generator) -> None:
    """Weights drawn uniformly in [-0.5, 0.5): non-zero biases; positive moving variances."""
    for weight in model.weights:
        values = rng.uniform(-0.5, 0.5, weight.shape)
        if "variance" in weight.path:
            values = rng.uniform(0.5, 2.0, weight.shape)
        weight.assign(values.astype(np.float32))


def deflate(path: pathlib.Path) -> None:
    """Keras stores the archive's members uncompressed; deflated, a model is a few KB."""
    with zipfile.ZipFile(path) as archive:
        members = [(info.filename, archive.read(info.filename)) for info in archive.infolist()]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for filename, data in members:
            archive.writestr(filename, data)
    path.write_bytes(buffer.getvalue())


def main() -> None:
    rng = np.random.default_rng(20261206)
    keras.utils.set_random_seed(0)
    predictions: dict[str, np.ndarray] = {}
    for name, make in {**MODELS, **REFUSED}.items():
        model = make()
        randomize(model, rng)
        model.save(HERE / f"{name}.keras")
        deflate(HERE / f"{name}.keras")
        if name in MODELS:
            steps = model.input_shape[1] or 4  # Input((None, F)): a length of our choosing
            x = rng.standard_normal((2, steps, model.input_shape[2])).astype(np.float32)
            predictions[f"{name}/x"] = x
            predictions[f"{name}/y"] = model.predict(x, verbose=0)
            if model.input_shape[1] is None:
                longer = rng.standard_normal((3, 9, model.input_shape[2])).astype(np.float32)
                predictions[f"{name}/x_longer"] = longer
                predictions[f"{name}/y_longer"] = model.predict(longer, verbose=0)
    for name in MODELS:  # the deflated files load in Keras and predict the same
        again = keras.models.load_model(HERE / f"{name}.keras")
        np.testing.assert_array_equal(again.predict(predictions[f"{name}/x"], verbose=0),
                                      predictions[f"{name}/y"])
    np.savez_compressed(HERE / "predictions.npz", **predictions)
    print(f"Keras {keras.__version__} ({keras.backend.backend()}): wrote {len(MODELS) + len(REFUSED)} models")


if __name__ == "__main__":
    main()

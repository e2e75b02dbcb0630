"""Family 7: weight files. ``load_weights`` reads untrusted files.

Each example saves a real model, then damages the file — random bytes, truncation, an empty
or ``.npy`` file, flipped bytes, metadata that is not JSON, nested too deeply, missing keys,
unknown types, values of other types, arrays of other shapes and dtypes, pickled objects, an
array header declaring terabytes — and checks that ``load_weights`` either refuses it with a
bnnsfw error naming the file, or (when the damage changed nothing that matters) rebuilds
layers that compute exactly what the saved ones did.
"""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile._hostile import HOSTILE, answered, attempt, refused, wrong
from hypothesis import given, settings
from hypothesis import strategies as st

import bnnsfw as bf
from bnnsfw.serialization import load_weights, save_weights

X = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)


def model() -> dict[str, Any]:
    return {
        "lstm": bf.LSTMLayer(bf.LSTMParameters.random(input_size=4, hidden_size=3, seed=1,
                                                      peepholes="diagonal")),
        "norm": bf.NormalizationLayer(bf.NormalizationParameters(
            type=bf.NormalizationType.batch(moving_mean=np.zeros(3), moving_variance=np.ones(3)),
            input_shape=(3,), momentum=0.5)),
        "head": bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=3, output_size=2,
                                                                          seed=2)),
    }


def predict(layers: dict[str, Any]) -> np.ndarray:
    h = layers["lstm"].apply(X).output[-1]
    return layers["head"].apply(layers["norm"].apply(h, phase="inference"))


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def write_members(path: Path, entries: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> None:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def meta_of(entries: dict[str, bytes]) -> dict[str, Any]:
    return json.loads(str(np.load(io.BytesIO(entries["__meta__.npy"]))))


HOSTILE_VALUES = ["abc", -1, 0, 1e308, float("nan"), None, [], {}, [[1, 2], [3]], True, 2**70, "float16",
                  [1.5, "x", None]]

DAMAGE = ["random bytes", "truncated", "empty", "npy file", "flipped byte", "not json", "deep json",
          "json list", "no format", "other format", "layers not object", "layer not object", "no type",
          "unknown type", "missing key", "extra key", "hostile value", "array shape", "array dtype",
          "complex array", "pickled array", "missing array", "extra array", "terabyte header",
          "member not npy", "no meta", "meta not text", "deflated", "nothing"]


@settings(HOSTILE, max_examples=150)
@given(damage=st.sampled_from(DAMAGE), data=st.data())
def test_load_weights_on_damaged_files(tmp_path_factory: pytest.TempPathFactory, damage: str,
                                       data: st.DataObject) -> None:
    path = tmp_path_factory.mktemp("weights") / "model.npz"
    original = model()
    save_weights(path, original)
    expected = predict(original)
    raw = path.read_bytes()
    entries = members(path)
    meta = meta_of(entries)
    layer = data.draw(st.sampled_from(sorted(meta["layers"])), label="layer")
    arrays = [name for name in entries if name.startswith(f"{layer}/")]

    def set_meta(value: Any) -> None:
        text = value if isinstance(value, str) else json.dumps(value)
        entries["__meta__.npy"] = npy(np.array(text))
        write_members(path, entries)

    if damage == "random bytes":
        path.write_bytes(bytes(data.draw(st.binary(min_size=1, max_size=2048), label="bytes")))
    elif damage == "truncated":
        path.write_bytes(raw[:data.draw(st.integers(1, len(raw) - 1), label="cut")])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "npy file":
        np.save(path.with_suffix(".npy"), np.zeros(3))
        path.with_suffix(".npy").rename(path)
    elif damage == "flipped byte":
        position = data.draw(st.integers(0, len(raw) - 1), label="position")
        path.write_bytes(raw[:position] + bytes([raw[position] ^ 0xFF]) + raw[position + 1:])
    elif damage == "not json":
        set_meta("{'format': bnnsfw")
    elif damage == "deep json":
        set_meta("[" * 200_000 + "]" * 200_000)
    elif damage == "json list":
        set_meta([1, 2, 3])
    elif damage == "no format":
        meta.pop("format")
        set_meta(meta)
    elif damage == "other format":
        meta["format"] = data.draw(st.sampled_from(["bnnsfw-weights-9", None, 1, ["x"]]), label="format")
        set_meta(meta)
    elif damage == "layers not object":
        meta["layers"] = data.draw(st.sampled_from([[], "lstm", None, 3, {}]), label="layers")
        set_meta(meta)
    elif damage == "layer not object":
        meta["layers"][layer] = data.draw(st.sampled_from([[], "lstm", None, 3]), label="entry")
        set_meta(meta)
    elif damage == "no type":
        meta["layers"][layer].pop("type")
        set_meta(meta)
    elif damage == "unknown type":
        meta["layers"][layer]["type"] = data.draw(st.sampled_from(["gru", "", None, 7, "LSTM"]), label="type")
        set_meta(meta)
    elif damage == "missing key":
        keys = sorted(k for k in meta["layers"][layer] if k != "type")
        key = data.draw(st.sampled_from(keys), label="key")
        optional = meta["layers"][layer].pop(key) is None and "/" in key  # an absent array: None either way
        set_meta(meta)
    elif damage == "extra key":
        meta["layers"][layer]["hidden_sise"] = 3
        set_meta(meta)
    elif damage == "hostile value":
        keys = sorted(k for k in meta["layers"][layer] if k != "type")
        key = data.draw(st.sampled_from(keys), label="key")
        value = data.draw(st.sampled_from(HOSTILE_VALUES), label="value")
        if meta["layers"][layer][key] == value:
            value = "abc"
        meta["layers"][layer][key] = value
        written = (layer, key, value)
        set_meta(json.dumps(meta, allow_nan=True))
    elif damage in ("array shape", "array dtype", "complex array", "pickled array"):
        name = data.draw(st.sampled_from(sorted(arrays)), label="array")
        array = np.load(io.BytesIO(entries[name]))
        replacements = {
            "array shape": lambda: np.zeros(array.size + 1, array.dtype),
            "array dtype": lambda: array.astype(np.int8) if array.dtype.kind == "f" else array.astype("U3"),
            "complex array": lambda: array.astype(np.complex64),
            "pickled array": lambda: np.array([{"a": 1}] * max(1, array.size), dtype=object),
        }
        entries[name] = npy(replacements[damage]())
        write_members(path, entries)
    elif damage == "missing array":  # an optional array left out reads as absent (the first layout did that)
        dropped = data.draw(st.sampled_from(sorted(arrays)), label="array")
        entries.pop(dropped)
        write_members(path, entries)
    elif damage == "extra array":
        entries[f"{layer}/bais.npy"] = npy(np.zeros(3, np.float32))
        write_members(path, entries)
    elif damage == "terabyte header":
        name = data.draw(st.sampled_from(sorted(entries)), label="member")
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (2**38, 2**3)})
        entries[name] = header.getvalue() + b"\0" * 64
        write_members(path, entries)
    elif damage == "member not npy":
        entries["README.txt"] = b"hello"
        write_members(path, entries)
    elif damage == "no meta":
        entries.pop("__meta__.npy")
        write_members(path, entries)
    elif damage == "meta not text":
        entries["__meta__.npy"] = npy(np.arange(3.0))
        write_members(path, entries)
    elif damage == "deflated":  # an archive written with compression: as good as a stored one
        write_members(path, entries, zipfile.ZIP_DEFLATED)
    tracemalloc.start()
    try:
        ok, result = attempt("weights", load_weights, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if peak > 64 * 2**20:
        raise wrong("weights", f"{damage}: {peak} bytes allocated reading a {path.stat().st_size}-byte file")
    if not ok:
        if str(path) not in str(result):
            raise wrong("weights", f"{damage}: the error does not name the file: {result}")
        return
    if damage == "hostile value":  # a valid value, then: the layer must hold what the file says
        name, key, value = written
        held = result[name].layer_parameters.to_state().get(key, "absent")
        if not (held == value or (isinstance(held, list) and list(held) == value)):
            raise wrong("weights", f"{name}.{key} = {value!r} in the file was loaded as {held!r}")
        answered("weights")
        return
    if damage == "missing array":
        name, key = dropped[:-4].split("/", 1)
        if result[name].layer_parameters.to_state()[key] is not None:
            raise wrong("weights", f"{dropped} left out of the file but {key} loaded")
        answered("weights")
        return
    if damage not in ("deflated", "nothing", "flipped byte") and not (damage == "missing key" and optional):
        raise wrong("weights", f"{damage}: accepted")
    if not np.array_equal(predict(result), expected):
        raise wrong("weights", f"{damage}: the loaded layers compute something else")
    answered("weights")



#: A checkpoint's entries beside the layers, and what an optimizer or a schedule given to
#: load_weights holds of each when the file's value is accepted (None: nothing to check).
CHECKPOINT_KEYS = {
    ("optimizer", "learning_rate"): lambda t: t["optimizer"].learning_rate,
    ("optimizer", "step_count"): lambda t: t["optimizer"].step_count,
    ("optimizer", "type"): None, ("optimizer", "class"): None, ("optimizer", "shapes"): None,
    ("optimizer", "parameter_names"): None, ("optimizer", "hyperparameters"): None,
    ("schedule", "epoch"): lambda t: t["schedule"].epoch,
    ("schedule", "base_learning_rate"): lambda t: t["schedule"].base_learning_rate,
    ("schedule", "type"): None, ("schedule", "class"): None,
    ("random", "lstm"): None, ("random", "dropout_generator"): None,
}


def checkpoint_objects() -> dict[str, Any]:
    optimizer = bf.optimizers.Adam(lr=0.01)
    return {"optimizer": optimizer, "schedule": bf.StepDecay(optimizer, step_size=2)}


@settings(HOSTILE, max_examples=60)
@given(key=st.sampled_from(sorted(CHECKPOINT_KEYS)), value=st.sampled_from(HOSTILE_VALUES))
def test_load_weights_on_damaged_checkpoints(tmp_path_factory: pytest.TempPathFactory, key: tuple[str, str],
                                             value: Any) -> None:
    """A checkpoint's optimizer, schedule or random-generator entry given a value of another
    type or range: refused naming the file, with nothing restored, or (for a valid value)
    restored as the file says."""
    path = tmp_path_factory.mktemp("checkpoint") / "model.npz"
    layers, training = model(), checkpoint_objects()
    parameters = {f"{name}.{k}": a for name, layer in layers.items() for k, a in layer.parameters().items()}
    training["optimizer"].step(parameters, {k: np.ones_like(a) for k, a in parameters.items()})
    training["schedule"].step()
    save_weights(path, layers, training=training)
    entries = members(path)
    meta = meta_of(entries)
    entry, field = key
    if entry == "random":
        target = meta["random"] if field == "lstm" else meta["random"]["lstm"]
        target[field] = value
    else:
        if meta["training"][entry].get(field) == value:
            value = "abc"
        meta["training"][entry][field] = value
    entries["__meta__.npy"] = npy(np.array(json.dumps(meta, allow_nan=True)))
    write_members(path, entries)
    fresh = checkpoint_objects()
    # The schedule, restored after the optimizer, sets the learning rate of its epoch.
    requested = {entry: fresh[entry]} if entry != "random" else fresh
    ok, result = attempt("weights", load_weights, path, training=requested)
    if not ok:
        if str(path) not in str(result):
            raise wrong("weights", f"{key}: the error does not name the file: {result}")
        if fresh["optimizer"].step_count or fresh["schedule"].epoch:
            raise wrong("weights", f"{key}: refused after restoring a state")
        return
    held = CHECKPOINT_KEYS[key]
    if held is None and not (key == ("optimizer", "hyperparameters") and isinstance(value, dict)):
        raise wrong("weights", f"{key} = {value!r}: accepted")
    if held is not None and held(fresh) != value:
        raise wrong("weights", f"{key} = {value!r} in the file was loaded as {held(fresh)!r}")
    answered("weights")


SIZES = [("lstm", "input_size"), ("lstm", "hidden_size"), ("lstm", "num_layers"), ("norm", "input_shape"),
         ("head", "input_size"), ("head", "output_size")]


@pytest.mark.parametrize("arrays", ["kept", "dropped"])
@pytest.mark.parametrize("layer, key", SIZES, ids=[f"{layer}.{key}" for layer, key in SIZES])
def test_declared_sizes_of_terabytes(tmp_path: Path, layer: str, key: str, arrays: str) -> None:
    """A size the metadata declares, set to 2**40 (with the layer's optional arrays kept or
    left out): refused, naming the file and the layer, with no more memory than the file needs."""
    path = tmp_path / "model.npz"
    save_weights(path, model())
    entries = members(path)
    meta = meta_of(entries)
    meta["layers"][layer][key] = [2**20, 2**20] if key == "input_shape" else 2**40
    if arrays == "dropped":  # the arrays nothing requires: a normalization's, a bias
        for name in [n for n in entries if n.startswith(f"{layer}/") and not n.endswith(("weights0.npy",
                                                                                         "hidden_weights.npy",
                                                                                         "/weights.npy"))]:
            entries.pop(name)
    entries["__meta__.npy"] = npy(np.array(json.dumps(meta)))
    write_members(path, entries)
    tracemalloc.start()
    try:
        error = refused("weights", load_weights, path, match=f"layer '{layer}'")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if str(path) not in str(error):
        raise wrong("weights", f"the error does not name the file: {error}")
    if peak > 64 * 2**20:
        size = path.stat().st_size
        raise wrong("weights", f"{layer}.{key}: {peak} bytes allocated reading a {size}-byte file")


@pytest.mark.parametrize("path", [3, None, b"\xff.npz", ["a.npz"]], ids=["int", "none", "bytes", "list"])
def test_load_weights_path_types(path: object) -> None:
    refused("weights", load_weights, path, match="load_weights\\(path\\)")

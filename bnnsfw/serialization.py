"""Saving and loading a model's layers as one safetensors (or ``.npz``) file.

``save_weights(path, {"lstm": lstm, "norm": norm, "head": head})`` writes every layer's
configuration (as JSON) and arrays — LSTM gate descriptors, normalization gamma/beta and
moving statistics, fully connected weights and bias — and ``load_weights(path)`` rebuilds
the same layers, which then compute exactly what the saved ones computed.

What a layer holds is its parameter object's plain state (``to_state()`` /
``from_state()``); this module only lays that state out in the file. For a layer named
``name``, each array of the state is the entry ``name/<key>`` and every other value goes
into the JSON metadata, beside the layer's ``type``. A path ending in ``.npz`` gets a NumPy
archive with that JSON in its ``__meta__`` entry; any other path a safetensors file with it in
the header (:mod:`bnnsfw._safetensors`). :func:`load_weights` reads both, whatever the name.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from typing import Any, Mapping, NoReturn

import numpy as np

from . import _safetensors
from .errors import BNNSError, InvalidParameterError, must_be
from .filter import Filter, FilterParameters
from .layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
from .layers.lstm import LSTMLayer, LSTMParameters
from .layers.normalization import NormalizationLayer, NormalizationParameters

__all__ = ["save_weights", "load_weights"]

_FORMAT = "bnnsfw-weights-1"

#: The layers a file holds, by the ``type`` written for them: (layer class, parameter class).
_LAYER_TYPES: dict[str, tuple[type[Any], type[Any]]] = {
    "lstm": (LSTMLayer, LSTMParameters),
    "normalization": (NormalizationLayer, NormalizationParameters),
    "fully_connected": (FullyConnectedLayer, FullyConnectedParameters),
}


def _type_names() -> str:
    """``"lstm, normalization or fully_connected"``, for messages."""
    names = list(_LAYER_TYPES)
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _live_state(name: str, layer: Filter) -> tuple[str, dict[str, Any]]:
    """The layer's type name and state, holding the arrays the layer computes with now.

    A layer that copied its arrays at creation (the default, without client pointers) trains
    those copies, and exposes them as properties named like the state's entries
    (``NormalizationLayer.gamma``, ``FullyConnectedLayer.weights`` …): those are saved.
    """
    for type_name, (layer_class, _) in _LAYER_TYPES.items():
        if isinstance(layer, layer_class):
            state: dict[str, Any] = layer.parameters.to_state()
            for key, value in state.items():
                live = getattr(layer_class, key, None)
                if (value is None or isinstance(value, np.ndarray)) and isinstance(live, property):
                    array = getattr(layer, key)
                    if isinstance(array, np.ndarray):
                        state[key] = array
            return type_name, state
    classes = ", ".join(layer_class.__name__ for layer_class, _ in _LAYER_TYPES.values())
    where = f"save_weights(layers[{name!r}])"
    raise InvalidParameterError(must_be(where, f"one of {classes}", type(layer).__name__))


def save_weights(path: str | os.PathLike[str], layers: Mapping[str, Filter]) -> None:
    """Write ``layers`` (name → open layer) to ``path``: a safetensors file, or a NumPy
    ``.npz`` archive when the name ends in ``.npz``."""
    if not layers:
        rule = "a non-empty mapping of name to layer"
        raise InvalidParameterError(must_be("save_weights(layers)", rule, layers))
    arrays: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for name, layer in layers.items():
        if not isinstance(name, str) or not name or "/" in name:
            rule = "non-empty names without '/'"
            raise InvalidParameterError(must_be("save_weights(layers) keys", rule, name))
        if not isinstance(layer, Filter):
            raise InvalidParameterError(must_be(f"save_weights(layers[{name!r}])", "a bnnsfw layer",
                                                type(layer).__name__))
        layer.check_open("save_weights")
        type_name, state = _live_state(name, layer)
        meta[name] = {"type": type_name}
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                arrays[f"{name}/{key}"] = value
            else:
                meta[name][key] = value
    if not os.fspath(path).endswith(".npz"):
        _safetensors.write(path, arrays, {"format": _FORMAT, "layers": meta})
        return
    arrays["__meta__"] = np.array(json.dumps({"format": _FORMAT, "layers": meta}))
    np.savez(path, **arrays)


def _build(name: str, meta: dict[str, Any], data: Any, fp: FilterParameters | None) -> Filter:
    """Rebuild the layer ``name`` from its JSON entry and its arrays."""
    state = dict(meta)
    type_name = state.pop("type", None)
    if type_name not in _LAYER_TYPES:
        raise InvalidParameterError(must_be("type", _type_names(), type_name))
    prefix = f"{name}/"
    state.update({key[len(prefix):]: data[key] for key in data.files if key.startswith(prefix)})
    layer_class, parameters_class = _LAYER_TYPES[type_name]
    layer: Filter = layer_class(parameters_class.from_state(state), fp)
    return layer


#: The most JSON metadata a weights file may carry (a real file's is a few kilobytes).
_MAX_META_BYTES = 16 * 1024 * 1024
#: DEFLATE expands at most about 1032-fold: a member declaring more than that over its
#: compressed size does not hold what it declares.
_MAX_EXPANSION = 1100


class _Refusal(InvalidParameterError):
    """load_weights refusing a file: the message names the file and the problem."""


def _refuse(where: str, rule: str, got: object) -> NoReturn:
    raise _Refusal(must_be(where, rule, got))


def _check_archive(where: str, path: str | os.PathLike[str]) -> dict[str, np.dtype]:
    """Refuse, before NumPy reads any array, what is not an archive of sound ``.npy`` members.

    Each member's header is read (a few hundred bytes) and must describe numbers (no pickled
    objects) whose size is exactly the data the member holds, and the member's sizes must be
    ones the file can hold: a header declaring terabytes is refused before any allocation.
    Returns each array's dtype, by entry name.
    """
    size = os.path.getsize(path)
    if size == 0:
        _refuse(where, "a weights file written by save_weights", "an empty file")
    with open(path, "rb") as handle:
        magic = handle.read(6)
    if magic == b"\x93NUMPY":
        _refuse(where, "a weights file written by save_weights (an .npz archive)", "an .npy file (one array)")
    if not zipfile.is_zipfile(path):
        _refuse(where, "a weights file written by save_weights (an .npz archive)", "a file that is not one")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            return {info.filename[:-4]: _check_member(where, archive, info, size) for info in infos}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, NotImplementedError, ValueError,
            RuntimeError) as error:
        if isinstance(error, _Refusal):
            raise
        _refuse(where, "a readable .npz archive", f"a damaged one ({type(error).__name__}: {error})")


def _check_member(where: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int) -> np.dtype:
    name = info.filename
    if not name.endswith(".npy"):
        _refuse(where, "an archive of .npy arrays", f"a member named {name!r}")
    if info.compress_size > size or info.file_size > info.compress_size * _MAX_EXPANSION + 4096 or (
            info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size):
        _refuse(where, f"member sizes the file can hold ({size} bytes)",
                f"{name!r} declaring {info.file_size} bytes ({info.compress_size} compressed)")
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                _refuse(where, "arrays in .npy format 1.0 or 2.0", f"{name!r} in format {version}")
        except ValueError as error:
            if isinstance(error, _Refusal):
                raise
            _refuse(where, "arrays with valid .npy headers", f"{name!r}: {error}")
        header = member.tell()
    if dtype.hasobject or dtype.kind not in "biufU":
        _refuse(where, "arrays of numbers (and the text of __meta__)", f"{name!r} of dtype {dtype}")
    declared = math.prod(shape) * dtype.itemsize
    if declared != info.file_size - header:
        _refuse(where, "arrays holding the data their header declares",
                f"{name!r} declaring {declared} bytes and holding {info.file_size - header}")
    if name == "__meta__.npy" and (dtype.kind != "U" or shape != () or declared > _MAX_META_BYTES):
        _refuse(where, f"a __meta__ entry of JSON text (at most {_MAX_META_BYTES} bytes)",
                f"one of dtype {dtype}, shape {shape}, {declared} bytes")
    return np.dtype(dtype)


def _metadata(where: str, data: Any) -> dict[str, Any]:
    """The layers of an ``.npz`` file's ``__meta__`` entry (:func:`_layers`)."""
    if "__meta__" not in data.files:
        _refuse(where, "a file written by save_weights", "no __meta__ entry")
    return _layers(where, parse_metadata(where, str(data["__meta__"])))


def parse_metadata(where: str, text: str) -> Any:
    """The JSON of a weights file's metadata, refused with a clear error when it is not JSON or
    is nested too deeply to read."""
    try:
        return json.loads(text)
    except RecursionError:
        _refuse(where, "metadata of the JSON save_weights writes", "JSON nested too deeply to read")
    except ValueError as error:
        _refuse(where, "metadata of valid JSON", f"invalid JSON ({error})")


def _layers(where: str, meta: Any) -> dict[str, Any]:
    """The ``layers`` object of a weights file's metadata, checked: its format, and a JSON
    object per layer."""
    if not isinstance(meta, dict):
        _refuse(where, "metadata that is a JSON object", type(meta).__name__)
    if meta.get("format") != _FORMAT:
        _refuse(f"{where}: format", _FORMAT, meta.get("format"))
    layers = meta.get("layers")
    if not isinstance(layers, dict) or not layers:
        _refuse(f"{where}: layers", "a non-empty JSON object of layer name to layer", layers)
    for name, entry in layers.items():
        if not isinstance(entry, dict):
            _refuse(f"{where}: layer {name!r}", "a JSON object", type(entry).__name__)
    return layers


def load_weights(path: str | os.PathLike[str],
                 filter_parameters: FilterParameters | None = None) -> dict[str, Filter]:
    """Rebuild the layers saved by :func:`save_weights` (name → new open layer), from either
    form it writes (safetensors, or ``.npz``), whatever the file is called.

    The file is untrusted input: anything but a sound file written by :func:`save_weights`
    raises a bnnsfw error naming the file and the problem — random bytes, an empty, truncated
    or damaged file, an ``.npy`` file, arrays whose header declares more data than they
    hold (checked before anything is allocated), pickled objects, metadata that is not JSON or
    is nested too deeply, missing or unexpected keys, unknown layer types, invalid values.
    A path that does not exist raises ``FileNotFoundError``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidParameterError(must_be("load_weights(path)", "a file path (str or os.PathLike)",
                                            type(path).__name__))
    where = f"load_weights({os.fspath(path)!r})"
    if _safetensors.is_safetensors(path):
        arrays, meta = _safetensors.read(path)
        return _rebuild(where, _layers(where, meta), arrays, {key: a.dtype for key, a in arrays.items()},
                        filter_parameters)
    dtypes = _check_archive(where, path)
    try:
        with np.load(path, allow_pickle=False) as data:
            return _rebuild(where, _metadata(where, data), data, dtypes, filter_parameters)
    except (zipfile.BadZipFile, EOFError, zlib.error) as error:  # damaged after the check
        _refuse(where, "a readable .npz archive", f"a damaged one ({type(error).__name__}: {error})")


def _rebuild(where: str, layers: dict[str, Any], data: Any, dtypes: Mapping[str, np.dtype],
             fp: FilterParameters | None) -> dict[str, Filter]:
    """Every layer of the file's metadata, built from its arrays; each array must be floats of
    the layer's dtype, and any problem names the file and the layer."""
    loaded: dict[str, Filter] = {}
    for name, entry in layers.items():
        declared = entry.get("dtype") if entry.get("dtype") in ("float32", "float64") else None
        for key, dtype in dtypes.items():
            if key.startswith(f"{name}/") and (dtype.kind != "f" or (declared and dtype != declared)):
                _refuse(f"{where}: {key}", f"an array of {declared or 'floats'} (the layer's dtype)",
                        str(dtype))
        try:
            loaded[name] = _build(name, entry, data, fp)
        except BNNSError as error:
            raise type(error)(f"{where}: layer {name!r}: {error}") from error
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as error:
            rule = "a layer state as save_weights writes it"
            raise _Refusal(must_be(f"{where}: layer {name!r}", rule,
                                   f"{type(error).__name__}: {error}")) from error
    return loaded

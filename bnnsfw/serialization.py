"""Saving and loading a model's layers as one safetensors (or ``.npz``) file.

``save_weights(path, model)`` writes every layer's configuration (as JSON) and arrays — LSTM
gate descriptors, normalization gamma/beta and moving statistics, fully connected weights
and bias — for a model that is one layer, a :class:`~bnnsfw.Sequential`, or a mapping of
name to layer. ``load_weights(path)`` rebuilds the same kind of object, whose layers then
compute exactly what the saved ones computed; ``load_weights(path, into=model)`` instead
copies the saved arrays into an existing model (strictly, by the names of ``state_dict()``),
whose configuration must be the file's but for the fields named in ``ignore=``.
Both read and write :func:`weights_path` of the path they are given, so what
``save_weights(p, …)`` writes is what ``load_weights(p)`` reads.

What a layer holds is its parameter object's plain state (``to_state()`` /
``from_state()``); this module only lays that state out in the file. For a layer named
``name``, each array of the state is the entry ``name/<key>`` and every other value goes
into the JSON metadata, beside the layer's ``type``. A path ending in ``.npz`` (or an open
binary file) gets a NumPy archive with that JSON in its ``__meta__`` entry; any other a
safetensors file with it in the header (:mod:`bnnsfw._safetensors`). :func:`load_weights`
reads both, whatever the name, and treats every file as untrusted input.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from typing import IO, Any, Collection, Mapping, NoReturn, Union

import numpy as np

from . import _safetensors
from ._validation import positive_int
from .activation import Activation
from .errors import BNNSError, InvalidParameterError, must_be
from .filter import Filter, FilterParameters, load_named_state
from .layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
from .layers.lstm import LSTMLayer, LSTMParameters
from .layers.normalization import NormalizationLayer, NormalizationParameters
from .sequential import FinalState, LastStep, Sequential, Softmax

__all__ = ["save_weights", "load_weights", "weights_path", "MAX_ELEMENTS"]

#: What :func:`save_weights` takes and :func:`load_weights` gives back.
Model = Union[Filter, Sequential, Mapping[str, Filter]]
PathLike = Union[str, "os.PathLike[str]"]

_FORMAT = "bnnsfw-weights-1"
#: The file name endings of the two forms; a path without either gets the first.
_SUFFIXES = (".safetensors", ".npz")

#: The layers a file holds, by the ``type`` written for them: (layer class, parameter class).
_LAYER_TYPES: dict[str, tuple[type[Any], type[Any]]] = {
    "lstm": (LSTMLayer, LSTMParameters),
    "normalization": (NormalizationLayer, NormalizationParameters),
    "fully_connected": (FullyConnectedLayer, FullyConnectedParameters),
}

#: The configuration of each layer type: the entries of its parameters' ``to_state()`` that are
#: not arrays (the variants of an LSTM included, which its state leaves out at their defaults).
#: ``load_weights(into=)`` compares them, and these are the names its ``ignore=`` takes.
_CONFIGURATION: dict[str, tuple[str, ...]] = {
    "lstm": ("input_size", "hidden_size", "num_layers", "bidirectional", "batch_first", "dropout",
             "default_activations", "hidden_activation", "dtype", "gate_activations", "reverse",
             "input_forget", "clip", "cell_clip", "projection_clip", "projection_size",
             "direction_activations", "layer_norm/epsilon"),
    "normalization": ("kind", "input_shape", "normalization_axis", "group_count", "root_mean_square",
                      "momentum", "epsilon", "activation", "dtype"),
    "fully_connected": ("input_size", "output_size", "activation", "dtype"),
}
#: State entries that are neither arrays nor configuration: an LSTM's seed chooses its random
#: draws (dropout masks), not what it computes, and a fresh model has its own.
_NOT_CONFIGURATION = ("seed",)

#: What a file holds, by the ``kind`` its metadata records (files without one hold a mapping).
_KINDS = ("layers", "layer", "sequential")
_LAST_STEP = "last_step"
_FINAL_STATE = "final_state"  # with its num_directions
_SOFTMAX = "softmax"


def weights_path(path: PathLike) -> str:
    """The file :func:`save_weights` writes and :func:`load_weights` reads for ``path``.

    ``path`` itself when it ends in ``.safetensors`` or ``.npz`` (the form is then the one its
    name says), else ``path + ".safetensors"`` — applied by both functions, so
    ``save_weights("model", …)`` writes ``model.safetensors`` and ``load_weights("model")``
    reads it (or, for files an earlier version wrote, ``model.npz`` when only that exists).

    >>> weights_path("runs/model"), weights_path("model.npz")
    ('runs/model.safetensors', 'model.npz')
    """
    text = os.fspath(path)
    return text if text.endswith(_SUFFIXES) else text + _SUFFIXES[0]


def _readable_path(path: PathLike) -> str:
    """The file :func:`load_weights` reads: :func:`weights_path`, or for a bare name whose
    ``.safetensors`` file does not exist, the ``.npz`` one an earlier version wrote."""
    text = weights_path(path)
    legacy = os.fspath(path) + ".npz"
    if text != os.fspath(path) and not os.path.exists(text) and os.path.exists(legacy):
        return legacy
    return text


def _elements(model: object) -> tuple[str, dict[str, Any]]:
    """The kind of ``model`` and its elements by name (checked: open layers, usable names)."""
    if isinstance(model, Sequential):
        model.check_open("save_weights")
        return "sequential", dict(model.layers)
    if isinstance(model, Filter):
        return "layer", {"layer": model}
    if not isinstance(model, Mapping):
        rule = "a layer, a Sequential or a mapping of name to layer"
        raise InvalidParameterError(must_be("save_weights(model)", rule, type(model).__name__))
    if not model:
        rule = "a non-empty mapping of name to layer"
        raise InvalidParameterError(must_be("save_weights(layers)", rule, model))
    for name, layer in model.items():
        if not isinstance(name, str) or not name or "/" in name:
            rule = "non-empty names without '/'"
            raise InvalidParameterError(must_be("save_weights(layers) keys", rule, name))
        if not isinstance(layer, Filter):
            raise InvalidParameterError(must_be(f"save_weights(layers[{name!r}])", "a bnnsfw layer",
                                                type(layer).__name__))
    return "layers", dict(model)


def _type_names() -> str:
    """``"lstm, normalization or fully_connected"``, for messages."""
    names = list(_LAYER_TYPES)
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _live_state(name: str, layer: Filter) -> tuple[str, dict[str, Any]]:
    """The layer's type name and state, holding the arrays the layer computes with now
    (``layer_parameters`` holds the live arrays, whatever the filter parameters)."""
    for type_name, (layer_class, _) in _LAYER_TYPES.items():
        if isinstance(layer, layer_class):
            state: dict[str, Any] = layer.layer_parameters.to_state()
            return type_name, state
    classes = ", ".join(layer_class.__name__ for layer_class, _ in _LAYER_TYPES.values())
    where = f"save_weights(layers[{name!r}])"
    raise InvalidParameterError(must_be(where, f"one of {classes}", type(layer).__name__))


def save_weights(path: PathLike | IO[bytes], model: Model) -> None:
    """Write ``model`` to the file :func:`weights_path` gives for ``path``.

    Parameters
    ----------
    path : str, path-like or binary file
        ``.safetensors`` is appended when the name ends in neither ``.safetensors`` nor
        ``.npz`` (:func:`weights_path`); a name ending in ``.npz`` gets a NumPy archive, as
        does an open binary file (written as it is).
    model : layer, Sequential, or mapping of name to layer
        Open layers. :func:`load_weights` gives back the same kind of object.
    """
    kind, layers = _elements(model)
    arrays: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for name, layer in layers.items():
        if isinstance(layer, LastStep):
            meta[name] = {"type": _LAST_STEP}
            continue
        if isinstance(layer, FinalState):
            meta[name] = {"type": _FINAL_STATE, "num_directions": layer.num_directions}
            continue
        if isinstance(layer, Softmax):
            meta[name] = {"type": _SOFTMAX}
            continue
        layer.check_open("save_weights")
        type_name, state = _live_state(name, layer)
        meta[name] = {"type": type_name}
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                arrays[f"{name}/{key}"] = value
            else:
                meta[name][key] = value
    header = json.dumps({"format": _FORMAT, "kind": kind, "layers": meta})
    if isinstance(path, (str, os.PathLike)) and not weights_path(path).endswith(".npz"):
        _safetensors.write(weights_path(path), arrays, header)
        return
    arrays["__meta__"] = np.array(header)
    np.savez(weights_path(path) if isinstance(path, (str, os.PathLike)) else path, **arrays)


def _build(name: str, meta: dict[str, Any], data: Any, fp: FilterParameters | None,
           budget: _Budget) -> Filter | LastStep | FinalState | Softmax:
    """Rebuild the layer ``name`` from its JSON entry and its arrays."""
    state = dict(meta)
    type_name = state.pop("type", None)
    if type_name == _LAST_STEP:
        return LastStep()
    if type_name == _FINAL_STATE:
        return FinalState(state["num_directions"])
    if type_name == _SOFTMAX:
        return Softmax()
    if type_name not in _LAYER_TYPES:
        raise InvalidParameterError(must_be("type", _type_names(), type_name))
    prefix = f"{name}/"
    state.update({key[len(prefix):]: data[key] for key in data.files if key.startswith(prefix)})
    layer_class, parameters_class = _LAYER_TYPES[type_name]
    parameters = parameters_class.from_state(state)
    budget.take(parameters)
    layer: Filter = layer_class(parameters, fp)
    return layer


class _Budget:
    """The elements that the shapes a file declares and no array in it has may hold, together.

    The parameter object has checked every declared size against the arrays that carry it
    (and holds those arrays, whose size the file bounds). An LSTM's and a fully connected
    layer's sizes are all carried by arrays they require. A normalization's ``input_shape``
    is carried by an array only when gamma, beta or a moving statistic has that very shape;
    otherwise nothing in the file confirms it, and a layer without gamma or beta makes them
    (ones, zeros) of a shape taken from it. Those shapes share one budget, so that many
    layers cannot ask together for what one may not.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, parameters: object) -> None:
        """Count the shape of ``parameters`` that no array confirms; refuse it, before the
        layer allocates anything, when it exceeds what is left."""
        if not isinstance(parameters, NormalizationParameters):
            return
        shape = parameters.input_shape
        arrays = (parameters.gamma, parameters.beta, parameters.type.moving_mean,
                  parameters.type.moving_variance)
        if any(array is not None and array.shape == shape for array in arrays):
            return
        elements = math.prod(shape)
        if elements > self.limit - self.used:
            rule = (f"a shape of at most {self.limit - self.used} elements when no array in the file has it "
                    f"(load_weights(max_elements=...) sets the limit, {self.limit}, for all such shapes of "
                    "a file together")
            rule += f"; the layers before it take {self.used})" if self.used else ")"
            raise InvalidParameterError(must_be("input_shape", rule, f"{shape}: {elements} elements"))
        self.used += elements


#: The most JSON metadata a weights file may carry (a real file's is a few kilobytes).
_MAX_META_BYTES = 16 * 1024 * 1024
#: The most elements that the shapes a weights file declares and no array in it has (a
#: normalization's input_shape without gamma or beta) may hold together: 2**28, 1 GiB of float32.
MAX_ELEMENTS = 2**28
#: DEFLATE expands at most about 1032-fold: a member declaring more than that over its
#: compressed size does not hold what it declares.
_MAX_EXPANSION = 1100


class _Refusal(InvalidParameterError):
    """load_weights refusing a file: the message names the file and the problem."""


def _refuse(where: str, rule: str, got: object) -> NoReturn:
    raise _Refusal(must_be(where, rule, got))


def _check_archive(where: str, path: str | IO[bytes]) -> dict[str, np.dtype]:
    """Refuse, before NumPy reads any array, what is not an archive of sound ``.npy`` members.

    Each member's header is read (a few hundred bytes) and must describe numbers (no pickled
    objects) whose size is exactly the data the member holds, and the member's sizes must be
    ones the file can hold: a header declaring terabytes is refused before any allocation.
    Returns each array's dtype, by entry name. ``path`` may be an open binary file, read from
    where it stands and left there.
    """
    if isinstance(path, str):
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            magic = handle.read(6)
    else:
        start = path.tell()
        size = path.seek(0, os.SEEK_END) - start
        path.seek(start)
        magic = path.read(6)
        path.seek(start)
    if size == 0:
        _refuse(where, "a weights file written by save_weights", "an empty file")
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


def _metadata(where: str, data: Any) -> Any:
    """The JSON of an ``.npz`` file's ``__meta__`` entry."""
    if "__meta__" not in data.files:
        _refuse(where, "a file written by save_weights", "no __meta__ entry")
    return parse_metadata(where, str(data["__meta__"]))


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


def load_weights(path: PathLike | IO[bytes], filter_parameters: FilterParameters | None = None, *,
                 into: Model | None = None, ignore: Collection[str] | None = (),
                 max_elements: int = MAX_ELEMENTS) -> Any:
    """Read a file written by :func:`save_weights`, in either form, whatever it is called.

    Parameters
    ----------
    path : str, path-like or binary file
        Read from :func:`weights_path` of it, as :func:`save_weights` wrote it (for a name
        without a suffix whose ``.safetensors`` file does not exist, the ``.npz`` file an
        earlier version wrote).
    filter_parameters : FilterParameters, optional
        Backend, threads and client-pointer flag of the rebuilt layers.
    into : layer, Sequential, or mapping of name to layer, optional
        Copy the saved arrays into this model instead of building new layers: its
        ``state_dict()`` names (``"<layer name>.<name>"`` for a container or a mapping) must
        be exactly the saved ones, with the same shapes, and each layer's configuration must
        be the one saved — every setting of its parameter object but the arrays (and an
        LSTM's ``seed``): sizes, ``batch_first``, ``bidirectional``, ``dtype``, activations,
        the variants, ``dropout``, ``momentum``, ``epsilon`` … (settings written differently
        that compute the same, such as an activation left at its default, are equal). A
        difference is refused naming the layer, the field and both values; a Sequential
        loaded from a Sequential must have its elements, ``LastStep`` ones too, in its order.
    ignore : tuple of str, optional
        With ``into``: configuration fields in which the model may differ from the file, by
        their names in the parameters' ``to_state()`` (``("batch_first",)``, ``("dtype",)``,
        ``("activation", "epsilon")``), for every layer that has them. The model's own
        setting is kept, and the arrays are still loaded strictly (a size ignored here is
        then refused by the shape of its arrays; values are converted to the model's
        dtype). Each name must be a field of one of the model's layers.
    max_elements : int, optional
        The most elements (default 2**28, :data:`~bnnsfw.serialization.MAX_ELEMENTS`) that the
        shapes the file declares and no array in it has may hold, all together — a
        normalization's ``input_shape`` without gamma or beta, from which the layer would make
        them. Every other size is checked against the arrays that carry it. A shape beyond the
        limit is refused before anything is allocated, naming the layer and the field; raise
        the limit for a file you trust.

    Returns
    -------
    layer, Sequential or dict of name to layer
        What was saved, rebuilt as new open layers: a layer for a layer, a
        :class:`~bnnsfw.Sequential` for a container, a dict for a mapping. With ``into``,
        ``into`` itself.

    The file is untrusted input: anything but a sound file written by :func:`save_weights`
    raises a bnnsfw error naming the file and the problem — random bytes, an empty, truncated
    or damaged file, an ``.npy`` file, arrays whose header declares more data than they
    hold (checked before anything is allocated), sizes that disagree with the arrays, a shape
    no array confirms beyond ``max_elements``, pickled objects, metadata that is not JSON or
    is nested too deeply, missing or unexpected keys, unknown layer types, invalid values.
    A path that does not exist raises ``FileNotFoundError``.
    """
    max_elements = positive_int("load_weights(max_elements)", max_elements)
    if into is not None and filter_parameters is not None:
        raise InvalidParameterError(must_be("load_weights(filter_parameters)",
                                            "None when into= is given (the model's layers keep theirs)",
                                            filter_parameters))
    targets = None if into is None else _targets(into)
    ignored = _ignored(ignore, targets)
    if isinstance(path, (str, os.PathLike)):
        source: str | IO[bytes] = _readable_path(path)
        where = f"load_weights({source!r})"
    elif hasattr(path, "read") and hasattr(path, "seek"):
        source, where, start = path, f"load_weights({type(path).__name__})", path.tell()
    else:
        raise InvalidParameterError(must_be("load_weights(path)", "a file path or an open binary file",
                                            type(path).__name__))
    if isinstance(source, str) and _safetensors.is_safetensors(source):
        arrays, text = _safetensors.read(source)
        kind, layers = _contents(where, parse_metadata(where, text))
        dtypes = {key: array.dtype for key, array in arrays.items()}
        loaded = _rebuild(where, layers, arrays, dtypes, filter_parameters, _Budget(max_elements))
    else:
        dtypes = _check_archive(where, source)
        if not isinstance(source, str):  # the checks moved an open file: back to where it was
            source.seek(start)
        try:
            with np.load(source, allow_pickle=False) as data:
                kind, layers = _contents(where, _metadata(where, data))
                loaded = _rebuild(where, layers, data, dtypes, filter_parameters, _Budget(max_elements))
        except (zipfile.BadZipFile, EOFError, zlib.error) as error:  # damaged after the check
            _refuse(where, "a readable .npz archive", f"a damaged one ({type(error).__name__}: {error})")
    model: Any = loaded
    if kind != "layers":
        model = loaded["layer"] if kind == "layer" else Sequential(loaded)
    if into is None or targets is None:
        return model
    try:
        _check_configuration(where, kind, loaded, into, targets, ignored)
        _copy_into(into, targets, _flat_state(model))
    finally:
        for layer in loaded.values():
            if isinstance(layer, Filter):
                layer.close()
    return into


def _contents(where: str, meta: Any) -> tuple[str, dict[str, Any]]:
    """The kind and the checked ``layers`` object of a file's metadata."""
    layers = _layers(where, meta)
    kind = meta.get("kind", "layers")
    if kind not in _KINDS or (kind == "layer" and list(layers) != ["layer"]):
        _refuse(f"{where}: kind", " or ".join(_KINDS) + " (a single layer named 'layer')", kind)
    return kind, layers


def _rebuild(where: str, layers: dict[str, Any], data: Any, dtypes: Mapping[str, np.dtype],
             fp: FilterParameters | None, budget: _Budget) -> dict[str, Any]:
    """Every layer of the file's metadata, built from its arrays; each array must be floats of
    the layer's dtype, and any problem names the file and the layer."""
    loaded: dict[str, Any] = {}  # layers, and LastStep elements of a container
    for name, entry in layers.items():
        declared = entry.get("dtype") if entry.get("dtype") in ("float32", "float64") else None
        for key, dtype in dtypes.items():
            if key.startswith(f"{name}/") and (dtype.kind != "f" or (declared and dtype != declared)):
                _refuse(f"{where}: {key}", f"an array of {declared or 'floats'} (the layer's dtype)",
                        str(dtype))
        try:
            loaded[name] = _build(name, entry, data, fp, budget)
        except BNNSError as error:
            raise type(error)(f"{where}: layer {name!r}: {error}") from error
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as error:
            rule = "a layer state as save_weights writes it"
            raise _Refusal(must_be(f"{where}: layer {name!r}", rule,
                                   f"{type(error).__name__}: {error}")) from error
    return loaded


def _flat_state(model: Any) -> dict[str, np.ndarray]:
    """One state dict for any model: a mapping's layers named like a container's."""
    if isinstance(model, (Filter, Sequential)):
        return model.state_dict()
    return {f"{name}.{key}": array for name, layer in model.items()
            for key, array in layer.state_dict().items()}


def _targets(into: object) -> dict[str, Any]:
    """The elements of ``into`` by name (``"layer"`` for a single layer), checked: a layer, a
    Sequential or a non-empty mapping of name to layer, all open."""
    if isinstance(into, Filter):
        into.check_open("load_weights")
        return {"layer": into}
    if isinstance(into, Sequential):
        into.check_open("load_weights")
        return dict(into.layers)
    if not isinstance(into, Mapping) or not into or not all(
            isinstance(name, str) and isinstance(layer, Filter) for name, layer in into.items()):
        rule = "a layer, a Sequential or a non-empty mapping of name to layer"
        raise InvalidParameterError(must_be("load_weights(into)", rule, type(into).__name__))
    for layer in into.values():
        layer.check_open("load_weights")
    return dict(into)


def _type_name(element: object) -> str | None:
    """The ``type`` a file records for ``element`` (``None`` for a LastStep or another object)."""
    for type_name, (layer_class, _) in _LAYER_TYPES.items():
        if isinstance(element, layer_class):
            return type_name
    return None


def _ignored(ignore: object, targets: dict[str, Any] | None) -> frozenset[str]:
    """The checked ``ignore`` argument: configuration fields of the layers of ``into``."""
    where = "load_weights(ignore)"
    if ignore is None:
        return frozenset()
    if not isinstance(ignore, (tuple, list, set, frozenset)) or not all(isinstance(n, str) for n in ignore):
        rule = "a tuple of configuration field names, e.g. ('batch_first',)"
        raise InvalidParameterError(must_be(where, rule, ignore))
    if not ignore:
        return frozenset()
    if targets is None:
        rule = "empty unless into= is given (it names settings in which that model may differ from the file)"
        raise InvalidParameterError(must_be(where, rule, ignore))
    type_names = [type_name for type_name in map(_type_name, targets.values()) if type_name is not None]
    known = {field for type_name in type_names for field in _CONFIGURATION[type_name]}
    unknown = sorted(set(ignore) - known)
    if unknown:
        rule = f"configuration fields of the model's layers ({', '.join(sorted(known))})"
        raise InvalidParameterError(must_be(where, rule, unknown if len(unknown) > 1 else unknown[0]))
    return frozenset(ignore)


def _configuration(parameters: Any) -> dict[str, Any]:
    """The settings of a layer's ``parameters`` as its file entry holds them: the state's
    entries that are not arrays (absent arrays are ``None`` there, equal to anything absent)."""
    state: dict[str, Any] = parameters.to_state()
    return {key: value for key, value in state.items()
            if key not in _NOT_CONFIGURATION and not isinstance(value, np.ndarray)}


#: An LSTM's entries that choose its activations; compared by the activations they give.
_LSTM_ACTIVATIONS = ("default_activations", "hidden_activation", "gate_activations", "direction_activations")


def _same_effect(key: str, saved: Any, model: Any) -> bool:
    """True when the entry ``key``, though written differently, computes the same in the two
    parameter objects: an LSTM's activations by the ones they give (``None`` is the default),
    its dropout with one layer (there is none), a normalization's momentum without moving
    statistics (nothing moves)."""
    if isinstance(saved, LSTMParameters) and isinstance(model, LSTMParameters):
        if key in _LSTM_ACTIVATIONS:
            directions = saved.num_directions
            return directions == model.num_directions and all(
                saved.activations(d) == model.activations(d) for d in range(directions))
        return key == "dropout" and saved.num_layers == model.num_layers == 1
    if isinstance(saved, NormalizationParameters) and isinstance(model, NormalizationParameters):
        moving = saved.type.has_moving_statistics or model.type.has_moving_statistics
        return key == "momentum" and not moving
    return False


def _shown(key: str, value: object) -> object:
    """A setting for a message: activations (``[function, alpha, beta]`` in the file) as
    :class:`~bnnsfw.Activation` values, anything else as it is."""
    if "activation" not in key or not isinstance(value, list):
        return value
    if len(value) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return Activation.from_state(value)
    return [_shown(key, item) for item in value]


def _check_configuration(where: str, kind: str, loaded: dict[str, Any], into: object,
                         targets: dict[str, Any], ignored: frozenset[str]) -> None:
    """Refuse a model whose elements or settings differ from the file's (but for ``ignored``),
    naming the element, the field and both values; the arrays are checked by the load."""
    def model(name: str) -> str:
        return f"{where}: the model" if isinstance(into, Filter) else f"{where}: the model's layer {name!r}"

    if kind == "sequential" and isinstance(into, Sequential):
        weightless = (LastStep, FinalState, Softmax)
        steps = {name for name, element in loaded.items() if isinstance(element, weightless)}
        their_steps = {name for name, element in targets.items() if isinstance(element, weightless)}
        if steps != their_steps or (set(loaded) == set(targets) and list(loaded) != list(targets)):
            rule = f"{list(loaded)} in this order (LastStep elements included), as in the file"
            raise InvalidParameterError(must_be(f"{where}: the model's elements", rule, list(targets)))
    for name, saved in loaded.items():
        element = targets.get(name)
        if element is None:
            continue  # a layer the model does not have: the load names its arrays
        if type(element) is not type(saved):
            rule = f"of type {type(saved).__name__}, as in the file"
            raise InvalidParameterError(must_be(model(name), rule, type(element).__name__))
        if not isinstance(saved, (LSTMLayer, NormalizationLayer, FullyConnectedLayer)):
            continue  # an element without weights: its LSTM's configuration says the rest
        saved_parameters, parameters = saved.layer_parameters, element.layer_parameters
        theirs, ours = _configuration(saved_parameters), _configuration(parameters)
        differing = []
        for key in [*theirs, *(key for key in ours if key not in theirs)]:
            if key in ignored:
                continue
            # The state leaves an option out at its default: False for a flag, else None.
            saved_value = theirs.get(key, False if isinstance(ours.get(key), bool) else None)
            value = ours.get(key, False if isinstance(theirs.get(key), bool) else None)
            if saved_value != value and not _same_effect(key, saved_parameters, parameters):
                differing.append((key, saved_value, value))
        if differing:
            key, saved_value, value = differing[0]
            names = tuple(field for field, _, _ in differing)
            rule = f"{_shown(key, saved_value)!r}, as in the file (ignore={names!r} loads its arrays anyway)"
            field = f"{model(name)}'s {key}" if isinstance(into, Filter) else f"{model(name)} {key}"
            raise InvalidParameterError(must_be(field, rule, _shown(key, value)))


def _copy_into(into: object, targets: dict[str, Any], state: dict[str, np.ndarray]) -> None:
    """Load ``state`` into ``into`` strictly (names, shapes, finite values), all checked first."""
    if isinstance(into, (Filter, Sequential)):
        into.load_state_dict(state)
        return
    members = [(f"{name}.", layer) for name, layer in targets.items()]
    load_named_state("dict", members, state, True, where="load_weights(into) with the saved arrays")

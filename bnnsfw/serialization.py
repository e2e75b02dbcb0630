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

A checkpoint is such a file with more in it: ``save_weights(path, model, training={name:
optimizer or schedule}, metadata={...})`` adds each optimizer's state arrays as
``<name>/<state>.<position>`` and, in the JSON, its class, hyperparameters, learning rate,
step count, parameter names and shapes; each schedule's class and state; each LSTM's
dropout-generator state; and the caller's metadata. ``load_weights(path, training={...},
return_metadata=True)`` gives all of it back.
"""

from __future__ import annotations

import copy
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
from .optimizers import Optimizer
from .schedules import LearningRateSchedule, SequentialSchedule
from .sequential import Dropout, FinalState, LastStep, Sequential, Softmax

__all__ = ["save_weights", "load_weights", "weights_path", "MAX_ELEMENTS"]

#: What :func:`save_weights` takes and :func:`load_weights` gives back.
Model = Union[Filter, Sequential, Mapping[str, Filter]]
#: What a checkpoint holds beside the model, by name (``training=``).
Training = Mapping[str, Union[Optimizer, LearningRateSchedule]]
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
_DROPOUT = "dropout"


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


def save_weights(path: PathLike | IO[bytes], model: Model, *, training: Training | None = None,
                 metadata: Mapping[str, Any] | None = None) -> None:
    """Write ``model`` to the file :func:`weights_path` gives for ``path``; with ``training``
    and ``metadata``, a checkpoint to resume training from.

    Parameters
    ----------
    path : str, path-like or binary file
        ``.safetensors`` is appended when the name ends in neither ``.safetensors`` nor
        ``.npz`` (:func:`weights_path`); a name ending in ``.npz`` gets a NumPy archive, as
        does an open binary file (written as it is).
    model : layer, Sequential, or mapping of name to layer
        Open layers. :func:`load_weights` gives back the same kind of object.
    training : mapping of name to optimizer or schedule, optional
        Optimizers (their moments by parameter name, step count and learning rate; their
        other hyperparameters are recorded) and learning-rate schedules (epoch and base), by
        names that are not the model's layer names. With it the file also holds each LSTM's
        dropout-generator state, so that ``load_weights(..., training=...)`` resumes exactly
        where this run is.
    metadata : mapping, optional
        The caller's own JSON-able values (an epoch, a loss, a configuration): a dict with str
        keys holding dicts, lists, tuples, str, bool, None, int and finite float values;
        anything else is refused naming where it is. ``load_weights(...,
        return_metadata=True)`` gives it back (tuples as lists).
    """
    kind, layers = _elements(model)
    extras = _training_elements(training, layers)
    user = _user_metadata(metadata)
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
        if isinstance(layer, Dropout):
            meta[name] = {"type": _DROPOUT, "rate": layer.rate, "seed": layer.seed}
            continue
        layer.check_open("save_weights")
        type_name, state = _live_state(name, layer)
        meta[name] = {"type": type_name}
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                arrays[f"{name}/{key}"] = value
            else:
                meta[name][key] = value
    contents: dict[str, Any] = {"format": _FORMAT, "kind": kind, "layers": meta}
    if extras:
        contents["training"] = {name: _training_entry(name, element, arrays)
                                for name, element in extras.items()}
        contents["random"] = {name: layer._runtime_state() for name, layer in layers.items()
                              if isinstance(layer, Filter) and layer._runtime_state()}
    if user is not None:
        contents["metadata"] = user
    header = json.dumps(contents, allow_nan=False)
    if isinstance(path, (str, os.PathLike)) and not weights_path(path).endswith(".npz"):
        _safetensors.write(weights_path(path), arrays, header)
        return
    arrays["__meta__"] = np.array(header)
    np.savez(weights_path(path) if isinstance(path, (str, os.PathLike)) else path, **arrays)


def _training_elements(training: object, layers: Mapping[str, Any]) -> dict[str, Any]:
    """The checked ``training`` argument of :func:`save_weights`: optimizers and schedules by
    names that are usable and not the model's layer names."""
    where = "save_weights(training)"
    checked = _training_objects(where, training, "a mapping of name to optimizer or schedule, e.g. "
                                "{'optimizer': adam}")
    for name in checked:
        if not isinstance(name, str) or not name or "/" in name:
            raise InvalidParameterError(must_be(f"{where} keys", "non-empty names without '/'", name))
        if name in layers:
            rule = f"names other than the model's layer names ({', '.join(layers)})"
            raise InvalidParameterError(must_be(f"{where} keys", rule, name))
    return checked


def _training_objects(where: str, training: object, rule: str) -> dict[str, Any]:
    """``training`` as a dict of optimizers and schedules by name ({} for None), its kinds
    checked; ``rule`` says what a mapping is expected to be."""
    if training is None:
        return {}
    if not isinstance(training, Mapping):
        raise InvalidParameterError(must_be(where, rule, type(training).__name__))
    for name, element in training.items():
        if not isinstance(element, (Optimizer, LearningRateSchedule)):
            rule = "a bnnsfw optimizer or learning-rate schedule"
            raise InvalidParameterError(must_be(f"{where}[{name!r}]", rule, type(element).__name__))
    return dict(training)


def _schedule_structure(schedule: LearningRateSchedule) -> Any:
    """What a file records of a schedule's kind: its class, and a sequence's parts and milestones."""
    if isinstance(schedule, SequentialSchedule):
        return {"class": type(schedule).__name__, "milestones": list(schedule.milestones),
                "schedules": [_schedule_structure(part) for part in schedule.schedules]}
    return {"class": type(schedule).__name__}


def _training_entry(name: str, element: Any, arrays: dict[str, Any]) -> dict[str, Any]:
    """The JSON entry of an optimizer or a schedule; an optimizer's state arrays go into
    ``arrays`` as ``<name>/<state name>.<position>``."""
    if isinstance(element, LearningRateSchedule):
        return {"type": "schedule", **_schedule_structure(element), **element.state_dict()}
    state: dict[str, Any] = element.state_dict()
    count = int(state["parameter_count"])
    names = state.get("parameter_names")
    hyperparameters = {field.name: getattr(element, field.name) for field in element._hyperparameter_fields()}
    for key, value in state.items():
        if isinstance(value, np.ndarray) and key != "parameter_names" and not key.startswith("shape."):
            arrays[f"{name}/{key}"] = value
    return {"type": "optimizer", "class": type(element).__name__, "hyperparameters": hyperparameters,
            "learning_rate": element.learning_rate, "step_count": state["step_count"],
            "parameter_names": None if names is None else [str(n) for n in names],
            "shapes": [[int(n) for n in state[f"shape.{i}"]] for i in range(count)]}


#: How deeply the caller's metadata may nest (JSON readers have limits; a real one is shallow).
_MAX_METADATA_DEPTH = 32


def _user_metadata(metadata: object) -> dict[str, Any] | None:
    """The caller's metadata, checked to be plain JSON: refused naming the first value that is not."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise InvalidParameterError(must_be("save_weights(metadata)", "a dict of JSON-able values",
                                            type(metadata).__name__))
    plain: dict[str, Any] = _plain_json("save_weights(metadata)", metadata, 0)
    return plain


def _plain_json(where: str, value: object, depth: int) -> Any:
    if depth > _MAX_METADATA_DEPTH:
        rule = f"nested at most {_MAX_METADATA_DEPTH} levels deep"
        raise InvalidParameterError(must_be(where, rule, "a deeper value"))
    if value is None or type(value) in (bool, str, int):
        return value
    if type(value) is float:
        if not math.isfinite(value):
            rule = "a finite number (JSON has no NaN or infinity)"
            raise InvalidParameterError(must_be(where, rule, value))
        return value
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise InvalidParameterError(must_be(f"{where} keys", "str (JSON object keys)", key))
        return {key: _plain_json(f"{where}[{key!r}]", item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_json(f"{where}[{i}]", item, depth + 1) for i, item in enumerate(value)]
    rule = ("a dict, list, tuple, str, int, finite float, bool or None (convert NumPy values with "
            ".item() or .tolist())")
    raise InvalidParameterError(must_be(where, rule, type(value).__name__))


def _build(name: str, meta: dict[str, Any], data: Any, fp: FilterParameters | None,
           budget: _Budget) -> Filter | LastStep | FinalState | Softmax | Dropout:
    """Rebuild the layer ``name`` from its JSON entry and its arrays."""
    state = dict(meta)
    type_name = state.pop("type", None)
    if type_name == _LAST_STEP:
        return LastStep()
    if type_name == _FINAL_STATE:
        return FinalState(state["num_directions"])
    if type_name == _SOFTMAX:
        return Softmax()
    if type_name == _DROPOUT:
        return Dropout(state["rate"], state.get("seed"))
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
        elements = math.prod(s for s in shape if s is not None)  # an open size allocates nothing
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
                 max_elements: int = MAX_ELEMENTS, training: Training | None = None,
                 return_metadata: bool = False) -> Any:
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
    training : mapping of name to optimizer or schedule, optional
        Objects to restore from a checkpoint, by the names ``save_weights(training=)`` gave
        them, each of the saved kind (the same optimizer class, the same schedule classes
        and milestones; create them as for the saved run). An optimizer gets the saved
        moments, step count and learning rate (its other hyperparameters stay its own); the
        saved parameter names, shapes and dtypes must be those of the model's
        ``parameters()``, or the load is refused naming the differences. A schedule gets
        its epoch and base and sets its optimizer's learning rate. Everything is checked
        before anything changes.
    return_metadata : bool
        Return ``(model, metadata)``: the ``metadata`` given to :func:`save_weights` (an
        empty dict when none was).

    Returns
    -------
    layer, Sequential or dict of name to layer
        What was saved, rebuilt as new open layers: a layer for a layer, a
        :class:`~bnnsfw.Sequential` for a container, a dict for a mapping. With ``into``,
        ``into`` itself. LSTMs continue the dropout-generator stream saved with a
        checkpoint. With ``return_metadata``, a tuple of it and the metadata.

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
    requested = _requested(training)
    if not isinstance(return_metadata, bool):
        raise InvalidParameterError(must_be("load_weights(return_metadata)", "True or False",
                                            return_metadata))
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
        meta = parse_metadata(where, text)
        kind, layers = _contents(where, meta)
        saved = _saved_training(where, meta, arrays, requested, layers)
        dtypes = {key: array.dtype for key, array in arrays.items()}
        loaded = _rebuild(where, layers, arrays, dtypes, filter_parameters, _Budget(max_elements))
    else:
        dtypes = _check_archive(where, source)
        if not isinstance(source, str):  # the checks moved an open file: back to where it was
            source.seek(start)
        try:
            with np.load(source, allow_pickle=False) as data:
                meta = _metadata(where, data)
                kind, layers = _contents(where, meta)
                saved = _saved_training(where, meta, data, requested, layers)
                loaded = _rebuild(where, layers, data, dtypes, filter_parameters, _Budget(max_elements))
        except (zipfile.BadZipFile, EOFError, zlib.error) as error:  # damaged after the check
            _refuse(where, "a readable .npz archive", f"a damaged one ({type(error).__name__}: {error})")
    model: Any = loaded
    if kind != "layers":
        model = loaded["layer"] if kind == "layer" else Sequential(loaded)
    if into is None or targets is None:
        try:
            saved.check(where, model, loaded)
        except BaseException:
            for layer in loaded.values():
                if isinstance(layer, Filter):
                    layer.close()
            raise
        saved.apply(loaded)
        return (model, saved.metadata) if return_metadata else model
    try:
        _check_configuration(where, kind, loaded, into, targets, ignored)
        saved.check(where, into, targets)
        _copy_into(into, targets, _flat_state(model))
    finally:
        for layer in loaded.values():
            if isinstance(layer, Filter):
                layer.close()
    saved.apply(targets)
    return (into, saved.metadata) if return_metadata else into


def _requested(training: object) -> dict[str, Any]:
    """The checked ``training`` argument of :func:`load_weights`."""
    rule = "a mapping of name to optimizer or schedule, as save_weights(training=) was given"
    return _training_objects("load_weights(training)", training, rule)


class _SavedTraining:
    """What a checkpoint holds beside the layers, read and checked before anything changes:
    each requested optimizer's state (a :meth:`~bnnsfw.optimizers.Optimizer.state_dict`) and
    learning rate, each requested schedule's state, the LSTMs' dropout-generator states and
    the caller's metadata."""

    def __init__(self) -> None:
        self.optimizers: dict[str, tuple[Optimizer, dict[str, object], float]] = {}
        self.schedules: dict[str, tuple[LearningRateSchedule, dict[str, Any]]] = {}
        self.random: dict[str, Any] = {}
        self.metadata: dict[str, Any] = {}

    def check(self, where: str, model: Any, layers: Mapping[str, Any]) -> None:
        """Refuse states that do not fit ``model`` (its parameters' names, shapes and dtypes)
        or the given objects, trying each on a copy."""
        parameters = _named_parameters(model) if self.optimizers else {}
        for name, (optimizer, state, rate) in self.optimizers.items():
            label = f"{where}: training[{name!r}]"
            saved_names = state.get("parameter_names")
            if isinstance(saved_names, np.ndarray):
                _check_parameters(label, [str(n) for n in saved_names], state, parameters)
            trial = copy.deepcopy(optimizer)
            try:
                trial.load_state_dict(state)
                trial.learning_rate = rate
            except BNNSError as error:
                raise type(error)(f"{label}: {error}") from error
        for name, (schedule, state) in self.schedules.items():
            try:
                copy.deepcopy(schedule).load_state_dict(state)
            except BNNSError as error:
                raise type(error)(f"{where}: training[{name!r}]: {error}") from error
        for name, generators in self.random.items():
            layer = layers.get(name)
            runtime = layer._runtime_state() if isinstance(layer, Filter) else {}
            if not isinstance(generators, dict) or set(generators) != set(runtime):
                got = sorted(generators) if isinstance(generators, dict) else generators
                rule = f"the random state of the model's layer ({sorted(runtime)})"
                _refuse(f"{where}: random[{name!r}]", rule, got)
            for key, value in generators.items():
                try:
                    np.random.default_rng().bit_generator.state = value
                except (TypeError, ValueError, KeyError, OverflowError) as error:
                    rule = "a random generator state as save_weights writes it"
                    _refuse(f"{where}: random[{name!r}][{key!r}]", rule, f"{type(error).__name__}: {error}")

    def apply(self, layers: Mapping[str, Any]) -> None:
        """Restore every state (all checked by :meth:`check`)."""
        for name, state in self.random.items():
            layers[name]._set_runtime_state(state)
        for optimizer, state, rate in self.optimizers.values():
            optimizer.load_state_dict(state)
            optimizer.learning_rate = rate
        for schedule, state in self.schedules.values():
            schedule.load_state_dict(state)


def _named_parameters(model: Any) -> dict[str, np.ndarray]:
    """A model's trainable arrays by the names its optimizer steps them under."""
    if isinstance(model, (Filter, Sequential)):
        return model.parameters()
    return {f"{name}.{key}": array for name, layer in model.items() if isinstance(layer, Filter)
            for key, array in layer.parameters().items()}


def _check_parameters(where: str, names: list[str], state: Mapping[str, object],
                      parameters: Mapping[str, np.ndarray]) -> None:
    """Refuse an optimizer state whose parameters are not the model's: names, then shapes and
    dtypes."""
    unknown = [name for name in names if name not in parameters]
    if unknown:
        rule = "an optimizer state over the model's parameters (some or all of them)"
        raise InvalidParameterError(must_be(where, rule, f"names the model does not have: {unknown}"))
    for i, name in enumerate(names):
        array = parameters[name]
        shape = tuple(int(n) for n in np.asarray(state[f"shape.{i}"]))
        dtypes = {value.dtype for key, value in state.items()
                  if key.endswith(f".{i}") and not key.startswith("shape.") and isinstance(value, np.ndarray)}
        if shape != array.shape or any(dtype != array.dtype for dtype in dtypes):
            saved = f"shape {shape} {', '.join(sorted(d.name for d in dtypes)) or ''}".strip()
            rule = f"of the model's shape {array.shape} and dtype {array.dtype.name}"
            raise InvalidParameterError(must_be(f"{where} state of {name!r}", rule, saved))


def _saved_training(where: str, meta: dict[str, Any], data: Any, requested: Mapping[str, Any],
                    layers: Mapping[str, Any]) -> _SavedTraining:
    """Read a checkpoint's training entries for the ``requested`` objects, its random states
    and its metadata, checking their form (their fit to the model comes later)."""
    saved = _SavedTraining()
    user = meta.get("metadata", {})
    if not isinstance(user, dict):
        _refuse(f"{where}: metadata", "a JSON object", type(user).__name__)
    saved.metadata = user
    random = meta.get("random", {})
    if not isinstance(random, dict) or not set(random) <= set(layers):
        _refuse(f"{where}: random", "a JSON object by the file's layer names", random)
    saved.random = random
    entries = meta.get("training", {})
    if not isinstance(entries, dict):
        rule = "a JSON object of name to optimizer or schedule"
        _refuse(f"{where}: training", rule, type(entries).__name__)
    absent = [name for name in requested if name not in entries]
    if absent:
        rule = f"names the file holds ({', '.join(entries) or 'none: it is no checkpoint'})"
        _refuse(f"{where}: training keys", rule, absent)
    for name, target in requested.items():
        entry, label = entries[name], f"{where}: training[{name!r}]"
        if not isinstance(entry, dict):
            _refuse(label, "a JSON object", type(entry).__name__)
        try:
            if isinstance(target, LearningRateSchedule):
                saved.schedules[name] = (target, _schedule_state(label, entry, target))
            else:
                state, rate = _optimizer_state(label, name, entry, target, data)
                saved.optimizers[name] = (target, state, rate)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as error:
            if isinstance(error, BNNSError):
                raise
            _refuse(label, "a training state as save_weights writes it", f"{type(error).__name__}: {error}")
    return saved


def _schedule_state(label: str, entry: dict[str, Any], schedule: LearningRateSchedule) -> dict[str, Any]:
    if entry.get("type") != "schedule":
        _refuse(label, "a schedule, as the object given", entry.get("type"))
    structure = _schedule_structure(schedule)
    saved = {key: entry.get(key) for key in structure}
    if saved != structure:
        _refuse(label, f"a schedule like the one given ({structure})", saved)
    return {"epoch": entry.get("epoch"), "base_learning_rate": entry.get("base_learning_rate")}


def _optimizer_state(label: str, name: str, entry: dict[str, Any], optimizer: Optimizer,
                     data: Any) -> tuple[dict[str, object], float]:
    """An optimizer's ``state_dict()`` made again from its entry and arrays, and its learning rate."""
    if entry.get("type") != "optimizer" or entry.get("class") != type(optimizer).__name__:
        what = entry.get("class") if entry.get("type") == "optimizer" else entry.get("type")
        _refuse(label, f"the state of a {type(optimizer).__name__}, as the optimizer given", what)
    if not isinstance(entry.get("hyperparameters"), dict):
        _refuse(f"{label} hyperparameters", "a JSON object", entry.get("hyperparameters"))
    shapes, names, rate = entry.get("shapes"), entry.get("parameter_names"), entry.get("learning_rate")
    if not isinstance(shapes, list) or not all(
            isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape) for shape in shapes):
        _refuse(f"{label} shapes", "a list of shapes (lists of integers >= 0)", shapes)
    if names is not None and (not isinstance(names, list) or len(names) != len(shapes)
                              or not all(isinstance(n, str) for n in names)):
        _refuse(f"{label} parameter_names", f"None or {len(shapes)} names (one per shape)", names)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        _refuse(f"{label} learning_rate", "a number", rate)
    state: dict[str, object] = {"step_count": entry.get("step_count"), "parameter_count": len(shapes)}
    if names is not None:
        state["parameter_names"] = np.array(names, dtype=str)
    for i, shape in enumerate(shapes):
        state[f"shape.{i}"] = np.array(shape, dtype=np.int64)
    prefix = f"{name}/"
    for key in data.files:
        if key.startswith(prefix):
            if key[len(prefix):] in state:
                rule = "state arrays only (counts, names and shapes are in the metadata)"
                _refuse(f"{label} arrays", rule, key)
            state[key[len(prefix):]] = np.array(data[key])
    return state, float(rate)


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
    loaded: dict[str, Any] = {}  # layers, and LastStep and Dropout elements of a container
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
        weightless = (LastStep, FinalState, Softmax, Dropout)
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
            continue  # no weights: its LSTM's configuration says the rest (a Dropout keeps its own rate)
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

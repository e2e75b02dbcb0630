"""Saving and loading a model's layers as one ``.npz`` file.

``save_weights(path, model)`` writes every layer's configuration (as JSON) and arrays — LSTM
gate descriptors, normalization gamma/beta and moving statistics, fully connected weights
and bias — for a model that is one layer, a :class:`~bnnsfw.Sequential`, or a mapping of
name to layer. ``load_weights(path)`` rebuilds the same kind of object, whose layers then
compute exactly what the saved ones computed; ``load_weights(path, into=model)`` instead
copies the saved arrays into an existing model (strictly, by the names of ``state_dict()``).
Both read and write :func:`weights_path` of the path they are given, so what
``save_weights(p, …)`` writes is what ``load_weights(p)`` reads.

What a layer holds is its parameter object's plain state (``to_state()`` /
``from_state()``); this module only lays that state out in the file. For a layer named
``name``, each array of the state is the entry ``name/<key>`` and every other value goes
into the JSON entry ``__meta__``, beside the layer's ``type``.
"""

from __future__ import annotations

import json
import os
from typing import IO, Any, Mapping, Union

import numpy as np

from .errors import InvalidParameterError, must_be
from .filter import Filter, FilterParameters, load_named_state
from .layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
from .layers.lstm import LSTMLayer, LSTMParameters
from .layers.normalization import NormalizationLayer, NormalizationParameters
from .sequential import LastStep, Sequential

__all__ = ["save_weights", "load_weights", "weights_path"]

#: What :func:`save_weights` takes and :func:`load_weights` gives back.
Model = Union[Filter, Sequential, Mapping[str, Filter]]
PathLike = Union[str, "os.PathLike[str]"]

_FORMAT = "bnnsfw-weights-1"

#: The layers a file holds, by the ``type`` written for them: (layer class, parameter class).
_LAYER_TYPES: dict[str, tuple[type[Any], type[Any]]] = {
    "lstm": (LSTMLayer, LSTMParameters),
    "normalization": (NormalizationLayer, NormalizationParameters),
    "fully_connected": (FullyConnectedLayer, FullyConnectedParameters),
}


#: What a file holds, by the ``kind`` its metadata records (files without one hold a mapping).
_KINDS = ("layers", "layer", "sequential")
_LAST_STEP = "last_step"


def weights_path(path: PathLike) -> str:
    """The file :func:`save_weights` writes and :func:`load_weights` reads for ``path``.

    ``path`` itself when it ends in ``.npz``, else ``path + ".npz"`` — NumPy's rule for
    ``numpy.savez``, applied by both functions, so ``save_weights("model", …)`` writes
    ``model.npz`` and ``load_weights("model")`` reads it.

    >>> weights_path("runs/model"), weights_path("model.npz")
    ('runs/model.npz', 'model.npz')
    """
    text = os.fspath(path)
    return text if text.endswith(".npz") else text + ".npz"


def _file(path: PathLike | IO[bytes]) -> str | IO[bytes]:
    """A path by :func:`weights_path`; an open binary file as it is."""
    return weights_path(path) if isinstance(path, (str, os.PathLike)) else path


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
    """Write ``model`` to the ``.npz`` file :func:`weights_path` gives for ``path``.

    Parameters
    ----------
    path : str, path-like or binary file
        ``.npz`` is appended when missing (:func:`weights_path`); an open file is written as
        it is.
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
        layer.check_open("save_weights")
        type_name, state = _live_state(name, layer)
        meta[name] = {"type": type_name}
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                arrays[f"{name}/{key}"] = value
            else:
                meta[name][key] = value
    arrays["__meta__"] = np.array(json.dumps({"format": _FORMAT, "kind": kind, "layers": meta}))
    np.savez(_file(path), **arrays)


def _build(name: str, meta: dict[str, Any], data: Any, fp: FilterParameters | None) -> Filter | LastStep:
    """Rebuild the layer ``name`` from its JSON entry and its arrays."""
    state = dict(meta)
    type_name = state.pop("type", None)
    if type_name == _LAST_STEP:
        return LastStep()
    if type_name not in _LAYER_TYPES:
        raise InvalidParameterError(must_be(f"load_weights: layer {name!r} type", _type_names(), type_name))
    prefix = f"{name}/"
    state.update({key[len(prefix):]: data[key] for key in data.files if key.startswith(prefix)})
    layer_class, parameters_class = _LAYER_TYPES[type_name]
    layer: Filter = layer_class(parameters_class.from_state(state), fp)
    return layer


def load_weights(path: PathLike | IO[bytes], filter_parameters: FilterParameters | None = None, *,
                 into: Model | None = None) -> Any:
    """Read a file written by :func:`save_weights`.

    Parameters
    ----------
    path : str, path-like or binary file
        Read from :func:`weights_path` of it (``.npz`` appended when missing), as
        :func:`save_weights` wrote it.
    filter_parameters : FilterParameters, optional
        Backend, threads and client-pointer flag of the rebuilt layers.
    into : layer, Sequential, or mapping of name to layer, optional
        Copy the saved arrays into this model instead of building new layers: its
        ``state_dict()`` names (``"<layer name>.<name>"`` for a container or a mapping) must
        be exactly the saved ones, with the same shapes; the configuration (activations,
        options) is the model's own.

    Returns
    -------
    layer, Sequential or dict of name to layer
        What was saved, rebuilt as new open layers: a layer for a layer, a
        :class:`~bnnsfw.Sequential` for a container, a dict for a mapping. With ``into``,
        ``into`` itself.
    """
    if into is not None and filter_parameters is not None:
        raise InvalidParameterError(must_be("load_weights(filter_parameters)",
                                            "None when into= is given (the model's layers keep theirs)",
                                            filter_parameters))
    source = _file(path)
    with np.load(source, allow_pickle=False) as data:
        if "__meta__" not in data.files:
            raise InvalidParameterError(must_be(f"load_weights({source!r})",
                                                "a file written by save_weights", "no __meta__ entry"))
        meta = json.loads(str(data["__meta__"]))
        if meta.get("format") != _FORMAT:
            raise InvalidParameterError(must_be("load_weights: format", _FORMAT, meta.get("format")))
        kind = meta.get("kind", "layers")
        if kind not in _KINDS:
            raise InvalidParameterError(must_be("load_weights: kind", " or ".join(_KINDS), kind))
        layers = {name: _build(name, m, data, filter_parameters) for name, m in meta["layers"].items()}
    elements: dict[str, Any] = layers
    loaded: Any = (elements["layer"] if kind == "layer" else Sequential(elements) if kind == "sequential"
                   else elements)
    if into is None:
        return loaded
    try:
        _copy_into(into, _flat_state(loaded))
    finally:
        for layer in layers.values():
            if isinstance(layer, Filter):
                layer.close()
    return into


def _flat_state(model: Any) -> dict[str, np.ndarray]:
    """One state dict for any model: a mapping's layers named like a container's."""
    if isinstance(model, (Filter, Sequential)):
        return model.state_dict()
    return {f"{name}.{key}": array for name, layer in model.items()
            for key, array in layer.state_dict().items()}


def _copy_into(into: object, state: dict[str, np.ndarray]) -> None:
    """Load ``state`` into ``into`` strictly (names, shapes, finite values), all checked first."""
    if isinstance(into, (Filter, Sequential)):
        into.load_state_dict(state)
        return
    where = "load_weights(into)"
    if not isinstance(into, Mapping) or not into or not all(
            isinstance(name, str) and isinstance(layer, Filter) for name, layer in into.items()):
        rule = "a layer, a Sequential or a non-empty mapping of name to layer"
        raise InvalidParameterError(must_be(where, rule, type(into).__name__))
    for layer in into.values():
        layer.check_open("load_weights")
    members = [(f"{name}.", layer) for name, layer in into.items()]
    load_named_state("dict", members, state, True, where="load_weights(into) with the saved arrays")

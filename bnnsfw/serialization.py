"""Saving and loading a model's layers as one ``.npz`` file.

``save_weights(path, {"lstm": lstm, "norm": norm, "head": head})`` writes every layer's
configuration (as JSON) and arrays — LSTM gate descriptors, normalization gamma/beta and
moving statistics, fully connected weights and bias — and ``load_weights(path)`` rebuilds
the same layers, which then compute exactly what the saved ones computed.

What a layer holds is its parameter object's plain state (``to_state()`` /
``from_state()``); this module only lays that state out in the file. For a layer named
``name``, each array of the state is the entry ``name/<key>`` and every other value goes
into the JSON entry ``__meta__``, beside the layer's ``type``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from .errors import InvalidParameterError, must_be
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
    """The layer's type name and state, holding the arrays the layer computes with now
    (``layer_parameters`` holds the live arrays, whatever the filter parameters)."""
    for type_name, (layer_class, _) in _LAYER_TYPES.items():
        if isinstance(layer, layer_class):
            state: dict[str, Any] = layer.layer_parameters.to_state()
            return type_name, state
    classes = ", ".join(layer_class.__name__ for layer_class, _ in _LAYER_TYPES.values())
    where = f"save_weights(layers[{name!r}])"
    raise InvalidParameterError(must_be(where, f"one of {classes}", type(layer).__name__))


def save_weights(path: str | os.PathLike[str], layers: Mapping[str, Filter]) -> None:
    """Write ``layers`` (name → open layer) to ``path`` (a ``.npz`` file)."""
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
    arrays["__meta__"] = np.array(json.dumps({"format": _FORMAT, "layers": meta}))
    np.savez(path, **arrays)


def _build(name: str, meta: dict[str, Any], data: Any, fp: FilterParameters | None) -> Filter:
    """Rebuild the layer ``name`` from its JSON entry and its arrays."""
    state = dict(meta)
    type_name = state.pop("type", None)
    if type_name not in _LAYER_TYPES:
        raise InvalidParameterError(must_be(f"load_weights: layer {name!r} type", _type_names(), type_name))
    prefix = f"{name}/"
    state.update({key[len(prefix):]: data[key] for key in data.files if key.startswith(prefix)})
    layer_class, parameters_class = _LAYER_TYPES[type_name]
    layer: Filter = layer_class(parameters_class.from_state(state), fp)
    return layer


def load_weights(path: str | os.PathLike[str],
                 filter_parameters: FilterParameters | None = None) -> dict[str, Filter]:
    """Rebuild the layers saved by :func:`save_weights` (name → new open layer)."""
    with np.load(path, allow_pickle=False) as data:
        if "__meta__" not in data.files:
            raise InvalidParameterError(must_be(f"load_weights({os.fspath(path)!r})",
                                                "a file written by save_weights", "no __meta__ entry"))
        meta = json.loads(str(data["__meta__"]))
        if meta.get("format") != _FORMAT:
            raise InvalidParameterError(must_be("load_weights: format", _FORMAT, meta.get("format")))
        return {name: _build(name, m, data, filter_parameters) for name, m in meta["layers"].items()}

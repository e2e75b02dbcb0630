"""Saving and loading a model's layers as one ``.npz`` file.

``save_weights(path, {"lstm": lstm, "norm": norm, "head": head})`` writes every layer's
configuration (as JSON) and arrays — LSTM gate descriptors, normalization gamma/beta and
moving statistics, fully connected weights and bias — and ``load_weights(path)`` rebuilds
the same layers, which then compute exactly what the saved ones computed.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from .activation import Activation
from .errors import InvalidParameterError, must_be
from .filter import Filter, FilterParameters
from .layers.lstm import GATE_FIELDS

__all__ = ["save_weights", "load_weights"]

_FORMAT = "bnnsfw-weights-1"


def _activation_json(act: Activation | None) -> list[float] | None:
    return None if act is None else [int(act.function), act.alpha, act.beta]


def _activation_from(value: list[float] | None) -> Activation | None:
    return None if value is None else Activation(int(value[0]), value[1], value[2])


def _describe(name: str, layer: Filter, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    from .layers.fully_connected import FullyConnectedLayer
    from .layers.lstm import LSTMLayer
    from .layers.normalization import NormalizationLayer

    def put(key: str, value: np.ndarray | None) -> None:
        if value is not None:
            arrays[f"{name}/{key}"] = np.array(value, copy=True)

    if isinstance(layer, LSTMLayer):
        p = layer.parameters
        for gate_name, gate in zip(GATE_FIELDS, p.gates):
            put(f"{gate_name}/input_weights0", gate.input_weights[0])
            put(f"{gate_name}/input_weights1", gate.input_weights[1])
            put(f"{gate_name}/hidden_weights", gate.hidden_weights)
            put(f"{gate_name}/cell_weights", gate.cell_weights)
            put(f"{gate_name}/bias", gate.bias)
        return {
            "type": "lstm", "input_size": p.input_size, "hidden_size": p.hidden_size,
            "num_layers": p.num_layers, "bidirectional": p.bidirectional, "batch_first": p.batch_first,
            "dropout": p.dropout, "seed": p.seed, "default_activations": p.default_activations,
            "hidden_activation": _activation_json(p.hidden_activation), "dtype": p.dtype.name,
            "gate_activations": [_activation_json(g.activation) for g in p.gates],
        }
    if isinstance(layer, NormalizationLayer):
        p = layer.parameters
        put("gamma", layer.gamma)
        put("beta", layer.beta)
        put("moving_mean", layer.moving_mean)
        put("moving_variance", layer.moving_variance)
        return {
            "type": "normalization", "kind": p.type.kind.name, "input_shape": list(p.input_shape),
            "normalization_axis": p.type.normalization_axis, "group_count": p.type.group_count,
            "momentum": p.momentum, "epsilon": p.epsilon, "activation": _activation_json(p.activation),
            "dtype": p.dtype.name,
        }
    if isinstance(layer, FullyConnectedLayer):
        put("weights", layer.weights)
        put("bias", layer.bias)
        return {"type": "fully_connected", "input_size": layer.input_size, "output_size": layer.output_size,
                "activation": _activation_json(layer.activation), "dtype": layer.dtype.name}
    raise InvalidParameterError(must_be(f"save_weights(layers[{name!r}])",
                                        "an LSTMLayer, NormalizationLayer or FullyConnectedLayer",
                                        type(layer).__name__))


def save_weights(path: str | os.PathLike[str], layers: Mapping[str, Filter]) -> None:
    """Write ``layers`` (name → open layer) to ``path`` (a ``.npz`` file)."""
    if not layers:
        raise InvalidParameterError(must_be("save_weights(layers)", "a non-empty mapping of name to layer", layers))
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    for name, layer in layers.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise InvalidParameterError(must_be("save_weights(layers) keys", "non-empty names without '/'", name))
        if not isinstance(layer, Filter):
            raise InvalidParameterError(must_be(f"save_weights(layers[{name!r}])", "a bnnsfw layer",
                                                type(layer).__name__))
        layer.check_open("save_weights")
        meta[name] = _describe(name, layer, arrays)
    arrays["__meta__"] = np.array(json.dumps({"format": _FORMAT, "layers": meta}))
    np.savez(path, **arrays)


def _build(name: str, meta: dict[str, Any], data: Any, fp: FilterParameters | None) -> Filter:
    from .layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
    from .layers.lstm import LSTMGateDescriptor, LSTMLayer, LSTMParameters
    from .layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

    def get(key: str) -> np.ndarray | None:
        full = f"{name}/{key}"
        return data[full] if full in data.files else None

    kind = meta["type"]
    if kind == "lstm":
        gates = {}
        for gate_name, act in zip(GATE_FIELDS, meta["gate_activations"]):
            gates[gate_name] = LSTMGateDescriptor(
                input_weights=(get(f"{gate_name}/input_weights0"), get(f"{gate_name}/input_weights1")),
                hidden_weights=get(f"{gate_name}/hidden_weights"), cell_weights=get(f"{gate_name}/cell_weights"),
                bias=get(f"{gate_name}/bias"), activation=_activation_from(act))
        params = LSTMParameters(
            input_size=meta["input_size"], hidden_size=meta["hidden_size"], num_layers=meta["num_layers"],
            bidirectional=meta["bidirectional"], batch_first=meta["batch_first"], dropout=meta["dropout"],
            seed=meta["seed"], default_activations=meta["default_activations"],
            hidden_activation=_activation_from(meta["hidden_activation"]), dtype=meta["dtype"], **gates)
        return LSTMLayer(params, fp)
    if kind == "normalization":
        moving = dict(moving_mean=get("moving_mean"), moving_variance=get("moving_variance"))
        ntype = {
            "batch_norm": lambda: NormalizationType.batch(**moving),
            "instance_norm": lambda: NormalizationType.instance(**moving),
            "layer_norm": lambda: NormalizationType.layer(normalization_axis=meta["normalization_axis"]),
            "group_norm": lambda: NormalizationType.group(group_count=meta["group_count"]),
        }[meta["kind"]]()
        params = NormalizationParameters(
            type=ntype, input_shape=tuple(meta["input_shape"]), gamma=get("gamma"), beta=get("beta"),
            momentum=meta["momentum"], epsilon=meta["epsilon"], activation=_activation_from(meta["activation"]),
            dtype=meta["dtype"])
        return NormalizationLayer(params, fp)
    if kind == "fully_connected":
        params = FullyConnectedParameters(
            input_size=meta["input_size"], output_size=meta["output_size"], weights=get("weights"),
            bias=get("bias"), activation=_activation_from(meta["activation"]), dtype=meta["dtype"])
        return FullyConnectedLayer(params, fp)
    raise InvalidParameterError(must_be(f"load_weights: layer {name!r} type", "lstm, normalization or "
                                        "fully_connected", kind))


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

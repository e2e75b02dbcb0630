"""Converting layers to and from PyTorch and Keras.

PyTorch: :func:`from_torch` turns an ``nn.LSTM`` (``proj_size`` included), ``nn.LayerNorm``,
``nn.RMSNorm``, ``nn.GroupNorm``, ``nn.BatchNorm1d/2d/3d``, ``nn.InstanceNorm1d/2d/3d`` or
``nn.Linear`` into the equivalent
bnnsfw layer with copied weights, and :func:`to_torch` goes back. Both are thin wrappers
around :func:`from_state_dict` and :func:`to_state_dict`, which work on plain state dicts of
NumPy arrays, so PyTorch is needed only to build or read modules.

Keras: :func:`from_keras` reads ``layer.get_weights()``-style arrays of an ``LSTM`` (kernel
``(I, 4H)``, gate order i, f, c, o), ``Bidirectional(LSTM)``, ``BatchNormalization``,
``LayerNormalization``, ``GroupNormalization`` or ``Dense``; :func:`load_keras` reads a
``.keras`` model (needs ``h5py``) as a :class:`~bnnsfw.Sequential` that predicts what Keras
predicts.

The conventions that differ (gate order, two biases, momentum direction, unbiased running
variance, channels-last data) are in ``docs/conversions.md``; what each conversion keeps
and refuses is decided in one place per layer kind below.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import re
import zipfile
from typing import Any, Mapping, Sequence

import attrs
import numpy as np

from .activation import Activation
from .enums import FilterType
from .errors import InvalidParameterError, ShapeError, UnsupportedError, must_be
from .filter import Filter, FilterParameters
from .layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
from .layers.lstm import GATE_FIELDS, LSTMActivations, LSTMGateDescriptor, LSTMLayer, LSTMParameters
from .layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType
from .sequential import FinalState, LastStep, Sequential, Softmax

__all__ = [
    "TorchState",
    "from_torch",
    "to_torch",
    "from_state_dict",
    "to_state_dict",
    "from_keras",
    "load_keras",
    "KERAS_PASS_THROUGH",
    "TORCH_MODULE_TYPES",
    "running_variance_to_torch",
    "running_variance_from_torch",
]

Parameters = Any  # LSTMParameters | NormalizationParameters | FullyConnectedParameters

#: The PyTorch module classes (by name) that convert, and the bnnsfw layer each becomes.
TORCH_MODULE_TYPES: dict[str, str] = {
    "LSTM": "LSTMLayer",
    "LayerNorm": "NormalizationLayer (layer)",
    "GroupNorm": "NormalizationLayer (group)",
    "BatchNorm1d": "NormalizationLayer (batch)",
    "BatchNorm2d": "NormalizationLayer (batch)",
    "BatchNorm3d": "NormalizationLayer (batch)",
    "InstanceNorm1d": "NormalizationLayer (instance)",
    "InstanceNorm2d": "NormalizationLayer (instance)",
    "InstanceNorm3d": "NormalizationLayer (instance)",
    "RMSNorm": "NormalizationLayer (RMS)",
    "Linear": "FullyConnectedLayer",
}


@attrs.frozen(kw_only=True, eq=False)
class TorchState:
    """A PyTorch module as plain data: its class name, constructor options and state dict.

    Attributes
    ----------
    module_type : str
        The ``torch.nn`` class name (``"LSTM"``, ``"BatchNorm2d"`` …).
    options : dict
        The constructor's keyword arguments (``hidden_size``, ``eps``, ``momentum`` …), so
        that ``getattr(torch.nn, module_type)(**options)`` builds a module of the right shape.
    state_dict : dict of str to ndarray
        What ``module.state_dict()`` holds, as NumPy arrays.
    """

    module_type: str
    options: dict[str, Any]
    state_dict: dict[str, np.ndarray]


# ------------------------------------------------------------------------------------------
# Small helpers.
# ------------------------------------------------------------------------------------------
def _dtype_of(arrays: Mapping[str, Any], dtype: Any) -> np.dtype:
    """``dtype`` if given, else float64 when the arrays are float64, else float32."""
    if dtype is not None:
        return np.dtype(dtype)
    kinds = {np.asarray(a).dtype for a in arrays.values() if np.asarray(a).dtype.kind == "f"}
    return np.dtype(np.float64) if kinds == {np.dtype(np.float64)} else np.dtype(np.float32)


def _take(where: str, state: Mapping[str, Any], key: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    if key not in state:
        raise InvalidParameterError(must_be(f"{where}[{key!r}]", "present", "no such key"))
    array = np.asarray(state[key])
    if shape is not None and array.shape != shape:
        raise ShapeError(must_be(f"{where}[{key!r}]", f"of shape {shape}", f"shape {array.shape}"))
    return array


def _no_other_keys(where: str, state: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(state) - known)
    if unknown:
        raise InvalidParameterError(must_be(f"{where} keys", f"among {sorted(known)}", unknown))


def _unsupported(where: str, feature: str, value: object) -> UnsupportedError:
    return UnsupportedError(must_be(where, f"something bnnsfw can express ({feature})", value))


# ------------------------------------------------------------------------------------------
# PyTorch LSTM.
# ------------------------------------------------------------------------------------------
# PyTorch's LSTM has two biases per gate; bnnsfw has one, their sum. So that PyTorch ->
# bnnsfw -> PyTorch gives back the very arrays it started from, each conversion remembers
# the split it summed, keyed by the bytes of the sum: to_state_dict finds it again while the
# bias is unchanged (through layer copies, save/load …), and otherwise writes the bias as
# bias_ih with bias_hh zero (only the sum matters). The memory is small and bounded.
_BIAS_SPLITS: collections.OrderedDict[bytes, tuple[np.ndarray, dict[str, np.ndarray]]] = (
    collections.OrderedDict())
_BIAS_SPLITS_KEPT = 64


def _bias_key(combined: np.ndarray) -> bytes:
    digest = hashlib.blake2b(repr((combined.dtype.str, combined.shape)).encode(), digest_size=16)
    digest.update(np.ascontiguousarray(combined).tobytes())
    return digest.digest()


def _remember_split(combined: np.ndarray, split: dict[str, np.ndarray]) -> None:
    key = _bias_key(combined)
    _BIAS_SPLITS[key] = (combined.copy(), {k: v.copy() for k, v in split.items()})
    _BIAS_SPLITS.move_to_end(key)
    while len(_BIAS_SPLITS) > _BIAS_SPLITS_KEPT:
        _BIAS_SPLITS.popitem(last=False)


def _recalled_split(combined: np.ndarray) -> dict[str, np.ndarray] | None:
    found = _BIAS_SPLITS.get(_bias_key(combined))
    if found is None or not np.array_equal(found[0], combined):
        return None
    return {k: v.copy() for k, v in found[1].items()}


def _combined_bias(params: LSTMParameters) -> np.ndarray | None:
    """Every gate's bias side by side: (L, D, 4H) in PyTorch's gate order i, f, g, o."""
    if params.input_gate.bias is None:
        return None
    return np.concatenate([g.bias for g in params.gates], axis=-1)


def _lstm_from_state_dict(state: Mapping[str, Any], options: Mapping[str, Any], dtype: Any) -> LSTMParameters:
    where = "from_state_dict('LSTM', state_dict)"
    options = dict(options)
    # --- The one place the options map. proj_size is LSTMParameters.projection_size; PyTorch's
    # LSTM has none of the other variants of SPEC §4.1.
    proj_size = int(options.pop("proj_size", 0) or 0)
    batch_first = bool(options.pop("batch_first", False))
    dropout = float(options.pop("dropout", 0.0))
    has_bias = bool(options.pop("bias", "bias_ih_l0" in state))
    declared = {k: options.pop(k) for k in ("input_size", "hidden_size", "num_layers", "bidirectional")
                if k in options}
    options.pop("device", None)
    options.pop("dtype", None)
    if options:
        raise InvalidParameterError(must_be(f"{where} options", "LSTM constructor options", sorted(options)))

    w0 = _take(where, state, "weight_ih_l0")
    if w0.ndim != 2 or w0.shape[0] % 4:
        raise ShapeError(must_be(f"{where}['weight_ih_l0']", "of shape (4·H, I)", f"shape {w0.shape}"))
    h, size_i = w0.shape[0] // 4, w0.shape[1]
    if "weight_hr_l0" in state:
        hr = np.shape(state["weight_hr_l0"])
        if len(hr) != 2 or hr[1] != h or (proj_size and hr[0] != proj_size):
            raise ShapeError(must_be(f"{where}['weight_hr_l0']", f"of shape ({proj_size or 'P'}, {h})",
                                     f"shape {hr}"))
        proj_size = int(hr[0])
    elif proj_size:
        raise InvalidParameterError(must_be(f"{where}['weight_hr_l0']", f"present (proj_size={proj_size})",
                                            "no such key"))
    p = proj_size or h  # the hidden state's size
    size_l = 0
    while f"weight_ih_l{size_l}" in state:
        size_l += 1
    bidirectional = "weight_ih_l0_reverse" in state
    inferred = {"input_size": size_i, "hidden_size": h, "num_layers": size_l, "bidirectional": bidirectional}
    for key, value in declared.items():
        if value != inferred[key]:
            raise ShapeError(must_be(f"{where} option {key}", f"{inferred[key]} (as the arrays say)", value))
    suffixes = ("", "_reverse") if bidirectional else ("",)
    d = len(suffixes)
    known: set[str] = set()
    dt = _dtype_of(state, dtype)

    def matrix(name: str, layer: int, suffix: str, width: int) -> np.ndarray:
        key = f"{name}_l{layer}{suffix}"
        known.add(key)
        return _take(where, state, key, (4 * h, width) if width else (4 * h,))

    w_ih = [[matrix("weight_ih", k, s, size_i if k == 0 else d * p) for s in suffixes] for k in range(size_l)]
    w_hh = [[matrix("weight_hh", k, s, p) for s in suffixes] for k in range(size_l)]
    projection = None
    if proj_size:
        keys = [[f"weight_hr_l{k}{s}" for s in suffixes] for k in range(size_l)]
        known.update(key for row in keys for key in row)
        projection = np.stack([np.stack([_take(where, state, key, (p, h)) for key in row])
                               for row in keys]).astype(dt)
    b_ih = b_hh = None
    if has_bias:
        b_ih = [[matrix("bias_ih", k, s, 0) for s in suffixes] for k in range(size_l)]
        b_hh = [[matrix("bias_hh", k, s, 0) for s in suffixes] for k in range(size_l)]
    _no_other_keys(where, state, known)

    gates: dict[str, Any] = {}
    for g, name in enumerate(GATE_FIELDS):  # PyTorch's i, f, g, o is bnnsfw's gate order
        rows = slice(g * h, (g + 1) * h)
        iw0 = np.stack([w[rows] for w in w_ih[0]])
        iw1 = (np.stack([np.stack([w[rows] for w in w_ih[k]]) for k in range(1, size_l)])
               if size_l > 1 else None)
        hw = np.stack([np.stack([w[rows] for w in w_hh[k]]) for k in range(size_l)])
        bias = None
        if b_ih is not None and b_hh is not None:
            bias = np.stack([np.stack([bi[rows].astype(dt) + bh[rows].astype(dt)
                                       for bi, bh in zip(b_ih[k], b_hh[k])]) for k in range(size_l)])
        upper = None if iw1 is None else iw1.astype(dt)
        gates[name] = LSTMGateDescriptor(input_weights=(iw0.astype(dt), upper), hidden_weights=hw.astype(dt),
                                         bias=bias)
    params = LSTMParameters(input_size=size_i, hidden_size=h, num_layers=size_l, bidirectional=bidirectional,
                            batch_first=batch_first, dropout=dropout, dtype=dt,
                            projection_size=proj_size or None, projection_weights=projection, **gates)
    combined = _combined_bias(params)
    if combined is not None:
        _remember_split(combined, {key: np.asarray(state[key]) for key in known if key.startswith("bias_")})
    return params


def _lstm_to_state_dict(params: LSTMParameters) -> TorchState:
    where = "to_state_dict(LSTM layer)"
    for name, gate in zip(GATE_FIELDS, params.gates):
        if gate.cell_weights is not None:
            raise _unsupported(f"{where}.{name}.cell_weights", "torch.nn.LSTM has no peepholes", "a peephole")
    for k in range(params.num_directions):
        acts = params.activations(k)
        if acts != LSTMActivations():
            raise _unsupported(f"{where} activations", "torch.nn.LSTM has sigmoid gates and tanh cells only",
                               [a.function.name for a in (*acts.gates, acts.hidden_activation)])
    for name, value in (("reverse", params.reverse), ("clip", params.clip), ("cell_clip", params.cell_clip),
                        ("projection_clip", params.projection_clip), ("input_forget", params.input_forget),
                        ("layer_norm", params.layer_norm)):
        if value not in (None, False):
            raise _unsupported(f"{where}.{name}", "torch.nn.LSTM has no such option",
                               "an LSTMLayerNorm" if name == "layer_norm" else value)
    h, d = params.hidden_size, params.num_directions
    suffixes = ("", "_reverse")[:d]
    sd: dict[str, np.ndarray] = {}
    combined = _combined_bias(params)
    split = None if combined is None else _recalled_split(combined)
    for layer in range(params.num_layers):
        for k, s in enumerate(suffixes):
            iw = [g.input_weights[0][k] if layer == 0 else g.input_weights[1][layer - 1, k]
                  for g in params.gates]
            sd[f"weight_ih_l{layer}{s}"] = np.concatenate(iw)
            sd[f"weight_hh_l{layer}{s}"] = np.concatenate([g.hidden_weights[layer, k] for g in params.gates])
            if params.projection_weights is not None:
                sd[f"weight_hr_l{layer}{s}"] = np.array(params.projection_weights[layer, k], copy=True)
            if combined is not None:
                if split is not None:
                    sd[f"bias_ih_l{layer}{s}"] = split[f"bias_ih_l{layer}{s}"]
                    sd[f"bias_hh_l{layer}{s}"] = split[f"bias_hh_l{layer}{s}"]
                else:
                    sd[f"bias_ih_l{layer}{s}"] = combined[layer, k].copy()
                    sd[f"bias_hh_l{layer}{s}"] = np.zeros(4 * h, dtype=params.dtype)
    options = {"input_size": params.input_size, "hidden_size": h, "num_layers": params.num_layers,
               "bias": combined is not None, "batch_first": bool(params.batch_first),
               "dropout": float(params.dropout), "bidirectional": bool(params.bidirectional),
               "proj_size": params.projection_size or 0}
    return TorchState(module_type="LSTM", options=options, state_dict=sd)


# ------------------------------------------------------------------------------------------
# PyTorch normalizations and Linear.
# ------------------------------------------------------------------------------------------
_NORM_TYPES = {"LayerNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
               "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "RMSNorm"}


def _norm_from_state_dict(module_type: str, state: Mapping[str, Any], options: Mapping[str, Any],
                          input_shape: Sequence[int | None] | None, dtype: Any) -> NormalizationParameters:
    where = f"from_state_dict({module_type!r}, state_dict)"
    options = dict(options)
    options.pop("device", None)
    options.pop("dtype", None)
    dt = _dtype_of(state, dtype)
    eps = options.pop("eps", None if module_type == "RMSNorm" else 1e-5)
    if module_type == "RMSNorm" and eps is None:
        eps = float(np.finfo(dt).eps)  # PyTorch's default: the machine epsilon of the dtype
    if module_type in ("LayerNorm", "RMSNorm"):
        shape = options.pop("normalized_shape", None)
        if shape is None:
            if "weight" not in state:
                raise InvalidParameterError(must_be(f"{where} options['normalized_shape']",
                                                    "given when the state has no weight", None))
            shape = np.shape(state["weight"])
        normalized = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        options.pop("elementwise_affine", None)
        options.pop("bias", None)
        full = tuple(input_shape) if input_shape is not None else normalized
        if tuple(full[len(full) - len(normalized):]) != normalized or len(full) < len(normalized):
            raise ShapeError(must_be(f"{where} input_shape", f"ending in normalized_shape {normalized}",
                                     full))
        rms = module_type == "RMSNorm"
        _no_other_keys(where, state, {"weight"} if rms else {"weight", "bias"})
        if options:
            raise InvalidParameterError(must_be(f"{where} options", f"{module_type} options",
                                                sorted(options)))
        axis = len(full) - len(normalized)
        kind = NormalizationType.rms(axis) if rms else NormalizationType.layer(normalization_axis=axis)
        return NormalizationParameters(type=kind, input_shape=full, gamma=state.get("weight"),
                                       beta=state.get("bias"), epsilon=eps, dtype=dt)

    if module_type == "GroupNorm":
        groups = options.pop("num_groups", None)
        channels = options.pop("num_channels", None)
        options.pop("affine", None)
        if groups is None:
            raise InvalidParameterError(must_be(f"{where} options['num_groups']", "given (the arrays do not "
                                                "say it)", None))
        if channels is None:
            channels = np.shape(state["weight"])[0] if "weight" in state else None
        # Without input_shape: images of any size, (C, None, None), GroupNorm's usual data.
        shape = tuple(input_shape) if input_shape is not None else (channels, None, None)
        if shape[0] is None or (channels is not None and shape[0] != channels):
            raise ShapeError(must_be(f"{where} input_shape", f"(C, *spatial) with C = {channels}", shape))
        _no_other_keys(where, state, {"weight", "bias"})
        if options:
            raise InvalidParameterError(must_be(f"{where} options", "GroupNorm options", sorted(options)))
        return NormalizationParameters(type=NormalizationType.group(group_count=int(groups)),
                                       input_shape=shape, gamma=state.get("weight"), beta=state.get("bias"),
                                       epsilon=eps, dtype=dt)

    # Batch and instance norm.
    batch = module_type.startswith("BatchNorm")
    rank = int(module_type[-2])  # the 1, 2 or 3 of BatchNorm2d
    momentum_pt = options.pop("momentum", 0.1)
    if momentum_pt is None:
        raise _unsupported(f"{where} options['momentum']",
                           "a cumulative moving average (momentum=None) has no bnnsfw counterpart", None)
    channels = options.pop("num_features", None)
    options.pop("affine", None)
    track = options.pop("track_running_stats", "running_mean" in state)
    if options:
        raise InvalidParameterError(must_be(f"{where} options", f"{module_type} options", sorted(options)))
    _no_other_keys(where, state, {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})
    if channels is None:
        for key in ("weight", "running_mean"):
            if key in state:
                channels = np.shape(state[key])[0]
                break
    if input_shape is None:
        if channels is None:
            raise InvalidParameterError(must_be(
                f"{where} input_shape", "the per-sample shape (C, *spatial) (no array says C)", None))
        # BatchNorm1d: (C,), its features; the others: their spatial axes of any size.
        spatial = 0 if (batch and rank == 1) else rank
        input_shape = (int(channels), *(None,) * spatial)
    shape = tuple(None if s is None else int(s) for s in input_shape)
    spatial_ranks = (0, 1) if (batch and rank == 1) else (rank,)
    if len(shape) - 1 not in spatial_ranks or (channels is not None and shape[0] != channels):
        raise ShapeError(must_be(f"{where} input_shape",
                                 f"(C, *spatial) with C = {channels} and {rank} spatial axes", shape))
    moving = {}
    if track:
        moving = {"moving_mean": _take(where, state, "running_mean"),
                  "moving_variance": _take(where, state, "running_var")}
    kind = NormalizationType.batch(**moving) if batch else NormalizationType.instance(**moving)
    return NormalizationParameters(type=kind, input_shape=shape, gamma=state.get("weight"),
                                   beta=state.get("bias"), momentum=1.0 - float(momentum_pt), epsilon=eps,
                                   dtype=dt)


def _norm_to_state_dict(layer: Filter | NormalizationParameters) -> TorchState:
    params = layer.layer_parameters if isinstance(layer, NormalizationLayer) else layer
    assert isinstance(params, NormalizationParameters)
    gamma = _live(layer, "gamma", params.gamma)
    kind, shape = params.type.kind, params.input_shape
    dt = params.dtype
    affine = params.affine_shape
    weight = np.ones(affine, dt) if gamma is None else np.array(gamma, copy=True)
    if params.type.root_mean_square:  # RMS normalization has no shift
        # PyTorch's eps=None is the dtype's machine epsilon: written so when it is that.
        eps = None if params.epsilon == float(np.finfo(dt).eps) else params.epsilon
        return TorchState(module_type="RMSNorm", options={"normalized_shape": list(affine), "eps": eps},
                          state_dict={"weight": weight})
    beta = _live(layer, "beta", params.beta)
    sd = {"weight": weight, "bias": np.zeros(affine, dt) if beta is None else np.array(beta, copy=True)}
    if kind is FilterType.layer_norm:
        return TorchState(module_type="LayerNorm", options={"normalized_shape": list(affine),
                                                             "eps": params.epsilon}, state_dict=sd)
    if kind is FilterType.group_norm:
        return TorchState(module_type="GroupNorm",
                          options={"num_groups": params.type.groups, "num_channels": shape[0],
                                   "eps": params.epsilon}, state_dict=sd)
    spatial = len(shape) - 1
    batch = kind is FilterType.batch_norm
    if spatial > 3 or (not batch and spatial == 0):
        what = "batch" if batch else "instance"
        raise _unsupported("to_state_dict(normalization) input_shape",
                           f"{what} norm over 1 to 3 spatial axes in PyTorch", shape)
    module_type = f"{'BatchNorm' if batch else 'InstanceNorm'}{max(spatial, 1)}d"
    track = params.type.has_moving_statistics
    options = {"num_features": shape[0], "eps": params.epsilon, "momentum": 1.0 - params.momentum,
               "affine": True, "track_running_stats": bool(track)}
    if track:
        sd["running_mean"] = np.array(_live(layer, "moving_mean", params.type.moving_mean), copy=True)
        sd["running_var"] = np.array(_live(layer, "moving_variance", params.type.moving_variance), copy=True)
        sd["num_batches_tracked"] = np.array(0, dtype=np.int64)
    return TorchState(module_type=module_type, options=options, state_dict=sd)


def _live(layer: object, name: str, fallback: Any) -> Any:
    """The array a layer computes with now (it may have trained), else the parameter's."""
    if isinstance(layer, Filter):
        return getattr(layer, name)
    return fallback


def _linear_from_state_dict(state: Mapping[str, Any], options: Mapping[str, Any], dtype: Any,
                            activation: Activation | None = None) -> FullyConnectedParameters:
    where = "from_state_dict('Linear', state_dict)"
    weight = _take(where, state, "weight")
    if weight.ndim != 2:
        raise ShapeError(must_be(f"{where}['weight']", "of shape (out_features, in_features)",
                                 f"shape {weight.shape}"))
    _no_other_keys(where, state, {"weight", "bias"})
    extra = set(options) - {"in_features", "out_features", "bias", "device", "dtype"}
    if extra:
        raise InvalidParameterError(must_be(f"{where} options", "Linear options", sorted(extra)))
    return FullyConnectedParameters(input_size=weight.shape[1], output_size=weight.shape[0], weights=weight,
                                    bias=state.get("bias"), dtype=_dtype_of(state, dtype),
                                    activation=activation or Activation.identity())


def _linear_to_state_dict(layer: Filter | FullyConnectedParameters) -> TorchState:
    params = layer.layer_parameters if isinstance(layer, FullyConnectedLayer) else layer
    assert isinstance(params, FullyConnectedParameters)
    if not params.activation.is_identity:
        raise _unsupported("to_state_dict(fully connected).activation",
                           "torch.nn.Linear has none; convert the layer without it",
                           params.activation.function.name)
    weights = _live(layer, "weights", params.weights)
    bias = _live(layer, "bias", params.bias)
    sd = {"weight": np.array(weights, copy=True)}
    if bias is not None:
        sd["bias"] = np.array(bias, copy=True)
    return TorchState(module_type="Linear", options={"in_features": params.input_size,
                                                     "out_features": params.output_size,
                                                     "bias": bias is not None}, state_dict=sd)


# ------------------------------------------------------------------------------------------
# Public: state dicts and modules.
# ------------------------------------------------------------------------------------------
def from_state_dict(module_type: str, state_dict: Mapping[str, Any], *,
                    input_shape: Sequence[int | None] | None = None, dtype: Any = None,
                    **options: Any) -> Parameters:
    """bnnsfw parameters from a PyTorch module's state dict of NumPy arrays (no PyTorch needed).

    Parameters
    ----------
    module_type : str
        The ``torch.nn`` class name: one of :data:`TORCH_MODULE_TYPES`.
    state_dict : mapping of str to array
        ``{k: v.numpy() for k, v in module.state_dict().items()}``, or arrays made any other way.
    input_shape : tuple of int or None, optional
        The per-sample shape ``(C, *spatial)`` of a normalization layer, ``None`` for a
        spatial size left open. By default: a ``LayerNorm`` or ``RMSNorm`` its
        ``normalized_shape`` (under any leading axes); ``BatchNorm1d`` ``(C,)``, its
        ``(N, C)`` features (``(C, None)`` is the ``(N, C, L)`` layer); ``BatchNorm2d/3d`` and
        ``InstanceNorm1d/2d/3d`` ``(C, None, …)`` with their number of spatial axes;
        ``GroupNorm`` ``(C, None, None)``, images (give ``(C,)`` or ``(C, None)`` for other
        data).
    dtype : float32 or float64, optional
        The layer's dtype; by default float64 when the arrays are, else float32.
    **options
        The module's constructor options the arrays do not say: ``batch_first`` and
        ``dropout`` of an LSTM (``proj_size`` is read from ``weight_hr_l0``), ``eps`` (an
        ``RMSNorm``'s ``None``, its default, is the dtype's machine epsilon) and ``momentum``
        (PyTorch's, converted: bnnsfw's momentum is ``1 − momentum``) of a norm,
        ``num_groups`` of a ``GroupNorm``.

    Returns
    -------
    LSTMParameters, NormalizationParameters or FullyConnectedParameters

    Raises
    ------
    UnsupportedError
        For what bnnsfw cannot express: ``momentum=None`` (a cumulative average).

    Examples
    --------
    >>> import numpy as np
    >>> sd = {"weight": np.eye(2), "bias": np.array([1.0, -1.0])}
    >>> p = from_state_dict("Linear", sd)
    >>> p.dtype, p.bias
    (dtype('float64'), array([ 1., -1.]))
    """
    if not isinstance(state_dict, Mapping):
        raise InvalidParameterError(must_be("from_state_dict(state_dict)", "a mapping of name to array",
                                            type(state_dict).__name__))
    state = {str(k): np.asarray(v) for k, v in state_dict.items()}
    if module_type == "LSTM":
        return _lstm_from_state_dict(state, options, dtype)
    if module_type in _NORM_TYPES:
        return _norm_from_state_dict(module_type, state, options, input_shape, dtype)
    if module_type == "Linear":
        return _linear_from_state_dict(state, options, dtype)
    raise _unsupported("from_state_dict(module_type)", f"one of {', '.join(TORCH_MODULE_TYPES)}", module_type)


def to_state_dict(layer: Any) -> TorchState:
    """The PyTorch form of a bnnsfw layer (or its parameters): class name, options, state dict.

    A layer's *live* arrays are taken (what it computes with now, after any training).
    An LSTM converted from PyTorch gets its two biases back exactly while the layer's bias
    is unchanged; otherwise the bias is written as ``bias_ih`` and ``bias_hh`` is zero (only
    their sum matters). Running variance is copied as it is (see ``docs/conversions.md``).

    Raises
    ------
    UnsupportedError
        For what PyTorch cannot express: peepholes, non-default LSTM activations (per
        direction too), the LSTM variants ``reverse``, ``clip``, ``cell_clip``,
        ``projection_clip``, ``input_forget`` and ``layer_norm`` (a projection converts), a fused
        activation on a normalization or fully connected layer, more than 3 spatial axes.
    """
    if isinstance(layer, LSTMLayer):
        layer.check_open("to_state_dict")
        return _lstm_to_state_dict(layer.layer_parameters)
    if isinstance(layer, LSTMParameters):
        return _lstm_to_state_dict(layer)
    if isinstance(layer, (NormalizationLayer, NormalizationParameters)):
        if isinstance(layer, Filter):
            layer.check_open("to_state_dict")
        params = layer.layer_parameters if isinstance(layer, NormalizationLayer) else layer
        if not params.activation.is_identity:
            raise _unsupported("to_state_dict(normalization).activation",
                               "PyTorch's norms have no fused activation", params.activation.function.name)
        return _norm_to_state_dict(layer)
    if isinstance(layer, (FullyConnectedLayer, FullyConnectedParameters)):
        if isinstance(layer, Filter):
            layer.check_open("to_state_dict")
        return _linear_to_state_dict(layer)
    raise InvalidParameterError(must_be("to_state_dict(layer)", "a bnnsfw LSTM, normalization or fully "
                                        "connected layer or its parameters", type(layer).__name__))


_LAYER_OF = {LSTMParameters: LSTMLayer, NormalizationParameters: NormalizationLayer,
             FullyConnectedParameters: FullyConnectedLayer}


def _module_options(module: Any) -> dict[str, Any]:
    """The constructor options of a supported torch module that its state dict does not say."""
    name = type(module).__name__
    if name == "LSTM":
        return {"batch_first": module.batch_first, "dropout": module.dropout, "proj_size": module.proj_size,
                "bias": module.bias}
    if name == "LayerNorm":
        return {"normalized_shape": tuple(module.normalized_shape), "eps": module.eps}
    if name == "GroupNorm":
        return {"num_groups": module.num_groups, "num_channels": module.num_channels, "eps": module.eps}
    if name == "RMSNorm":
        return {"normalized_shape": tuple(module.normalized_shape), "eps": module.eps}
    if name.startswith(("BatchNorm", "InstanceNorm")):
        return {"num_features": module.num_features, "eps": module.eps, "momentum": module.momentum,
                "track_running_stats": module.track_running_stats}
    return {}


def from_torch(module: Any, *, input_shape: Sequence[int | None] | None = None, dtype: Any = None,
               filter_parameters: FilterParameters | None = None) -> Filter:
    """The bnnsfw layer equivalent to a PyTorch module, with its weights copied.

    Parameters
    ----------
    module : torch.nn.Module
        An ``LSTM`` (stacked, bidirectional, ``batch_first``, ``proj_size``), ``LayerNorm``,
        ``RMSNorm``, ``GroupNorm``, ``BatchNorm1d/2d/3d``, ``InstanceNorm1d/2d/3d`` or ``Linear``.
    input_shape, dtype
        As for :func:`from_state_dict`; ``dtype`` defaults to the module's (float32 for a
        module without parameters).
    filter_parameters : FilterParameters, optional
        Passed to the new layer.

    Returns
    -------
    LSTMLayer, NormalizationLayer or FullyConnectedLayer
        A layer that computes what the module computes: ``module.eval()``'s output in the
        inference phase, ``module.train()``'s in the training phase (running statistics
        updated with the converted momentum).
    """
    name = type(module).__name__
    if name not in TORCH_MODULE_TYPES:
        raise _unsupported("from_torch(module)", f"one of torch.nn.{', '.join(TORCH_MODULE_TYPES)}", name)
    state = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
    params = from_state_dict(name, state, input_shape=input_shape, dtype=dtype, **_module_options(module))
    layer: Filter = _LAYER_OF[type(params)](params, filter_parameters)
    return layer


def to_torch(layer: Any) -> Any:
    """A PyTorch module computing what a bnnsfw layer computes, with its weights copied.

    The module has the layer's dtype; see :func:`to_state_dict` for what is kept and refused.
    """
    import torch

    state = to_state_dict(layer)
    dtype = torch.float64 if _state_dtype(state) == np.float64 else torch.float32
    module = getattr(torch.nn, state.module_type)(**state.options).to(dtype)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.state_dict.items()}
    module.load_state_dict(tensors)
    return module


def _state_dtype(state: TorchState) -> Any:
    floats = [v.dtype for v in state.state_dict.values() if v.dtype.kind == "f"]
    return floats[0] if floats else np.float32


# ------------------------------------------------------------------------------------------
# Keras.
# ------------------------------------------------------------------------------------------
# Keras activation names, as Keras 3 defines them, and the bnnsfw Activation of each.
_KERAS_ACTIVATIONS: dict[str, Activation] = {
    "linear": Activation.identity(),
    "relu": Activation.relu(),
    "sigmoid": Activation.sigmoid(),
    "tanh": Activation.tanh(),
    "hard_sigmoid": Activation.hard_sigmoid(alpha=1.0 / 6.0, beta=0.5),  # relu6(x + 3) / 6
    "softsign": Activation.softsign(),
    "softplus": Activation.softplus(),
    "elu": Activation.elu(),
    "selu": Activation.selu(),
    "gelu": Activation.gelu(),
    "silu": Activation.silu(),
    "swish": Activation.silu(),
    "relu6": Activation.relu6(),
    "log_sigmoid": Activation.log_sigmoid(),
    "hard_silu": Activation.hard_swish(),
    "hard_swish": Activation.hard_swish(),
}


def _keras_activation(where: str, name: object) -> Activation:
    if name is None:
        return Activation.identity()
    if isinstance(name, str) and name in _KERAS_ACTIVATIONS:
        return _KERAS_ACTIVATIONS[name]
    raise _unsupported(where, f"a Keras activation among {', '.join(_KERAS_ACTIVATIONS)}", name)


def _keras_lstm(weights: Sequence[Any], config: Mapping[str, Any], dt: np.dtype,
                bidirectional: bool) -> LSTMParameters:
    where = "from_keras('LSTM')"
    config = dict(config)
    # --- The one place Keras LSTM options map; what bnnsfw cannot express exactly is refused.
    if config.get("go_backwards"):
        # Keras returns the outputs of a backwards LSTM in processing order (its output t is
        # the step of input T−1−t, and its last output the state after input 0); bnnsfw's
        # reverse=True runs the same recurrence but keeps each output at its input's step.
        raise _unsupported(f"{where} go_backwards", "False: Keras returns a backwards LSTM's outputs "
                           "time-reversed, bnnsfw's reverse=True aligns them with the input steps (convert "
                           "without go_backwards, set reverse=True and flip the output along time)", True)
    for option in ("dropout", "recurrent_dropout"):
        if config.get(option):
            raise _unsupported(f"{where} {option}", "Keras's in-layer dropout masks (bnnsfw drops between "
                               "layers)", config[option])
    use_bias = bool(config.get("use_bias", True))
    per_direction = 3 if use_bias else 2
    d = 2 if bidirectional else 1
    if len(weights) != per_direction * d:
        raise InvalidParameterError(must_be(f"{where} weights", f"{per_direction * d} arrays (kernel, "
                                            f"recurrent_kernel{', bias' if use_bias else ''} per direction)",
                                            len(weights)))
    arrays = [np.asarray(w) for w in weights]
    kernel = arrays[0]
    if kernel.ndim != 2 or kernel.shape[1] % 4:
        raise ShapeError(must_be(f"{where} kernel", "of shape (I, 4·H)", f"shape {kernel.shape}"))
    size_i, h = kernel.shape[0], kernel.shape[1] // 4
    for k in range(d):
        group = arrays[k * per_direction:(k + 1) * per_direction]
        expected = [(size_i, 4 * h), (h, 4 * h)] + ([(4 * h,)] if use_bias else [])
        for array, shape, label in zip(group, expected, ("kernel", "recurrent_kernel", "bias")):
            if array.shape != shape:
                raise ShapeError(must_be(f"{where} {label} of direction {k}", f"of shape {shape}",
                                         f"shape {array.shape}"))
    gates: dict[str, Any] = {}
    for g, name in enumerate(GATE_FIELDS):  # Keras's i, f, c, o is bnnsfw's i, f, g, o
        cols = slice(g * h, (g + 1) * h)
        iw0 = np.stack([arrays[k * per_direction][:, cols].T for k in range(d)])
        hw = np.stack([arrays[k * per_direction + 1][:, cols].T for k in range(d)])[None]
        bias = np.stack([arrays[k * per_direction + 2][cols] for k in range(d)])[None] if use_bias else None
        gates[name] = LSTMGateDescriptor(input_weights=(iw0, None), hidden_weights=hw, bias=bias)
    gate = _keras_activation(f"{where} recurrent_activation", config.get("recurrent_activation", "sigmoid"))
    cell = _keras_activation(f"{where} activation", config.get("activation", "tanh"))
    gates = {name: attrs.evolve(descriptor, activation=cell if name == "candidate_gate" else gate)
             for name, descriptor in gates.items()}
    return LSTMParameters(input_size=size_i, hidden_size=h, bidirectional=bidirectional, batch_first=True,
                          hidden_activation=cell, dtype=dt, **gates)


def _keras_axis(where: str, axis: object, rank: int) -> int:
    """A Keras axis (counting the batch axis, negative from the end) as a per-sample axis."""
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            raise _unsupported(f"{where} axis", "one axis", axis)
        axis = axis[0]
    value = int(axis)  # type: ignore[call-overload]  # whatever Keras's config holds: int() is the check
    per_sample = value - 1 if value > 0 else rank + value
    if not 0 <= per_sample < rank:
        raise InvalidParameterError(must_be(f"{where} axis", f"an axis of the {rank}-d sample", axis))
    return per_sample


def _keras_norm(kind: str, weights: Sequence[Any], config: Mapping[str, Any],
                input_shape: Sequence[int] | None, dt: np.dtype) -> NormalizationParameters:
    where = f"from_keras({kind!r})"
    arrays = [np.asarray(w) for w in weights]
    scale, center = bool(config.get("scale", True)), bool(config.get("center", True))
    gamma = arrays.pop(0) if scale and arrays else None
    beta = arrays.pop(0) if center and arrays else None
    width = (gamma if gamma is not None else beta if beta is not None else arrays[0] if arrays else None)
    if input_shape is None:
        if width is None:
            raise InvalidParameterError(must_be(f"{where} input_shape", "given (no weights say it)", None))
        input_shape = tuple(np.shape(width))
    shape = tuple(int(s) for s in input_shape)
    axis = _keras_axis(where, config.get("axis", -1), len(shape))
    eps = float(config.get("epsilon", 1e-3))
    if kind == "RMSNormalization":  # x · γ / sqrt(mean(x²) + ε) over the axes; weights [scale]
        axes = config.get("axis", -1)
        listed = list(axes) if isinstance(axes, (list, tuple)) else [axes]
        per = sorted(_keras_axis(where, [a], len(shape)) for a in listed)
        if per != list(range(per[0], len(shape))):
            raise _unsupported(f"{where} axis", "trailing axes only", axes)
        if len(weights) != 1:
            raise InvalidParameterError(must_be(f"{where} weights", "[scale]", f"{len(weights)} arrays"))
        return NormalizationParameters(type=NormalizationType.rms(per[0]), input_shape=shape,
                                       gamma=np.broadcast_to(np.asarray(weights[0]), shape[per[0]:]),
                                       epsilon=float(config.get("epsilon", 1e-6)), dtype=dt)
    if kind == "LayerNormalization":
        if config.get("rms_scaling"):
            # Keras's rms_scaling divides the uncentred x by sqrt(variance + ε), the variance
            # taken about the mean, in the Keras versions that define it this way: neither a
            # layer norm nor RMS normalization, and a file does not say which version wrote it.
            raise _unsupported(f"{where} rms_scaling",
                               "False: Keras's rms_scaling is x·γ/sqrt(var(x) + ε) (not the mean of "
                               "squares), which no bnnsfw normalization computes; Keras's RMSNormalization "
                               "layer converts", True)
        axes = config.get("axis", -1)
        if isinstance(axes, (list, tuple)) and len(axes) > 1:
            per = sorted(_keras_axis(where, [a], len(shape)) for a in axes)
            if per != list(range(per[0], len(shape))):
                raise _unsupported(f"{where} axis", "trailing axes only", axes)
            axis = per[0]
        if arrays:
            raise InvalidParameterError(must_be(f"{where} weights", "[gamma, beta] (as scale and center say)",
                                                f"{len(weights)} arrays"))
        trailing = shape[axis:]
        return NormalizationParameters(
            type=NormalizationType.layer(normalization_axis=axis), input_shape=shape,
            gamma=None if gamma is None else np.broadcast_to(gamma, trailing),
            beta=None if beta is None else np.broadcast_to(beta, trailing), epsilon=eps, dtype=dt)
    # Batch and group normalization normalize per channel: bnnsfw's channel is axis 0.
    if axis != 0:
        raise _unsupported(
            f"{where} axis", "the channel axis first in bnnsfw: give input_shape channels-first and "
            "transpose the data (x.transpose(0, 2, 1) for (N, T, C))", config.get("axis", -1))
    if kind == "GroupNormalization":
        if arrays:
            raise InvalidParameterError(must_be(f"{where} weights", "[gamma, beta]",
                                                f"{len(weights)} arrays"))
        groups = int(config.get("groups", 32))
        return NormalizationParameters(type=NormalizationType.group(group_count=groups),
                                       input_shape=shape, gamma=gamma, beta=beta, epsilon=eps, dtype=dt)
    if len(arrays) != 2:
        raise InvalidParameterError(must_be(f"{where} weights", "[gamma, beta, moving_mean, moving_variance] "
                                            "(as scale and center say)", f"{len(weights)} arrays"))
    return NormalizationParameters(
        type=NormalizationType.batch(moving_mean=arrays[0], moving_variance=arrays[1]), input_shape=shape,
        gamma=gamma, beta=beta, momentum=float(config.get("momentum", 0.99)), epsilon=eps, dtype=dt)


def from_keras(class_name: str, weights: Sequence[Any], config: Mapping[str, Any] | None = None, *,
               input_shape: Sequence[int] | None = None, dtype: Any = None) -> Parameters:
    """bnnsfw parameters from a Keras layer's ``get_weights()`` arrays and ``get_config()``.

    Parameters
    ----------
    class_name : str
        ``"LSTM"``, ``"Bidirectional"`` (of an LSTM, ``merge_mode="concat"``),
        ``"BatchNormalization"``, ``"LayerNormalization"``, ``"GroupNormalization"``,
        ``"RMSNormalization"`` (Keras 3's layer; weights ``[scale]``) or ``"Dense"``.
    weights : sequence of arrays
        In Keras's order: LSTM ``[kernel (I, 4H), recurrent_kernel (H, 4H), bias (4H,)]``
        (gates i, f, c, o; the forward then the backward layer's for ``Bidirectional``);
        batch norm ``[gamma, beta, moving_mean, moving_variance]``; layer and group norm
        ``[gamma, beta]`` (either left out when ``scale`` / ``center`` is false); Dense
        ``[kernel (I, O), bias]``.
    config : mapping, optional
        The layer's ``get_config()`` (activations, ``use_bias``, ``axis``, ``epsilon``,
        ``momentum``, ``groups`` …); Keras's defaults when omitted.
    input_shape : tuple of int, optional
        The per-sample shape of a normalization layer, **channels first** (bnnsfw's layout):
        Keras's batch and group norm normalize its last axis by default, so give ``(C, …)``
        and transpose the data. Defaults to the weights' shape.
    dtype : float32 or float64, optional
        By default float64 when the arrays are, else float32.

    Returns
    -------
    LSTMParameters (``batch_first=True``, as Keras), NormalizationParameters or FullyConnectedParameters
    """
    config = dict(config or {})
    dt = _dtype_of({str(i): w for i, w in enumerate(weights)}, dtype)
    if class_name == "LSTM":
        return _keras_lstm(weights, config, dt, bidirectional=False)
    if class_name == "Bidirectional":
        inner = dict(config.get("layer", {}).get("config", {})) if "layer" in config else config
        mode = config.get("merge_mode", "concat")
        if mode != "concat":
            raise _unsupported("from_keras('Bidirectional') merge_mode", "'concat' (bnnsfw's output layout)",
                               mode)
        return _keras_lstm(weights, inner, dt, bidirectional=True)
    if class_name in ("BatchNormalization", "LayerNormalization", "GroupNormalization", "RMSNormalization"):
        return _keras_norm(class_name, weights, config, input_shape, dt)
    if class_name == "Dense":
        arrays = [np.asarray(w) for w in weights]
        if not arrays or arrays[0].ndim != 2:
            raise ShapeError(must_be("from_keras('Dense') weights", "[kernel (I, O), bias (O,)]",
                                     [a.shape for a in arrays]))
        kernel = arrays[0]
        return FullyConnectedParameters(
            input_size=kernel.shape[0], output_size=kernel.shape[1], weights=kernel.T,
            bias=arrays[1] if len(arrays) > 1 else None, dtype=dt,
            activation=_keras_activation("from_keras('Dense') activation",
                                         config.get("activation", "linear")))
    raise _unsupported("from_keras(class_name)", "LSTM, Bidirectional, BatchNormalization, "
                       "LayerNormalization, GroupNormalization or Dense", class_name)


#: Keras layers that compute nothing at inference (noise, dropout, regularizers, the input):
#: ``load_keras`` leaves them out. Every other layer computes or is refused by name.
KERAS_PASS_THROUGH = frozenset({"InputLayer", "Dropout", "SpatialDropout1D", "GaussianNoise",
                                "GaussianDropout", "AlphaDropout", "ActivityRegularization", "Identity"})

#: The Keras layers ``load_keras`` computes.
_KERAS_COMPUTED = ("LSTM", "Bidirectional", "Dense", "LayerNormalization", "BatchNormalization",
                   "RMSNormalization", "GroupNormalization")

# Why a layer a Keras sequence model often holds is refused, where the class name is not enough.
_KERAS_REFUSALS = {
    "Masking": "a layer bnnsfw computes (Masking makes Keras's LSTM skip the masked steps: leave it out "
               "and pass sequence_lengths to LSTMLayer.apply)",
    "GRU": "a layer bnnsfw computes (bnnsfw has no GRU)",
    "SimpleRNN": "a layer bnnsfw computes (bnnsfw has no simple RNN)",
    "Activation": "a layer bnnsfw computes (give the activation to the Dense layer before it)",
}

# The inbound-node arguments a layer may be called with: Keras records them, they change nothing.
_KERAS_CALL_OPTIONS = {"training", "mask"}


def _snake(name: str) -> str:
    """Keras's snake case of a class name: ``LSTM`` -> ``lstm``, ``LayerNormalization`` ->
    ``layer_normalization``."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", re.sub(r"\W+", "", name))
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def load_keras(path: str | os.PathLike[str], *, dtype: Any = None,
               filter_parameters: FilterParameters | None = None) -> Sequential:
    """A Keras 3 ``.keras`` model as a :class:`~bnnsfw.Sequential` whose ``apply(x)`` is Keras's
    ``model.predict(x)``.

    Reads the file's ``config.json`` and ``model.weights.h5`` (``h5py`` needed). The model is
    a Keras ``Sequential`` or a linear functional model: one input, one output, every layer
    called once on one tensor (otherwise :class:`~bnnsfw.UnsupportedError` names the layer
    where the graph branches or joins). The container's layers keep the Keras names; the
    data stays batch-first ``(N, T, F)`` as in Keras.

    - ``LSTM`` and ``Bidirectional(LSTM)`` (``merge_mode="concat"``) are LSTM layers. Without
      ``return_sequences`` an element ``"<name>:last"`` follows: :class:`~bnnsfw.LastStep`,
      or for ``Bidirectional`` :class:`~bnnsfw.FinalState` (each direction's final state).
    - ``Dense`` is a fully connected layer with its activation; a softmax is an element
      ``"<name>:softmax"`` (:class:`~bnnsfw.Softmax`) after it.
    - ``LayerNormalization``, ``BatchNormalization`` and ``RMSNormalization`` over the last
      axis normalize each step (per-sample shape ``(C,)``); ``GroupNormalization`` only where
      no time axis is left (on ``(N, T, C)`` Keras's statistics span the whole sequence).
    - The layers of :data:`KERAS_PASS_THROUGH` (``Dropout``, ``GaussianNoise`` …) are left
      out; every other layer (``GRU``, ``Masking``, ``Conv1D``, ``Flatten`` …) is refused by
      name.

    Every element has its backward, so a loaded model can be trained further.

    Parameters
    ----------
    path : str or path-like
        A ``.keras`` file.
    dtype : float32 or float64, optional
        By default that of the file's weights (float32 for Keras's default policy).
    filter_parameters : FilterParameters, optional
        Given to every layer (the backend, for instance).
    """
    try:
        import h5py
    except ImportError:  # pragma: no cover - exercised only without h5py
        raise UnsupportedError(must_be("load_keras", "run with h5py installed (pip install h5py)",
                                       "no h5py")) from None
    where = f"load_keras({os.fspath(path)!r})"
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as error:
        raise InvalidParameterError(must_be(where, "a .keras file (a zip archive)", str(error))) from None
    with archive:
        names = set(archive.namelist())
        if not {"config.json", "model.weights.h5"} <= names:
            raise InvalidParameterError(must_be(where, "a Keras 3 file with config.json and model.weights.h5",
                                                sorted(names)))
        config = json.loads(archive.read("config.json"))
        weights_file = io.BytesIO(archive.read("model.weights.h5"))
    layers_config = config.get("config", {}).get("layers", [])
    if config.get("class_name") not in ("Sequential", "Functional", "Model") or not layers_config:
        raise UnsupportedError(must_be(where, "a Sequential or functional model", config.get("class_name")))
    # Keras names a layer's weights after its class, numbered from the second one on, in the
    # order of the model's layers.
    groups: dict[int, str] = {}
    counts: collections.Counter[str] = collections.Counter()
    for index, entry in enumerate(layers_config):
        snake = _snake(str(entry.get("class_name")))
        groups[index] = snake if counts[snake] == 0 else f"{snake}_{counts[snake]}"
        counts[snake] += 1
    chain = (list(range(len(layers_config))) if config.get("class_name") == "Sequential"
             else _keras_chain(where, config["config"]))
    elements: dict[str, Any] = {}
    try:
        with h5py.File(weights_file, "r") as h5:
            _keras_read_chain(where, [(layers_config[index], groups[index]) for index in chain], h5,
                              elements, dtype, filter_parameters)
        if not elements:
            raise UnsupportedError(must_be(where, "a model with at least one layer bnnsfw computes", "none"))
        return Sequential(elements)
    except BaseException:
        for element in elements.values():  # the layers made before the refusal
            if isinstance(element, Filter):
                element.close()
        raise


def _keras_read_chain(where: str, chain: list[tuple[Mapping[str, Any], str]], h5: Any,
                      elements: dict[str, Any], dtype: Any,
                      filter_parameters: FilterParameters | None) -> None:
    """Add the container elements of each Keras layer of the chain (its config entry and the
    name of its weights group) to ``elements``, in order."""
    flow = _KerasFlow(sequence=None, width=None)
    for entry, group_name in chain:
        class_name, layer_config = str(entry.get("class_name")), dict(entry.get("config", {}))
        name = str(layer_config.get("name", group_name))
        if class_name == "InputLayer":
            batch_shape = layer_config.get("batch_shape") or layer_config.get("batch_input_shape")
            if batch_shape:
                flow = _KerasFlow(sequence=len(batch_shape) == 3, width=batch_shape[-1])
            continue
        if class_name in KERAS_PASS_THROUGH:
            continue
        if class_name not in _KERAS_COMPUTED:
            rule = (_KERAS_REFUSALS.get(class_name)
                    or f"a layer bnnsfw computes ({', '.join(_KERAS_COMPUTED)}) or one that passes "
                       f"through ({', '.join(sorted(KERAS_PASS_THROUGH))})")
            raise UnsupportedError(must_be(f"{where}: layer {name!r}", rule, class_name))
        group = h5.get(f"layers/{group_name}")
        if group is None:
            raise InvalidParameterError(must_be(f"{where}: weights of layer {name!r}",
                                                f"at layers/{group_name}", "missing"))
        arrays = _keras_group_arrays(group, class_name)
        added, flow = _keras_elements(f"{where}: layer {name!r}", class_name, layer_config, arrays, flow,
                                      dtype)
        for suffix, element in added:
            key = name + suffix
            if key in elements:
                raise InvalidParameterError(must_be(f"{where}: layer {name!r}", "a name of its own", key))
            elements[key] = (_LAYER_OF[type(element)](element, filter_parameters)
                             if type(element) in _LAYER_OF else element)


@attrs.frozen
class _KerasFlow:
    """What reaches a Keras layer: a sequence ``(N, T, C)`` or not, and ``C`` when known."""

    sequence: bool | None
    width: int | None


def _keras_elements(where: str, class_name: str, config: Mapping[str, Any], arrays: list[np.ndarray],
                    flow: _KerasFlow, dtype: Any) -> tuple[list[tuple[str, Any]], _KerasFlow]:
    """The container elements of one Keras layer (parameters, or LastStep / FinalState /
    Softmax), each with the suffix of its name, and what leaves the layer."""
    if class_name in ("LSTM", "Bidirectional"):
        inner = dict(config.get("layer", {}).get("config", {})) if class_name == "Bidirectional" else config
        if class_name == "Bidirectional":
            _keras_check_backward_layer(where, config)
        for option in ("return_state", "stateful"):
            if inner.get(option):
                raise _unsupported(f"{where} {option}", "False (a loaded model returns one array and starts "
                                   "from zero states)", True)
        params = from_keras(class_name, arrays, config, dtype=dtype)
        width = params.num_directions * params.hidden_size
        if inner.get("return_sequences", False):
            return [("", params)], _KerasFlow(sequence=True, width=width)
        final: FinalState | LastStep = FinalState(2) if params.bidirectional else LastStep()
        return [("", params), (":last", final)], _KerasFlow(sequence=False, width=width)
    if class_name == "Dense":
        softmax = config.get("activation") == "softmax"
        params = from_keras("Dense", arrays, {**config, "activation": "linear"} if softmax else config,
                            dtype=dtype)
        added: list[tuple[str, Any]] = [("", params), *([(":softmax", Softmax())] if softmax else [])]
        return added, _KerasFlow(sequence=flow.sequence, width=params.output_size)
    # A normalization over the last axis, applied to each step of a sequence.
    axes = config.get("axis", -1)
    listed = list(axes) if isinstance(axes, (list, tuple)) else [axes]
    last_axes = [-1] if flow.sequence is None else [-1, 2 if flow.sequence else 1]
    if len(listed) != 1 or listed[0] not in last_axes:
        spelled = " or ".join(str(a) for a in last_axes)
        rule = f"the last axis ({spelled}): bnnsfw normalizes each step's features"
        raise _unsupported(f"{where} axis", rule, axes)
    if class_name == "GroupNormalization" and flow.sequence:
        raise _unsupported(f"{where}", "GroupNormalization where no time axis is left: on (N, T, C) Keras "
                           "takes each group's statistics over the whole sequence, not each step",
                           "GroupNormalization on a sequence")
    width = flow.width
    params = from_keras(class_name, arrays, {**config, "axis": -1},
                        input_shape=None if width is None else (width,), dtype=dtype)
    return [("", params)], _KerasFlow(sequence=flow.sequence, width=params.input_shape[0])


def _keras_check_backward_layer(where: str, config: Mapping[str, Any]) -> None:
    """A Bidirectional's backward layer is the forward LSTM's twin (as Keras makes it by default)."""
    forward, backward = config.get("layer", {}), config.get("backward_layer")
    if forward.get("class_name") != "LSTM":
        raise UnsupportedError(must_be(f"{where} layer", "a Bidirectional of an LSTM",
                                       forward.get("class_name")))
    if backward is None:
        return
    if backward.get("class_name") != "LSTM":
        raise UnsupportedError(must_be(f"{where} backward_layer", "an LSTM", backward.get("class_name")))
    ours, theirs = forward.get("config", {}), backward.get("config", {})
    for key in ("units", "activation", "recurrent_activation", "use_bias", "return_sequences", "dropout",
                "recurrent_dropout"):
        if ours.get(key) != theirs.get(key):
            rule = f"the forward layer's {key} ({ours.get(key)!r})"
            raise UnsupportedError(must_be(f"{where} backward_layer {key}", rule, theirs.get(key)))


def _keras_endpoints(value: Any) -> list[str]:
    """The layer names of a functional config's ``input_layers`` / ``output_layers``."""
    if isinstance(value, list) and len(value) == 3 and isinstance(value[0], str):
        return [value[0]]
    if isinstance(value, list):
        return [name for item in value for name in _keras_endpoints(item)]
    return []


def _keras_sources(value: Any) -> list[str]:
    """The layers whose tensors an inbound node's arguments hold, in order."""
    if isinstance(value, dict):
        if value.get("class_name") == "__keras_tensor__":
            return [str(value["config"]["keras_history"][0])]
        return [name for item in value.values() for name in _keras_sources(item)]
    if isinstance(value, (list, tuple)):
        return [name for item in value for name in _keras_sources(item)]
    return []


def _keras_chain(where: str, model: Mapping[str, Any]) -> list[int]:
    """The positions of a linear functional model's layers, from its input to its output.

    A layer must be called once, on one tensor, and its output used by one layer; otherwise
    the model is refused, naming the layer where the graph branches or joins.
    """
    entries = model.get("layers", [])
    position = {str(entry.get("name", entry.get("config", {}).get("name"))): i
                for i, entry in enumerate(entries)}
    inputs = _keras_endpoints(model.get("input_layers"))
    outputs = _keras_endpoints(model.get("output_layers"))
    if len(inputs) != 1 or len(outputs) != 1:
        raise UnsupportedError(must_be(where, "a model with one input and one output",
                                       f"inputs {inputs}, outputs {outputs}"))
    source_of: dict[str, str] = {}
    users: dict[str, list[str]] = collections.defaultdict(list)
    for name, i in position.items():
        nodes = entries[i].get("inbound_nodes") or []
        if len(nodes) > 1:
            raise UnsupportedError(must_be(f"{where}: layer {name!r}", "called once (a linear model)",
                                           f"called {len(nodes)} times"))
        for node in nodes:
            sources = _keras_sources(node)
            options = {key: value for key, value in dict(node.get("kwargs", {})).items()
                       if key not in _KERAS_CALL_OPTIONS or (key == "mask" and value is not None)}
            if options and len(sources) <= 1:
                raise UnsupportedError(must_be(f"{where}: layer {name!r}", "called on its input alone",
                                               f"called with {sorted(options)}"))
            for source in dict.fromkeys(sources):
                users[source].append(name)
            if sources:
                source_of[name] = sources[0] if len(sources) == 1 else ""
    for source, consumers in users.items():
        if len(consumers) > 1:
            raise UnsupportedError(must_be(f"{where}: layer {source!r}", "used by one layer (the graph "
                                           "branches here; a model loads when it is a chain)",
                                           f"used by {consumers}"))
    for name, source in source_of.items():
        if not source:
            raise UnsupportedError(must_be(f"{where}: layer {name!r}", "called on one tensor (the graph "
                                           "joins here; a model loads when it is a chain)",
                                           f"{_keras_sources(entries[position[name]]['inbound_nodes'])}"))
    chain = [inputs[0]]
    following = {source: name for name, source in source_of.items()}
    while chain[-1] in following:
        chain.append(following[chain[-1]])
    if chain[-1] != outputs[0] or any(name not in position for name in chain):
        raise UnsupportedError(must_be(where, f"a chain from {inputs[0]!r} to {outputs[0]!r}",
                                       f"one that ends at {chain[-1]!r}"))
    return [position[name] for name in chain]


def _keras_group_arrays(group: Any, class_name: str) -> list[np.ndarray]:
    def numbered(vars_group: Any) -> list[np.ndarray]:
        return [np.asarray(vars_group[str(i)]) for i in range(len(vars_group))]

    if class_name == "Bidirectional":
        return [*numbered(group["forward_layer/cell/vars"]), *numbered(group["backward_layer/cell/vars"])]
    if class_name == "LSTM":
        return numbered(group["cell/vars"])
    return numbered(group["vars"])


def running_variance_to_torch(moving_variance: Any, count: int) -> np.ndarray:
    """bnnsfw's biased moving variance as PyTorch's unbiased running variance.

    ``count`` is the number of values per channel in one batch (``N·L`` for ``BatchNorm1d``
    on ``(N, C, L)``). Started from ``running_variance_from_torch(running_var, count)``, a
    bnnsfw layer trained with batches of that size follows PyTorch's running variance
    exactly (``docs/conversions.md`` derives it).
    """
    if int(count) < 2:
        raise InvalidParameterError(must_be("running_variance_to_torch(count)", ">= 2", count))
    return np.asarray(moving_variance) * count / (count - 1)


def running_variance_from_torch(running_var: Any, count: int) -> np.ndarray:
    """PyTorch's unbiased running variance as bnnsfw's biased one (``count`` values per channel)."""
    if int(count) < 2:
        raise InvalidParameterError(must_be("running_variance_from_torch(count)", ">= 2", count))
    return np.asarray(running_var) * (count - 1) / count

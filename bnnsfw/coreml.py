"""Export bnnsfw layers as a Core ML ML Program (``.mlpackage``): the BNNSGraph migration path.

Apple deprecated the BNNS filter API in macOS 15 / iOS 18 in favour of BNNSGraph, which runs
inference on compiled Core ML models and does not train. :func:`export` writes LSTM,
normalization and fully connected layers, applied one after the other (as
:func:`bnnsfw.onnx.export` defines it), as an ML Program built with coremltools' MIL builder, and
returns a :class:`CoreMLReport` listing every feature of the bnnsfw layers that does not survive
the trip (training, sequence lengths, initial states, float64 …). What would make the program
compute something *different* from the layers' inference phase (a full peephole matrix, gate
activations Core ML does not have …) is refused with :class:`~bnnsfw.UnsupportedError`
instead.

Needs coremltools (``pip install 'bnnsfw[coreml]'``). Writing and inspecting the package works
on Linux; running predictions needs macOS (``coremltools.models.MLModel(path).predict``) or
BNNSGraph on an Apple device.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from typing import Any, Callable, Sequence

import attrs
import numpy as np

from .activation import Activation
from .enums import ActivationFunction, FilterType
from .errors import InvalidParameterError, ShapeError, UnsupportedError, must_be
from .layers.fully_connected import FullyConnectedLayer
from .layers.lstm import GATE_FIELDS, LSTMLayer
from .layers.normalization import NormalizationLayer

__all__ = ["export", "CoreMLReport", "LostFeature", "MAX_EXTENT"]

#: The largest batch and sequence extent the exported program accepts (Core ML needs bounds).
MAX_EXTENT = 65536


@attrs.frozen
class LostFeature:
    """One feature of a bnnsfw layer that the Core ML program does not have."""

    layer: str
    feature: str
    detail: str


@attrs.frozen
class CoreMLReport:
    """What :func:`export` wrote and what did not survive.

    Attributes
    ----------
    path : str
        The ``.mlpackage`` written.
    operations : tuple of str
        The program's operations in order (constants left out), e.g. ``("lstm", "layer_norm", "linear")``.
    lost : tuple of LostFeature
        Every feature of the layers that the program does not carry, with what happens instead.
    """

    path: str
    operations: tuple[str, ...]
    lost: tuple[LostFeature, ...]

    def __str__(self) -> str:
        lines = [f"Core ML ML Program written to {self.path}", f"operations: {', '.join(self.operations)}"]
        if self.lost:
            lines.append("does not survive:")
            lines += [f"  - {f.layer}: {f.feature} — {f.detail}" for f in self.lost]
        else:
            lines.append("everything survives")
        return "\n".join(lines)


# bnnsfw activation -> a MIL builder call, for activations fused after a layer.
def _mil_activation(mb: Any, activation: Activation, x: Any, where: str) -> Any:
    f, a, b = activation.function, float(activation.alpha), float(activation.beta)
    simple: dict[ActivationFunction, Callable[[], Any]] = {
        ActivationFunction.relu: lambda: mb.relu(x=x),
        ActivationFunction.sigmoid: lambda: mb.sigmoid(x=x),
        ActivationFunction.tanh: lambda: mb.tanh(x=x),
        ActivationFunction.softsign: lambda: mb.softsign(x=x),
        ActivationFunction.silu: lambda: mb.silu(x=x),
        ActivationFunction.relu6: lambda: mb.relu6(x=x),
        ActivationFunction.abs: lambda: mb.abs(x=x),
        ActivationFunction.gelu: lambda: mb.gelu(x=x, mode="EXACT"),
        ActivationFunction.leaky_relu: lambda: mb.leaky_relu(x=x, alpha=a),
        ActivationFunction.elu: lambda: mb.elu(x=x, alpha=a),
        ActivationFunction.hard_sigmoid: lambda: mb.sigmoid_hard(x=x, alpha=a, beta=b),
        ActivationFunction.scaled_tanh: lambda: mb.scaled_tanh(x=x, alpha=a, beta=b),
        ActivationFunction.linear: lambda: mb.linear_activation(x=x, alpha=a, beta=0.0),
        ActivationFunction.linear_with_bias: lambda: mb.linear_activation(x=x, alpha=a, beta=b),
    }
    if activation.is_identity:
        return x
    if f is ActivationFunction.softplus and a == 1.0 and b == 1.0:
        return mb.softplus(x=x)
    if f in simple:
        return simple[f]()
    raise UnsupportedError(must_be(f"{where}.activation", "one Core ML has (relu, sigmoid, tanh, leaky_relu, "
                                   "elu, gelu, silu, …)", f.name))


# bnnsfw LSTM activation -> Core ML lstm activation name (no parameters: Core ML's lstm takes none).
_LSTM_ACTIVATIONS = {ActivationFunction.sigmoid: "sigmoid", ActivationFunction.tanh: "tanh",
                     ActivationFunction.relu: "relu", ActivationFunction.identity: "linear"}
_COREML_GATES = ("input_gate", "forget_gate", "output_gate", "candidate_gate")  # Core ML's i, f, o, z
_COREML_PEEPHOLES = ("input_gate", "forget_gate", "output_gate")


class _Exporter:
    def __init__(self, mb: Any, lost: list[LostFeature]) -> None:
        self.mb = mb
        self.lost = lost

    def lose(self, where: str, feature: str, detail: str) -> None:
        self.lost.append(LostFeature(where, feature, detail))

    def lstm(self, layer: LSTMLayer, x: Any, where: str) -> Any:
        mb, p = self.mb, layer.layer_parameters
        h, d = p.hidden_size, p.num_directions
        for name, gate in zip(GATE_FIELDS, p.gates):
            if gate.peephole == "full":
                raise UnsupportedError(must_be(f"{where}.{name}.cell_weights", "None or diagonal (Core ML's "
                                               "peephole)", "a full peephole matrix"))
        if p.candidate_gate.cell_weights is not None:
            raise UnsupportedError(must_be(f"{where}.candidate_gate.cell_weights", "None (Core ML has no "
                                           "candidate peephole)", "a peephole"))
        # The SPEC §4.1 variants Core ML's lstm has no input for (its ``clip`` is not ONNX's:
        # the program would compute something else), refused by name.
        for name, value in (("clip", p.clip), ("cell_clip", p.cell_clip),
                            ("projection_size", p.projection_size), ("projection_clip", p.projection_clip),
                            ("layer_norm", p.layer_norm)):
            if value is not None:
                raise UnsupportedError(must_be(f"{where}.{name}", "None (Core ML's lstm has no such input)",
                                               "an LSTMLayerNorm" if name == "layer_norm" else value))
        if p.input_forget:
            raise UnsupportedError(must_be(f"{where}.input_forget", "False (Core ML's lstm has no coupled "
                                           "input and forget gates)", True))
        if d == 2 and p.activations(0) != p.activations(1):
            raise UnsupportedError(must_be(f"{where}.direction_activations", "the same for both directions "
                                           "(Core ML's lstm takes one set)", "two different sets"))
        acts = p.gate_activations
        if not acts[0] == acts[1] == acts[3]:
            rule = "the same on the input, forget and output gates (Core ML's recurrent_activation)"
            used = [a.function.name for a in acts]
            raise UnsupportedError(must_be(f"{where} gate activations", rule, used))
        names: list[str] = []
        for label, activation in (("gate", acts[0]), ("candidate", acts[2]), ("hidden", p.cell_activation)):
            coreml_name = _LSTM_ACTIVATIONS.get(activation.function)
            if coreml_name is None:
                raise UnsupportedError(must_be(f"{where} {label} activation",
                                               "sigmoid, tanh, relu or identity "
                                               "(Core ML's lstm activations)", activation.function.name))
            names.append(coreml_name)
        self.lose(where, "sequence_lengths",
                  "the program has no lengths input: every sequence runs all T steps")
        self.lose(where, "initial states",
                  "the program starts every sequence from zero hidden and cell states")
        self.lose(where, "final states", "the final hidden and cell states are not program outputs")
        if p.dropout > 0 and p.num_layers > 1:
            self.lose(where, f"dropout {p.dropout}", "training only; the program is the inference phase")
        if p.batch_first:
            x = mb.transpose(x=x, perm=[1, 0, 2])
        gates = dict(zip(GATE_FIELDS, p.gates))
        dtype = np.float32
        for layer_index in range(p.num_layers):
            def stacked(field: Callable[[Any], np.ndarray], order: Sequence[str], k: int) -> np.ndarray:
                return np.concatenate([field(gates[g])[k] for g in order]).astype(dtype)

            def input_weights(gate: Any) -> np.ndarray:
                return gate.input_weights[0] if layer_index == 0 else gate.input_weights[1][layer_index - 1]

            arguments: dict[str, Any] = {}
            for k, suffix in enumerate(("", "_back")[:d]):
                arguments[f"weight_ih{suffix}"] = stacked(input_weights, _COREML_GATES, k)
                arguments[f"weight_hh{suffix}"] = stacked(lambda g: g.hidden_weights[layer_index],
                                                          _COREML_GATES, k)
                if p.input_gate.bias is not None:
                    arguments[f"bias{suffix}"] = stacked(lambda g: g.bias[layer_index], _COREML_GATES, k)
                if any(gates[g].cell_weights is not None for g in _COREML_PEEPHOLES):
                    arguments[f"peephole{suffix}"] = np.concatenate([
                        np.zeros(h) if gates[g].cell_weights is None else gates[g].cell_weights[layer_index,
                                                                                                k]
                        for g in _COREML_PEEPHOLES]).astype(dtype)
            zeros = np.zeros((1, d * h), dtype)
            x, _, _ = mb.lstm(x=x, initial_h=zeros, initial_c=zeros,
                              direction=p.direction,
                              output_sequence=True, recurrent_activation=names[0], cell_activation=names[1],
                              activation=names[2], **arguments)
        if p.batch_first:
            x = mb.transpose(x=x, perm=[1, 0, 2])
        return x

    def normalization(self, layer: NormalizationLayer, x: Any, rank: int, where: str) -> Any:
        mb, p = self.mb, layer.layer_parameters
        kind, shape = p.type.kind, layer.input_shape
        eps = float(p.epsilon)
        if p.type.root_mean_square:  # x · rsqrt(mean(x²) + ε) · γ over the trailing axes
            axes = list(range(-(len(shape) - p.type.axis), 0))
            mean_square = mb.reduce_mean(x=mb.mul(x=x, y=x), axes=axes, keep_dims=True)
            scale = mb.rsqrt(x=mean_square, epsilon=eps)
            y = mb.mul(x=mb.mul(x=x, y=scale), y=layer.gamma.astype(np.float32))
            return _mil_activation(mb, p.activation, y, where)
        gamma, beta = layer.gamma.astype(np.float32), layer.beta.astype(np.float32)
        if p.type.has_moving_statistics:
            self.lose(where, "moving-statistics updates",
                      "the program is the inference phase: it normalizes with "
                      "the moving statistics and never updates them")
        if kind is FilterType.layer_norm:
            axes = list(range(-(len(shape) - p.type.axis), 0))
            y = mb.layer_norm(x=x, axes=axes, gamma=gamma, beta=beta, epsilon=eps)
            return _mil_activation(mb, p.activation, y, where)
        original = mb.shape(x=x)
        channels = p.channels  # export refused open sizes
        spatial = int(np.prod([int(s or 0) for s in shape[1:]], dtype=np.int64))
        flat = mb.reshape(x=x, shape=[-1, channels, spatial])
        with_statistics = kind is FilterType.instance_norm and p.type.has_moving_statistics
        if kind is FilterType.batch_norm or with_statistics:
            if layer.moving_mean is None or layer.moving_variance is None:
                raise UnsupportedError(must_be(f"{where}",
                                               "a batch norm with moving statistics (Core ML's batch_norm "
                                               "normalizes with given statistics)", "none"))
            y = mb.batch_norm(x=flat, mean=layer.moving_mean.astype(np.float32),
                              variance=layer.moving_variance.astype(np.float32), gamma=gamma, beta=beta,
                              epsilon=eps)
        elif kind is FilterType.instance_norm:
            if len(shape) < 2:
                raise ShapeError(must_be(f"{where} input_shape", "(C, *spatial) with spatial axes", shape))
            y = mb.instance_norm(x=flat, gamma=gamma, beta=beta, epsilon=eps)
        else:
            groups = p.type.groups
            grouped = mb.reshape(x=flat, shape=[-1, groups, (channels // groups) * spatial])
            normalized = mb.layer_norm(x=grouped, axes=[-1], epsilon=eps)
            back = mb.reshape(x=normalized, shape=[-1, channels, spatial])
            y = mb.add(x=mb.mul(x=back, y=gamma.reshape(channels, 1)), y=beta.reshape(channels, 1))
        y = _mil_activation(mb, p.activation, y, where)
        return mb.reshape(x=y, shape=original)

    def fully_connected(self, layer: FullyConnectedLayer, x: Any, where: str) -> Any:
        weights = layer.weights.astype(np.float32)
        bias = None if layer.bias is None else layer.bias.astype(np.float32)
        if bias is None:
            y = self.mb.linear(x=x, weight=weights)
        else:
            y = self.mb.linear(x=x, weight=weights, bias=bias)
        return _mil_activation(self.mb, layer.activation, y, where)


def _coremltools() -> Any:
    # coremltools logs warnings about untested library versions when imported; they say nothing
    # about this use, so the import is kept quiet.
    quiet = logging.getLogger("coremltools")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import coremltools
    except ImportError:  # pragma: no cover - exercised only without coremltools
        raise UnsupportedError(must_be("bnnsfw.coreml", "used with coremltools installed "
                                       "(pip install 'bnnsfw[coreml]')", "no coremltools")) from None
    finally:
        quiet.setLevel(level)
    return coremltools


def export(model_or_layers: Any, path: str | os.PathLike[str], *,
           max_extent: int = MAX_EXTENT) -> CoreMLReport:
    """Write bnnsfw layers, applied one after the other, as a Core ML ML Program.

    Parameters
    ----------
    model_or_layers : layer, sequence or mapping of layers
        ``LSTMLayer``, ``NormalizationLayer`` and ``FullyConnectedLayer`` objects in the order
        data flows through them (see :func:`bnnsfw.onnx.export` for how normalization layers
        see their input).
    path : str or PathLike
        The ``.mlpackage`` directory to write (the suffix is added when missing).
    max_extent : int
        The largest batch size and sequence length the program accepts.

    Returns
    -------
    CoreMLReport
        The operations written and every feature that did not survive.

    Raises
    ------
    UnsupportedError
        For what would change the computed values: a full or candidate-gate peephole,
        different activations on the input, forget and output gates, activations Core ML's
        ``lstm`` or activation operations do not have, batch norm without moving statistics,
        a normalization with open sizes (``None`` in ``input_shape``).
    """
    from .onnx._export import _layers_of

    layers = _layers_of(model_or_layers)
    for index, layer in enumerate(layers):
        if isinstance(layer, NormalizationLayer) and layer.layer_parameters.open_sizes:
            raise UnsupportedError(must_be(
                f"coreml.export(model_or_layers)[{index}] input_shape",
                "fixed sizes (the program's tensors have fixed per-sample shapes: make the layer with the "
                "sizes the app uses)", layer.input_shape))
    ct = _coremltools()
    from coremltools.converters.mil import Builder as mb

    if not layers:
        raise InvalidParameterError(must_be("coreml.export(model_or_layers)", "at least one layer", "none"))
    if not isinstance(max_extent, int) or max_extent < 1:
        raise InvalidParameterError(must_be("coreml.export(max_extent)", "an int >= 1", max_extent))
    for index, layer in enumerate(layers):
        if not isinstance(layer, (LSTMLayer, NormalizationLayer, FullyConnectedLayer)):
            raise InvalidParameterError(must_be(f"coreml.export(model_or_layers)[{index}]",
                                                "an LSTM, normalization or fully connected layer",
                                                type(layer).__name__))
        layer.check_open("coreml.export")
    first = layers[0]
    dim = ct.RangeDim(1, max_extent)
    if isinstance(first, LSTMLayer):
        shape: list[Any] = [dim, dim, first.layer_parameters.input_size]
    elif isinstance(first, NormalizationLayer):
        shape = [dim, *first.input_shape]
    else:
        assert isinstance(first, FullyConnectedLayer)
        shape = [dim, first.input_size]
    lost: list[LostFeature] = [LostFeature("model", "training",
                                           "the program is inference only: apply_backward, "
                                           "training caches and optimizers stay in bnnsfw")]
    if any(getattr(layer, "layer_parameters").dtype == np.float64 for layer in layers):  # every layer has it
        lost.append(LostFeature("model", "float64", "the program computes in float32"))
    exporter = _Exporter(mb, lost)
    from coremltools.converters.mil.mil import get_new_symbol

    symbols = [get_new_symbol() if not isinstance(s, int) else s for s in shape]

    @mb.program(input_specs=[mb.TensorSpec(shape=tuple(symbols))], opset_version=ct.target.iOS17)
    def program(input: Any) -> Any:  # the parameter's name is the program input's name
        x, width = input, shape[-1]
        for index, layer in enumerate(layers):
            where = f"layer[{index}] {type(layer).__name__}"
            if isinstance(layer, LSTMLayer):
                _check(where, width, layer.layer_parameters.input_size)
                x = exporter.lstm(layer, x, where)
                width = layer.layer_parameters.num_directions * layer.layer_parameters.hidden_size
            elif isinstance(layer, NormalizationLayer):
                _check(where, width, int(layer.input_shape[-1] or 0))  # export refused open sizes
                x = exporter.normalization(layer, x, len(shape), where)
            else:
                assert isinstance(layer, FullyConnectedLayer)
                _check(where, width, layer.input_size)
                x = exporter.fully_connected(layer, x, where)
                width = layer.output_size
        return mb.identity(x=x, name="output")

    target = os.fspath(path)
    if not target.endswith(".mlpackage"):
        target += ".mlpackage"
    # coremltools prints progress bars, and leaves a temporary directory of its own to an
    # implicit clean-up (a ResourceWarning) when the conversion returns.
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        model = ct.convert(program, inputs=[ct.TensorType(name="input", shape=tuple(shape))],
                           convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                           compute_precision=ct.precision.FLOAT32)
    model.save(target)
    operations = tuple(op.op_type for op in program.functions["main"].operations
                       if op.op_type not in ("const", "identity"))
    return CoreMLReport(path=target, operations=operations, lost=tuple(lost))


def _check(where: str, width: object, expected: int) -> None:
    if isinstance(width, int) and width != expected:
        raise ShapeError(must_be(f"coreml.export {where} input", f"data whose last extent is {expected}",
                                 f"last extent {width}"))

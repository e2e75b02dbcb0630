"""The field table of the C-style API: every field of every structure it takes, zeroed.

A C caller zero-fills what its configuration does not use (``= {0}``, ``memset``). For each
structure, configuration and field, the table says what a zero there does:

- ``not read``: BNNS ignores the field for this configuration; the call gives the very results
  (bit for bit) of the call with the field as it was;
- ``absent``: a zero-filled descriptor (or structure of descriptors) has no data: the call
  gives the results of the call with ``None`` there (zeros for an input, "not computed" for an
  output, no peephole, no bias, no moving statistics…);
- ``value``: zero is a value the call reads and takes (``epsilon = 0``, the identity
  activation, a dense layout…);
- otherwise the field is read and zero is refused, with the logged message given.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import bnns
from bnnsfw.bnns import BNNSNDArrayDescriptor as Desc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

F32 = np.float32
NOT_READ, ABSENT, VALUE = "not read", "absent", "value"
SHAPE = (4, 2, 3)  # (C, H, W): ImageCHW sizes (3, 2, 4)


def zero_descriptor() -> Desc:
    return Desc(flags=0, layout=0, size=(0,) * 8, stride=(0,) * 8, data=None, data_type=0)


def zero_of(value: object) -> object:
    """What ``memset`` leaves in a field that holds ``value``."""
    if isinstance(value, Desc):
        return zero_descriptor()
    if isinstance(value, bnns.BNNSActivation):
        return bnns.BNNSActivation(function=0, alpha=0.0, beta=0.0)
    if isinstance(value, bnns.BNNSLSTMDataDescriptor):
        return bnns.BNNSLSTMDataDescriptor(data_desc=zero_descriptor(), hidden_desc=zero_descriptor(),
                                           cell_state_desc=zero_descriptor())
    if isinstance(value, bnns.BNNSLSTMGateDescriptor):
        return bnns.BNNSLSTMGateDescriptor(
            iw_desc=(zero_descriptor(), zero_descriptor()), hw_desc=zero_descriptor(),
            cw_desc=zero_descriptor(), b_desc=zero_descriptor(), activation=zero_of(bnns.BNNSActivation()))
    if isinstance(value, bnns.BNNSFilterParameters):
        return bnns.BNNSFilterParameters(flags=0, n_threads=0, alloc_memory=None, free_memory=None)
    if isinstance(value, tuple):  # size[8], stride[8]
        return (0,) * 8
    if isinstance(value, float):
        return 0.0
    if isinstance(value, int):
        return 0
    return None  # a pointer: data, alloc_memory, free_memory


def absent_of(value: object) -> object:
    """``None`` for a descriptor, and a structure of ``None`` descriptors for a structure."""
    if isinstance(value, bnns.BNNSLSTMDataDescriptor):
        return bnns.BNNSLSTMDataDescriptor()
    if isinstance(value, bnns.BNNSLSTMGateDescriptor):
        return None
    return None


_STEP = re.compile(r"(\w+)(?:\[(\d)\])?")


def locate(args: dict[str, Any], path: str) -> tuple[Any, str, int | None]:
    """(holder, attribute, index) of the field at ``path`` (``layer_params.input_gate.iw_desc[1]``)."""
    steps = path.split(".")
    holder: Any = args
    for step in steps[:-1]:
        name, index = _STEP.fullmatch(step).groups()
        holder = holder[name] if isinstance(holder, dict) else getattr(holder, name)
        if index is not None:
            holder = holder[int(index)]
    name, index = _STEP.fullmatch(steps[-1]).groups()
    return holder, name, None if index is None else int(index)


def get(args: dict[str, Any], path: str) -> object:
    holder, name, index = locate(args, path)
    value = holder[name] if isinstance(holder, dict) else getattr(holder, name)
    return value if index is None else value[index]


def put(args: dict[str, Any], path: str, value: object) -> None:
    holder, name, index = locate(args, path)
    if index is not None:
        pair = list(getattr(holder, name))
        pair[index] = value
        value = tuple(pair)
    if isinstance(holder, dict):
        holder[name] = value
    else:
        setattr(holder, name, value)


# ------------------------------------------------------------------ normalization ------

def normalization_args(kind: str) -> dict[str, Any]:
    """A valid call of each normalization entry point, every field set (and non-zero where a
    field may be: num_groups 2, normalization_axis 1 outside layer norm, momentum 0.9…)."""
    rng = np.random.default_rng(5)
    affine = SHAPE if kind == "layer_norm" else (SHAPE[0],)
    layout = "last_major_3d" if len(affine) == 3 else "vector"
    n = 2
    return {
        "normType": getattr(bf.FilterType, kind),
        "layer_params": bnns.BNNSLayerParametersNormalization(
            i_desc=Desc.shape_only(SHAPE, "image_chw"), o_desc=Desc.shape_only(SHAPE, "image_chw"),
            gamma_desc=Desc.from_array(rng.uniform(0.5, 1.5, affine).astype(F32), layout),
            beta_desc=Desc.from_array(rng.standard_normal(affine).astype(F32), layout),
            moving_mean_desc=Desc.from_array(rng.standard_normal(SHAPE[0]).astype(F32)),
            moving_variance_desc=Desc.from_array(rng.uniform(0.5, 2, SHAPE[0]).astype(F32)),
            momentum=0.9, epsilon=1e-3,
            activation=bnns.BNNSActivation(function=bf.ActivationFunction.leaky_relu, alpha=0.1, beta=0.5),
            num_groups=2, normalization_axis=0 if kind == "layer_norm" else 1),
        "filter_params": bnns.BNNSFilterParameters(flags=bnns.BNNSFlagsUseClientPtr, n_threads=1,
                                                   alloc_memory=object(), free_memory=object()),
        "x": rng.standard_normal((n, *SHAPE)).astype(F32),
        "out": np.zeros(n * int(np.prod(SHAPE)), F32),
        "in_delta": Desc(layout="image_chw", size=tuple(reversed(SHAPE)),
                         data=np.full(n * int(np.prod(SHAPE)), 0.5, F32),
                         flags=bf.NDArrayFlags.backprop_accumulate),
        "out_delta": Desc(layout="image_chw", size=tuple(reversed(SHAPE)),
                          data=rng.standard_normal(n * int(np.prod(SHAPE))).astype(F32)),
        "beta_delta": Desc.from_array(np.full(affine, 0.25, F32), layout,
                                      flags=bf.NDArrayFlags.backprop_accumulate),
        "gamma_delta": Desc.from_array(np.zeros(affine, F32), layout),
    }


def run_normalization(args: dict[str, Any]) -> list[np.ndarray]:
    """Create, forward (training), backward, destroy: every buffer the calls write, or an
    AssertionError carrying the logged reason of the first failure."""
    p = args["layer_params"]
    f = bnns.BNNSFilterCreateLayerNormalization(args["normType"], p, args["filter_params"])
    assert f is not None
    n = len(args["x"])
    assert bnns.BNNSNormalizationFilterApplyBatch(f, n, args["x"].ravel(), 0, args["out"], 0, True) == 0
    assert bnns.BNNSNormalizationFilterApplyBackwardBatch(
        f, n, args["in_delta"], 0, args["out"], 0, args["out_delta"], 0, args["beta_delta"],
        args["gamma_delta"]) == 0
    bnns.BNNSFilterDestroy(f)
    written = [args["out"]]
    for name in ("in_delta", "beta_delta", "gamma_delta"):
        desc = args[name]
        written.append(None if desc is None or desc.data is None else desc.data)
    for name in ("moving_mean_desc", "moving_variance_desc") if args["normType"].name in TRACKED else ():
        desc = getattr(p, name)
        written.append(None if desc is None or desc.data is None else desc.data)
    return written


NORM = ("batch_norm", "instance_norm", "layer_norm", "group_norm")
TRACKED = ("batch_norm", "instance_norm")
LAYOUT_ZERO = r"{}\.layout must be one of the layouts the C-style API reads \(.*\); got 0\."
TYPE_ZERO = r"{}\.data_type must be BNNSDataTypeFloat32{}; got 0\."

#: struct, configuration, field, outcome (or the refusal's message).
NORMALIZATION_TABLE: list[tuple[str, str, str, str]] = []
for _kind in NORM:
    NORMALIZATION_TABLE += [
        ("BNNSLayerParametersNormalization", _kind, "layer_params.i_desc",
         LAYOUT_ZERO.format(r"layer_params\.i_desc")),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.o_desc",
         LAYOUT_ZERO.format(r"layer_params\.o_desc")),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.beta_desc", ABSENT),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.gamma_desc", ABSENT),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.moving_mean_desc",
         r"layer_params\.moving_mean_desc\.data must be set when layer_params\.moving_variance_desc\.data is"
         if _kind in TRACKED else NOT_READ),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.moving_variance_desc",
         r"layer_params\.moving_variance_desc\.data must be set when layer_params\.moving_mean_desc\.data is"
         if _kind in TRACKED else NOT_READ),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.momentum",
         VALUE if _kind in TRACKED else NOT_READ),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.epsilon", VALUE),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.activation", VALUE),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.num_groups",
         r"layer_params\.num_groups must be an integer >= 1; got 0\." if _kind == "group_norm" else NOT_READ),
        ("BNNSLayerParametersNormalization", _kind, "layer_params.normalization_axis",
         VALUE if _kind == "layer_norm" else NOT_READ),
    ]
NORMALIZATION_TABLE += [
    # the descriptors' own fields, in a descriptor each call reads
    ("BNNSNDArrayDescriptor", "i_desc (any type)", "layer_params.i_desc.flags", NOT_READ),
    ("BNNSNDArrayDescriptor", "i_desc (any type)", "layer_params.i_desc.layout",
     LAYOUT_ZERO.format(r"layer_params\.i_desc")),
    ("BNNSNDArrayDescriptor", "i_desc (any type)", "layer_params.i_desc.size",
     r"layer_params\.i_desc\.size must be 3 sizes > 0 for BNNSDataLayoutImageCHW; got \(0, 0, 0\)\."),
    ("BNNSNDArrayDescriptor", "i_desc (any type)", "layer_params.i_desc.stride", VALUE),
    ("BNNSNDArrayDescriptor", "i_desc (any type)", "layer_params.i_desc.data", NOT_READ),
    ("BNNSNDArrayDescriptor", "i_desc (any type)", "layer_params.i_desc.data_type",
     TYPE_ZERO.format(r"layer_params\.i_desc", "")),
    ("BNNSNDArrayDescriptor", "gamma_desc (any type)", "layer_params.gamma_desc.flags", NOT_READ),
    ("BNNSNDArrayDescriptor", "gamma_desc (any type)", "layer_params.gamma_desc.layout",
     LAYOUT_ZERO.format(r"layer_params\.gamma_desc")),
    ("BNNSNDArrayDescriptor", "gamma_desc (any type)", "layer_params.gamma_desc.size", VALUE),
    ("BNNSNDArrayDescriptor", "gamma_desc (any type)", "layer_params.gamma_desc.stride", VALUE),
    ("BNNSNDArrayDescriptor", "gamma_desc (any type)", "layer_params.gamma_desc.data", ABSENT),
    ("BNNSNDArrayDescriptor", "gamma_desc (any type)", "layer_params.gamma_desc.data_type",
     TYPE_ZERO.format(r"layer_params\.gamma_desc", "")),
    ("BNNSNDArrayDescriptor", "moving_mean_desc (batch norm)", "layer_params.moving_mean_desc.layout",
     LAYOUT_ZERO.format(r"layer_params\.moving_mean_desc")),
    ("BNNSNDArrayDescriptor", "moving_mean_desc (layer norm)", "layer_params.moving_mean_desc.layout",
     NOT_READ),
    ("BNNSNDArrayDescriptor", "in_delta (backward)", "in_delta.flags", VALUE),
    ("BNNSNDArrayDescriptor", "in_delta (backward)", "in_delta.layout", LAYOUT_ZERO.format("in_delta")),
    ("BNNSNDArrayDescriptor", "in_delta (backward)", "in_delta.size", VALUE),
    ("BNNSNDArrayDescriptor", "in_delta (backward)", "in_delta.stride", VALUE),
    ("BNNSNDArrayDescriptor", "in_delta (backward)", "in_delta.data", ABSENT),
    ("BNNSNDArrayDescriptor", "in_delta (backward)", "in_delta.data_type",
     TYPE_ZERO.format("in_delta", " or BNNSDataTypeBFloat16")),
    ("BNNSNDArrayDescriptor", "out_delta (backward)", "out_delta.data",
     r"out_delta\.data must be set \(dy: BNNS requires it\); got None\."),
    ("BNNSNDArrayDescriptor", "beta_delta (backward)", "beta_delta", ABSENT),
    ("BNNSNDArrayDescriptor", "gamma_delta (backward)", "gamma_delta", ABSENT),
    ("BNNSNDArrayDescriptor", "in_delta (backward)", "in_delta", ABSENT),
    ("BNNSNDArrayDescriptor", "out_delta (backward)", "out_delta",
     r"out_delta\.data must be set \(dy: BNNS requires it\); got None\."),
    # the activation's fields (a leaky ReLU, alpha 0.1: beta is not read)
    ("BNNSActivation", "activation (leaky ReLU)", "layer_params.activation.function", VALUE),
    ("BNNSActivation", "activation (leaky ReLU)", "layer_params.activation.alpha", VALUE),
    ("BNNSActivation", "activation (leaky ReLU)", "layer_params.activation.beta", NOT_READ),
    # the filter parameters
    ("BNNSFilterParameters", "filter_params (any filter)", "filter_params", VALUE),
    ("BNNSFilterParameters", "filter_params (any filter)", "filter_params.flags", VALUE),
    ("BNNSFilterParameters", "filter_params (any filter)", "filter_params.n_threads", VALUE),
    ("BNNSFilterParameters", "filter_params (any filter)", "filter_params.alloc_memory", NOT_READ),
    ("BNNSFilterParameters", "filter_params (any filter)", "filter_params.free_memory", NOT_READ),
]


def _configuration_kind(configuration: str) -> str:
    for kind in NORM:
        if configuration == kind:
            return kind
    return "layer_norm" if "layer norm" in configuration else "batch_norm"


def check_row(args: dict[str, Any], path: str, expected: str, run: Any,
              caplog: pytest.LogCaptureFixture) -> None:
    reference = copy.deepcopy(args)
    zeroed = copy.deepcopy(args)
    put(zeroed, path, zero_of(get(zeroed, path)))
    caplog.clear()
    if expected not in (NOT_READ, ABSENT, VALUE):
        with pytest.raises(AssertionError):
            run(zeroed)
        assert re.search(expected, caplog.text), caplog.text
        return
    got = run(zeroed)
    assert "failed" not in caplog.text, caplog.text
    if expected == VALUE:
        return
    if expected == ABSENT:
        put(reference, path, absent_of(get(reference, path)))
    want = run(reference)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("struct, configuration, path, expected", NORMALIZATION_TABLE,
                         ids=[f"{c}:{p}" for _, c, p, _ in NORMALIZATION_TABLE])
def test_normalization_field_zeroed(struct: str, configuration: str, path: str, expected: str,
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    args = normalization_args(_configuration_kind(configuration))
    check_row(args, path, expected, run_normalization, caplog)


def test_the_regression_num_groups_zero_outside_group_norm(caplog: pytest.LogCaptureFixture) -> None:
    """A batch norm whose ``num_groups`` is 0 (zero-filled) is created: BNNS reads it for group
    norm only."""
    shape = Desc.shape_only(SHAPE, "image_chw")
    params = bnns.BNNSLayerParametersNormalization(i_desc=shape, o_desc=shape, num_groups=0)
    assert bnns.BNNSFilterCreateLayerNormalization(bnns.BNNSBatchNorm, params, None) is not None


# ------------------------------------------------------------------ LSTM ---------------

T, N, IN, H = 3, 2, 3, 2
GATES = ("input_gate", "forget_gate", "candidate_gate", "output_gate")
LSTM_CONFIGS = ("one layer", "two layers", "default activations")


def lstm_args(configuration: str) -> dict[str, Any]:
    """A valid forward and backward call, every field set (activations given, a sequence
    descriptor, states in and out; dropout 0.3 where BNNS ignores it, with one layer: with two,
    a backward without a cache needs none)."""
    layers = 2 if configuration == "two layers" else 1
    p = bf.LSTMParameters.random(input_size=IN, hidden_size=H, num_layers=layers, peepholes="full", seed=4)
    rng = np.random.default_rng(6)

    def d(a: np.ndarray | None, layout: str | None = None) -> Desc | None:
        return None if a is None else Desc.from_array(np.ascontiguousarray(a, dtype=F32), layout)

    acts = {"input_gate": ("hard_sigmoid", 0.2, 0.5), "forget_gate": ("sigmoid", 0.0, 0.0),
            "candidate_gate": ("tanh", 0.0, 0.0), "output_gate": ("sigmoid", 0.0, 0.0)}
    states = (layers, N, H)

    def structure(delta: bool) -> bnns.BNNSLayerParametersLSTM:
        def w(a: np.ndarray | None) -> Desc | None:
            return None if a is None else d(np.zeros_like(a) if delta else a)

        gates = {name: bnns.BNNSLSTMGateDescriptor(
            iw_desc=(w(g.input_weights[0]),
                     w(g.input_weights[1]) if layers > 1 else d(np.ones((1, 1, H, H)))),
            hw_desc=w(g.hidden_weights), cw_desc=w(g.cell_weights), b_desc=w(g.bias),
            activation=bnns.BNNSActivation(function=acts[name][0], alpha=acts[name][1], beta=acts[name][2]))
            for name, g in zip(GATES, p.gates)}
        def data(zeros: bool, width: int) -> bnns.BNNSLSTMDataDescriptor:
            def values(shape: tuple[int, ...]) -> np.ndarray:
                return np.zeros(shape) if zeros else rng.standard_normal(shape)

            return bnns.BNNSLSTMDataDescriptor(data_desc=d(values((T, N, width)), "sne"),
                                               hidden_desc=d(values(states)),
                                               cell_state_desc=d(values(states)))

        data_in, data_out = (data(True, IN), data(False, H)) if delta else (data(False, IN), data(True, H))
        flags = bf.LayerFlags.lstm_default_activations if configuration == "default activations" else 0
        return bnns.BNNSLayerParametersLSTM(
            input_size=IN, hidden_size=H, batch_size=N, num_layers=layers, seq_len=T,
            dropout=0.3 if layers == 1 else 0.0,
            lstm_flags=int(flags),
            sequence_descriptor=Desc(layout="vector", size=(T,), data=np.array([2, 2, 1], np.int32),
                                     data_type="int32"),
            input_descriptor=data_in, output_descriptor=data_out, **gates,
            hidden_activation=bnns.BNNSActivation(function="softsign"))

    return {"layer_params": structure(False), "layer_delta_params": structure(True), "filter_params": None}


def run_lstm(args: dict[str, Any]) -> list[np.ndarray | None]:
    """Forward (inference, then with a training cache), backward: the buffers written."""
    p, dp = args["layer_params"], args["layer_delta_params"]
    assert bnns.BNNSDirectApplyLSTMBatchTrainingCaching(p, args["filter_params"], None, 0) == 0
    capacity = bnns.BNNSComputeLSTMTrainingCacheCapacity(p)
    assert capacity > 0
    assert bnns.BNNSDirectApplyLSTMBatchBackward(p, dp, args["filter_params"], None, 0) == 0
    written: list[np.ndarray | None] = []
    for data in (p.output_descriptor, dp.input_descriptor):
        for field in ("data_desc", "hidden_desc", "cell_state_desc"):
            desc = None if data is None else getattr(data, field)
            written.append(None if desc is None or desc.data is None else desc.data)
    for name in GATES:
        g = getattr(dp, name)
        for desc in (*g.iw_desc, g.hw_desc, g.cw_desc, g.b_desc) if g is not None else (None,) * 5:
            written.append(None if desc is None or desc.data is None else desc.data)
    return written


LSTM_TABLE: list[tuple[str, str, str, str]] = []
for _config in LSTM_CONFIGS:
    own = _config != "default activations"
    LSTM_TABLE += [
        ("BNNSLayerParametersLSTM", _config, f"layer_params.{field}",
         rf"layer_params\.{field} must be an integer >= 1; got 0\.")
        for field in ("input_size", "hidden_size", "batch_size", "num_layers", "seq_len")]
    LSTM_TABLE += [
        ("BNNSLayerParametersLSTM", _config, "layer_params.dropout",
         VALUE if _config == "two layers" else NOT_READ),
        ("BNNSLayerParametersLSTM", _config, "layer_params.lstm_flags", VALUE),
        ("BNNSLayerParametersLSTM", _config, "layer_params.sequence_descriptor", ABSENT),
        ("BNNSLayerParametersLSTM", _config, "layer_params.input_descriptor",
         r"layer_params\.input_descriptor\.data_desc\.data must be set \(x: BNNS requires it\); got None\."),
        ("BNNSLayerParametersLSTM", _config, "layer_params.output_descriptor", ABSENT),
        ("BNNSLayerParametersLSTM", _config, "layer_params.input_gate",
         r"layer_params\.input_gate\.iw_desc\[1\]\.data must be set when num_layers > 1; got None\."
         if _config == "two layers" else
         r"layer_params\.input_gate\.iw_desc\[0\]\.data must be set; got None\."),
        ("BNNSLayerParametersLSTM", _config, "layer_params.hidden_activation", VALUE if own else NOT_READ),
        ("BNNSLSTMDataDescriptor", _config, "layer_params.input_descriptor.data_desc",
         r"layer_params\.input_descriptor\.data_desc\.data must be set \(x: BNNS requires it\); got None\."),
        ("BNNSLSTMDataDescriptor", _config, "layer_params.input_descriptor.hidden_desc", ABSENT),
        ("BNNSLSTMDataDescriptor", _config, "layer_params.input_descriptor.cell_state_desc", ABSENT),
        ("BNNSLSTMDataDescriptor", _config, "layer_params.output_descriptor.data_desc", ABSENT),
        ("BNNSLSTMDataDescriptor", _config, "layer_params.output_descriptor.hidden_desc", ABSENT),
        ("BNNSLSTMDataDescriptor", _config, "layer_params.output_descriptor.cell_state_desc", ABSENT),
        ("BNNSLSTMGateDescriptor", _config, "layer_params.forget_gate.iw_desc[0]",
         r"layer_params\.forget_gate\.iw_desc\[0\]\.data must be set; got None\."),
        ("BNNSLSTMGateDescriptor", _config, "layer_params.forget_gate.iw_desc[1]",
         r"layer_params\.forget_gate\.iw_desc\[1\]\.data must be set when num_layers > 1; got None\."
         if _config == "two layers" else NOT_READ),
        ("BNNSLSTMGateDescriptor", _config, "layer_params.forget_gate.hw_desc",
         r"layer_params\.forget_gate\.hw_desc\.data must be set; got None\."),
        ("BNNSLSTMGateDescriptor", _config, "layer_params.forget_gate.cw_desc", ABSENT),
        ("BNNSLSTMGateDescriptor", _config, "layer_params.forget_gate.b_desc", ABSENT),
        ("BNNSLSTMGateDescriptor", _config, "layer_params.input_gate.activation", VALUE if own else NOT_READ),
        ("BNNSActivation", _config, "layer_params.input_gate.activation.alpha", VALUE if own else NOT_READ),
        # the delta structure: its sizes and flags may be the forward's or 0, its descriptors absent
        *[("BNNSLayerParametersLSTM (delta)", _config, f"layer_delta_params.{field}", NOT_READ)
          for field in ("input_size", "hidden_size", "batch_size", "num_layers", "seq_len", "dropout",
                        "lstm_flags", "sequence_descriptor", "hidden_activation")],
        *[("BNNSLayerParametersLSTM (delta)", _config, f"layer_delta_params.{field}", ABSENT)
          for field in ("input_descriptor", "output_descriptor", "input_gate")],
        ("BNNSLSTMGateDescriptor (delta)", _config, "layer_delta_params.output_gate.activation", NOT_READ),
        ("BNNSLSTMGateDescriptor (delta)", _config, "layer_delta_params.output_gate.cw_desc", ABSENT),
    ]


@pytest.mark.parametrize("struct, configuration, path, expected", LSTM_TABLE,
                         ids=[f"{c}:{p}" for _, c, p, _ in LSTM_TABLE])
def test_lstm_field_zeroed(struct: str, configuration: str, path: str, expected: str,
                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="bnnsfw")
    check_row(lstm_args(configuration), path, expected, run_lstm, caplog)

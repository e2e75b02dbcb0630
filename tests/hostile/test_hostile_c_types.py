"""Family 2: the C-style functions take the argument types Apple declares.

``BNNSNormalizationFilterApplyBackwardBatch`` takes ``BNNSNDArrayDescriptor`` s for
``in_delta``, ``out_delta``, ``beta_delta`` and ``gamma_delta``: their layouts, strides and
``backprop_accumulate`` flags are honoured (checked against the object API, with guard
regions around every buffer). The other entry points keep Apple's parameter names and
refuse values of other types with a clear logged reason.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hostile._hostile import HOSTILE, answered, c_call, c_refused, wrong
from hypothesis import given, settings
from hypothesis import strategies as st

import bnnsfw as bf
from bnnsfw import bnns
from bnnsfw.bnns import BNNSNDArrayDescriptor as Desc
from bnnsfw.layers.lstm import LSTMParameters
from bnnsfw.layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

F32 = np.float32
GUARD = 8
SHAPE = (4, 2, 3)  # (C, H, W)
ACCUMULATE = int(bf.NDArrayFlags.backprop_accumulate)

#: Apple's declarations (bnns.h), parameter by parameter; ``in`` is ``in_`` in Python.
APPLE = {
    "BNNSFilterCreateLayerNormalization": ["normType", "layer_params", "filter_params"],
    "BNNSNormalizationFilterApplyBatch": ["filter", "batch_size", "in_", "in_stride", "out", "out_stride",
                                          "training"],
    "BNNSNormalizationFilterApplyBackwardBatch": ["filter", "batch_size", "in_delta", "in_delta_stride",
                                                  "out", "out_stride", "out_delta", "out_delta_stride",
                                                  "beta_delta", "gamma_delta"],
    "BNNSFilterDestroy": ["filter"],
    "BNNSComputeLSTMTrainingCacheCapacity": ["layer_params"],
    "BNNSDirectApplyLSTMBatchTrainingCaching": ["layer_params", "filter_params", "training_cache_ptr",
                                                "training_cache_capacity"],
    "BNNSDirectApplyLSTMBatchBackward": ["layer_params", "layer_delta_params", "filter_params",
                                         "training_cache_ptr", "training_cache_capacity"],
}


def test_parameters_are_apples() -> None:
    for name, parameters in APPLE.items():
        assert list(inspect.signature(getattr(bnns, name)).parameters) == parameters, name


def guarded(values: np.ndarray, strides_np: tuple[int, ...], offset: int = 0,
            fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``values`` laid out with element strides ``strides_np`` (NumPy order) in a buffer between
    guard regions: (backing, buffer). Elements between the described ones hold ``fill``."""
    span = 1 + sum((n - 1) * s for n, s in zip(values.shape, strides_np))
    backing = np.full(GUARD + offset + span + GUARD, 1e30, F32)
    buffer = backing[GUARD:GUARD + offset + span]
    buffer[...] = fill
    view = np.lib.stride_tricks.as_strided(buffer[offset:], values.shape, tuple(4 * s for s in strides_np))
    view[...] = values
    return backing, buffer


def padded_strides(shape: tuple[int, ...], pads: list[int]) -> tuple[int, ...]:
    """NumPy-order element strides of ``shape`` with ``pads`` extra elements per dimension."""
    strides, step = [], 1
    for extent, pad in zip(reversed(shape), pads):
        step += pad
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def reference(kind: str, x: np.ndarray, dy: np.ndarray):
    ntype = {"layer_norm": NormalizationType.layer(normalization_axis=1),
             "instance_norm": NormalizationType.instance(),
             "group_norm": NormalizationType.group(group_count=2)}[kind]
    layer = NormalizationLayer(NormalizationParameters(type=ntype, input_shape=SHAPE, epsilon=1e-3))
    layer.apply(x)
    return layer.apply_backward(x, dy)


def forward(f: bnns.BNNSFilter, x: np.ndarray) -> None:
    assert bnns.BNNSNormalizationFilterApplyBatch(f, len(x), x.ravel().copy(), 0, np.zeros(x.size, F32), 0,
                                                  True) == 0


def make_filter(kind: str):
    i_desc = Desc.shape_only(SHAPE, "image_chw")
    params = bnns.BNNSLayerParametersNormalization(i_desc=i_desc, o_desc=i_desc, epsilon=1e-3, num_groups=2,
                                                   normalization_axis=1)
    f = bnns.BNNSFilterCreateLayerNormalization(getattr(bf.FilterType, kind), params, None)
    assert f is not None
    return f


def test_backward_with_descriptors_as_apple_declares(rng: np.random.Generator) -> None:
    """The declared form: every delta a descriptor with its own strides, one accumulating."""
    n = 2
    x = rng.standard_normal((n, *SHAPE)).astype(F32)
    dy = rng.standard_normal((n, *SHAPE)).astype(F32)
    want = reference("layer_norm", x, dy)
    f = make_filter("layer_norm")
    forward(f, x)

    sample_strides = padded_strides(SHAPE, [1, 2, 0])              # 2 apart, rows padded
    span = 1 + sum((e - 1) * s for e, s in zip(SHAPE, sample_strides))
    batch_stride = span + 5
    batch_strides = (batch_stride, *sample_strides)
    dy_backing, dy_buf = guarded(dy, batch_strides, fill=np.nan)
    dx_backing, dx_buf = guarded(np.zeros_like(x), batch_strides, fill=-3.0)
    sizes = tuple(reversed(SHAPE))
    strides = tuple(reversed(sample_strides))
    out_delta = Desc(layout="image_chw", size=sizes, stride=strides, data=dy_buf)
    in_delta = Desc(layout="image_chw", size=sizes, stride=strides, data=dx_buf)
    affine = SHAPE[1:]
    gamma_start = rng.standard_normal(affine).astype(F32)
    gamma_backing, gamma_buf = guarded(gamma_start.T.copy(), (2, 1))  # column-major (H, W): h + 2·w
    gamma_delta = Desc(layout="column_major_matrix", size=affine, data=gamma_buf, flags=ACCUMULATE)
    beta_delta = Desc.from_array(np.full(affine, 9.0, F32))
    before = [a.copy() for a in (dy_backing, dx_backing, gamma_backing)]
    assert bnns.BNNSNormalizationFilterApplyBackwardBatch(f, n, in_delta, batch_stride, None, 0, out_delta,
                                                          batch_stride, beta_delta, gamma_delta) == 0
    view = np.lib.stride_tricks.as_strided(dx_buf, x.shape, tuple(4 * s for s in batch_strides))
    np.testing.assert_allclose(view, want.input, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(beta_delta.data, want.beta, rtol=1e-5, atol=1e-5)      # overwritten
    gamma = np.lib.stride_tricks.as_strided(gamma_buf, affine, (4, 4 * affine[0]))
    np.testing.assert_allclose(gamma, gamma_start + want.gamma, rtol=1e-5, atol=1e-5)  # accumulated
    np.testing.assert_array_equal(dy_backing, before[0])  # out_delta: read only, and never outside
    for backing, old in zip((dx_backing, gamma_backing), before[1:]):
        np.testing.assert_array_equal(backing[:GUARD], old[:GUARD])
        np.testing.assert_array_equal(backing[-GUARD:], old[-GUARD:])
    assert np.count_nonzero(dx_buf != -3.0) <= x.size  # only the described elements of in_delta changed


DELTA_KINDS = ("none", "buffer", "dense", "padded", "sizes", "accumulate", "no data", "wrong sizes",
               "float64 data", "int8 type", "aliasing strides", "short", "gamma buffer", "not a descriptor")


@settings(HOSTILE, max_examples=160)
@given(data=st.data(), kind=st.sampled_from(["layer_norm", "instance_norm", "group_norm"]),
       n=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_backward_delta_arguments(data: st.DataObject, kind: str, n: int, seed: int) -> None:
    """Each delta drawn from the declared descriptor forms and from hostile values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *SHAPE)).astype(F32)
    dy = rng.standard_normal((n, *SHAPE)).astype(F32)
    want = reference(kind, x, dy)
    f = make_filter(kind)
    forward(f, x)
    sizes = tuple(reversed(SHAPE))
    affine = want.gamma.shape
    expectations: list = []  # (check, description) run after a success

    def sample_delta(role: str, values: np.ndarray) -> tuple[object, int, bool]:
        """(argument, batch stride, valid) for in_delta (values zeros) or out_delta (values dy)."""
        form = data.draw(st.sampled_from(DELTA_KINDS[:6] + DELTA_KINDS[7:12] + DELTA_KINDS[13:]), label=role)
        if form == "none":
            return None, 0, role == "in_delta"
        if form == "buffer":
            buf = values.ravel().copy()
            if role == "in_delta":
                expectations.append((lambda: buf.reshape(x.shape), "in_delta buffer"))
            return buf, 0, True
        if form == "not a descriptor":
            return {"data": values}, 0, False
        pads = [0, 0, 0] if form in ("dense", "sizes", "accumulate") else data.draw(
            st.lists(st.integers(0, 2), min_size=3, max_size=3), label=f"{role} pads")
        strides_np = padded_strides(SHAPE, pads)
        span = 1 + sum((e - 1) * s for e, s in zip(SHAPE, strides_np))
        batch_stride = span + data.draw(st.integers(0, 3), label=f"{role} batch gap")
        start = (rng.standard_normal(values.shape).astype(F32) if form == "accumulate"
                 else np.zeros_like(values))
        _, buf = guarded(values if role == "out_delta" else start, (batch_stride, *strides_np))
        stride8 = tuple(reversed(strides_np)) if any(pads) else (0, 0, 0)
        desc = Desc(layout="image_chw", size=sizes if form != "dense" else (0, 0, 0), stride=stride8,
                    data=buf, flags=ACCUMULATE if form == "accumulate" else 0)
        valid = True
        if form == "no data":
            desc.data = None
            valid = role == "in_delta"
        elif form == "wrong sizes":
            desc.size = (3, 2, 5)
            valid = False
        elif form == "float64 data":
            desc.data = np.zeros(buf.size, np.float64)
            valid = False
        elif form == "int8 type":
            desc.data_type = "int8"
            valid = False
        elif form == "aliasing strides":
            desc.stride = (1, 2, 3)
            valid = False
        elif form == "short":
            desc.data = buf[:-1]
            valid = False
        if valid and role == "in_delta" and desc.data is not None:
            layout = (batch_stride, *strides_np)

            def got(buf: np.ndarray = buf, strides: tuple[int, ...] = layout) -> np.ndarray:
                return np.lib.stride_tricks.as_strided(buf, x.shape, tuple(4 * s for s in strides))
            base = start.copy()
            expectations.append((lambda: got() - base, "in_delta"))
        return desc, batch_stride, valid

    in_delta, in_stride, in_ok = sample_delta("in_delta", np.zeros_like(x))
    out_delta, out_stride, out_ok = sample_delta("out_delta", dy)

    def parameter_delta(name: str) -> tuple[object, bool, np.ndarray | None]:
        form = data.draw(st.sampled_from(["none", "set", "accumulate", "no data", "buffer", "wrong shape",
                                          "same as in_delta"]), label=name)
        if form == "none":
            return None, True, None
        if form == "buffer":
            return np.zeros(affine, F32), False, None
        if form == "same as in_delta":
            if isinstance(in_delta, Desc) and in_delta.data is not None and in_ok:
                return Desc(layout="vector", size=(int(np.prod(affine)),), data=in_delta.data), False, None
            form = "set"
        if form == "wrong shape":
            return Desc.from_array(np.zeros(int(np.prod(affine)) + 1, F32)), False, None
        start = rng.standard_normal(affine).astype(F32) if form == "accumulate" else np.zeros(affine, F32)
        desc = Desc.from_array(start.copy(), "row_major_matrix" if len(affine) == 2 else None,
                               flags=ACCUMULATE if form == "accumulate" else 0)
        if form == "no data":
            desc.data = None
            return desc, True, None
        return desc, True, start

    beta_delta, beta_ok, beta_start = parameter_delta("beta_delta")
    gamma_delta, gamma_ok, gamma_start = parameter_delta("gamma_delta")
    valid = in_ok and out_ok and beta_ok and gamma_ok
    ok, _ = c_call("c-types", bnns.BNNSNormalizationFilterApplyBackwardBatch, f, n, in_delta, in_stride, None,
                   0, out_delta, out_stride, beta_delta, gamma_delta)
    if ok != valid:
        raise wrong("c-types", f"{'accepted' if ok else 'refused'} in_delta={type(in_delta).__name__} "
                               f"out_delta={type(out_delta).__name__}")
    if not ok:
        return
    for get, what in expectations:
        if not np.allclose(get(), want.input, rtol=1e-5, atol=1e-5):
            raise wrong("c-types", f"{what} differs from the object API's input gradient")
    for desc, start, value in ((beta_delta, beta_start, want.beta), (gamma_delta, gamma_start, want.gamma)):
        if start is not None and not np.allclose(np.asarray(desc.data) - start, value, rtol=1e-5, atol=1e-5):
            raise wrong("c-types", "a parameter delta differs from the object API's")
    answered("c-types")


HOSTILE_VALUES = [None, "filter", 1.5, -1, 2**70, object(), np.zeros(3, F32), [1, 2], True]


@settings(HOSTILE, max_examples=90)
@given(function=st.sampled_from(sorted(APPLE)), position=st.integers(0, 9),
       value=st.sampled_from(HOSTILE_VALUES))
def test_other_types_are_refused(function: str, position: int, value: object) -> None:
    """A value of another type in any position of any entry point: refused with its reason
    (or, where Apple's type allows it, answered as for a valid call)."""
    i_desc = Desc.shape_only((2, 3), "row_major_matrix")
    f = bnns.BNNSFilterCreateLayerNormalization(
        bf.FilterType.layer_norm, bnns.BNNSLayerParametersNormalization(i_desc=i_desc, o_desc=i_desc), None)
    x, y = np.ones(6, F32), np.zeros(6, F32)
    p = LSTMParameters.random(input_size=2, hidden_size=2, seed=0)
    lstm = lstm_parameters(p)
    delta = lstm_parameters(p, delta=True)
    layer_params = bnns.BNNSLayerParametersNormalization(i_desc=i_desc, o_desc=i_desc)
    good = {
        "BNNSFilterCreateLayerNormalization": [bf.FilterType.layer_norm, layer_params, None],
        "BNNSNormalizationFilterApplyBatch": [f, 1, x, 0, y, 0, True],
        "BNNSNormalizationFilterApplyBackwardBatch": [f, 1, None, 0, None, 0, x, 0, None, None],
        "BNNSFilterDestroy": [f],
        "BNNSComputeLSTMTrainingCacheCapacity": [lstm],
        "BNNSDirectApplyLSTMBatchTrainingCaching": [lstm, None, None, 0],
        "BNNSDirectApplyLSTMBatchBackward": [lstm, delta, None, None, 0],
    }[function]
    if function == "BNNSNormalizationFilterApplyBackwardBatch":
        assert bnns.BNNSNormalizationFilterApplyBatch(f, 1, x, 0, y, 0, True) == 0
    args = list(good)
    position %= len(args)
    args[position] = value
    failure = None if function in ("BNNSFilterCreateLayerNormalization", "BNNSFilterDestroy") else -1
    nullable = APPLE[function][position] in ("filter_params", "in_delta", "out", "beta_delta", "gamma_delta",
                                             "training_cache_ptr")
    if value is None and nullable:
        ok, result = c_call("c-types", getattr(bnns, function), *args, failure=failure)
        if function == "BNNSFilterCreateLayerNormalization":
            ok = ok and isinstance(result, bnns.BNNSFilter)
        if not ok:
            raise wrong("c-types", f"{function}: a null {APPLE[function][position]} was refused")
        answered("c-types")
        return
    if function == "BNNSFilterDestroy":  # returns None either way: the reason must be logged
        c_refused("c-types", bnns.BNNSFilterDestroy, value, failure=None)
        return
    if (function, position, value) == ("BNNSNormalizationFilterApplyBatch", 1, True):
        pass  # a bool is not a size_t
    c_refused("c-types", getattr(bnns, function), *args, failure=failure)


def lstm_parameters(p: LSTMParameters, delta: bool = False) -> bnns.BNNSLayerParametersLSTM:
    t, n = 2, 1

    def d(a: np.ndarray | None) -> Desc | None:
        return None if a is None else Desc.from_array(np.zeros_like(a) if delta else a.astype(F32))

    gates = {name: bnns.BNNSLSTMGateDescriptor(iw_desc=(d(g.input_weights[0]), None),
                                               hw_desc=d(g.hidden_weights), b_desc=d(g.bias))
             for name, g in zip(("input_gate", "forget_gate", "candidate_gate", "output_gate"), p.gates)}
    sequence = Desc.from_array(np.zeros((t, n, 2), F32), "sne")
    return bnns.BNNSLayerParametersLSTM(
        input_size=2, hidden_size=2, batch_size=n, num_layers=1, seq_len=t,
        input_descriptor=bnns.BNNSLSTMDataDescriptor(data_desc=sequence),
        output_descriptor=bnns.BNNSLSTMDataDescriptor(
            data_desc=Desc.from_array(np.ones((t, n, 2), F32), "sne")),
        **gates)

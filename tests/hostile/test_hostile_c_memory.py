"""Family 1: the C-style API checks every size and stride against the caller's buffer.

Each example builds a normalization filter whose sample layout (``i_desc``/``o_desc``
strides) and batch layout (``in_stride``, ``out_stride``, ``batch_size``, buffer lengths) are
drawn from valid and hostile values, places every buffer between guard regions, and checks:
a valid layout gives the object API's answer and writes exactly the described elements; any
other is refused with Apple's failure value and a clear logged reason; nothing outside the
caller's buffers is read (the guards hold NaN, which would reach the output) or written.
"""

from __future__ import annotations

import math

import numpy as np
from hostile._hostile import HOSTILE, answered, c_call, c_refused, wrong
from hypothesis import given, settings
from hypothesis import strategies as st

import bnnsfw as bf
from bnnsfw import bnns
from bnnsfw.bnns import BNNSNDArrayDescriptor as Desc
from bnnsfw.layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

F32 = np.float32
GUARD = 16
KINDS = {"batch_norm": NormalizationType.batch(), "instance_norm": NormalizationType.instance(),
         "layer_norm": NormalizationType.layer(), "group_norm": NormalizationType.group(group_count=2)}

#: Values a C caller could pass where Apple declares ``size_t``: most valid, some hostile.
HOSTILE_INTS = st.one_of(st.integers(-2**31, -1), st.sampled_from([2**40, 2**62, 2**64 + 3]),
                         st.sampled_from([1.5, "2", None, True, np.float32(3.0)]))


def nested(sizes: list[int], strides: list[int]) -> bool:
    """The test's own statement of the layout rule: dimensions of more than one element,
    by increasing stride, each at least the span of those inside it."""
    span = 1
    for size, stride in sorted((p for p in zip(sizes, strides) if p[0] > 1), key=lambda p: p[1]):
        if stride < span:
            return False
        span += (size - 1) * stride
    return True


def is_count(value: object, minimum: int = 0) -> bool:
    """A ``size_t`` at least ``minimum``."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and minimum <= value <= 2**64 - 1)


@st.composite
def sample_layouts(draw: st.DrawFn, sizes: list[int], hostile: bool) -> list[int]:
    """Strides, fastest first, for a sample of ``sizes``: dense (zeros), padded, or (hostile)
    anything at all."""
    kind = draw(st.sampled_from(["dense", "padded", "padded", "swapped", *(["free"] * 3 * hostile)]))
    if kind == "dense":
        return [0] * len(sizes)
    if kind == "free":  # anything: zeros mixed with positives, aliasing, huge
        return draw(st.lists(st.one_of(st.integers(0, 12), st.just(2**50)), min_size=len(sizes),
                             max_size=len(sizes)))
    strides, step = [], 1
    for size in sizes:
        step += draw(st.integers(0, 2))
        strides.append(step)
        step *= size
    if kind == "swapped" and len(strides) > 1:  # outer dimension fastest: still a valid nesting
        strides = [strides[-1] * sizes[-1], *strides[1:-1], 1] if sizes[-1] > 1 else strides
    return strides


def gather(buffer: np.ndarray, shape: tuple[int, ...], strides_np: list[int], batch: int,
           batch_stride: int) -> np.ndarray:
    """The test's own element-by-element read of a strided batch (NumPy-order strides)."""
    out = np.empty((batch, *shape), F32)
    for index in np.ndindex(*out.shape):
        offset = index[0] * batch_stride + sum(i * s for i, s in zip(index[1:], strides_np))
        out[index] = buffer[offset]
    return out


def guarded(length: int, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """A buffer of ``length`` elements between two guard regions: (backing, buffer)."""
    backing = np.full(GUARD + max(length, 0) + GUARD, np.nan, F32)
    backing[GUARD:GUARD + length] = fill
    return backing, backing[GUARD:GUARD + length]


FIELDS = ("template", "batch", "in_stride", "out_stride", "in_len", "out_len", "training")


@settings(HOSTILE, max_examples=260)
@given(data=st.data(), kind=st.sampled_from(sorted(KINDS)),
       shape=st.tuples(st.sampled_from([2, 4]), st.integers(1, 3), st.integers(1, 3)),
       hostile=st.sampled_from([None, None, *FIELDS]))
def test_normalization_batch_layouts(data: st.DataObject, kind: str, shape: tuple[int, ...],
                                     hostile: str | None) -> None:
    """Every field valid, or one of them (``hostile``) drawn from hostile values as well."""
    sizes = list(reversed(shape))
    strides = data.draw(sample_layouts(sizes, hostile == "template"), label="sample strides")
    effective = strides if any(strides) else [math.prod(sizes[:i]) for i in range(len(sizes))]
    template_ok = (all(s == 0 for s in strides) or all(s > 0 for s in strides)) and nested(sizes, effective)
    span = 1 + sum((s - 1) * st_ for s, st_ in zip(sizes, effective))
    desc = Desc(layout="image_chw", size=sizes, stride=strides)
    params = bnns.BNNSLayerParametersNormalization(i_desc=desc, o_desc=desc, epsilon=1e-3, num_groups=2)
    if not template_ok:
        c_refused("c-memory", bnns.BNNSFilterCreateLayerNormalization, getattr(bf.FilterType, kind), params,
                  None, failure=None, match=r"i_desc\.stride")
        return
    f = bnns.BNNSFilterCreateLayerNormalization(getattr(bf.FilterType, kind), params, None)
    assert f is not None

    def pick(field: str, valid: st.SearchStrategy[object], bad: st.SearchStrategy[object]) -> object:
        return data.draw(st.one_of(valid, bad) if hostile == field else valid, label=field)

    batch = pick("batch", st.integers(1, 3), st.one_of(HOSTILE_INTS, st.just(0)))
    n = batch if is_count(batch, 1) and batch < 4 else 2
    valid_stride = st.one_of(st.just(0), st.just(span), st.integers(span, span + 5))
    bad_stride = st.one_of(st.integers(1, max(1, span - 1)), HOSTILE_INTS)
    in_stride = pick("in_stride", valid_stride, bad_stride)
    out_stride = pick("out_stride", valid_stride, bad_stride)

    def layout_ok(stride: object) -> bool:
        return is_count(stride) and (stride == 0 or n == 1 or stride >= span)

    def needed(stride: object) -> int:
        step = span if stride == 0 or not is_count(stride) else int(stride)
        return (n - 1) * step + span

    def length(stride: object, field: str) -> int:  # a huge layout gets a small buffer: refused
        need = needed(stride)
        return 64 if need > 10**5 else need + int(pick(field, st.sampled_from([0, 3]), st.just(-1)))

    in_len, out_len = length(in_stride, "in_len"), length(out_stride, "out_len")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    in_backing, in_buf = guarded(in_len, np.nan)
    in_buf[...] = rng.standard_normal(in_buf.shape).astype(F32)
    out_backing, out_buf = guarded(out_len, -7.0)
    out_backing[:GUARD] = out_backing[GUARD + out_len:] = 1e30  # a sentinel that compares equal
    in_before, out_before = in_backing.copy(), out_backing.copy()
    training = pick("training", st.booleans(), st.sampled_from([1, None, "yes", np.float32(1)]))

    valid = (is_count(batch, 1) and batch < 4 and layout_ok(in_stride) and layout_ok(out_stride)
             and in_len >= needed(in_stride) and out_len >= needed(out_stride)
             and isinstance(training, bool))
    ok, _ = c_call("c-memory", bnns.BNNSNormalizationFilterApplyBatch, f, batch, in_buf, in_stride, out_buf,
                   out_stride, training)
    np.testing.assert_array_equal(in_backing, in_before)  # the input and both guards: untouched
    np.testing.assert_array_equal(out_backing[:GUARD], out_before[:GUARD])
    np.testing.assert_array_equal(out_backing[GUARD + out_len:], out_before[GUARD + out_len:])
    if not ok:
        if valid:
            raise wrong("c-memory", "a valid layout was refused")
        np.testing.assert_array_equal(out_backing, out_before)
        return
    if not valid:
        raise wrong("c-memory", f"accepted batch={batch!r} in_stride={in_stride!r} out_stride={out_stride!r} "
                                f"lengths {in_len}/{out_len}")
    numpy_strides = list(reversed(effective))
    x = gather(in_buf, shape, numpy_strides, n, in_stride or span)
    layer = NormalizationLayer(NormalizationParameters(type=KINDS[kind], input_shape=shape, epsilon=1e-3))
    expected = layer.apply(x, phase="training" if training else "inference")
    got = gather(out_buf, shape, numpy_strides, n, out_stride or span)
    if not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        raise wrong("c-memory", "the output differs from the object API's")
    written = np.count_nonzero(out_backing != out_before)  # the guards compare equal: no NaN in them
    assert written <= expected.size  # nothing but the described elements changed
    answered("c-memory")


@settings(HOSTILE, max_examples=60)
@given(data=st.data())
def test_normalization_buffer_kinds(data: st.DataObject) -> None:
    """Buffers of every kind a caller might pass: only writable float32 memory of the
    described extent is used; everything else is refused with its reason."""
    shape = (2, 3)
    layer_desc = Desc.shape_only(shape, "row_major_matrix")
    f = bnns.BNNSFilterCreateLayerNormalization(
        bf.FilterType.layer_norm, bnns.BNNSLayerParametersNormalization(i_desc=layer_desc, o_desc=layer_desc),
        None)
    x = np.random.default_rng(0).standard_normal((2, *shape)).astype(F32)
    kinds = {
        "array": lambda: np.zeros(12, F32),
        "bytearray": lambda: bytearray(48),
        "float64": lambda: np.zeros(12, np.float64),
        "big-endian": lambda: np.zeros(12, ">f4"),
        "read-only": lambda: np.frombuffer(bytes(48), F32),
        "strided view": lambda: np.zeros(24, F32)[::2],
        "list": lambda: [0.0] * 12,
        "short": lambda: np.zeros(11, F32),
        "odd bytes": lambda: bytearray(47),
        "object": lambda: object(),
        "none": lambda: None,
    }
    in_kind = data.draw(st.sampled_from(sorted(kinds)), label="in")
    out_kind = data.draw(st.sampled_from(sorted(kinds)), label="out")
    in_buf, out_buf = kinds[in_kind](), kinds[out_kind]()
    if in_kind in ("array", "bytearray", "read-only"):
        writable = np.frombuffer(in_buf, F32) if in_kind != "array" else in_buf
        if in_kind == "read-only":
            in_buf = x.ravel().tobytes()
            in_buf = np.frombuffer(in_buf, F32)
        else:
            writable[...] = x.ravel()
    valid = in_kind in ("array", "bytearray", "read-only") and out_kind in ("array", "bytearray")
    ok, _ = c_call("c-memory", bnns.BNNSNormalizationFilterApplyBatch, f, 2, in_buf, 0, out_buf, 0, True)
    if ok != valid:
        raise wrong("c-memory", f"in={in_kind} out={out_kind}: {'accepted' if ok else 'refused'}")
    if ok:
        got = np.frombuffer(out_buf, F32) if isinstance(out_buf, bytearray) else out_buf
        expected = NormalizationLayer(NormalizationParameters(type=NormalizationType.layer(),
                                                              input_shape=shape)).apply(x)
        if not np.allclose(got.reshape(2, *shape), expected, rtol=1e-5, atol=1e-5):
            raise wrong("c-memory", "the output differs from the object API's")
        answered("c-memory")


# --- LSTM: every region of one call in one backing buffer, some of them overlapping -------

T, N, IN, H = 3, 2, 3, 2
REGIONS = {"x": (T, N, IN), "h0": (1, N, H), "c0": (1, N, H), "y": (T, N, H), "hT": (1, N, H),
           "cT": (1, N, H)}
INPUTS, OUTPUTS = ("x", "h0", "c0"), ("y", "hT", "cT")


def lstm_call_params(p: bf.LSTMParameters, arrays: dict[str, np.ndarray]) -> bnns.BNNSLayerParametersLSTM:
    def d(a: np.ndarray, layout: str | None = None) -> Desc:
        return Desc(layout=layout or "last_major_3d", size=tuple(reversed(a.shape)), data=a)

    gates = {name: bnns.BNNSLSTMGateDescriptor(iw_desc=(Desc.from_array(g.input_weights[0]), None),
                                               hw_desc=Desc.from_array(g.hidden_weights),
                                               b_desc=Desc.from_array(g.bias))
             for name, g in zip(("input_gate", "forget_gate", "candidate_gate", "output_gate"), p.gates)}
    return bnns.BNNSLayerParametersLSTM(
        input_size=IN, hidden_size=H, batch_size=N, num_layers=1, seq_len=T,
        input_descriptor=bnns.BNNSLSTMDataDescriptor(
            data_desc=d(arrays["x"], "sne"), hidden_desc=d(arrays["h0"]), cell_state_desc=d(arrays["c0"])),
        output_descriptor=bnns.BNNSLSTMDataDescriptor(
            data_desc=d(arrays["y"], "sne"), hidden_desc=d(arrays["hT"]), cell_state_desc=d(arrays["cT"])),
        **gates)


@settings(HOSTILE, max_examples=70)
@given(data=st.data(), collide=st.sampled_from([None, None, ("y", "x"), ("hT", "h0"), ("cT", "c0"),
                                                ("hT", "cT"), ("y", "hT"), ("cache", "x"), ("cache", "y"),
                                                ("cache", "h0"), ("cT", "h0")]),
       exact=st.booleans())
def test_lstm_regions_apart(data: st.DataObject, collide: tuple[str, str] | None, exact: bool) -> None:
    """One buffer for two outputs, an output partly over an input, or the training cache over
    any descriptor: refused before anything is written. An output over exactly the elements of
    an input of its shape (a state updated in place) is answered like separate buffers."""
    p = bf.LSTMParameters.random(input_size=IN, hidden_size=H, seed=2)
    layer = bf.LSTMLayer(p)
    capacity = layer.training_cache_capacity(batch_size=N, seq_len=T)
    cache_elems = -(-capacity // 4)
    sizes = {name: math.prod(shape) for name, shape in REGIONS.items()} | {"cache": cache_elems}
    offsets, at = {}, GUARD
    for name in sizes:
        offsets[name] = at
        at += sizes[name] + data.draw(st.integers(0, 3), label=f"gap after {name}")
    valid = True
    if collide is not None:
        a, b = collide
        same_shape = sizes[a] == sizes[b] and a != "cache" and b != "cache"
        in_place = exact and same_shape and a in OUTPUTS and b in INPUTS
        offsets[a] = offsets[b] + (0 if exact and same_shape else 1)
        valid = in_place
    backing = np.full(at + cache_elems + GUARD, 1e30, F32)
    rng = np.random.default_rng(data.draw(st.integers(0, 999), label="seed"))
    arrays = {name: backing[offsets[name]:offsets[name] + sizes[name]].reshape(REGIONS[name])
              for name in REGIONS}
    inputs = {name: rng.standard_normal(REGIONS[name]).astype(F32) for name in INPUTS}
    for name in INPUTS:
        arrays[name][...] = inputs[name]
    cache = backing[offsets["cache"]:offsets["cache"] + cache_elems].view(np.uint8)[:capacity]
    before = backing.copy()
    ok, _ = c_call("c-memory", bnns.BNNSDirectApplyLSTMBatchTrainingCaching, lstm_call_params(p, arrays),
                   None, cache, capacity)
    if ok != valid:
        raise wrong("c-memory", f"LSTM regions {collide} exact={exact}: {'accepted' if ok else 'refused'}")
    if not ok:
        np.testing.assert_array_equal(backing, before)  # refused before anything was written
        return
    np.testing.assert_array_equal(backing[:GUARD], before[:GUARD])
    np.testing.assert_array_equal(backing[-GUARD:], before[-GUARD:])
    want = layer.apply(inputs["x"], hidden=inputs["h0"], cell=inputs["c0"])
    for name, value in (("y", want.output), ("hT", want.hidden), ("cT", want.cell)):
        if not np.allclose(arrays[name], value, rtol=1e-5, atol=1e-6):
            raise wrong("c-memory", f"LSTM {name} differs from the object API's")
    answered("c-memory")

"""Family 6: every other entry of the object API gives a clear error or the right answer.

Each example puts one hostile value in one argument of one public call (the other arguments
valid) and checks: the call either raises a bnnsfw error that names the argument, the rule
and the value, or it answers — and then the value must have been one the API documents
accepting (an array of the layer's dtype, or an array-like of real numbers, of the right
shape), and the answer must be that of the same call with the value converted. Complex
numbers, text, ``None``, big-endian arrays, integer arrays to activations, ragged lists,
object arrays, one buffer for two outputs: none is answered.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np
import pytest
from hostile._hostile import HOSTILE, answered, attempt, refused, wrong
from hypothesis import given, settings
from hypothesis import strategies as st

import bnnsfw as bf
from bnnsfw.losses import MeanSquaredError, SoftmaxCrossEntropy
from bnnsfw.optimizers import SGD

F32 = np.float32
T, N, IN, H = 3, 2, 4, 3


def arrays_like(shape: tuple[int, ...]) -> st.SearchStrategy[object]:
    """Hostile and valid stand-ins for an array of ``shape``."""
    base = np.arange(math.prod(shape), dtype=np.float64).reshape(shape) / 7 - 0.5
    dtypes = ["<f4", "<f8", ">f4", ">f8", "<f2", "<i4", "<i8", "|b1", "<c8", "<c16", "|O", "<U3", "<u1"]
    typed = st.sampled_from(dtypes).map(lambda d: base.astype(d))
    shapes = st.sampled_from([shape[:-1], (*shape, 1), tuple(reversed(shape)), (0, *shape[1:]), ()]).map(
        lambda s: np.zeros(s, F32))
    lists = st.sampled_from(["floats", "complex", "strings", "ragged", "none inside", "ints"]).map(lambda k: {
        "floats": base.tolist(), "ints": base.astype(int).tolist(),
        "complex": (base + 1j).tolist(), "strings": base.astype(str).tolist(),
        "ragged": [[1.0, 2.0], [3.0]], "none inside": [None] * shape[0]}[k])
    scalars = st.one_of(st.none(), st.text(max_size=3), st.booleans(), st.integers(-3, 3),
                        st.complex_numbers(max_magnitude=5, allow_nan=False, allow_infinity=False),
                        st.just(object()))
    return st.one_of(typed, typed, shapes, lists, scalars)


def acceptable(value: object, shape: tuple[int | None, ...], dtype: Any,
               empty: bool = False) -> np.ndarray | None:
    """The test's own rule, the one docs/conventions.md states: what NumPy reads from the value
    (``numpy.asarray``) must already have the layer's dtype, whatever kind of value it is;
    that array, or None."""
    try:
        raw = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (TypeError, ValueError):
        return None
    array = raw if raw.dtype == np.dtype(dtype) else None
    if array is None or array.ndim != len(shape):
        return None
    if any(e is not None and a != e for a, e in zip(array.shape, shape)) or (0 in array.shape and not empty):
        return None
    return array


def lstm(dtype: Any = F32) -> bf.LSTMLayer:
    return bf.LSTMLayer(bf.LSTMParameters.random(input_size=IN, hidden_size=H, seed=0, dtype=dtype))


@functools.lru_cache(maxsize=None)
def warm_lstm() -> bf.LSTMLayer:
    """One layer for the whole run that has answered valid inferences of the kinds the
    examples draw (float32, C-contiguous, shaped as :data:`ARRAY_TARGETS` says, batched and
    not, with and without a hidden state): it skips the checks of a kind it knows, and must
    refuse every hostile value all the same."""
    layer = lstm()
    for x, hidden in ((np.zeros((2, 2, IN), F32), None), (np.zeros((2, IN), F32), None),
                      (X, np.zeros((1, N, H), F32))):
        for _ in range(2):
            layer.apply(x, hidden=hidden)
    return layer


def norm() -> bf.NormalizationLayer:
    parameters = bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(IN,))
    return bf.NormalizationLayer(parameters)


def dense() -> bf.FullyConnectedLayer:
    return bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=IN, output_size=H, seed=0))


X = np.random.default_rng(0).standard_normal((T, N, IN)).astype(F32)
#: (call with the hostile value, NumPy shape it stands for (None: any extent), dtype)
ARRAY_TARGETS: dict[str, tuple[Callable[[object], Any], tuple[int | None, ...], Any]] = {
    "LSTMLayer.apply(x)": (lambda v: lstm().apply(v).output, (None, None, IN), F32),
    "LSTMLayer.apply(hidden)": (lambda v: lstm().apply(X, hidden=v).output, (1, N, H), F32),
    "LSTMLayer.apply(x), kinds known": (lambda v: warm_lstm().apply(v).output, (None, None, IN), F32),
    "LSTMLayer.apply(hidden), kinds known": (lambda v: warm_lstm().apply(X, hidden=v).output, (1, N, H), F32),
    "LSTMLayer.apply_backward(output_gradient)": (
        lambda v: lstm().apply_backward(X, v).input, (T, N, H), F32),
    "NormalizationLayer.apply(x)": (lambda v: norm().apply(v), (None, IN), F32),
    "NormalizationLayer.apply_backward(dy)": (
        lambda v: norm().apply_backward(X[0], v).input, (N, IN), F32),
    "FullyConnectedLayer.apply(x)": (lambda v: dense().apply(v), (None, IN), F32),
    "MeanSquaredError.apply(target)": (
        lambda v: MeanSquaredError().apply(X[0].astype(np.float64), v).gradient, (N, IN), np.float64),
}


OPTIONAL = {"LSTMLayer.apply(hidden)", "LSTMLayer.apply(hidden), kinds known",
            "LSTMLayer.apply_backward(output_gradient)"}


@settings(HOSTILE, max_examples=290)
@given(target=st.sampled_from(sorted(ARRAY_TARGETS)), data=st.data())
def test_hostile_arrays(target: str, data: st.DataObject) -> None:
    call, shape, dtype = ARRAY_TARGETS[target]
    value = data.draw(arrays_like(tuple(e if e is not None else 2 for e in shape)), label="value")
    if value is None and target in OPTIONAL:
        return  # None means "not given" there (zeros for a state): not a hostile value
    canonical = acceptable(value, shape, dtype, empty=target.startswith("FullyConnected"))  # (0, I) -> (0, O)
    ok, result = attempt("errors", call, value)
    if not ok:
        if canonical is not None:
            raise wrong("errors", f"{target}: refused an acceptable {value!r}")
        return
    if canonical is None:
        raise wrong("errors", f"{target}: answered for {value!r}")
    if not np.array_equal(result, call(canonical), equal_nan=True):
        raise wrong("errors", f"{target}: the answer differs from the converted value's")
    answered("errors")


def floats_like() -> st.SearchStrategy[object]:
    return st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans(),
                     st.none(), st.text(max_size=4),
                     st.sampled_from(["0.5", "x", "nan", [0.1], (1, 2), 1 + 2j, object()]),
                     st.sampled_from([np.float32(0.25), np.int64(2), np.array(0.5), np.complex64(1)]))


def stored(rule: Callable[[float], bool]) -> Callable[[object], float | None]:
    """What a float field should keep of ``value``: its value as a number, when ``rule`` holds."""
    def expected(value: object) -> float | None:
        if isinstance(value, (bool, np.bool_, str, complex, np.complexfloating)) or value is None:
            return None
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return number if math.isfinite(number) and rule(number) else None
    return expected


#: (build with the value, read the field back, what it should keep (None: refused))
SCALAR_TARGETS: dict[str, tuple[Callable[[object], Any], Callable[[Any], Any], Callable[[object], Any]]] = {
    "Activation.alpha": (lambda v: bf.Activation(3, alpha=v), lambda a: a.alpha, stored(lambda x: True)),
    "Activation.beta": (lambda v: bf.Activation.softplus(beta=v), lambda a: a.beta, stored(lambda x: True)),
    "LSTMParameters.dropout": (
        lambda v: bf.LSTMParameters.random(input_size=2, hidden_size=2, dropout=v), lambda p: p.dropout,
        stored(lambda x: 0 <= x < 1)),
    "NormalizationParameters.epsilon": (
        lambda v: bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(2,), epsilon=v),
        lambda p: p.epsilon, stored(lambda x: x >= 0)),
    "NormalizationParameters.momentum": (
        lambda v: bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(2,), momentum=v),
        lambda p: p.momentum, stored(lambda x: 0 <= x <= 1)),
    "SGD.learning_rate": (lambda v: SGD(v), lambda o: o.learning_rate, stored(lambda x: x >= 0)),
}


def integral(minimum: int) -> Callable[[object], int | None]:
    def expected(value: object) -> int | None:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        return int(value) if ok and value >= minimum else None  # type: ignore[operator]
    return expected


INT_TARGETS = {
    "LSTMParameters.hidden_size": (lambda v: bf.LSTMParameters.random(input_size=2, hidden_size=v),
                                   lambda p: p.hidden_size, integral(1)),
    "FilterParameters.n_threads": (lambda v: bf.FilterParameters(n_threads=v), lambda f: f.n_threads,
                                   integral(0)),
    "NormalizationType.group_count": (lambda v: bf.NormalizationType.group(group_count=v),
                                      lambda t: t.group_count, integral(1)),
}


@settings(HOSTILE, max_examples=140)
@given(target=st.sampled_from(sorted(SCALAR_TARGETS) + sorted(INT_TARGETS)), value=floats_like())
def test_hostile_scalars(target: str, value: object) -> None:
    build, read, expected = {**SCALAR_TARGETS, **INT_TARGETS}[target]
    if target == "LSTMParameters.hidden_size" and isinstance(value, int) and value > 64:
        value = 64
    want = expected(value)
    ok, result = attempt("errors", build, value)
    if not ok:
        if want is not None:
            raise wrong("errors", f"{target}: refused {value!r}")
        return
    if want is None or read(result) != want:
        raise wrong("errors", f"{target}: {value!r} kept as {read(result)!r}")
    answered("errors")


def test_one_buffer_for_two_outputs() -> None:
    x = X[0]
    layer = norm()
    buffer = np.zeros(IN, F32)
    refused("errors", layer.apply_backward, x, x, beta_gradient=buffer, gamma_gradient=buffer,
            match="one buffer for two outputs")
    fc = dense()
    weights = np.zeros((H, IN), F32)
    refused("errors", fc.apply_backward, x, np.ones((N, H), F32), weights_gradient=weights,
            bias_gradient=weights[:, 0], match="one buffer for two outputs")


@pytest.mark.parametrize("call, match", [
    (lambda: bf.Activation.relu().forward(np.arange(3)), r"Activation.forward\(x\) must be a floating-point"),
    (lambda: bf.Activation.tanh().forward(np.arange(3, dtype=np.int8)), "floating-point"),
    (lambda: bf.Activation.sigmoid().forward([0.0, 1.0]), "a NumPy array of floats"),
    (lambda: bf.Activation.sigmoid().forward(np.zeros(3, np.complex64)), "complex64"),
    (lambda: bf.Activation.relu().forward(np.zeros(3), out=np.zeros(4)), r"forward\(out\)"),
    (lambda: bf.Activation.relu().backward(np.ones(3, np.int32), y=np.ones(3)), r"backward\(dy\)"),
    (lambda: bf.Activation(3, alpha="x"), r"Activation.alpha must be a finite number; got 'x'"),
    (lambda: bf.Activation(11).forward(np.zeros(3)), "per-element"),
    (lambda: MeanSquaredError().apply(None, np.zeros(2)), r"apply\(prediction\) must be"),
    (lambda: MeanSquaredError().apply(np.zeros(2), None), r"apply\(target\) must be an array"),
    (lambda: SoftmaxCrossEntropy().apply(None, np.zeros(2, int)), r"apply\(prediction\) must be"),
    (lambda: SoftmaxCrossEntropy().apply(np.zeros((2, 3)), None), r"apply\(target\) must be"),
    (lambda: SoftmaxCrossEntropy().apply(np.zeros((2, 3)), [1 + 1j, 0]), r"apply\(target\) must be"),
    (lambda: lstm().apply(np.zeros((T, N, IN), ">f4")), "big-endian"),
    (lambda: norm().apply(np.zeros((N, IN), ">f4")), "big-endian"),
    (lambda: bf.LSTMParameters.random(input_size=2, hidden_size=2).to_state() and bf.LSTMLayer(
        bf.LSTMParameters.random(input_size=2, hidden_size=2), bf.FilterParameters(backend="nope")),
     "nope"),
    (lambda: bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(2,),
                                        gamma=[1 + 1j, 1]), "complex numbers"),
    (lambda: bf.FullyConnectedParameters(input_size=2, output_size=1, weights=np.ones((1, 2), np.complex128)),
     "complex numbers"),
    (lambda: bf.NormalizationType.batch(moving_mean=["a", "b"], moving_variance=[1, 1]), "text"),
    (lambda: bf.DataType.parse("float128"), "DataType must be one of"),
    (lambda: bf.LearningPhase.parse(None), "LearningPhase"),
    (lambda: lstm().apply(X, sequence_lengths=[1.5, 2]), "sequence_lengths"),
    (lambda: lstm().apply(X, sequence_lengths=[0, 9]), "sequence_lengths"),
    (lambda: lstm().apply(X, training="yes"), r"apply\(training\)"),
    (lambda: lstm().apply(X, training=True, training_cache="buffer"), "training_cache"),
    (lambda: lstm().apply(X, training=True, training_cache=np.zeros(8, np.float32)), "training_cache"),
    (lambda: norm().apply(X[0], phase="train"), "phase"),
    (lambda: norm().apply_backward(X[0], X[0], accumulate="yes"), "accumulate"),
], ids=range(28))
def test_named_hostile_calls(call: Callable[[], Any], match: str) -> None:
    refused("errors", call, match=match)

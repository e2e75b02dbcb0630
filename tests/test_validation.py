"""One dtype rule for every kind of input: arrays, lists and array-likes alike."""

from __future__ import annotations

import numpy as np
import pytest

import bnnsfw as bf


class ArrayLike:
    """An object NumPy reads through ``__array__`` (as pandas or xarray objects are read)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __array__(self, dtype=None, copy=None):
        return self._array if dtype is None else self._array.astype(dtype)


def _layers(dtype, backend_name):
    fp = bf.FilterParameters(backend=backend_name)
    lstm = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=2, seed=0, dtype=dtype), fp)
    norm = bf.NormalizationLayer(bf.NormalizationParameters(type=bf.NormalizationType.layer(),
                                                            input_shape=(3,), dtype=dtype), fp)
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=3, output_size=2,
                                                                     dtype=dtype), fp)
    x_lstm = np.linspace(-1, 1, 12).reshape(2, 2, 3)       # (T, N, I)
    x_flat = np.linspace(-1, 1, 6).reshape(2, 3)           # (N, 3)
    return [("LSTMLayer.apply(x)", lambda x: lstm.apply(x).output, x_lstm),
            ("NormalizationLayer.apply(x)", lambda x: norm.apply(x), x_flat),
            ("FullyConnectedLayer.apply(x)", lambda x: head.apply(x), x_flat)]


def _kinds(values: np.ndarray):
    return {"ndarray": values, "array-like": ArrayLike(values), "list": values.tolist()}


def test_a_float32_layer_refuses_float64_of_every_kind_with_one_message(backend_name):
    for where, apply, x in _layers(np.float32, backend_name):
        messages = {}
        for kind, value in _kinds(x.astype(np.float64)).items():
            with pytest.raises(bf.DTypeError) as info:
                apply(value)
            messages[kind] = str(info.value)
        rule = f"{where} must be a float32 array (the layer's dtype); got 'float64"
        assert all(m.startswith(rule) for m in messages.values()), messages
        assert messages["list"].endswith("got 'float64 from list'.")
        assert messages["array-like"].endswith("got 'float64 from ArrayLike'.")


def test_a_layer_takes_every_kind_of_its_own_dtype_and_computes_the_same(backend_name):
    for dtype in (np.float32, np.float64):
        for where, apply, x in _layers(dtype, backend_name):
            values = x.astype(dtype)
            reference = apply(values)
            same = [apply(ArrayLike(values))]
            if dtype == np.float64:  # Python floats are float64 to NumPy
                same.append(apply(values.tolist()))
            for result in same:
                np.testing.assert_array_equal(result, reference, err_msg=where)


def test_integer_lists_are_refused_by_a_float64_layer():
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=2, output_size=1,
                                                                     dtype=np.float64))
    match = r"must be a float64 array \(the layer's dtype\); got 'int\d+ from list'"
    with pytest.raises(bf.DTypeError, match=match):
        head.apply([[1, 2]])

"""The NumPy < 2 stand-ins in ``bnnsfw._compat`` agree with NumPy's own functions."""

import math

import numpy as np
import pytest

from bnnsfw import _compat

SHAPES = [
    ((7,), (7,)),                 # one vector each: a scalar result
    ((5, 7), (7,)),               # rows against one vector (row sums with ones)
    ((5, 7), (5, 7)),             # row by row
    ((3, 4, 6), (3, 4, 6)),       # stacked rows
    ((3, 1, 6), (1, 4, 6)),       # leading axes broadcast
    ((4, 0), (4, 0)),             # empty rows sum to zero
]


def by_hand(a, b):
    """Each row's dot product in float64, one term at a time."""
    a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    result = np.empty(a.shape[:-1])
    for index in np.ndindex(*a.shape[:-1]):
        result[index] = math.fsum(x * y for x, y in zip(a[index], b[index]))
    return result


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("shape_a", "shape_b"), SHAPES)
def test_vecdot_stand_in_matches_a_hand_computation(shape_a, shape_b, dtype, rng):
    a = rng.standard_normal(shape_a).astype(dtype)
    b = rng.standard_normal(shape_b).astype(dtype)
    got = _compat._vecdot(a, b)
    expected = by_hand(a, b)
    assert np.shape(got) == expected.shape and np.result_type(got) == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vecdot_stand_in_writes_into_out(dtype, rng):
    a = rng.standard_normal((6, 9)).astype(dtype)
    ones = np.ones(9, dtype)
    buffer = np.full(10, -1.0, dtype)
    out = buffer[2:8]
    returned = _compat._vecdot(a, ones, out=out)
    assert returned is out
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, a.astype(np.float64).sum(axis=1), rtol=tol)
    assert (buffer[:2] == -1).all() and (buffer[8:] == -1).all()


def test_vecdot_stand_in_promotes_like_numpy():
    assert _compat._vecdot(np.ones(3, np.float32), np.ones(3, np.float64)).dtype == np.float64
    assert _compat._vecdot(np.ones((2, 3), np.float32), np.ones(3, np.float32)).dtype == np.float32


def test_vecdot_stand_in_refuses_what_numpy_refuses():
    with pytest.raises(ValueError, match="last axes"):
        _compat._vecdot(np.ones((2, 3)), np.ones(4))
    with pytest.raises(ValueError, match="shape"):
        _compat._vecdot(np.ones((2, 3)), np.ones(3), out=np.empty(3))
    with pytest.raises(ValueError):
        _compat._vecdot(np.float64(1.0), np.ones(3))


@pytest.mark.skipif(not hasattr(np, "vecdot"), reason="np.vecdot needs NumPy >= 2.0")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("shape_a", "shape_b"), SHAPES)
def test_vecdot_stand_in_matches_numpy_vecdot(shape_a, shape_b, dtype, rng):
    a = rng.standard_normal(shape_a).astype(dtype)
    b = rng.standard_normal(shape_b).astype(dtype)
    expected = np.vecdot(a, b)
    got = _compat._vecdot(a, b)
    assert type(got) is type(expected) and np.shape(got) == np.shape(expected)
    assert np.result_type(got) == np.result_type(expected)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def test_vecdot_is_numpys_own_when_there_is_one():
    if hasattr(np, "vecdot"):
        assert _compat.vecdot is np.vecdot
    else:
        assert _compat.vecdot is _compat._vecdot

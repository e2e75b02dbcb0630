"""The descriptor boundary of the C-style API: sizes fastest first, strides in elements."""

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import _descriptors as nd
from bnnsfw.bnns import BNNSNDArrayDescriptor as Desc


def test_contiguous_descriptor_reads_reversed_sizes():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    d = Desc.from_array(a)
    assert d.size[:3] == (4, 3, 2) and d.layout is bf.DataLayout.last_major_3d
    np.testing.assert_array_equal(nd.read("d", d, (2, 3, 4)), a)


def test_strided_descriptor_reads_and_writes_only_its_elements():
    buf = np.arange(40, dtype=np.float32)
    # a 3 x 4 row-major matrix whose rows are 10 elements apart and columns 2 apart
    d = Desc(layout="row_major_matrix", size=(4, 3), stride=(2, 10), data=buf)
    expected = np.array([[0, 2, 4, 6], [10, 12, 14, 16], [20, 22, 24, 26]], np.float32)
    np.testing.assert_array_equal(nd.read("d", d, (3, 4)), expected)
    before = buf.copy()
    nd.write("d", d, np.full((3, 4), -1, np.float32))
    touched = before != buf
    assert touched.sum() == 12 and np.all(buf[touched] == -1)
    nd.write("d", d, np.ones((3, 4), np.float32), accumulate=True)
    assert np.all(buf[touched] == 0) and np.array_equal(buf[~touched], before[~touched])


def test_column_major_matrix_is_transposed():
    buf = np.arange(6, dtype=np.float32)  # columns of a 2 x 3 matrix, stored one after another
    d = Desc(layout="column_major_matrix", size=(2, 3), data=buf)
    np.testing.assert_array_equal(nd.read("d", d, (2, 3)), [[0, 2, 4], [1, 3, 5]])


def test_zero_sizes_take_the_expected_shape():
    a = np.arange(6, dtype=np.float32)
    d = Desc(layout="row_major_matrix", data=a)
    np.testing.assert_array_equal(nd.read("d", d, (2, 3)), a.reshape(2, 3))


def test_same_elements_in_another_rank_are_reshaped():
    a = np.arange(24, dtype=np.float32)
    d = Desc(layout="last_major_4d", size=(4, 3, 2, 1), data=a)
    np.testing.assert_array_equal(nd.read("d", d, (2, 3, 4)), a.reshape(2, 3, 4))
    nd.write("d", d, np.zeros((2, 3, 4), np.float32))
    assert not a.any()


def test_batch_dimension_with_sample_stride():
    buf = np.arange(30, dtype=np.float32)
    d = Desc(layout="vector", size=(4,), data=buf)
    got = nd.read("in", d, (4,), batch=(3, 10))
    np.testing.assert_array_equal(got, [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]])


def test_buffers_other_than_arrays():
    raw = bytearray(np.arange(4, dtype=np.float32).tobytes())
    d = Desc(layout="vector", size=(4,), data=raw)
    np.testing.assert_array_equal(nd.read("d", d, (4,)), [0, 1, 2, 3])
    nd.write("d", d, np.full(4, 7, np.float32))
    assert np.frombuffer(raw, np.float32).tolist() == [7, 7, 7, 7]


@pytest.mark.parametrize(
    "desc, error, message",
    [
        (Desc(layout="vector", size=(5,), data=np.zeros(4, np.float32)), bf.ShapeError,
         "at least 5 elements"),
        (Desc(layout="vector", size=(4,), data=np.zeros(4, np.int8), data_type="int8"), bf.DTypeError,
         "d.data_type must be BNNSDataTypeFloat32; got BNNSDataTypeInt8"),
        (Desc(layout="vector", size=(4,), data=np.zeros(4, np.float64)), bf.DTypeError,
         "d.data must be an array of float32"),
        (Desc(layout="first_major_3d", size=(1, 1, 4), data=np.zeros(4, np.float32)),
         bf.InvalidParameterError,
         "d.layout must be one of the layouts the C-style API reads .*; got BNNSDataLayout3DFirstMajor"),
        (Desc(layout="vector", size=(3,), data=np.zeros(4, np.float32)), bf.ShapeError,
         r"d.size must be \(4,\), fastest first \(or the same 4 elements in another rank\); got \(3,\)"),
        (Desc(layout="row_major_matrix", size=(2, 2), stride=(0, 2), data=np.zeros(4, np.float32)),
         bf.InvalidParameterError,
         "all positive"),
        (Desc(layout="row_major_matrix", size=(4, 2), stride=(1, 2), data=np.zeros(8, np.float32)),
         bf.InvalidParameterError,
         r"d.stride must be a layout whose elements do not overlap"),
    ],
)
def test_bad_descriptors_are_named(desc, error, message):
    with pytest.raises(error, match=message):
        nd.read("d", desc, (4,))


def test_read_only_target_is_refused():
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    with pytest.raises(bf.InvalidParameterError, match="writable"):
        nd.write("d", Desc(layout="vector", size=(4,), data=a), np.ones(4, np.float32))


def test_too_many_sizes():
    with pytest.raises(bf.InvalidParameterError, match=r"d.size must be a sequence of at most 8 integers"):
        nd.read("d", Desc(size=tuple(range(9)), data=np.zeros(4, np.float32)), (4,))


@pytest.mark.parametrize("field, value, message", [
    ("size", "abc", r"d.size must be a sequence of at most 8 integers >= 0; got 'abc'"),
    ("size", (-4, 9), r"d.size\[0\] must be an integer >= 0; got -4"),
    ("stride", (1.5,), r"d.stride\[0\] must be an integer >= 0; got 1.5"),
    ("stride", (-1,), r"d.stride\[0\] must be an integer >= 0; got -1"),
    ("layout", "diagonal", r"d.layout must be one of the layouts .*; got 'diagonal'"),
    ("layout", 0, r"d.layout must be one of the layouts .*; got 0\."),
    ("data_type", 3.0, r"d.data_type must be BNNSDataTypeFloat32; got 3.0"),
    ("data_type", 0, r"d.data_type must be BNNSDataTypeFloat32; got 0\."),
])
def test_descriptor_fields_are_checked_where_read(field, value, message):
    """A descriptor holds what the caller wrote, as a C structure does (a zero-filled one can
    exist); the fields are checked where a call reads them, under the argument's name."""
    d = Desc(layout="vector", size=(4,), data=np.zeros(4, np.float32))
    setattr(d, field, value)
    with pytest.raises(bf.BNNSError, match=message):
        nd.read("d", d, (4,))
    assert nd.read("d", Desc(**{field: value}), (4,), required=False) is None  # no data: not read


def test_an_all_zero_descriptor_exists_and_is_absent():
    zero = Desc(flags=0, layout=0, size=(0,) * 8, stride=(0,) * 8, data=None, data_type=0)
    assert zero.layout == 0 and zero.data_type == 0
    assert nd.read("d", zero, (4,), required=False) is None
    assert not nd.write("d", zero, np.ones(4, np.float32))
    with pytest.raises(bf.InvalidParameterError, match=r"d.data must be set; got None"):
        nd.read("d", zero, (4,))


# Property: writing through any positive-stride descriptor then reading back gives the
# data, and touches exactly the described elements.
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), gaps=st.lists(st.integers(0, 3), min_size=4,
                                                                               max_size=4))
def test_strided_round_trip(shape, gaps):
    sizes = list(reversed(shape))
    strides, step = [], 1
    for size, gap in zip(sizes, gaps):
        step += gap
        strides.append(step)
        step *= size
    layout = {1: "vector", 2: "row_major_matrix", 3: "last_major_3d", 4: "last_major_4d"}[len(shape)]
    buf = np.full(step + 1, np.nan, np.float32)
    d = Desc(layout=layout, size=sizes, stride=strides, data=buf)
    value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    nd.write("d", d, value)
    np.testing.assert_array_equal(nd.read("d", d, tuple(shape)), value)
    assert np.count_nonzero(~np.isnan(buf)) == value.size

"""Reading and writing NumPy data through BNNS n-dimensional array descriptors.

A ``BNNSNDArrayDescriptor`` lists sizes and strides fastest dimension first, strides in
elements, 0 meaning "contiguous". The functions here turn a descriptor into a NumPy view of
its data (slowest dimension first) and back, so that the C-style API converts exactly once,
at its boundary.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Literal, NamedTuple, Sequence, Tuple, Union, overload

import numpy as np

from . import _bfloat16 as _bf16
from ._validation import dtype_text
from .enums import DataLayout, DataType, apple_name
from .errors import DTypeError, InvalidParameterError, ShapeError, must_be

MAX_RANK = 8
SIZE_MAX = 2**64 - 1  # the largest size_t
UINT32_MAX = 2**32 - 1

#: The fields of a ``BNNSNDArrayDescriptor``; any object that has them is taken for one.
FIELDS = ("flags", "layout", "size", "stride", "data", "data_type")


class Named(str):
    """A value's name in a message, shown as it is (``got 0.``, ``got BNNSDataLayoutSNE.``)."""

    def __repr__(self) -> str:
        return str(self)


def integer(where: str, value: object, *, minimum: int = 0, maximum: int = SIZE_MAX) -> int:
    """A C integer field or argument (``size_t`` unless ``maximum`` says otherwise): an ``int``
    (or NumPy integer, not a bool) in range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParameterError(must_be(where, f"an integer >= {minimum}", value))
    number = int(value)
    if number < minimum or number > maximum:
        rule = f"an integer >= {minimum}" if maximum == SIZE_MAX and number < minimum else \
            f"an integer in [{minimum}, {maximum}]"
        raise InvalidParameterError(must_be(where, rule, number))
    return number


def real(where: str, value: object) -> float:
    """A C ``float`` field, any value (a field the configuration does not read): a real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidParameterError(must_be(where, "a number", value))
    return float(value)


def finite(where: str, value: object) -> float:
    """A C ``float`` field that a call reads: a finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)):
        raise InvalidParameterError(must_be(where, "a finite number", value))
    return float(value)


def eight(where: str, values: object, rank: int = MAX_RANK) -> tuple[int, ...]:
    """The first ``rank`` entries of ``size[8]`` or ``stride[8]`` (``size_t``), the entries
    missing from a shorter sequence being 0; the entries past ``rank`` are not read."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidParameterError(must_be(where, "a sequence of at most 8 integers >= 0", values))
    items = tuple(values)
    if len(items) > MAX_RANK:
        raise InvalidParameterError(must_be(where, "a sequence of at most 8 integers >= 0", items))
    items += (0,) * (MAX_RANK - len(items))
    return tuple(integer(f"{where}[{i}]", v) for i, v in enumerate(items[:rank]))


def descriptor(where: str, desc: object) -> Any:
    """``desc`` when it is a ``BNNSNDArrayDescriptor`` (has its six fields), else refused."""
    if not all(hasattr(desc, field) for field in FIELDS):
        raise InvalidParameterError(must_be(where, "a BNNSNDArrayDescriptor", type(desc).__name__))
    return desc


def flags_of(where: str, desc: object) -> int:
    """The descriptor's ``flags`` (``BNNSNDArrayFlags``, a ``uint32_t``)."""
    return integer(f"{where}.flags", getattr(desc, "flags"), maximum=UINT32_MAX)


class Batch(NamedTuple):
    """A leading batch dimension: ``samples`` samples ``stride`` elements apart (0: dense)."""

    samples: int
    stride: int
    where: str = "batch stride"  # the stride argument's name, for messages


BatchArg = Union[Tuple[int, int], Batch, None]

# Layouts whose size[0] is the fastest dimension and whose stride[i] goes with size[i]:
# the NumPy view is the reversed sizes; the column-major matrix is that view transposed.
_LAST_MAJOR = {
    DataLayout.vector, DataLayout.last_major_1d, DataLayout.row_major_matrix,
    DataLayout.column_major_matrix, DataLayout.last_major_2d, DataLayout.image_chw,
    DataLayout.sne, DataLayout.nse, DataLayout.last_major_3d, DataLayout.last_major_4d,
}


_LAYOUT_NAMES = ", ".join(apple_name(DataLayout, m) for m in sorted(_LAST_MAJOR))


def layout_of(where: str, desc: object) -> DataLayout:
    """The descriptor's ``layout``, one of those the C-style API reads."""
    value = getattr(desc, "layout")
    layout = _member(DataLayout, value)
    if layout not in _LAST_MAJOR:
        raise InvalidParameterError(must_be(f"{where}.layout", f"one of the layouts the C-style API reads "
                                            f"({_LAYOUT_NAMES})", Named(apple_name(DataLayout, value))))
    return layout


def data_type_of(where: str, desc: object, data_types: Sequence[DataType]) -> DataType:
    """The descriptor's ``data_type``, one of ``data_types`` (the types taken where it is read)."""
    value = getattr(desc, "data_type")
    data_type = _member(DataType, value)
    if data_type not in data_types:
        names = " or ".join(apple_name(DataType, t) for t in data_types)
        raise DTypeError(must_be(f"{where}.data_type", names, Named(apple_name(DataType, value))))
    return data_type


def _member(kind: Any, value: object) -> Any:
    """The ``kind`` member that ``value`` is, or names, or numbers; ``None`` for any other value."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        try:
            return kind.parse(value)
        except InvalidParameterError:
            return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        try:
            return kind(int(value))
        except ValueError:
            return None
    return None


def bnns_sizes(layout: DataLayout, shape: Sequence[int]) -> tuple[int, ...]:
    """A NumPy shape as ``layout`` lists its sizes: fastest first (a column-major matrix lists
    its rows first, as its shape does)."""
    if layout is DataLayout.column_major_matrix and len(shape) == 2:
        return (int(shape[0]), int(shape[1]))
    return tuple(int(s) for s in reversed(shape))


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a dense array whose sizes are listed fastest first."""
    strides, step = [], 1
    for s in sizes:
        strides.append(step)
        step *= max(int(s), 1)
    return tuple(strides)


def storage(data_type: DataType) -> np.dtype:
    """The NumPy dtype of a data type's elements as they are read and written here: its own,
    or for BFloat16 the ``uint16`` bits (DataType has no uint16 of its own to be confused with)."""
    return _bf16.STORAGE if data_type is DataType.bfloat16 else data_type.numpy_dtype


def _flat(where: str, data: object, data_type: DataType) -> np.ndarray:
    """The descriptor's data as a flat 1-D array of its elements, sharing its memory.

    Only the caller's own elements are reachable through it: every layout is checked
    against its size before a view is made.
    """
    dtype = storage(data_type)
    bfloat16 = data_type is DataType.bfloat16
    if isinstance(data, np.ndarray):
        if bfloat16 and _bf16.is_bfloat16(data.dtype):
            data = data.view(dtype)  # ml_dtypes.bfloat16: read through its bits
        if data.dtype != dtype:
            rule = ("an array of ml_dtypes.bfloat16, or of uint16 holding the bits (the descriptor's "
                    "data_type is BNNSDataTypeBFloat16)" if bfloat16 else
                    f"an array of {dtype.name} (the descriptor's data_type)")
            raise DTypeError(must_be(f"{where}.data", rule, Named(dtype_text(data.dtype))))
        if not (data.flags.c_contiguous or data.flags.f_contiguous):
            raise InvalidParameterError(must_be(f"{where}.data",
                                                "a contiguous array (describe strides in the "
                                                "descriptor instead)", "a strided view"))
        return data.ravel(order="K")  # memory order: a view for contiguous data
    try:
        view = memoryview(data)  # type: ignore[arg-type]  # checked by memoryview()
    except TypeError:
        raise InvalidParameterError(must_be(f"{where}.data", "a NumPy array, a buffer or None",
                                            type(data).__name__)) from None
    try:
        raw = np.frombuffer(view.cast("B"), dtype=np.uint8) if view.nbytes else np.empty(0, np.uint8)
    except (TypeError, ValueError):
        raise InvalidParameterError(must_be(f"{where}.data", "a C-contiguous buffer",
                                            f"a non-contiguous {type(data).__name__}")) from None
    if raw.size % dtype.itemsize:
        name = "bfloat16" if bfloat16 else dtype.name
        raise InvalidParameterError(must_be(f"{where}.data", f"a whole number of {name} elements "
                                            f"({dtype.itemsize} bytes each)", f"{raw.size} bytes"))
    return raw.view(dtype)


def check_layout(where: str, sizes: Sequence[int], strides: Sequence[int]) -> None:
    """Refuse a layout in which two elements share memory.

    Dimensions of more than one element, taken by increasing stride, must nest: each stride
    at least the span of the dimensions inside it (``1 + Σ (size − 1) · stride``). That is
    what every dense or padded layout satisfies; layouts that interleave dimensions without
    aliasing are refused too (BNNS describes none).
    """
    span = 1
    for size, stride in sorted((pair for pair in zip(sizes, strides) if pair[0] > 1), key=lambda p: p[1]):
        if stride < span:
            raise InvalidParameterError(must_be(
                f"{where}.stride", f"a layout whose elements do not overlap (each stride at least the "
                f"span of the faster dimensions: {span} elements here, for sizes {tuple(sizes)})",
                tuple(strides)))
        span += (size - 1) * stride


def _strided(where: str, desc: object, expected_shape: Sequence[int] | None, *, writable: bool,
             data_types: Sequence[DataType], batch: BatchArg,
             ) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """The strided view of ``desc``'s data in its own sizes (batch first), and the sizes.

    Every size and stride is checked against the extent of the caller's buffer before the
    view is made: no layout reaches memory outside it, and none makes two elements alias.
    """
    descriptor(where, desc)
    data = getattr(desc, "data")
    if data is None:  # absent: nothing else of it is read
        return None
    layout = layout_of(where, desc)
    data_type = data_type_of(where, desc, data_types)
    dtype = storage(data_type)
    rank = layout.rank
    sizes = list(eight(f"{where}.size", getattr(desc, "size"), rank))
    if all(s == 0 for s in sizes):
        if expected_shape is None:
            raise ShapeError(must_be(f"{where}.size", "set (non-zero)", tuple(sizes)))
        if len(expected_shape) != rank:
            raise ShapeError(must_be(
                f"{where}.size", f"set: sizes of 0 take {bnns_sizes(layout, expected_shape)}, fastest first, "
                f"which {apple_name(DataLayout, layout)} (rank {rank}) cannot hold", tuple(sizes)))
        sizes = list(bnns_sizes(layout, expected_shape))
    strides = list(eight(f"{where}.stride", getattr(desc, "stride"), rank))
    if all(s == 0 for s in strides):
        strides = list(contiguous_strides(sizes))
    elif any(s <= 0 for s in strides):
        raise InvalidParameterError(must_be(f"{where}.stride", "all positive, or all 0 for contiguous",
                                            tuple(strides)))
    check_layout(where, sizes, strides)
    flat = _flat(where, data, data_type)
    if writable and not flat.flags.writeable:
        raise InvalidParameterError(must_be(f"{where}.data", "writable", "a read-only buffer"))
    shape, step = list(reversed(sizes)), list(reversed(strides))
    sample_span = 1 + sum((s - 1) * st for s, st in zip(sizes, strides)) if all(sizes) else 0
    samples = ""
    if batch is not None:  # a leading batch dimension: batch_size samples batch_stride apart
        batch = Batch(*batch)
        count, batch_stride = batch.samples, batch.stride
        if batch_stride == 0:
            batch_stride = sample_span
        elif batch_stride < 0 or (count > 1 and batch_stride < sample_span):
            raise InvalidParameterError(must_be(
                batch.where, f"0 (dense) or at least the {sample_span} elements one sample spans, "
                "so that samples do not overlap", batch_stride))
        shape, step = [count, *shape], [batch_stride, *step]
        samples = f" and {count} samples {batch_stride} apart"
    span = 1 + sum((s - 1) * st for s, st in zip(shape, step)) if all(shape) else 0
    if span > flat.size:
        raise ShapeError(must_be(f"{where}.data", f"at least {span} elements for sizes {tuple(sizes)}, "
                                 f"strides {tuple(strides)}{samples}", f"{flat.size} elements"))
    # A dimension of one element never moves: its stride (which may be any size_t) is not used.
    byte_steps = tuple(st * dtype.itemsize if extent > 1 else 0 for extent, st in zip(shape, step))
    arr = np.lib.stride_tricks.as_strided(flat, shape=tuple(shape), strides=byte_steps, writeable=writable)
    if layout is DataLayout.column_major_matrix:
        arr = arr.swapaxes(-1, -2)
    return arr, tuple(sizes)


@overload
def view(where: str, desc: object, expected_shape: Sequence[int] | None = None, *,
         writable: Literal[False] = False, data_types: Sequence[DataType] = ...,
         batch: BatchArg = None) -> np.ndarray | None: ...


@overload
def view(where: str, desc: object, expected_shape: Sequence[int] | None = None, *,
         writable: bool, data_types: Sequence[DataType] = ...,
         batch: BatchArg = None) -> np.ndarray | _ShapedWrite | None: ...


def view(where: str, desc: object, expected_shape: Sequence[int] | None = None, *,
         writable: bool = False, data_types: Sequence[DataType] = (DataType.float32,),
         batch: BatchArg = None) -> np.ndarray | _ShapedWrite | None:
    """NumPy view (slowest dimension first) of ``desc``'s data, or ``None`` when it has no data.

    Size fields that are all 0 take ``expected_shape``. The element count and, when given,
    the shape must match ``expected_shape`` (a view of another shape with the same element
    count in the same order is reshaped, as BNNS reads a dense buffer; a writable view of
    that kind comes back as a ``_ShapedWrite`` for :func:`write`).
    """
    found = _strided(where, desc, expected_shape, writable=writable, data_types=data_types, batch=batch)
    if found is None:
        return None
    arr, sizes = found
    lead = arr.shape[:1] if batch is not None else ()
    sample = arr.shape[len(lead):]
    if expected_shape is not None and tuple(sample) != tuple(expected_shape):
        if math.prod(sample) != math.prod(expected_shape):
            layout = _member(DataLayout, getattr(desc, "layout"))
            raise ShapeError(must_be(
                f"{where}.size", f"{bnns_sizes(layout, expected_shape)}, fastest first (or the same "
                f"{math.prod(expected_shape)} elements in another rank)", sizes))
        if writable:
            return _ShapedWrite(arr, (*lead, *expected_shape))
        arr = arr.reshape((*lead, *expected_shape))
    return arr


def region(where: str, desc: object, expected_shape: Sequence[int] | None, *,
           data_types: Sequence[DataType] = (DataType.float32,),
           batch: BatchArg = None) -> np.ndarray | None:
    """The caller's elements that ``desc`` (and ``batch``) covers, as a read-only view that
    shares their memory (for overlap checks), or ``None`` without data; checked as by :func:`view`."""
    if desc is None:
        return None
    found = _strided(where, desc, expected_shape, writable=False, data_types=data_types, batch=batch)
    return None if found is None else found[0]


class _ShapedWrite:
    """A writable target whose memory shape differs from its logical shape (same order)."""

    def __init__(self, target: np.ndarray, shape: tuple[int, ...]) -> None:
        self.target, self.shape = target, shape


@overload
def read(where: str, desc: object, expected_shape: Sequence[int] | None, *, required: Literal[True] = True,
         data_types: Sequence[DataType] = ..., batch: BatchArg = None) -> np.ndarray: ...


@overload
def read(where: str, desc: object, expected_shape: Sequence[int] | None, *, required: bool,
         data_types: Sequence[DataType] = ..., batch: BatchArg = None) -> np.ndarray | None: ...


def read(where: str, desc: object, expected_shape: Sequence[int] | None, *, required: bool = True,
         data_types: Sequence[DataType] = (DataType.float32,),
         batch: BatchArg = None) -> np.ndarray | None:
    """A C-contiguous copy of ``desc``'s data in ``expected_shape`` (``None`` if no data)."""
    if desc is None:
        if required:
            raise InvalidParameterError(must_be(where, "a BNNSNDArrayDescriptor", None))
        return None
    arr = view(where, desc, expected_shape, data_types=data_types, batch=batch)
    if arr is None:
        if required:
            raise InvalidParameterError(must_be(f"{where}.data", "set", None))
        return None
    if arr.dtype == _bf16.STORAGE:  # BFloat16 bits: their float32 values (exact)
        return np.ascontiguousarray(_bf16.to_float32(arr))
    return np.array(arr, copy=True, order="C")


def write(where: str, desc: object, value: np.ndarray, *, accumulate: bool = False,
          data_types: Sequence[DataType] = (DataType.float32,), batch: BatchArg = None) -> bool:
    """Store ``value`` into ``desc``'s data (add to it with ``accumulate``); False if no data.

    Into BFloat16 data, ``value`` (float32) is rounded once: accumulating reads the data,
    adds in float32 and rounds the sum.
    """
    if desc is None:
        return False
    shape = value.shape[1:] if batch is not None else value.shape
    target = view(where, desc, shape, writable=True, data_types=data_types, batch=batch)
    if target is None:
        return False
    if isinstance(target, _ShapedWrite):
        dest, src = target.target, value.reshape(target.target.shape)
    else:
        dest, src = target, value
    if dest.dtype == _bf16.STORAGE:
        total = _bf16.to_float32(dest) + src.astype(np.float32, copy=False) if accumulate else src
        dest[...] = _bf16.from_float32(total)
    elif accumulate:
        dest += src
    else:
        dest[...] = src
    return True

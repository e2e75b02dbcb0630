"""How the compiled LSTM kernels take their operands: states feature-major, peepholes as
rows, step weights in padded rows that start on cache lines, and the outputs and output
gradients behind one layout whatever their strides, so that each kernel compiles once for
them (:func:`_any_layout`)."""

from __future__ import annotations

import functools

import numpy as np

from .._shared.lstm_kernels import repeated
from ._stream import LINE_BYTES

__all__ = ["ROW_PAD", "wide_rows"]


_EMPTY: dict[np.dtype, np.ndarray] = {np.dtype(t): np.empty((0, 0), t) for t in (np.float32, np.float64)}
_NO_LENGTHS = np.empty(0, np.int64)


def _feature_major(state: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """An (N, H) state as a contiguous (H, N) array; an empty one for "zeros"."""
    if state is None:
        return _EMPTY[dtype]
    return np.ascontiguousarray(state.T)


def _diagonal(peepholes: tuple[np.ndarray | None, ...], h: int, dtype: np.dtype) -> np.ndarray:
    """The internal-order diagonal peepholes as one (4, H) array, zero rows where a gate has
    none (all zeros without peepholes: :func:`_no_peepholes`, made once per shape)."""
    if all(p is None for p in peepholes):
        return _no_peepholes(h, 1, dtype)
    return np.stack([np.zeros(h, dtype) if p is None else p.reshape(h) for p in peepholes])


@functools.lru_cache(maxsize=32)
def _no_peepholes(h: int, batch: int, dtype: np.dtype) -> np.ndarray:
    """Zeros (4, H·N): :func:`_repeated` (and with N = 1 :func:`_diagonal`) for a cell without
    diagonal peepholes, made once per shape (the kernels only read it)."""
    return np.zeros((4, h * batch), dtype)


def _repeated(peepholes: tuple[np.ndarray | None, ...], h: int, batch: int, dtype: np.dtype) -> np.ndarray:
    """The diagonal peepholes of :func:`_diagonal` repeated over the ``batch`` sequences:
    (4, H·N), element ``j·N + n`` of a row for unit ``j``."""
    if all(p is None for p in peepholes):
        return _no_peepholes(h, batch, dtype)
    return np.repeat(_diagonal(peepholes, h, dtype), batch, axis=1)


#: Elements added to each row of the step weights (:func:`wide_rows`): 64 bytes of float32.
ROW_PAD = 16


def wide_rows(a: np.ndarray) -> np.ndarray:
    """``a`` (R, C) as the first C columns of a contiguous (R, C + :data:`ROW_PAD`) array, the
    rest zeros: how the kernels take the step weights ``U`` and ``Uᵀ``.

    The step products (:func:`~._tiles.product`) read six or twelve rows of the weights
    side by side. Rows whose length in bytes is a multiple of 4 KiB (``Uᵀ``'s 4H = 1 024
    float32 at H = 256, ``U``'s from H = 1 024) all start at the same offset in a page, so
    their elements fall in one set of the level-1 cache, which holds 8 lines a set, and evict
    each other: backward's ``Uᵀ dz`` on half the long row's units, 128 × 1 024 × 8, took 43.7 µs
    with rows 4 KiB apart and 21.6 µs with rows 64 bytes further apart (L's, 128 × 1 024 × 32,
    77.9 against 75.3; one thread, alternated in one process). A wider array, not a view of
    one, keeps the kernels' argument contiguous: one compiled kernel for every shape.

    The array starts on a cache line (NumPy aligns its arrays to 16 bytes only). When a step's
    product for fewer sequences than a vector holds was a BLAS call, the call's speed depended
    on it: S's forward kernel (one sequence, H = 64, 100 steps) took 174–191 µs with ``U`` on a
    line and 211–258 µs at each of the three other 16-byte offsets (one thread, the same
    arguments but ``U``, two runs), so the same layer ran at either speed from one process to
    the next. Such products take no BLAS call now (:func:`~._lstm_forward._recur_one`,
    :func:`~._lstm_backward._backprop`)."""
    rows, columns = a.shape
    wide = _on_a_line(lambda size: np.zeros(size, a.dtype), rows, columns + ROW_PAD, a.dtype)
    wide[:, :columns] = a
    return wide


def _on_a_line(allocate, rows: int, width: int, dtype: np.dtype) -> np.ndarray:
    """A contiguous (rows, width) view that starts on a cache line, inside the 1-D buffer
    ``allocate(size)`` returns (``size`` elements of ``dtype``: the view's and a line more)."""
    itemsize = np.dtype(dtype).itemsize
    buffer = allocate(rows * width + LINE_BYTES // itemsize)
    start = (-buffer.ctypes.data % LINE_BYTES) // itemsize
    return buffer[start:start + rows * width].reshape(rows, width)


def _aligned(scratch, name: str, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """A scratch matrix whose rows start on cache lines, :data:`ROW_PAD` elements further apart
    than its width (a view into a larger buffer). The steps write a run of each row of the
    chunk's gate gradients: whole lines stored past the caches (:func:`~._lstm_cell._store_columns`), or,
    with rows of a multiple of 4 KiB (1 024 float32 columns), lines of one level-1 cache set
    that evict each other, as :func:`wide_rows` describes; the padding spreads them."""
    rows, columns = shape
    padded = _on_a_line(lambda size: scratch.array(name, (size,), dtype), rows, columns + ROW_PAD, dtype)
    return padded[:, :columns]


def _any_layout(a: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``a`` (or one element of it repeated to ``shape``) behind a leading axis of length 2 and
    stride 0; the kernels take element 0. Numba compiles a kernel once per layout of each array
    argument, and such a view is never contiguous: a contiguous output, a bidirectional
    layer's strided half of one, a column-major one and an absent gradient (zeros) all reach
    one compiled kernel instead of one each (every extra layout compiled the forward or the
    backward family again, 10 to 25 s from cold). A contiguous ``a`` (the common output) by
    :func:`repeated`, which is quicker."""
    if shape is not None:
        return np.lib.stride_tricks.as_strided(a, shape=(2, *shape), strides=(0,) * (len(shape) + 1))
    if a.flags.c_contiguous:
        return repeated(a, 2)
    return np.lib.stride_tricks.as_strided(a, shape=(2, *a.shape), strides=(0, *a.strides))

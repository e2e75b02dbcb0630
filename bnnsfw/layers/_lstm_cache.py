"""The byte layout of an LSTM training cache (``BNNSComputeLSTMTrainingCacheCapacity``).

A cache is one flat byte buffer: a 64-byte header, then the arrays a training forward
leaves for backward, packed back to back in the layer's dtype (every offset a multiple of
the item size, so views are aligned whenever the buffer is):

====================  ======================  =============================================
array                 shape                   for
====================  ======================  =============================================
``inputs[l]``         (T, N, D·H), l ≥ 1      the input layer l saw (after dropout)
``masks[l]``          (T, N, D·H), l ≥ 1      dropout scale (0 or 1/(1−p)); only if p > 0
``steps[l][d]``       (T, 6H, N)              per step: the cell before the step, the
                                              activated gates g, f, i, o (internal order)
                                              and the hidden activation of the new cell
``pre[l][d]``         (T, 4H, N)              gate pre-activations (internal order); only
                                              when a gate activation's derivative needs
                                              its input
``hidden[l][d]``      (T, H, N)               hidden state before the step at each time
====================  ======================  =============================================

Per-step arrays are feature-major (one column per sequence), the layout the step kernels
read and write (``bnnsfw/backends/_lstm_kernels.py`` documents the rows of a step block).
Layer by layer (inputs, masks, then each direction's three arrays). Every array is a
multiple of T·N elements, so the capacity is ``64 + itemsize · T · N · k`` with ``k`` fixed
by the configuration: exactly affine in T·N.

Header (little-endian): magic ``b"BNNSLSTM"``, version (u32), header size (u32), a 64-bit
fingerprint of the configuration (u64), payload bytes (u64), T (u32), N (u32), flags (u32:
1 masks, 2 pre-activations), item size (u32), zeros to 64 bytes. The forward clears the
magic first and writes the header last, so an interrupted forward leaves no valid cache.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import numpy as np

from ..errors import InvalidParameterError, must_be

__all__ = ["CacheLayout", "CacheViews", "HEADER_BYTES", "as_byte_buffer", "write_header", "read_header"]

HEADER_BYTES = 64
MAGIC = b"BNNSLSTM"
VERSION = 2  # 2: step blocks (T, 6H, N) in the internal gate order, states feature-major
_HEADER = struct.Struct("<8sIIQQIIII")
FLAG_MASKS = 1
FLAG_PRE = 2


class CacheViews(NamedTuple):
    """Views into a cache buffer; per-layer lists, per-(layer, direction) nested lists."""

    inputs: list[np.ndarray | None]
    masks: list[np.ndarray | None]
    steps: list[list[np.ndarray]]
    pre: list[list[np.ndarray | None]]
    hidden: list[list[np.ndarray | None]]


class CacheLayout:
    """Offsets of every cached array for one configuration, sequence length and batch size."""

    def __init__(self, *, seq_len: int, batch_size: int, hidden_size: int, num_layers: int,
                 num_directions: int, dtype: np.dtype, store_pre: bool, store_masks: bool,
                 reuse_steps: bool = False) -> None:
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_directions = num_directions
        self.dtype = np.dtype(dtype)
        self.store_pre = store_pre
        self.store_masks = store_masks
        self.reuse_steps = reuse_steps
        self.fingerprint: int | None = None  # the layer's digest for full-length sequences, once computed
        h, dirs = hidden_size, num_directions
        per_step = 0  # elements per (time step, batch row)
        per_batch = 0  # elements per batch row, for arrays that one step's buffer serves
        for layer in range(num_layers):
            if layer > 0:
                per_step += dirs * h * (2 if store_masks else 1)
            per_step += dirs * 4 * h * (1 if store_pre else 0)  # pre
            if reuse_steps:  # inference: one step block, no states kept
                per_batch += dirs * 6 * h
            else:
                per_step += dirs * 7 * h  # the step blocks and the hidden states
        self.payload_bytes = self.dtype.itemsize * batch_size * (seq_len * per_step + per_batch)
        self.nbytes = HEADER_BYTES + self.payload_bytes

    @property
    def flags(self) -> int:
        return (FLAG_MASKS if self.store_masks else 0) | (FLAG_PRE if self.store_pre else 0)

    def bind(self, buffer: np.ndarray) -> CacheViews:
        """Views of the arrays inside ``buffer`` (a 1-D uint8 array of at least ``nbytes``).

        With ``reuse_steps`` (the inference scratch space, never a training cache) every
        step shares one step block, a view with a zero stride along T, so the step loop stays
        the same and its working set stays in cache, and no hidden states are kept.
        """
        data = buffer[HEADER_BYTES:self.nbytes].view(self.dtype)
        t, n, h, dirs = self.seq_len, self.batch_size, self.hidden_size, self.num_directions
        position = 0

        def take(*shape: int) -> np.ndarray:
            nonlocal position
            size = math.prod(shape)
            view = data[position:position + size].reshape(shape)
            position += size
            return view

        def per_step(*shape: int) -> np.ndarray:
            if not self.reuse_steps:
                return take(t, *shape)
            one = take(*shape)
            return np.lib.stride_tricks.as_strided(one, (t, *shape), (0, *one.strides), writeable=True)

        views = CacheViews([], [], [], [], [])
        for layer in range(self.num_layers):
            views.inputs.append(take(t, n, dirs * h) if layer > 0 else None)
            views.masks.append(take(t, n, dirs * h) if layer > 0 and self.store_masks else None)
            views.steps.append([])
            views.pre.append([])
            views.hidden.append([])
            for _ in range(dirs):
                views.steps[layer].append(per_step(6 * h, n))
                views.pre[layer].append(take(t, 4 * h, n) if self.store_pre else None)
                views.hidden[layer].append(None if self.reuse_steps else take(t, h, n))
        assert position == data.size
        return views


def as_byte_buffer(where: str, value: object, *, writable: bool) -> np.ndarray:
    """A caller's cache object as a flat uint8 array sharing its memory.

    Accepts a C-contiguous ``numpy.uint8`` array, or any object exposing a (C-contiguous)
    buffer: ``bytearray``, ``memoryview``, ``mmap``, ``array.array``; ``bytes`` only for
    reading.
    """
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8:
            raise InvalidParameterError(must_be(where, "a numpy.uint8 array or a writable buffer",
                                                f"a {value.dtype.name} array"))
        if not value.flags.c_contiguous:
            raise InvalidParameterError(must_be(where, "C-contiguous", "a non-contiguous array"))
        if writable and not value.flags.writeable:
            raise InvalidParameterError(must_be(where, "writable", "a read-only array"))
        return value.reshape(-1)
    try:
        view = memoryview(value)  # type: ignore[arg-type]  # checked by memoryview()
    except TypeError:
        raise InvalidParameterError(
            must_be(where, "a numpy.uint8 array, a bytearray or another writable buffer",
                    type(value).__name__)
        ) from None
    if not view.c_contiguous:
        raise InvalidParameterError(must_be(where, "a C-contiguous buffer", "a non-contiguous buffer"))
    if writable and view.readonly:
        raise InvalidParameterError(must_be(where, "writable", f"a read-only {type(value).__name__}"))
    return np.frombuffer(view.cast("B"), dtype=np.uint8)


def write_header(buffer: np.ndarray, layout: CacheLayout, fingerprint: int) -> None:
    """Stamp a finished cache."""
    header = _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, fingerprint, layout.payload_bytes,
                          layout.seq_len, layout.batch_size, layout.flags, layout.dtype.itemsize)
    buffer[:HEADER_BYTES] = 0
    buffer[:len(header)] = np.frombuffer(header, dtype=np.uint8)


def clear_header(buffer: np.ndarray) -> None:
    """Invalidate a cache before it is rewritten."""
    buffer[:HEADER_BYTES] = 0


class CacheHeader(NamedTuple):
    fingerprint: int
    payload_bytes: int
    seq_len: int
    batch_size: int
    flags: int
    itemsize: int


_WRITTEN_BY = "a training cache written by LSTMLayer.apply(training=True)"


def read_header(where: str, buffer: np.ndarray) -> CacheHeader:
    """The header of a cache, or an error naming ``where`` when it holds none."""
    if buffer.size < HEADER_BYTES:
        raise InvalidParameterError(must_be(where, _WRITTEN_BY, f"{buffer.size} bytes"))
    magic, version, header_bytes, fingerprint, payload, seq_len, batch, flags, itemsize = _HEADER.unpack(
        buffer[:_HEADER.size].tobytes())
    if magic != MAGIC or header_bytes != HEADER_BYTES:
        raise InvalidParameterError(must_be(where, _WRITTEN_BY, "a buffer without an LSTM cache header"))
    if version != VERSION:
        raise InvalidParameterError(
            must_be(where, f"a cache of format version {VERSION}", f"version {version}"))
    return CacheHeader(fingerprint, payload, seq_len, batch, flags, itemsize)

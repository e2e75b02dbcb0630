"""The frame of an LSTM training cache (``BNNSComputeLSTMTrainingCacheCapacity``).

A cache is one flat byte buffer: a 64-byte header that the layer writes, then the payload,
whose layout belongs to the backend (``lstm_cache_layout`` in the backend contract gives its
size and the name of its format; the built-in backends' layout is described in
``docs/lstm.md``). The capacity is ``64 + payload bytes``, affine in ``T·N``.

Header (little-endian): magic ``b"BNNSLSTM"``, version (u32), header size (u32), a 64-bit
fingerprint of the configuration, the payload format, T, N and the lengths (u64), payload
bytes (u64), T (u32), N (u32), reserved (u32), item size (u32), zeros to 64 bytes. The
forward clears the magic first and writes the header last, so an interrupted forward leaves
no valid cache.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from ..errors import InvalidParameterError, must_be

__all__ = ["HEADER_BYTES", "as_byte_buffer", "write_header", "clear_header", "read_header"]

HEADER_BYTES = 64
MAGIC = b"BNNSLSTM"
VERSION = 3  # 3: the payload layout is the backend's, named in the fingerprint
_HEADER = struct.Struct("<8sIIQQIIII")


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


def write_header(buffer: np.ndarray, *, fingerprint: int, payload_bytes: int, seq_len: int, batch_size: int,
                 itemsize: int) -> None:
    """Stamp a finished cache."""
    header = _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, fingerprint, payload_bytes, seq_len, batch_size, 0,
                          itemsize)
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
    itemsize: int


_WRITTEN_BY = "a training cache written by LSTMLayer.apply(training=True)"


def read_header(where: str, buffer: np.ndarray) -> CacheHeader:
    """The header of a cache, or an error naming ``where`` when it holds none."""
    if buffer.size < HEADER_BYTES:
        raise InvalidParameterError(must_be(where, _WRITTEN_BY, f"{buffer.size} bytes"))
    magic, version, header_bytes, fingerprint, payload, seq_len, batch, _, itemsize = _HEADER.unpack(
        buffer[:_HEADER.size].tobytes())
    if magic != MAGIC or header_bytes != HEADER_BYTES:
        raise InvalidParameterError(must_be(where, _WRITTEN_BY, "a buffer without an LSTM cache header"))
    if version != VERSION:
        raise InvalidParameterError(
            must_be(where, f"a cache of format version {VERSION}", f"version {version}"))
    return CacheHeader(fingerprint, payload, seq_len, batch, itemsize)

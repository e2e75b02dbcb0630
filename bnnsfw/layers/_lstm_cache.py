"""The frame of an LSTM training cache (``BNNSComputeLSTMTrainingCacheCapacity``).

A cache is one flat byte buffer: a 64-byte header that the layer writes, then the payload,
whose layout belongs to the backend (``lstm_cache_layout`` in the backend contract gives its
size and the name of its format; the built-in backends' layout is described in
``docs/lstm.md``). The capacity is ``64 + payload bytes``, affine in ``T·N``.

Header (little-endian): magic ``b"BNNSLSTM"``, version (u16), header size (u16), item size
(u16), reserved (u16), a 64-bit fingerprint of the configuration, the payload format, T, N
and the lengths (u64), payload bytes (u64), T (u32), N (u32), and the cache's identity: a
digest of the producing layer's weights (u64), that layer's weights version (u32), the
forward's generation (u32), a digest of ``x`` (u32) and one of the initial states (u32). The forward
clears the magic first and writes the header last, so an interrupted forward leaves no valid
cache.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import zlib
from typing import NamedTuple

import numpy as np

from ..errors import InvalidParameterError, must_be

__all__ = ["HEADER_BYTES", "CacheIdentity", "as_byte_buffer", "write_header", "clear_header", "read_header",
           "digest", "next_generation"]

HEADER_BYTES = 64
MAGIC = b"BNNSLSTM"
VERSION = 4  # 4: the cache carries its identity (layer, weights version, generation, input digests)
_HEADER = struct.Struct("<8sHHHHQQIIQIIII")
_generations = itertools.count(1)


def next_generation() -> int:
    """A number for one training forward, different from the last 2³² − 1 (thread-safe)."""
    return next(_generations) & 0xFFFFFFFF


_SAMPLE = 4096


def digest(*arrays: np.ndarray, size: int = 4) -> int:
    """A cheap digest (4 or 8 bytes) of arrays: their shapes and dtypes, and either all their
    bytes (up to 4096 elements) or the XOR of all their elements' bits (any single element that
    differs changes it) with an evenly spaced sample of 4096 elements (which also catches most
    reorderings). Each array is read once, at memory speed; 4 bytes are a CRC-32, 8 a BLAKE2b."""
    hasher = None if size == 4 else hashlib.blake2b(digest_size=size)
    crc = 0
    for array in arrays:
        flat = (array if array.flags.c_contiguous else np.ascontiguousarray(array)).reshape(-1)
        parts: tuple[object, ...] = (f"{array.shape}{array.dtype.str}".encode(), flat)
        if flat.size > _SAMPLE:
            parts = (parts[0], np.bitwise_xor.reduce(flat.view(f"u{flat.itemsize}")).tobytes(),
                     np.ascontiguousarray(flat[::flat.size // _SAMPLE]))
        for part in parts:
            if hasher is None:
                crc = zlib.crc32(part, crc)  # type: ignore[arg-type]  # bytes or a C-contiguous array
            else:
                hasher.update(part)  # type: ignore[arg-type]  # bytes or a C-contiguous array
    return crc if hasher is None else int.from_bytes(hasher.digest(), "little")


class CacheIdentity(NamedTuple):
    """Who wrote a cache, from what: checked by the backward before it trusts the cache."""

    weights: int  # digest(...) of the producing layer's weights: the layer, as far as the cache goes
    weights_version: int  # that layer's packed-weights version (for messages)
    generation: int  # this forward's number (a forward running over the cache changes it)
    x_digest: int  # digest(x) of the prepared (T, N, I) input
    state_digest: int  # digest(h0, c0), zeros standing for missing states


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
                 itemsize: int, identity: CacheIdentity) -> None:
    """Stamp a finished cache."""
    header = _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, itemsize, 0, fingerprint, payload_bytes, seq_len,
                          batch_size, *identity)
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
    identity: CacheIdentity


_WRITTEN_BY = "a training cache written by LSTMLayer.apply(training=True)"


def read_header(where: str, buffer: np.ndarray) -> CacheHeader:
    """The header of a cache, or an error naming ``where`` when it holds none."""
    if buffer.size < HEADER_BYTES:
        raise InvalidParameterError(must_be(where, _WRITTEN_BY, f"{buffer.size} bytes"))
    fields = _HEADER.unpack(buffer[:_HEADER.size].tobytes())
    magic, version, header_bytes, itemsize, _, fingerprint, payload, seq_len, batch = fields[:9]
    identity = fields[9:]
    if magic != MAGIC:
        raise InvalidParameterError(must_be(where, _WRITTEN_BY, "a buffer without an LSTM cache header"))
    if version != VERSION or header_bytes != HEADER_BYTES:
        raise InvalidParameterError(
            must_be(where, f"a cache of format version {VERSION}", f"version {version & 0xFFFF}"))
    return CacheHeader(fingerprint, payload, seq_len, batch, itemsize, CacheIdentity(*identity))

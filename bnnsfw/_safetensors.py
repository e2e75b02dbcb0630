"""The safetensors form of a weights file (what :func:`bnnsfw.save_weights` writes by default).

A safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw bytes: no code runs when it is read, and
other tools (``safetensors.numpy.load_file``, PyTorch, Rust) read the arrays directly.
bnnsfw keeps its layer metadata — the same JSON that the ``.npz`` form keeps in its
``__meta__`` entry — in the header's ``__metadata__`` under the key ``bnnsfw``, and names the
tensors ``<layer>/<key>`` as in the ``.npz`` form. This module only lays out the arrays and
that JSON text; what the text says, and reading it, is :mod:`bnnsfw.serialization`'s.
"""

from __future__ import annotations

import os
from typing import Iterator, Mapping

import numpy as np

from .errors import InvalidParameterError, must_be

__all__ = ["is_safetensors", "write", "read", "Arrays"]

_METADATA_KEY = "bnnsfw"
_HEADER_LIMIT = 100_000_000  # the safetensors package refuses larger headers too


def is_safetensors(path: str | os.PathLike[str]) -> bool:
    """True when the file starts like a safetensors file (a header length, then ``{``)."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    length = int.from_bytes(head[:8], "little")
    return 2 <= length <= _HEADER_LIMIT and head[8:9] == b"{"


def write(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray], metadata: str) -> None:
    """Write ``arrays`` and the layer metadata (JSON text) to ``path``."""
    from safetensors.numpy import save_file

    tensors = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    save_file(tensors, os.fspath(path), metadata={_METADATA_KEY: metadata})


class Arrays(Mapping[str, np.ndarray]):
    """The arrays of a safetensors file by name, with ``files`` as ``numpy.load`` gives."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self._arrays = arrays

    @property
    def files(self) -> list[str]:
        return list(self._arrays)

    def __getitem__(self, key: str) -> np.ndarray:
        return self._arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


def read(path: str | os.PathLike[str]) -> tuple[Arrays, str]:
    """The arrays and the layer metadata (the JSON text, unread) of a file :func:`write` wrote.

    A safetensors file from another tool (without bnnsfw's metadata) is refused, naming
    what is missing.
    """
    from safetensors import SafetensorError, safe_open

    where = f"load_weights({os.fspath(path)!r})"
    try:
        with safe_open(os.fspath(path), framework="np") as f:
            metadata = f.metadata() or {}
            arrays = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise InvalidParameterError(must_be(where, "a readable safetensors file", str(error))) from None
    if _METADATA_KEY not in metadata:
        rule = "a file written by save_weights (bnnsfw metadata in the safetensors header)"
        raise InvalidParameterError(must_be(where, rule, f"header metadata keys {sorted(metadata)}"))
    return Arrays(arrays), metadata[_METADATA_KEY]

"""The compiled kernels' disk cache, kept fresh against the source of every kernel module.

Numba stamps each cached kernel with the source of its own module only. A kernel that calls
compiled code from another module carries that code in its cache entry (each LSTM kernel calls
the step product of ``_tiles.py``; the normalization kernels call the streaming stores of
``_stream.py``), and Numba goes on loading the entry after the other module has changed: in a
checkout updated in place, a new step product left the LSTM kernels running the old one, with
no sign of it but their speed. :func:`install` puts a locator first in Numba's list which, for
the modules of the numba package (:data:`KERNEL_MODULES`) alone, keeps the cache folder Numba
would have chosen (``NUMBA_CACHE_DIR``, else beside the module, else the user's cache folder)
and adds a digest of all the kernel modules' sources, and of the modules whose values they
freeze (:data:`FROZEN_MODULES`), to the stamp: a change to any of them recompiles every kernel.
Numba's own list of locators (``NUMBA_CACHE_LOCATOR_CLASSES``), when set, replaces it.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

from numba.core import caching

__all__ = ["KERNEL_MODULES", "FROZEN_MODULES", "install", "sources_digest"]

#: Every module of the numba backend's package, named one by one: their sources make up every
#: kernel's stamp. A module added to the package goes here too (a test compares this list with
#: the package's files), or a change to it would leave kernels that inline its code stale.
KERNEL_MODULES = tuple(Path(__file__).resolve().parent / name for name in (
    "__init__.py",
    "_cache.py",
    "_cells.py",
    "_lstm.py",
    "_normalization.py",
    "_progress.py",
    "_stream.py",
    "_tiers.py",
    "_tiles.py",
    "_worker.py",
))


#: Modules outside the package whose values the kernels freeze when they compile: the cells'
#: kernels take each activation's BNNS number (``enums.ActivationFunction``) as a constant.
FROZEN_MODULES = (Path(__file__).resolve().parents[2] / "enums.py",)


def sources_digest(paths: tuple[Path, ...] = KERNEL_MODULES + FROZEN_MODULES) -> str:
    """SHA-256 over the names and contents of ``paths``, in order."""
    digest = hashlib.sha256()
    for path in paths:
        source = path.read_bytes()
        digest.update(path.name.encode())
        digest.update(len(source).to_bytes(8, "little"))
        digest.update(source)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _kernels_digest() -> str:
    """:func:`sources_digest` of the kernel modules and the modules whose values they freeze,
    read once per process."""
    return sources_digest()


class KernelSourcesLocator(caching._CacheLocator):
    """The locator Numba would choose for a kernel module's function, with
    :func:`sources_digest` in the stamp."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def ensure_cache_path(self) -> None:
        self._inner.ensure_cache_path()

    def get_cache_path(self) -> str:
        return str(self._inner.get_cache_path())

    def get_source_stamp(self) -> Any:
        return self._inner.get_source_stamp(), _kernels_digest()

    def get_disambiguator(self) -> str:
        return str(self._inner.get_disambiguator())

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> KernelSourcesLocator | None:
        if not os.path.exists(py_file) or Path(py_file).resolve() not in KERNEL_MODULES:
            return None
        others: list[Any] = caching.CacheImpl._locator_classes
        for other in others:
            if other is not cls:
                inner = other.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner)
        return None


def install() -> None:
    """Put :class:`KernelSourcesLocator` first in Numba's locators (once); call it before the
    kernels are defined, since Numba picks a function's locator when it is decorated."""
    locators: list[Any] = caching.CacheImpl._locator_classes
    if KernelSourcesLocator not in locators:
        locators.insert(0, KernelSourcesLocator)

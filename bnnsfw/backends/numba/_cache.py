"""The compiled kernels' disk cache, each module's kernels stamped with the sources they carry.

Numba stamps each cached kernel with the source of its own module only. A kernel that calls
compiled code from another module carries that code in its cache entry (the LSTM's forward and
backward kernels call the step product of ``_tiles.py``; the normalization kernels call the
streaming stores of ``_stream.py``), and the values of the globals its compiled code reads are
frozen into it (the cells' kernels take each activation's BNNS number from
``enums.ActivationFunction``). Numba goes on loading such an entry after the other module has
changed: in a checkout updated in place, a new step product left the LSTM kernels running the
old one, with no sign of it but their speed.

:func:`install` puts a locator first in Numba's list which, for the modules of the numba
package, keeps the cache folder Numba would have chosen (``NUMBA_CACHE_DIR``, else beside the
module, else the user's cache folder) and adds to the stamp of each module's kernels a digest
of exactly the sources they can carry (:func:`stamped_modules`):

- the module itself and the package's modules it imports, theirs in turn, found from the
  import statements; all but this one, which decides the stamps and reaches no kernel;
- the modules outside the package whose values compiled code in any of those freezes
  (:data:`FROZEN`). The kernel modules' other imports from outside the package (the LSTM's
  plan and weights, thread limits, ``Activation``) serve their Python code only.

So an edit recompiles the kernels that carry the edited code or values and no others:
``_tiles.py`` those of the LSTM's forward and backward and of normalization;
``_progress.py`` the LSTM's forward and backward; ``_lstm_backward.py`` its own;
``enums.py`` the cells'; the package's ``__init__.py``, ``_lstm.py`` (the LSTM's entry points),
``_tiers.py`` and ``_worker.py``, which define no kernels and which no kernel module imports,
none. Numba's own list of locators (``NUMBA_CACHE_LOCATOR_CLASSES``),
when set, replaces this one.

:func:`lock_saves` makes every save of a kernel to the cache hold a lock of its folder
(:class:`_LockedIndex`), so that processes compiling at once keep each other's entries.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import itertools
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from numba.core import caching

try:
    import fcntl
except ImportError:  # Windows: no file locks (two processes compiling at once may both run)
    fcntl = None  # type: ignore[assignment]

__all__ = ["FROZEN", "PACKAGE", "imported_modules", "install", "lock_saves", "locked", "module_digest",
           "package_digest", "sources_digest", "stamped_modules"]

#: The numba backend's package folder, its dotted name, and bnnsfw's folder.
PACKAGE = Path(__file__).resolve().parent
_PACKAGE_NAME = __name__.rpartition(".")[0]
_BNNSFW = PACKAGE.parents[1]

#: By kernel module, the modules outside the package (under bnnsfw's folder) whose values its
#: compiled code freezes when it compiles: the cells' kernels take each activation's BNNS
#: number (``enums.ActivationFunction``) as a constant. A test finds, from the code, every
#: global that compiled code reads and where its value comes from, and compares with this.
FROZEN: dict[str, tuple[str, ...]] = {
    "_cells.py": ("enums.py",),
}


def _import_statements(source: str) -> Iterator[ast.stmt]:
    """The import statements of ``source``, at any depth: each line that begins with ``from`` or
    ``import``, parsed alone, or with the lines that follow while a bracket stays open or a
    backslash ends it (comments aside). Numba reads each kernel's stamp when the kernel is
    defined, so the import of the backend pays for this: under 4 ms for all the kernel
    modules, where parsing them whole takes 40. A line of prose that parses as an import
    counts too, which can only widen a stamp; a test checks that this finds what a full parse
    of each module finds."""
    lines = source.splitlines()
    for number, line in enumerate(lines):
        statement, end = line.lstrip(), number
        if not statement.startswith(("from ", "import ")):
            continue
        bare = statement.split("#", 1)[0]  # an import holds no string: a "#" starts a comment
        while True:
            try:
                yield from ast.parse(statement).body
                break
            except SyntaxError:  # a bracket still open, or prose in a docstring
                if not (bare.count("(") > bare.count(")") or bare.rstrip().endswith("\\")) \
                        or end + 1 == len(lines):
                    break
                end += 1
                statement += "\n" + lines[end]
                bare += "\n" + lines[end].split("#", 1)[0]


def _package_module(dotted: str) -> Path | None:
    """The file of the package's module named ``dotted`` (absolute), ``None`` outside the
    package; the package's ``__init__.py`` for the package itself."""
    if dotted == _PACKAGE_NAME:
        return PACKAGE / "__init__.py"
    if not dotted.startswith(_PACKAGE_NAME + "."):
        return None
    return PACKAGE / (dotted[len(_PACKAGE_NAME) + 1:].split(".")[0] + ".py")


@functools.lru_cache(maxsize=None)
def imported_modules(path: Path) -> frozenset[Path]:
    """The package's modules that the module at ``path`` imports (``from . import _x``,
    ``from ._x import y``, and the same with absolute names); ``from . import name`` of a name
    that is not a module of the package counts as the package's ``__init__.py``."""
    found: set[Path | None] = set()
    for statement in _import_statements(path.read_text(encoding="utf-8")):
        if isinstance(statement, ast.Import):
            found.update(_package_module(alias.name) for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom):
            package = _PACKAGE_NAME.split(".")
            base = package[:len(package) + 1 - statement.level] if statement.level else []
            dotted = ".".join(base + ([statement.module] if statement.module else []))
            module = _package_module(dotted)
            if module is not None and module.name == "__init__.py":
                for alias in statement.names:
                    submodule = PACKAGE / f"{alias.name}.py"
                    found.add(submodule if submodule.exists() else module)
            else:
                found.add(module)
    return frozenset(p for p in found if p is not None)


@functools.lru_cache(maxsize=None)
def stamped_modules(path: Path) -> tuple[Path, ...]:
    """The sources that make up the stamp of the kernels of the module at ``path`` (module
    docstring): it and the package's modules it imports, theirs in turn, but this one
    (``_cache.py``), sorted; then the modules whose values any of them freezes
    (:data:`FROZEN`), sorted."""
    reached: set[Path] = set()
    pending = [path.resolve()]
    while pending:
        module = pending.pop()
        if module not in reached and module != Path(__file__).resolve():
            reached.add(module)
            pending.extend(imported_modules(module))
    frozen = {_BNNSFW / name for module in reached for name in FROZEN.get(module.name, ())}
    return tuple(sorted(reached)) + tuple(sorted(frozen))


def sources_digest(paths: tuple[Path, ...]) -> str:
    """SHA-256 over the names and contents of ``paths``, in order."""
    digest = hashlib.sha256()
    for path in paths:
        source = path.read_bytes()
        digest.update(path.name.encode())
        digest.update(len(source).to_bytes(8, "little"))
        digest.update(source)
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def module_digest(path: Path) -> str:
    """:func:`sources_digest` of :func:`stamped_modules`, read once per process: what the
    stamp of the kernels of the module at ``path`` adds to Numba's."""
    return sources_digest(stamped_modules(path))


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """:func:`sources_digest` of every module of the package and of :data:`FROZEN`'s, read once
    per process: what the markers of the kinds of call whose kernels are on disk are keyed on
    (``_tiers.py``), since beside the kernels' sources the package's ``__init__.py`` decides
    which kernels a call runs and ``_tiers.py`` how a background compile replays it."""
    frozen = {_BNNSFW / name for names in FROZEN.values() for name in names}
    return sources_digest(tuple(sorted(PACKAGE.glob("*.py"))) + tuple(sorted(frozen)))


class KernelSourcesLocator(caching._CacheLocator):
    """The locator Numba would choose for a function of the package, with
    :func:`module_digest` in the stamp."""

    def __init__(self, inner: Any, module: Path) -> None:
        self._inner = inner
        self._module = module

    def __getattr__(self, name: str) -> Any:
        """What Numba reads of its own locators beyond this interface (``_py_file``, when it
        warns that a function cannot be cached), from the locator it would have chosen."""
        if name in ("_inner", "_module"):  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

    def ensure_cache_path(self) -> None:
        self._inner.ensure_cache_path()

    def get_cache_path(self) -> str:
        return str(self._inner.get_cache_path())

    def get_source_stamp(self) -> Any:
        return self._inner.get_source_stamp(), module_digest(self._module)

    def get_disambiguator(self) -> str:
        return str(self._inner.get_disambiguator())

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> KernelSourcesLocator | None:
        if not os.path.exists(py_file) or Path(py_file).resolve().parent != PACKAGE:
            return None
        others: list[Any] = caching.CacheImpl._locator_classes
        for other in others:
            if other is not cls:
                inner = other.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner, Path(py_file).resolve())
        return None


def install() -> None:
    """Put :class:`KernelSourcesLocator` first in Numba's locators (once); call it before the
    kernels are defined, since Numba picks a function's locator when it is decorated."""
    locators: list[Any] = caching.CacheImpl._locator_classes
    if KernelSourcesLocator not in locators:
        locators.insert(0, KernelSourcesLocator)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the file ``path`` (made if missing) for the block; the block runs
    without one when it cannot be had (a read-only folder, no file locks on this system or
    this file system). Two opens of one file lock each other out, in one process too."""
    handle: Any = None
    if fcntl is not None:
        with contextlib.suppress(OSError):
            handle = open(path, "a+b")
        if handle is None:  # a lock file of another user's, say: readable is enough to lock
            with contextlib.suppress(OSError):
                handle = open(path, "rb")
    if handle is None:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:  # a file system without locks
            held = False
        else:
            held = True
        try:
            yield
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


class _LockedIndex(caching.IndexDataCacheFile):
    """Numba's cache file of one kernel, whose saves hold the lock of its folder
    (``index.lock``). Numba's own save reads the kernel's index, names a new entry's data file
    after the first number the index does not use, and writes the index, then the data: two
    processes saving two new signatures of one kernel at once could both take the same name,
    one's entry lost and the other's pointing to the first one's code, which a later process
    would then run on the arguments of the other signature; and a process loading between the
    two writes could follow the new entry to a data file left by older sources. Here the whole
    save holds the lock, and the data is written before the index names it."""

    def save(self, key: Any, data: Any) -> None:
        with locked(Path(self._cache_path) / "index.lock"):
            overloads = self._load_index()
            name = overloads.get(key)
            if name is None:
                taken = set(overloads.values())
                name = next(n for n in map(self._data_name, itertools.count(1)) if n not in taken)
            self._save_data(name, data)
            if overloads.get(key) != name:
                overloads[key] = name
                self._save_index(overloads)


def lock_saves() -> None:
    """Make the saves of every cached kernel of the package's imported modules
    :class:`_LockedIndex`'s. Numba makes each kernel's cache file when the kernel is defined,
    so the package calls this once its modules are imported."""
    for name, module in list(sys.modules.items()):
        if name.startswith(f"{_PACKAGE_NAME}."):
            for value in vars(module).values():
                cache_file = getattr(getattr(value, "_cache", None), "_cache_file", None)
                if type(cache_file) is caching.IndexDataCacheFile:
                    cache_file.__class__ = _LockedIndex

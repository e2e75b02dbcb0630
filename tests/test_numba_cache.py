"""The numba kernels' disk cache: each module's kernels stamped with the sources they carry."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

import bnnsfw as bf

pytestmark = pytest.mark.skipif("numba" not in bf.available_backends(), reason="needs the numba backend")

_PACKAGE_NAME = "bnnsfw.backends.numba"
_BNNSFW = Path(bf.__file__).resolve().parent

#: Which sources stamp the kernels of each module of the package: the module, the package's
#: modules it imports (theirs in turn; ``_cache.py`` aside), and ``enums.py`` for the cells.
_STAMPS = {
    "_cells.py": ["_cells.py", "_lstm_cell.py", "_lstm_operands.py", "_stream.py", "enums.py"],
    "_lstm_backward.py": ["_lstm_backward.py", "_lstm_cell.py", "_progress.py", "_stream.py", "_tiles.py"],
    "_lstm_cell.py": ["_lstm_cell.py", "_stream.py"],
    "_lstm_forward.py": ["_lstm_cell.py", "_lstm_forward.py", "_lstm_operands.py", "_progress.py",
                         "_stream.py", "_tiles.py"],
    "_normalization.py": ["_normalization.py", "_stream.py", "_tiles.py"],
    "_progress.py": ["_progress.py"],
    "_stream.py": ["_stream.py"],
    "_tiles.py": ["_tiles.py"],
}

#: Modules that define no kernel but whose values kernels read: they are in the stamps of the
#: kernel modules that import them (the padding of the step weights' rows, ``ROW_PAD``).
_READ_BY_KERNELS = {"_lstm_operands.py"}

#: The jit decorators of Numba by their last name: a function under one (or under a module
#: global bound to one, such as ``_kernel = numba.njit(...)``) runs compiled or while compiling.
_COMPILING = {"njit", "jit", "intrinsic", "overload", "overload_method", "overload_attribute",
              "register_jitable", "generated_jit", "vectorize", "guvectorize", "cfunc", "stencil"}


def _modules():
    from bnnsfw.backends.numba import _cache

    return sorted(_cache.PACKAGE.glob("*.py"))


def _absolute(node: ast.ImportFrom) -> str:
    package = _PACKAGE_NAME.split(".")
    base = package[:len(package) + 1 - node.level] if node.level else []
    return ".".join(base + ([node.module] if node.module else []))


def _file(dotted: str) -> str:
    """The file of bnnsfw's module ``dotted``, relative to bnnsfw's folder."""
    relative = Path(*dotted.split(".")[1:])
    return (relative.with_suffix(".py") if (_BNNSFW / relative.with_suffix(".py")).exists()
            else relative / "__init__.py").as_posix()


def _last_name(node: ast.expr) -> str | None:
    node = node.func if isinstance(node, ast.Call) else node
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _jit_aliases(path: Path) -> set[str]:
    """The module-level names of the module at ``path`` bound to a Numba decorator: its own
    (``_kernel = numba.njit(...)``) and those it imports from the package's modules that bind
    them."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {t.id for node in tree.body if isinstance(node, ast.Assign)
               and _last_name(node.value) in _COMPILING for t in node.targets if isinstance(t, ast.Name)}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            source = path.parent / f"{node.module}.py"
            if source.exists():
                theirs = _jit_aliases(source)
                aliases |= {a.asname or a.name for a in node.names if a.name in theirs}
    return aliases


def _frozen_sources(path: Path) -> tuple[set[str], set[str], set[str]]:
    """From the code of the module at ``path``: the modules of bnnsfw outside the numba package
    (relative to bnnsfw's folder) whose values its compiled code reads, those it imports, and
    the names of its compiled functions. Compiled code is every function under a Numba
    decorator; what it reads is every name in it, then every name in the module-level
    definitions of those (a constant computed at import from an imported value, a helper an
    overload calls while compiling), in turn: wider than what it really reads, never narrower."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    outside: dict[str, str] = {}  # a name bound by an import from bnnsfw outside the package
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("bnnsfw") for a in node.names), "name the values imported"
        if isinstance(node, ast.ImportFrom):
            dotted = _absolute(node)
            if not dotted.startswith("bnnsfw.") or f"{dotted}.".startswith(f"{_PACKAGE_NAME}."):
                continue
            for alias in node.names:
                module = f"{dotted}.{alias.name}"
                is_module = (_BNNSFW / _file(module)).exists()
                outside[alias.asname or alias.name] = _file(module if is_module else dotted)
    reads: dict[str, set[str]] = {}  # module-level name: the names its definitions read
    roots: set[str] = set()
    jit_aliases = _jit_aliases(path)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound = {node.name}
            if any(_last_name(d) in _COMPILING | jit_aliases for d in getattr(node, "decorator_list", ())):
                roots.add(node.name)
        else:
            bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for name in bound:
            reads.setdefault(name, set()).update(names)
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(reads.get(name, ()))
    return {outside[name] for name in seen if name in outside}, set(outside.values()), roots


def test_frozen_names_every_module_whose_values_compiled_code_reads(tmp_path):
    """Read from the code: the modules outside the package whose values the compiled code of
    each module of the package reads are those :data:`_cache.FROZEN` names (``enums.py`` for
    the cells, whose kernels take the activations' numbers as constants; the plan, weights,
    thread limits and ``Activation`` the modules import serve their Python code only). The
    reading finds every compiled function Numba knows in the module."""
    import importlib

    import numba
    from numba.core.extending import _Intrinsic

    from bnnsfw.backends.numba import _cache

    for path in _modules():
        frozen, _, roots = _frozen_sources(path)
        assert frozen == set(_cache.FROZEN.get(path.name, ())), path.name
        module = importlib.import_module(f"{_PACKAGE_NAME}.{path.stem}")
        for value in vars(module).values():
            func = getattr(value, "py_func", None) if isinstance(value, numba.core.dispatcher.Dispatcher) \
                else getattr(value, "_defn", None) if isinstance(value, _Intrinsic) else None
            if func is not None and func.__module__ == module.__name__:
                assert func.__name__ in roots, (path.name, func.__name__)
    assert _frozen_sources(_cache.PACKAGE / "_cells.py")[:2] == (
        {"enums.py"}, {"activation.py", "enums.py", "backends/_shared/lstm_kernels.py"})
    sample = tmp_path / "_sample.py"
    sample.write_text("import numba\n"
                      "from ...enums import ActivationFunction as AF\n"
                      "from .._shared.lstm_kernels import repeated\n"
                      "_kernel = numba.njit(cache=True)\n"
                      "_TANH = int(AF.tanh)\n"
                      "def python_side(a):\n    return repeated(a, 2)\n"
                      "@_kernel\ndef k(x):\n    return x + _TANH\n", encoding="utf-8")
    assert _frozen_sources(sample) == ({"enums.py"}, {"enums.py", "backends/_shared/lstm_kernels.py"}, {"k"})


def test_import_statements_found_line_by_line_are_the_full_parse():
    """The quick reading of a module's imports finds what a parse of the whole module finds,
    for every module of the package; a statement split over lines counts once."""
    from bnnsfw.backends.numba import _cache

    for path in _modules():
        source = path.read_text(encoding="utf-8")
        quick = [ast.dump(s) for s in _cache._import_statements(source)]
        full = [ast.dump(s) for s in ast.walk(ast.parse(source))
                if isinstance(s, (ast.Import, ast.ImportFrom))]
        assert sorted(quick) == sorted(full), path.name
    split = ("from ._tiles import (a,  # b)\n    b)  # (c\nx = 1\n\"\"\"\nfrom the docstring (a\n\"\"\"\n"
             "import \\\n  numba\nfrom . import (_stream  # )\n  )\n")
    assert [ast.dump(s) for s in _cache._import_statements(split)] == [
        ast.dump(s) for s in ast.parse(split).body if isinstance(s, (ast.Import, ast.ImportFrom))]


def test_each_kernel_module_is_stamped_with_the_sources_it_reaches():
    """Each kernel's cache entry is stamped with what Numba's own locator gives plus the digest
    of the sources its module reaches (:data:`_STAMPS`); no kernel module imports a module with
    no kernels but those whose values kernels read (:data:`_READ_BY_KERNELS`)."""
    import importlib

    import numba

    from bnnsfw.backends.numba import _cache

    for path in _modules():
        stamped = [p.name for p in _cache.stamped_modules(path)]
        if path.name in _STAMPS:
            assert stamped == _STAMPS[path.name], path.name
        elif path.name in _READ_BY_KERNELS:
            assert any(path.name in names for names in _STAMPS.values()), path.name
        else:
            assert not any(path.name in names for names in _STAMPS.values()), path.name
        module = importlib.import_module(f"{_PACKAGE_NAME}.{path.stem}")
        kernels = [v for v in vars(module).values() if isinstance(v, numba.core.dispatcher.Dispatcher)
                   and v.py_func.__module__ == module.__name__]
        assert bool(kernels) == (path.name in _STAMPS), path.name
        for kernel in kernels:
            locator = kernel._cache._impl.locator
            assert isinstance(locator, _cache.KernelSourcesLocator)
            inner, digest = locator.get_source_stamp()
            assert inner == locator._inner.get_source_stamp() and digest == _cache.module_digest(path)
    assert len({_cache.module_digest(_cache.PACKAGE / name) for name in _STAMPS}) == len(_STAMPS)


def test_a_kernel_that_cannot_be_cached_warns_with_its_file():
    """Numba's warning that a compiled function cannot be cached (with ``NUMBA_OPT=0``, or for
    one that uses dynamic globals) names the function's file, which it reads from the locator."""
    from numba.core.errors import NumbaWarning

    from bnnsfw.backends.numba import _tiles

    impl = _tiles._product._cache._impl
    result = SimpleNamespace(lifted=(), library=SimpleNamespace(has_dynamic_globals=True),
                             fndesc=SimpleNamespace(qualname="_product"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert impl.check_cachable(result) is False
    assert [(w.category, w.filename) for w in caught] == [(NumbaWarning, _tiles.__file__)]
    assert "Cannot cache compiled function \"_product\"" in str(caught[0].message)
    with pytest.raises(AttributeError):
        impl.locator.no_such_attribute  # noqa: B018


_ONE_KERNEL_EACH = """
import json
import numpy as np
from bnnsfw.backends.numba import (_cells, _lstm_backward, _lstm_cell, _lstm_forward, _normalization,
                                   _progress, _stream, _tiles)
calls = {
    "_progress.py": (_progress.wait_for, (np.ones(1, np.int64), 1)),
    "_stream.py": (_stream.stream_copy, (np.ones(64, np.float32), np.empty(64, np.float32))),
    "_tiles.py": (_tiles._unit_rows, (np.ones((2, 2)),)),
    "_lstm_cell.py": (_lstm_cell._chunk, (8, 4, 1, False)),
    "_lstm_forward.py": (_lstm_forward._following, (0, 2, 0, 0, 1, False)),
    "_lstm_backward.py": (_lstm_backward._states_as_rows, (np.ones((1, 2, 1)), 0, 1, np.empty((1, 2)), 0, 2)),
    "_normalization.py": (_normalization._combine, (1.0, 0.0, 0.0, 1.0, 1.0, 0.0)),
    "_cells.py": (_cells._zero_columns, (np.ones((4, 2)), np.zeros(2, np.bool_), 0, 4)),
}
found = {}
for name, (kernel, args) in calls.items():
    kernel(*args)
    found[name] = [sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values())]
print(json.dumps(found))
"""


def test_an_edit_recompiles_the_kernels_that_carry_the_edited_sources_and_no_others(tmp_path):
    """End to end, in a copy of bnnsfw with a cache of its own, one small kernel of each kernel
    module: all compile in the first process; after edits to modules no kernel carries (the
    compile tiers, the package's ``__init__``, the stamping itself, the LSTM's entry points in
    ``_lstm.py``, the shared LSTM kernels and ``Activation``, which the LSTM modules import for
    their Python code) all load from the cache; after an edit to ``_progress.py`` the kernels
    of the LSTM's forward and backward and its own compile again, the others load; after one to
    ``_lstm_backward.py``, its own alone; after one to ``_lstm_operands.py`` (no kernel, but
    values the kernels read), those of the forward and the cells; after one to
    ``_lstm_cell.py``, those of every LSTM module; after one to ``_tiles.py``, those of every module that
    calls the tiles; after one to ``enums.py``, whose values the cells' kernels freeze, those
    of ``_cells.py`` alone."""
    tree = tmp_path / "tree"
    shutil.copytree(_BNNSFW, tree / "bnnsfw", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def compiled_after(*edited: str) -> set[str]:
        for name in edited:
            with open(tree / "bnnsfw" / name, "a", encoding="utf-8") as fh:
                fh.write("\n# an edit\n")
        done = subprocess.run([sys.executable, "-c", _ONE_KERNEL_EACH], capture_output=True, text=True,
                              timeout=600, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        counts = json.loads(done.stdout.strip().splitlines()[-1])
        assert all(sorted(c) == [0, 1] for c in counts.values()), counts  # loaded or compiled, once
        return {name for name, (_, misses) in counts.items() if misses}

    numba = "backends/numba/"
    assert compiled_after() == set(_STAMPS)
    no_kernel_carries = ("_tiers.py", "__init__.py", "_cache.py", "_worker.py", "_lstm.py")
    assert compiled_after(*(numba + name for name in no_kernel_carries), "backends/_shared/lstm_kernels.py",
                          "activation.py") == set()
    assert compiled_after(numba + "_progress.py") == {"_progress.py", "_lstm_forward.py", "_lstm_backward.py"}
    assert compiled_after(numba + "_lstm_backward.py") == {"_lstm_backward.py"}
    assert compiled_after(numba + "_lstm_operands.py") == {"_lstm_forward.py", "_cells.py"}
    lstm_modules = {"_lstm_cell.py", "_lstm_forward.py", "_lstm_backward.py", "_cells.py"}
    assert compiled_after(numba + "_lstm_cell.py") == lstm_modules
    assert compiled_after(numba + "_tiles.py") == {"_tiles.py", "_lstm_forward.py", "_lstm_backward.py",
                                                   "_normalization.py"}
    assert compiled_after("enums.py") == {"_cells.py"}


def test_every_cached_kernel_saves_under_the_cache_folder_lock():
    """Each compiled function of the numba package that Numba caches on disk, found among all
    the objects of the process once every module of the package is imported (not from the
    modules' names, as the package finds them), saves through the locked index."""
    import gc
    import importlib

    from numba.core.dispatcher import Dispatcher

    from bnnsfw.backends.numba import _cache

    for path in _cache.PACKAGE.glob("*.py"):
        importlib.import_module(f"{_PACKAGE_NAME}.{path.stem}" if path.stem != "__init__" else _PACKAGE_NAME)
    cached = [o for o in gc.get_objects() if issubclass(type(o), Dispatcher)  # (no weak proxies)
              and o.py_func.__module__.startswith(f"{_PACKAGE_NAME}.")
              and getattr(o, "_cache", None) is not None and hasattr(o._cache, "_cache_file")]
    assert len(cached) > 50
    unlocked = [o.py_func.__qualname__ for o in cached
                if not isinstance(o._cache._cache_file, _cache._LockedIndex)]
    assert unlocked == []


def test_a_kernel_save_waits_for_the_cache_folder_lock(tmp_path):
    """While another holder has the folder's lock (here a second open of the lock file, which
    locks as another process's would), a save reads and writes nothing: an entry another
    process saves meanwhile is kept. The save completes once the lock is released."""
    import threading

    from numba.core.caching import IndexDataCacheFile

    from bnnsfw.backends.numba import _cache

    if _cache.fcntl is None:
        pytest.skip("no file locks on this system")
    files = dict(cache_path=str(tmp_path), filename_base="kernel", source_stamp="stamp")
    index = _cache._LockedIndex(**files)
    saving = threading.Thread(target=index.save, args=(("signature", 1), {"code": 1}))
    with _cache.locked(tmp_path / "index.lock"):
        saving.start()
        saving.join(0.5)
        assert saving.is_alive()
        assert not (tmp_path / "kernel.nbi").exists()
        IndexDataCacheFile(**files).save(("signature", 2), {"code": 2})  # the other process's
    saving.join(10.0)
    assert not saving.is_alive()
    assert index.load(("signature", 1)) == {"code": 1}
    assert index.load(("signature", 2)) == {"code": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.lock", "kernel.1.nbc", "kernel.2.nbc",
                                                          "kernel.nbi"]


def test_a_kernel_save_writes_its_data_before_the_index_names_it(tmp_path, monkeypatch):
    """A process loading while another saves finds a new entry's data complete: when the index
    is written, the data file it names exists (Numba's own save writes them the other way
    round, and a data file left by older sources would be read)."""
    from bnnsfw.backends.numba import _cache

    found = []
    write_index = _cache._LockedIndex._save_index

    def spy(self, overloads):
        found.append(sorted((name, (tmp_path / name).exists()) for name in overloads.values()))
        write_index(self, overloads)

    monkeypatch.setattr(_cache._LockedIndex, "_save_index", spy)
    index = _cache._LockedIndex(cache_path=str(tmp_path), filename_base="kernel", source_stamp="stamp")
    index.save(("signature", 1), {"code": 1})
    index.save(("signature", 2), {"code": 2})
    index.save(("signature", 1), {"code": 3})  # an entry saved again: its data replaced in place
    assert found == [[("kernel.1.nbc", True)], [("kernel.1.nbc", True), ("kernel.2.nbc", True)]]
    assert index.load(("signature", 1)) == {"code": 3}


def test_a_save_runs_without_the_lock_where_the_file_system_has_no_locks(tmp_path, monkeypatch):
    """A cache folder on a file system that refuses locks (some network mounts) still takes
    the kernels: the save runs unlocked rather than failing the call that compiled."""
    import errno

    from bnnsfw.backends.numba import _cache

    if _cache.fcntl is None:
        pytest.skip("no file locks on this system")

    def refuse(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_cache.fcntl, "flock", refuse)
    index = _cache._LockedIndex(cache_path=str(tmp_path), filename_base="kernel", source_stamp="stamp")
    index.save(("signature",), {"code": 1})
    assert index.load(("signature",)) == {"code": 1}

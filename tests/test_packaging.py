"""The source distribution is complete: its own tests, docs and samples run from it."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Tests that need the helpers beside them, the samples and the docs, and so fail when the
# sdist leaves any of those out; a few seconds in all.
SMOKE = [
    "tests/test_enums.py",
    "tests/test_compat.py",
    "tests/test_fully_connected.py",             # tests/gradcheck.py
    "tests/test_lstm.py::test_forward_matches_plain_reference",  # tests/lstm_reference.py
    "tests/test_samples.py",                     # samples/
    "tests/test_docs.py",                        # docs/
]

# Run inside the unpacked sdist: import bnnsfw first and make sure it is the unpacked copy,
# not the installed one, then hand over to pytest in the same interpreter.
RUNNER = """
import sys
from pathlib import Path

import bnnsfw
import pytest

root = Path.cwd().resolve()
if root not in Path(bnnsfw.__file__).resolve().parents:
    sys.exit(f"bnnsfw was imported from {bnnsfw.__file__}, not from {root}")
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-n", "0", *sys.argv[1:]]))
"""


def _source_files() -> list[str]:
    """Every file of the source tree that the sdist has to carry, relative to the root."""
    names = ["LICENSE", "README.md", "pyproject.toml", "setup.cfg", "MANIFEST.in", ".ci/run",
             "bnnsfw/py.typed"]
    for folder, pattern in (("bnnsfw", "*.py"), ("tests", "*.py"), ("samples", "*.py"), ("docs", "*")):
        for path in (ROOT / folder).rglob(pattern):
            relative = path.relative_to(ROOT)
            if path.is_file() and not {"__pycache__", "_build"} & set(relative.parts):
                names.append(relative.as_posix())
    return sorted(names)


def _build_command(source: Path, outdir: Path) -> list[str]:
    """``python -m build --sdist``, without build isolation when setuptools is at hand (no network)."""
    command = [sys.executable, "-m", "build", "--sdist", "--outdir", str(outdir)]
    if importlib.util.find_spec("setuptools") is not None:
        command.append("--no-isolation")
    return command + [str(source)]


def _clean_copy(destination: Path) -> Path:
    """The source tree without build output: setuptools adds the files listed in an existing
    ``*.egg-info/SOURCES.txt`` to every later sdist, which would hide a gap in MANIFEST.in."""
    ignore = shutil.ignore_patterns(".git", "*.egg-info", "__pycache__", "*.py[cod]", "build", "dist",
                                    "_build", ".hypothesis", ".pytest_cache", ".mypy_cache", ".venv")
    return Path(shutil.copytree(ROOT, destination / "source", ignore=ignore))


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("build") is None:
        pytest.skip("the 'build' package is not installed (pip install -e '.[test]' brings it)")
    source = _clean_copy(tmp_path_factory.mktemp("copy"))
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run(_build_command(source, dist), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (archive,) = dist.glob("bnnsfw-*.tar.gz")
    target = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(archive) as tar:
        # The "data" filter (Python 3.10.12+, 3.11.4+) refuses links and absolute paths; newer
        # Pythons warn when no filter is named.
        tar.extractall(target, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (top,) = target.iterdir()
    return top


def test_sdist_carries_every_source_file(unpacked):
    missing = [name for name in _source_files() if not (unpacked / name).is_file()]
    assert not missing, f"missing from the sdist: {missing}"


def test_sdist_carries_no_build_output(unpacked):
    stray = [path.relative_to(unpacked).as_posix() for path in unpacked.rglob("*")
             if path.name == "__pycache__" or path.suffix == ".pyc" or "_build" in path.parts]
    assert not stray


def _with_compiled_kernels(unpacked: Path, destination: Path) -> Path:
    """A copy of the unpacked tree with the checkout's on-disk Numba cache (``*.nbi`` and
    ``*.nbc`` in the ``__pycache__`` folders beside the kernels), so that the tests run there do
    not compile every kernel again (about a minute). Numba takes an entry only when the source
    it was compiled from is byte-identical (the index holds the source's hash; older releases
    hold its time stamp, and compile afresh): a missing or stale cache costs time, never a
    wrong answer. The sdist itself carries none (``test_sdist_carries_no_build_output``)."""
    from bnnsfw.backends.numba import _cache

    tree = Path(shutil.copytree(unpacked, destination / unpacked.name))
    for folder in sorted({index.parent for index in (ROOT / "bnnsfw").rglob("__pycache__/*.nbi")}):
        # under the lock the kernels' saves hold (the suite's other workers may be saving)
        with _cache.locked(folder / "index.lock"):
            for path in folder.glob("*.nb[ic]"):
                target = tree / path.relative_to(ROOT)
                target.parent.mkdir(exist_ok=True)
                shutil.copy2(path, target)
    return tree


@pytest.mark.slow
def test_smoke_tests_run_from_the_unpacked_sdist(unpacked, tmp_path):
    tree = _with_compiled_kernels(unpacked, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONSTARTUP", None)
    done = subprocess.run([sys.executable, "-c", RUNNER, *SMOKE], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_readme_requirements_name_every_dependency_and_its_floor():
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    with open(ROOT / "pyproject.toml", "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    requirements = readme.split("## Requirements", 1)[1].split("\n## ", 1)[0]
    requirements = " ".join(requirements.split()).lower()
    for dependency in dependencies:
        name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", dependency.replace(" ", "")).groups()
        assert f"{name.lower()} ≥ {floor}" in requirements, f"README's requirements lack {name} ≥ {floor}"

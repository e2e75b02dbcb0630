"""The documentation: it builds without warnings, every page is reachable, examples run."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bnnsfw

DOCS = Path(__file__).resolve().parent.parent / "docs"
BUILD = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html"]


def _toctree_entries(page: Path) -> list[str]:
    """Documents named by the MyST ``{toctree}`` blocks of ``page``, relative to docs/."""
    text = page.read_text(encoding="utf-8")
    entries = []
    for block in re.findall(r"^```\{toctree\}[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            line = line.strip()
            if not line or line.startswith(":"):
                continue
            match = re.fullmatch(r".*<(.+)>", line)  # "Title <document>"
            entries.append((match.group(1) if match else line).removesuffix(".md"))
    return entries


def _reachable() -> set[str]:
    seen: set[str] = set()
    todo = ["index"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        page = DOCS / f"{name}.md"
        assert page.is_file(), f"a toctree names {name!r}, but docs/{name}.md does not exist"
        todo.extend(_toctree_entries(page))
    return seen


def test_every_page_is_reachable_from_the_toctree():
    pages = {p.stem for p in DOCS.glob("*.md")}
    missing = pages - _reachable()
    assert not missing, f"docs pages in no toctree (add them to docs/index.md): {sorted(missing)}"


def test_every_public_name_is_in_the_api_reference():
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    directive = r"^\.\. auto(?:class|exception|function|data):: bnnsfw\.(\w+)$"
    documented = set(re.findall(directive, api, flags=re.M))
    modules = set(re.findall(r"^\.\. automodule:: bnnsfw\.([\w.]+)$", api, flags=re.M))
    for name in bnnsfw.__all__:
        if name == "__version__":
            continue
        if name in ("losses", "optimizers", "schedules"):
            assert name in modules, f"docs/api.md has no automodule for bnnsfw.{name}"
        else:
            assert name in documented, f"docs/api.md does not document bnnsfw.{name}"


def test_concepts_examples_run():
    text = (DOCS / "concepts.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/concepts.md", "exec"), {})


@pytest.mark.parametrize("page", ["lstm.md", "normalization.md"])
def test_layer_pages_self_contained_examples_run(page):
    """Every example of the page that starts with its own imports runs as it is."""
    text = (DOCS / page).read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
              if b.startswith("import numpy as np")]
    assert len(blocks) >= 3
    for block in blocks:
        exec(compile(block, f"docs/{page}", "exec"), {})


@pytest.mark.slow
def test_docs_build_with_warnings_as_errors(tmp_path):
    if importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("myst_parser") is None:
        pytest.skip("sphinx and myst-parser are not installed (pip install -e '.[docs]')")
    command = [*BUILD, "-q", "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"the docs build failed:\n{result.stderr[-6000:]}"
    assert (tmp_path / "html" / "api.html").is_file()


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_readme_examples_run(tmp_path, monkeypatch):
    """The README's layer example, then its six-line model and training loop (2 epochs here)."""
    monkeypatch.chdir(tmp_path)
    first, model = _python_blocks(DOCS.parent / "README.md")
    namespace: dict = {}
    exec(compile(first, "README.md", "exec"), namespace)
    assert "range(30)" in model and "make_sine_task(seed=0)" in model
    fast = model.replace("range(30)", "range(2)")
    fast = fast.replace("make_sine_task(seed=0)", "make_sine_task(n_series=8, seed=0)")
    exec(compile(fast, "README.md", "exec"), namespace)
    task = namespace["task"]
    loaded = bnnsfw.load_weights("forecaster")
    assert isinstance(loaded, bnnsfw.Sequential)
    np.testing.assert_array_equal(loaded(task.x_val), namespace["model"](task.x_val))


def test_training_page_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_python_blocks(DOCS / "training.md")[0], "docs/training.md", "exec"), namespace)
    assert isinstance(namespace["same"], bnnsfw.Sequential)
    assert (tmp_path / "forecaster.safetensors").is_file()


def _run_training_block(marker: str) -> dict:
    """Run the one python block of the training page that contains ``marker``, on the numpy
    backend, and return its names."""
    blocks = [block for block in _python_blocks(DOCS / "training.md") if marker in block]
    assert len(blocks) == 1
    namespace: dict = {}
    with bnnsfw.use_backend("numpy"):
        exec(compile(blocks[0], "docs/training.md", "exec"), namespace)
    return namespace


def test_training_page_padded_example_runs():
    """The padded classifier: lengths, LastStep at the valid step, Dropout, an evaluation between."""
    namespace = _run_training_block("sequence_lengths=lengths")
    assert namespace["optimizer"].step_count == 1


def test_training_page_copy_example_runs():
    """The copies example of the training page (the pool example needs a module of its own)."""
    namespace = _run_training_block("copy.deepcopy")
    assert namespace["best_optimizer"].step_count == 2

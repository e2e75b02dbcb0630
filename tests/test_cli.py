import subprocess
import sys
from pathlib import Path

import pytest

import bnnsfw
from bnnsfw import cli


def test_info_prints_version_backends_and_health(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bnnsfw ")
    auto = bnnsfw.get_backend("auto").name
    assert f"backends: {', '.join(bnnsfw.available_backends())} (auto -> {auto})" in out
    assert "health: ok" in out


def test_demo_and_bench_help_are_wired(capsys):
    for command in ("demo", "bench"):
        try:
            cli.main([command, "--help"])
        except SystemExit as exc:
            assert exc.code == 0
        assert f"bnnsfw {command}" in capsys.readouterr().out


def test_unknown_command_exits_2(capsys):
    try:
        cli.main(["frobnicate"])
    except SystemExit as exc:
        assert exc.code == 2
    else:  # pragma: no cover
        raise AssertionError("expected SystemExit")
    assert "invalid choice" in capsys.readouterr().err


def test_python_dash_m_runs_the_same_command():
    done = subprocess.run([sys.executable, "-m", "bnnsfw"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "health: ok" in done.stdout


def test_deprecations_subcommand_is_wired(capsys):
    assert cli.main(["deprecations", "BNNSDirectApplyLSTMBatchBackward"]) == 0
    out = capsys.readouterr().out
    assert "bnnsfw.LSTMLayer.apply_backward" in out and "Use BNNSGraph* APIs" in out


def test_the_library_never_imports_the_command_line():
    """Importing every library module leaves ``bnnsfw.cli`` unloaded."""
    package = Path(bnnsfw.__file__).parent
    names = sorted(
        ".".join(("bnnsfw", *path.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        for path in package.rglob("*.py")
        if path.relative_to(package).parts[0] not in ("cli", "__main__.py")
    )
    script = "import importlib, sys\n" + "".join(f"importlib.import_module({name!r})\n" for name in names)
    script += "print(sorted(m for m in sys.modules if m.startswith('bnnsfw.cli')))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "bnnsfw.deprecation" in names and "bnnsfw.serialization" in names


@pytest.mark.skipif("numba" not in bnnsfw.available_backends(), reason="needs the numba backend")
def test_compile_builds_a_models_kernels_ahead_and_says_where(capsys, monkeypatch, tmp_path):
    """``bnnsfw compile`` makes a model's calls as a first run does, waits for the background
    compile, and reports the kinds of call now ready, the cache folder and the CPU (float32's:
    float64 has none); a process after it finds them ready (``bnnsfw`` alone says so)."""
    from bnnsfw.backends.numba import _tiers

    monkeypatch.setattr(_tiers, "ready_folder", lambda: tmp_path / "bnnsfw-ready")
    monkeypatch.setattr(bnnsfw.backends.get_backend("numba"), "_tiers", _tiers.Tiers())
    argv = ["compile", "--hidden", "4", "--seq", "3", "--batch", "2", "--dtype", "float32",
            "--dtype", "float64"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "compiled for the model of the given sizes: 5 new kinds of call ready (5 in all)" in out, out
    assert "float64: nothing to compile (the numba backend runs it on scipy-blas's kernels)" in out
    assert f"kernels: {tmp_path} (markers in bnnsfw-ready/); CPU " in out
    assert bnnsfw.backends.compile_mode() == "wait"  # the suite's mode, restored
    assert cli.main([]) == 0
    assert "compiled kernels: 5 kinds of call ready" in capsys.readouterr().out


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"bnnsfw {bnnsfw.__version__}\n"


def test_a_misuse_from_the_shell_is_one_line_and_status_2():
    done = subprocess.run([sys.executable, "-m", "bnnsfw", "demo", "--backend", "nope"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("bnnsfw demo: error: argument --backend: invalid choice: 'nope' (choose from ")
    assert all(f"'{name}'" in last for name in bnnsfw.available_backends())


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "argument --repeats: must be an integer >= 1; got 0"),
    (["--threads", "-1"], "argument --threads: must be an integer >= 0; got -1"),
    (["--backend", "fast"], "argument --backend: invalid choice: 'fast'"),
    (["--json", "/no/such/folder/b.json"], "argument --json: the folder '/no/such/folder' does not exist"),
])
def test_bench_misuse_is_a_usage_error_before_any_timing(argv, message, capsys):
    from bnnsfw.cli import bench

    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == ""
    assert message in captured.err and "Traceback" not in captured.err

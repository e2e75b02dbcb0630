"""Family 3: the deprecation scanner and the command line.

Each example builds a directory tree from hostile parts — FIFOs and device links with source
suffixes, symlinks out of the tree, in it, dangling and looping, version-control, build,
cache and virtual-environment directories, files over the size limit, binary files, names
with control characters or bytes that are not UTF-8 — runs ``bnnsfw deprecations --scan``
on it (in a thread with a timeout: a hang fails the test), and checks the findings against
the tree's own record of what should be found, and that the output is printable.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from hostile._hostile import HOSTILE, answered, count, wrong
from hypothesis import given, settings
from hypothesis import strategies as st

from bnnsfw.cli import main as bnnsfw_main
from bnnsfw.cli.deprecations import main

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and symlinks (POSIX)")

CALL = "BNNSFilterApply(f, in, out);\n"  # one deprecated name per file
NAMES = ["plain", "with space", "tab\there", "new\nline", "esc\x1b[31mred", "del\x7f", "csi\x9bx", "bell\x07"]
PARTS = ["source", "source", "fifo", "dev-zero", "outside", "inside", "dangling", "loop", "git", "build",
         "venv", "pycache", "big", "binary", "bad-bytes", "dir-outside"]


def run_cli(argv: list[str], timeout: float = 20.0) -> tuple[int, str, str]:
    """Run the command in a thread; a call still running after ``timeout`` is a hang."""
    out, err = io.StringIO(), io.StringIO()
    result: dict[str, Any] = {}

    def target() -> None:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                result["status"] = main(argv)
            except BaseException as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        count("scanner", "wrong")
        raise AssertionError(f"bnnsfw deprecations {argv!r} hung")
    if "error" in result:
        count("scanner", "unclear")
        raise AssertionError(f"bnnsfw deprecations raised {result['error']!r}")
    return result["status"], out.getvalue(), err.getvalue()


def printable_output(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def build(root: Path, outside: Path, parts: list[tuple[str, str]]) -> int:
    """Make the tree; return how many findings a correct scan reports."""
    expected = 0
    for index, (part, name) in enumerate(parts):
        stem = f"{index}-{name}"
        if part == "source":
            (root / f"{stem}.c").write_text(CALL)
            expected += 1
        elif part == "fifo":
            os.mkfifo(root / f"{stem}.c")
        elif part == "dev-zero":
            os.symlink("/dev/zero", root / f"{stem}.c")
        elif part == "outside":
            target = outside / f"{stem}.c"
            target.write_text(CALL)
            os.symlink(target, root / f"link-{stem}.c")
        elif part == "inside":
            (root / f"{stem}-target.c").write_text(CALL)
            os.symlink(root / f"{stem}-target.c", root / f"link-{stem}.c")
            expected += 2  # the file, and the link to it inside the tree
        elif part == "dangling":
            os.symlink(root / "nowhere.c", root / f"{stem}.c")
        elif part == "loop":
            os.symlink(root / f"{stem}-b.c", root / f"{stem}-a.c")
            os.symlink(root / f"{stem}-a.c", root / f"{stem}-b.c")
        elif part in ("git", "build", "pycache"):
            directory = root / {"git": ".git", "build": "build/lib", "pycache": "__pycache__"}[part] / stem
            directory.mkdir(parents=True)
            (directory / "copy.py").write_text(CALL)
        elif part == "venv":
            directory = root / f"env-{stem}"
            (directory / "lib").mkdir(parents=True)
            (directory / "pyvenv.cfg").write_text("home = /usr\n")
            (directory / "lib" / "site.py").write_text(CALL)
        elif part == "big":
            (root / f"{stem}.h").write_text(CALL + "x" * 5000)
        elif part == "binary":
            (root / f"{stem}.m").write_bytes(b"\0" + CALL.encode())
        elif part == "bad-bytes":
            path = os.path.join(os.fsencode(root), os.fsencode(stem) + b"\xff\xfe.swift")
            with open(path, "wb") as handle:
                handle.write(CALL.encode())
            expected += 1
        elif part == "dir-outside":
            (outside / f"dir-{stem}").mkdir()
            (outside / f"dir-{stem}" / "x.c").write_text(CALL)
            os.symlink(outside / f"dir-{stem}", root / f"dirlink-{stem}")
    return expected


@settings(HOSTILE, max_examples=45)
@given(parts=st.lists(st.tuples(st.sampled_from(PARTS), st.sampled_from(NAMES)), min_size=1, max_size=6),
       as_json=st.booleans())
def test_scan_hostile_trees(tmp_path_factory: pytest.TempPathFactory, parts: list[tuple[str, str]],
                            as_json: bool) -> None:
    base = tmp_path_factory.mktemp("tree")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    expected = build(root, outside, parts)
    argv = ["--scan", str(root), "--max-bytes", "4096"] + (["--json"] if as_json else [])
    status, out, err = run_cli(argv)
    if status != 0:
        raise wrong("scanner", f"exit status {status}: {err}")
    if not printable_output(out) or not printable_output(err):
        raise wrong("scanner", "raw control characters in the output")
    findings = [line for line in out.splitlines() if re.match(r".*:\d+:\d+  ", line)]
    found = len(json.loads(out)) if as_json else len(findings)
    if found != expected:
        raise wrong("scanner", f"{found} findings, {expected} expected:\n{out}\n{err}")
    answered("scanner")


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/dev/urandom", "fifo", "big", "dangling"])
def test_scan_explicit_paths_that_are_not_sources(tmp_path: Path, path: str) -> None:
    """Named explicitly, a device, a FIFO, an over-size file or a dangling link is skipped
    with its reason on stderr, and the scan ends."""
    if path == "fifo":
        os.mkfifo(tmp_path / "blocked.c")
        path = str(tmp_path / "blocked.c")
    elif path == "big":
        (tmp_path / "big.c").write_text(CALL * 1000)
        path = str(tmp_path / "big.c")
    elif path == "dangling":
        os.symlink(tmp_path / "gone.c", tmp_path / "evil.c")
        path = str(tmp_path / "evil.c")
    elif not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    status, out, err = run_cli(["--scan", path, "--max-bytes", "1024"])
    if status != 0 or "skipped" not in err or not out.startswith("No deprecated"):
        raise wrong("scanner", f"{path}: status {status}, {out!r}, {err!r}")
    answered("scanner")


def test_this_repository_scans_without_duplicates() -> None:
    """The project's own tree: build output, caches and environments are not walked."""
    root = Path(__file__).resolve().parents[2]
    status, out, err = run_cli(["--scan", str(root / "bnnsfw"), str(root / "samples"), "--json"], timeout=120)
    findings = json.loads(out)
    locations = [(f["path"], f["line"], f["column"]) for f in findings]
    if status != 0 or len(locations) != len(set(locations)):
        raise wrong("scanner", "a location reported twice")
    if any(f"{os.sep}build{os.sep}" in f["path"] for f in findings):
        raise wrong("scanner", "build output scanned")
    answered("scanner")


HOSTILE_ARGV = [
    ["--scan"], ["--max-bytes", "-5", "--scan", "."], ["--max-bytes", "abc", "--scan", "."], ["--check"],
    ["--all-dirs"], ["--bogus"], ["--list", "--scan", "."], ["--status", "nope", "--list"], [],
    ["\x1b[31mBNNSNope"], ["BNNS\nFilter"], ["--kind", "function"], ["--json"], ["-"], ["--scan", "\x00"],
    ["--scan", "/nonexistent/\x1b[2J"], ["--list", "--status", "deprecated", "--kind", "bogus"],
    ["BNNSFilterApply", "\udcff"], ["--scan", "/dev/zero", "--max-bytes", "99999999999999999999999"],
]


@pytest.mark.parametrize("argv", HOSTILE_ARGV, ids=range(len(HOSTILE_ARGV)))
def test_hostile_command_lines(argv: list[str]) -> None:
    """Usage errors and unknown names: exit status 2, the reason on stderr, no traceback,
    nothing unprintable."""
    status, out, err = run_cli(argv)
    if status not in (0, 2) or "Traceback" in err or not printable_output(out + err):
        raise wrong("scanner", f"{argv!r}: status {status}, {out!r}, {err!r}")
    if status == 2 and not err.strip():
        raise wrong("scanner", f"{argv!r}: exit status 2 without a reason")
    answered("scanner")


@pytest.mark.parametrize("argv", [["frobnicate"], ["demo", "--nope"], ["bench", "--layers", "x"],
                                  ["deprecations", "--bogus"], ["--version-x"]])
def test_hostile_top_level_command_lines(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = bnnsfw_main(argv)
    except SystemExit as exit_:  # argparse reports usage errors by exiting
        status = exit_.code
    captured = capsys.readouterr()
    if status != 2 or "Traceback" in captured.err or not captured.err.strip():
        raise wrong("scanner", f"bnnsfw {argv!r}: status {status}, {captured.err!r}")
    answered("scanner")

"""The ``bnnsfw`` command line.

``bnnsfw`` alone prints the version, the backends and a one-line health check; the
subcommands run the main jobs, one module each: :mod:`bnnsfw.cli.demo`,
:mod:`bnnsfw.cli.bench`, :mod:`bnnsfw.cli.compile` and :mod:`bnnsfw.cli.deprecations`. The
library never imports this package.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

__all__ = ["main"]


def _health() -> tuple[bool, str]:
    """Run one small product on every backend and compare it with ``numpy.matmul``."""
    from .. import backends
    from ..backends.contract import GemmRequest

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((7, 5)), rng.standard_normal((5, 3))
    expected = a @ b
    failures = []
    names = backends.available_backends()
    for name in names:
        try:
            got = backends.get_backend(name).gemm(GemmRequest(a=a, b=b)).out
            if not np.allclose(got, expected, rtol=1e-12, atol=1e-12):
                failures.append(f"{name}: wrong product")
        except Exception as exc:  # report, do not crash the health check
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    if failures:
        return False, "health: FAILED (" + "; ".join(failures) + ")"
    return True, f"health: ok (a matrix product agrees with NumPy on {', '.join(names)})"


def _compiled_kernels() -> str:
    """Whether this process would find compiled kernels ready, and where."""
    from .. import backends

    status = getattr(backends.get_backend("numba"), "compile_status")()
    where = f"{status.cache}, CPU {status.cpu}; compile mode {status.mode}"
    if status.ready:
        return f"compiled kernels: {status.ready} kinds of call ready ({where})"
    return (f"compiled kernels: none ready yet ({where}): first calls run on scipy-blas's kernels while "
            "they compile (bnnsfw compile builds them ahead)")


def _info() -> int:
    import bnnsfw

    from .. import backends

    print(f"bnnsfw {bnnsfw.__version__} (numpy {np.__version__})")
    auto = backends.get_backend("auto").name
    print(f"backends: {', '.join(backends.available_backends())} (auto -> {auto})")
    ok, line = _health()
    print(line)
    if "numba" in backends.available_backends():
        print(_compiled_kernels())
    print("commands: bnnsfw demo | bnnsfw bench | bnnsfw compile | bnnsfw deprecations  "
          "(bnnsfw COMMAND --help)")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bnnsfw`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="bnnsfw", description="BNNS layers (LSTM, normalization) in NumPy and SciPy."
    )
    parser.add_argument("command", nargs="?", choices=["demo", "bench", "compile", "deprecations"],
                        help="what to run; without one, print version, backends and a health check")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    if not args:
        return _info()
    if args[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if args == ["--version"]:
        import bnnsfw

        print(f"bnnsfw {bnnsfw.__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command == "deprecations":
        from .deprecations import main as deprecations_main

        return deprecations_main(rest)
    if command == "demo":
        from .demo import main as demo_main

        return demo_main(rest)
    if command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    if command == "compile":
        from .compile import main as compile_main

        return compile_main(rest)
    parser.parse_args(args)  # reports the unknown command and exits with status 2
    return 2

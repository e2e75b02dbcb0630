"""``bnnsfw compile``: compile the numba backend's kernels for a model ahead of its first run.

Without options it compiles what ``bnnsfw demo`` runs (one epoch of it, with the demo's
batches); with ``--input``, ``--hidden`` and the others, what one training step and one
inference of the demo's kind of model of those sizes run: an LSTM, its last step, a layer norm
and a fully connected head, for each ``--dtype`` and ``--batch`` (float64 has nothing to compile:
the numba backend runs it on ``scipy-blas``'s kernels). The calls run as any
program's first calls do (compile mode ``background``): on ``scipy-blas``'s kernels while a
separate process compiles the compiled kernels and marks them ready; the command waits for
that process and prints what it compiled, how long it took, where the kernels are and the
CPU they were compiled for. A program that later makes calls of the same kinds (the same
sizes, dtypes and thread counts) on this machine runs compiled from its first call.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from typing import Any, Sequence

import numpy as np

from ._options import integer

__all__ = ["main", "parser"]

_DTYPES = {"float32": np.float32, "float64": np.float64}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bnnsfw compile", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=sorted(_DTYPES), action="append",
                   help="a dtype to compile for; repeat for several (default: float32; float64 runs "
                        "uncompiled, so it has nothing to compile)")
    p.add_argument("--input", type=integer(1), help="the LSTM's input size (default: the demo's model)")
    p.add_argument("--hidden", type=integer(1), help="its hidden size (default: 32)")
    p.add_argument("--layers", type=integer(1), help="its number of layers (default: 2)")
    p.add_argument("--seq", type=integer(1), help="the sequence length (default: 32)")
    p.add_argument("--batch", type=integer(1), action="append",
                   help="a batch size; repeat for several (default: 64)")
    return p


def _model_calls(opts: argparse.Namespace, compiled_dtype: np.dtype) -> None:
    """One training step and one inference of the demo's kind of model of the given sizes, in
    each dtype asked for that has compiled kernels."""
    from ..losses import MeanSquaredError
    from .demo import build_model

    rng = np.random.default_rng(0)
    input_size, hidden = opts.input or 1, opts.hidden or 32
    for dtype in opts.dtype or ["float32"]:
        if np.dtype(dtype) != compiled_dtype:
            continue
        model = build_model(input_size=input_size, hidden_size=hidden, output_size=1,
                            num_layers=opts.layers or 2, backend="numba", dtype=_DTYPES[dtype])
        for batch in opts.batch or [64]:
            x = rng.standard_normal((opts.seq or 32, batch, input_size)).astype(dtype)
            y = np.zeros((batch, 1), dtype)
            step = MeanSquaredError().apply(model.apply(x, training=True), y)
            model.apply_backward(step.gradient)
            model(x)
        model.close()


def run(opts: argparse.Namespace, *, out: Any = None) -> int:
    """Make the calls, wait for their kernels, report; 0 when every kind compiled."""
    out = sys.stdout if out is None else out
    from .. import backends

    backend: Any = backends.get_backend("numba")
    before = backend.compile_status()
    backends.set_compile_mode("background")
    start = time.perf_counter()
    try:
        given = (opts.input, opts.hidden, opts.layers, opts.seq, opts.batch, opts.dtype)
        if any(v is not None for v in given):
            _model_calls(opts, backend.compiled_dtype)
            what = "the model of the given sizes"
        else:
            from .demo import run_forecast

            run_forecast(epochs=1, backend="numba", out=io.StringIO())
            what = "bnnsfw demo's model"
        while backend.compile_status().pending:
            time.sleep(0.1)
    finally:
        backends.set_compile_mode(None)
    seconds = time.perf_counter() - start
    status = backend.compile_status()
    for dtype in sorted(set(opts.dtype or ()) - {backend.compiled_dtype.name}):
        print(f"{dtype}: nothing to compile (the numba backend runs it on scipy-blas's kernels)", file=out)
    print(f"compiled for {what}: {status.ready - before.ready} new kinds of call ready ({status.ready} in "
          f"all) in {seconds:.1f} s", file=out)
    print(f"kernels: {status.cache} (markers in {status.markers.name}/); CPU {status.cpu}, "
          f"Numba {status.numba_version}", file=out)
    for reason in status.failed:
        print(f"failed: {reason}", file=out)
    return 1 if status.failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``bnnsfw compile``; returns the exit status."""
    opts = parser().parse_args(argv)
    from .. import backends

    if "numba" not in backends.available_backends():
        print("bnnsfw compile: the numba backend is not available here (Numba does not import); "
              "nothing to compile", file=sys.stderr)
        return 1
    return run(opts)

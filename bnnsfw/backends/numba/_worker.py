"""The process that compiles the numba kernels in the background (:mod:`._tiers`)."""

from __future__ import annotations

from pathlib import Path

from . import NumbaBackend
from ._tiers import run_jobs

__all__ = ["main"]


def main(paths: list[str]) -> int:
    """Replay the calls of the job files ``paths`` with the compiled kernels; 1 when one failed."""
    return 1 if run_jobs(NumbaBackend(), [Path(p) for p in paths]) else 0

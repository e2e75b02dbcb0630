"""Option types and checks shared by the subcommands: every misuse is a usage error.

argparse turns an ``ArgumentTypeError`` raised by a ``type=`` function into the one-line
message ``bnnsfw demo: error: argument --seed: must be an integer >= 0; got -1`` and exit
status 2; :func:`check_output_path` gives the same for an output file that could not be
written, before any work starts.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable


def integer(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}; got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}; got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def backend_names() -> list[str]:
    """The values ``--backend`` accepts: every registered backend, and ``auto``."""
    from .. import backends

    return [*backends.available_backends(), "auto"]


def check_output_path(parser: argparse.ArgumentParser, option: str, path: str) -> None:
    """Refuse, as a usage error, an output ``path`` that cannot be written: a missing or
    read-only folder, or an existing folder in its place."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"argument {option}: {path!r} is a folder; give a file name")
    if not os.path.isdir(folder):
        parser.error(f"argument {option}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        parser.error(f"argument {option}: the folder {folder!r} is not writable")

"""The compile mode: whether a call of the compiled backend may wait for the compiler.

``background`` (the default): a call whose compiled kernels are not on disk yet runs on
kernels that need no compiler while a separate process compiles them; ``wait``: it compiles
in the calling process first; ``off``: nothing is compiled. ``BNNSFW_COMPILE`` sets it for a
process, :func:`set_compile_mode` from Python (``docs/performance.md``).
"""

from __future__ import annotations

import os

from ...errors import InvalidParameterError, must_be

__all__ = ["MODES", "ENVIRONMENT", "compile_mode", "set_compile_mode"]

#: The compile modes, the first the default.
MODES = ("background", "wait", "off")
#: The environment variable that sets the compile mode.
ENVIRONMENT = "BNNSFW_COMPILE"

_mode: str | None = None


def compile_mode() -> str:
    """The compile mode in force: :func:`set_compile_mode`'s, else ``BNNSFW_COMPILE``'s, else
    ``"background"``."""
    mode = _mode if _mode is not None else os.environ.get(ENVIRONMENT, MODES[0])
    if mode not in MODES:
        raise InvalidParameterError(must_be(ENVIRONMENT, f"one of {', '.join(MODES)}", mode))
    return mode


def set_compile_mode(mode: str | None) -> None:
    """Set the compile mode for this process (``None``: back to ``BNNSFW_COMPILE``, else the
    default)."""
    global _mode
    if mode is not None and mode not in MODES:
        raise InvalidParameterError(must_be("set_compile_mode(mode)", f"one of {', '.join(MODES)} or None",
                                            mode))
    _mode = mode

"""The BLAS thread pools of the process, as threadpoolctl sees them.

One ``threadpoolctl.ThreadpoolController`` serves every thread limit bnnsfw applies (a
layer's ``n_threads``, the normalization kernels' one-thread BLAS); making one scans the
loaded libraries, so it is made once, on first use.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

_controller: Any = None
_lock = threading.Lock()


def blas_controller() -> Any:
    """The shared ``threadpoolctl.ThreadpoolController``."""
    global _controller
    with _lock:
        if _controller is None:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        return _controller


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS held to one thread inside the block: for code that calls BLAS from several threads
    of its own, each of which should not start more."""
    with blas_controller().limit(limits=1, user_api="blas"):
        yield

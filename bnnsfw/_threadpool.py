"""The BLAS thread pools of the process, as threadpoolctl sees them.

One ``threadpoolctl.ThreadpoolController`` serves every thread limit bnnsfw applies (a
layer's ``n_threads``, the normalization kernels' one-thread BLAS); making one scans the
loaded libraries, so it is made once, on first use.
"""

from __future__ import annotations

import threading
from typing import Any

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

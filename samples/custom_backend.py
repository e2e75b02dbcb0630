"""Writing, registering and selecting a backend of your own.

A backend is a strategy object: layers call its ``gemm`` and its fused kernels and never ask
what it is. Subclassing the reference ``NumpyBackend`` and overriding one method is enough;
everything not overridden falls back to the reference. This one counts the matrix products
and the floating-point work a layer asks for. Usage: ``python samples/custom_backend.py``.
"""

from __future__ import annotations

import sys

import numpy as np

import bnnsfw as bf
from bnnsfw.backends import NumpyBackend


class CountingBackend(NumpyBackend):
    """The NumPy backend, counting every matrix product and its multiply-adds."""

    name = "counting"

    def __init__(self) -> None:
        self.products = 0
        self.multiply_adds = 0

    def gemm(self, a, b, out=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
        m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
        n = b.shape[0] if trans_b else b.shape[1]
        self.products += 1
        self.multiply_adds += m * n * k
        return super().gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)


def main(quick: bool = False) -> int:
    bf.register_backend("counting", CountingBackend, replace=True)
    t, n, i, h = (5, 2, 3, 4) if quick else (50, 16, 32, 64)
    params = bf.LSTMParameters.random(input_size=i, hidden_size=h, seed=0)
    x = np.random.default_rng(0).standard_normal((t, n, i)).astype(np.float32)

    with bf.use_backend("counting") as backend:      # layers created here take the backend
        layer = bf.LSTMLayer(params)
    out = layer.apply(x, training=True)
    forward_products = backend.products
    layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
    print(f"LSTM T={t} N={n} I={i} H={h} on backend {layer.backend.name!r}:")
    print(f"  forward : {forward_products} matrix products")
    print(f"  backward: {backend.products - forward_products} matrix products")
    print(f"  total   : {backend.multiply_adds:,} multiply-adds")

    reference = bf.LSTMLayer(params, bf.FilterParameters(backend="numpy")).apply(x).output
    same = np.allclose(layer.apply(x).output, reference)
    print(f"  same output as the numpy backend: {same}")
    layer.close()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))

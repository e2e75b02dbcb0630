"""A backend of your own: override one operation, register it, prove it with the conformance kit.

The reference backend (``NumpyBackend``) carries every operation of the backend contract
(``bnnsfw.backends.contract``). This backend keeps all of them but one: its normalization
forward accumulates the statistics in float64 (one upcast copy of the data, then NumPy's
pairwise sums), which some users prefer for very long float32 rows. Registering it checks it
against the contract; ``bnnsfw.testing.check_backend`` then runs every layer configuration
on it and on the reference and compares every output and gradient. Usage:
``python samples/custom_backend.py [--quick]``.
"""

from __future__ import annotations

import sys

import numpy as np

import bnnsfw as bf
from bnnsfw.backends import NumpyBackend
from bnnsfw.backends.contract import NormalizationForwardRequest, NormalizationForwardResult
from bnnsfw.testing import check_backend


class Float64StatisticsBackend(NumpyBackend):
    """The reference backend, with a normalization forward whose statistics are float64 sums."""

    name = "float64-statistics"

    def normalization_forward(self, request: NormalizationForwardRequest) -> NormalizationForwardResult:
        if not request.centered:  # RMS normalization: leave what this kernel does not serve to the reference
            return super().normalization_forward(request)
        x, dtype = request.x, request.x.dtype
        if request.mean is None or request.variance is None:
            axes = (0, 2, 3) if request.batch_statistics else (2, 3)   # the canonical (N, G, K, S) view
            wide = x.astype(np.float64)
            mean = wide.mean(axis=axes, keepdims=True)
            variance = np.square(wide - mean).mean(axis=axes, keepdims=True)  # biased, as BNNS
        else:  # given (moving) statistics
            mean, variance = request.mean, request.variance
        scale = request.gamma / np.sqrt(variance + request.epsilon)
        np.copyto(request.out, (x - mean) * scale + request.beta, casting="same_kind")
        if not request.activation.is_identity:
            request.activation.forward(request.out, out=request.out)
        return NormalizationForwardResult(output=request.out, mean=np.asarray(mean, dtype),
                                          variance=np.asarray(variance, dtype))


def main(quick: bool = False) -> int:
    bf.register_backend("float64-statistics", Float64StatisticsBackend, replace=True)  # checked here
    report = check_backend("float64-statistics", quick=quick, raise_on_failure=False)
    print(f"backend {report.backend!r}: {report.checked} configurations, {report.compared} arrays compared "
          f"with the reference, {len(report.failures)} disagreements")
    for failure in report.failures:
        print("  -", failure)

    params = bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(4, 8))
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32) + 1000.0
    with bf.use_backend("float64-statistics"):            # layers created here take the backend
        layer = bf.NormalizationLayer(params)
    y = layer.apply(x)
    print(f"layer norm of data offset by 1000 on {layer.backend.name!r}: "
          f"per-sample mean {np.abs(y.mean(axis=(1, 2))).max():.1e}, std {y.std(axis=(1, 2)).mean():.4f}")
    layer.close()
    return 0 if not report.failures else 1


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))

"""Reference (NumPy) kernels of the normalization layer, mixed into every backend.

The layer hands every kernel the same canonical 4-D view of its data, ``(N, G, K, S)``:

==========  ==============================  ===========================  ====================
type        view of ``(N, C, *spatial)``    statistics (reduced over)    gamma / beta
==========  ==============================  ===========================  ====================
batch       ``(N, C, 1, H·W…)``             ``(1, C, 1, 1)`` (N, K, S)   ``(1, C, 1, 1)``
instance    ``(N, C, 1, H·W…)``             ``(N, C, 1, 1)`` (K, S)      ``(1, C, 1, 1)``
group       ``(N, G, C/G, H·W…)``           ``(N, G, 1, 1)`` (K, S)      ``(1, G, C/G, 1)``
layer       ``(N, P, M, 1)``                ``(N, P, 1, 1)`` (K, S)      ``(1, 1, M, 1)``
==========  ==============================  ===========================  ====================

For layer norm ``P`` is the product of the per-sample extents before ``normalization_axis``
and ``M`` that of the normalized ones. Statistics are always constant over ``K`` and ``S``,
gamma and beta always constant over ``N`` and ``S``, so one pair of kernels covers the four
types. Read as a matrix, the view has one row per ``(n, g)`` statistics set (``K·S``
columns), which makes every statistic a row sum.

These are the reference kernels, written for reading: one NumPy operation per step of the
math. The ``scipy-blas`` backend overrides them with cache-blocked, multithreaded kernels
(:mod:`bnnsfw.backends._fast_normalization`) that compute the same quantities.

Precision. Everything stays in the input's dtype: no float64 temporaries on the float32
path. Sums are ``einsum`` row sums and row dot products accumulated in float32; on the
benchmark sizes (up to 65 536 elements per statistics set) the float32 mean is within float32
rounding of the float64 one and the variance within 1e-6 relative, so accumulating in
float64 (measured 1.5-2.5 times slower, for the buffered casts) buys nothing. The variance is
the mean of the *centred* squares, which keeps its precision when ``|mean| >> std``
(``E[x²] − E[x]²`` would not). Sums stay single-threaded on purpose: BLAS matrix-vector
products with a ones vector are faster on an idle machine, but made a whole fwd + bwd about
twice as slow when another process held one of the two cores (spinning BLAS threads).

Passes over memory. NumPy cannot fuse element-wise operations, so each one is a pass; one
that reads an array and writes another costs about twice an in-place one here, so the
kernels centre once, into the output (forward) or a scratch array (backward), and work in
place from there:

- forward, batch statistics: row sums, centre into the output, centred squares (3 passes,
  1 write), then in place ``·rstd·gamma`` and ``+beta`` (2 passes; 3 for layer norm);
- forward, given statistics: ``x·scale`` then ``+shift`` in place (2 passes);
- backward, batch statistics: the statistics again, into scratch (3 passes), two row
  reductions ``Σ dz`` and ``Σ dz·(x − μ)`` (batch, instance and group norm; layer norm needs
  four, around one product ``dz·(x − μ)``), and ``dx = A·dz − B·(x − μ) − C`` (4 passes);
- backward, given statistics: centre, two reductions, ``dx = A·dz`` (4 passes).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .contract import (
    NormalizationBackwardRequest,
    NormalizationBackwardResult,
    NormalizationForwardRequest,
    NormalizationForwardResult,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..activation import Activation

__all__ = ["NormalizationKernels", "reciprocal_std", "reduce_axes"]

Array = np.ndarray


def reciprocal_std(variance: Array, epsilon: float) -> Array:
    """``1 / sqrt(variance + epsilon)`` on the small statistics array (same dtype)."""
    rstd = variance + epsilon
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    return rstd


def _is_small(a: Array, b: Array, target: Array) -> bool:
    """True when ``a · b`` broadcast is much smaller than ``target`` (worth forming)."""
    return math.prod(np.broadcast_shapes(a.shape, b.shape)) * 4 <= target.size


def _scale(target: Array, source: Array, rstd: Array, gamma: Array) -> Array:
    """``target = source · rstd · gamma``; ``source`` may be ``target``.

    ``rstd`` varies over ``(N, G)`` and ``gamma`` over ``(G, K)``: their product is small for
    the channel-wise types (one pass) and data-sized for layer norm (two passes then).
    """
    if _is_small(rstd, gamma, target):
        np.multiply(source, rstd * gamma, out=target)
    else:
        np.multiply(source, rstd, out=target)
        np.multiply(target, gamma, out=target)
    return target


def _scratch(scratch: Sequence[Array], index: int, like: Array) -> Array:
    """The ``index``-th caller-provided scratch array, or a new one shaped like ``like``."""
    if index < len(scratch) and scratch[index].shape == like.shape and scratch[index].dtype == like.dtype:
        return scratch[index]
    return np.empty_like(like)


def _row_sums(matrix: Array) -> Array:
    """Sums of the rows of a C-contiguous 2-D array (one read, vectorised)."""
    return np.einsum("ij->i", matrix)


def _row_dots(a: Array, b: Array) -> Array:
    """``Σ_j a[i, j] · b[i, j]`` for every row ``i``, without a temporary."""
    return np.einsum("ij,ij->i", a, b)


def reduce_axes(batch_statistics: bool) -> tuple[int, ...]:
    """The axes of the canonical view that the statistics are computed over."""
    return (0, 2, 3) if batch_statistics else (2, 3)


class NormalizationKernels:
    """The contract's normalization operations, with the reference kernels.

    Every kernel takes the canonical ``(N, G, K, S)`` view described in this module's
    docstring, C-contiguous, with ``reduce_axes`` either ``(2, 3)`` (per-sample statistics)
    or ``(0, 2, 3)`` (batch statistics), statistics broadcast as ``(1 or N, G, 1, 1)``, and
    gamma and beta as ``(1, 1 or G, K, 1)``, all in one float dtype.
    """

    def normalization_forward(self, request: NormalizationForwardRequest) -> NormalizationForwardResult:
        """The contract's forward, by the reference kernel."""
        r = request
        out, mean, variance = self._normalization_forward(
            r.x, r.gamma, r.beta, epsilon=r.epsilon, reduce_axes=reduce_axes(r.batch_statistics),
            activation=r.activation, out=r.out, mean=r.mean, variance=r.variance, threads=r.threads,
            subtract_mean=r.centered)
        return NormalizationForwardResult(output=out, mean=mean, variance=variance)

    def normalization_backward(self, request: NormalizationBackwardRequest) -> NormalizationBackwardResult:
        """The contract's backward, by the reference kernel."""
        r = request
        dx, dgamma, dbeta = self._normalization_backward(
            r.x, r.dy, r.gamma, r.beta, epsilon=r.epsilon, reduce_axes=reduce_axes(r.batch_statistics),
            activation=r.activation, output=r.output, out=r.out, mean=r.mean, variance=r.variance,
            scratch=r.scratch, threads=r.threads, subtract_mean=r.centered)
        return NormalizationBackwardResult(input=dx, gamma=dgamma, beta=dbeta)

    def normalization_statistics(self, x: Array, reduce_axes: tuple[int, ...], centered: Array, *,
                                 subtract_mean: bool = True) -> tuple[Array, Array]:
        """Mean and biased variance of ``x`` over ``reduce_axes``; writes ``x − mean`` to ``centered``.

        With ``subtract_mean=False`` (RMS normalization) the mean is taken as 0: the
        variance is the mean of the squares and ``centered`` receives ``x`` itself.

        Parameters
        ----------
        x : ndarray, shape (N, G, K, S)
            The data (read only, unless ``centered`` is ``x``).
        reduce_axes : tuple of int
            ``(0, 2, 3)`` for batch statistics, ``(2, 3)`` for per-sample ones.
        centered : ndarray, shape (N, G, K, S), C-contiguous
            Receives ``x − mean``; may be ``x`` itself.

        Returns
        -------
        mean, variance : ndarray, shape (1 or N, G, 1, 1)
        """
        n, g, k, s = x.shape
        across_batch = 0 in reduce_axes
        count = (n if across_batch else 1) * k * s
        shape = (1 if across_batch else n, g, 1, 1)
        rows = x.reshape(n * g, k * s)
        if not subtract_mean:
            if centered is not x:
                np.copyto(centered, x)
            squares = _row_dots(rows, rows).reshape(n, g)
            if across_batch:
                squares = np.add.reduce(squares, axis=0, keepdims=True)
            return np.zeros(shape, x.dtype), (squares / count).reshape(shape)
        sums = _row_sums(rows).reshape(n, g)
        if across_batch:
            sums = np.add.reduce(sums, axis=0, keepdims=True)
        mean = (sums / count).reshape(shape)
        np.subtract(x, mean, out=centered)
        flat = centered.reshape(rows.shape)
        squares = _row_dots(flat, flat).reshape(n, g)
        if across_batch:
            squares = np.add.reduce(squares, axis=0, keepdims=True)
        variance = (squares / count).reshape(shape)
        return mean, variance

    def _normalization_forward(
        self,
        x: Array,
        gamma: Array,
        beta: Array,
        *,
        epsilon: float,
        reduce_axes: tuple[int, ...],
        activation: "Activation",
        out: Array,
        mean: Array | None = None,
        variance: Array | None = None,
        threads: int = 0,
        subtract_mean: bool = True,
    ) -> tuple[Array, Array, Array]:
        """``out = act(gamma · (x − mean) / sqrt(variance + epsilon) + beta)``.

        Parameters
        ----------
        x : ndarray, shape (N, G, K, S)
            Input in the canonical view.
        gamma, beta : ndarray, shape (1, 1 or G, K, 1)
            Scale and shift.
        epsilon : float
            Added to the variance.
        reduce_axes : tuple of int
            Axes the statistics are computed over (unused when ``mean`` is given).
        activation : Activation
            Per-element activation applied last (the identity skips the pass).
        out : ndarray, shape (N, G, K, S), C-contiguous
            Output buffer; may be ``x`` itself (in place).
        mean, variance : ndarray, shape (1, G, 1, 1), optional
            Statistics to use (moving statistics in inference); computed from ``x`` when
            ``None``.
        threads : int
            Threads the kernel may use (``FilterParameters.n_threads``; 0: the backend's
            default). The reference kernels run on the calling thread and ignore it.
        subtract_mean : bool
            False for RMS normalization: the mean is 0 and the variance the mean of squares.

        Returns
        -------
        out, mean, variance : ndarray
            The output and the statistics used (shape ``(1 or N, G, 1, 1)``).
        """
        if mean is None or variance is None:
            mean, variance = self.normalization_statistics(x, reduce_axes, out, subtract_mean=subtract_mean)
            rstd = reciprocal_std(variance, epsilon)
            _scale(out, out, rstd, gamma)
            np.add(out, beta, out=out)
        else:
            # Constant statistics: out = x · scale + (beta − mean · scale), no centring pass.
            rstd = reciprocal_std(variance, epsilon)
            scale = rstd * gamma
            np.multiply(x, scale, out=out)
            np.add(out, beta - mean * scale, out=out)
        if not activation.is_identity:
            activation.forward(out, out=out)
        return out, mean, variance

    def _normalization_backward(
        self,
        x: Array,
        dy: Array,
        gamma: Array,
        beta: Array,
        *,
        epsilon: float,
        reduce_axes: tuple[int, ...],
        activation: "Activation",
        output: Array | None = None,
        out: Array | None = None,
        mean: Array | None = None,
        variance: Array | None = None,
        scratch: Sequence[Array] = (),
        threads: int = 0,
        subtract_mean: bool = True,
    ) -> tuple[Array, Array, Array]:
        """Gradients of the forward with respect to ``x``, ``gamma`` and ``beta``.

        With ``mean``/``variance`` given the statistics are constants (moving statistics in
        inference): ``dx = dz · gamma / sqrt(variance + epsilon)``. Otherwise they are the
        statistics of ``x`` over ``reduce_axes`` and the gradient flows through them too:
        ``dx = rstd · (γ·dz − a/m − x̂·b/m)`` with ``a = Σ γ·dz`` and ``b = Σ γ·dz·x̂`` over
        each statistics set of ``m`` elements. ``dz`` is ``dy`` times the activation's
        derivative, taken from ``output`` when the activation allows it, else from the
        recomputed pre-activation. Without a mean (``subtract_mean=False``, RMS normalization)
        the ``a`` term drops out: ``dx = rstd · (γ·dz − x̂·b/m)``.

        Parameters
        ----------
        x, dy : ndarray, shape (N, G, K, S)
            Forward input and gradient of the loss with respect to the forward output.
        gamma, beta : ndarray, shape (1, 1 or G, K, 1)
        epsilon, reduce_axes, activation :
            As for :meth:`_normalization_forward`.
        output : ndarray, shape (N, G, K, S), optional
            The forward output (needed for an activation whose derivative it gives).
        out : ndarray, shape (N, G, K, S), C-contiguous, optional
            Receives ``dx``; may be ``dy`` itself. Must not overlap ``x`` or ``output``.
        mean, variance : ndarray, shape (1, G, 1, 1), optional
            Constant statistics, as in the forward.
        scratch : sequence of ndarray
            Up to two C-contiguous arrays shaped like ``x`` that the kernel may overwrite
            (reused workspaces); missing ones are allocated.
        threads : int
            As for :meth:`_normalization_forward`.

        Returns
        -------
        dx : ndarray, shape (N, G, K, S)
        dgamma, dbeta : ndarray, shaped like ``gamma``
        """
        n, g, k, s = x.shape
        centered = _scratch(scratch, 0, x)
        if mean is not None and variance is not None:
            constant = True
            np.subtract(x, mean, out=centered)
        else:
            constant = False
            mean, variance = self.normalization_statistics(x, reduce_axes, centered,
                                                           subtract_mean=subtract_mean)
        rstd = reciprocal_std(variance, epsilon)
        if out is None:
            out = np.empty_like(x)
        dz = self._normalization_dz(dy, centered, rstd, gamma, beta, activation, output, out, scratch)
        if not constant and s == 1 and gamma.shape[1] == 1 and 0 not in reduce_axes:
            return self._normalization_backward_rows(dz, centered, rstd, gamma, out, scratch,
                                                     subtract_mean=subtract_mean)

        # Batch, instance and group norm: gamma and the statistics are constant along each
        # row of S positions, so two row reductions carry everything to small arrays.
        rows = (n * g * k, s)
        dz_rows, centered_rows = dz.reshape(rows), centered.reshape(rows)
        if s > 1:
            t1 = _row_sums(dz_rows).reshape(n, g, k)
            t2 = _row_dots(dz_rows, centered_rows).reshape(n, g, k)
        else:
            t1 = dz.reshape(n, g, k)  # a view of dz: consumed before out is written
            t2 = np.multiply(dz, centered).reshape(n, g, k)
        rstd3 = rstd[..., 0]
        t2 *= rstd3  # Σ_S dz · x̂
        gamma3 = gamma[..., 0]
        gamma_axes = tuple(i for i in (0, 1) if gamma3.shape[i] == 1)
        dbeta = np.add.reduce(t1, axis=gamma_axes, keepdims=True).reshape(gamma.shape)
        dgamma = np.add.reduce(t2, axis=gamma_axes, keepdims=True).reshape(gamma.shape)

        if constant:
            _scale(out, dz, rstd, gamma)
            return out, dgamma, dbeta

        # dx = γ·rstd·dz − (x − μ)·rstd²·b/m − rstd·a/m, with a, b summed per statistics set.
        count = (n if 0 in reduce_axes else 1) * k * s
        stat_axes = (0, 2) if 0 in reduce_axes else (2,)
        a = np.add.reduce(t1 * gamma3, axis=stat_axes, keepdims=True)[..., None]
        b = np.add.reduce(t2 * gamma3, axis=stat_axes, keepdims=True)[..., None]
        a *= rstd / count
        b *= rstd * rstd / count
        _scale(out, dz, rstd, gamma)  # every read of dz is done: out may be dz
        np.multiply(centered, b, out=centered)
        np.subtract(out, centered, out=out)
        if subtract_mean:
            np.subtract(out, a, out=out)
        return out, dgamma, dbeta

    def _normalization_backward_rows(self, dz: Array, centered: Array, rstd: Array, gamma: Array,
                                     out: Array, scratch: Sequence[Array], *,
                                     subtract_mean: bool = True) -> tuple[Array, Array, Array]:
        """Layer norm: statistics per row, gamma per column of the ``(N·P, M)`` matrix.

        ``a = dz @ γ``, ``dβ = 1 @ dz``, and with ``p = dz · (x − μ)``: ``b = rstd · (p @ γ)``,
        ``dγ = rstd @ p``; then ``dx = rstd · (γ·dz − a/m) − (x − μ)·rstd²·b/m`` (without the
        ``a/m`` term for RMS normalization, ``subtract_mean=False``, where μ = 0).
        """
        n, g, m, _ = dz.shape
        rows = (n * g, m)
        dz2, centered2, out2 = dz.reshape(rows), centered.reshape(rows), out.reshape(rows)
        gamma1 = gamma.reshape(m)
        rstd1 = rstd.reshape(n * g)
        a = np.einsum("ij,j->i", dz2, gamma1)
        dbeta = np.einsum("ij->j", dz2)
        product = _scratch(scratch, 1, dz).reshape(rows) if np.may_share_memory(out, dz) else out2
        np.multiply(dz2, centered2, out=product)
        b = np.einsum("ij,j->i", product, gamma1)
        dgamma = np.einsum("ij,i->j", product, rstd1)
        a *= rstd1 / m
        b *= rstd1 * rstd1 * rstd1 / m
        np.multiply(dz2, gamma1, out=out2)  # product (possibly in out) is consumed
        np.multiply(out2, rstd1[:, None], out=out2)
        np.multiply(centered2, b[:, None], out=centered2)
        np.subtract(out2, centered2, out=out2)
        if subtract_mean:
            np.subtract(out2, a[:, None], out=out2)
        return out, dgamma.reshape(gamma.shape), dbeta.reshape(gamma.shape)

    def _normalization_dz(self, dy: Array, centered: Array, rstd: Array, gamma: Array, beta: Array,
                          activation: "Activation", output: Array | None, out: Array,
                          scratch: Sequence[Array]) -> Array:
        """``dy · act'(z)`` written to ``out`` (or ``dy`` itself for the identity)."""
        if activation.is_identity:
            return dy
        if output is not None and activation.derivative_from_output:
            derivative = activation.derivative(y=output)
        else:
            # The pre-activation, recomputed in out unless out is dy (still to be read).
            z = _scratch(scratch, 1, out) if np.may_share_memory(out, dy) else out
            _scale(z, centered, rstd, gamma)
            np.add(z, beta, out=z)
            derivative = activation.derivative(x=z)
        return np.multiply(dy, derivative, out=out)

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
(:mod:`bnnsfw.backends.scipy_blas._normalization`) that compute the same quantities.

Precision. Everything stays in the input's dtype: no float64 temporaries on the float32
path. Sums are ``einsum`` row sums and row dot products accumulated in float32; on the
benchmark sizes (up to 65 536 elements per statistics set) the float32 mean is within float32
rounding of the float64 one and the variance within 1e-6 relative, so accumulating in
float64 (measured 1.5-2.5 times slower, for the buffered casts) buys nothing. The variance is
the mean of the *centred* squares, which keeps its precision when ``|mean| >> std``
(``E[x²] − E[x]²`` would not). Sums stay single-threaded on purpose: BLAS matrix-vector
products with a ones vector are faster on an idle machine, but made a whole fwd + bwd about
twice as slow when another process held one of the two cores (spinning BLAS threads).

Large values. A variance below 2⁸⁰ in float32 (2⁶⁰⁰ in float64) means that no sum, centred
square or power of ``rstd`` below overflowed or underflowed; a forward in place, which centres
over its input, checks ``Σx²`` of every set against the same bound first (one read pass). The
statistics sets above it are recomputed from the input multiplied by a power of two that brings
their largest element to 2⁴⁰ ≈ 1.1e12 (2³⁰⁰) —
exact, so the same formula then gives the same normalized values — with ``ε`` scaled alike and
the reciprocal standard deviation taken in float64 (``ε·s²`` is far below float32's range). Layer norm of
float32 data up to ±3.4e38 is therefore finite and right; the statistics returned (the
variance of such data is about 1e77) saturate to infinity where the dtype cannot hold them.
The backward scales the input gradient back (``dx = s · dx_s``); the gamma and beta gradients
do not depend on the scale.

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

from ..contract import (
    NormalizationBackwardRequest,
    NormalizationBackwardResult,
    NormalizationForwardRequest,
    NormalizationForwardResult,
)

if TYPE_CHECKING:  # pragma: no cover
    from ...activation import Activation

__all__ = ["NormalizationKernels", "reciprocal_std", "reduce_axes"]

Array = np.ndarray


def reciprocal_std(variance: Array, epsilon: float) -> Array:
    """``1 / sqrt(variance + epsilon)`` on the small statistics array (same dtype)."""
    rstd = variance + epsilon
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    return rstd


def _unscaled(dx: Array, scale: Array | None) -> Array:
    """The input gradient of ``x`` from that of ``x · scale``: ``dx = scale · dx_scaled``."""
    if scale is not None:
        np.multiply(dx, scale, out=dx)
    return dx


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


#: The exponent E a large statistics set's biggest element is scaled to, per item size. With
#: every |x| below 2^E: sums and centred squares stay finite (for fewer than 2⁴⁶ elements in
#: float32, 2⁴⁰⁰ in float64), ``rstd ≥ 2^−E`` so the backward's ``rstd³`` stays a normal number,
#: and ``2^E / sqrt(ε)`` stays far below the largest value.
_SCALED_EXPONENT = {4: 40, 8: 300}


#: 2^2E per item size: a variance (or ``Σx²``) below it means no value of the set needs scaling.
_LIMITS = {size: 2.0 ** (2 * exponent) for size, exponent in _SCALED_EXPONENT.items()}


def _limit(dtype: np.dtype) -> float:
    return _LIMITS[dtype.itemsize]


def set_scale(x: Array, reduce_axes: tuple[int, ...]) -> Array:
    """One power of two per statistics set, shaped like the statistics, that brings each set's
    largest element to about 2^E (``_SCALED_EXPONENT``: 2⁴⁰ ≈ 1.1e12 in float32, 2³⁰⁰ in
    float64) — 1 for the sets below it, and for NaN and infinity, which propagate as before."""
    with np.errstate(invalid="ignore"):
        largest = np.max(np.abs(x), axis=reduce_axes, keepdims=True)
    exponent = np.frexp(largest)[1]
    shift = np.clip(exponent - _SCALED_EXPONENT[x.dtype.itemsize], 0, None)
    return np.ldexp(np.ones_like(largest), -shift)


def overflow_scale(x: Array, reduce_axes: tuple[int, ...]) -> Array | None:
    """``None`` when every element of ``x`` is below 2^E in magnitude, else :func:`set_scale`.

    ``Σx²`` per set (one read) decides, before anything is written: below 2^2E, every element
    is below 2^E. NaN and infinity fail the test (and get the scale 1).
    """
    n, g, k, s = x.shape
    rows = x.reshape(n * g, k * s)
    squares = _row_dots(rows, rows).reshape(n, g)
    if 0 in reduce_axes:
        squares = np.add.reduce(squares, axis=0, keepdims=True)
    if bool(np.all(squares < _limit(x.dtype))):
        return None
    return set_scale(x, reduce_axes)


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

    def _statistics(self, x: Array, reduce_axes: tuple[int, ...], centered: Array, epsilon: float, *,
                    subtract_mean: bool = True) -> tuple[Array, Array, Array, Array | None]:
        """Mean, biased variance and ``1/sqrt(variance + ε)`` of ``x``, with ``x − mean`` in
        ``centered``; through :func:`set_scale` when values are large enough for a statistic to
        overflow, or ``rstd³`` to underflow (a variance beyond 2^2E says so afterwards; when
        ``centered`` is ``x`` itself, :func:`overflow_scale` says so before).

        Returns ``(mean, variance, rstd, scale)``: with a ``scale`` (one power of two per set,
        else ``None``), ``centered`` and ``rstd`` are those of ``x · scale`` (their product, the
        normalized value, is the same) and mean and variance are unscaled.
        """
        if np.may_share_memory(centered, x):  # centring would overwrite x: decide before it
            scale = overflow_scale(x, reduce_axes)
            if scale is None:
                mean, variance = self.normalization_statistics(x, reduce_axes, centered,
                                                               subtract_mean=subtract_mean)
                return mean, variance, reciprocal_std(variance, epsilon), None
        else:  # decide from the statistics themselves (x is still intact if they say no)
            mean, variance = self.normalization_statistics(x, reduce_axes, centered,
                                                           subtract_mean=subtract_mean)
            if variance.max() < _limit(x.dtype):  # NaN compares False
                return mean, variance, reciprocal_std(variance, epsilon), None
            scale = set_scale(x, reduce_axes)
        mean_s, variance_s = self.normalization_statistics(x * scale, reduce_axes, centered,
                                                           subtract_mean=subtract_mean)
        wide_scale, wide_variance = scale.astype(np.float64), variance_s.astype(np.float64)
        with np.errstate(over="ignore"):
            mean = (mean_s / wide_scale).astype(x.dtype)
            variance = (wide_variance / (wide_scale * wide_scale)).astype(x.dtype)
        # A constant set (centred values exactly 0) needs no scaling: its rstd is 1/sqrt(ε) as is.
        scale = np.where(variance_s == 0, np.ones_like(scale), scale)
        wide_scale = scale.astype(np.float64)
        rstd = 1.0 / np.sqrt(wide_variance + epsilon * wide_scale * wide_scale)
        # Bounded so that the backward's rstd³ stays finite: only a set whose centred values are
        # rounding noise of its mean comes near the bound.
        rstd = np.minimum(rstd, 2.0 ** (np.finfo(x.dtype).maxexp // 3 - 4)).astype(x.dtype)
        return mean, variance, rstd, scale

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
            mean, variance, rstd, _ = self._statistics(x, reduce_axes, out, epsilon,
                                                       subtract_mean=subtract_mean)
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
        scale = None
        if mean is not None and variance is not None:
            constant = True
            np.subtract(x, mean, out=centered)
            rstd = reciprocal_std(variance, epsilon)
        else:
            constant = False
            mean, variance, rstd, scale = self._statistics(x, reduce_axes, centered, epsilon,
                                                           subtract_mean=subtract_mean)
        if out is None:
            out = np.empty_like(x)
        dz = self._normalization_dz(dy, centered, rstd, gamma, beta, activation, output, out, scratch)
        if not constant and s == 1 and gamma.shape[1] == 1 and 0 not in reduce_axes:
            dx, dgamma, dbeta = self._normalization_backward_rows(dz, centered, rstd, gamma, out, scratch,
                                                                  subtract_mean=subtract_mean)
            return _unscaled(dx, scale), dgamma, dbeta

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
        return _unscaled(out, scale), dgamma, dbeta

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

    # --- some statistics sets only (the compiled and blocked kernels hand over the sets whose
    # --- values are too large for their fast paths) -------------------------------------------

    @staticmethod
    def _set_views(x: Array, gamma: Array, beta: Array, batch_statistics: bool,
                   sets: Array) -> tuple[Array, Array, Array, tuple[int, ...]]:
        """Copies of the statistics sets ``sets`` of ``x`` as a canonical view of their own,
        with their gamma and beta: channels ``g`` for batch statistics (``(N, len(sets), K,
        S)``); for per-sample statistics, rows ``n·G + g`` — as ``(len(sets), 1, K, S)`` when
        every row has the same gamma (layer norm), else as ``(1, len(sets), K, S)`` with each
        row's own gamma and beta."""
        n, g, k, s = x.shape
        if batch_statistics:
            return x[:, sets], gamma[:, sets], beta[:, sets], (0, 2, 3)
        if gamma.shape[1] == 1:  # the same gamma for every row
            return x.reshape(n * g, 1, k, s)[sets], gamma, beta, (2, 3)
        rows = x.reshape(1, n * g, k, s)[:, sets]
        gamma_rows = np.broadcast_to(gamma, (n, g, k, 1)).reshape(1, n * g, k, 1)[:, sets]
        beta_rows = np.broadcast_to(beta, (n, g, k, 1)).reshape(1, n * g, k, 1)[:, sets]
        return rows, gamma_rows, beta_rows, (2, 3)

    @staticmethod
    def _of_sets(a: Array, gamma: Array, batch_statistics: bool, sets: Array) -> Array:
        """The elements of the sets ``sets`` of the canonical view ``a``, as :meth:`_set_views` lays
        them out (a view when the sets are a slice, else a copy); assignable through ``[...]``."""
        n, g, k, s = a.shape
        if batch_statistics:
            return a[:, sets]
        if gamma.shape[1] == 1:
            return a.reshape(n * g, 1, k, s)[sets]
        return a.reshape(1, n * g, k, s)[:, sets]

    @staticmethod
    def _store_sets(target: Array, value: Array, gamma: Array, batch_statistics: bool, sets: Array) -> None:
        n, g, k, s = target.shape
        if batch_statistics:
            target[:, sets] = value
        elif gamma.shape[1] == 1:
            target.reshape(n * g, 1, k, s)[sets] = value
        else:
            target.reshape(1, n * g, k, s)[:, sets] = value

    def normalization_forward_sets(self, x: Array, gamma: Array, beta: Array, *, epsilon: float,
                                   batch_statistics: bool, activation: "Activation", out: Array,
                                   sets: Array) -> tuple[Array, Array]:
        """The reference forward on the statistics sets ``sets`` only (row indices ``n·G + g``
        for per-sample statistics, channels for batch statistics): their elements of ``out``
        are written, the others untouched. Returns their means and variances (1-D)."""
        xs, gs, bs, axes = self._set_views(x, gamma, beta, batch_statistics, sets)
        ys, mean, variance = self._normalization_forward(xs, gs, bs, epsilon=epsilon, reduce_axes=axes,
                                                         activation=activation, out=np.empty_like(xs))
        self._store_sets(out, ys, gamma, batch_statistics, sets)
        return mean.reshape(-1), variance.reshape(-1)

    def normalization_backward_sets(self, x: Array, dy: Array, gamma: Array, beta: Array, *, epsilon: float,
                                    batch_statistics: bool, activation: "Activation", output: Array | None,
                                    out: Array, sets: Array) -> tuple[Array, Array]:
        """The reference backward on the statistics sets ``sets`` only: their elements of
        ``out`` (dx) are written, the others untouched. Returns the gamma and beta gradients
        those sets contribute, shaped like ``gamma``, to add to the others'."""
        xs, gs, bs, axes = self._set_views(x, gamma, beta, batch_statistics, sets)
        dx, dgamma_sets, dbeta_sets = self._normalization_backward(
            xs, np.ascontiguousarray(self._of_sets(dy, gamma, batch_statistics, sets)), gs, bs,
            epsilon=epsilon, reduce_axes=axes, activation=activation,
            output=None if output is None else np.ascontiguousarray(
                self._of_sets(output, gamma, batch_statistics, sets)), out=None)
        self._store_sets(out, dx, gamma, batch_statistics, sets)
        if batch_statistics or gamma.shape[1] == 1:  # one gamma per channel, or shared by every row
            dgamma, dbeta = np.zeros_like(gamma), np.zeros_like(gamma)
            if batch_statistics:
                dgamma[:, sets], dbeta[:, sets] = dgamma_sets, dbeta_sets
                return dgamma, dbeta
            return dgamma_sets, dbeta_sets
        groups = sets % x.shape[1]
        k = x.shape[2]
        dgamma, dbeta = np.zeros_like(gamma), np.zeros_like(gamma)
        np.add.at(dgamma[0, :, :, 0], groups, dgamma_sets.reshape(len(sets), k))
        np.add.at(dbeta[0, :, :, 0], groups, dbeta_sets.reshape(len(sets), k))
        return dgamma, dbeta

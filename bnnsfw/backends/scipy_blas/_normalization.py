"""Cache-blocked, multithreaded normalization kernels: the fast path of the ``scipy-blas`` backend.

The reference kernels (:mod:`bnnsfw.backends._shared.normalization_kernels`) make one pass over the
whole array per NumPy operation (five for an instance-norm forward, nine for its backward),
every pass streaming the data through memory on one core. These kernels compute the same
quantities block by block. The canonical ``(N, G, K, S)`` view is read as ``N·G`` rows, one
per statistics set, of ``L = K·S`` elements, and a block is a range of whole rows. The first
operation on a block reads it from memory and the last writes it back; the ones in between
work on a 64-byte-aligned per-thread workspace that stays in cache. The blocks go to a small
persistent thread pool (NumPy releases the GIL inside its loops), every thread, the caller's
included, taking the next block until none is left.

- Per-sample statistics (instance, group and layer norm) are complete within a block: the
  forward and the backward each take one sweep over the blocks.
- Batch statistics reduce over the batch, so batch norm takes two sweeps. The first computes
  per row the mean ``m_r`` and the centred sum of squares ``M2_r`` (and in the backward
  ``Σ dz`` and ``Σ dz·(x − m_r)``); the caller combines them per channel exactly,
  ``M2 = Σ M2_r + L·Σ (m_r − μ)²`` and ``Σ dz·(x − μ) = Σ [Σ dz·(x − m_r) + (m_r − μ)·Σ dz]``
  (Chan, Golub and LeVeque's pairwise update), so the variance keeps the precision of the
  centred two-pass formula. The second sweep normalizes. An activation whose derivative
  needs the pre-activation adds a sweep to the backward (``dz`` needs the batch statistics).
- Given (moving) statistics take one sweep, as ``x · scale + shift`` like the reference.
  The instance- and group-norm forward does the same once the block's statistics are known,
  taking them from ``Σx`` and ``Σx²`` when no row's mean is large against its spread
  (``_plain_moments``); otherwise it centres the block first.
- Layer norm's backward does its reductions as BLAS matrix-vector products: the row sums
  ``Σ_j γ·dz`` and ``Σ_j γ·dz·(x − μ)`` and the column sums behind ``dγ`` and ``dβ`` (which
  NumPy's ``einsum`` and ``add.reduce(axis=0)`` did at a third of the speed). While the kernels
  run, BLAS is limited to one thread (``_one_blas_thread``).

Large values. The blocked kernels sum in the data's dtype; when a block's (or, for batch norm,
a channel's) statistics come out non-finite — values beyond about 1.8e19 in float32, or NaN —
or, in the backward, so large that ``rstd³`` would underflow (variances beyond 2⁸⁰), that
block's rows, or the whole batch-norm call, go to the reference kernels, which scale such
sets by a power of two first (see :mod:`bnnsfw.backends._shared.normalization_kernels`). The check
costs nothing on ordinary data: the statistics are computed anyway, and nothing of a block is
written before them.

Results are reproducible: each block writes its own slots of the partial results and the
calling thread combines them in row or block order, so for a given block size the threads
that ran the blocks make no difference to a single bit. The block size depends on the
thread count (below); only layer norm's gamma and beta gradients, summed per block, depend
on it, through the order of their float additions.

What measurements on a 2-vCPU machine said:

- On one thread, blocks of 2¹⁶ elements (256 KiB of float32) are best: the workspaces and
  the block of each array stay in L2.
- With several threads, larger blocks (up to 2¹⁹ elements) are best. Every NumPy call
  releases and retakes the GIL; when the other thread holds it, taking it back means
  sleeping until woken, tens of microseconds on a virtual machine, and a block makes about
  fifteen calls. Short blocks then lose more to those hand-overs than they gain in cache.
- When a row is shorter than NumPy's ufunc buffer (8192 elements), NumPy copies a broadcast
  per-row operand (``x − mean[:, None]``) through the buffer, which makes those operations
  about twice as slow as a plain product. The kernels set the buffer to
  ``_BUFFER_ELEMENTS`` while they run (restored afterwards), which avoids the copy.
- NumPy's vectorised loops store whole 64-byte vectors; ``out = a + b`` into an array that
  starts 16 bytes past a cache line (what ``malloc`` returns for large arrays, so most
  ``np.empty`` outputs) is about twice as slow as into an aligned one. Workspaces and the
  input gradient the kernel allocates are aligned; where the caller's output is not, the
  layer-norm forward adds in place and copies instead.

Shapes the blocking does not help (channel-wise types without spatial extent, whose rows
have one element) and inputs smaller than ``normalization_min_elements`` go to the reference
kernels.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from ..._compat import vecdot
from ..._threadpool import blas_limit, usable_cores
from .._shared.normalization_kernels import NormalizationKernels, reciprocal_std

if TYPE_CHECKING:  # pragma: no cover
    from ...activation import Activation

__all__ = ["BlockedNormalizationKernels", "default_threads"]

Array = np.ndarray

_BUFFER_ELEMENTS = 256
_ALIGNMENT = 64
_KEEP_WORKSPACE_ELEMENTS = 1 << 20  # per-thread workspaces up to this size are kept between calls
_PLAIN_MOMENTS_RATIO = 4.0  # rows with mean² above this many variances need the centred formula
#: Variances from which the backward's ``rstd²`` and ``rstd³`` would leave the normal numbers:
#: such blocks (values beyond about 1e12 in float32) go to the reference kernels, which scale them.
_BACKWARD_VARIANCE = {4: 2.0**80, 8: 2.0**600}

_CPUS = usable_cores()


def default_threads() -> int:
    """Threads a kernel uses when the layer sets none: the CPUs available, at most 8.

    The kernels are memory-bound and run a little Python per block under the GIL, so more
    threads than that stop paying.
    """
    return min(_CPUS, 8)


def _thread_count(requested: int) -> int:
    """``FilterParameters.n_threads`` (0: the default) capped at the CPUs available."""
    return default_threads() if requested <= 0 else min(requested, _CPUS)


# --- the thread pool and the per-thread workspaces ------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pool_pid = -1
_pool_lock = threading.Lock()
_local = threading.local()


def _executor() -> ThreadPoolExecutor:
    """The process's worker pool (recreated in a forked child, whose copy has no threads)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=max(1, _CPUS - 1),
                                       thread_name_prefix="bnnsfw-normalization")
            _pool_pid = os.getpid()
        return _pool


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Run BLAS on one thread inside the block (concurrent kernels share one limit).

    The kernels call BLAS (gemv) on blocks from several threads at once. Left to itself,
    OpenBLAS splits each of those small calls over its own threads, which then spin waiting
    for work and take the cores from the kernel's threads: a layer-norm backward took more
    than ten times as long. The limit is process-wide (OpenBLAS has no per-call one); it is
    shared with every other limit bnnsfw applies (:func:`bnnsfw._threadpool.blas_limit`).
    """
    with blas_limit(1):
        yield


def _aligned_empty(size: int, dtype: np.dtype) -> Array:
    """``np.empty(size)`` starting on a 64-byte boundary.

    NumPy's vectorised loops store whole 64-byte vectors; into an array that starts 16 bytes
    past a cache line (what ``malloc`` returns for large arrays) every store straddles two
    lines, which makes ``out = a · b`` about twice as slow here.
    """
    dtype = np.dtype(dtype)
    raw = np.empty(size * dtype.itemsize + _ALIGNMENT, np.uint8)
    skip = -raw.ctypes.data % _ALIGNMENT
    return raw[skip:skip + size * dtype.itemsize].view(dtype)


def _is_aligned(a: Array) -> bool:
    return a.ctypes.data % _ALIGNMENT == 0


def aligned_empty_like(a: Array) -> Array:
    """An uninitialised C-ordered array like ``a``, 64-byte aligned."""
    return _aligned_empty(a.size, a.dtype).reshape(a.shape)


def _workspace(index: int, size: int, dtype: np.dtype) -> Array:
    """The calling thread's ``index``-th workspace of ``size`` elements (contents undefined)."""
    arrays: dict[tuple[int, np.dtype], Array] = _local.__dict__.setdefault("arrays", {})
    array = arrays.get((index, dtype))
    if array is None or array.size < size:
        array = _aligned_empty(size, dtype)
        if size <= _KEEP_WORKSPACE_ELEMENTS:
            arrays[(index, dtype)] = array
    return array[:size]


# --- blocks ----------------------------------------------------------------------------------


def _ranges(total: int, most: int) -> list[tuple[int, int]]:
    """``[0, total)`` cut into the fewest near-equal ranges of at most ``most`` items."""
    count = -(-total // max(1, most))
    size = -(-total // count)
    return [(i, min(i + size, total)) for i in range(0, total, size)]


class _Plan:
    """The blocks of one ``(N, G, K, S)`` array, seen as ``N·G`` rows of ``L = K·S`` elements.

    A block is a range of whole rows (statistics sets) of about ``block_elements`` elements.
    """

    def __init__(self, shape: tuple[int, ...], block_elements: int, threads: int) -> None:
        n, g, k, s = shape
        self.rows, self.length = n * g, k * s
        self.spans = _ranges(self.rows, max(1, block_elements // self.length))
        self.block_rows = max(b - a for a, b in self.spans)
        self.threads = max(1, min(threads, len(self.spans)))

    def __len__(self) -> int:
        return len(self.spans)

    def run(self, task: Callable[[int, int, int, Array, Array], None], dtype: np.dtype) -> None:
        """Call ``task(index, r0, r1, work0, work1)`` once per block, on up to ``self.threads``
        threads; ``work0`` and ``work1`` are the running thread's ``(r1 − r0, L)`` workspaces."""
        spans, length, counter, errors = self.spans, self.length, itertools.count(), np.geterr()
        size = self.block_rows * length

        def drain() -> None:
            with np.errstate(**errors):  # the caller's error state, in every thread
                previous = np.setbufsize(_BUFFER_ELEMENTS)
                try:
                    work0, work1 = _workspace(0, size, dtype), _workspace(1, size, dtype)
                    while (index := next(counter)) < len(spans):
                        r0, r1 = spans[index]
                        used = (r1 - r0) * length
                        task(index, r0, r1, work0[:used].reshape(r1 - r0, length),
                             work1[:used].reshape(r1 - r0, length))
                finally:
                    np.setbufsize(previous)

        if self.threads == 1:
            drain()
            return
        pool = _executor()
        futures: list[Future[None]] = [pool.submit(drain) for _ in range(self.threads - 1)]
        try:
            drain()
        finally:
            # A worker that has not started finds no block left: cancel it rather than wait.
            wait([f for f in futures if not f.cancel()])
        for future in futures:
            if not future.cancelled():
                future.result()  # re-raise a worker's error


# --- small helpers ---------------------------------------------------------------------------


def _per_row(a: Array, n: int, g: int) -> Array:
    """A ``(1 or N, 1 or G, K, 1)`` array repeated to one ``(K, 1)`` slab per row: ``(N·G, K, 1)``."""
    return np.ascontiguousarray(np.broadcast_to(a, (n, g, a.shape[2], 1))).reshape(n * g, a.shape[2], 1)


def _plain_moments(xr: Array, ones: Array, inv: float, means: Array, variances: Array) -> bool:
    """Row means and biased variances of ``xr`` from ``Σx`` and ``Σx²``, without a centred copy.

    Writes them to ``means`` and ``variances`` and says whether every row passed the
    precision guard ``mean² ≤ _PLAIN_MOMENTS_RATIO · variance``; when one did not, the
    caller recomputes the block with the centred formula. ``Σx²/L − mean²`` loses about
    ``log2(1 + mean²/variance)`` bits to cancellation, which the guard bounds at 2.3 (a NaN,
    an infinity or a negative variance fails it). Skipping the centred copy saves a pass
    over the block, and it allows normalizing as ``x · scale + shift`` with a per-row
    ``shift``, whose rounding grows with ``|mean|/σ`` (bounded by the guard as well).
    """
    mean = vecdot(xr, ones, out=means)
    mean *= inv
    variance = vecdot(xr, xr, out=variances)
    variance *= inv
    square = mean * mean
    variance -= square
    return bool(np.all(square <= variance * _PLAIN_MOMENTS_RATIO))


def _block_dz(activation: "Activation", dy: Array, out: Array, output: Array | None,
              preactivation: Callable[[], Array]) -> Array:
    """``dy · act'(z)`` for one block, written to ``out`` (``dy`` itself for the identity)."""
    if activation.is_identity:
        return dy
    if output is not None and activation.derivative_from_output:
        derivative = activation.derivative(y=output)
    else:
        derivative = activation.derivative(x=preactivation())
    return np.multiply(dy, derivative, out=out)


def _combine_moments(row_means: Array, row_m2: Array, length: int) -> tuple[Array, Array, Array]:
    """Per-channel mean and biased variance from per-row means and centred sums of squares.

    ``row_means`` and ``row_m2`` have shape ``(N, G)``, every row ``length`` elements:
    ``μ = mean(m_row)``, ``M2 = Σ M2_row + length·Σ (m_row − μ)²``. Returns the mean and
    the variance shaped ``(1, G, 1, 1)`` and the deviations ``m_row − μ``, shape ``(N, G)``.
    """
    n, g = row_means.shape
    mean = np.add.reduce(row_means, axis=0) / n
    deviation = row_means - mean
    m2 = np.add.reduce(row_m2, axis=0) + np.add.reduce(deviation * deviation, axis=0) * length
    return mean.reshape(1, g, 1, 1), (m2 / (n * length)).reshape(1, g, 1, 1), deviation


class BlockedNormalizationKernels(NormalizationKernels):
    """Normalization kernels that work block by block, on several threads.

    A mixin of the ``scipy-blas`` backend, on the reference kernels (which take the blocks or
    calls whose values are too large for float32 sums): :meth:`blocked_plan` says whether the blocked
    kernels serve an input (the backend asks it, in one place, before each call); the kernels
    take the reference kernels' arguments plus the plan and give the same results within
    float rounding.

    Attributes
    ----------
    normalization_block_elements : int
        Elements per block on one thread: 2¹⁶ (256 KiB of float32), so that the blocks of
        every array a backward touches stay in L2 together.
    normalization_threaded_block_elements : int
        Largest block when several threads share the work: 2¹⁹ (2 MiB of float32). Every
        NumPy call releases and retakes the GIL, and on a busy or virtualised machine
        handing the GIL to a sleeping thread costs tens of microseconds: short blocks then
        cost more in hand-overs than they save in cache misses.
    normalization_min_elements : int
        Inputs with fewer elements use the reference kernels: they fit in cache whole, and
        one block on one thread would do the same work with more bookkeeping.
    """

    normalization_block_elements: int = 1 << 16
    normalization_threaded_block_elements: int = 1 << 19
    normalization_min_elements: int = 1 << 15

    def blocked_plan(self, x: Array, gamma: Array, batch_statistics: bool, constant: bool, threads: int,
                     *arrays: Array | None) -> _Plan | None:
        """The blocks of ``x``, or None when the reference kernels should run: inputs below
        ``normalization_min_elements``, and the channel-wise types without spatial extent
        (rows of one element, which blocking cannot help)."""
        s = x.shape[3]
        rows_layout = s == 1 and gamma.shape[1] == 1 and not batch_statistics and not constant  # layer norm
        if s == 1 and not rows_layout:
            return None
        if x.size < max(1, self.normalization_min_elements):
            return None
        if not all(a is None or a.flags.c_contiguous for a in (x, *arrays)):
            return None  # pragma: no cover - the layer hands C-ordered arrays
        threads = _thread_count(threads)
        block = self.normalization_block_elements
        if threads > 1:
            block = max(block, min(self.normalization_threaded_block_elements, -(-x.size // threads)))
        return _Plan(x.shape, block, threads)

    # --- forward -----------------------------------------------------------------------------

    def blocked_forward(
        self,
        x: Array,
        gamma: Array,
        beta: Array,
        *,
        epsilon: float,
        batch_statistics: bool,
        activation: "Activation",
        out: Array,
        mean: Array | None,
        variance: Array | None,
        plan: _Plan,
    ) -> tuple[Array, Array, Array]:
        """The reference forward (``NormalizationKernels._normalization_forward``), blocked
        and threaded along ``plan`` (from :meth:`blocked_plan`)."""
        n, g, k, s = x.shape
        per_sample = not batch_statistics
        rows_layout = s == 1 and gamma.shape[1] == 1 and per_sample and mean is None  # layer norm
        dtype, length = x.dtype, k * s
        x2, x3, o3 = x.reshape(-1, length), x.reshape(-1, k, s), out.reshape(-1, k, s)
        act = None if activation.is_identity else activation
        inv = 1.0 / length

        if mean is not None and variance is not None:
            # Given statistics: out = x · scale + (beta − mean · scale), as the reference does.
            scale = reciprocal_std(variance, epsilon) * gamma
            scale_r, shift_r = _per_row(scale, n, g), _per_row(beta - mean * scale, n, g)

            def affine(index: int, r0: int, r1: int, work: Array, _: Array) -> None:
                ob = o3[r0:r1]
                np.multiply(x3[r0:r1], scale_r[r0:r1], out=ob)
                np.add(ob, shift_r[r0:r1], out=ob)
                if act is not None:
                    act.forward(ob, out=ob)

            plan.run(affine, dtype)
            return out, mean, variance

        ones = np.ones(length, dtype)
        sums = np.empty(n * g, dtype)
        squares = np.empty(n * g, dtype)

        def moments(r0: int, r1: int, work: Array) -> Array:
            """Row means (into ``sums``) and centred sums of squares (into ``squares``);
            ``work = x − mean``."""
            xr = x2[r0:r1]
            row_mean = vecdot(xr, ones, out=sums[r0:r1])
            row_mean *= inv
            np.subtract(xr, row_mean[:, None], out=work)
            return vecdot(work, work, out=squares[r0:r1])

        if not per_sample:  # batch norm: the statistics first, then normalize
            def batch_moments(index: int, r0: int, r1: int, work: Array, _: Array) -> None:
                moments(r0, r1, work)

            plan.run(batch_moments, dtype)
            mean, variance, _ = _combine_moments(sums.reshape(n, g), squares.reshape(n, g), length)
            if not np.all(np.isfinite(variance)):  # too large for float32 sums (or NaN): nothing written yet
                return self._normalization_forward(x, gamma, beta, epsilon=epsilon, reduce_axes=(0, 2, 3),
                                                   activation=activation, out=out)
            scale = reciprocal_std(variance, epsilon) * gamma
            mean_r, scale_r, beta_r = _per_row(mean, n, g), _per_row(scale, n, g), _per_row(beta, n, g)

            def normalize(index: int, r0: int, r1: int, work: Array, _: Array) -> None:
                w3 = work.reshape(-1, k, s)
                np.subtract(x3[r0:r1], mean_r[r0:r1], out=w3)
                np.multiply(w3, scale_r[r0:r1], out=w3)
                ob = o3[r0:r1]
                np.add(w3, beta_r[r0:r1], out=ob)
                if act is not None:
                    act.forward(ob, out=ob)

            plan.run(normalize, dtype)
            return out, mean, variance

        if rows_layout:
            gamma1, beta1, o2 = gamma.reshape(length), beta.reshape(length), out.reshape(-1, length)
            # ``out = work + beta`` stores whole vectors straight from two streams; into an
            # output off a 64-byte boundary that is much slower than adding in place and copying.
            direct = _is_aligned(out) and (length * out.itemsize) % _ALIGNMENT == 0
        else:
            gamma_r, beta_r = _per_row(gamma, n, g), _per_row(beta, n, g)

        def forward(index: int, r0: int, r1: int, work: Array, _: Array) -> None:
            if not rows_layout and _plain_moments(x2[r0:r1], ones, inv, sums[r0:r1], squares[r0:r1]):
                # Instance and group norm: gamma is constant along S, so out = x · scale + shift
                # with (row, channel) operands: two passes instead of three.
                rstd = reciprocal_std(squares[r0:r1], epsilon)
                scale = gamma_r[r0:r1] * rstd[:, None, None]
                shift = beta_r[r0:r1] - sums[r0:r1, None, None] * scale
                w3, ob = work.reshape(-1, k, s), o3[r0:r1]
                np.multiply(x3[r0:r1], scale, out=w3)
                np.add(w3, shift, out=ob)
                if act is not None:
                    act.forward(ob, out=ob)
                return
            m2 = moments(r0, r1, work)
            m2 *= inv
            if not np.all(np.isfinite(m2)):  # too large for float32 sums (or NaN): the reference rows
                sums[r0:r1], squares[r0:r1] = self.normalization_forward_sets(
                    x, gamma, beta, epsilon=epsilon, batch_statistics=False, activation=activation, out=out,
                    sets=np.arange(r0, r1))
                return
            rstd = reciprocal_std(m2, epsilon)
            if rows_layout:  # rstd per row, gamma per column: their product would be block-sized
                np.multiply(work, rstd[:, None], out=work)
                np.multiply(work, gamma1, out=work)
                ob = o2[r0:r1]
                if direct:
                    np.add(work, beta1, out=ob)
                else:
                    np.add(work, beta1, out=work)
                    np.copyto(ob, work)
            else:
                w3 = work.reshape(-1, k, s)
                np.multiply(w3, gamma_r[r0:r1] * rstd[:, None, None], out=w3)
                ob = o3[r0:r1]
                np.add(w3, beta_r[r0:r1], out=ob)
            if act is not None:
                act.forward(ob, out=ob)

        plan.run(forward, dtype)
        return out, sums.reshape(n, g, 1, 1), squares.reshape(n, g, 1, 1)

    # --- backward ----------------------------------------------------------------------------

    def blocked_backward(
        self,
        x: Array,
        dy: Array,
        gamma: Array,
        beta: Array,
        *,
        epsilon: float,
        batch_statistics: bool,
        activation: "Activation",
        output: Array | None,
        out: Array | None,
        mean: Array | None,
        variance: Array | None,
        plan: _Plan,
    ) -> tuple[Array, Array, Array]:
        """The reference backward (``NormalizationKernels._normalization_backward``), blocked
        and threaded along ``plan``. Each thread keeps block-sized workspaces of its own, and a
        missing ``out`` is allocated 64-byte aligned."""
        n, g, k, s = x.shape
        per_sample = not batch_statistics
        constant = mean is not None and variance is not None
        rows_layout = s == 1 and gamma.shape[1] == 1 and per_sample and not constant  # layer norm
        if out is None:
            out = aligned_empty_like(x)
        if rows_layout:
            return self._layer_backward(x, dy, gamma, beta, epsilon, activation, output, out, plan)
        return self._channel_backward(x, dy, gamma, beta, epsilon, activation, output, out, plan,
                                      per_sample, mean if constant else None, variance if constant else None)

    def _channel_backward(self, x: Array, dy: Array, gamma: Array, beta: Array, epsilon: float,
                          activation: "Activation", output: Array | None, out: Array, plan: _Plan,
                          per_sample: bool, mean: Array | None, variance: Array | None,
                          ) -> tuple[Array, Array, Array]:
        """Batch, instance and group norm: gamma and the statistics are constant along ``S``.

        Per row ``r`` and channel ``k`` the reductions are ``Σ_S dz`` and ``Σ_S dz·(x − μ)``;
        then ``dx = rstd·γ·dz − (x − μ)·b − a`` with ``a = rstd·Σ γ·dz / m`` and
        ``b = rstd³·Σ γ·dz·(x − μ) / m`` per statistics set of ``m`` elements (``a = b = 0``
        for given statistics).
        """
        n, g, k, s = x.shape
        dtype, length = x.dtype, k * s
        x2, x3, o3 = x.reshape(-1, length), x.reshape(-1, k, s), out.reshape(-1, k, s)
        dy3 = dy.reshape(-1, k, s)
        y3 = None if output is None else output.reshape(-1, k, s)
        inv = 1.0 / length
        ones, ones_s = np.ones(length, dtype), np.ones(s, dtype)
        sums_dz = np.empty((n * g, k), dtype)  # Σ_S dz
        sums_dzc = np.empty((n * g, k), dtype)  # Σ_S dz · (x − centre)
        gamma_r, beta_r = _per_row(gamma, n, g), _per_row(beta, n, g)

        def block_dz(r0: int, r1: int, w3: Array, centered3: Array, scale: Array | None) -> Array:
            """dz of a block; ``scale`` is None when the derivative comes from the output alone."""
            def preactivation() -> Array:
                assert scale is not None
                np.multiply(centered3, scale, out=w3)
                return np.add(w3, beta_r[r0:r1], out=w3)

            output_block = None if y3 is None else y3[r0:r1]
            return _block_dz(activation, dy3[r0:r1], o3[r0:r1], output_block, preactivation)

        def reduce_pairs(r0: int, r1: int, dz3: Array, centered3: Array) -> None:
            vecdot(dz3, ones_s, out=sums_dz[r0:r1])
            vecdot(dz3, centered3, out=sums_dzc[r0:r1])

        if per_sample and mean is None:  # instance and group norm: one sweep
            rstds = np.empty(n * g, dtype)
            extra: list[tuple[Array, Array]] = []  # gradients of the blocks the reference kernels took
            gamma_rk = gamma_r[..., 0]

            def backward(index: int, r0: int, r1: int, work: Array, spare: Array) -> None:
                xr = x2[r0:r1]
                row_mean = vecdot(xr, ones)
                row_mean *= inv
                np.subtract(xr, row_mean[:, None], out=work)
                variance = vecdot(work, work) * inv
                if not np.all(variance < _BACKWARD_VARIANCE[dtype.itemsize]):  # the reference rows
                    extra.append(self.normalization_backward_sets(
                        x, dy, gamma, beta, epsilon=epsilon, batch_statistics=False, activation=activation,
                        output=output, out=out, sets=np.arange(r0, r1)))
                    rstds[r0:r1] = sums_dz[r0:r1] = sums_dzc[r0:r1] = 0.0
                    return
                rstd = reciprocal_std(variance, epsilon)
                rstds[r0:r1] = rstd
                c3, w3 = work.reshape(-1, k, s), spare.reshape(-1, k, s)
                scale = gamma_r[r0:r1] * rstd[:, None, None]
                dz3 = block_dz(r0, r1, w3, c3, scale)
                reduce_pairs(r0, r1, dz3, c3)
                a = vecdot(sums_dz[r0:r1], gamma_rk[r0:r1])
                b = vecdot(sums_dzc[r0:r1], gamma_rk[r0:r1])
                a *= rstd * inv
                b *= rstd * rstd * rstd * inv
                np.multiply(c3, b[:, None, None], out=c3)
                np.multiply(dz3, scale, out=w3)
                np.subtract(w3, c3, out=w3)
                np.subtract(w3, a[:, None, None], out=o3[r0:r1])  # every read of dz is done

            plan.run(backward, dtype)
            dbeta = np.add.reduce(sums_dz.reshape(n, g, k), axis=0).reshape(gamma.shape)
            sums_dzc *= rstds[:, None]  # Σ dz · x̂
            dgamma = np.add.reduce(sums_dzc.reshape(n, g, k), axis=0).reshape(gamma.shape)
            for extra_gamma, extra_beta in extra:
                dgamma += extra_gamma
                dbeta += extra_beta
            return out, dgamma, dbeta

        if mean is not None and variance is not None:  # given statistics: dx = dz · γ · rstd
            rstd = reciprocal_std(variance, epsilon)
            scale_r, mean_r = _per_row(rstd * gamma, n, g), _per_row(mean, n, g)

            def constant_backward(index: int, r0: int, r1: int, work: Array, spare: Array) -> None:
                c3, w3 = work.reshape(-1, k, s), spare.reshape(-1, k, s)
                np.subtract(x3[r0:r1], mean_r[r0:r1], out=c3)
                scale = scale_r[r0:r1]
                dz3 = block_dz(r0, r1, w3, c3, scale)
                reduce_pairs(r0, r1, dz3, c3)
                np.multiply(dz3, scale, out=o3[r0:r1])

            plan.run(constant_backward, dtype)
            dbeta = np.add.reduce(sums_dz.reshape(n, g, k), axis=0, keepdims=True)
            dgamma = np.add.reduce(sums_dzc.reshape(n, g, k), axis=0, keepdims=True) * rstd[..., 0]
            return out, dgamma.reshape(gamma.shape), dbeta.reshape(gamma.shape)

        # Batch norm: moments (and, when dz needs no statistics, the reductions around each
        # row's own mean), the per-channel statistics, then dx.
        count = n * length
        sums = np.empty(n * g, dtype)
        squares = np.empty(n * g, dtype)
        # dz goes to out: taken early only when out is not dy, which a fallback below would still read
        early = activation.is_identity or (output is not None and activation.derivative_from_output
                                           and not np.may_share_memory(out, dy))

        def moments(index: int, r0: int, r1: int, work: Array, spare: Array) -> None:
            xr = x2[r0:r1]
            row_mean = vecdot(xr, ones, out=sums[r0:r1])
            row_mean *= inv
            np.subtract(xr, row_mean[:, None], out=work)
            vecdot(work, work, out=squares[r0:r1])
            if early:
                c3 = work.reshape(-1, k, s)
                reduce_pairs(r0, r1, block_dz(r0, r1, spare.reshape(-1, k, s), c3, None), c3)

        plan.run(moments, dtype)
        mean, variance, deviation = _combine_moments(sums.reshape(n, g), squares.reshape(n, g), length)
        if not np.all(variance < _BACKWARD_VARIANCE[dtype.itemsize]):  # (or NaN): dy is intact
            return self._normalization_backward(x, dy, gamma, beta, epsilon=epsilon, reduce_axes=(0, 2, 3),
                                                activation=activation, output=output, out=out)
        rstd = reciprocal_std(variance, epsilon)
        scale = rstd * gamma
        mean_r, scale_r = _per_row(mean, n, g), _per_row(scale, n, g)
        if early:
            # Σ dz·(x − μ) = Σ_rows [Σ dz·(x − m_row) + (m_row − μ)·Σ dz]
            sums_dzc += deviation.reshape(n * g, 1) * sums_dz
        else:
            def reductions(index: int, r0: int, r1: int, work: Array, spare: Array) -> None:
                c3 = work.reshape(-1, k, s)
                np.subtract(x3[r0:r1], mean_r[r0:r1], out=c3)
                reduce_pairs(r0, r1, block_dz(r0, r1, spare.reshape(-1, k, s), c3, scale_r[r0:r1]), c3)

            plan.run(reductions, dtype)
        dbeta = np.add.reduce(sums_dz.reshape(n, g, k), axis=0, keepdims=True)  # (1, G, K)
        dgamma = np.add.reduce(sums_dzc.reshape(n, g, k), axis=0, keepdims=True) * rstd[..., 0]  # Σ dz · x̂
        gamma3 = gamma[..., 0]
        a = np.add.reduce(dbeta * gamma3, axis=2)[..., None, None] * (rstd / count)
        b = np.add.reduce(dgamma * gamma3, axis=2)[..., None, None] * (rstd * rstd / count)
        a_r, b_r = _per_row(a, n, g), _per_row(b, n, g)

        def input_gradient(index: int, r0: int, r1: int, work: Array, spare: Array) -> None:
            c3, w3 = work.reshape(-1, k, s), spare.reshape(-1, k, s)
            dz3 = dy3[r0:r1] if activation.is_identity else o3[r0:r1]
            np.subtract(x3[r0:r1], mean_r[r0:r1], out=c3)
            np.multiply(c3, b_r[r0:r1], out=c3)
            np.multiply(dz3, scale_r[r0:r1], out=w3)
            np.subtract(w3, c3, out=w3)
            np.subtract(w3, a_r[r0:r1], out=o3[r0:r1])

        plan.run(input_gradient, dtype)
        return out, dgamma.reshape(gamma.shape), dbeta.reshape(gamma.shape)

    def _layer_backward(self, x: Array, dy: Array, gamma: Array, beta: Array, epsilon: float,
                        activation: "Activation", output: Array | None, out: Array,
                        plan: _Plan) -> tuple[Array, Array, Array]:
        """Layer norm: statistics per row, gamma per column of each block's ``(rows, M)`` matrix.

        With ``c = x − mean`` per row, ``A = Σ_j γ·dz`` and ``B = Σ_j γ·dz·c``:
        ``dx = rstd·γ·dz − c·rstd³·B/M − rstd·A/M``, ``dγ = Σ_rows rstd·dz·c`` and
        ``dβ = Σ_rows dz`` (per-block column sums, added in block order). Every reduction is
        a matrix-vector product (BLAS gemv), which costs about half an elementwise pass.
        """
        m = x.shape[2]
        dtype = x.dtype
        x2, dy2, o2 = x.reshape(-1, m), dy.reshape(-1, m), out.reshape(-1, m)
        y2 = None if output is None else output.reshape(-1, m)
        gamma1, beta1 = gamma.reshape(m), beta.reshape(m)
        ones, ones_rows = np.ones(m, dtype), np.ones(plan.block_rows, dtype)
        inv = 1.0 / m
        dgamma_parts = np.empty((len(plan), m), dtype)
        dbeta_parts = np.empty((len(plan), m), dtype)

        def backward(index: int, r0: int, r1: int, centered: Array, work: Array) -> None:
            xr, outr = x2[r0:r1], o2[r0:r1]
            row_mean = vecdot(xr, ones)
            row_mean *= inv
            np.subtract(xr, row_mean[:, None], out=centered)
            variance = vecdot(centered, centered) * inv
            if not np.all(variance < _BACKWARD_VARIANCE[dtype.itemsize]):  # the reference rows
                extra_gamma, extra_beta = self.normalization_backward_sets(
                    x, dy, gamma, beta, epsilon=epsilon, batch_statistics=False, activation=activation,
                    output=output, out=out, sets=np.arange(r0, r1))
                dgamma_parts[index], dbeta_parts[index] = extra_gamma.reshape(m), extra_beta.reshape(m)
                return
            rstd = reciprocal_std(variance, epsilon)

            def preactivation() -> Array:
                np.multiply(centered, rstd[:, None], out=work)
                np.multiply(work, gamma1, out=work)
                return np.add(work, beta1, out=work)

            dz = _block_dz(activation, dy2[r0:r1], outr, None if y2 is None else y2[r0:r1], preactivation)
            np.matmul(ones_rows[:r1 - r0], dz, out=dbeta_parts[index])
            a = np.matmul(dz, gamma1)
            np.multiply(dz, centered, out=work)
            b = np.matmul(work, gamma1)
            np.matmul(rstd, work, out=dgamma_parts[index])  # Σ_rows dz · x̂
            a *= rstd
            a *= -inv
            b *= rstd * rstd * rstd
            b *= -inv
            np.multiply(centered, b[:, None], out=centered)
            np.add(centered, a[:, None], out=centered)  # −c·rstd³·B/M − rstd·A/M
            np.multiply(rstd[:, None], gamma1, out=work)
            np.multiply(work, dz, out=work)
            np.add(work, centered, out=outr)  # every read of dz is done: out may be dz

        with _one_blas_thread():
            plan.run(backward, dtype)
        dgamma = np.add.reduce(dgamma_parts, axis=0)
        dbeta = np.add.reduce(dbeta_parts, axis=0)
        return out, dgamma.reshape(gamma.shape), dbeta.reshape(gamma.shape)

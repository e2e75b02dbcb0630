"""Compiled (Numba) normalization kernels: a few passes per row while the row is in cache.

The layer hands every type the canonical view ``(N, G, K, S)`` (``docs/backends.md``). These
kernels serve the statistics of the batch (training, and layer and group norm always) with the
identity activation:

- **per-sample statistics** (instance, group and layer norm): one statistics set per row
  ``r = (n, g)`` of ``K·S`` elements. Rows go to Numba's threads (``prange``). Instance and
  group norm gather a row's statistics segment by segment (:data:`SEGMENT` elements, read
  twice while in L1: the mean, then the centred sum of squares, which keeps its precision
  when the mean is large against the spread) and combine the segments exactly; backward
  gathers the sums of ``dy`` in the same pass. One more pass writes the output (or ``dx``).
  Layer norm's rows (``_flat_*``) are a few KiB and take their passes whole; their last pass
  (:func:`._stream.normalized_row`) takes a ``gamma`` and ``beta`` per column. Large
  arrays' outputs are written past the caches (:func:`_streams`). Memory sees about one read
  of each array and one write.
- **batch statistics** (batch norm): one statistics set per channel ``g`` over ``N`` and ``S``;
  channels go to the threads.

The statistics (mean and centred sum of squares) are gathered segment by segment: along a
segment in the data's dtype, around an estimate of its mean which a second sum corrects
(:func:`_segment_stats`), and across segments in float64, exactly (:func:`_combine`).
Backward's sums are summed in the data's dtype along one run (a row of S elements, or for
layer norm 16 rows of a column) and in float64 across runs. Both keep the loops at the full
vector width: a loop mixing float32 data with float64 sums runs at half of it. A statistics
set whose values are too large for the loops' arithmetic (a centred spread beyond 1e38 in
float32, 1e150 in float64; :data:`_LIMITS`), or holds NaN, is skipped by the loops and handed
to ``redo``: the backend's reference kernels, which scale such sets before normalizing them.
The gamma and beta gradients are summed per thread block of rows and the blocks added in
order, so a result depends only on the data and the thread count. Kernels are compiled on
first use and cached on disk.
"""

from __future__ import annotations

import contextlib
import functools
import math
from pathlib import Path
from typing import Callable, Iterator

import numba
import numpy as np

from . import _cache

from ._stream import affine, normalized_row, normalized_row_backward, store_fence
from ._tiles import wide_loops

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry

__all__ = ["serves", "forward", "backward"]

#: Fast-math flags that let LLVM reorder sums (vector reductions) but keep NaN and infinity
#: meaningful: the loops' ``not squares < limit`` test must see a NaN, and with all flags on
#: (``fastmath=True`` assumes no NaN) it was folded away.
#: ``arcp`` stays (the LSTM kernels leave it out: ``_lstm_cell.FAST_MATH``): these kernels
#: divide only in scalar code, per statistics set, so no element's bits depend on whether a
#: vectorized loop or its scalar remainder computed it.
_FASTMATH = {"reassoc", "nsz", "arcp", "contract", "afn"}
_parallel = numba.njit(parallel=True, nogil=True, fastmath=_FASTMATH, error_model="numpy", cache=True)
_inline = numba.njit(nogil=True, fastmath=_FASTMATH, error_model="numpy", cache=True, inline="always")


def serves(x: np.ndarray, activation_is_identity: bool, given_statistics: bool) -> bool:
    """True for the statistics of the batch with the identity activation (the rest goes to
    the blocked or reference kernels)."""
    return activation_is_identity and not given_statistics


#: Elements of one segment, at most: a row's statistics are gathered segment by segment (8 KiB
#: of float32; forward cuts the row anywhere, backward at ``k`` boundaries), each read a few
#: times while it is in the core's L1 cache, and combined exactly (Chan's pairwise update of
#: the count, the mean and the centred sum of squares). A group-norm row of 32 KiB read whole
#: for each pass ran from L2 and took 1.4 times as long per element as instance norm's 4 KiB
#: rows.
SEGMENT = 2048


@_inline
def _centre(v):
    """The mean of the 1-D run ``v`` summed in its dtype: the centre its sums are taken around.
    (The loops index a slice from 0: indices running from a computed start kept LLVM from
    proving them non-negative, and the loops ran unvectorized, ten times slower.)"""
    total = v.dtype.type(0.0)
    for i in range(v.size):
        total += v[i]
    return v.dtype.type(total / v.size)


@_inline
def _corrected(centre, deviations, squares, count):
    """The mean and centred sum of squares, in float64, of ``count`` elements whose deviations
    ``d`` from ``centre`` sum to ``deviations`` and whose ``d²`` sum to ``squares``: the centre
    corrected by the deviations' mean. What the deviations sum to is the error of a centre
    summed in float32; adding it back leaves the mean with the rounding of a sum of small
    deviations rather than of the values, and squares taken around a point this close to the
    mean lose nothing to cancellation."""
    d = float(deviations)
    return float(centre) + d / count, max(float(squares) - d * d / count, 0.0)


@_inline
def _segment_stats(v):
    """The mean and centred sum of squares of the 1-D run ``v`` of at most :data:`SEGMENT`
    elements, summed in its dtype, then :func:`_corrected`. (Summed in float64, the
    benchmark's group norm took 1.05–1.3 times as long forward and 1.0–1.3 backward.)"""
    centre = _centre(v)
    deviations = v.dtype.type(0.0)
    squares = v.dtype.type(0.0)
    for i in range(v.size):
        d = v[i] - centre
        deviations += d
        squares += d * d
    return _corrected(centre, deviations, squares, v.size)


@_inline
def _combine(count, mean, squares, more, more_mean, more_squares):
    """Chan's update: the statistics of two disjoint sets from each one's count, mean and
    centred sum of squares (no cancellation, whatever the means)."""
    total = count + more
    delta = more_mean - mean
    squares += more_squares + delta * delta * (count * more / total)
    return total, mean + delta * (more / total), squares


@_inline
def _gather(v, count, mean, squares):
    """The statistics ``(count, mean, squares)`` of a set with the 1-D run ``v`` added, segment
    by segment."""
    for f0 in range(0, v.size, SEGMENT):
        part = v[f0:f0 + SEGMENT]
        part_mean, part_squares = _segment_stats(part)
        count, mean, squares = _combine(count, mean, squares, float(part.size), part_mean, part_squares)
    return count, mean, squares


@_parallel
def _row_forward(x, flat, gamma, beta, groups, epsilon, out, means, variances, limit, wide, stream):
    """Per-sample statistics: ``x`` (R, K, S) with R = N·G rows, ``flat`` the same as (R, K·S),
    ``gamma``/``beta`` (1 or G, K); ``stream``: write ``out`` past the caches
    (:func:`_streams`)."""
    rows, k_size, s_size = x.shape
    per_group = gamma.shape[0] > 1
    for r in numba.prange(rows):
        wide_loops()
        g = r % groups if per_group else 0
        count, mean, squares = _gather(flat[r], 0.0, 0.0, 0.0)
        if not squares < limit:  # too large for the loop below (or NaN): the caller redoes the row
            wide[r] = True
            continue
        variance = squares / count
        rstd = 1.0 / math.sqrt(variance + epsilon)
        mean_x = x.dtype.type(mean)
        if stream:  # centred first: exactly beta at the mean, no cancellation
            for k in range(k_size):
                affine(x[r, k], x[r, k], out[r, k], 0.0, rstd * gamma[g, k], mean_x, beta[g, k], False)
            store_fence()
        else:
            for k in range(k_size):
                scale = x.dtype.type(rstd * gamma[g, k])
                for s in range(s_size):
                    out[r, k, s] = (x[r, k, s] - mean_x) * scale + beta[g, k]
        means[r] = mean
        variances[r] = variance


@_parallel
def _row_backward(x, flat, dy, gamma, groups, epsilon, dx, d_gamma_blocks, d_beta_blocks, limit, wide,
                  stream):
    """Per-sample statistics backward; the gamma and beta gradients per block of rows.

    A segment is a run of at most :data:`SEGMENT` elements of one ``k``, or as many whole
    ``k`` as fit when S is shorter. A first pass over it finds its :func:`_centre`; a second,
    while it is in L1, gathers its statistics and, per ``k``, its sums of ``dy`` and of
    ``dy·(x − centre)``; once the row's mean is known, each ``k``'s sum of ``dy·(x − mean)``
    is put together from them exactly (``+ (centre − mean)·Σ dy``). A last pass writes
    ``dx``."""
    rows, k_size, s_size = x.shape
    count = k_size * s_size
    per_group = gamma.shape[0] > 1
    blocks = d_gamma_blocks.shape[0]
    per_k = (s_size + SEGMENT - 1) // SEGMENT  # pieces of one k (1 unless S > SEGMENT)
    k_step = max(1, SEGMENT // max(s_size, 1))  # whole k per segment (1 unless S < SEGMENT)
    zero = x.dtype.type(0.0)
    for b in numba.prange(blocks):
        wide_loops()
        d_gamma = d_gamma_blocks[b]
        d_beta = d_beta_blocks[b]
        d_gamma[:, :] = 0.0
        d_beta[:, :] = 0.0
        part_centres = np.empty(k_size * per_k, np.float64)  # the centre of the piece's segment
        part_dy = np.empty(k_size * per_k, np.float64)  # Σ dy over the piece
        part_dy_x = np.empty(k_size * per_k, np.float64)  # Σ dy·(x − centre)
        for r in range(b * rows // blocks, (b + 1) * rows // blocks):
            g = r % groups if per_group else 0
            seen, mean, squares = 0.0, 0.0, 0.0
            for k0 in range(0, k_size, k_step):
                k1 = min(k0 + k_step, k_size)
                for s0 in range(0, s_size, SEGMENT):
                    segment = flat[r, k0 * s_size + s0:(k1 - 1) * s_size + min(s0 + SEGMENT, s_size)]
                    centre = _centre(segment)
                    deviations = zero  # as in _segment_stats
                    deviation_squares = zero
                    for k in range(k0, k1):
                        x_run = x[r, k, s0:s0 + SEGMENT]
                        dy_run = dy[r, k, s0:s0 + SEGMENT]
                        sum_dy = zero  # in the data's dtype along the run (full-width vectors),
                        sum_dy_x = zero  # in float64 across runs
                        for i in range(x_run.size):
                            d = x_run[i] - centre
                            deviations += d
                            deviation_squares += d * d
                            sum_dy += dy_run[i]
                            sum_dy_x += dy_run[i] * d
                        p = k * per_k + s0 // SEGMENT
                        part_centres[p] = centre
                        part_dy[p] = sum_dy
                        part_dy_x[p] = sum_dy_x
                    part_mean, part_squares = _corrected(centre, deviations, deviation_squares, segment.size)
                    seen, mean, squares = _combine(seen, mean, squares, float(segment.size), part_mean,
                                                   part_squares)
            if not squares < limit:
                wide[r] = True
                continue
            rstd = 1.0 / math.sqrt(squares / count + epsilon)
            a = 0.0  # Σ γ·dy
            c = 0.0  # Σ γ·dy·x̂
            for k in range(k_size):
                sum_dy = 0.0
                sum_dy_x = 0.0  # Σ dy·(x − mean) over this k
                for p in range(k * per_k, (k + 1) * per_k):
                    sum_dy += part_dy[p]
                    sum_dy_x += part_dy_x[p] + (part_centres[p] - mean) * part_dy[p]
                sum_dy_xhat = sum_dy_x * rstd
                d_beta[g, k] += sum_dy
                d_gamma[g, k] += sum_dy_xhat
                a += gamma[g, k] * sum_dy
                c += gamma[g, k] * sum_dy_xhat
            # dx = rstd·γ·dy − rstd·(a + x̂·c)/count, x̂ = (x − mean)·rstd
            mean_x, rstd_x = x.dtype.type(mean), x.dtype.type(rstd)
            if stream:
                slope, shift = -rstd * rstd * c / count, -rstd * a / count
                for k in range(k_size):
                    affine(dy[r, k], x[r, k], dx[r, k], rstd * gamma[g, k], slope, mean_x, shift, True)
                store_fence()
            else:
                a_x, c_x = x.dtype.type(a / count), x.dtype.type(c / count)
                for k in range(k_size):
                    scale = x.dtype.type(rstd * gamma[g, k])
                    for s in range(s_size):
                        xhat = (x[r, k, s] - mean_x) * rstd_x
                        dx[r, k, s] = scale * dy[r, k, s] - rstd_x * (a_x + xhat * c_x)


@_parallel
def _flat_forward(x, gamma, beta, epsilon, out, means, variances, limit, wide, blocks, stream):
    """Layer norm: ``x`` (R, M), one statistics set per row, ``gamma``/``beta`` (M,) per column;
    the rows in ``blocks`` runs, one per thread. ``stream``: write ``out`` past the caches
    (:func:`_streams`). (The (R, K, S) loops above with S = 1 would not vectorize.)"""
    rows, m = x.shape
    for b in numba.prange(blocks):
        wide_loops()
        for r in range(b * rows // blocks, (b + 1) * rows // blocks):
            _, mean, squares = _gather(x[r], 0.0, 0.0, 0.0)
            if not squares < limit:
                wide[r] = True
                continue
            variance = squares / m
            normalized_row(x[r], gamma, beta, out[r], mean, 1.0 / math.sqrt(variance + epsilon), stream)
            means[r] = mean
            variances[r] = variance
        if stream:
            store_fence()


#: Rows whose gamma and beta gradients layer norm's backward sums in the data's dtype before
#: adding them to its float64 sums (a mixed float32/float64 loop ran at half the vector width).
FLAT_RUN = 16


@_parallel
def _flat_backward(x, dy, gamma, epsilon, dx, d_gamma_blocks, d_beta_blocks, limit, wide, stream):
    """Layer norm backward on (R, M) rows; gamma and beta gradients per block of rows;
    ``stream`` as in :func:`_flat_forward`."""
    rows, m = x.shape
    blocks = d_gamma_blocks.shape[0]
    zero = x.dtype.type(0.0)
    for b in numba.prange(blocks):
        wide_loops()
        d_gamma = d_gamma_blocks[b]
        d_beta = d_beta_blocks[b]
        d_gamma[:] = 0.0
        d_beta[:] = 0.0
        # the column sums in the data's dtype over runs of FLAT_RUN rows (full-width vectors),
        # in float64 across runs
        run_gamma = np.zeros(m, x.dtype)
        run_beta = np.zeros(m, x.dtype)
        first, last = b * rows // blocks, (b + 1) * rows // blocks
        for r in range(first, last):
            _, mean, squares = _gather(x[r], 0.0, 0.0, 0.0)
            if not squares < limit:
                wide[r] = True
                continue
            rstd = x.dtype.type(1.0 / math.sqrt(squares / m + epsilon))
            mean_x = x.dtype.type(mean)
            a = zero  # Σ γ·dy
            c = zero  # Σ γ·dy·x̂
            for j in range(m):
                xhat = (x[r, j] - mean_x) * rstd
                gdy = gamma[j] * dy[r, j]
                a += gdy
                c += gdy * xhat
                run_beta[j] += dy[r, j]
                run_gamma[j] += dy[r, j] * xhat
            if (r - first) % FLAT_RUN == FLAT_RUN - 1 or r == last - 1:
                for j in range(m):
                    d_beta[j] += run_beta[j]
                    d_gamma[j] += run_gamma[j]
                    run_beta[j] = 0.0
                    run_gamma[j] = 0.0
            normalized_row_backward(x[r], dy[r], gamma, dx[r], mean_x, rstd, a / m, c / m, stream)
        if stream:
            store_fence()


@_parallel
def _channel_forward(x, gamma, beta, epsilon, out, means, variances, limit, wide):
    """Batch statistics: ``x`` (N, G, S) (K = 1), one set per channel ``g``."""
    batch, channels, s_size = x.shape
    count = batch * s_size
    for g in numba.prange(channels):
        wide_loops()
        seen, mean, squares = 0.0, 0.0, 0.0
        for n in range(batch):
            seen, mean, squares = _gather(x[n, g], seen, mean, squares)
        if not squares < limit:
            wide[g] = True
            continue
        variance = squares / count
        rstd = 1.0 / math.sqrt(variance + epsilon)
        scale = x.dtype.type(rstd * gamma[g])
        mean_x = x.dtype.type(mean)
        for n in range(batch):  # centred first: exactly beta at the mean, no cancellation
            for s in range(s_size):
                out[n, g, s] = (x[n, g, s] - mean_x) * scale + beta[g]
        means[g] = mean
        variances[g] = variance


@_parallel
def _channel_backward(x, dy, gamma, epsilon, dx, d_gamma, d_beta, limit, wide):
    """Batch statistics backward, one channel per task."""
    batch, channels, s_size = x.shape
    count = batch * s_size
    for g in numba.prange(channels):
        wide_loops()
        seen, mean, squares = 0.0, 0.0, 0.0
        for n in range(batch):
            seen, mean, squares = _gather(x[n, g], seen, mean, squares)
        if not squares < limit:
            wide[g] = True
            continue
        rstd = 1.0 / math.sqrt(squares / count + epsilon)
        sum_dy = 0.0
        sum_dy_xhat = 0.0
        for n in range(batch):
            for s in range(s_size):
                sum_dy += dy[n, g, s]
                sum_dy_xhat += dy[n, g, s] * (x[n, g, s] - mean) * rstd
        d_beta[g] = sum_dy
        d_gamma[g] = sum_dy_xhat
        scale = rstd * gamma[g]
        a = sum_dy / count
        c = sum_dy_xhat / count
        for n in range(batch):
            for s in range(s_size):
                xhat = (x[n, g, s] - mean) * rstd
                dx[n, g, s] = scale * (dy[n, g, s] - a - xhat * c)


#: Below this many elements a call stays on the calling thread: waking Numba's threads costs
#: more than they save there, and on a busy machine a parallel region waits for a thread the
#: system has put aside (the demo's (64, 32) layer norm took 20 ms a call under load, 75 µs
#: alone). The scipy-blas backend's blocked kernels start at the same size.
PARALLEL_MIN_ELEMENTS = 1 << 15


@contextlib.contextmanager
def _threads(requested: int, size: int) -> Iterator[int]:
    """Numba's threads for one call on ``size`` elements: one below
    :data:`PARALLEL_MIN_ELEMENTS`, else ``requested`` (a limit), else all of them; the caller's
    setting is restored afterwards (each setting costs about a microsecond: none is made
    when the count is the caller's)."""
    most: int = getattr(numba.config, "NUMBA_NUM_THREADS")
    count = most if requested <= 0 else max(1, min(requested, most))
    if size < PARALLEL_MIN_ELEMENTS:
        count = 1
    before = numba.get_num_threads()
    if count == before:
        yield count
        return
    numba.set_num_threads(count)
    try:
        yield count
    finally:
        numba.set_num_threads(before)


#: Per dtype, the centred sum of squares of a statistics set below which the loops above are
#: exact enough and cannot overflow: every |x − mean| is then below 1e38 in float32 (the loops
#: centre in float32) and 1e150 in float64. Sets above it, or NaN, are left to ``redo``; so is
#: a set whose segment sums overflow the data's dtype (from |x − mean| of about 1.8e19 in
#: float32), which makes its statistics infinite or NaN.
_LIMITS = {4: 1e76, 8: 1e300}

#: ``redo(sets, target)``: the reference kernels on those statistics sets only (rows n·G + g, or
#: channels for batch statistics), writing their elements of ``target`` (the output, or dx);
#: returns the statistics (forward) or the gamma and beta gradients they add (backward).
Redo = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, *, epsilon: float, batch_statistics: bool,
            out: np.ndarray, threads: int, redo: Redo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``out = gamma · (x − mean) / sqrt(variance + epsilon) + beta`` with the statistics of
    ``x``; returns the output and the statistics, ``(1 or N, G, 1, 1)``."""
    with _threads(threads, x.size) as count:
        return _forward(x, gamma, beta, epsilon, batch_statistics, out, count, redo)


def _streams(out: np.ndarray, arrays: int) -> bool:
    """True when a row kernel writes ``out`` past the caches (:mod:`._stream`): when the
    pass's ``arrays`` arrays of ``out``'s size (``x`` and ``out`` forward, ``x``, ``dy`` and
    ``dx`` backward) fill at least half the last-level cache, so that they do not stay there
    from call to call and each ordinary store first reads its line from memory. Measured on
    two threads and a 32 MiB cache, forward and backward together, instance and group norm:
    (32, 64, 32, 32) float32 (8 MiB) streamed in 0.79–0.86× the time of ordinary stores,
    (16, 64, 32, 32) (4 MiB) in 1.12–1.21×, (8, 64, 16, 16) (0.5 MiB) in 1.1–1.3×."""
    return 2 * arrays * out.nbytes >= last_level_cache_bytes()


@functools.cache
def last_level_cache_bytes() -> int:
    """The largest cache's size, as Linux reports it for the first CPU; 32 MiB where it does
    not."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        with contextlib.suppress(OSError, ValueError):
            text = entry.read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 << 20)


def _forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, epsilon: float, batch_statistics: bool,
             out: np.ndarray, count: int, redo: Redo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, g, k, s = x.shape
    limit = _LIMITS[x.dtype.itemsize]
    if batch_statistics:  # K = 1 for batch norm
        means = np.empty(g, np.float64)
        variances = np.empty(g, np.float64)
        wide = np.zeros(g, np.bool_)
        _channel_forward(x.reshape(n, g, s), gamma.reshape(g), beta.reshape(g), epsilon,
                         out.reshape(n, g, s), means, variances, limit, wide)
        shape = (1, g, 1, 1)
    elif s == 1 and gamma.shape[1] == 1:  # layer norm: gamma per column of (N·P, M) rows
        means = np.empty(n * g, np.float64)
        variances = np.empty(n * g, np.float64)
        wide = np.zeros(n * g, np.bool_)
        rows_out = out.reshape(n * g, k)
        _flat_forward(x.reshape(n * g, k), gamma.reshape(k), beta.reshape(k), epsilon, rows_out, means,
                      variances, limit, wide, max(1, min(n * g, count)), _streams(rows_out, 2))
        shape = (n, g, 1, 1)
    else:
        means = np.empty(n * g, np.float64)
        variances = np.empty(n * g, np.float64)
        wide = np.zeros(n * g, np.bool_)
        rows = gamma.shape[1]
        _row_forward(x.reshape(n * g, k, s), x.reshape(n * g, k * s), gamma.reshape(rows, k),
                     beta.reshape(rows, k), g, epsilon, out.reshape(n * g, k, s), means, variances, limit,
                     wide, _streams(out, 2))
        shape = (n, g, 1, 1)
    if np.count_nonzero(wide):  # (a third of any()'s cost on a short array)
        sets = np.flatnonzero(wide)
        means[sets], variances[sets] = redo(sets, out)
    with np.errstate(over="ignore"):  # a variance beyond float32's range is infinite there
        return out, means.astype(x.dtype).reshape(shape), variances.astype(x.dtype).reshape(shape)


def backward(x: np.ndarray, dy: np.ndarray, gamma: np.ndarray, *, epsilon: float, batch_statistics: bool,
             out: np.ndarray | None, threads: int, redo: Redo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``dx``, ``dgamma`` and ``dbeta`` of the forward above; ``out`` may be ``dy`` itself."""
    with _threads(threads, x.size) as count:
        return _backward(x, dy, gamma, epsilon, batch_statistics, out, count, redo)


def _backward(x: np.ndarray, dy: np.ndarray, gamma: np.ndarray, epsilon: float, batch_statistics: bool,
              out: np.ndarray | None, count: int, redo: Redo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, g, k, s = x.shape
    limit = _LIMITS[x.dtype.itemsize]
    dx = np.empty_like(x) if out is None or np.shares_memory(out, dy) else out
    if batch_statistics:
        d_gamma = np.empty(g, np.float64)
        d_beta = np.empty(g, np.float64)
        wide = np.zeros(g, np.bool_)
        _channel_backward(x.reshape(n, g, s), dy.reshape(n, g, s), gamma.reshape(g), epsilon,
                          dx.reshape(n, g, s), d_gamma, d_beta, limit, wide)
        d_gamma[wide] = d_beta[wide] = 0.0
    elif s == 1 and gamma.shape[1] == 1:  # layer norm
        blocks = max(1, min(n * g, count))
        flat_gamma = np.empty((blocks, k), np.float64)
        flat_beta = np.empty((blocks, k), np.float64)
        wide = np.zeros(n * g, np.bool_)
        rows_dx = dx.reshape(n * g, k)
        _flat_backward(x.reshape(n * g, k), dy.reshape(n * g, k), gamma.reshape(k), epsilon, rows_dx,
                       flat_gamma, flat_beta, limit, wide, _streams(rows_dx, 3))
        d_gamma = np.add.reduce(flat_gamma, axis=0)
        d_beta = np.add.reduce(flat_beta, axis=0)
    else:
        rows = gamma.shape[1]
        blocks = max(1, min(n * g, count))
        d_gamma_blocks = np.empty((blocks, rows, k), np.float64)
        d_beta_blocks = np.empty((blocks, rows, k), np.float64)
        wide = np.zeros(n * g, np.bool_)
        _row_backward(x.reshape(n * g, k, s), x.reshape(n * g, k * s), dy.reshape(n * g, k, s),
                      gamma.reshape(rows, k), g, epsilon, dx.reshape(n * g, k, s), d_gamma_blocks,
                      d_beta_blocks, limit, wide, _streams(dx, 3))
        d_gamma = np.add.reduce(d_gamma_blocks, axis=0)
        d_beta = np.add.reduce(d_beta_blocks, axis=0)
    if np.count_nonzero(wide):  # before dx goes to out: dy (which out may be) is still intact
        extra_gamma, extra_beta = redo(np.flatnonzero(wide), dx)
        d_gamma += extra_gamma.reshape(d_gamma.shape)
        d_beta += extra_beta.reshape(d_beta.shape)
    if out is not None and dx is not out:
        np.copyto(out, dx)
        dx = out
    return dx, d_gamma.astype(x.dtype).reshape(gamma.shape), d_beta.astype(x.dtype).reshape(gamma.shape)

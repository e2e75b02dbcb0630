"""Compiled (Numba) LSTM kernels: one layer and direction, forward and backward, per call.

They serve the cell almost every model uses (tanh candidate, sigmoid forget, input and output
gates, tanh hidden activation), with no, diagonal or full peepholes, over full or variable
lengths, in float32 and float64 (:func:`serves` says which). They read and write the
reference's training cache (``docs/lstm.md``): per step a feature-major ``(6H, N)`` block
holding the cell before the step, the activated gates in the internal order g, f, i, o and
``tanh(c_t)``, and the hidden state before each step ``(T, H, N)``; so caches stay
interchangeable between backends. The forward weights of the sigmoid gates are halved
(``σ(z) = ½·tanh(z/2) + ½``), so every gate is one ``tanh``.

What is compiled, and why:

- **The large products are BLAS calls made from the compiled loop** (``?gemm`` on strided
  operands, the same SciPy BLAS the rest of the backend uses: two BLAS libraries would each
  keep a spinning thread pool and take the cores from each other). **A step's product**
  ``U h`` (and backward's ``Uᵀ dz``) is :func:`~._tiles.product` as soon as the
  sequences fill a vector (8 in float32, 4 in float64): a tile kept in registers, with no
  packing of ``U`` at each step. With fewer sequences BLAS would pack ``U`` at every call:
  one sequence takes a tile of one row instead (:func:`~._tiles.row_product`), two
  to seven dot products of ``U``'s rows (:func:`_narrow_product`).
- **Time in chunks.** The input projection ``W x_t + b`` is one product per chunk of steps
  (BLAS adding ``W x_t`` to rows filled with ``b``: :func:`_biased_product`), and
  backward's weight and input gradients are one product each per chunk, so the scratch memory
  is bounded by the chunk (:data:`CHUNK_COLUMNS` columns of ``T·N``), not by the sequence
  length, while each product stays large. An overlapped backward (:func:`_backward_overlapped`)
  makes the three products of each of its pieces with the register tile instead.
- **One fused pass per step** over the ``H·N`` units reads ``U h`` plus the step's
  projection (the product starts from it), applies the four gate functions and the
  peepholes, updates the cell and the hidden state, writes the cache block and the output.
  Backward is one fused pass computing ``dz`` for the four gates and the cell gradient, then
  one product ``Uᵀ dz``; the bias and peephole gradients are one pass per chunk over its
  ``dz``. The forward pass runs over each gate's ``H·N`` elements as one unit-stride loop
  (feature-major blocks keep them consecutive).
  Inference without peepholes takes a lighter pass of its own (:func:`_state_run`): no cache
  rows, which nothing reads, and no peephole terms.
- **Full peepholes** add a product per step: ``P c_{t−1}`` for the candidate, forget and
  input gates goes into ``z`` with ``U h``; the output gate's ``P_o c_t`` needs every unit's
  new cell, so the pass splits in two around it (backward: ``P_oᵀ dz_o`` between two passes,
  ``Pᵀ dz`` into the cell gradient after them), and their gradients are one product per
  chunk against the cells as columns. Such cells keep their steps on the calling thread.
- **Steps shared out over threads** (:func:`step_parts`): for several sequences and
  a step product of at least :data:`THREADED_STEP_MIN` multiply-adds, each of Numba's threads
  takes a run of units and computes their four gate rows of ``U h`` with
  :func:`~._tiles.product` (its rows of ``U`` stay in its cache from step to step),
  then their fused update. Where the sequences take packed rows (:func:`_step_tiles`), a
  thread's product is ``U h + W x_t + b`` at once, over ``[h; x_t]`` with the rows of
  ``[U W]`` packed, and the steps project nothing ahead. One parallel region runs a chunk's
  steps (:func:`_steps_threads`;
  one region per step cost about 1.4 µs a step to start): each step's units are a piece per
  thread, which a thread claims before it runs it (an atomic flag; a thread late to a step
  finds its piece taken by one that came first), and a step begins once a shared count shows
  every piece of the step before done (:mod:`._progress`). Backward the same
  (:func:`_backward_steps_threads`): a thread's piece makes its units' rows of ``Uᵀ dz`` for
  the step after, then their pass of the step, with ``dz`` taken from two arrays in turn.
  BLAS is held to one thread meanwhile
  and the chunk products are shared out by rows, each thread calling a one-thread BLAS, so
  the two thread pools never wait for the cores at once.
- float32 uses a rational tanh (an odd polynomial over an even one on ``|x| ≤ 7.9``; largest
  error about 2e-7 absolute, inside the contract's float32 tolerance), which is pure
  multiply-add and one division, so with fast math (:data:`FAST_MATH`: an exact division and
  no reordering, the same bits in the vectorized loop and its scalar remainder) and the NumPy
  error model (no zero-division check, which would keep the loop scalar) the loop vectorizes:
  0.37 ns per tanh against 2.7 ns under the Python error model. float64 uses ``math.tanh``
  (the contract's float64 tolerance is 1e-9).

Kernels are compiled on first use and cached on disk (``cache=True``; Numba keeps the cache
beside the module, in the user's cache folder when the package folder is read only, or in
``NUMBA_CACHE_DIR``), each entry stamped with the sources of every kernel module
(:mod:`._cache`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

import numba
import numba.np.linalg
import numpy as np
from numba.core import types
from numba.extending import overload

from ..._threadpool import blas_limit, current_limit
from ...enums import ActivationFunction as AF
from . import _cache
from .._shared.lstm_kernels import LSTMStepPlan, LSTMWeights, repeated
from ._progress import claim, count_up, wait_for
from ._stream import LINE_BYTES, prefetch, store_fence, stream_copy
from ._tiles import (COLUMN_ROWS, PACK_ROWS, VECTOR_BYTES, column_product, pack_rows,
                           pack_size, packed_product, packed_rest_product, packs, paired, paired_product,
                           product, row_product, transposed_product, wide_loops)

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry

__all__ = ["CHUNK_COLUMNS", "FAST_MATH", "SUM_MATH", "OVERLAP_COLUMNS",
           "OVERLAP_PIECES", "OVERLAP_STEP_MAX", "ROW_PAD", "THREADED_STEP_MIN",
           "serves", "step_parts", "group_sequences", "chunk_steps", "overlaps", "overlap_pieces",
           "wide_rows", "forward", "backward"]

#: Columns (steps × sequences) per chunk of the input projection and of the weight-gradient
#: products. 1024 keeps each product large and a chunk's projection, which the steps read
#: back, at ``4H × 1024`` elements (4 MiB at H = 256 in float32), most of it still in the
#: caches: against 4096 columns, the long row (T = 2000, N = 8, H = 256) took 0.89–0.92× the
#: time forward and 0.90–0.95× a training step, L (2 chunks instead of 1) 0.97–0.99×, XL
#: the same; the other benchmark shapes are one chunk either way.
CHUNK_COLUMNS = 1024

#: Length of the blocks of the shared axis in which the register tile makes the gradient
#: products of a backward (:func:`_tile_weight_gradients`, :func:`_tile_input_gradient`): a
#: twelve-row block of the left operand (12 KiB of float32) then stays in L1 from one panel of
#: columns to the next, and the right operand's block in L2. Unblocked, a chunk's 1 024
#: columns made the tile's products slower than OpenBLAS's.
TILE_BLOCK = 256

#: The kernels' fast-math flags: all of LLVM's but ``arcp`` (division by a reciprocal) and
#: ``reassoc`` (reordering arithmetic), so that a vectorized loop and its scalar remainder do the
#: same operations in the same order and give every element the same bits. Which of the two
#: computes an element changes with the number of threads (each thread's run of units) and with
#: the run-time checks that the loop's arrays do not overlap, which read their addresses: with
#: ``arcp``, LLVM divided by a reciprocal estimate refined once in the vectorized loops and
#: exactly in their remainders (a gate's value differed in the last bit for about 1.5 % of the
#: elements; the suite's hostile-input test once saw one input give two answers in two calls);
#: with ``reassoc``, on a machine whose CPU LLVM named ``rocketlake`` (a KVM guest on an AVX-512
#: Xeon, family 6 model 207), the backward pass's gate gradients differed in the last bit for up
#: to a third of the elements (the suite's check of this had passed on that model before). Exact
#: division costs little more (the five gate functions of a unit 2.0–2.1 ns against 1.9–2.0,
#: about 0.3 µs a step of M's 2 048 units, one thread); the passes need no reordering to
#: vectorize (their loops hold no sums): 1.84–1.85 ns a unit forward, 1.02 backward, with and
#: without it.
FAST_MATH = {"nnan", "ninf", "nsz", "contract", "afn"}

#: :data:`FAST_MATH` and ``reassoc``, for the kernels whose loops are sums (the bias and peephole
#: gradients of a chunk): a sum vectorizes only when it may be reordered, and it is computed by
#: one loop whatever the run, so its bits follow the shapes alone.
SUM_MATH = FAST_MATH | {"reassoc"}

#: Compiled kernels: no GIL, fast math, the NumPy error model, cached on disk.
_kernel = numba.njit(nogil=True, fastmath=FAST_MATH, error_model="numpy", cache=True)
_threaded = numba.njit(nogil=True, fastmath=FAST_MATH, error_model="numpy", cache=True, parallel=True)
_inline = numba.njit(nogil=True, fastmath=FAST_MATH, error_model="numpy", cache=True, inline="always")
_summing = numba.njit(nogil=True, fastmath=SUM_MATH, error_model="numpy", cache=True)
_summing_threaded = numba.njit(nogil=True, fastmath=SUM_MATH, error_model="numpy", cache=True, parallel=True)

# BLAS ?gemm through Numba's own helper, which calls SciPy's BLAS (scipy.linalg.cython_blas);
# unlike a ctypes pointer it is resolved by name, so the kernels that call it can be cached.
numba.np.linalg.ensure_blas()
_xxgemm = types.ExternalFunction("numba_xxgemm", types.intc(
    types.char, types.char, types.char, types.intp, types.intp, types.intp, types.voidptr, types.voidptr,
    types.intp, types.voidptr, types.intp, types.voidptr, types.voidptr, types.intp))
_NO, _YES = 78, 84  # 'N', 'T'

# The rational tanh's coefficients: numerator odd in x (x·P(x²)), denominator even (Q(x²)),
# as float32 constants so that float32 arithmetic stays float32 (and vectorizes).
_CLAMP = np.float32(7.90531110763549805)
_P0, _P1, _P2, _P3 = (np.float32(4.89352455891786e-03), np.float32(6.37261928875436e-04),
                      np.float32(1.48572235717979e-05), np.float32(5.12229709037114e-08))
_P4, _P5, _P6 = (np.float32(-8.60467152213735e-11), np.float32(2.00018790482477e-13),
                 np.float32(-2.76076847742355e-16))
_Q0, _Q1, _Q2, _Q3 = (np.float32(4.89352518554385e-03), np.float32(2.26843463243900e-03),
                      np.float32(1.18534705686654e-04), np.float32(1.19825839466702e-06))


def serves(plan: LSTMStepPlan) -> bool:
    """True for the cells these kernels compute: the default activations, with no, diagonal
    or full peepholes (any lengths; the stack zeroes the states of length-0 sequences)."""
    acts = plan.activations
    return (acts[0].function is AF.tanh and all(plan.halved[1:])
            and plan.hidden_activation.function is AF.tanh)


#: Smallest product ``4H·H·N`` of a step whose units are shared out over threads
#: (:func:`step_parts`); below it one thread with BLAS is faster (the demo's model, 2¹⁷: 0.70 ms
#: against 0.85 forward with two threads, 2.4 against 5.7 for a training step).
THREADED_STEP_MIN = 1 << 19


@functools.cache
def _cheap_parallel_regions() -> bool:
    """True when Numba's threading layer starts a parallel region in about a microsecond (OpenMP
    or TBB, whose threads wait spinning); its ``workqueue`` layer takes about 80 µs a region,
    more than a step's work."""
    _touch_threads(np.zeros(max(numba.get_num_threads(), 1)))
    return bool(numba.threading_layer() in ("omp", "tbb"))


def threads_matter(hidden_size: int, batch: int) -> bool:
    """Whether :func:`step_parts` depends on the threads in force: steps of at least
    :data:`THREADED_STEP_MIN` multiply-adds over several sequences."""
    return batch >= 2 and 4 * hidden_size * hidden_size * batch >= THREADED_STEP_MIN


def step_parts(hidden_size: int, batch: int) -> int:
    """Threads that share out the units of each step and the products of a call
    (:func:`_forward_threads`, :func:`_backward_threads`): Numba's thread count for steps of
    at least :data:`THREADED_STEP_MIN` multiply-adds over several sequences when parallel
    regions are cheap, else 1 (the steps on the calling thread, BLAS's own threads in the
    products). A thread limit in force (a layer's ``n_threads``, :func:`blas_limit`) caps it."""
    if not threads_matter(hidden_size, batch):
        return 1
    return _threads_in_force()


def _threads_in_force() -> int:
    """Numba's thread count, capped by a thread limit in force, when parallel regions are
    cheap; else 1."""
    threads = numba.get_num_threads()
    limit = current_limit()
    if limit:
        threads = min(threads, limit)
    if threads < 2:
        return 1
    return threads if _cheap_parallel_regions() else 1


def chunk_steps(seq_len: int, batch: int) -> int:
    """Steps per chunk: :data:`CHUNK_COLUMNS` columns, at least one step, at most ``seq_len``."""
    return max(1, min(seq_len, CHUNK_COLUMNS // max(batch, 1)))


#: An overlapped backward's pieces are at most ``⌈T / OVERLAP_PIECES⌉`` steps long
#: (:func:`overlap_pieces`, :func:`_backward_overlapped`): each piece's products start as soon
#: as it is walked.
OVERLAP_PIECES = 8

#: Largest step, ``4H·H·N`` multiply-adds (exclusive), whose backward on two threads is
#: overlapped (:func:`overlaps`): on such steps a walk shared out over two threads gains
#: little over one. Measured (training steps, blocks alternated in one process, overlapped
#: against shared out): 2¹⁹–2²⁰ (H = 64 to 128, N = 8 to 32) 0.85–0.96; 2²¹ (H = 256, N = 8)
#: 1.04; 2²² 1.12–1.41; L's 2²³ 1.05–1.08.
OVERLAP_STEP_MAX = 1 << 21

#: Most columns (steps × sequences) of a layer whose backward is overlapped: its gate
#: gradients are kept for the whole sequence, so at most one chunk's worth
#: (:data:`CHUNK_COLUMNS`), the scratch the shared-out backward takes.
OVERLAP_COLUMNS = CHUNK_COLUMNS


def _piece_steps(seq_len: int) -> int:
    """Most steps in a piece of an overlapped backward (:func:`overlap_pieces`): the sequence
    over :data:`OVERLAP_PIECES`, rounded up."""
    return -(-seq_len // OVERLAP_PIECES)


def overlaps(parts: int, seq_len: int, batch: int, hidden_size: int) -> bool:
    """True when a backward on ``parts`` threads is overlapped (:func:`_backward_overlapped`):
    two threads, steps below :data:`OVERLAP_STEP_MAX`, at most :data:`OVERLAP_COLUMNS` columns
    and at least two pieces of steps."""
    return (parts == 2 and 4 * hidden_size * hidden_size * batch < OVERLAP_STEP_MAX
            and seq_len * batch <= OVERLAP_COLUMNS and _piece_steps(seq_len) < seq_len)


@functools.lru_cache(maxsize=64)
def overlap_pieces(seq_len: int, hidden_size: int, input_size: int) -> np.ndarray:
    """The pieces an overlapped backward walks the steps in (:func:`_backward_overlapped`),
    as bounds of the walking index ``k`` (ascending, from 0 to ``seq_len``; the walk goes from
    the last piece to the first). The walking thread makes the first piece's products (the
    first time steps) once its walk is done; the other thread makes the others' while the walk
    goes on. Walking a step costs about ``1.5·H / (2I + H)`` of its products (the products hold
    ``2I + H`` multiply-adds per gate row and step, the walk ``H`` and its fused pass): with
    ``r`` the inverse and ``P`` = :data:`OVERLAP_PIECES`, the walker takes ``(2 + (r − 1)·T +
    (P − 2)/2) / 2r`` steps (at least one, at most ``T − 1``), which evens out the two threads'
    work, a piece's fixed cost half a walked step. The pieces walked first are 2, 4, 8… steps
    long, so that the other thread starts after two steps instead of a whole piece; the rest
    are even, at most ``⌈T / P⌉`` steps. Made once per shape; read only."""
    cap = _piece_steps(seq_len)
    ratio = (2 * input_size + hidden_size) / (1.5 * hidden_size)
    first = min(2, cap)
    walker = round((first + (ratio - 1.0) * seq_len + 0.5 * (OVERLAP_PIECES - 2)) / (2.0 * ratio))
    walker = min(max(walker, 1), seq_len - 1)
    others = seq_len - walker
    sizes = []  # walk order
    size, done = first, 0
    while size < cap and done + size < others:
        sizes.append(size)
        done += size
        size *= 2
    rest = others - done
    count = -(-rest // cap)
    sizes += [rest // count + (1 if i < rest % count else 0) for i in range(count)]
    sizes.append(walker)
    bounds = np.cumsum([0] + sizes[::-1], dtype=np.int64)
    bounds.flags.writeable = False
    return bounds


@functools.lru_cache(maxsize=64)
def _widest_piece(seq_len: int, hidden_size: int, input_size: int) -> int:
    """Steps in the longest of the pieces :func:`overlap_pieces` gives (made once per shape)."""
    return int(np.max(np.diff(overlap_pieces(seq_len, hidden_size, input_size))))


# --------------------------------------------------------------------------------------
# Building blocks.
# --------------------------------------------------------------------------------------
def _tanh(x):  # pragma: no cover - replaced by the overload below inside compiled code
    """tanh(x) in compiled code: the rational approximation for float32, ``math.tanh`` else."""
    return math.tanh(x)


@overload(_tanh, inline="always", jit_options=dict(fastmath=FAST_MATH, error_model="numpy"))
def _tanh_typed(x):
    """Chosen by the argument's type when the kernel is compiled, so the loops hold no branch
    between the two (a run-time flag left both paths in the vectorized loop: 65 ns per unit
    instead of 4)."""
    if x != types.float32:
        return lambda x: math.tanh(x)

    def rational(x):
        x = min(max(x, -_CLAMP), _CLAMP)
        x2 = x * x
        p = ((((((_P6 * x2 + _P5) * x2 + _P4) * x2 + _P3) * x2 + _P2) * x2 + _P1) * x2 + _P0)
        q = (((_Q3 * x2 + _Q2) * x2 + _Q1) * x2 + _Q0)
        return x * p / q

    return rational


def _runtime(value):  # pragma: no cover - replaced by the overload below inside compiled code
    """``value`` itself."""
    return value


@overload(_runtime)
def _runtime_typed(value):
    """In compiled code, ``value`` typed as a value known at run time, not as a literal. A
    constant argument (``0``, ``False``) reaches the kernel it is passed to typed as that
    constant (``Literal[int](0)``), and Numba compiles the kernel again for it, beside the
    specialization the kernel's other callers take: 12 s more of a cold first call for
    :func:`_forward_part`'s. Passed through ``_runtime``, the constant takes theirs. Not inlined
    into Numba's IR, where it would be the constant again; LLVM inlines the call."""
    return lambda value: value


@_threaded
def _touch_threads(flags):
    """A parallel region that does nothing useful: it makes Numba choose its threading layer."""
    for p in numba.prange(flags.size):
        flags[p] = 1.0


@_kernel
def _mm(a, trans_a, b, trans_b, c, beta):
    """``c = op(a) @ op(b) + beta·c`` on 2-D arrays; ``c``'s rows must be unit-stride (any row
    stride), operands whose rows are not are copied first. BLAS sees each row-major array as
    the column-major transpose, so it computes ``cᵀ = op(b)ᵀ op(a)ᵀ``."""
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    a = _row_major(a)
    b = _row_major(b)
    if m == 0 or n == 0:
        return
    if k == 0:  # an empty sum; beta = 0 overwrites, as BLAS does (whatever c held, NaN included)
        for r in range(m):
            for s in range(n):
                c[r, s] = 0.0 if beta == 0.0 else beta * c[r, s]
        return
    scalars = np.empty(2, c.dtype)
    scalars[0] = 1.0
    scalars[1] = beta
    _xxgemm(115 if c.itemsize == 4 else 100, _YES if trans_b else _NO, _YES if trans_a else _NO, n, m, k,
            scalars.ctypes, b.ctypes, _leading(b), a.ctypes, _leading(a), scalars[1:].ctypes, c.ctypes,
            _leading(c))


@_summing
def _narrow_product(a, width, b, c, beta):
    """``c = a[:, :width] @ b + beta·c`` for a ``b`` (width, N) of fewer columns than a vector
    holds, two or more (a step's ``U h`` or ``Uᵀ dz`` for so few sequences; one sequence takes
    :func:`~._tiles.row_product`): one dot product of runs per element of ``c``, four
    rows of ``a`` at a time against a column of ``b`` copied to a run. ``a`` is contiguous
    (its rows padded: :func:`wide_rows`), so that each row is a unit-stride run the compiler
    knows; ``beta`` 0 overwrites ``c``, 1 adds to it. BLAS packs ``a`` at every call for such
    products. On the Zen 3 guest (one thread, float32): ``U h`` for 4 sequences at H = 64 took
    4.9–5.8 µs through BLAS and 3.2 here, for 7 at H = 128 34–36 µs against 17; for one
    sequence, H = 64, 5.6–6.3 µs through BLAS, 2.2–2.4 here and 0.96 as a row."""
    m, n = c.shape
    runs = np.empty((n, width), c.dtype)
    for j in range(width):
        for s in range(n):
            runs[s, j] = b[j, s]
    zero = c.dtype.type(0.0)
    whole = m - m % 4
    for r in range(0, whole, 4):
        a0, a1, a2, a3 = a[r], a[r + 1], a[r + 2], a[r + 3]
        for s in range(n):
            run = runs[s]
            s0, s1, s2, s3 = zero, zero, zero, zero
            for j in range(width):
                v = run[j]
                s0 += a0[j] * v
                s1 += a1[j] * v
                s2 += a2[j] * v
                s3 += a3[j] * v
            if beta == 0.0:
                c[r, s], c[r + 1, s], c[r + 2, s], c[r + 3, s] = s0, s1, s2, s3
            else:
                c[r, s] += s0
                c[r + 1, s] += s1
                c[r + 2, s] += s2
                c[r + 3, s] += s3
    for r in range(whole, m):
        row = a[r]
        for s in range(n):
            run = runs[s]
            total = zero
            for j in range(width):
                total += row[j] * run[j]
            c[r, s] = total if beta == 0.0 else c[r, s] + total


@_inline
def _biased_product(wx, bias, x_rows, projection, r0, r1, width):
    """Rows ``r0 … r1 − 1`` of ``projection[:, :width]`` = ``W xᵀ + b`` (``W`` = ``wx[r0:r1]``,
    ``b`` added to each row): the rows filled with the bias, then the product added to them by
    BLAS (``beta = 1``). With ``beta = 0`` BLAS clears its output in a pass of its own before
    the product, and adding the bias afterwards took a third pass over the chunk's projection
    (4 MiB on the L row: 70–80 µs a chunk for each thread's half). ``projection`` whole, not a
    view of its columns, so that the compiler knows the rows it fills to be unit-stride."""
    for r in range(r0, r1):
        b = bias[r]
        for column in range(width):
            projection[r, column] = b
    _mm(wx[r0:r1], False, x_rows, True, projection[r0:r1, :width], 1.0)


@_inline
def _row_major(m):
    """``m`` itself when its rows are unit-stride (every operand the kernels build), else a
    row-major copy: BLAS reads each operand through its row stride alone."""
    if m.shape[1] <= 1 or m.strides[1] == m.itemsize:
        return m
    return np.ascontiguousarray(m)


@_inline
def _leading(m):
    """BLAS's leading dimension of a row-major matrix: its row stride in elements. A single
    row may have any stride (NumPy leaves a length-1 axis's stride free), so it gets its width."""
    if m.shape[0] == 1:
        return max(m.shape[1], 1)
    return m.strides[0] // m.itemsize


@numba.njit(cache=True, inline="always")
def _rows(flat, stride, start, length):
    """Views of four runs of ``length`` elements of a 1-D array, run ``k`` starting at
    ``k·stride + start`` (a thread's units in each row block of a feature-major array). A
    tuple, not a list: a list of the views, made at every step, cost 0.4–0.6 µs a pass (its
    allocation and the references it holds; H = 64, N = 1: the pass 0.86–0.90 µs against
    1.36–1.56 with the list)."""
    a, b, c, d = start, stride + start, 2 * stride + start, 3 * stride + start
    return flat[a:a + length], flat[b:b + length], flat[c:c + length], flat[d:d + length]


@numba.njit(cache=True, inline="always")
def _six_rows(flat, stride, start, length):
    """:func:`_rows` for six runs (a cache block's rows)."""
    e, f = 4 * stride + start, 5 * stride + start
    return _rows(flat, stride, start, length) + (flat[e:e + length], flat[f:f + length])


@_inline
def _store_columns(dz, d_gates, r0, r1, first):
    """Rows ``r0 … r1 − 1`` of a step's ``dz`` (4H, N) into its columns ``first … first + N − 1``
    of the chunk's gate gradients ``d_gates`` (4H, chunk·N). Each row's columns are a short run
    in a large array the caches do not hold, so an ordinary store first reads each line from
    memory: when a row of ``dz`` is a whole number of cache lines, the runs are stored past
    the caches (:func:`._stream.stream_copy`), whole lines that need no read
    (``d_gates`` is line-aligned, :func:`_aligned`). The caller ends the step with
    :func:`._stream.store_fence` before anything reads them."""
    batch = dz.shape[1]
    if (batch * dz.itemsize) % LINE_BYTES == 0:
        for r in range(r0, r1):
            stream_copy(dz[r], d_gates[r, first:first + batch])
    else:
        for r in range(r0, r1):
            for n in range(batch):
                d_gates[r, first + n] = dz[r, n]


@_inline
def _gates(zg, zf, zi, zo, c_prev, pg, pf, pi, po, half):
    """The cell's update from its pre-activations (halved for the sigmoid gates, bias
    included) and the diagonal peepholes (0 without them): ``(g, f, i, o, c_t, tanh(c_t))``;
    ``half`` is 0.5 in the dtype."""
    g, f, i, c = _pre_cell(zg, zf, zi, c_prev, pg, pf, pi, half)
    o, a = _post_cell(zo, c, po, half)
    return g, f, i, o, c, a


@_inline
def _pre_cell(zg, zf, zi, c_prev, pg, pf, pi, half):
    """The candidate, forget and input gates and the new cell: ``(g, f, i, c_t)``."""
    g = _tanh(zg + pg * c_prev)
    f = half * _tanh(zf + pf * c_prev) + half
    i = half * _tanh(zi + pi * c_prev) + half
    return g, f, i, f * c_prev + i * g


@_inline
def _post_cell(zo, c, po, half):
    """The output gate, which sees the new cell, and ``tanh(c_t)``: ``(o, tanh(c_t))``."""
    return half * _tanh(zo + po * c) + half, _tanh(c)


@_inline
def _gate_run(zg, zf, zi, zo, c_prev, pg, pf, pi, po, g_row, f_row, i_row, o_row, a_row, cell, hid):
    """The fused forward pass over one run of elements (1-D views of equal length, unit
    stride): the gates from their pre-activations ``z*`` and peepholes ``p*`` into the cache
    rows, the new cell and hidden values into ``cell`` and ``hid``. Inlined, so each caller's
    loop is compiled (and vectorized) in place."""
    half = cell.dtype.type(0.5)
    for e in range(cell.size):
        g, f, i, o, c, a = _gates(zg[e], zf[e], zi[e], zo[e], c_prev[e], pg[e], pf[e], pi[e], po[e], half)
        g_row[e] = g
        f_row[e] = f
        i_row[e] = i
        o_row[e] = o
        a_row[e] = a
        cell[e] = c
        hid[e] = o * a


@_inline
def _state_run(zg, zf, zi, zo, c_prev, cell, hid):
    """:func:`_gate_run` for inference without peepholes: only the new cell and hidden values,
    no cache rows (nothing reads them) and no peephole terms (all zero). Its own loop: a flag
    inside :func:`_gate_run`'s loop would keep it from vectorizing."""
    half = cell.dtype.type(0.5)
    zero = cell.dtype.type(0.0)  # the peepholes: constant zeros, which the compiler folds away
    for e in range(cell.size):
        _, _, _, o, c, a = _gates(zg[e], zf[e], zi[e], zo[e], c_prev[e], zero, zero, zero, zero, half)
        cell[e] = c
        hid[e] = o * a


@_inline
def _forward_step_full(h, z, pe, block, c_next, h_next, full_out):
    """:func:`_forward_step` for a full output peephole ``full_out`` (H, H), which sees the new
    cell of every unit: one pass to the new cell, the product ``P_o c_t`` into the output
    gate's rows of ``z``, one pass for the output gate and the hidden state."""
    half = block.dtype.type(0.5)
    batch = block.shape[1]
    m = h * batch
    c_prev, g_row, f_row, i_row, o_row, a_row = _six_rows(block.reshape(6 * m), m, 0, m)
    zg, zf, zi, zo = _rows(z.reshape(4 * m), m, 0, m)
    pg, pf, pi, po = pe[0], pe[1], pe[2], pe[3]
    cell, hid = c_next.reshape(m), h_next.reshape(m)
    for e in range(m):
        g, f, i, c = _pre_cell(zg[e], zf[e], zi[e], c_prev[e], pg[e], pf[e], pi[e], half)
        g_row[e] = g
        f_row[e] = f
        i_row[e] = i
        cell[e] = c
    _mm(full_out, False, c_next, False, z[3 * h:], 1.0)
    for e in range(m):
        o, a = _post_cell(zo[e], cell[e], po[e], half)
        o_row[e] = o
        a_row[e] = a
        hid[e] = o * a


@_inline
def _forward_step(h, z, pe, block, c_next, h_next, light):
    """The fused pass of one step over every unit and sequence: reads ``z`` (4H, N) (``U h``
    plus the projection), writes the cache block's rows and the new cell and hidden state
    (``c_next``, ``h_next``: contiguous (H, N), written in place). ``pe`` (4, H·N) holds the
    diagonal peepholes repeated over the sequences (zeros without them). ``light``: inference
    without peepholes (:func:`_state_run`: no cache rows).

    The pass runs over the ``H·N`` elements of each gate row block as one unit-stride loop, on
    one 1-D view per row block: a nest over units and sequences, vectorized along the
    sequences, left 8 sequences scalar (8.3 ns per unit at H = 256, against 2.5 for 16 or
    more), and indexing one array at offsets ``r·H + j`` left the loop scalar too (13.3 ns per
    unit, against 1.6 with the views; H = 64, N = 1, float32). Array writes stay in the loop
    body: inside a helper function, or behind a branch in the loop, they kept it from
    vectorizing (15× slower; checked in the assembly, scalar ``vfmadd…ss`` instead of packed
    ``…ps``)."""
    batch = block.shape[1]
    m = h * batch
    c_prev, g_row, f_row, i_row, o_row, a_row = _six_rows(block.reshape(6 * m), m, 0, m)
    zg, zf, zi, zo = _rows(z.reshape(4 * m), m, 0, m)
    cell, hid = c_next.reshape(m), h_next.reshape(m)
    if light:
        _state_run(zg, zf, zi, zo, c_prev, cell, hid)
    else:
        pg, pf, pi, po = pe[0], pe[1], pe[2], pe[3]
        _gate_run(zg, zf, zi, zo, c_prev, pg, pf, pi, po, g_row, f_row, i_row, o_row, a_row, cell, hid)


# --------------------------------------------------------------------------------------
# Forward.
# --------------------------------------------------------------------------------------
@_inline
def _step_arrays(k, seq_len, reverse, steps, hidden, h0, c0, h_fin, c_fin):
    """Walking step ``k``'s time step ``t``, its cache block and hidden state before the step
    (set from ``h0``/``c0``, or zeros, at ``k = 0``: :func:`_start_states`), and where the new
    cell and hidden state go (:func:`_step_views`)."""
    if k == 0:
        _start_states(seq_len, reverse, steps, hidden, h0, c0)
    return _step_views(k, seq_len, reverse, steps, hidden, h_fin, c_fin)


@_inline
def _start_states(seq_len, reverse, steps, hidden, h0, c0):
    """The states before the first walking step: ``h0``/``c0``, or zeros, into its hidden state
    and the cell row of its cache block."""
    h = steps.shape[1] // 6
    blocks = steps.shape[0]
    t = seq_len - 1 if reverse else 0
    block = steps[t % blocks]
    h_prev = hidden[t % blocks]
    for j in range(h):
        for n in range(steps.shape[2]):
            h_prev[j, n] = h0[j, n] if h0.size else 0.0
            block[j, n] = c0[j, n] if c0.size else 0.0


@_inline
def _step_views(k, seq_len, reverse, steps, hidden, h_fin, c_fin):
    """Walking step ``k``'s time step ``t``, its cache block and hidden state before the step,
    and where the new cell and hidden state go: the next step's block and hidden state, or the
    final states at the last step. These are contiguous (H, N) arrays, which the fused passes
    write in place as one run of elements (passes that wrote scratch rows and copied them out
    took about 5 % longer forward on the M, L and long rows).
    """
    h = steps.shape[1] // 6
    blocks = steps.shape[0]
    t = seq_len - 1 - k if reverse else k
    block = steps[t % blocks]
    h_prev = hidden[t % blocks]
    if k == seq_len - 1:
        return t, block, h_prev, c_fin[:], h_fin[:]
    following = t - 1 if reverse else t + 1
    return t, block, h_prev, steps[following % blocks, :h], hidden[following % blocks]


@_kernel
def _recur(projection, chunk_first, u, u_t, pe, full_pre, full_out, h0, c0, lengths, steps, hidden, out,
           h_fin, c_fin, reverse, k_begin, k_end, light):
    """The forward steps ``k_begin … k_end − 1`` (in walking order); ``projection`` holds
    ``W x + b`` of the chunk that starts at time step ``chunk_first``. Arrays as in
    :func:`_forward` (``u`` and ``u_t`` with their padded rows)."""
    wide_loops()
    six_h, batch = steps.shape[1], steps.shape[2]
    seq_len = out.shape[0]
    h = six_h // 6
    # U h lands in memory of the kernel's own, which the compiler knows aliases nothing else: the
    # fused pass then needs few enough run-time overlap checks to be vectorized (measured: with
    # z handed in, the pass stayed scalar and the step took 1.8× as long).
    z = np.empty((4 * h, batch), steps.dtype)
    tiled = batch * z.itemsize >= VECTOR_BYTES  # a vector's worth of sequences: the tile product
    u_rows = u[:, :h]
    # one sequence: hᵀ Uᵀ as a row (the true Uᵀ), the halved gates' ½ applied to its sums (exact)
    u_t_rows = u_t[:, :4 * h]
    h_row = np.empty((1, h), steps.dtype)
    z_row = np.empty((1, 4 * h), steps.dtype)
    half = steps.dtype.type(0.5)
    for k in range(k_begin, k_end):
        t, block, h_prev, c_next, h_next = _step_arrays(k, seq_len, reverse, steps, hidden, h0, c0, h_fin,
                                                        c_fin)
        first = (t - chunk_first) * batch
        with_product = k > 0 or h0.size > 0  # U @ 0 adds nothing
        if with_product and tiled:  # z = the projection's columns + U h: the fused pass reads z alone
            product(u_rows, h_prev, projection[:, first:first + batch], z)
        elif with_product and batch == 1:
            for j in range(h):
                h_row[0, j] = h_prev[j, 0]
            row_product(h_row, u_t_rows, z_row)
            for r in range(h):
                z[r, 0] = projection[r, first] + z_row[0, r]
            for r in range(h, 4 * h):
                z[r, 0] = projection[r, first] + half * z_row[0, r]
        else:
            if batch == 1:  # one loop: a nest of one-trip loops cost 0.2 µs a step here
                for r in range(4 * h):
                    z[r, 0] = projection[r, first]
            else:
                for r in range(4 * h):
                    for n in range(batch):
                        z[r, n] = projection[r, first + n]
            if with_product:
                _narrow_product(u, h, h_prev, z, 1.0)
        if full_pre.size:  # full peepholes of g, f, i on the cell before the step
            _mm(full_pre, False, block[:h], False, z, 1.0)
        if full_out.size:
            _forward_step_full(h, z, pe, block, c_next, h_next, full_out)
        else:
            _forward_step(h, z, pe, block, c_next, h_next, light)
        out_t = out[t]
        for n in range(batch):
            if lengths.size and t >= lengths[n]:  # past its length: keep the state, output 0
                for j in range(h):
                    c_next[j, n] = block[j, n]
                    h_next[j, n] = h_prev[j, n]
                    out_t[n, j] = 0.0
            else:
                for j in range(h):
                    out_t[n, j] = h_next[j, n]


@_inline
def _chunk(seq_len, chunk, q, reverse):
    """Chunk ``q``: its walking steps ``k_begin … k_end − 1`` and its first time step."""
    k_begin = q * chunk
    k_end = min(seq_len, k_begin + chunk)
    first_t = seq_len - k_end if reverse else k_begin
    return k_begin, k_end, first_t


@_inline
def _piece(seq_len, bounds, q, reverse):
    """Piece ``q`` of ``bounds`` (:func:`overlap_pieces`): its walking steps ``k_begin …
    k_end − 1`` and its first time step."""
    k_begin, k_end = bounds[q], bounds[q + 1]
    first_t = seq_len - k_end if reverse else k_begin
    return k_begin, k_end, first_t


@_inline
def _projection_steps(projection, batch):
    """Steps per chunk of a forward's projection scratch, (4H, chunk·N + ROW_PAD) as
    :func:`_forward_call` makes it."""
    return (projection.shape[1] - ROW_PAD) // batch


@_kernel
def _forward(x2, wx, bias, u, u_t, pe, full_pre, full_out, h0, c0, lengths, steps, hidden, outs, h_fin,
             c_fin, projection, reverse, light):
    """One layer and direction forward, on one thread (BLAS may use more).

    ``x2`` (T·N, I) the layer input (rows ``t·N + n``); ``wx`` (4H, I), ``bias`` (4H,) and ``u``
    (4H, H + ROW_PAD: :func:`wide_rows`) the forward weights (halved rows), ``u_t`` (H, 4H +
    ROW_PAD) the true ``Uᵀ`` (the steps of one sequence take it), ``pe`` (4, H·N)
    the diagonal peepholes repeated over the sequences (zeros without them), ``full_pre``
    (4H, H) the full peepholes of the candidate, forget and input gates and ``full_out`` (H, H)
    the output gate's ((0, 0) without);
    ``h0``/``c0`` (H, N), or (0, 0) for zeros; ``lengths`` (N,) or (0,); ``steps`` (T, 6H, N)
    and ``hidden`` (T, H, N) the cache, or (2, 6H, N) and (2, H, N) taken in turn when nothing
    is kept (inference); ``outs[0]`` (T, N, H) the output (any strides; ``outs`` as
    :func:`_any_layout` makes it); ``h_fin``/``c_fin`` (H, N) the final states; ``projection``
    (4H, chunk·N + ROW_PAD) scratch (:func:`_forward_call`); ``light`` for inference without
    peepholes (the steps write no cache rows: :func:`_state_run`).

    A sequence past its length keeps its state and outputs zeros; its cache block holds
    finite values that backward ignores (as the reference's does).
    """
    out = outs[0]
    seq_len, batch = out.shape[0], out.shape[1]
    chunk = _projection_steps(projection, batch)
    for q in range((seq_len + chunk - 1) // chunk):
        k_begin, k_end, first_t = _chunk(seq_len, chunk, q, reverse)
        _project_chunk(wx, bias, x2, projection, first_t, k_end - k_begin, batch)
        _recur(projection, first_t, u, u_t, pe, full_pre, full_out, h0, c0, lengths, steps, hidden, out,
               h_fin, c_fin, reverse, k_begin, k_end, light)


@_kernel
def _project_chunk(wx, bias, x2, projection, first_t, count, batch):
    """``projection[:, :count·N]`` = ``W x + b`` for the ``count`` steps from ``first_t``: one
    product and one pass."""
    wide_loops()
    width = count * batch
    rows = x2[first_t * batch:first_t * batch + width]
    _biased_product(wx, bias, rows, projection, 0, wx.shape[0], width)


# --------------------------------------------------------------------------------------
# Steps shared out over threads (few sequences: the recurrent product is skinny).
# --------------------------------------------------------------------------------------
@_inline
def _part(h, parts, p):
    """Thread ``p``'s units ``j0 … j1 − 1`` of ``h``: ``parts`` near-equal runs, cut at multiples
    of 16 units so that no two threads write one cache line of a state row."""
    j0 = (p * h // parts) // 16 * 16
    j1 = h if p == parts - 1 else ((p + 1) * h // parts) // 16 * 16
    return j0, j1


@_inline
def _following(k, k_end, t, chunk_first, batch, reverse):
    """The first column of a chunk's projection (from time step ``chunk_first``) that walking
    step ``k + 1`` reads, where walking step ``k`` is time step ``t``; −1 when ``k`` is the
    chunk's last walking step (``k_end − 1``: the next chunk is not projected yet)."""
    if k + 1 >= k_end:
        return -1
    return ((t - 1 if reverse else t + 1) - chunk_first) * batch


@_inline
def _ask_columns(projection, h, j0, j1, first, batch):
    """:func:`prefetch` the columns ``first … first + batch − 1`` of the four gates' rows of
    units ``j0 … j1 − 1`` in ``projection`` (contiguous, 4H rows)."""
    flat = projection.reshape(projection.size)
    stride = projection.shape[1]
    step = LINE_BYTES // projection.itemsize
    for g in range(4):
        for r in range(g * h + j0, g * h + j1):
            start = r * stride + first
            for c in range(start, start + batch, step):
                prefetch(flat, c)
            if batch > 1:  # the run's last line, where the run does not start on a line
                prefetch(flat, start + batch - 1)


@_kernel
def _forward_part(j0, j1, u, tiles, projection, first, following, pe, block, h_prev, c_next, h_next, out_t,
                  lengths, t, with_product, light, x2, operand, next_operand, bias_rows, next_t):
    """One step for the units ``j0 … j1 − 1``: their four gate rows of ``U h + W x + b`` (``U h``
    left out for a zero state), the fused cell update, the cache block's rows, the new states
    (``c_next``/``h_next`` (H, N)) and the output row ``out_t`` (N, H); a sequence past its
    length keeps its state and outputs zeros. ``pe`` (4, H·N) holds the diagonal peepholes
    repeated over the sequences (zeros without them); ``light``: inference without peepholes
    (no cache rows, :func:`_state_run`). Without an ``operand``, ``U h`` is
    :func:`paired_product` on the thread's rows of ``u``, which stay in its cache from step to
    step, added to the chunk's ``projection``. With one (``[h; x_t]`` (H + I, N)), ``tiles``
    (4, B, H + I, R) holds each gate's rows of the units' ``[U W]`` packed
    (:func:`_step_tiles`), and the products :func:`packed_product` and
    :func:`packed_rest_product` make of it and the operand, added to ``bias_rows`` (4H, N), are
    the whole ``U h + W x + b``; with ``next_t`` ≥ 0 the step then writes its share of the next
    step's operand into ``next_operand`` (:func:`_next_operand`: its units' rows of the new
    hidden state, and as many of time step ``next_t``'s rows of ``x2`` (T·N, I)).

    ``following`` is the first projection column the next step reads (:func:`_following`), or
    −1: the step asks for those columns of its units' rows before its products
    (:func:`_ask_columns`). Each step reads a run of every row of the chunk's projection: rows
    4 KiB and more apart, each run in a page of its own, where the processor's own prefetching
    does not follow it from step to step, and half of them made by the other thread.
    Alternated in one process with the kernels before (40 pairs of 40 ms blocks, median of the
    pairs' ratios): forward M 0.977, L 0.983, the long row 0.995, XL 1.004; a training step M
    0.983, the others within 0.99–1.04 (earlier runs of 20 pairs: M 0.962–0.978, L
    0.973–0.992, long 0.978–0.980)."""
    wide_loops()
    h = u.shape[1]
    batch = block.shape[1]
    count = j1 - j0
    m = count * batch
    if m == 0:
        return
    zl = np.empty((4, m), block.dtype)  # the thread's own: aliases nothing, so the pass vectorizes
    if following >= 0:  # the next step's columns of the units' rows, asked for a step ahead
        _ask_columns(projection, h, j0, j1, following, batch)
    if operand.size and tiles.shape[3] == COLUMN_ROWS:  # U h + W x + b, the column tile's blocks
        for g in range(4):
            column_product(tiles[g], operand, bias_rows[g * h + j0:g * h + j1], zl[g].reshape((count, batch)))
    elif operand.size:  # U h + W x + b: one product over [h; x]
        size = tiles.shape[3]
        whole = count // size
        done = whole * size
        for g in range(4):
            rows = zl[g].reshape((count, batch))
            added = bias_rows[g * h + j0:g * h + j1]
            packed_product(tiles[g, :whole], operand, added[:done], rows[:done])
            if done < count:
                packed_rest_product(tiles[g, whole], operand, added[done:], rows[done:])
    else:
        pairs = paired(h_prev)  # once for the four gates' products
        for g in range(4):
            rows = zl[g].reshape((count, batch))
            added = projection[g * h + j0:g * h + j1, first:first + batch]
            if with_product:
                paired_product(u[g * h + j0:g * h + j1], h_prev, pairs, added, rows)
            else:
                for jj in range(count):
                    for n in range(batch):
                        rows[jj, n] = added[jj, n]
    hn, a0 = h * batch, j0 * batch
    c_prev, g_row, f_row, i_row, o_row, a_row = _six_rows(block.reshape(6 * hn), hn, a0, m)
    pg, pf, pi, po = _rows(pe.reshape(4 * hn), hn, a0, m)
    zg, zf, zi, zo = zl[0], zl[1], zl[2], zl[3]
    cell = c_next.reshape(hn)[a0:a0 + m]
    hid = h_next.reshape(hn)[a0:a0 + m]
    if light:
        _state_run(zg, zf, zi, zo, c_prev, cell, hid)
    else:
        _gate_run(zg, zf, zi, zo, c_prev, pg, pf, pi, po, g_row, f_row, i_row, o_row, a_row, cell, hid)
    for n in range(batch):
        if lengths.size and t >= lengths[n]:  # past its length: keep the state, output 0
            for jj in range(count):
                j = j0 + jj
                c_next[j, n] = c_prev[jj * batch + n]
                h_next[j, n] = h_prev[j, n]
                out_t[n, j] = 0.0
        else:
            for jj in range(count):
                out_t[n, j0 + jj] = hid[jj * batch + n]
    if next_t >= 0:  # the next step's operand: these units' new hidden state, a share of its x
        _next_operand(next_operand, h_next, x2, next_t, j0, j1, 0, batch)


@_inline
def _next_operand(operand, h_next, x2, t, j0, j1, first, batch):
    """Rows ``j0 … j1 − 1`` of the hidden-state part of a step's operand ``[h; x_t]`` ((H + I, n):
    :func:`_forward_threads`, :func:`_sequence_group`) from ``h_next`` (H, n), and the same share
    of its input rows (``H + i0 … H + i1 − 1``, ``i0 = j0·I // H``) from time step ``t`` of
    sequences ``first … first + n − 1`` in ``x2`` (T·N, I, ``batch`` = N), transposed: the
    pieces of a step, which cover the units, cover the input too."""
    h, count = h_next.shape
    size_i = x2.shape[1]
    i0, i1 = j0 * size_i // h, j1 * size_i // h
    for j in range(j0, j1):
        for n in range(count):
            operand[j, n] = h_next[j, n]
    for n in range(count):
        row = x2[t * batch + first + n]
        for i in range(i0, i1):
            operand[h + i, n] = row[i]


@_threaded
def _steps_threads(parts, u, tiles, projection, chunk_first, pe, lengths, steps, hidden, out, h_fin, c_fin,
                   reverse, k_begin, k_end, with_state, light, claims, done, x2, operands, bias_rows):
    """The steps ``k_begin … k_end − 1`` in one parallel region: each step's units in ``parts``
    pieces (:func:`_part`, :func:`_forward_part`), which the threads take as they come to them.
    Thread ``p`` tries piece ``p`` first, so each keeps its rows of ``u`` in its cache from step
    to step, then the others (:func:`claim` on ``claims``, one flag per piece of each step, all
    zero at the call); ``done`` (one element, zero at the call) counts the pieces done, and a
    step begins once every piece of the step before is done. A thread only waits for pieces
    another thread has taken, so the steps end however many threads run the loop: one region
    for the chunk instead of one per step (about 1.4 µs each on M's steps).
    ``with_state``: the state before the first step is not zero. ``tiles`` (P, 4, B, H + I,
    PACK_ROWS): piece ``p``'s packed rows of ``[U W]`` (:func:`_step_tiles`), or an empty
    (1, 4, 0, 0, PACK_ROWS) array for none; ``light`` as in
    :func:`_forward_part`. With packed rows, ``operands`` (2, H + I, N) holds each step's
    ``[h; x_t]`` in turn (the first one made by :func:`_recur_threads`) and ``bias_rows``
    (4H, N) the bias repeated over the sequences: each step makes ``U h + W x + b`` in one
    product, and each piece writes its share of the next step's operand
    (:func:`_next_operand`); without, ``operands`` is (2, 0, 0) and ``projection`` holds the
    chunk's ``W x + b``."""
    h = u.shape[1]
    batch = steps.shape[2]
    seq_len = out.shape[0]
    fused = operands.shape[1] > 0
    for p in numba.prange(parts):
        for k in range(k_begin, k_end):
            i = k - k_begin
            wait_for(done, i * parts)
            t, block, h_prev, c_next, h_next = _step_views(k, seq_len, reverse, steps, hidden, h_fin, c_fin)
            operand, next_operand = operands[k % 2], operands[(k + 1) % 2]
            next_t = -1
            if fused and k + 1 < k_end:
                next_t = t - 1 if reverse else t + 1
            for s in range(parts):
                piece = (p + s) % parts
                if claim(claims, i * parts + piece):
                    j0, j1 = _part(h, parts, piece)
                    _forward_part(j0, j1, u, tiles[piece % tiles.shape[0]], projection,
                                  (t - chunk_first) * batch,
                                  -1 if fused else _following(k, k_end, t, chunk_first, batch, reverse), pe,
                                  block, h_prev, c_next, h_next, out[t], lengths, t, k > 0 or with_state,
                                  light, x2, operand, next_operand, bias_rows, next_t)
                    count_up(done)


@_threaded
def _project_threads(parts, wx, bias, x2, projection, first_t, count, batch):
    """:func:`_project_chunk` with the rows shared out over ``parts`` threads, each calling a
    one-thread BLAS (the caller holds BLAS to one thread: its own pool would fight these
    threads for the cores)."""
    rows = wx.shape[0]
    width = count * batch
    x_rows = x2[first_t * batch:first_t * batch + width]
    for p in numba.prange(parts):
        wide_loops()
        r0, r1 = p * rows // parts, (p + 1) * rows // parts
        _biased_product(wx, bias, x_rows, projection, r0, r1, width)


@_kernel
def _recur_threads(parts, projection, chunk_first, u, tiles, pe, h0, c0, lengths, steps, hidden, out, h_fin,
                   c_fin, reverse, k_begin, k_end, light, x2, operands, bias_rows):
    """:func:`_recur` with each step shared out over ``parts`` threads (:func:`_steps_threads`,
    whose first operand, with packed rows, is made here)."""
    if k_begin == 0:
        _start_states(out.shape[0], reverse, steps, hidden, h0, c0)
        if operands.shape[1]:
            t = out.shape[0] - 1 if reverse else 0
            _next_operand(operands[0], hidden[t % hidden.shape[0]], x2, t, 0, hidden.shape[1], 0,
                          out.shape[1])
    claims = np.zeros((k_end - k_begin) * parts, np.int64)
    done = np.zeros(1, np.int64)
    _steps_threads(parts, u, tiles, projection, chunk_first, pe, lengths, steps, hidden, out, h_fin, c_fin,
                   reverse, k_begin, k_end, h0.size > 0, light, claims, done, x2, operands, bias_rows)


@_kernel
def _forward_threads(parts, x2, wx, bias, u, tiles, pe, h0, c0, lengths, steps, hidden, outs, h_fin, c_fin,
                     projection, reverse, light):
    """:func:`_forward` with each step shared out over ``parts`` threads; ``u`` as there,
    ``tiles`` as in :func:`_steps_threads`, ``pe`` (4, H·N), ``light`` as in
    :func:`_forward_part`. With packed rows (``tiles``: :func:`_step_tiles`) the steps make
    their input's product too, one step at a time, and ``projection`` is not used; without,
    chunks of steps are projected first (:func:`_project_threads`)."""
    out = outs[0]
    seq_len, batch = out.shape[0], out.shape[1]
    h = steps.shape[1] // 6
    u_rows = u[:, :h]
    if tiles.shape[2]:
        operands = np.empty((2, h + x2.shape[1], batch), steps.dtype)
        bias_rows = np.empty((4 * h, batch), steps.dtype)
        for r in range(4 * h):
            for n in range(batch):
                bias_rows[r, n] = bias[r]
        first = _runtime(0)  # not a literal 0, which would compile _recur_threads a second time
        _recur_threads(parts, projection, first, u_rows, tiles, pe, h0, c0, lengths, steps, hidden, out,
                       h_fin, c_fin, reverse, first, seq_len, light, x2, operands, bias_rows)
        return
    no_operands = np.empty((2, 0, 0), steps.dtype)
    chunk = _projection_steps(projection, batch)
    for q in range((seq_len + chunk - 1) // chunk):
        k_begin, k_end, first_t = _chunk(seq_len, chunk, q, reverse)
        _project_threads(parts, wx, bias, x2, projection, first_t, k_end - k_begin, batch)
        _recur_threads(parts, projection, first_t, u_rows, tiles, pe, h0, c0, lengths, steps, hidden, out,
                       h_fin, c_fin, reverse, k_begin, k_end, light, x2, no_operands, no_operands[0])


#: Fewest multiply-adds of a call (``T·N·4H·(H + I)``), and of each group's step
#: (``4H·(H + I)·N / threads``), for which an inference too small to share its steps out
#: (:func:`step_parts`) still gives each thread a group of the sequences (:func:`group_parts`):
#: the groups share nothing between steps, so one parallel region serves the whole call.
#: Measured (float32, one layer, groups on two threads ÷ one thread, alternated in one
#: process): T 32, N 32, I = H = 32 (8.4 M) 0.66; I 1, H 32 (4.3 M) 0.86; T 8, N 32,
#: I = H = 32 (2.1 M) 0.71; T 32, N 16, I = H = 32 0.71; T 32, N 32, I = H = 16 (2.1 M, a
#: group's step 2¹⁵) 0.95; T 2, N 32, I = H = 32 (0.5 M) 1.42; T 32, N 32, I = H = 8 1.52.
GROUP_CALL_MIN = 1 << 21
GROUP_STEP_MIN = 1 << 16


def group_parts(seq_len: int, batch: int, hidden_size: int, input_size: int, dtype: np.dtype) -> int:
    """Threads for an inference whose steps stay on one thread (:func:`step_parts` 1), each
    walking a group of the sequences (:func:`_groups_threads`): the threads in force when
    :func:`group_sequences` takes them and the call and each group's step hold at least
    :data:`GROUP_CALL_MIN` and :data:`GROUP_STEP_MIN` multiply-adds; else 1."""
    step = 4 * hidden_size * (hidden_size + input_size) * batch
    if seq_len * step < GROUP_CALL_MIN:
        return 1
    threads = _threads_in_force()
    if threads < 2 or step < GROUP_STEP_MIN * threads or not group_sequences(threads, batch, dtype):
        return 1
    return threads


def group_sequences(parts: int, batch: int, dtype: np.dtype) -> bool:
    """True when an inference on ``parts`` threads gives each thread its own ``batch / parts``
    sequences, every step of them (:func:`_groups_threads`), instead of a share of each step's
    units: float32, ``batch`` a multiple of ``parts`` and each group's columns packed products'
    own (:func:`packs`). In float64 every thread's reading all of ``[U W]`` a step costs more
    (twice the bytes): alternated with the shared-out steps, L's shape took 0.98 the time, M's
    0.98 and XL's 1.05."""
    return (np.dtype(dtype) == np.float32 and parts > 1 and batch % parts == 0
            and packs(batch // parts, dtype))


@_threaded
def _groups_threads(parts, u, tiles, pe, h0, c0, lengths, x2, bias, outs, h_fin, c_fin, reverse, light):
    """An inference whose ``parts`` threads each walk ``N / parts`` of the sequences through every
    step (:func:`_sequence_group`), with nothing shared between them but the packed rows of
    ``[U W]`` (``tiles`` (1, 4, B, H + I, R): :func:`_step_tiles` for one piece and the group's
    columns), which they only read: no wait between steps, and no state made by one thread
    that the other's next product reads. ``pe`` (4, H·N) and ``light`` as in
    :func:`_forward_part`."""
    out = outs[0]
    u_rows = u[:, :h_fin.shape[0]]
    size = out.shape[1] // parts
    for p in numba.prange(parts):
        _sequence_group(p * size, (p + 1) * size, u_rows, tiles[0], pe, h0, c0, lengths, x2, bias, out, h_fin,
                        c_fin, reverse, light)


@_kernel
def _sequence_group(n0, n1, u, tiles, pe, h0, c0, lengths, x2, bias, out, h_fin, c_fin, reverse, light):
    """Sequences ``n0 … n1 − 1`` of an inference through every step, on the calling thread:
    each step :func:`_forward_part` on all the units of the group's own states, cache blocks,
    peepholes (its columns of ``pe``) and operand ``[h; x_t]`` ((H + I, n1 − n0),
    :func:`_next_operand`), its output rows into ``out`` (T, N, H) and, at the end, its
    columns of the final states ``h_fin``/``c_fin`` (H, N). ``h0``/``c0`` are (H, N) or empty
    (zeros), ``lengths`` (N,) or empty."""
    seq_len, batch = out.shape[0], out.shape[1]
    h = u.shape[1]
    count = n1 - n0
    dtype = out.dtype
    blocks = np.empty((2, 6 * h, count), dtype)  # two cache blocks in turn (light steps: their cell rows)
    states = np.empty((2, h, count), dtype)
    operands = np.empty((2, h + x2.shape[1], count), dtype)
    bias_rows = np.empty((4 * h, count), dtype)
    own_pe = np.empty((4, h * count), dtype)  # the group's columns of the repeated peepholes
    for g in range(4):
        for j in range(h):
            for n in range(count):
                own_pe[g, j * count + n] = pe[g, j * batch + n0 + n]
    for r in range(4 * h):
        for n in range(count):
            bias_rows[r, n] = bias[r]
    for j in range(h):
        for n in range(count):
            states[0, j, n] = h0[j, n0 + n] if h0.size else 0.0
            blocks[0, j, n] = c0[j, n0 + n] if c0.size else 0.0
    own_lengths = lengths[n0:n1] if lengths.size else lengths
    t = seq_len - 1 if reverse else 0
    _next_operand(operands[0], states[0], x2, t, 0, h, n0, batch)
    # the shared-out steps' specialization of _forward_part (:func:`_runtime`)
    zero, none, yes = _runtime(0), _runtime(-1), _runtime(True)
    for k in range(seq_len):
        t = seq_len - 1 - k if reverse else k
        now, following = k % 2, (k + 1) % 2
        _forward_part(zero, h, u, tiles, bias_rows, zero, none, own_pe, blocks[now], states[now],
                      blocks[following, :h], states[following], out[t, n0:n1], own_lengths, t, yes, light,
                      x2, operands[now], operands[following], bias_rows, none)
        if k + 1 < seq_len:
            _next_operand(operands[following], states[following], x2, t - 1 if reverse else t + 1, 0, h, n0,
                          batch)
    last = seq_len % 2
    for j in range(h):
        for n in range(count):
            h_fin[j, n0 + n] = states[last, j, n]
            c_fin[j, n0 + n] = blocks[last, j, n]


# --------------------------------------------------------------------------------------
# Backward.
# --------------------------------------------------------------------------------------
@_inline
def _cell_backward(c_prev, g, f, i, o, a, d, dc, pg, pf, pi, po, one):
    """One unit's backward from its cached values, ``d`` = dL/dh_t and ``dc`` = dL/dc_t from
    later steps: ``(dz_g, dz_f, dz_i, dz_o, dL/dc_{t−1})``; ``p*`` the diagonal peepholes (0
    without them)."""
    dz_o = _out_backward(o, a, d, one)
    dz_g, dz_f, dz_i, dc_prev = _in_backward(c_prev, g, f, i, o, a, d, dc + dz_o * po, pg, pf, pi, one)
    return dz_g, dz_f, dz_i, dz_o, dc_prev


@_inline
def _out_backward(o, a, d, one):
    """The output gate's ``dz`` from ``d`` = dL/dh_t."""
    return d * a * o * (one - o)


@_inline
def _in_backward(c_prev, g, f, i, o, a, d, dc, pg, pf, pi, one):
    """``(dz_g, dz_f, dz_i, dL/dc_{t−1})`` from ``d`` = dL/dh_t and ``dc``: dL/dc_t from later
    steps and through the output gate's peephole."""
    dcell = dc + d * o * (one - a * a)
    dz_g = dcell * i * (one - g * g)
    dz_f = dcell * c_prev * f * (one - f)
    dz_i = dcell * g * i * (one - i)
    return dz_g, dz_f, dz_i, dcell * f + dz_g * pg + dz_f * pf + dz_i * pi


@_inline
def _cell_run(c_prev, g_row, f_row, i_row, o_row, a_row, pg, pf, pi, po, d_h, d_c, dz_g, dz_f, dz_i, dz_o):
    """The fused backward pass over one run of elements (1-D views, unit stride): ``dz`` of
    the four gates from the cached gates, ``d_h`` and ``d_c`` (updated in place to the cell
    gradient carried to the step before). Inlined, as :func:`_gate_run`."""
    one = d_c.dtype.type(1.0)
    for e in range(d_c.size):
        dz_g[e], dz_f[e], dz_i[e], dz_o[e], d_c[e] = _cell_backward(
            c_prev[e], g_row[e], f_row[e], i_row[e], o_row[e], a_row[e], d_h[e], d_c[e],
            pg[e], pf[e], pi[e], po[e], one)


@_inline
def _backward_step_full(h, block, dh, dc, dz, pe, full_out_grad, through):
    """:func:`_backward_step` for a full output peephole ``full_out_grad`` (H, H): one pass for
    the output gate's ``dz``, the product ``P_oᵀ dz_o`` into ``through`` (H, N), one pass for the
    rest."""
    one = block.dtype.type(1.0)
    m = h * dh.shape[1]
    c_prev, g_row, f_row, i_row, o_row, a_row = _six_rows(block.reshape(6 * m), m, 0, m)
    d_h, d_c = dh.reshape(m), dc.reshape(m)
    dz_g, dz_f, dz_i, dz_o = _rows(dz.reshape(4 * m), m, 0, m)
    pg, pf, pi, po = pe[0], pe[1], pe[2], pe[3]
    for e in range(m):
        dz_o[e] = _out_backward(o_row[e], a_row[e], d_h[e], one)
    _mm(full_out_grad, True, dz[3 * h:], False, through, 0.0)
    extra = through.reshape(m)
    for e in range(m):
        dz_g[e], dz_f[e], dz_i[e], d_c[e] = _in_backward(
            c_prev[e], g_row[e], f_row[e], i_row[e], o_row[e], a_row[e], d_h[e],
            d_c[e] + dz_o[e] * po[e] + extra[e], pg[e], pf[e], pi[e], one)


@_inline
def _backward_step(h, block, dh, dc, dz, pe):
    """The fused backward pass of one step: ``dz`` (4H, N) of the four gates and the cell
    gradient carried to the step before (``dc`` (H, N) in place); ``pe`` (4, H·N) as in
    :func:`_forward_step`, and one unit-stride loop over the ``H·N`` elements for the same
    reasons. ``dz`` is the kernel's own (contiguous, aliasing nothing); the caller copies it
    into the chunk's gate gradients."""
    m = h * dh.shape[1]
    c_prev, g_row, f_row, i_row, o_row, a_row = _six_rows(block.reshape(6 * m), m, 0, m)
    d_h, d_c = dh.reshape(m), dc.reshape(m)
    dz_g, dz_f, dz_i, dz_o = _rows(dz.reshape(4 * m), m, 0, m)
    pg, pf, pi, po = pe[0], pe[1], pe[2], pe[3]
    _cell_run(c_prev, g_row, f_row, i_row, o_row, a_row, pg, pf, pi, po, d_h, d_c, dz_g, dz_f, dz_i, dz_o)


@_kernel
def _backprop(steps, dy, lengths, u_t, u, pe, full_pre_grad, full_out_grad, dc, carried, dh, d_gates,
              dh_first, reverse, k_begin, k_end, chunk_first, ring):
    """Backward through the walking steps ``k_end − 1`` down to ``k_begin`` (one chunk, whose
    first time step is ``chunk_first``): ``dz`` into
    ``d_gates``, ``dc`` and ``carried`` (the gradient for ``h`` from the step after) updated,
    ``dh_first`` written at walking step 0. A sequence past its length has ``dz = 0`` and passes
    ``dh`` and ``dc`` through. With a ``ring`` (T, 4H, N) (not empty) each step's ``dz`` is
    made in ``ring[t]`` and ``d_gates`` is not written (:func:`_backward_overlapped`). ``u_t``
    (the true ``Uᵀ``) and ``u`` (the forward's ``U``, halved rows; the steps of one sequence
    take it) with their padded rows (:func:`wide_rows`)."""
    wide_loops()
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    own = np.empty((4 * h, batch), steps.dtype)
    through = np.empty((h, batch), steps.dtype)
    tiled = batch * own.itemsize >= VECTOR_BYTES  # Uᵀ dz by the tile product, else dot products
    u_t_rows = u_t[:, :4 * h]
    # one sequence: dzᵀ U as a row over the forward's halved U, dz of the halved gates doubled (exact)
    u_rows = u[:, :h]
    dz_row = np.empty((1, 4 * h), steps.dtype)
    d_row = np.empty((1, h), steps.dtype)
    two = steps.dtype.type(2.0)
    ringed = ring.shape[0] > 0
    for k in range(k_end - 1, k_begin - 1, -1):
        t = seq_len - 1 - k if reverse else k
        dz = ring[t] if ringed else own
        block = steps[t]
        first = (t - chunk_first) * batch
        # dh: the gradient from later steps plus the output's (none past a length).
        for n in range(batch):
            active = not lengths.size or t < lengths[n]
            for j in range(h):
                dh[j, n] = carried[j, n] + dy[t, n, j] if active else carried[j, n]
        if lengths.size:
            for j in range(h):
                for n in range(batch):
                    carried[j, n] = dc[j, n]  # kept for the sequences past their length
        if full_out_grad.size:
            _backward_step_full(h, block, dh, dc, dz, pe, full_out_grad, through)
        else:
            _backward_step(h, block, dh, dc, dz, pe)
        some_inactive = False
        for n in range(batch):
            if lengths.size and t >= lengths[n]:  # dz = 0; dh and dc pass through
                some_inactive = True
                for r in range(4 * h):
                    dz[r, n] = 0.0
                for j in range(h):
                    dc[j, n] = carried[j, n]
                    carried[j, n] = dh[j, n]
            elif lengths.size:  # the base of the product below (beta = 1)
                for j in range(h):
                    carried[j, n] = 0.0
        if full_pre_grad.size:  # the cell before the step feeds g, f, i through full peepholes
            _mm(full_pre_grad, True, dz, False, dc, 1.0)
        if not ringed:
            _store_columns(dz, d_gates, 0, 4 * h, first)
        target = dh_first if k == 0 else carried
        if k == 0:
            for j in range(h):
                for n in range(batch):
                    dh_first[j, n] = carried[j, n] if lengths.size else 0.0
        beta = 1.0 if some_inactive or k == 0 else 0.0
        if tiled:
            if beta == 0.0:
                target[:] = 0.0
            product(u_t_rows, dz, target, target)
        elif batch == 1:
            for r in range(h):
                dz_row[0, r] = dz[r, 0]
            for r in range(h, 4 * h):
                dz_row[0, r] = two * dz[r, 0]
            row_product(dz_row, u_rows, d_row)
            for j in range(h):
                target[j, 0] = d_row[0, j] if beta == 0.0 else target[j, 0] + d_row[0, j]
        else:
            _narrow_product(u_t, 4 * h, dz, target, beta)
    store_fence()  # the chunk's gate gradients, before its products read them


@_inline
def _tile_weight_gradients(gates, x_rows, states, d_wx, d_u, beta):
    """``d_wx`` (rows, I) and ``d_u`` (rows, H) set to ``gates @ x_rows`` and ``gates @ states``
    (``beta`` 0) or added to (``beta`` 1) with the register tile (:func:`~._tiles.product`),
    the shared axis in blocks of :data:`TILE_BLOCK`: ``gates`` (rows, w) a run of ``w``
    columns of gate gradients, ``x_rows`` (w, I) their inputs, ``states`` (w, H) the hidden
    state before each column's step."""
    if beta == 0.0:
        d_wx[:, :] = 0.0
        d_u[:, :] = 0.0
    width = gates.shape[1]
    for k0 in range(0, width, TILE_BLOCK):
        k1 = min(width, k0 + TILE_BLOCK)
        product(gates[:, k0:k1], x_rows[k0:k1], d_wx, d_wx)
        product(gates[:, k0:k1], states[k0:k1], d_u, d_u)


@_inline
def _tile_input_gradient(wx, gates, d_input, input_beta):
    """``d_input`` (w, I) set to ``gatesᵀ wx + input_beta·d_input`` with the register tile:
    ``wx`` (4H, I) the true input weights and ``gates`` (4H, w), both with unit-stride rows,
    the tile reading ``gates`` by columns (:func:`~._tiles.transposed_product`); the
    shared axis in blocks of :data:`TILE_BLOCK`."""
    if input_beta == 0.0:
        d_input[:, :] = 0.0
    elif input_beta != 1.0:
        for c in range(d_input.shape[0]):
            for i in range(d_input.shape[1]):
                d_input[c, i] *= input_beta
    rows = gates.shape[0]
    for k0 in range(0, rows, TILE_BLOCK):
        k1 = min(rows, k0 + TILE_BLOCK)
        transposed_product(gates[k0:k1], wx[k0:k1], d_input, d_input)


@_inline
def _row_sums(gates, r0, r1, width, sums, beta):
    """``sums[r]`` for the rows ``r0 … r1 − 1`` set to the sum of the first ``width`` columns
    of row ``r`` of ``gates`` (``beta`` 0; scratch holds anything before) or added to it
    (``beta`` 1): the bias gradient of a run of columns of gate gradients. Each row is read as
    a unit-stride run (``np.ascontiguousarray`` of a row whose elements are adjacent is the
    row itself, no copy), a loop the compiler vectorizes; indexed through the 2-D view, whose
    column stride it does not know, the loop stayed scalar: a chunk of L's gate gradients
    (1 024 rows of 1 024 columns) took 0.43 ms on two threads against 0.05."""
    for r in range(r0, r1):
        run = np.ascontiguousarray(gates[r, :width])
        total = sums.dtype.type(0.0)
        for column in range(width):
            total += run[column]
        sums[r] = total if beta == 0.0 else sums[r] + total


@_inline
def _states_as_rows(hidden, chunk_first, count, states, j0, j1):
    """``states[s·N + n, j] = hidden[chunk_first + s][j, n]`` for the units ``j0 … j1 − 1``: the
    hidden state before each of ``count`` steps, a row per column of the run."""
    batch = hidden.shape[2]
    for s in range(count):
        state = hidden[chunk_first + s]
        for n in range(batch):
            for j in range(j0, j1):
                states[s * batch + n, j] = state[j, n]


@_inline
def _states_as_columns(hidden, chunk_first, count, columns, j0, j1):
    """``columns[j, s·N + n] = hidden[chunk_first + s][j, n]`` for the units ``j0 … j1 − 1``:
    the hidden state before each of ``count`` steps, a column per column of the run (BLAS's
    operand)."""
    batch = hidden.shape[2]
    for s in range(count):
        state = hidden[chunk_first + s]
        for j in range(j0, j1):
            for n in range(batch):
                columns[j, s * batch + n] = state[j, n]


@_summing
def _chunk_products(x2, wx_t, wx, steps, hidden, has_peep, d_gates, columns, d_wx, d_u, d_bias, d_peep,
                    d_input, input_beta, chunk_first, count, beta, d_full_pre, d_full_out, tiled):
    """The weight, bias, peephole and input gradients of one chunk's ``count`` steps from time
    step ``chunk_first``: one product or one pass each, added to the earlier chunks' with
    ``beta = 1`` (``d_input`` rows are the chunk's own: ``input_beta``). ``d_full_pre`` (4H, H)
    and ``d_full_out`` (H, H) are the full peepholes' gradients ((0, 0) without them). The
    three products with the register tile when ``tiled`` (:func:`_tile_weight_gradients`,
    :func:`_tile_input_gradient`, which reads the true input weights ``wx`` (4H, I)), else with
    BLAS (which reads them as ``wx_t`` (I, 4H)); the other of the two is not read."""
    wide_loops()
    batch = steps.shape[2]
    h = steps.shape[1] // 6
    width = count * batch
    rows = slice(chunk_first * batch, chunk_first * batch + width)
    if tiled:
        states = np.empty((width, h), d_gates.dtype)
        _states_as_rows(hidden, chunk_first, count, states, 0, h)
        _tile_weight_gradients(d_gates[:, :width], x2[rows], states, d_wx, d_u, beta)
        _tile_input_gradient(wx, d_gates[:, :width], d_input[rows], input_beta)
    else:
        _states_as_columns(hidden, chunk_first, count, columns, 0, h)
        _mm(d_gates[:, :width], False, x2[rows], False, d_wx, beta)
        _mm(d_gates[:, :width], False, columns[:, :width], True, d_u, beta)
        _mm(d_gates[:, :width], True, wx_t, True, d_input[rows], input_beta)
    _row_sums(d_gates, 0, 4 * h, width, d_bias, beta)
    if has_peep:  # g, f, i see the previous cell, o the new one
        if beta == 0.0:
            d_peep[:, :] = 0.0
        for s in range(count):
            block = steps[chunk_first + s]
            for j in range(h):
                for n in range(batch):
                    column = s * batch + n
                    c_prev = block[j, n]
                    d_peep[0, j] += d_gates[j, column] * c_prev
                    d_peep[1, j] += d_gates[h + j, column] * c_prev
                    d_peep[2, j] += d_gates[2 * h + j, column] * c_prev
                    c_new = block[2 * h + j, n] * c_prev + block[3 * h + j, n] * block[h + j, n]
                    d_peep[3, j] += d_gates[3 * h + j, column] * c_new
    if d_full_pre.size or d_full_out.size:  # the cells before the steps, as columns
        for s in range(count):
            block = steps[chunk_first + s]
            for j in range(h):
                for n in range(batch):
                    columns[j, s * batch + n] = block[j, n]
        if d_full_pre.size:
            _mm(d_gates[:, :width], False, columns[:, :width], True, d_full_pre, beta)
        if d_full_out.size:  # the output gate sees the new cells, f·c + i·g
            for s in range(count):
                block = steps[chunk_first + s]
                for j in range(h):
                    for n in range(batch):
                        column = s * batch + n
                        f, i, g = block[2 * h + j, n], block[3 * h + j, n], block[h + j, n]
                        columns[j, column] = f * columns[j, column] + i * g
            _mm(d_gates[3 * h:, :width], False, columns[:, :width], True, d_full_out, beta)


@_kernel
def _backward(x2, wx_t, u_t, u, peep, pe, has_peep, full_pre_grad, full_out_grad, lengths, steps, hidden,
              dys, dc, carried, d_wx, d_u, d_bias, d_peep, d_full_pre, d_full_out, d_input, input_beta,
              dh_first, d_gates, columns, dh, reverse):
    """One layer and direction backward from a training forward's cache, on one thread (BLAS
    may use more).

    ``x2`` (T·N, I) the layer input; ``wx_t`` (I, 4H), ``u_t`` (H, 4H + ROW_PAD:
    :func:`wide_rows`) and ``peep`` (4, H) the true weights (zero peepholes when ``has_peep``
    is false), ``u`` (4H, H + ROW_PAD) the forward's (halved rows; the steps of one sequence
    take it), ``pe`` (4, H·N) the peepholes repeated over the sequences, ``full_pre_grad``
    (4H, H) and ``full_out_grad`` (H, H) the true full peepholes ((0, 0) without them);
    ``steps``/``hidden`` the cache; ``dys[0]`` (T, N, H) the output's gradient (any strides,
    ``dys`` as :func:`_any_layout` makes it; zeros when there is none); ``carried`` (H, N) the
    final hidden state's gradient and ``dc`` (H, N) the final cell's, updated to the initial
    cell's. Writes
    (overwrites) ``d_wx`` (4H, I), ``d_u`` (4H, H), ``d_bias`` (4H,), ``d_peep``, ``d_full_pre``
    and ``d_full_out`` (shaped as their weights), ``dh_first`` (H, N), and ``d_input`` (T·N, I)
    as ``dX + input_beta·d_input``. Scratch: ``d_gates`` (4H, chunk·N), ``columns``
    (H, chunk·N), ``dh`` (H, N).
    """
    dy = dys[0]
    seq_len, batch = steps.shape[0], steps.shape[2]
    chunk = d_gates.shape[1] // batch
    n_chunks = (seq_len + chunk - 1) // chunk
    no_ring = np.empty((0, 0, 0), steps.dtype)
    for q in range(n_chunks - 1, -1, -1):  # backward walks the chunks, and their steps, in reverse
        k_begin, k_end, first_t = _chunk(seq_len, chunk, q, reverse)
        _backprop(steps, dy, lengths, u_t, u, pe, full_pre_grad, full_out_grad, dc, carried, dh, d_gates,
                  dh_first, reverse, k_begin, k_end, first_t, no_ring)
        _chunk_products(x2, wx_t, wx_t[:0], steps, hidden, has_peep, d_gates, columns, d_wx, d_u, d_bias,
                        d_peep, d_input, input_beta, first_t, k_end - k_begin,
                        0.0 if q == n_chunks - 1 else 1.0, d_full_pre, d_full_out, _runtime(False))


# --------------------------------------------------------------------------------------
# Backward with the steps shared out over threads (as forward's, :func:`_forward_threads`).
# --------------------------------------------------------------------------------------
@_kernel
def _backward_part(j0, j1, block, dy, t, lengths, pe, dc, carried, dh, dz, d_gates, first):
    """One backward step for the units ``j0 … j1 − 1``: ``dh = carried + dy`` (the output's
    gradient only within a sequence's length), the fused pass into their rows of ``dz`` (4H, N),
    copied to ``d_gates``'s step columns; ``dc`` updated.
    ``carried`` is left as the base the product adds to: the pass-through ``dh`` of a sequence
    past its length, 0 for the others (whose ``dc`` passes through as well). Without lengths
    the loop that adds ``dy`` clears ``carried`` as it reads it, and nothing else is copied
    (the piece took 0.85–0.87× the time of one that kept ``dc`` and cleared ``carried``
    column by column, on M's, L's and the long row's halves)."""
    wide_loops()
    h = carried.shape[0]
    batch = carried.shape[1]
    count = j1 - j0
    m = count * batch
    if m == 0:
        return
    hn, a0 = h * batch, j0 * batch
    c_prev, g_row, f_row, i_row, o_row, a_row = _six_rows(block.reshape(6 * hn), hn, a0, m)
    pg, pf, pi, po = _rows(pe.reshape(4 * hn), hn, a0, m)
    d_h, d_c = dh.reshape(hn)[a0:a0 + m], dc.reshape(hn)[a0:a0 + m]
    dz_g, dz_f, dz_i, dz_o = _rows(dz.reshape(4 * hn), hn, a0, m)
    kept = d_c  # without lengths: nothing reads it
    if not lengths.size:  # every sequence active: carried becomes 0 as it is read
        for jj in range(count):
            j = j0 + jj
            for n in range(batch):
                dh[j, n] = carried[j, n] + dy[t, n, j]
                carried[j, n] = 0.0
    else:
        for jj in range(count):
            j = j0 + jj
            for n in range(batch):
                dh[j, n] = carried[j, n] + dy[t, n, j] if t < lengths[n] else carried[j, n]
        kept = d_c.copy()  # dc before the pass, for the sequences past their length
    _cell_run(c_prev, g_row, f_row, i_row, o_row, a_row, pg, pf, pi, po, d_h, d_c, dz_g, dz_f, dz_i, dz_o)
    for n in range(lengths.size):
        if t >= lengths[n]:  # dz = 0; dh and dc pass through
            for jj in range(count):
                j = j0 + jj
                for g in range(4):
                    dz[g * h + j, n] = 0.0
                dc[j, n] = kept[jj * batch + n]
                carried[j, n] = dh[j, n]
        else:
            for jj in range(count):
                carried[j0 + jj, n] = 0.0
    for g in range(4):
        _store_columns(dz, d_gates, g * h + j0, g * h + j1, first)
    store_fence()  # before the piece is counted done


@_threaded
def _backward_steps_threads(parts, steps, dy, lengths, u_t, pe, dc, carried, dh, dz, d_gates, dh_first,
                            reverse, k_begin, k_end, chunk_first, claims, done):
    """The backward walk over the steps ``k_end − 1`` down to ``k_begin`` in one parallel region,
    each step's units in ``parts`` pieces that the threads take as :func:`_steps_threads` does
    forward (``claims``, ``done``). A piece of walking step ``k``: the gradient for the hidden
    state before the step after, ``carried + Uᵀ dz`` of step ``k + 1`` for its units
    (:func:`product` on their rows of ``u_t`` (H, 4H), whose rows are unit-stride; into
    ``dh_first`` after the first time step), then the pass of step ``k`` (:func:`_backward_part`),
    which reads only those units' ``carried`` and writes its ``dz``: walking step ``k``'s in
    ``dz[k % 2]``, so a step reads what the one before wrote and writes the other array. One
    more round of pieces makes the chunk's last product."""
    h = carried.shape[0]
    seq_len, batch = steps.shape[0], steps.shape[2]
    for p in numba.prange(parts):
        for k in range(k_end - 1, k_begin - 2, -1):
            i = k_end - 1 - k
            wait_for(done, i * parts)
            step = k >= k_begin
            t = (seq_len - 1 - k if reverse else k) if step else 0
            target = dh_first if k + 1 == 0 else carried
            for s in range(parts):
                piece = (p + s) % parts
                if claim(claims, i * parts + piece):
                    j0, j1 = _part(h, parts, piece)
                    if k < k_end - 1:
                        product(u_t[j0:j1], dz[(k + 1) % 2], carried[j0:j1], target[j0:j1])
                    if step:
                        _backward_part(j0, j1, steps[t], dy, t, lengths, pe, dc, carried, dh, dz[k % 2],
                                       d_gates, (t - chunk_first) * batch)
                    count_up(done)


@_kernel
def _backprop_threads(parts, steps, dy, lengths, u_t, pe, dc, carried, dh, dz, d_gates, dh_first, reverse,
                      k_begin, k_end, chunk_first):
    """:func:`_backprop` with each step shared out over ``parts`` threads
    (:func:`_backward_steps_threads`). ``dz`` (2, 4H, N) scratch."""
    claims = np.zeros((k_end - k_begin + 1) * parts, np.int64)
    done = np.zeros(1, np.int64)
    _backward_steps_threads(parts, steps, dy, lengths, u_t, pe, dc, carried, dh, dz, d_gates, dh_first,
                            reverse, k_begin, k_end, chunk_first, claims, done)


@_summing_threaded
def _chunk_products_threads(parts, x2, wx_t, steps, hidden, has_peep, d_gates, columns, d_wx, d_u,
                            d_bias, d_peep, d_input, input_beta, chunk_first, count, beta):
    """:func:`_chunk_products` shared out over ``parts`` threads: rows of the weight
    gradients, of the input gradient, units for the hidden states and the peepholes, each
    thread calling a one-thread BLAS (the hidden states copied as ``columns``). The register
    tile made these products no faster: alternated in one process (the bench's rounds), L's
    training step took 0.971-0.977 of the time with it, XL's 0.995-1.002."""
    batch = steps.shape[2]
    h = steps.shape[1] // 6
    width = count * batch
    x0 = chunk_first * batch
    for p in numba.prange(parts):
        wide_loops()
        j0, j1 = _part(h, parts, p)
        _states_as_columns(hidden, chunk_first, count, columns, j0, j1)
    for p in numba.prange(parts):
        wide_loops()
        r0, r1 = p * 4 * h // parts, (p + 1) * 4 * h // parts
        c0, c1 = p * width // parts, (p + 1) * width // parts
        if r1 > r0:
            _mm(d_gates[r0:r1, :width], False, x2[x0:x0 + width], False, d_wx[r0:r1], beta)
            _mm(d_gates[r0:r1, :width], False, columns[:, :width], True, d_u[r0:r1], beta)
        if c1 > c0:
            _mm(d_gates[:, c0:c1], True, wx_t, True, d_input[x0 + c0:x0 + c1], input_beta)
        _row_sums(d_gates, r0, r1, width, d_bias, beta)
        if has_peep:
            j0, j1 = _part(h, parts, p)
            for j in range(j0, j1):
                s0 = s1 = s2 = s3 = d_peep.dtype.type(0.0)
                for s in range(count):
                    block = steps[chunk_first + s]
                    for n in range(batch):
                        column = s * batch + n
                        c_prev = block[j, n]
                        s0 += d_gates[j, column] * c_prev
                        s1 += d_gates[h + j, column] * c_prev
                        s2 += d_gates[2 * h + j, column] * c_prev
                        c_new = block[2 * h + j, n] * c_prev + block[3 * h + j, n] * block[h + j, n]
                        s3 += d_gates[3 * h + j, column] * c_new
                if beta == 0.0:
                    d_peep[0, j], d_peep[1, j], d_peep[2, j], d_peep[3, j] = s0, s1, s2, s3
                else:
                    d_peep[0, j] += s0
                    d_peep[1, j] += s1
                    d_peep[2, j] += s2
                    d_peep[3, j] += s3


@_kernel
def _backward_threads(parts, x2, wx_t, u_t, pe, has_peep, lengths, steps, hidden, dys, dc, carried,
                      d_wx, d_u, d_bias, d_peep, d_input, input_beta, dh_first, d_gates, columns, dh, dz,
                      reverse):
    """:func:`_backward` with every step and every product shared out over ``parts`` threads
    (BLAS held to one thread by the caller); ``u_t`` as there, scratch ``dz`` (2, 4H, N)."""
    dy = dys[0]
    seq_len, batch = steps.shape[0], steps.shape[2]
    chunk = d_gates.shape[1] // batch
    n_chunks = (seq_len + chunk - 1) // chunk
    u_t_rows = u_t[:, :4 * (steps.shape[1] // 6)]
    for q in range(n_chunks - 1, -1, -1):
        k_begin, k_end, first_t = _chunk(seq_len, chunk, q, reverse)
        _backprop_threads(parts, steps, dy, lengths, u_t_rows, pe, dc, carried, dh, dz, d_gates, dh_first,
                          reverse, k_begin, k_end, first_t)
        _chunk_products_threads(parts, x2, wx_t, steps, hidden, has_peep, d_gates, columns, d_wx, d_u,
                                d_bias, d_peep, d_input, input_beta, first_t, k_end - k_begin,
                                0.0 if q == n_chunks - 1 else 1.0)


@_inline
def _gather_piece(ring, first_t, count, gates):
    """The gate gradients of ``count`` steps from time step ``first_t``, made by the walk in
    ``ring`` (T, 4H, N), as the columns of ``gates`` (4H, ≥ count·N) the products read (column
    ``s·N + n`` for step ``first_t + s``): each row written in one run, in this thread's cache."""
    rows, batch = ring.shape[1], ring.shape[2]
    for r in range(rows):
        for s in range(count):
            source = ring[first_t + s, r]
            for n in range(batch):
                gates[r, s * batch + n] = source[n]


@_threaded
def _backward_overlapped(x2, wx, u_t, u, pe, has_peep, lengths, steps, hidden, dys, dc, carried, d_wx, d_u,
                         d_bias, d_peep, d_input, input_beta, dh_first, ring, pieces, dh, reverse, bounds,
                         other_wx, other_u, other_bias, other_peep, empty):
    """:func:`_backward` of a layer whose steps make one chunk (:func:`overlaps`), on two
    threads that overlap the walk with the products instead of sharing out each: thread 0
    walks the steps back (:func:`_backprop`, one thread) piece by piece, the pieces ``bounds``
    gives (:func:`overlap_pieces`), and counts the pieces walked; thread 1 makes each walked
    piece's products but the last one's (:func:`_chunk_products`: weight, bias and peephole
    gradients into ``other_*`` of its own, the piece's rows of ``d_input``) while the walk goes
    on. Once the walk is done, thread 0 makes the products of the last piece walked (the
    first time steps) into ``d_wx``, ``d_u``, ``d_bias`` and ``d_peep``, and the two threads'
    sums are added. Which thread makes which piece is fixed by the arguments, so the result's
    bits depend on the data and these alone. ``empty`` is a (0, 0) array (the BLAS products'
    columns, which the tile's do not use, among others). Thread 0
    never waits, so the call ends however many threads run it.

    The walk makes each step's ``dz`` in ``ring[t]`` (T, 4H, N), where the next step's product
    reads it, and stores it nowhere else; before a piece's products its thread gathers the
    piece's steps from the ring into the columns of its own rows, ``pieces[p]`` (4H, at least
    the widest piece's columns: :func:`_gather_piece`), which stay in its cache for the
    products. Before, the walk stored each step's ``dz`` past the caches into the columns of
    gate gradients for the whole sequence, which the products read back from memory: one
    cache line a row on M, 2.4 µs of a 13.3 µs step walked alone. M's backward took 0.955 and
    0.960 of the time in the layer, its training step 0.967–0.972 (blocks alternated in one
    process with the package before).

    The pieces' products (a few hundred columns: M's are 112) take the register tile
    (:func:`_chunk_products` with ``tiled``). On an AMD EPYC (Zen 5, AVX-512) guest, one
    thread, float32, M's piece (``4H = 512``, ``I = H = 128``): ``dW`` 62 µs with the tile
    against 67 with OpenBLAS, the input gradient (then made as its transpose and copied) 60
    against 87; M's backward took 1.43–1.48 ms against 1.59–1.65. Read by columns instead
    (:func:`_tile_input_gradient`), the input gradient took 59.5 µs against 65.3 made as its
    transpose, on the same machine later (one thread, the piece's gate gradients a view of
    wider rows), and M's training step 0.98 of the time. Elsewhere BLAS stays: S's chunk (100
    columns of one sequence, not a whole number of vectors) took its training step 2–4 % longer
    with the tile, and runs of 1 024 columns shared out by rows over two threads (L, XL) longer
    still (L's backward 12.8–14.8 ms against 12.6, XL's 49–55 against 44)."""
    dy = dys[0]
    seq_len, batch = steps.shape[0], steps.shape[2]
    walked = np.zeros(1, np.int64)
    count = bounds.shape[0] - 1
    for p in numba.prange(2):
        if p == 0:
            for q in range(count - 1, -1, -1):
                k_begin, k_end, _ = _piece(seq_len, bounds, q, reverse)
                # _runtime: a literal 0 would compile _backprop a second time
                _backprop(steps, dy, lengths, u_t, u, pe, empty, empty, dc, carried, dh, empty[:, :0],
                          dh_first, reverse, k_begin, k_end, _runtime(0), ring)
                count_up(walked)
            k_begin, k_end, first_t = _piece(seq_len, bounds, 0, reverse)
            width = (k_end - k_begin) * batch
            _gather_piece(ring, first_t, k_end - k_begin, pieces[0])
            # empty[:, :0]: the layout of _backward's columns, so both take one _chunk_products
            _chunk_products(x2, empty, wx, steps, hidden, has_peep, pieces[0][:, :width], empty[:, :0],
                            d_wx, d_u, d_bias, d_peep, d_input, input_beta, first_t, k_end - k_begin, 0.0,
                            empty, empty, _runtime(True))
        else:
            for q in range(count - 1, 0, -1):
                wait_for(walked, count - q)
                k_begin, k_end, first_t = _piece(seq_len, bounds, q, reverse)
                width = (k_end - k_begin) * batch
                _gather_piece(ring, first_t, k_end - k_begin, pieces[1])
                _chunk_products(x2, empty, wx, steps, hidden, has_peep, pieces[1][:, :width], empty[:, :0],
                                other_wx, other_u, other_bias, other_peep, d_input, input_beta, first_t,
                                k_end - k_begin, 0.0 if q == count - 1 else 1.0, empty, empty, _runtime(True))
    for r in range(d_wx.shape[0]):
        for c in range(d_wx.shape[1]):
            d_wx[r, c] += other_wx[r, c]
        for c in range(d_u.shape[1]):
            d_u[r, c] += other_u[r, c]
        d_bias[r] += other_bias[r]
    if has_peep:
        for g in range(4):
            for j in range(d_peep.shape[1]):
                d_peep[g, j] += other_peep[g, j]


# --------------------------------------------------------------------------------------
# The per-sequence kernels the stack calls (``LSTMStack`` signatures).
# --------------------------------------------------------------------------------------
_EMPTY: dict[np.dtype, np.ndarray] = {np.dtype(t): np.empty((0, 0), t) for t in (np.float32, np.float64)}
_NO_LENGTHS = np.empty(0, np.int64)


def _feature_major(state: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """An (N, H) state as a contiguous (H, N) array; an empty one for "zeros"."""
    if state is None:
        return _EMPTY[dtype]
    return np.ascontiguousarray(state.T)


def _diagonal(peepholes: tuple[np.ndarray | None, ...], h: int, dtype: np.dtype) -> np.ndarray:
    """The internal-order diagonal peepholes as one (4, H) array, zero rows where a gate has
    none (all zeros without peepholes: :func:`_no_peepholes`, made once per shape)."""
    if all(p is None for p in peepholes):
        return _no_peepholes(h, 1, dtype)
    return np.stack([np.zeros(h, dtype) if p is None else p.reshape(h) for p in peepholes])


@functools.lru_cache(maxsize=32)
def _no_peepholes(h: int, batch: int, dtype: np.dtype) -> np.ndarray:
    """Zeros (4, H·N): :func:`_repeated` (and with N = 1 :func:`_diagonal`) for a cell without
    diagonal peepholes, made once per shape (the kernels only read it)."""
    return np.zeros((4, h * batch), dtype)


def _repeated(peepholes: tuple[np.ndarray | None, ...], h: int, batch: int, dtype: np.dtype) -> np.ndarray:
    """The diagonal peepholes of :func:`_diagonal` repeated over the ``batch`` sequences:
    (4, H·N), element ``j·N + n`` of a row for unit ``j``."""
    if all(p is None for p in peepholes):
        return _no_peepholes(h, batch, dtype)
    return np.repeat(_diagonal(peepholes, h, dtype), batch, axis=1)


#: Elements added to each row of the step weights (:func:`wide_rows`): 64 bytes of float32.
ROW_PAD = 16


def wide_rows(a: np.ndarray) -> np.ndarray:
    """``a`` (R, C) as the first C columns of a contiguous (R, C + :data:`ROW_PAD`) array, the
    rest zeros: how the kernels take the step weights ``U`` and ``Uᵀ``.

    The step products (:func:`~._tiles.product`) read six or twelve rows of the weights
    side by side. Rows whose length in bytes is a multiple of 4 KiB (``Uᵀ``'s 4H = 1 024
    float32 at H = 256, ``U``'s from H = 1 024) all start at the same offset in a page, so
    their elements fall in one set of the level-1 cache, which holds 8 lines a set, and evict
    each other: backward's ``Uᵀ dz`` on half the long row's units, 128 × 1 024 × 8, took 43.7 µs
    with rows 4 KiB apart and 21.6 µs with rows 64 bytes further apart (L's, 128 × 1 024 × 32,
    77.9 against 75.3; one thread, alternated in one process). A wider array, not a view of
    one, keeps the kernels' argument contiguous: one compiled kernel for every shape.

    The array starts on a cache line (NumPy aligns its arrays to 16 bytes only). When a step's
    product for fewer sequences than a vector holds was a BLAS call, the call's speed depended
    on it: S's forward kernel (one sequence, H = 64, 100 steps) took 174–191 µs with ``U`` on a
    line and 211–258 µs at each of the three other 16-byte offsets (one thread, the same
    arguments but ``U``, two runs), so the same layer ran at either speed from one process to
    the next. Such products take no BLAS call now (:func:`_recur`, :func:`_backprop`)."""
    rows, columns = a.shape
    wide = _on_a_line(lambda size: np.zeros(size, a.dtype), rows, columns + ROW_PAD, a.dtype)
    wide[:, :columns] = a
    return wide


def _on_a_line(allocate, rows: int, width: int, dtype: np.dtype) -> np.ndarray:
    """A contiguous (rows, width) view that starts on a cache line, inside the 1-D buffer
    ``allocate(size)`` returns (``size`` elements of ``dtype``: the view's and a line more)."""
    itemsize = np.dtype(dtype).itemsize
    buffer = allocate(rows * width + LINE_BYTES // itemsize)
    start = (-buffer.ctypes.data % LINE_BYTES) // itemsize
    return buffer[start:start + rows * width].reshape(rows, width)


def _aligned(scratch, name: str, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """A scratch matrix whose rows start on cache lines, :data:`ROW_PAD` elements further apart
    than its width (a view into a larger buffer). The steps write a run of each row of the
    chunk's gate gradients: whole lines stored past the caches (:func:`_store_columns`), or,
    with rows of a multiple of 4 KiB (1 024 float32 columns), lines of one level-1 cache set
    that evict each other, as :func:`wide_rows` describes; the padding spreads them."""
    rows, columns = shape
    padded = _on_a_line(lambda size: scratch.array(name, (size,), dtype), rows, columns + ROW_PAD, dtype)
    return padded[:, :columns]


def _any_layout(a: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``a`` (or one element of it repeated to ``shape``) behind a leading axis of length 2 and
    stride 0; the kernels take element 0. Numba compiles a kernel once per layout of each array
    argument, and such a view is never contiguous: a contiguous output, a bidirectional
    layer's strided half of one, a column-major one and an absent gradient (zeros) all reach
    one compiled kernel instead of one each (every extra layout compiled the forward or the
    backward family again, 10 to 25 s from cold). A contiguous ``a`` (the common output) by
    :func:`repeated`, which is quicker."""
    if shape is not None:
        return np.lib.stride_tricks.as_strided(a, shape=(2, *shape), strides=(0,) * (len(shape) + 1))
    if a.flags.c_contiguous:
        return repeated(a, 2)
    return np.lib.stride_tricks.as_strided(a, shape=(2, *a.shape), strides=(0, *a.strides))


class _ForwardCall(NamedTuple):
    """The arguments of :func:`_forward` for one layer and direction (after the scratch is
    taken and the states laid out), and where its final states go."""

    x2: np.ndarray
    wx: np.ndarray
    bias: np.ndarray
    u: np.ndarray
    u_t: np.ndarray
    pe: np.ndarray
    full_pre: np.ndarray
    full_out: np.ndarray
    h0: np.ndarray
    c0: np.ndarray
    lengths: np.ndarray
    steps: np.ndarray
    hidden: np.ndarray
    outs: np.ndarray
    h_fin: np.ndarray
    c_fin: np.ndarray
    projection: np.ndarray
    light: bool
    h_final: np.ndarray
    c_final: np.ndarray

    def run(self, reverse: bool) -> None:
        """:func:`_forward` on the calling thread."""
        _forward(self.x2, self.wx, self.bias, self.u, self.u_t, self.pe, self.full_pre, self.full_out,
                 self.h0, self.c0, self.lengths, self.steps, self.hidden, self.outs, self.h_fin, self.c_fin,
                 self.projection, reverse, self.light)

    def finish(self) -> None:
        """Copy the final states out, batch-major."""
        np.copyto(self.h_final, self.h_fin.T)
        np.copyto(self.c_final, self.c_fin.T)


def _forward_call(w: LSTMWeights, x2: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None,
                  lengths: np.ndarray | None, steps: np.ndarray, hidden: np.ndarray | None,
                  output: np.ndarray, h_final: np.ndarray, c_final: np.ndarray, scratch,
                  chunk: int) -> _ForwardCall:
    """Scratch, laid-out states and weights for :func:`_forward`, from the arguments of
    :func:`forward`; ``chunk`` steps per input projection."""
    assert w.u_wide is not None and w.u_t_wide is not None, "weights packed by NumbaBackend.lstm_pack_weights"
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    inference = hidden is None or not steps.strides[0]
    if inference:  # nothing kept: two blocks taken in turn
        steps = scratch.array("lstm_numba_blocks", (2, six_h, batch), dtype)
        hidden = scratch.array("lstm_numba_hidden", (2, h, batch), dtype)
    assert hidden is not None  # a training cache keeps the states
    # ROW_PAD more columns than the chunk's: each step reads a run of every row, and rows of a
    # multiple of 4 KiB (the chunks of 1 024 float32 columns of L, XL and the long row) would
    # put all those runs in one set of the level-1 cache (as :func:`wide_rows` describes for U).
    # A contiguous array, not a padded view of one: with the view (a kernel compiled for any
    # strides) L's forward took 1.2 times as long.
    projection = scratch.array("lstm_numba_projection", (4 * h, chunk * batch + ROW_PAD), dtype)
    h_fin = scratch.array("lstm_numba_h_fin", (h, batch), dtype)
    c_fin = scratch.array("lstm_numba_c_fin", (h, batch), dtype)
    f = _forward_weights(w, x2.shape[1], h, batch, dtype, inference)
    return _ForwardCall(
        x2, f.wx, f.bias, w.u_wide, w.u_t_wide, f.pe, f.full_pre, f.full_out, _feature_major(h0, dtype),
        _feature_major(c0, dtype), _NO_LENGTHS if lengths is None else lengths, steps, hidden,
        _any_layout(output), h_fin, c_fin, projection, f.light, h_final, c_final)


class _ForwardWeights(NamedTuple):
    """The arguments of :func:`_forward` taken from the weights alone (:func:`_forward_weights`)."""

    wx: np.ndarray
    bias: np.ndarray
    pe: np.ndarray
    full_pre: np.ndarray
    full_out: np.ndarray
    light: bool


#: Kinds of call whose weight arguments a packing keeps at most (:func:`_forward_weights`).
FORWARD_WEIGHTS_KEPT = 8


def _forward_weights(w: LSTMWeights, size_i: int, h: int, batch: int, dtype: np.dtype,
                     inference: bool) -> _ForwardWeights:
    """What :func:`_forward` reads from the weights for inputs of width ``size_i``, ``h``
    units, ``batch`` sequences and an inference or not: made at the first such call of a packing and kept in
    ``w.forward_args`` (the weights of a packing never change; a few kinds at most are kept).
    A call of a small layer spent about 4 µs making them each time."""
    kept = w.forward_args
    key = (size_i, h, batch, dtype, inference)
    if kept is not None:
        found = kept.get(key)
        if found is not None:
            return found
    full_out = w.peepholes.full_output
    made = _ForwardWeights(
        w.wx_bias[:4 * h, :size_i], np.ascontiguousarray(w.wx_bias[:4 * h, size_i]),
        _repeated(w.peepholes.diagonal, h, batch, dtype), _EMPTY[dtype] if w.full_pre is None else w.full_pre,
        _EMPTY[dtype] if full_out is None else full_out, _light(w, inference))
    if kept is not None:
        if len(kept) >= FORWARD_WEIGHTS_KEPT:
            kept.clear()
        kept[key] = made
    return made


def _light(w: LSTMWeights, inference: bool) -> bool:
    """An inference without peepholes: the steps write no cache rows (nothing reads them)."""
    return inference and w.full_pre is None and w.peepholes.full_output is None and all(
        p is None for p in w.peepholes.diagonal)


@_kernel
def _pack_tiles(a, parts, tiles):
    """:func:`_step_tiles`' packing: for each of ``parts`` pieces of the units (:func:`_part`)
    and each gate, the piece's rows of ``a`` (4H, K) in blocks of ``tiles.shape[4]`` rows
    (:func:`~._tiles.pack_size`; :func:`pack_rows`), the rows left over in the
    first columns of one more block (zeros in the others)."""
    h = a.shape[0] // 4
    size = tiles.shape[4]
    for p in range(parts):
        j0, j1 = _part(h, parts, p)
        whole = (j1 - j0) // size
        for g in range(4):
            first = g * h + j0
            pack_rows(a[first:first + whole * size], tiles[p, g, :whole])
            rest = j1 - j0 - whole * size
            if rest:
                for k in range(a.shape[1]):
                    for i in range(size):
                        tiles[p, g, whole, k, i] = a[first + whole * size + i, k] if i < rest else 0.0


_NO_TILES = {np.dtype(t): np.empty((1, 4, 0, 0, PACK_ROWS), t) for t in (np.float32, np.float64)}


def _step_tiles(w: LSTMWeights, parts: int, batch: int) -> np.ndarray:
    """The rows of ``[U W]`` packed for the steps shared out over ``parts`` threads
    (:func:`_steps_threads`, whose products then take ``U h + W x`` at once: no projection of
    the input ahead of the steps): (P, 4, B, H + I, R), piece ``p``'s gate ``g`` in ``[p, g]``,
    its rows in whole blocks of ``R`` and the rest in one more (:func:`_pack_tiles`); ``R`` is
    :func:`~._tiles.pack_size` of the batch (:data:`COLUMN_ROWS` where ``batch``
    sequences take the column tile, else the rows of the tile that takes the blocks). Made
    once per packing of the weights, thread count and ``R``, kept in ``w.step_tiles``. An
    empty array (no packed rows) where ``batch`` sequences do not take packed products
    (:func:`packs`).

    One product over ``[h; x]`` instead of ``U h`` a step after a projection of the chunk's
    inputs: the tile runs at the cores' peak on these shapes, where OpenBLAS's projection did
    not (L's ``1024 × 256 × 1024``, a thread's half of a chunk's rows each, 411 GFLOP/s on the
    two threads; the steps' packed products of ``[U W]``, 495), and nothing is written to be
    read back a step later. L's forward kernel took 4.7–5.1 ms instead of 5.95, XL's
    17.9–18.9 instead of 19.6 (kernels alone on the bench's arguments).

    A block's tile reads twelve rows of ``U`` side by side, twelve runs that each advance by
    one element a step of its walk; packed, it reads one run, its twelve scalars at fixed
    offsets from one address. Alternated with the rows as they are (two threads, each its own
    operands, float32, medians of 30): ``1020 × 512 × 64`` (XL's forward step, half the units)
    143 GFLOP/s a thread against 131, ``516 × 256 × 32`` (L's) 153 against 149, the same bits.
    (On a faster machine since, one thread: L's four gates 246–249 packed against 235–254 as
    rows, XL's 250–256 against 244–259.)"""
    dtype = w.u.dtype
    if w.step_tiles is None or not packs(batch, dtype):
        return _NO_TILES[dtype]
    size = pack_size(batch, dtype)
    tiles = w.step_tiles.get((parts, size))
    if tiles is None:
        h = w.u.shape[1]
        pieces = [_part.py_func(h, parts, p) for p in range(parts)]
        blocks = max(-(-(j1 - j0) // size) for j0, j1 in pieces)  # whole ones and one for the rest
        weights = np.concatenate([w.u, w.wx], axis=1)  # [U W]: the steps' product over [h; x]
        tiles = (_NO_TILES[dtype] if blocks == 0
                 else np.empty((parts, 4, blocks, weights.shape[1], size), dtype))
        if blocks:
            _pack_tiles(weights, parts, tiles)
        w.step_tiles[(parts, size)] = tiles
    return tiles


def forward(w: LSTMWeights, x2: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None,
            lengths: np.ndarray | None, steps: np.ndarray, hidden: np.ndarray | None, output: np.ndarray,
            h_final: np.ndarray, c_final: np.ndarray, *, reverse: bool, scratch, parts: int = 1,
            groups: bool = True) -> None:
    """One layer and direction forward (:func:`_forward`); ``steps`` is (T, 6H, N), with a
    zero stride along T in inference (then ``hidden`` is None). With ``parts`` > 1 each step's
    units are shared out over that many threads (:func:`_forward_threads`, BLAS held to one
    thread meanwhile); :func:`backward` then takes the same ``parts``. An inference whose sequences
    :func:`group_sequences` shares out instead walks one group a thread
    (:func:`_groups_threads`), and so does one with ``parts`` 1 that :func:`group_parts` gives
    threads, unless ``groups`` is False."""
    seq_len, six_h, batch = steps.shape
    inference = hidden is None or not steps.strides[0]
    threads = parts
    if inference and parts == 1 and groups:  # steps too small to share out: perhaps groups
        threads = group_parts(seq_len, batch, six_h // 6, x2.shape[1], steps.dtype)
    grouped = (inference and group_sequences(threads, batch, steps.dtype) and w.full_pre is None
               and w.peepholes.full_output is None)
    tiles = _step_tiles(w, 1, batch // threads) if grouped else _NO_TILES[steps.dtype]  # every unit's rows
    if tiles.shape[2]:
        a = _forward_call(w, x2, h0, c0, lengths, steps, hidden, output, h_final, c_final, scratch, 0)
        with blas_limit(1):
            _groups_threads(threads, a.u, tiles, a.pe, a.h0, a.c0, a.lengths, a.x2, a.bias, a.outs, a.h_fin,
                            a.c_fin, reverse, a.light)
        a.finish()
        return
    tiles = _step_tiles(w, parts, batch) if parts > 1 else _NO_TILES[steps.dtype]
    # with packed rows the steps make the input's product too: no projection scratch
    a = _forward_call(w, x2, h0, c0, lengths, steps, hidden, output, h_final, c_final, scratch,
                      0 if tiles.shape[2] else chunk_steps(seq_len, batch))
    if parts > 1:
        assert a.full_pre.size == 0 and a.full_out.size == 0, "threads serve no full peepholes"
        with blas_limit(1):
            _forward_threads(parts, a.x2, a.wx, a.bias, a.u, tiles, a.pe, a.h0, a.c0, a.lengths, a.steps,
                             a.hidden, a.outs, a.h_fin, a.c_fin, a.projection, reverse, a.light)
    else:
        a.run(reverse)
    a.finish()


class StackInference:
    """:func:`forward` of every inference of one kind through a stack of one-direction layers
    whose steps stay on the calling thread (``parts`` 1, which :func:`threads_matter` False
    makes so), calling :func:`_forward` for each layer in turn: layer k's output, in scratch of
    the call's own, is layer k + 1's input (a stack's dropout acts in training only).

    What each call would otherwise work out is worked out once: each layer's weight arguments
    (:func:`_forward_weights`), the chunk, and where the scratch arrays lie in one workspace
    buffer (their views kept while the workspace hands out that buffer). A call then lays out
    every layer's states in one copy, runs the layers' kernels and copies every final state
    out in one more. Through the stack's layers of calls a prepared forward ran about 5 µs of
    Python around the kernel at T = N = 1, and taking its scratch arrays one by one about 1 µs
    more; a stream step of two layers (I = 32, H = 64, N = 1) took 33.9 µs there, 18.3 here."""

    def __init__(self, weights: Sequence[LSTMWeights], seq_len: int, batch: int, size_i: int, h: int,
                 dtype: np.dtype) -> None:
        assert all(w.u_wide is not None and w.u_t_wide is not None for w in weights), \
            "weights packed by NumbaBackend"
        self._dtype = dtype
        #: per layer, the arguments of :func:`_forward` from ``wx`` to ``full_out``, and ``light``
        self._layers: list[tuple] = []
        for k, w in enumerate(weights):
            a = _forward_weights(w, size_i if k == 0 else h, h, batch, dtype, True)
            self._layers.append((a.wx, a.bias, w.u_wide, w.u_t_wide, a.pe, a.full_pre, a.full_out, a.light))
        self._x_shape = (seq_len * batch, size_i)
        chunk = chunk_steps(seq_len, batch)
        size_l = len(weights)
        # as :func:`_forward_call` takes them: two blocks of steps and of states taken in turn
        # and the chunk's projection (ROW_PAD more columns); every layer's initial and final
        # states, feature-major; the outputs of the layers below the top, two taken in turn
        # (a layer reads one and writes the other)
        shapes = ((2, 6 * h, batch), (2, h, batch), (4 * h, chunk * batch + ROW_PAD),
                  *[(size_l, h, batch)] * 4, *[(seq_len, batch, h)] * min(size_l - 1, 2))
        self._layout = []
        offset = 0
        for shape in shapes:
            nbytes = math.prod(shape) * dtype.itemsize
            self._layout.append((offset, nbytes, shape))
            offset += -(-nbytes // 64) * 64  # each array on a cache line of its own
        self._nbytes = offset
        self._bound: tuple[np.ndarray | None, tuple] = (None, ())

    def _scratch(self, scratch) -> tuple:
        """The scratch arrays in the workspace's buffer, with each layer's views of them:
        states in and out, and below the top the output it writes (as :func:`_any_layout`
        makes it) and the rows the next layer reads. Made again only when the workspace hands
        out another buffer."""
        buffer = scratch.bytes("lstm_numba_stack", self._nbytes)
        base, bound = self._bound
        if base is None or buffer.base is not base:
            dtype = self._dtype
            views = [buffer[o:o + n].view(dtype).reshape(shape) for o, n, shape in self._layout]
            steps, states, projection, h0, c0, h_fin, c_fin, *between = views
            outputs = [(_any_layout(b), b.reshape(-1, b.shape[2])) for b in between]
            last = len(self._layers) - 1  # the top layer writes the call's output
            layers = tuple((h0[k], c0[k], h_fin[k], c_fin[k], *(outputs[k % 2] if k < last else (None, None)))
                           for k in range(last + 1))
            bound = (steps, states, projection, h0, c0, h_fin, c_fin, layers)
            self._bound = (buffer.base, bound)
        return bound

    def __call__(self, x: np.ndarray, hidden: np.ndarray | None, cell: np.ndarray | None, output: np.ndarray,
                 hidden_out: np.ndarray, cell_out: np.ndarray, scratch) -> None:
        steps, states, projection, h0, c0, h_fin, c_fin, layers = self._scratch(scratch)
        empty = _EMPTY[self._dtype]
        if hidden is not None:  # assigning, which took 0.40 µs where np.copyto took 0.56
            h0[...] = hidden.transpose(0, 2, 1)
        if cell is not None:
            c0[...] = cell.transpose(0, 2, 1)
        x2 = x.reshape(self._x_shape)
        for weights, views in zip(self._layers, layers):
            wx, bias, u, u_t, pe, full_pre, full_out, light = weights
            h0_k, c0_k, h_fin_k, c_fin_k, outs, following = views
            _forward(x2, wx, bias, u, u_t, pe, full_pre, full_out, empty if hidden is None else h0_k,
                     empty if cell is None else c0_k,
                     _NO_LENGTHS, steps, states, _any_layout(output) if outs is None else outs, h_fin_k,
                     c_fin_k, projection, False, light)
            x2 = following
        hidden_out[...] = h_fin.transpose(0, 2, 1)
        cell_out[...] = c_fin.transpose(0, 2, 1)


class _BackwardCall(NamedTuple):
    """The arguments of :func:`_backward` for one layer and direction (after the scratch is
    taken and the final states' gradients laid out), and where the initial states' gradients
    go."""

    x2: np.ndarray
    wx_t: np.ndarray
    wx: np.ndarray
    u_t: np.ndarray
    u: np.ndarray
    peep: np.ndarray
    pe: np.ndarray
    has_peep: bool
    full_pre_grad: np.ndarray
    full_out_grad: np.ndarray
    lengths: np.ndarray
    steps: np.ndarray
    hidden: np.ndarray
    dys: np.ndarray
    dc: np.ndarray
    carried: np.ndarray
    d_wx: np.ndarray
    d_u: np.ndarray
    d_bias: np.ndarray
    d_peep: np.ndarray
    d_full_pre: np.ndarray
    d_full_out: np.ndarray
    d_input: np.ndarray
    input_beta: float
    dh_first: np.ndarray
    d_gates: np.ndarray
    columns: np.ndarray
    dh: np.ndarray
    dh_initial: np.ndarray
    dc_initial: np.ndarray

    def run(self, reverse: bool) -> None:
        """:func:`_backward` on the calling thread."""
        _backward(self.x2, self.wx_t, self.u_t, self.u, self.peep, self.pe, self.has_peep, self.full_pre_grad,
                  self.full_out_grad, self.lengths, self.steps, self.hidden, self.dys, self.dc, self.carried,
                  self.d_wx, self.d_u, self.d_bias, self.d_peep, self.d_full_pre, self.d_full_out,
                  self.d_input, self.input_beta, self.dh_first, self.d_gates, self.columns, self.dh, reverse)

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None,
                              np.ndarray | None]:
        """Copy the initial states' gradients out, batch-major; the weight gradients as
        :func:`backward` returns them."""
        np.copyto(self.dh_initial, self.dh_first.T)
        np.copyto(self.dc_initial, self.dc.T)
        return (self.d_wx, self.d_u, self.d_bias, self.d_peep if self.has_peep else None,
                self.d_full_pre if self.full_pre_grad.size else None,
                self.d_full_out if self.full_out_grad.size else None)


def _backward_call(w: LSTMWeights, x2: np.ndarray, lengths: np.ndarray | None, steps: np.ndarray,
                   hidden: np.ndarray, dy: np.ndarray | None, dh_final: np.ndarray | None,
                   dc_final: np.ndarray | None, dh_initial: np.ndarray, dc_initial: np.ndarray,
                   d_input: np.ndarray, accumulate_input: bool, scratch, chunk: int) -> _BackwardCall:
    """Scratch, laid-out gradients and weights for :func:`_backward`, from the arguments of
    :func:`backward`; ``chunk`` steps per weight-gradient product."""
    assert w.u_t_wide is not None and w.u_wide is not None, "weights packed by NumbaBackend.lstm_pack_weights"
    assert w.wx_rows is not None, "weights packed by NumbaBackend.lstm_pack_weights"
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    size_i = x2.shape[1]
    dc = scratch.array("lstm_numba_dc", (h, batch), dtype)
    carried = scratch.array("lstm_numba_carried", (h, batch), dtype)
    for state, final in ((dc, dc_final), (carried, dh_final)):
        if final is None:
            state.fill(0.0)
        else:
            np.copyto(state, final.T)
    full_pre, full_out = w.full_pre_grad, w.peepholes_grad.full_output
    return _BackwardCall(
        x2, w.wx_t, w.wx_rows, w.u_t_wide, w.u_wide,
        _diagonal(w.peepholes_grad.diagonal, h, dtype),
        _repeated(w.peepholes_grad.diagonal, h, batch, dtype),
        any(p is not None for p in w.peepholes_grad.diagonal),
        _EMPTY[dtype] if full_pre is None else full_pre, _EMPTY[dtype] if full_out is None else full_out,
        _NO_LENGTHS if lengths is None else lengths, steps, hidden,
        _any_layout(np.zeros(1, dtype), (seq_len, batch, h)) if dy is None else _any_layout(dy), dc, carried,
        scratch.array("lstm_numba_d_wx", (4 * h, size_i), dtype),
        scratch.array("lstm_numba_d_u", (4 * h, h), dtype),
        scratch.array("lstm_numba_d_bias", (4 * h,), dtype),
        scratch.array("lstm_numba_d_peep", (4, h), dtype),
        _EMPTY[dtype] if full_pre is None else scratch.array("lstm_numba_d_full_pre", (4 * h, h), dtype),
        _EMPTY[dtype] if full_out is None else scratch.array("lstm_numba_d_full_out", (h, h), dtype),
        d_input, 1.0 if accumulate_input else 0.0,
        scratch.array("lstm_numba_dh_first", (h, batch), dtype),
        _aligned(scratch, "lstm_numba_d_gates", (4 * h, chunk * batch), dtype),
        _aligned(scratch, "lstm_numba_columns", (h, chunk * batch), dtype),
        scratch.array("lstm_numba_dh", (h, batch), dtype), dh_initial, dc_initial)


def backward(w: LSTMWeights, x2: np.ndarray, lengths: np.ndarray | None, steps: np.ndarray,
             hidden: np.ndarray, dy: np.ndarray | None, dh_final: np.ndarray | None,
             dc_final: np.ndarray | None, dh_initial: np.ndarray, dc_initial: np.ndarray,
             d_input: np.ndarray, *, accumulate_input: bool, reverse: bool,
             scratch, parts: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                                               np.ndarray | None, np.ndarray | None]:
    """One layer and direction backward (:func:`_backward`). Returns the stacked
    internal-order gradients ``d_wx`` (4H, I), ``d_u`` (4H, H), ``d_bias`` (4H,), the
    diagonal peepholes' (4, H), the full peepholes' of the candidate, forget and input gates
    (4H, H) and of the output gate (H, H) (each None without them); writes ``d_input`` (added
    to it with ``accumulate_input``) and the initial states' gradients. With ``parts`` = 2
    and small steps the walk and the products overlap (:func:`overlaps`,
    :func:`_backward_overlapped`); else, with ``parts`` > 1, both are shared out
    (:func:`_backward_threads`)."""
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    overlapped = overlaps(parts, seq_len, batch, h)
    # overlapped: the walk's dz in a ring of steps, gathered piece by piece (no chunk of columns)
    a = _backward_call(w, x2, lengths, steps, hidden, dy, dh_final, dc_final, dh_initial, dc_initial, d_input,
                       accumulate_input, scratch, 1 if overlapped else chunk_steps(seq_len, batch))
    if parts > 1:
        assert a.full_pre_grad.size == 0 and a.full_out_grad.size == 0, "threads serve no full peepholes"
        dtype = steps.dtype
        with blas_limit(1):
            if overlapped:
                bounds = overlap_pieces(seq_len, h, x2.shape[1])
                ring = scratch.array("lstm_numba_ring", (seq_len, 4 * h, batch), dtype)
                widest = _widest_piece(seq_len, h, x2.shape[1]) * batch
                pieces = scratch.array("lstm_numba_pieces", (2, 4 * h, widest), dtype)
                other_wx, other_u, other_bias, other_peep = (
                    scratch.array(f"lstm_numba_other_{name}", array.shape, dtype)
                    for name, array in (("wx", a.d_wx), ("u", a.d_u), ("bias", a.d_bias), ("peep", a.d_peep)))
                _backward_overlapped(
                    a.x2, a.wx, a.u_t, a.u, a.pe, a.has_peep, a.lengths, a.steps, a.hidden, a.dys, a.dc,
                    a.carried, a.d_wx, a.d_u, a.d_bias, a.d_peep, a.d_input, a.input_beta, a.dh_first,
                    ring, pieces, a.dh, reverse, bounds, other_wx, other_u, other_bias, other_peep,
                    _EMPTY[dtype])
            else:
                dz = scratch.array("lstm_numba_dz", (2, 4 * h, batch), dtype)
                _backward_threads(parts, a.x2, a.wx_t, a.u_t, a.pe, a.has_peep, a.lengths, a.steps,
                                  a.hidden, a.dys, a.dc, a.carried, a.d_wx, a.d_u, a.d_bias, a.d_peep,
                                  a.d_input, a.input_beta, a.dh_first, a.d_gates, a.columns, a.dh, dz,
                                  reverse)
    else:
        a.run(reverse)
    return a.finish()

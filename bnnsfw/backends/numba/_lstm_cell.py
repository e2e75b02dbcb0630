"""The arithmetic every compiled LSTM kernel of the default cell shares: the compiler's flags,
the float32 tanh, the products made outside the register tiles, the fused passes of one step
over the units, forward and backward, and the walk's bookkeeping (a chunk's or piece's steps,
a thread's units: :func:`_chunk`, :func:`_piece`, :func:`_part`).

- **One fused pass per step** over the ``H·N`` units reads ``U h`` plus the step's
  projection (the product starts from it), applies the four gate functions and the
  peepholes, updates the cell and the hidden state and writes the cache block
  (:func:`_forward_step`; :func:`_forward_step_full` with full peepholes, whose output gate's
  ``P_o c_t`` needs every unit's new cell, so the pass splits in two around it). It runs over
  each gate's ``H·N`` elements as one unit-stride loop (feature-major blocks keep them
  consecutive). Inference without peepholes takes a lighter pass of its own
  (:func:`_state_run`): no cache rows, which nothing reads, and no peephole terms. Backward
  is one fused pass computing ``dz`` for the four gates and the cell gradient
  (:func:`_backward_step`, :func:`_backward_step_full`).
- **Products outside the tiles.** The large products are BLAS calls made from the compiled
  loop (:func:`_mm`: ``?gemm`` on strided operands, the same SciPy BLAS the rest of the backend
  uses: two BLAS libraries would each keep a spinning thread pool and take the cores from
  each other); the input projection is BLAS adding ``W x`` to rows filled with the bias
  (:func:`_biased_product`). A step's product for fewer sequences than a vector holds is a
  tile of rows (:func:`~._tiles.row_product`, the states as rows), its operands put between
  columns and rows four columns at a time (:func:`_columns_from_rows`,
  :func:`_rows_from_columns`).
- float32 uses a rational tanh (an odd polynomial over an even one on ``|x| ≤ 7.9``; largest
  error about 2e-7 absolute, inside the contract's float32 tolerance), which is pure
  multiply-add and one division, so with fast math (:data:`FAST_MATH`: an exact division and
  no reordering, the same bits in the vectorized loop and its scalar remainder) and the NumPy
  error model (no zero-division check, which would keep the loop scalar) the loop vectorizes:
  0.37 ns per tanh against 2.7 ns under the Python error model. float64 uses ``math.tanh``
  (the contract's float64 tolerance is 1e-9).
"""

from __future__ import annotations

import math

import numba
import numba.np.linalg
import numpy as np
from numba.core import types
from numba.extending import overload

from . import _cache
from ._stream import LINE_BYTES, stream_copy

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry

__all__ = ["FAST_MATH", "SUM_MATH"]


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


@_threaded
def _touch_threads(flags):
    """A parallel region that does nothing useful: it makes Numba choose its threading layer."""
    for p in numba.prange(flags.size):
        flags[p] = 1.0


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
    :func:`~._lstm_forward._forward_part`'s. Passed through ``_runtime``, the constant takes
    theirs. Not inlined into Numba's IR, where it would be the constant again; LLVM inlines the call."""
    return lambda value: value


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


@_inline
def _from_rows(z, rows, add, first, h, scale, n0, k):
    """``z[r, n] = add[r, first + n] + s·rows[n, r]`` for the ``k`` (literal) columns ``n`` from
    ``n0``, ``s`` 1 for ``r < h``, ``scale`` after: the ``k`` stores of a row unrolled."""
    one = z.dtype.type(1.0)
    for r in range(z.shape[0]):
        s = scale if r >= h else one
        base, row = add[r], z[r]
        for n in range(n0, n0 + k):
            row[n] = base[first + n] + s * rows[n, r]


@_kernel
def _columns_from_rows(z, rows, add, first, h, scale):
    """A narrow step's ``U h`` made as rows of ``hᵀ Uᵀ`` (:func:`~._tiles.row_product`), put back
    as the columns of ``z`` (4H, N) the fused pass reads, the step's projection ``add`` (from
    column ``first``) added (:func:`_from_rows`): four columns at a time, then one. Backward,
    ``dzᵀ U`` the same way into the hidden state's gradient, ``add`` being ``z`` itself. On T 100,
    N 4, H 64 (one thread, float32) 0.5 µs a step, against 1.4 with a loop over the columns
    inside."""
    k = z.shape[1]
    n0 = 0
    while n0 + 4 <= k:
        _from_rows(z, rows, add, first, h, scale, n0, 4)
        n0 += 4
    while n0 < k:
        _from_rows(z, rows, add, first, h, scale, n0, 1)
        n0 += 1


@_inline
def _to_rows(rows, z, h, scale, n0, k):
    """``rows[n, r] = s·z[r, n]`` for the ``k`` (literal) columns ``n`` of ``z`` from ``n0``,
    ``s`` 1 for ``r < h``, ``scale`` after."""
    one = z.dtype.type(1.0)
    for r in range(z.shape[0]):
        s = scale if r >= h else one
        row = z[r]
        for n in range(n0, n0 + k):
            rows[n, r] = s * row[n]


@_kernel
def _rows_from_columns(rows, z, h, scale):
    """A narrow step's ``dz`` (4H, N) as the rows of ``dzᵀ`` for :func:`~._tiles.row_product`
    (:func:`_to_rows`), four columns at a time, then one (:func:`_columns_from_rows`)."""
    k = z.shape[1]
    n0 = 0
    while n0 + 4 <= k:
        _to_rows(rows, z, h, scale, n0, 4)
        n0 += 4
    while n0 < k:
        _to_rows(rows, z, h, scale, n0, 1)
        n0 += 1


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
    (``d_gates`` is line-aligned, :func:`~._lstm_operands._aligned`). The caller ends the step with
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


@_inline
def _chunk(seq_len, chunk, q, reverse):
    """Chunk ``q``: its walking steps ``k_begin … k_end − 1`` and its first time step."""
    k_begin = q * chunk
    k_end = min(seq_len, k_begin + chunk)
    first_t = seq_len - k_end if reverse else k_begin
    return k_begin, k_end, first_t


@_inline
def _piece(seq_len, bounds, q, reverse):
    """Piece ``q`` of ``bounds`` (:func:`~._lstm.overlap_pieces`): its walking steps ``k_begin …
    k_end − 1`` and its first time step."""
    k_begin, k_end = bounds[q], bounds[q + 1]
    first_t = seq_len - k_end if reverse else k_begin
    return k_begin, k_end, first_t


@_inline
def _part(h, parts, p):
    """Thread ``p``'s units ``j0 … j1 − 1`` of ``h``: ``parts`` near-equal runs, cut at multiples
    of 16 units so that no two threads write one cache line of a state row."""
    j0 = (p * h // parts) // 16 * 16
    j1 = h if p == parts - 1 else ((p + 1) * h // parts) // 16 * 16
    return j0, j1


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

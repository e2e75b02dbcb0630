"""The compiled backward of one LSTM layer and direction (the default cell): on the calling
thread (:func:`_backward`), with each step's units shared out over threads
(:func:`_backward_threads`), or on two threads with the walk through the steps overlapped
with the products of the steps already walked (:func:`_backward_overlapped`).
:mod:`._lstm` chooses among them.

- **Time in chunks.** The weight and input gradients are one product each per chunk of
  steps, so the scratch memory is bounded by the chunk, while each product stays large; the
  bias and peephole gradients are one pass per chunk over its ``dz``
  (:func:`_chunk_products`). An overlapped backward makes the three products of each of its
  pieces with the register tile instead (:data:`TILE_BLOCK`).
- **A step** is one fused pass computing ``dz`` and the cell gradient
  (:func:`~._lstm_cell._backward_step`), then one product ``Uᵀ dz``. Full peepholes add
  ``P_oᵀ dz_o`` between two passes and ``Pᵀ dz`` into the cell gradient after them; their
  gradients are one product per chunk against the cells as columns.
- **Steps shared out over threads** as the forward's (:mod:`._lstm_forward`): a thread's
  piece makes its units' rows of ``Uᵀ dz`` for the step after, then their pass of the step,
  with ``dz`` taken from two arrays in turn (:func:`_backward_steps_threads`); the chunk
  products are shared out by rows, each thread calling a one-thread BLAS.
"""

from __future__ import annotations

import numba
import numpy as np

from . import _cache
from ._lstm_cell import (_backward_step, _backward_step_full, _cell_run, _chunk, _columns_from_rows, _inline,
                         _kernel, _mm, _part, _piece, _rows, _rows_from_columns, _runtime, _six_rows,
                         _store_columns, _summing, _summing_threaded, _threaded)
from ._progress import claim, count_up, wait_for
from ._stream import store_fence
from ._tiles import VECTOR_BYTES, product, row_product, transposed_product, wide_loops

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry


#: Length of the blocks of the shared axis in which the register tile makes the gradient
#: products of a backward (:func:`_tile_weight_gradients`, :func:`_tile_input_gradient`): a
#: twelve-row block of the left operand (12 KiB of float32) then stays in L1 from one panel of
#: columns to the next, and the right operand's block in L2. Unblocked, a chunk's 1 024
#: columns made the tile's products slower than OpenBLAS's.
TILE_BLOCK = 256


@_kernel
def _backprop(steps, dy, lengths, u_t, u, pe, full_pre_grad, full_out_grad, dc, carried, dh, d_gates,
              dh_first, reverse, k_begin, k_end, chunk_first, ring):
    """Backward through the walking steps ``k_end − 1`` down to ``k_begin`` (one chunk, whose
    first time step is ``chunk_first``): ``dz`` into
    ``d_gates``, ``dc`` and ``carried`` (the gradient for ``h`` from the step after) updated,
    ``dh_first`` written at walking step 0. A sequence past its length has ``dz = 0`` and passes
    ``dh`` and ``dc`` through. With a ``ring`` (T, 4H, N) (not empty) each step's ``dz`` is
    made in ``ring[t]`` and ``d_gates`` is not written (:func:`_backward_overlapped`). ``u_t``
    (the true ``Uᵀ``) and ``u`` (the forward's ``U``, halved rows; the steps of fewer sequences
    than a vector holds take it) with their padded rows (:func:`~._lstm_operands.wide_rows`)."""
    wide_loops()
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    own = np.empty((4 * h, batch), steps.dtype)
    through = np.empty((h, batch), steps.dtype)
    tiled = batch * own.itemsize >= VECTOR_BYTES  # Uᵀ dz by the tile product, else as rows
    u_t_rows = u_t[:, :4 * h]
    # fewer sequences than a vector holds: dzᵀ U a row a sequence over the forward's halved U,
    # dz of the halved gates doubled (exact)
    u_rows = u[:, :h]
    dz_row = np.empty((batch, 4 * h), steps.dtype)
    d_row = np.empty((batch, h), steps.dtype)
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
        if beta == 0.0:
            target[:] = 0.0
        if tiled:
            product(u_t_rows, dz, target, target)
        else:  # fewer sequences than a vector holds: dzᵀ U, a row a sequence, added to target
            _rows_from_columns(dz_row, dz, h, two)
            row_product(dz_row, u_rows, d_row)
            _columns_from_rows(target, d_row, target, 0, h, two)  # target's H rows: none scaled
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
        _mm(d_gates[:, :width], False, columns[:h, :width], True, d_u, beta)
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
            _mm(d_gates[:, :width], False, columns[:h, :width], True, d_full_pre, beta)
        if d_full_out.size:  # the output gate sees the new cells, f·c + i·g
            for s in range(count):
                block = steps[chunk_first + s]
                for j in range(h):
                    for n in range(batch):
                        column = s * batch + n
                        f, i, g = block[2 * h + j, n], block[3 * h + j, n], block[h + j, n]
                        columns[j, column] = f * columns[j, column] + i * g
            _mm(d_gates[3 * h:, :width], False, columns[:h, :width], True, d_full_out, beta)


@_kernel
def _backward(x2, wx_t, u_t, u, peep, pe, has_peep, full_pre_grad, full_out_grad, lengths, steps, hidden,
              dys, dc, carried, d_wx, d_u, d_bias, d_peep, d_full_pre, d_full_out, d_input, input_beta,
              dh_first, d_gates, columns, dh, reverse):
    """One layer and direction backward from a training forward's cache, on one thread (BLAS
    may use more).

    ``x2`` (T·N, I) the layer input; ``wx_t`` (I, 4H), ``u_t`` (H, 4H + ROW_PAD:
    :func:`~._lstm_operands.wide_rows`) and ``peep`` (4, H) the true weights (zero peepholes when ``has_peep``
    is false), ``u`` (4H, H + ROW_PAD) the forward's (halved rows; the steps of fewer sequences
    than a vector holds take it), ``pe`` (4, H·N) the peepholes repeated over the sequences, ``full_pre_grad``
    (4H, H) and ``full_out_grad`` (H, H) the true full peepholes ((0, 0) without them);
    ``steps``/``hidden`` the cache; ``dys[0]`` (T, N, H) the output's gradient (any strides,
    ``dys`` as :func:`~._lstm_operands._any_layout` makes it; zeros when there is none);
    ``carried`` (H, N) the final hidden state's gradient and ``dc`` (H, N) the final cell's,
    updated to the initial cell's. Writes
    (overwrites) ``d_wx`` (4H, I), ``d_u`` (4H, H), ``d_bias`` (4H,), ``d_peep``, ``d_full_pre``
    and ``d_full_out`` (shaped as their weights), ``dh_first`` (H, N), and ``d_input`` (T·N, I)
    as ``dX + input_beta·d_input``. Scratch: ``d_gates`` (4H, chunk·N), ``columns``
    (at least H rows of chunk·N; its first H are read), ``dh`` (H, N).
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
    each step's units in ``parts`` pieces that the threads take as :func:`~._lstm_forward._steps_threads` does
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
            _mm(d_gates[r0:r1, :width], False, columns[:h, :width], True, d_u[r0:r1], beta)
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
    """:func:`_backward` of a layer whose steps make one chunk (:func:`~._lstm.overlaps`), on two
    threads that overlap the walk with the products instead of sharing out each: thread 0
    walks the steps back (:func:`_backprop`, one thread) piece by piece, the pieces ``bounds``
    gives (:func:`~._lstm.overlap_pieces`), and counts the pieces walked; thread 1 makes each walked
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

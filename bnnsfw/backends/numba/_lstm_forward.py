"""The compiled forward of one LSTM layer and direction (the default cell): on the calling
thread (:func:`_forward`, and :func:`_forward_one` for one sequence), with each step's units
shared out over threads (:func:`_forward_threads`), or with each thread walking a group of the
sequences through every step (:func:`_groups_threads`). :mod:`._lstm` chooses among them.

- **Time in chunks.** The input projection ``W x_t + b`` is one product per chunk of steps
  (BLAS adding ``W x_t`` to rows filled with ``b``: :func:`~._lstm_cell._biased_product`),
  so the scratch memory is bounded by the chunk (:data:`~._lstm.CHUNK_COLUMNS` columns of ``T·N``,
  :data:`~._lstm.NARROW_CHUNK_COLUMNS` for narrow steps on one thread), not by the sequence length,
  while each product stays large. A step's product ``U h`` is
  :func:`~._tiles.product` as soon as the sequences fill a vector (8 in float32, 4 in
  float64): a tile kept in registers, with no packing of ``U`` at each step; fewer
  sequences take a tile of their states as rows (:func:`~._tiles.row_product`). One
  sequence's projection is a row a step (:func:`~._lstm.projection_shape`), to which the step
  adds ``hᵀ Uᵀ`` in place (:func:`~._tiles.add_row_product`), in a kernel of its own
  (:func:`_forward_one`): no model compiles the steps it never takes.
- **Full peepholes** add a product per step: ``P c_{t−1}`` for the candidate, forget and
  input gates goes into ``z`` with ``U h``. Such cells keep their steps on the calling thread.
- **Steps shared out over threads**: each of Numba's threads takes a run of units and
  computes their four gate rows of ``U h`` with :func:`~._tiles.product` (its rows of ``U``
  stay in its cache from step to step), then their fused update. Where the sequences take
  packed rows (:func:`_pack_tiles`), a thread's product is ``U h + W x_t + b`` at once, over
  ``[h; x_t]`` with the rows of ``[U W]`` packed, and the steps project nothing ahead. One
  parallel region runs a chunk's steps (:func:`_steps_threads`; one region per step cost
  about 1.4 µs a step to start): each step's units are a piece per thread, which a thread
  claims before it runs it (an atomic flag; a thread late to a step finds its piece taken by
  one that came first), and a step begins once a shared count shows every piece of the step
  before done (:mod:`._progress`). BLAS is held to one thread meanwhile and the chunk's
  projection is shared out by rows, each thread calling a one-thread BLAS, so the two thread
  pools never wait for the cores at once.
"""

from __future__ import annotations

import numba
import numpy as np

from . import _cache
from ._lstm_cell import (_biased_product, _chunk, _columns_from_rows, _forward_step, _forward_step_full,
                         _gate_run, _inline, _kernel, _mm, _part, _rows, _runtime, _six_rows, _state_run,
                         _threaded)
from ._lstm_operands import ROW_PAD
from ._progress import claim, count_up, wait_for
from ._stream import LINE_BYTES, prefetch
from ._tiles import (COLUMN_ROWS, VECTOR_BYTES, column_product, pack_rows, packed_product,
                     packed_rest_product, paired, paired_product, product, row_product, wide_loops,
                     add_row_product)

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry


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
    ``W x + b`` of the chunk that starts at time step ``chunk_first``, a column a step and
    sequence. Arrays as in :func:`_forward` (``u`` and ``u_t`` with their padded rows)."""
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
    # fewer sequences than a vector holds: hᵀ Uᵀ a row a sequence, the halved gates' ½ applied
    # to its sums (exact)
    u_t_rows = u_t[:, :4 * h]
    z_row = np.empty((batch, 4 * h), steps.dtype)
    half = steps.dtype.type(0.5)
    for k in range(k_begin, k_end):
        t, block, h_prev, c_next, h_next = _step_arrays(k, seq_len, reverse, steps, hidden, h0, c0, h_fin,
                                                        c_fin)
        first = (t - chunk_first) * batch
        with_product = k > 0 or h0.size > 0  # U @ 0 adds nothing
        if with_product and tiled:  # z = the projection's columns + U h: the fused pass reads z alone
            product(u_rows, h_prev, projection[:, first:first + batch], z)
        elif with_product:  # fewer sequences than a vector holds: hᵀ Uᵀ, a row a sequence
            row_product(h_prev.T, u_t_rows, z_row)
            _columns_from_rows(z, z_row, projection, first, h, half)
        else:
            for r in range(4 * h):
                for n in range(batch):
                    z[r, n] = projection[r, first + n]
        _finish_step(h, z, pe, full_pre, full_out, block, h_prev, c_next, h_next, out[t], lengths, t, light)


@_kernel
def _recur_one(projection, chunk_first, u_t, pe, full_pre, full_out, h0, c0, lengths, steps, hidden, out,
               h_fin, c_fin, reverse, k_begin, k_end, light):
    """:func:`_recur` for one sequence, whose ``projection`` holds a row a step: each step
    copies its row into ``z`` and adds ``hᵀ Uᵀ`` to it (``u_t`` the halved rows' transpose,
    :func:`~._lstm._halved_u_t`), so no pass puts the product back."""
    wide_loops()
    h = steps.shape[1] // 6
    seq_len = out.shape[0]
    z = np.empty((4 * h, 1), steps.dtype)  # memory of the kernel's own, as in _recur
    z_one = z.reshape((1, z.size))  # z as the row its product is added to
    u_t_rows = u_t[:, :4 * h]
    for k in range(k_begin, k_end):
        t, block, h_prev, c_next, h_next = _step_arrays(k, seq_len, reverse, steps, hidden, h0, c0, h_fin,
                                                        c_fin)
        row = projection[t - chunk_first]
        for r in range(4 * h):
            z_one[0, r] = row[r]
        if k > 0 or h0.size > 0:  # U @ 0 adds nothing
            add_row_product(h_prev.T, u_t_rows, z_one)
        _finish_step(h, z, pe, full_pre, full_out, block, h_prev, c_next, h_next, out[t], lengths, t, light)


@_inline
def _finish_step(h, z, pe, full_pre, full_out, block, h_prev, c_next, h_next, out_t, lengths, t, light):
    """The rest of a step once ``z`` holds ``W x_t + b + U h``: the full peepholes' products,
    the fused pass, and the step's output ``out_t`` (N, H). A sequence past its length keeps
    its state and outputs zeros."""
    batch = z.shape[1]
    if full_pre.size:  # full peepholes of g, f, i on the cell before the step
        _mm(full_pre, False, block[:h], False, z, 1.0)
    if full_out.size:
        _forward_step_full(h, z, pe, block, c_next, h_next, full_out)
    else:
        _forward_step(h, z, pe, block, c_next, h_next, light)
    for n in range(batch):
        if lengths.size and t >= lengths[n]:  # past its length: keep the state, output 0
            for j in range(h):
                c_next[j, n] = block[j, n]
                h_next[j, n] = h_prev[j, n]
                out_t[n, j] = 0.0
        else:
            for j in range(h):
                out_t[n, j] = h_next[j, n]


@_kernel
def _forward(x2, wx, bias, u, u_t, pe, full_pre, full_out, h0, c0, lengths, steps, hidden, outs, h_fin,
             c_fin, projection, reverse, light):
    """One layer and direction forward, on one thread (BLAS may use more); one sequence takes
    :func:`_forward_one`, whose parameters are the same but some operands laid out otherwise.

    ``x2`` (T·N, I) the layer input (rows ``t·N + n``); ``wx`` (4H, I), ``bias`` (4H,) and ``u``
    (4H, H + ROW_PAD: :func:`~._lstm_operands.wide_rows`) the forward weights (halved rows),
    ``u_t`` (H, 4H + ROW_PAD) the true ``Uᵀ`` for the steps of fewer sequences than a vector
    holds, ``pe`` (4, H·N) the diagonal peepholes repeated over the sequences (zeros without
    them), ``full_pre`` (4H, H) the full peepholes of the candidate, forget and input gates and
    ``full_out`` (H, H) the output gate's ((0, 0) without);
    ``h0``/``c0`` (H, N), or (0, 0) for zeros; ``lengths`` (N,) or (0,); ``steps`` (T, 6H, N)
    and ``hidden`` (T, H, N) the cache, or (2, 6H, N) and (2, H, N) taken in turn when nothing
    is kept (inference); ``outs[0]`` (T, N, H) the output (any strides; ``outs`` as
    :func:`~._lstm_operands._any_layout` makes it); ``h_fin``/``c_fin`` (H, N) the final states;
    ``projection`` scratch of :func:`~._lstm.projection_shape` for the chunk's steps; ``light``
    for inference without peepholes (the steps write no cache rows: :func:`_state_run`).

    A sequence past its length keeps its state and outputs zeros; its cache block holds
    finite values that backward ignores (as the reference's does).
    """
    out = outs[0]
    seq_len, batch = out.shape[0], out.shape[1]
    chunk = _column_steps(projection, batch)
    for q in range((seq_len + chunk - 1) // chunk):
        k_begin, k_end, first_t = _chunk(seq_len, chunk, q, reverse)
        _project_chunk(wx, bias, x2, projection, first_t, k_end - k_begin, batch)
        _recur(projection, first_t, u, u_t, pe, full_pre, full_out, h0, c0, lengths, steps, hidden, out,
               h_fin, c_fin, reverse, k_begin, k_end, light)


@_inline
def _column_steps(projection, batch):
    """Steps per chunk of a projection scratch laid out a column a step and sequence, (4H,
    chunk·N + ROW_PAD) (:func:`~._lstm.projection_shape`), one sequence's steps shared out over
    threads included."""
    return (projection.shape[1] - ROW_PAD) // batch


@_kernel
def _forward_one(x2, wx, bias, u, u_t, pe, full_pre, full_out, h0, c0, lengths, steps, hidden, outs, h_fin,
                 c_fin, projection, reverse, light):
    """:func:`_forward` of one sequence, a kernel of its own so that a model of several
    sequences does not compile its steps (nor one sequence theirs): ``wx`` is ``Wᵀ`` (I, 4H,
    :func:`_project_rows`), ``u_t`` the halved rows' transpose (:func:`~._lstm._halved_u_t`),
    ``u`` not read, ``projection`` (chunk, 4H) a row a step. From an empty cache, the demo's
    model (32 sequences) compiled its forward in 19.4–19.7 s with these steps apart, 26.8–27.7 s
    with them in :func:`_recur`; S (one sequence) in 11.6–12.5 s against 25.9–26.6 (a process
    each, alternated)."""
    out = outs[0]
    seq_len = out.shape[0]
    chunk = projection.shape[0]
    for q in range((seq_len + chunk - 1) // chunk):
        k_begin, k_end, first_t = _chunk(seq_len, chunk, q, reverse)
        _project_rows(wx, bias, x2, projection, first_t, k_end - k_begin)
        _recur_one(projection, first_t, u_t, pe, full_pre, full_out, h0, c0, lengths, steps, hidden, out,
                   h_fin, c_fin, reverse, k_begin, k_end, light)


@_kernel
def _project_chunk(wx, bias, x2, projection, first_t, count, batch):
    """``projection[:, :count·N]`` = ``W x + b`` for the ``count`` steps from ``first_t``: one
    product and one pass."""
    wide_loops()
    width = count * batch
    _biased_product(wx, bias, x2[first_t * batch:first_t * batch + width], projection, 0, wx.shape[0], width)


@_kernel
def _project_rows(wx, bias, x2, projection, first_t, count):
    """One sequence's ``projection[:count]`` = ``x Wᵀ + b``, a row a step
    (:func:`~._lstm.projection_shape`), ``wx`` being ``Wᵀ`` (I, 4H), by the tile of
    :func:`~._tiles.add_row_product`: S's (100 × 32 × 256) took 16–17 µs, where BLAS took
    17–38 µs from one process to the next on ``W`` as it is."""
    wide_loops()
    for s in range(count):
        for r in range(wx.shape[1]):
            projection[s, r] = bias[r]
    add_row_product(x2[first_t:first_t + count], wx, projection[:count])


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
    (:func:`~._lstm._step_tiles`), and the products :func:`packed_product` and
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
    PACK_ROWS): piece ``p``'s packed rows of ``[U W]`` (:func:`~._lstm._step_tiles`), or an empty
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
    :func:`_forward_part`. With packed rows (``tiles``: :func:`~._lstm._step_tiles`) the steps make
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
    chunk = _column_steps(projection, batch)
    for q in range((seq_len + chunk - 1) // chunk):
        k_begin, k_end, first_t = _chunk(seq_len, chunk, q, reverse)
        _project_threads(parts, wx, bias, x2, projection, first_t, k_end - k_begin, batch)
        _recur_threads(parts, projection, first_t, u_rows, tiles, pe, h0, c0, lengths, steps, hidden, out,
                       h_fin, c_fin, reverse, k_begin, k_end, light, x2, no_operands, no_operands[0])


@_threaded
def _groups_threads(parts, u, tiles, pe, h0, c0, lengths, x2, bias, outs, h_fin, c_fin, reverse, light):
    """An inference whose ``parts`` threads each walk ``N / parts`` of the sequences through every
    step (:func:`_sequence_group`), with nothing shared between them but the packed rows of
    ``[U W]`` (``tiles`` (1, 4, B, H + I, R): :func:`~._lstm._step_tiles` for one piece and the group's
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


@_kernel
def _pack_tiles(a, parts, tiles):
    """:func:`~._lstm._step_tiles`' packing: for each of ``parts`` pieces of the units (:func:`_part`)
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

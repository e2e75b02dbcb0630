"""The compiled (Numba) LSTM kernels' entry points: one layer and direction, forward and
backward, per call, and the choice of the path that serves it.

They serve the cell almost every model uses (tanh candidate, sigmoid forget, input and output
gates, tanh hidden activation), with no, diagonal or full peepholes, over full or variable
lengths (:func:`serves` says which), in float32: the backend sends float64 to ``scipy-blas``'s
kernels (``COMPILED_DTYPE`` in the package). They read and write the
reference's training cache (``docs/lstm.md``): per step a feature-major ``(6H, N)`` block
holding the cell before the step, the activated gates in the internal order g, f, i, o and
``tanh(c_t)``, and the hidden state before each step ``(T, H, N)``; so caches stay
interchangeable between backends. The forward weights of the sigmoid gates are halved
(``σ(z) = ½·tanh(z/2) + ½``), so every gate is one ``tanh``.

The kernels, by concept:

- this module: which path serves a call (:func:`step_parts`, :func:`group_parts`,
  :func:`overlaps`, :func:`chunk_steps`), the arguments a call hands the kernels
  (prepared once per layer and shape where they depend on the weights), the entry points the
  stack calls (:func:`forward`, :func:`backward`), and a prepared inference through every
  layer of a stack (:class:`StackInference`, which the backend's prepared forward calls);
- :mod:`._lstm_cell`: the arithmetic every path shares: the fused passes of a step over the
  units, forward and backward, the float32 tanh, the small products;
- :mod:`._lstm_forward`: the forward's paths: on the calling thread, each step's units shared
  out over threads, or a group of the sequences a thread;
- :mod:`._lstm_backward`: the backward's paths: on the calling thread, shared out, or the walk
  overlapped with the products;
- :mod:`._lstm_operands`: how the kernels take their operands (layouts, padded rows);
- :mod:`._tiles`, :mod:`._stream`, :mod:`._progress`: the register tiles of the step products,
  the stores past the caches and the counters the threads wait on.

Kernels are compiled on first use and cached on disk (``cache=True``; Numba keeps the cache
beside the module, in the user's cache folder when the package folder is read only, or in
``NUMBA_CACHE_DIR``), each module's entries stamped with the sources they carry
(:mod:`._cache`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Sequence

import numba
import numpy as np

from ..._threadpool import blas_limit, current_limit
from ...enums import ActivationFunction as AF
from .._shared.lstm_kernels import LSTMStepPlan, LSTMWeights
from ..contract import Workspace
from . import _tiers
from ._lstm_backward import _backward, _backward_overlapped, _backward_threads
from ._lstm_cell import _part, _touch_threads
from ._lstm_forward import _forward, _forward_one, _forward_threads, _groups_threads, _pack_tiles
from ._lstm_operands import (_EMPTY, _NO_LENGTHS, ROW_PAD, _aligned, _any_layout, _diagonal, _feature_major,
                             _repeated, wide_rows)
from ._tiles import PACK_ROWS, VECTOR_BYTES, pack_size, packs

__all__ = ["CHUNK_COLUMNS", "NARROW_CHUNK_COLUMNS", "OVERLAP_COLUMNS", "OVERLAP_PIECES", "OVERLAP_STEP_MAX",
           "THREADED_STEP_MIN", "serves", "step_parts", "group_sequences", "chunk_steps", "narrow",
           "overlaps", "overlap_pieces", "wide_rows", "forward", "backward"]


# --------------------------------------------------------------------------------------
# Which path serves a call.
# --------------------------------------------------------------------------------------
#: Columns (steps × sequences) per chunk of the input projection and of the weight-gradient
#: products. 1024 keeps each product large and a chunk's projection, which the steps read
#: back, at ``4H × 1024`` elements (4 MiB at H = 256 in float32), most of it still in the
#: caches: against 4096 columns, the long row (T = 2000, N = 8, H = 256) took 0.89–0.92× the
#: time forward and 0.90–0.95× a training step, L (2 chunks instead of 1) 0.97–0.99×, XL
#: the same; the other benchmark shapes are one chunk either way.
CHUNK_COLUMNS = 1024

#: Columns per chunk of a forward on the calling thread whose steps are narrow (:func:`narrow`;
#: shared out over threads, its chunks keep :data:`CHUNK_COLUMNS`). Each such step reads
#: its few columns of every one of the projection's 4H rows, a cache line of each, and with
#: :data:`CHUNK_COLUMNS` the chunk's projection could outgrow the level-2 cache (1 MiB at
#: H = 64 and 1024 columns): some processes then ran the forward 10–20 % slower throughout.
#: Measured (forward, float32, seven fresh processes each, 1024 columns against 128): T 400,
#: N 4, I 32, H 64 1 167–1 362 µs against 1 131–1 148; T 400, N 2, I 64, H 128 1 908–2 207
#: against 1 910–1 992; T 1 000, N 1 (I 32, H 64) and H 256 the same either way.
NARROW_CHUNK_COLUMNS = 128


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
    cheap; else 1, and 1 in a process forked from one running Numba's GNU OpenMP threads,
    which cannot start a parallel region (:func:`._tiers.forked_from_openmp`)."""
    if _tiers.forked_from_openmp():
        return 1
    threads = numba.get_num_threads()
    limit = current_limit()
    if limit:
        threads = min(threads, limit)
    if threads < 2:
        return 1
    return threads if _cheap_parallel_regions() else 1


def chunk_steps(seq_len: int, batch: int, narrow_steps: bool = False) -> int:
    """Steps per chunk: :data:`CHUNK_COLUMNS` columns (:data:`NARROW_CHUNK_COLUMNS` for a
    forward on the calling thread of ``narrow_steps``), at least one step, at most ``seq_len``."""
    columns = NARROW_CHUNK_COLUMNS if narrow_steps else CHUNK_COLUMNS
    return max(1, min(seq_len, columns // max(batch, 1)))


def narrow(batch: int, dtype: np.dtype) -> bool:
    """Whether the steps of ``batch`` sequences are narrow: fewer sequences than a vector holds,
    whose products are a tile of their states as rows (:func:`~._tiles.row_product`)."""
    return batch * np.dtype(dtype).itemsize < VECTOR_BYTES


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
    units: ``batch`` a multiple of ``parts`` and each group's columns packed products' own
    (:func:`packs`)."""
    return parts > 1 and batch % parts == 0 and packs(batch // parts, dtype)


# --------------------------------------------------------------------------------------
# The arguments a call hands the kernels, and the entry points the stack calls.
# --------------------------------------------------------------------------------------
class _ForwardCall(NamedTuple):
    """The arguments of :func:`_forward` or :func:`_forward_one` for one layer and direction
    (after the scratch is taken and the states laid out), and where its final states go."""

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
    one: bool

    def run(self, reverse: bool) -> None:
        """:func:`_forward` (:func:`_forward_one` for ``one`` sequence) on the calling thread."""
        kernel = _forward_one if self.one else _forward
        kernel(self.x2, self.wx, self.bias, self.u, self.u_t, self.pe, self.full_pre, self.full_out,
               self.h0, self.c0, self.lengths, self.steps, self.hidden, self.outs, self.h_fin, self.c_fin,
               self.projection, reverse, self.light)

    def finish(self) -> None:
        """Copy the final states out, batch-major."""
        np.copyto(self.h_final, self.h_fin.T)
        np.copyto(self.c_final, self.c_fin.T)


def _forward_call(w: LSTMWeights, x2: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None,
                  lengths: np.ndarray | None, steps: np.ndarray, hidden: np.ndarray | None,
                  output: np.ndarray, h_final: np.ndarray, c_final: np.ndarray, scratch,
                  chunk: int, one: bool = False) -> _ForwardCall:
    """Scratch, laid-out states and weights for the forward kernels, from the arguments of
    :func:`forward`; ``chunk`` steps per input projection; ``one``: one sequence on the calling
    thread (:func:`projection_shape`)."""
    assert w.u_wide is not None and w.u_t_wide is not None, "weights packed by NumbaBackend.lstm_pack_weights"
    dtype = steps.dtype
    seq_len, six_h, batch = steps.shape
    h = six_h // 6
    inference = hidden is None or not steps.strides[0]
    if inference:  # nothing kept: two blocks taken in turn
        steps = scratch.array("lstm_numba_blocks", (2, six_h, batch), dtype)
        hidden = scratch.array("lstm_numba_hidden", (2, h, batch), dtype)
    assert hidden is not None  # a training cache keeps the states
    projection = scratch.array("lstm_numba_projection", projection_shape(h, chunk, batch, one), dtype)
    h_fin = scratch.array("lstm_numba_h_fin", (h, batch), dtype)
    c_fin = scratch.array("lstm_numba_c_fin", (h, batch), dtype)
    f = _forward_weights(w, x2.shape[1], h, batch, dtype, inference, one)
    return _ForwardCall(
        x2, f.wx, f.bias, w.u_wide, f.u_t, f.pe, f.full_pre, f.full_out, _feature_major(h0, dtype),
        _feature_major(c0, dtype), _NO_LENGTHS if lengths is None else lengths, steps, hidden,
        _any_layout(output), h_fin, c_fin, projection, f.light, h_final, c_final, one)


def projection_shape(h: int, chunk: int, batch: int, one: bool) -> tuple[int, int]:
    """The shape of a forward's projection scratch for ``chunk`` steps.

    ``one`` (one sequence on the calling thread, :func:`_forward_one`): a row a step, (chunk,
    4H), a step reading one contiguous row, to which its product is added
    (:func:`~._lstm_forward._recur_one`). Else (the steps shared out over threads, whatever the
    batch, too) a column a step and sequence,
    (4H, chunk·N + :data:`ROW_PAD`): each step reads a run of every row, and rows of a
    multiple of 4 KiB (the chunks of 1 024 float32 columns of L, XL and the long row) would
    put all those runs in one set of the level-1 cache (as :func:`wide_rows` describes for
    ``U``), hence the padding. A contiguous array, not a padded view of one: with the view (a
    kernel compiled for any strides) L's forward took 1.2 times as long."""
    if one:
        return (chunk, 4 * h)
    return (4 * h, chunk * batch + ROW_PAD)


class _ForwardWeights(NamedTuple):
    """The arguments of :func:`_forward` or :func:`_forward_one` taken from the weights alone
    (:func:`_forward_weights`)."""

    wx: np.ndarray
    bias: np.ndarray
    u_t: np.ndarray
    pe: np.ndarray
    full_pre: np.ndarray
    full_out: np.ndarray
    light: bool


#: Kinds of call whose weight arguments a packing keeps at most (:func:`_forward_weights`).
FORWARD_WEIGHTS_KEPT = 8


def _forward_weights(w: LSTMWeights, size_i: int, h: int, batch: int, dtype: np.dtype,
                     inference: bool, one: bool = False) -> _ForwardWeights:
    """What the forward kernels read from the weights for inputs of width ``size_i``, ``h``
    units, ``batch`` sequences and an inference or not (with ``one``, one sequence on the
    calling thread as :func:`projection_shape` says: ``Wᵀ`` instead of ``W``, and
    :func:`_halved_u_t`): made at the first such call of a packing and kept in
    ``w.forward_args`` (the weights of a packing never change; a few kinds at most are kept).
    A call of a small layer spent about 4 µs making them each time."""
    kept = w.forward_args
    key = (size_i, h, batch, dtype, inference, one)
    if kept is not None:
        found = kept.get(key)
        if found is not None:
            return found
    full_out = w.peepholes.full_output
    wx, u_t = w.wx_bias[:4 * h, :size_i], w.u_t_wide
    assert u_t is not None, "weights packed by NumbaBackend.lstm_pack_weights"
    if one:  # Wᵀ, the operand of one sequence's projection (a view: the kernels' one type)
        wx, u_t = wide_rows(np.ascontiguousarray(wx.T))[:, :4 * h], _halved_u_t(w)
    made = _ForwardWeights(
        wx, np.ascontiguousarray(w.wx_bias[:4 * h, size_i]), u_t,
        _repeated(w.peepholes.diagonal, h, batch, dtype), _EMPTY[dtype] if w.full_pre is None else w.full_pre,
        _EMPTY[dtype] if full_out is None else full_out, _light(w, inference))
    if kept is not None:
        if len(kept) >= FORWARD_WEIGHTS_KEPT:
            kept.clear()
        kept[key] = made
    return made


def _halved_u_t(w: LSTMWeights) -> np.ndarray:
    """``Uᵀ`` with the halved gates' columns halved, in wide rows (:func:`wide_rows`): the
    transpose of the forward's ``u``, to which one sequence's step adds its product
    (:func:`~._lstm_forward._recur_one`). Made at the first such forward of a packing, kept in
    ``w.forward_args``."""
    kept = w.forward_args
    found = None if kept is None else kept.get(("u_t",))
    if found is None:
        found = wide_rows(np.ascontiguousarray(w.u.T))
        if kept is not None:
            kept[("u_t",)] = found
    return found


def _light(w: LSTMWeights, inference: bool) -> bool:
    """An inference without peepholes: the steps write no cache rows (nothing reads them)."""
    return inference and w.full_pre is None and w.peepholes.full_output is None and all(
        p is None for p in w.peepholes.diagonal)


_NO_TILES = {np.dtype(t): np.empty((1, 4, 0, 0, PACK_ROWS), t) for t in (np.float32, np.float64)}


def _step_tiles(w: LSTMWeights, parts: int, batch: int) -> np.ndarray:
    """The rows of ``[U W]`` packed for the steps shared out over ``parts`` threads
    (:func:`~._lstm_forward._steps_threads`, whose products then take ``U h + W x`` at once: no projection of
    the input ahead of the steps): (P, 4, B, H + I, R), piece ``p``'s gate ``g`` in ``[p, g]``,
    its rows in whole blocks of ``R`` and the rest in one more (:func:`_pack_tiles`); ``R`` is
    :func:`~._tiles.pack_size` of the batch (:data:`~._tiles.COLUMN_ROWS` where ``batch``
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
            h_final: np.ndarray, c_final: np.ndarray, *, reverse: bool, scratch, parts: int = 1) -> None:
    """One layer and direction forward (:func:`_forward`, :func:`_forward_one`); ``steps`` is
    (T, 6H, N), with a zero stride along T in inference (then ``hidden`` is None). With
    ``parts`` > 1 each step's units are shared out over that many threads
    (:func:`_forward_threads`, BLAS held to one thread meanwhile); :func:`backward` then takes
    the same ``parts``. An inference whose sequences :func:`group_sequences` shares out instead
    walks one group a thread (:func:`_groups_threads`), and so does one with ``parts`` 1 that
    :func:`group_parts` gives threads."""
    seq_len, six_h, batch = steps.shape
    inference = hidden is None or not steps.strides[0]
    threads = parts
    if inference and parts == 1:  # steps too small to share out: perhaps groups
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
    chunk = 0 if tiles.shape[2] else chunk_steps(seq_len, batch, parts == 1 and narrow(batch, steps.dtype))
    a = _forward_call(w, x2, h0, c0, lengths, steps, hidden, output, h_final, c_final, scratch, chunk,
                      parts == 1 and batch == 1)
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
    makes so), calling :func:`_forward` (:func:`_forward_one` for one sequence) for each layer
    in turn: layer k's output, in scratch of the call's own, is layer k + 1's input (a stack's
    dropout acts in training only).

    What each call would otherwise work out is worked out once: each layer's weight arguments
    (:func:`_forward_weights`), the chunk, and where the scratch arrays lie in one workspace
    buffer (their views kept while the workspace hands out that buffer). A call then lays out
    every layer's states in one copy, runs the layers' kernels and copies every final state
    out in one more. Through the stack's layers of calls a prepared forward ran about 5 µs of
    Python around the kernel at T = N = 1, and taking its scratch arrays one by one about 1 µs
    more; a stream step of two layers (I = 32, H = 64, N = 1) took 33.9 µs there, 18.3 here.

    Two costs of a call are cut where they would outweigh its steps. With one sequence a
    C-contiguous, aligned state ``(L, 1, H)`` lies in memory as the kernels' feature-major
    ``(L, H, 1)``, a C-contiguous view of the same kind as the scratch's, so the kernels read
    and write the caller's states in place (:meth:`_in_place`; each copy took about 0.4 µs).
    And an output of at most :data:`TOP_COPIED_BYTES` is written to scratch and copied out,
    because making the stride-0 view the kernel takes (:func:`_any_layout`) of a new output at
    each call took 1.0 µs, and the copy 0.2-0.6."""

    #: The largest output the top layer writes to scratch, to copy it out after the kernel.
    TOP_COPIED_BYTES = 16384

    def __init__(self, weights: Sequence[LSTMWeights], seq_len: int, batch: int, size_i: int, h: int,
                 dtype: np.dtype) -> None:
        assert all(w.u_wide is not None and w.u_t_wide is not None for w in weights), \
            "weights packed by NumbaBackend"
        self._dtype = dtype
        self._one = batch == 1  # one sequence's layout and kernel (_forward_one), else _forward's
        #: per layer, the kernel's arguments from ``wx`` to ``full_out``, and ``light``
        self._layers: list[tuple] = []
        for k, w in enumerate(weights):
            a = _forward_weights(w, size_i if k == 0 else h, h, batch, dtype, True, self._one)
            self._layers.append((a.wx, a.bias, w.u_wide, a.u_t, a.pe, a.full_pre, a.full_out, a.light))
        self._x_shape = (seq_len * batch, size_i)
        chunk = chunk_steps(seq_len, batch, narrow(batch, dtype))
        size_l = len(weights)
        # as :func:`_forward_call` takes them: two blocks of steps and of states taken in turn
        # and the chunk's projection (projection_shape); every layer's initial and final
        # states, feature-major; the outputs of the layers below the top, two taken in turn
        # (a layer reads one and writes the other)
        # (and the top layer's output when it is copied out)
        self._top_copied = seq_len * batch * h * dtype.itemsize <= self.TOP_COPIED_BYTES
        #: (L, H, 1), the kernels' view of a C-contiguous (L, 1, H) state, with one sequence
        self._columns = (size_l, h, 1) if batch == 1 else None
        shapes = ((2, 6 * h, batch), (2, h, batch), projection_shape(h, chunk, batch, self._one),
                  *[(size_l, h, batch)] * 4, *[(seq_len, batch, h)] * min(size_l - 1, 2),
                  *[(seq_len, batch, h)] * self._top_copied)
        self._layout = []
        offset = 0
        for shape in shapes:
            nbytes = math.prod(shape) * dtype.itemsize
            self._layout.append((offset, nbytes, shape))
            offset += -(-nbytes // 64) * 64  # each array on a cache line of its own
        self._nbytes = offset
        self._bound: tuple[np.ndarray | None, tuple] = (None, ())

    def _scratch(self, scratch) -> tuple:
        """The scratch arrays in the workspace's buffer, with each layer's views of the output
        it writes (as :func:`_any_layout` makes it; the top's only when it is copied out) and
        of that output as the next layer reads it. Made again only when the workspace hands
        out another buffer."""
        buffer = scratch.bytes("lstm_numba_stack", self._nbytes)
        base, bound = self._bound
        if base is None or buffer.base is not base:
            dtype = self._dtype
            views = [buffer[o:o + n].view(dtype).reshape(shape) for o, n, shape in self._layout]
            steps, states, projection, h0, c0, h_fin, c_fin, *between = views
            top = between.pop() if self._top_copied else None
            outputs: list[tuple[Any, Any]] = [(_any_layout(b), b.reshape(-1, b.shape[2])) for b in between]
            last = len(self._layers) - 1  # the top layer writes the call's output
            outputs.append((None, None) if top is None else (_any_layout(top), top))
            layers = tuple(outputs[k % 2] if k < last else outputs[-1] for k in range(last + 1))
            bound = (steps, states, projection, h0, c0, h_fin, c_fin, top, layers)
            self._bound = (buffer.base, bound)
        return bound

    def _in_place(self, state: np.ndarray) -> bool:
        """Whether the kernels read or write ``state`` (L, N, H) where it lies (see the class)."""
        flags = state.flags
        return self._columns is not None and flags.c_contiguous and flags.aligned

    def __call__(self, x: np.ndarray, hidden: np.ndarray | None, cell: np.ndarray | None, output: np.ndarray,
                 hidden_out: np.ndarray, cell_out: np.ndarray, cache: np.ndarray | None,
                 dropout_masks: tuple[np.ndarray | None, ...] | None, workspace: Workspace) -> None:
        """The contract's prepared forward (:class:`~bnnsfw.backends.contract.LSTMForwardCall`)
        of an inference (no cache, no dropout masks)."""
        steps, states, projection, h0, c0, h_fin, c_fin, top, layers = self._scratch(workspace)
        empty = _EMPTY[self._dtype]
        # every layer's states as the kernels take them, (L, H, N): the caller's or the scratch's
        columns = self._columns
        if hidden is not None:
            if self._in_place(hidden):
                h0 = hidden.reshape(columns)
            else:  # assigning, which took 0.40 µs where np.copyto took 0.56
                h0[...] = hidden.transpose(0, 2, 1)
        if cell is not None:
            if self._in_place(cell):
                c0 = cell.reshape(columns)
            else:
                c0[...] = cell.transpose(0, 2, 1)
        h_last = hidden_out.reshape(columns) if self._in_place(hidden_out) else h_fin
        c_last = cell_out.reshape(columns) if self._in_place(cell_out) else c_fin
        x2 = x.reshape(self._x_shape)
        kernel = _forward_one if self._one else _forward
        for k, (weights, (outs, following)) in enumerate(zip(self._layers, layers)):
            wx, bias, u, u_t, pe, full_pre, full_out, light = weights
            kernel(x2, wx, bias, u, u_t, pe, full_pre, full_out, empty if hidden is None else h0[k],
                   empty if cell is None else c0[k],
                   _NO_LENGTHS, steps, states, _any_layout(output) if outs is None else outs, h_last[k],
                   c_last[k], projection, False, light)
            x2 = following
        if top is not None:
            output[...] = top
        if h_last is h_fin:
            hidden_out[...] = h_fin.transpose(0, 2, 1)
        if c_last is c_fin:
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
        # two rows at least: a view of one row is contiguous, and Numba would compile the
        # backward family once more for that layout (H = 1)
        _aligned(scratch, "lstm_numba_columns", (max(h, 2), chunk * batch), dtype),
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
    and small float32 steps the walk and the products overlap (:func:`overlaps`,
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

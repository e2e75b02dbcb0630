"""A compiled product for the LSTM's step: ``out = add + a @ b`` without packing at each call.

A step's recurrent product is skinny (``4H × H`` weights against ``H × N`` states, N a few
sequences), and it runs once per step with the same weights. BLAS repacks both operands at
every call, and the dot-product kernel it replaced (vectorized along the shared axis ``k``)
spent much of its time in the horizontal sums that end each dot product. :func:`product`
instead keeps a tile of ``out`` in vector registers while it walks ``k``: each step of the
walk loads a row of ``b`` (``2L`` columns, ``L`` the elements of one vector: 16 float32 with
AVX-512, else 8) and multiplies it by six broadcast scalars of ``a``, twelve fused
multiply-adds with no sum across lanes. One thread ran 95–112 GFLOP/s in float32 on the
benchmark's step shapes (``256 × 128 × 16`` up to ``1024 × 512 × 64``, 32-byte vectors),
against 60–82 for the dot-product kernel, 93–103 for a one-thread OpenBLAS call on the same
operands and about 105 for one core's share of the sgemm peak. The weights' rows can be
packed once for all the steps instead (:func:`packed_product`).

The tile is written in LLVM's vector types (:func:`_tile`, a Numba intrinsic), which LLVM
lowers for whatever the machine has: 64-byte vectors where the code is compiled for AVX-512
(:data:`WIDE_BYTES`), 32-byte ones on AVX2, two 16-byte halves on SSE or NEON. ``llvm.fmuladd``
becomes one fused instruction where the machine has one.

Columns go in panels of two wide vectors, then at most one of one wide vector, then (with
AVX-512) at most one of a 32-byte vector; when N is not a whole number of 32-byte vectors,
the product runs on copies of ``b`` and ``add`` padded with zero columns. With AVX-512, a
product of one 32-byte vector's worth of columns (8 float32 sequences, 4 float64) and an even
``K`` is paired instead (:func:`_pair_tile`): ``b``'s rows are interleaved two by two into
64-byte rows, and each fused multiply-add takes two steps of ``k`` for the whole row of ``out``,
``a[i, 2k]`` and ``a[i, 2k + 1]`` broadcast over alternate lanes. On one thread the 32-byte tile
ran 62–68 GFLOP/s on ``512 × 256 × 8`` (the long row's step, half the units) and ``1024 × 256
× 8``, the paired one 117–132. One 64-byte vector's worth of columns (16 float32 sequences,
8 float64) with an even ``K`` is paired too, half a vector's columns at a time: each
broadcast pair then serves two vectors of pairs, sixteen fused multiply-adds for eight
broadcasts and two loaded rows (ten loads), where the one-vector tile takes twelve
broadcasts and a loaded row for twelve. On one thread, float32, the
pairing of ``b`` included (three runs alternated with the one-vector tile):
``256 × 128 × 16`` (M's forward step, half its units) 132–151 GFLOP/s against 107–121,
``128 × 512 × 16`` (its backward ``Uᵀ dz``, half the units) 129–162 against 100–114.
(Those figures are from a Zen 5 guest, whose vector units are 512 bits wide. Where they are 256
bits wide, the 64-byte vectors gain nothing over two 32-byte ones and the paired tiles stay
unused: :data:`PAIRS`.)
Each call of the tile in the source compiles to a loop of its own, so the kernel calls it from
few places, and :func:`product` hands its operands on as views of one layout: the kernel
compiles once per dtype, in about 5 s with the 64-byte panels and both paired tiles (3.0
without either; the two-vector paired tile added about 0.5 s; a kernel per
layout of the operands, with the padded columns handled in each block of rows, took 4–5 s
each, and the demo's first call from an empty cache went from 14 to 36 s).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import _cache

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry

__all__ = ["ROWS", "NARROW_ROWS", "PAIR_ROWS", "PAIR_WIDE_ROWS", "PACK_ROWS", "PAIRS", "ROW_VECTORS",
           "ROWS_VECTORS", "SPLIT_WIDE_CPUS", "VECTOR_BYTES", "WIDE_BYTES", "COLUMN_ROWS", "COLUMN_COLUMNS",
           "column_tiles", "column_product", "TRANSPOSED_ROWS", "lanes", "packs", "pack_rows", "pack_size",
           "packed_product", "paired", "paired_product", "product", "row_product", "add_row_product",
           "transposed_product", "wide_loops"]

#: Rows of ``out`` per tile: six rows by two vectors keep twelve sums in flight, more than a
#: fused multiply-add's latency times the two a cycle that a core issues (4 × 2 on the
#: machines measured), with the loaded row of ``b`` and a broadcast: 15 of 16 vector registers
#: (AVX2). With AVX-512's 32 registers every panel takes :data:`NARROW_ROWS` (:func:`_blocks`).
ROWS = 6

#: Rows per tile of a one-vector panel (N of 8 float32, say): twelve sums in flight again.
NARROW_ROWS = 2 * ROWS

#: Rows per tile of the paired product of one narrow vector's worth of columns (with AVX-512:
#: :func:`_pair_tile`). Twelve sums in flight, as in the other tiles; on ``512 × 256 × 8`` in
#: float32, one thread, 8, 12 and 16 rows ran within 3 % of each other, 6 rows 20 % slower and
#: 24 (which spill the 32 vector registers) 2–3 times slower.
PAIR_ROWS = 12

#: Rows per tile of the paired product of one wide vector's worth of columns (two vectors of
#: pairs a row): sixteen sums. With twelve or ten rows (24 or 20 sums) the compiled walk moved
#: some sums to the stack and back at every step (seen in the assembly): on ``256 × 128 × 16``
#: in float32, one thread, 84–94 GFLOP/s against 148–151 with eight rows.
PAIR_WIDE_ROWS = 8

#: Bytes per vector of the narrowest panels (8 float32, 4 float64); columns go in whole
#: numbers of these.
VECTOR_BYTES = 32


def _wide_bytes() -> int:
    """Bytes per vector of the wide panels: 64 where the code is compiled for AVX-512 (the
    features Numba compiles for: its ``NUMBA_CPU_FEATURES``, else the machine's), else
    :data:`VECTOR_BYTES`."""
    from numba.core import codegen, config

    chosen = getattr(config, "CPU_FEATURES", None)  # set at import from the environment
    features = chosen if chosen is not None else codegen.get_host_cpu_features()
    return 64 if "+avx512f" in str(features).split(",") else VECTOR_BYTES


#: Bytes per vector of the wide panels (:func:`_wide_bytes`). With AVX-512 a tile of 64-byte
#: vectors holds as many sums in half the instructions (a loaded row of ``b`` and each
#: broadcast serve 16 float32 columns instead of 8): one thread ran 92–115 GFLOP/s on the
#: step shapes, against 67–112 for 32-byte vectors, whose speed changed from one process to
#: the next (68–76 in some, 102–112 in others, the same shapes and machine).
WIDE_BYTES = _wide_bytes()

#: The processors, as LLVM names them, whose AVX-512 instructions run on 256-bit units (each
#: 64-byte operation in two halves): Zen 4 (``znver4``). There a 64-byte fused multiply-add does
#: the work of two 32-byte ones, so the paired tiles (:func:`_pair_tile`) gain nothing from their
#: wider vectors and pay for their pair broadcasts, and the packed rows (:func:`packs`) serve
#: one vector's worth of columns too. On an AMD EPYC guest (Zen 4, 2.6 GHz), two threads each
#: with its half of a step's rows, float32: the long row's ``U h`` (``256 × 256 × 8`` a gate)
#: 26–30 µs a step paired, ``[U W] [h; x]`` packed 42–52 µs, where the projection it replaces
#: took 21 µs a step; M's 11.8–13.6 µs paired, packed 20.3–21.7, its projection 11.8 a step.
#: A processor LLVM names otherwise keeps the paired tiles (on a Zen 5 guest, whose units are
#: 512 bits wide, they ran 117–151 GFLOP/s a thread against 62–121 for the other tiles).
SPLIT_WIDE_CPUS = frozenset({"znver4"})


def _cpu_name() -> str:
    """The processor Numba compiles for: its ``NUMBA_CPU_NAME``, else the machine's."""
    from llvmlite import binding
    from numba.core import config

    chosen = getattr(config, "CPU_NAME", None)  # set at import from the environment
    return str(chosen) if chosen else str(binding.get_host_cpu_name())


def _pairs(wide_bytes: int, cpu: str) -> bool:
    """Whether the paired tiles serve: 64-byte vectors on a processor not in
    :data:`SPLIT_WIDE_CPUS`."""
    return wide_bytes == 2 * VECTOR_BYTES and cpu not in SPLIT_WIDE_CPUS


#: Whether products of one narrow or one wide vector's worth of columns take the paired tiles
#: (:func:`_pairs_apply`; :func:`_pairs` of :data:`WIDE_BYTES` and the processor). A constant of
#: the compiled kernels, whose entries Numba's cache keeps apart by processor name and features.
PAIRS = _pairs(WIDE_BYTES, _cpu_name())

_kernel = numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True)
_inline = numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True, inline="always")


@intrinsic
def wide_loops(typingctx):
    """Vectorize the calling function's loops with vectors of :data:`WIDE_BYTES`: sets its
    ``prefer-vector-width`` attribute, which LLVM's loop vectorizer reads. LLVM's tuning for
    the AVX-512 Xeons prefers 32-byte vectors in the loops it vectorizes itself (the tiles
    below say their width); in those loops the wide vectors halve the instructions (the fused
    forward pass of M's step, one thread: 7.1–7.6 µs → 5.4; five gate functions 3.5 → 2.6 ns a
    unit). The attribute applies to the function being compiled: a kernel calls this once,
    outside its loops, and in the body of each ``prange`` loop (a function of its own)."""
    signature = types.void()

    def codegen(context, builder, sig, args):
        attributes = builder.function.attributes
        if isinstance(attributes, set):  # llvmlite's set of names, printed as written
            # (its ``add`` accepts only the attributes it lists, no string attributes)
            set.add(attributes, f'"prefer-vector-width"="{8 * WIDE_BYTES}"')
        return context.get_dummy_value()

    return signature, codegen


def lanes(dtype: np.dtype) -> int:
    """Elements of ``dtype`` per vector of the tile."""
    return VECTOR_BYTES // np.dtype(dtype).itemsize


def _tile_types(literals, arrays) -> bool:
    """Whether an intrinsic tile's arguments type: ``literals`` literal integers, ``arrays`` 2-D
    arrays of one float dtype."""
    if not all(isinstance(t, types.IntegerLiteral) for t in literals):
        return False
    if not all(isinstance(t, types.Array) and t.ndim == 2 for t in arrays):
        return False
    return len({t.dtype for t in arrays}) == 1 and arrays[0].dtype in (types.float32, types.float64)


def _operands(context, builder, sig, args, count):
    """The first ``count`` (2-D array) arguments of an intrinsic's call: their structures, their
    data as byte pointers and their row strides in bytes."""
    structs = [context.make_array(t)(context, builder, v) for t, v in zip(sig.args[:count], args[:count])]
    data = [builder.bitcast(s.data, ir.IntType(8).as_pointer()) for s in structs]
    row_bytes = [cgutils.unpack_tuple(builder, s.strides, 2)[0] for s in structs]
    return structs, data, row_bytes


def _fmuladd(builder, vector, dtype):
    """LLVM's fused multiply-add on ``vector`` (an ``ir.VectorType`` of ``dtype``'s scalars)."""
    return cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vector, [vector, vector, vector]),
        f"llvm.fmuladd.v{vector.count}f{dtype.bitwidth}")


@intrinsic
def _tile(typingctx, a, b, add, out, rows, vectors, vector_bytes, a_by_columns):
    """``out[i, :V·L] = add[i, :V·L] + Σ_k a[i, k]·b[k, :V·L]`` for ``i < rows``, ``V = vectors``
    of ``vector_bytes`` each (``L`` elements; all four literal integers), ``k`` over the shared
    axis. Every array is 2-D; ``b``, ``add`` and ``out`` with unit-stride rows (any row stride).
    ``a`` with any strides, or with ``a_by_columns`` 1 given as its transpose (K, rows) with
    unit-stride rows (a block packed by :func:`pack_rows`): each step of the walk then reads
    its ``rows`` broadcast scalars at fixed offsets from one address, where rows of ``a`` need
    an offset each (twelve rows' offsets and the tile's other addresses outgrew the sixteen
    general registers, and each broadcast reloaded its offset from the stack: on L's step
    ``512 × 256 × 32``, one thread, float32, 208–225 GFLOP/s against 246–249 with the fixed
    offsets, the rows as they are 241–265). ``out`` may be ``add``: the tile reads all of
    ``add`` before it writes."""
    literals = (rows, vectors, vector_bytes, a_by_columns)
    if not _tile_types(literals, (a, b, add, out)):
        return None
    n_rows, n_vectors, n_bytes, by_columns = (t.literal_value for t in literals)
    signature = types.void(a, b, add, out, rows, vectors, vector_bytes, a_by_columns)

    def codegen(context, builder, sig, args):
        dtype = sig.args[0].dtype
        scalar = context.get_value_type(dtype)
        itemsize = dtype.bitwidth // 8
        width = n_bytes // itemsize
        vector = ir.VectorType(scalar, width)
        i64 = ir.IntType(64)
        structs, data, row_bytes = _operands(context, builder, sig, args, 4)
        a_shape = cgutils.unpack_tuple(builder, structs[0].shape, 2)
        if by_columns:
            a_step, size_k = row_bytes[0], a_shape[0]
        else:
            a_step, size_k = cgutils.unpack_tuple(builder, structs[0].strides, 2)[1], a_shape[1]
        fmuladd = _fmuladd(builder, vector, dtype)

        def at(base, offset, kind):
            return builder.bitcast(builder.gep(base, [offset]), kind.as_pointer())

        def row(which, i):
            if which == 0 and by_columns:
                return ir.Constant(i64, i * itemsize)
            return builder.mul(row_bytes[which], ir.Constant(i64, i))

        def column(v):
            return ir.Constant(i64, v * n_bytes)

        sums = [[cgutils.alloca_once(builder, vector) for _ in range(n_vectors)] for _ in range(n_rows)]
        for i in range(n_rows):
            for v in range(n_vectors):
                start = builder.load(at(data[2], builder.add(row(2, i), column(v)), vector), align=itemsize)
                builder.store(start, sums[i][v])
        everywhere = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)
        undefined = ir.Constant(vector, ir.Undefined)
        with cgutils.for_range(builder, size_k) as loop:
            b_row = builder.mul(loop.index, row_bytes[1])
            b_vectors = [builder.load(at(data[1], builder.add(b_row, column(v)), vector), align=itemsize)
                         for v in range(n_vectors)]
            a_column = builder.mul(loop.index, a_step)
            for i in range(n_rows):
                value = builder.load(at(data[0], builder.add(row(0, i), a_column), scalar), align=itemsize)
                broadcast = builder.shuffle_vector(
                    builder.insert_element(undefined, value, ir.Constant(ir.IntType(32), 0)), undefined,
                    everywhere)
                for v in range(n_vectors):
                    total = builder.call(fmuladd, [broadcast, b_vectors[v], builder.load(sums[i][v])])
                    builder.store(total, sums[i][v])
        for i in range(n_rows):
            for v in range(n_vectors):
                target = at(data[3], builder.add(row(3, i), column(v)), vector)
                builder.store(builder.load(sums[i][v]), target, align=itemsize)
        return context.get_dummy_value()

    return signature, codegen


def _interleaved(width):
    """The shuffle that puts lane ``j`` of a first half-vector in lane ``2j`` of a vector of
    ``width`` lanes and lane ``j`` of a second one in lane ``2j + 1``: rows of ``b`` paired
    (:func:`_pair_rows`), or a row of ``add`` spread over the even lanes of a paired tile's
    sums with zeros for the second (:func:`_pair_tile`)."""
    order = [j // 2 + (width // 2) * (j % 2) for j in range(width)]
    return ir.Constant(ir.VectorType(ir.IntType(32), width), order)


def _pair_types(arrays, vector_bytes):
    """The common dtype of ``arrays`` (2-D, one float dtype) and the elements of a vector of
    ``vector_bytes`` (a literal integer), or None when they do not type."""
    if not isinstance(vector_bytes, types.IntegerLiteral):
        return None
    if not all(isinstance(t, types.Array) and t.ndim == 2 for t in arrays):
        return None
    if len({t.dtype for t in arrays}) != 1 or arrays[0].dtype not in (types.float32, types.float64):
        return None
    return arrays[0].dtype, vector_bytes.literal_value // (arrays[0].dtype.bitwidth // 8)


@intrinsic
def _pair_rows(typingctx, b, pairs, vector_bytes):
    """``pairs[k, L·v + 2j + e] = b[2k + e, (L/2)·v + j]`` for ``k < pairs.shape[0]``, ``e`` 0 or 1,
    ``j`` below half the elements ``L`` of a vector of ``vector_bytes`` and ``v`` below the
    number of such half-vectors in a row of ``b``: each pair of rows of ``b`` interleaved, ``L/2``
    columns at a time, into one vector each, a load of each row's half and one shuffle."""
    typed = _pair_types((b, pairs), vector_bytes)
    if typed is None:
        return None
    dtype, width = typed
    signature = types.void(b, pairs, vector_bytes)

    def codegen(context, builder, sig, args):
        scalar = context.get_value_type(dtype)
        half, whole = ir.VectorType(scalar, width // 2), ir.VectorType(scalar, width)
        i64 = ir.IntType(64)
        align = dtype.bitwidth // 8
        structs, data, row_bytes = _operands(context, builder, sig, args, 2)
        count, columns = cgutils.unpack_tuple(builder, structs[1].shape, 2)
        mixed = _interleaved(width)
        vectors = builder.udiv(columns, ir.Constant(i64, width))
        with cgutils.for_range(builder, count) as loop:
            even = builder.mul(builder.mul(loop.index, ir.Constant(i64, 2)), row_bytes[0])
            odd = builder.add(even, row_bytes[0])
            target_row = builder.mul(loop.index, row_bytes[1])
            with cgutils.for_range(builder, vectors) as group:
                offset = builder.mul(group.index, ir.Constant(i64, width // 2 * align))
                rows = [builder.load(builder.bitcast(builder.gep(data[0], [builder.add(at, offset)]),
                                                     half.as_pointer()), align=align)
                        for at in (even, odd)]
                target = builder.gep(data[1], [builder.add(target_row, builder.add(offset, offset))])
                builder.store(builder.shuffle_vector(rows[0], rows[1], mixed),
                              builder.bitcast(target, whole.as_pointer()), align=align)
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def _pair_tile(typingctx, a, pairs, add, out, rows, vectors, vector_bytes):
    """``out[i, :V·L/2] = add[i, :V·L/2] + Σ_k a[i, k]·b[k, :V·L/2]`` for ``i < rows``, ``V =
    vectors`` (both literal integers), ``L`` the elements of a vector of ``vector_bytes``, ``b``
    given as ``pairs`` (:func:`_pair_rows`, ``K/2`` rows of ``V·L``). Each step of the walk
    broadcasts the pair ``a[i, 2k], a[i, 2k + 1]`` over a vector and multiplies it by the ``V``
    vectors of pair row ``k``: one fused multiply-add takes two steps of ``k`` for ``L/2``
    columns, and the even and odd lanes of each sum are added at the end. Arrays as in
    :func:`_tile`."""
    typed = _pair_types((a, pairs, add, out), vector_bytes)
    if typed is None or not all(isinstance(t, types.IntegerLiteral) for t in (rows, vectors)):
        return None
    dtype, width = typed
    n_rows, n_vectors = rows.literal_value, vectors.literal_value
    signature = types.void(a, pairs, add, out, rows, vectors, vector_bytes)

    def codegen(context, builder, sig, args):
        scalar = context.get_value_type(dtype)
        whole, half, two = (ir.VectorType(scalar, n) for n in (width, width // 2, 2))
        i64, i32 = ir.IntType(64), ir.IntType(32)
        itemsize = dtype.bitwidth // 8
        structs, data, row_bytes = _operands(context, builder, sig, args, 4)
        count = cgutils.unpack_tuple(builder, structs[1].shape, 2)[0]
        fmuladd = _fmuladd(builder, whole, dtype)

        def at(which, i, offset, kind):
            start = builder.add(builder.mul(row_bytes[which], ir.Constant(i64, i)), offset)
            return builder.bitcast(builder.gep(data[which], [start]), kind.as_pointer())

        def lanes(values):
            return ir.Constant(ir.VectorType(i32, len(values)), values)

        def column(v):
            return ir.Constant(i64, v * (width // 2) * itemsize)

        # each sum starts as its row of ``add`` in the even lanes, zeros in the odd ones
        spread = _interleaved(width)
        zeros = ir.Constant(half, [0.0] * (width // 2))
        sums = [[cgutils.alloca_once(builder, whole) for _ in range(n_vectors)] for _ in range(n_rows)]
        for i in range(n_rows):
            for v in range(n_vectors):
                start = builder.load(at(2, i, column(v), half), align=itemsize)
                builder.store(builder.shuffle_vector(start, zeros, spread), sums[i][v])
        pair_everywhere, undefined = lanes([0, 1] * (width // 2)), ir.Constant(two, ir.Undefined)
        with cgutils.for_range(builder, count) as loop:
            b_row = builder.mul(loop.index, row_bytes[1])
            b_pairs = [builder.load(at(1, 0, builder.add(b_row, ir.Constant(i64, v * width * itemsize)),
                                       whole), align=itemsize) for v in range(n_vectors)]
            a_column = builder.mul(loop.index, ir.Constant(i64, 2 * itemsize))
            for i in range(n_rows):
                pair = builder.load(at(0, i, a_column, two), align=itemsize)
                broadcast = builder.shuffle_vector(pair, undefined, pair_everywhere)
                for v in range(n_vectors):
                    total = builder.call(fmuladd, [broadcast, b_pairs[v], builder.load(sums[i][v])])
                    builder.store(total, sums[i][v])
        even, odd = lanes(list(range(0, width, 2))), lanes(list(range(1, width, 2)))
        for i in range(n_rows):
            for v in range(n_vectors):
                total = builder.load(sums[i][v])
                both = builder.fadd(builder.shuffle_vector(total, total, even),
                                    builder.shuffle_vector(total, total, odd))
                builder.store(both, at(3, i, column(v), half), align=itemsize)
        return context.get_dummy_value()

    return signature, codegen


@_inline
def _pair_rows_of(a, pairs, add, out, vectors):
    """Every row of a paired product of ``vectors`` (a literal 1 or 2) vectors of pairs a row
    (:func:`_pair_tile`): blocks of :data:`PAIR_ROWS` rows (:data:`PAIR_WIDE_ROWS` for two
    vectors), then of 4, 2 and 1."""
    m = out.shape[0]
    i = 0
    tile_rows = PAIR_ROWS if vectors == 1 else PAIR_WIDE_ROWS
    while i + tile_rows <= m:
        rows = slice(i, i + tile_rows)
        _pair_tile(a[rows], pairs, add[rows], out[rows], tile_rows, vectors, WIDE_BYTES)
        i += tile_rows
    while i + 4 <= m:
        _pair_tile(a[i:i + 4], pairs, add[i:i + 4], out[i:i + 4], 4, vectors, WIDE_BYTES)
        i += 4
    if i + 2 <= m:
        _pair_tile(a[i:i + 2], pairs, add[i:i + 2], out[i:i + 2], 2, vectors, WIDE_BYTES)
        i += 2
    if i < m:
        _pair_tile(a[i:i + 1], pairs, add[i:i + 1], out[i:i + 1], 1, vectors, WIDE_BYTES)


@_inline
def _pair_blocks(a, pairs, add, out):
    """Every row of a paired product (:func:`_pair_tile`): one vector of pairs a row (a narrow
    vector's worth of columns) or two (a wide vector's worth)."""
    if pairs.shape[1] * pairs.itemsize == WIDE_BYTES:
        _pair_rows_of(a, pairs, add, out, 1)
    else:
        _pair_rows_of(a, pairs, add, out, 2)


@_inline
def _panels(a_rows, b, add_rows, out_rows, rows, a_by_columns):
    """The ``rows`` rows of ``out_rows`` (whose columns are a whole number of
    :data:`VECTOR_BYTES` vectors), one panel of columns after the other, so that these rows of
    ``a`` are read from memory once and then from L1 (``b``, read once per block, stays in
    L2): panels of two wide vectors (:data:`WIDE_BYTES`), then one of one, then, with
    AVX-512, one of a narrow vector for the columns left. ``a_rows`` and ``a_by_columns`` as
    :func:`_tile` takes them."""
    n = out_rows.shape[1]
    width = WIDE_BYTES // out_rows.itemsize
    n0 = 0
    while n0 + 2 * width <= n:
        _tile(a_rows, b[:, n0:n0 + 2 * width], add_rows[:, n0:n0 + 2 * width], out_rows[:, n0:n0 + 2 * width],
              rows, 2, WIDE_BYTES, a_by_columns)
        n0 += 2 * width
    if n0 + width <= n:
        _tile(a_rows, b[:, n0:n0 + width], add_rows[:, n0:n0 + width], out_rows[:, n0:n0 + width], rows, 1,
              WIDE_BYTES, a_by_columns)
        n0 += width
    if WIDE_BYTES > VECTOR_BYTES and n0 < n:
        _tile(a_rows, b[:, n0:n], add_rows[:, n0:n], out_rows[:, n0:n], rows, 1, VECTOR_BYTES, a_by_columns)


@_inline
def _block(a, b, add, out, i, rows):
    """Rows ``i … i + rows − 1`` of ``out`` (:func:`_panels`)."""
    _panels(a[i:i + rows], b, add[i:i + rows], out[i:i + rows], rows, 0)


@_inline
def _blocks(a, b, add, out):
    """Every row: blocks of :data:`ROWS` rows (:data:`NARROW_ROWS` for one vector's worth of
    columns, wide or narrow, and with AVX-512 for any columns), then of 4, 2 and 1 (fewer sums
    in flight, but only for the last few rows).

    With AVX-512's 32 vector registers, twelve rows of a two-vector panel (24 sums, the two
    loaded vectors of ``b`` and a broadcast) fit as well as six do, and each row of ``b``
    loaded serves twice the rows: where ``b``'s panel does not stay in the level-1 cache
    (``K`` of 512 and more) it is read from L2 half as often. One thread, float32: XL's
    backward step ``256 × 2048 × 64`` (half the units) went from 532–556 µs to 420–454 µs,
    its forward one ``1024 × 512 × 64`` from 630–674 to 624–645, L's (``K`` of 256 and 1 024,
    32 columns) within 5 %. The twelve-row tiles were compiled already (for one-vector
    panels): no new code."""
    m, n = out.shape
    i = 0
    if WIDE_BYTES > VECTOR_BYTES or n * out.itemsize == WIDE_BYTES or n * out.itemsize == VECTOR_BYTES:
        while i + NARROW_ROWS <= m:
            _block(a, b, add, out, i, NARROW_ROWS)
            i += NARROW_ROWS
    while i + ROWS <= m:
        _block(a, b, add, out, i, ROWS)
        i += ROWS
    while i + 4 <= m:
        _block(a, b, add, out, i, 4)
        i += 4
    if i + 2 <= m:
        _block(a, b, add, out, i, 2)
        i += 2
    if i < m:
        _block(a, b, add, out, i, 1)


@_inline
def _unit_rows(x):
    return x.size == 0 or x.shape[1] < 2 or x.strides[1] == x.itemsize


@_inline
def _pairs_apply(b):
    """True when products of ``b`` take the paired tile: :data:`PAIRS`, one narrow or one wide
    vector's worth of columns and an even, non-zero number of rows."""
    return (PAIRS and b.shape[1] * b.itemsize in (VECTOR_BYTES, WIDE_BYTES)
            and b.shape[0] > 0 and b.shape[0] % 2 == 0)


@_inline
def paired(b):
    """``b``'s rows interleaved two by two (:func:`_pair_rows`) when its products take the
    paired tile (:func:`_pairs_apply`), else an empty view of ``b``: made once for several
    products of one ``b`` (:func:`paired_product`). Pairing ``h`` (256 × 8 float32) took about
    0.27 µs, its allocation included; the long row's threads each made four gate products of
    it per step."""
    if _pairs_apply(b):
        pairs = np.empty((b.shape[0] // 2, 2 * b.shape[1]), b.dtype)
        _pair_rows(b, pairs, WIDE_BYTES)
        return pairs[:, 0:pairs.shape[1]]
    return b[0:0, 0:b.shape[1]]


@_inline
def product(a, b, add, out):
    """``out = add + a @ b`` for 2-D ``a`` (M, K), ``b`` (K, N), ``add`` and ``out`` (M, N), one
    dtype, all with unit-stride rows; ``out`` may be ``add`` (the same array, not an overlapping
    other view). Inlined: it hands its operands on to :func:`_product` as views of layout 'A',
    so that one kernel per dtype is compiled whatever their layouts (each took about 4 s to
    compile)."""
    _product(a[:, 0:a.shape[1]], b[:, 0:b.shape[1]], add[:, 0:add.shape[1]], out[:, 0:out.shape[1]],
             b[0:0, 0:b.shape[1]])


@_inline
def paired_product(a, b, pairs, add, out):
    """:func:`product` with ``pairs`` = :func:`paired` (``b``), for several products of one
    ``b``."""
    _product(a[:, 0:a.shape[1]], b[:, 0:b.shape[1]], add[:, 0:add.shape[1]], out[:, 0:out.shape[1]],
             pairs[:, 0:pairs.shape[1]])


#: Rows of ``a`` per block of a packed product (:func:`packed_product`): the tile's rows where
#: every panel takes :data:`NARROW_ROWS` (AVX-512), so that the packed blocks are the blocks
#: :func:`product` makes of the same rows.
PACK_ROWS = NARROW_ROWS


def packs(columns: int, dtype: np.dtype) -> bool:
    """True when products with ``columns`` columns of ``b`` take packed rows of ``a``
    (:func:`packed_product`): a whole number of narrow vectors and, where the paired tiles
    apply (:data:`PAIRS`, with AVX-512), not their widths (:func:`paired`). The blocks' rows
    follow the tiles' (:func:`pack_size`)."""
    size = columns * np.dtype(dtype).itemsize
    paired_width = PAIRS and size in (VECTOR_BYTES, WIDE_BYTES)
    return size > 0 and size % VECTOR_BYTES == 0 and not paired_width


@_inline
def pack_rows(a, packed):
    """``packed[p, k, i] = a[R·p + i, k]`` for ``p < packed.shape[0]``, ``R = packed.shape[2]``
    (:data:`PACK_ROWS`, or :data:`COLUMN_ROWS` for the column tile): each block of ``R`` rows of
    ``a`` with its columns one after the other, the block's elements of one column side by
    side."""
    rows = packed.shape[2]
    for p in range(packed.shape[0]):
        for k in range(packed.shape[1]):
            for i in range(rows):
                packed[p, k, i] = a[rows * p + i, k]


@_inline
def packed_product(packed, b, add, out):
    """:func:`product` for the rows of ``a`` packed by :func:`pack_rows`: ``out = add + a @ b``
    on the ``R · packed.shape[0]`` rows of ``add`` and ``out`` (``R`` = ``packed.shape[2]``,
    :data:`PACK_ROWS` or :data:`ROWS`: :func:`pack_size`), for ``b`` whose columns
    :func:`packs`. Each block's tile then reads one run of ``a`` (the block's elements of one
    column after those of the column before) instead of :data:`PACK_ROWS` runs, one a row, and
    makes the same sums in the same order: the same bits as :func:`product`."""
    _packed_product(packed, b[:, 0:b.shape[1]], add[:, 0:add.shape[1]], out[:, 0:out.shape[1]])


@_inline
def packed_rest_product(block, b, add, out):
    """:func:`packed_product` for the ``out.shape[0]`` (fewer than the block's) rows of
    ``a`` packed in the first columns of one block (``block`` (K, R), the rest of its
    columns not read): tiles of 8, 4, 2 and 1 of those rows, each reading its columns of the
    block as the packed tiles do. Where the units of a piece are not a whole number of blocks
    (L's 128 a gate: 10 blocks and 8 rows), these rows as rows of ``a`` took their product at
    about half the speed of the packed ones."""
    rest = out.shape[0]
    i = 0
    if rest - i >= 8:
        _panels(block[:, i:i + 8], b, add[i:i + 8], out[i:i + 8], 8, 1)
        i += 8
    if rest - i >= 4:
        _panels(block[:, i:i + 4], b, add[i:i + 4], out[i:i + 4], 4, 1)
        i += 4
    if rest - i >= 2:
        _panels(block[:, i:i + 2], b, add[i:i + 2], out[i:i + 2], 2, 1)
        i += 2
    if rest - i >= 1:
        _panels(block[:, i:i + 1], b, add[i:i + 1], out[i:i + 1], 1, 1)


@_kernel
def _packed_product(packed, b, add, out):
    """:func:`packed_product`: one branch per block size, the tile's rows a literal."""
    if packed.shape[2] == PACK_ROWS:
        for p in range(packed.shape[0]):
            r0 = p * PACK_ROWS
            _panels(packed[p], b, add[r0:r0 + PACK_ROWS], out[r0:r0 + PACK_ROWS], PACK_ROWS, 1)
    else:
        for p in range(packed.shape[0]):
            r0 = p * ROWS
            _panels(packed[p], b, add[r0:r0 + ROWS], out[r0:r0 + ROWS], ROWS, 1)


#: Rows of ``out`` per block of the column tile (:func:`column_product`): two 64-byte vectors
#: of float32 (the units of a block, side by side in each packed column).
COLUMN_ROWS = 2 * 64 // 4

#: Columns of ``b`` the column tile takes: one narrow vector's worth of float32.
COLUMN_COLUMNS = VECTOR_BYTES // 4


def column_tiles(columns: int, dtype: np.dtype) -> bool:
    """True when products with ``columns`` columns of ``b`` take the column tile
    (:func:`column_product`) on rows packed in blocks of :data:`COLUMN_ROWS`: float32, one
    narrow vector's worth of columns (8 sequences), with AVX-512 (its vectors are 64 bytes),
    where such products take packed rows (:func:`packs`: on a processor without the paired
    tiles, :data:`PAIRS`)."""
    return (np.dtype(dtype) == np.float32 and columns == COLUMN_COLUMNS and WIDE_BYTES > VECTOR_BYTES
            and packs(columns, dtype))


@intrinsic
def _column_tile(typingctx, a, b, add, out, vectors, columns):
    """``out[r, n] = add[r, n] + Σ_k a[k, r]·b[k, n]`` for ``r`` below ``V`` 64-byte vectors' worth
    of rows (``V = vectors``) and ``n < columns`` (both literal integers): the tile with its
    vectors along the rows of ``out`` instead of its columns. ``a`` (K, ≥ V·L) is a packed block
    (:func:`pack_rows`), unit-stride rows; ``b`` (K, columns) with unit-stride rows; ``add`` and
    ``out`` (V·L, columns) with unit-stride rows, any row stride; ``out`` may be ``add``. Each
    step of the walk loads ``V`` vectors of ``a`` (a column of the block) and broadcasts each of
    the ``columns`` scalars of ``b``'s row once for all ``V`` of them: ``V · columns`` fused
    multiply-adds for ``V + columns`` loads, where the tile of :func:`_tile` takes a broadcast
    for every one on one vector's worth of columns. The sums start from zero; at the end each
    row of ``out`` is gathered from lane ``r`` of the ``columns`` sums and added to its row of
    ``add``."""
    if not _tile_types((vectors, columns), (a, b, add, out)):
        return None
    n_vectors, n_columns = vectors.literal_value, columns.literal_value
    signature = types.void(a, b, add, out, vectors, columns)

    def codegen(context, builder, sig, args):
        dtype = sig.args[0].dtype
        scalar = context.get_value_type(dtype)
        itemsize = dtype.bitwidth // 8
        width = 64 // itemsize
        vector, row_vector = ir.VectorType(scalar, width), ir.VectorType(scalar, n_columns)
        i64, i32 = ir.IntType(64), ir.IntType(32)
        structs, data, row_bytes = _operands(context, builder, sig, args, 4)
        size_k = cgutils.unpack_tuple(builder, structs[0].shape, 2)[0]
        fmuladd = _fmuladd(builder, vector, dtype)

        def at(which, offset, kind):
            return builder.bitcast(builder.gep(data[which], [offset]), kind.as_pointer())

        zero = ir.Constant(vector, [0.0] * width)
        sums = [[cgutils.alloca_once_value(builder, zero) for _ in range(n_vectors)]
                for _ in range(n_columns)]
        undefined = ir.Constant(vector, ir.Undefined)
        everywhere = ir.Constant(ir.VectorType(i32, width), [0] * width)
        with cgutils.for_range(builder, size_k) as loop:
            a_row = builder.mul(loop.index, row_bytes[0])
            b_row = builder.mul(loop.index, row_bytes[1])
            a_vectors = [builder.load(at(0, builder.add(a_row, ir.Constant(i64, v * 64)), vector),
                                      align=itemsize) for v in range(n_vectors)]
            for n in range(n_columns):
                value = builder.load(at(1, builder.add(b_row, ir.Constant(i64, n * itemsize)), scalar),
                                     align=itemsize)
                broadcast = builder.shuffle_vector(
                    builder.insert_element(undefined, value, ir.Constant(i32, 0)), undefined, everywhere)
                for v in range(n_vectors):
                    total = builder.call(fmuladd, [a_vectors[v], broadcast, builder.load(sums[n][v])])
                    builder.store(total, sums[n][v])
        for v in range(n_vectors):
            totals = [builder.load(sums[n][v]) for n in range(n_columns)]
            for i in range(width):
                row = ir.Constant(row_vector, ir.Undefined)
                for n in range(n_columns):
                    lane = builder.extract_element(totals[n], ir.Constant(i32, i))
                    row = builder.insert_element(row, lane, ir.Constant(i32, n))
                offset = ir.Constant(i64, v * width + i)
                start = builder.load(at(2, builder.mul(row_bytes[2], offset), row_vector), align=itemsize)
                builder.store(builder.fadd(start, row), at(3, builder.mul(row_bytes[3], offset), row_vector),
                              align=itemsize)
        return context.get_dummy_value()

    return signature, codegen


@_inline
def column_product(packed, b, add, out):
    """``out = add + a @ b`` on the ``out.shape[0]`` rows of ``a`` packed in blocks of
    :data:`COLUMN_ROWS` (:func:`pack_rows`; ``packed`` (B, K, COLUMN_ROWS), the last block's
    rows past ``out.shape[0]`` not read into ``out``), for ``b`` of :data:`COLUMN_COLUMNS`
    columns (:func:`column_tiles`), with the column tile (:func:`_column_tile`). A last block of
    fewer rows is made whole into scratch, then its rows are added to ``add``'s as the whole
    blocks' are. The long row's step (``[U W] [h; x]``, 4 gates of 128 units a thread, ``K`` =
    512, 8 sequences), two threads, float32, on an AMD EPYC (Zen 4) guest: 39–41 µs against
    51–54 for the twelve-row packed tile (:func:`packed_product`), 204–215 GFLOP/s."""
    _column_product(packed, b[:, 0:b.shape[1]], add[:, 0:add.shape[1]], out[:, 0:out.shape[1]])


@_kernel
def _column_product(packed, b, add, out):
    """:func:`column_product`."""
    m = out.shape[0]
    if out.itemsize != 4 or b.shape[1] != COLUMN_COLUMNS or packed.shape[2] != COLUMN_ROWS or (
            packed.shape[0] * COLUMN_ROWS < m):
        raise ValueError("column_product: float32, b of COLUMN_COLUMNS columns, blocks of COLUMN_ROWS rows")
    if m == 0:
        return
    if not (_unit_rows(packed[0]) and _unit_rows(b) and _unit_rows(add) and _unit_rows(out)):
        raise ValueError("column_product: every operand needs unit-stride rows")
    rest = np.empty((COLUMN_ROWS, COLUMN_COLUMNS), out.dtype)
    for p in range(-(-m // COLUMN_ROWS)):
        r0 = p * COLUMN_ROWS
        if r0 + COLUMN_ROWS <= m:
            _column_tile(packed[p], b, add[r0:r0 + COLUMN_ROWS], out[r0:r0 + COLUMN_ROWS], 2, COLUMN_COLUMNS)
        else:
            rest[:, :] = 0.0
            _column_tile(packed[p], b, rest, rest, 2, COLUMN_COLUMNS)
            for r in range(r0, m):
                for n in range(COLUMN_COLUMNS):
                    out[r, n] = add[r, n] + rest[r - r0, n]


@_inline
def _whole_vectors(b, add, out):
    """``b``, ``add`` and ``out`` as the tiles take them: themselves when N is a whole number of
    :data:`VECTOR_BYTES` vectors, else copies of ``b`` and ``add`` padded with zero columns to
    the next one (the third a view of the second, for :func:`_unpad`)."""
    m, n = out.shape
    width = VECTOR_BYTES // out.itemsize
    if n % width == 0:
        return b, add, out
    size_k = b.shape[0]
    wide = n + width - n % width
    b_wide = np.zeros((size_k, wide), out.dtype)
    out_wide = np.zeros((m, wide), out.dtype)
    for k in range(size_k):
        for j in range(n):
            b_wide[k, j] = b[k, j]
    for i in range(m):
        for j in range(n):
            out_wide[i, j] = add[i, j]
    return b_wide[:, 0:wide], out_wide[:, 0:wide], out_wide[:, 0:wide]


@_inline
def _unpad(out, out_cols):
    """``out`` from the padded ``out_cols`` :func:`_whole_vectors` made (nothing when it made
    none)."""
    m, n = out.shape
    if n % (VECTOR_BYTES // out.itemsize):
        for i in range(m):
            for j in range(n):
                out[i, j] = out_cols[i, j]


@_kernel
def _product(a, b, add, out, pairs):
    """:func:`product` (:func:`_blocks`). Where the paired tile applies (:func:`_pairs_apply`):
    :func:`_pair_blocks` on ``pairs``, or on pairs made here when ``pairs`` is empty. When N
    is not a whole number of vectors, on copies of ``b`` and ``add`` padded with zero columns
    to the next one (:func:`_whole_vectors`)."""
    m, n = out.shape
    if not (_unit_rows(a) and _unit_rows(b) and _unit_rows(add) and _unit_rows(out)):
        raise ValueError("product: every operand needs unit-stride rows")
    if m == 0 or n == 0:
        return
    size_k = a.shape[1]
    if size_k == 0:
        for i in range(m):
            for j in range(n):
                out[i, j] = add[i, j]
        return
    if _pairs_apply(b):
        _pair_blocks(a, pairs if pairs.shape[0] else paired(b), add, out)
        return
    b_cols, add_cols, out_cols = _whole_vectors(b, add, out)  # one call of _blocks: each compiles a loop
    _blocks(a, b_cols, add_cols, out_cols)
    _unpad(out, out_cols)


#: Rows of ``out`` per tile of :func:`transposed_product`: twelve with AVX-512 (as the packed
#: tiles), else :data:`ROWS`.
TRANSPOSED_ROWS = NARROW_ROWS if WIDE_BYTES > VECTOR_BYTES else ROWS


@_inline
def transposed_product(a_t, b, add, out):
    """``out = add + a_tᵀ @ b`` for ``a_t`` (K, M), ``b`` (K, N), ``add`` and ``out`` (M, N), one
    dtype, all with unit-stride rows; ``out`` may be ``add``. The tiles read ``a_t`` as they
    read packed rows (a block's elements of one ``k`` side by side), so a product whose left
    operand is stored transposed needs no transposed copy. The backward's input gradient
    ``dzᵀ W`` of L's chunk (``dz`` 1 024 × 512 columns a thread, ``W`` 1 024 × 256, float32,
    AVX-512) took 1.08 ms a thread this way against 1.29 for ``(Wᵀ dz)ᵀ`` made with
    :func:`product` into scratch and copied: 249 GFLOP/s, a core's peak."""
    _transposed_product(a_t[:, 0:a_t.shape[1]], b[:, 0:b.shape[1]], add[:, 0:add.shape[1]],
                        out[:, 0:out.shape[1]])


@_kernel
def _transposed_product(a_t, b, add, out):
    """:func:`transposed_product`: blocks of :data:`TRANSPOSED_ROWS` rows of ``out``, then the
    rows left as :func:`packed_rest_product` makes them."""
    m, n = out.shape
    if not (_unit_rows(a_t) and _unit_rows(b) and _unit_rows(add) and _unit_rows(out)):
        raise ValueError("transposed_product: every operand needs unit-stride rows")
    if m == 0 or n == 0:
        return
    if a_t.shape[0] == 0:
        for i in range(m):
            for j in range(n):
                out[i, j] = add[i, j]
        return
    b_cols, add_cols, out_cols = _whole_vectors(b, add, out)
    i = 0
    while i + TRANSPOSED_ROWS <= m:
        _panels(a_t[:, i:i + TRANSPOSED_ROWS], b_cols, add_cols[i:i + TRANSPOSED_ROWS],
                out_cols[i:i + TRANSPOSED_ROWS], TRANSPOSED_ROWS, 1)
        i += TRANSPOSED_ROWS
    if i < m:
        packed_rest_product(a_t[:, i:m], b_cols, add_cols[i:m], out_cols[i:m])
    _unpad(out, out_cols)


#: Vectors per tile of a one-row product (:func:`row_product`): eight sums in flight, as many
#: as a core's two fused multiply-adds a cycle, over their latency, keep busy.
ROW_VECTORS = 8

#: Vectors per tile of four or two rows (:func:`row_product` for a few rows), and of one row
#: after its tiles of :data:`ROW_VECTORS`: sixteen sums of four rows with AVX-512's 32
#: registers, eight with AVX2's 16.
ROWS_VECTORS = 4 if WIDE_BYTES == 64 else 2


@_inline
def _row_tiles(a, b, out, rows, vectors, n0, whole):
    """``out[:, n0:n1] += a @ b[:, n0:n1]`` by tiles of ``rows`` rows and ``vectors`` vectors
    (both literal; :data:`WIDE_BYTES`) as many as fit before column ``whole``; returns ``n1``."""
    width = WIDE_BYTES // out.itemsize
    while n0 + vectors * width <= whole:
        _tile(a, b[:, n0:n0 + vectors * width], out[:, n0:n0 + vectors * width],
              out[:, n0:n0 + vectors * width], rows, vectors, WIDE_BYTES, 0)
        n0 += vectors * width
    return n0


@_inline
def row_product(a, b, out):
    """``out = a @ b`` for one row or a few: ``a`` (M, K), ``b`` (K, N) and ``out`` (M, N),
    unit-stride rows (``a`` any strides): four rows at a time, then two, then one, each by
    tiles of :data:`ROWS_VECTORS` vectors, one row first by tiles of :data:`ROW_VECTORS`
    (:func:`_row_tiles`), then of one vector; the columns left after the whole vectors one
    by one; ``out`` is overwritten. A step's product for fewer sequences than a vector holds,
    their states as the rows of ``a``: a tile of a few rows keeps its sums in registers along
    the row, where the tiles of :func:`product`, whose vectors run along the sequences, would
    fill a fraction of each vector."""
    m, n = out.shape
    for i in range(m):
        for j in range(n):
            out[i, j] = 0.0
    add_row_product(a, b, out)


@_inline
def add_row_product(a, b, out):
    """``out += a @ b`` by the tiles of :func:`row_product` (which is this on zeros): a step
    that adds its product to what ``out`` holds already (one sequence's projection,
    :func:`~._lstm_forward._recur_one`) makes no pass of its own to add it."""
    m, n = out.shape
    whole = n - n % (WIDE_BYTES // out.itemsize)
    i0 = 0
    while i0 + 4 <= m:
        a4, out4 = a[i0:i0 + 4], out[i0:i0 + 4]
        _row_tiles(a4, b, out4, 4, 1, _row_tiles(a4, b, out4, 4, ROWS_VECTORS, 0, whole), whole)
        i0 += 4
    if i0 + 2 <= m:
        a2, out2 = a[i0:i0 + 2], out[i0:i0 + 2]
        _row_tiles(a2, b, out2, 2, 1, _row_tiles(a2, b, out2, 2, ROWS_VECTORS, 0, whole), whole)
        i0 += 2
    if i0 < m:
        a1, out1 = a[i0:i0 + 1], out[i0:i0 + 1]
        n0 = _row_tiles(a1, b, out1, 1, ROW_VECTORS, 0, whole)
        _row_tiles(a1, b, out1, 1, 1, _row_tiles(a1, b, out1, 1, ROWS_VECTORS, n0, whole), whole)
    for i in range(m):
        for j in range(whole, n):
            total = out[i, j]
            for k in range(a.shape[1]):
                total += a[i, k] * b[k, j]
            out[i, j] = total


def pack_size(columns: int, dtype: np.dtype) -> int:
    """Rows a block of packed rows holds for products with ``columns`` columns of ``b``
    (:func:`packs`), those of the tile that takes the block: :data:`COLUMN_ROWS` for the
    column tile (:func:`column_tiles`); :data:`PACK_ROWS` (twelve) with AVX-512, whose every
    panel takes twelve-row tiles, and for one vector's worth of columns; :data:`ROWS` (six)
    for more without AVX-512, whose 16 vector registers hold six rows of a two-vector panel."""
    if column_tiles(columns, dtype):
        return COLUMN_ROWS
    if WIDE_BYTES == VECTOR_BYTES and columns * np.dtype(dtype).itemsize != VECTOR_BYTES:
        return ROWS
    return PACK_ROWS

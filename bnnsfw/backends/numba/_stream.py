"""Compiled passes that write their output past the caches: a normalization's last pass.

A normalization's last pass writes an output as large as its input. When the arrays are larger
than the last-level cache, an ordinary store first reads each line of the output from memory
(to own it) and later writes it back: three transfers for each two the data needs. A
non-temporal store writes a whole line without reading it. Numba does not emit such stores,
so the passes are Numba intrinsics written in LLVM's vector types (:func:`_runs`: a scalar
head up to the output's first aligned line, whole lines, a scalar tail), with the stores
marked ``!nontemporal``; LLVM makes them ``vmovntps`` (x86) or keeps ordinary stores on a
machine without such an instruction. The kernels end their passes with a store fence
(:func:`store_fence`: ``sfence`` on x86), so that the stores are visible to any thread that
reads the output after them. Two formulas take this form: :func:`affine` (``a·u + b·(v −
centre) + shift``, scalars per run: instance and group norm, and :func:`stream_copy`) and
:func:`normalized_row` / :func:`normalized_row_backward` (layer norm's rows, with a ``gamma``
and a ``beta`` per column). Instance and group norm keep plain loops for passes that are not
streamed: calling :func:`affine` for every run there made a (64, 512, 1, 1) group norm, runs
of one element, 1.1–1.2× slower. Layer norm's rows take the intrinsic either way (ordinary
stores when not streamed), so that its formula is written once.

Measured on the benchmark's group norm (32, 64, 32, 32), 8 groups, two threads: the output
passes, with their reads, took about 60 % of a training step (0.39 of 0.64 ms forward, 0.69
of 1.07 backward, timed by leaving the writes out).

:func:`prefetch` is the other direction: a hint that asks for a line ahead of a read, which
the LSTM's shared-out forward steps give for the projection columns of the step after them.
"""

from __future__ import annotations

import platform

import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import _cache

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry

__all__ = ["LINE_BYTES", "STREAM_MIN", "affine", "normalized_row", "normalized_row_backward", "prefetch",
           "stream_copy", "store_fence"]

#: Bytes per vector store: one cache line, so each store fills a line of the write-combining
#: buffer at once (two 32-byte stores where vectors are 32 bytes wide).
LINE_BYTES = 64

#: Shortest run written past the caches: four lines of float32. A shorter run is mostly the
#: scalar head and tail, and a row of runs of one element (a (64, 512, 1, 1) group norm)
#: ran 1.4× slower streamed.
STREAM_MIN = 64

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


#: The fast-math flag of the passes' arithmetic. Numba gives its kernels' fast-math flags to
#: every float instruction that has none (``numba.core.fastmathpass``), the instructions of an
#: inlined intrinsic included; with them LLVM may reassociate or fuse the scalar head and tail
#: otherwise than the vector lines, and an element's bits then depend on where the output
#: starts in memory (seen with Numba 0.59 compiling for a generic CPU: layer norm's ``dx`` one
#: ulp apart from call to call). ``afn`` (approximate functions) changes nothing for an add, a
#: subtraction or a multiplication, so the formulas are computed as written, alike in every
#: lane.
_AS_WRITTEN = ("afn",)


def _add(builder, a, b):
    return builder.fadd(a, b, flags=_AS_WRITTEN)


def _sub(builder, a, b):
    return builder.fsub(a, b, flags=_AS_WRITTEN)


def _mul(builder, a, b):
    return builder.fmul(a, b, flags=_AS_WRITTEN)


def _runs(context, builder, dtype, data, count, scalars, formula, stream):
    """Emit ``data[-1][i] = formula(load, scalars)`` for ``i < count``: scalar elements up to
    the first aligned line of the output (the last of ``data``), whole lines as vectors, then
    scalar elements. ``load(k)`` reads element ``i`` (or the line at ``i``) of ``data[k]``;
    the lines are stored ``!nontemporal`` when ``stream``."""
    scalar = context.get_value_type(dtype)
    itemsize = dtype.bitwidth // 8
    width = LINE_BYTES // itemsize
    vector = ir.VectorType(scalar, width)
    i64 = ir.IntType(64)
    out = data[-1]

    def splat(value):
        undefined = ir.Constant(vector, ir.Undefined)
        one = builder.insert_element(undefined, value, ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(one, undefined, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                                  [0] * width))

    def scalar_run(start, stop):
        with cgutils.for_range_slice(builder, start, stop, ir.Constant(i64, 1)) as (i, _):
            total = formula(lambda k: builder.load(builder.gep(data[k], [i])), scalars)
            builder.store(total, builder.gep(out, [i]))

    address = builder.ptrtoint(out, i64)
    misalignment = builder.and_(builder.neg(address), ir.Constant(i64, LINE_BYTES - 1))
    head = builder.udiv(misalignment, ir.Constant(i64, itemsize))
    head = builder.select(builder.icmp_signed("<", head, count), head, count)
    lines = builder.sdiv(builder.sub(count, head), ir.Constant(i64, width))
    body_end = builder.add(head, builder.mul(lines, ir.Constant(i64, width)))
    scalar_run(ir.Constant(i64, 0), head)
    splats = [splat(value) for value in scalars]
    nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
    with cgutils.for_range_slice(builder, head, body_end, ir.Constant(i64, width)) as (i, _):
        def load(k):
            pointer = builder.bitcast(builder.gep(data[k], [i]), vector.as_pointer())
            return builder.load(pointer, align=itemsize)

        target = builder.bitcast(builder.gep(out, [i]), vector.as_pointer())
        store = builder.store(formula(load, splats), target, align=LINE_BYTES)
        if stream:
            store.set_metadata("nontemporal", nontemporal)
    scalar_run(body_end, count)


def _float_runs(arrays, scalars):
    """The one float dtype of 1-D ``arrays`` and ``scalars``, or None."""
    if not all(isinstance(t, types.Array) and t.ndim == 1 for t in arrays):
        return None
    dtype = arrays[-1].dtype
    if dtype not in (types.float32, types.float64) or any(t.dtype != dtype for t in arrays):
        return None
    if any(s != dtype for s in scalars):
        return None
    return dtype


def _pointers(context, builder, array_types, values):
    """The data pointers of 1-D arrays, and the last one's length."""
    structs = [context.make_array(t)(context, builder, x) for t, x in zip(array_types, values)]
    return [s.data for s in structs], cgutils.unpack_tuple(builder, structs[-1].shape, 1)[0]


@intrinsic
def _affine(typingctx, u, v, out, a, b, centre, shift, with_u):
    """``out[i] = a·u[i] + b·(v[i] − centre) + shift`` (``a·u[i]`` left out unless ``with_u``,
    a literal boolean) over 1-D unit-stride runs of one float dtype, ``u`` and ``v`` at least
    as long as ``out``. Scalar elements up to the first aligned line of ``out``, then whole
    lines with non-temporal stores, then scalar elements. The caller ends its passes with
    :func:`store_fence`."""
    if not isinstance(with_u, types.BooleanLiteral):
        return None
    dtype = _float_runs((u, v, out), (a, b, centre, shift))
    if dtype is None:
        return None
    use_u = with_u.literal_value

    def codegen(context, builder, sig, args):
        def formula(load, scalars):
            a_value, b_value, centre_value, shift_value = scalars
            total = _add(builder, _mul(builder, b_value, _sub(builder, load(1), centre_value)), shift_value)
            if use_u:
                total = _add(builder, _mul(builder, a_value, load(0)), total)
            return total

        data, count = _pointers(context, builder, sig.args[:3], args[:3])
        _runs(context, builder, dtype, data, count, args[3:7], formula, True)
        return context.get_dummy_value()

    return types.void(u, v, out, a, b, centre, shift, with_u), codegen


@intrinsic
def _normalized(typingctx, x, dy, gamma, beta, out, mean, rstd, a, c, backward, stream):
    """Layer norm's last pass over one row, ``x̂ = (x − mean)·rstd`` per element: forward
    (``backward`` False) ``out = x̂·gamma + beta``, backward ``out = rstd·(gamma·dy − a −
    x̂·c)`` (``beta``, and forward ``dy``, ``a`` and ``c``, not read). 1-D unit-stride runs of
    one float dtype at least as long as ``out``, as in :func:`_affine`; ``backward`` and
    ``stream`` (non-temporal stores, else ordinary ones) literal booleans."""
    if not (isinstance(backward, types.BooleanLiteral) and isinstance(stream, types.BooleanLiteral)):
        return None
    arrays = (x, dy, gamma, beta, out)
    dtype = _float_runs(arrays, (mean, rstd, a, c))
    if dtype is None or any(t.layout != "C" for t in arrays):
        return None
    is_backward = backward.literal_value

    def codegen(context, builder, sig, args):
        def formula(load, scalars):
            mean_value, rstd_value, a_value, c_value = scalars
            xhat = _mul(builder, _sub(builder, load(0), mean_value), rstd_value)
            if not is_backward:
                return _add(builder, _mul(builder, xhat, load(2)), load(3))
            total = _sub(builder, _mul(builder, load(2), load(1)), a_value)
            return _mul(builder, rstd_value, _sub(builder, total, _mul(builder, xhat, c_value)))

        data, count = _pointers(context, builder, sig.args[:5], args[:5])
        _runs(context, builder, dtype, data, count, args[5:9], formula, stream.literal_value)
        return context.get_dummy_value()

    return types.void(x, dy, gamma, beta, out, mean, rstd, a, c, backward, stream), codegen


@intrinsic
def store_fence(typingctx):
    """Orders the non-temporal stores before it with every store after it (``sfence`` on x86,
    where an ordinary fence may not order them; a full fence elsewhere)."""
    def codegen(context, builder, sig, args):
        if _X86:
            sfence = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                    "llvm.x86.sse.sfence")
            builder.call(sfence, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def prefetch(typingctx, flat, index):
    """Ask for the cache line holding ``flat[index]`` (a 1-D array, an integer index that the
    caller keeps inside it) to be brought into the level-2 cache, ahead of a read (LLVM's
    ``llvm.prefetch``: ``prefetcht1`` on x86; nothing where the machine has no such hint). It
    reads nothing and cannot fault."""
    if not (isinstance(flat, types.Array) and flat.ndim == 1 and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        where = builder.gep(array.data, [context.cast(builder, args[1], sig.args[1], types.int64)])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        hint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
        read, level_two, data = (ir.Constant(i32, value) for value in (0, 2, 1))
        builder.call(hint, [builder.bitcast(where, i8p), read, level_two, data])
        return context.get_dummy_value()

    return types.void(flat, index), codegen


@numba.njit(nogil=True, cache=True, inline="always")
def affine(u, v, out, a, b, centre, shift, with_u):
    """``out = a·u + b·(v − centre) + shift`` over 1-D runs of equal length (``with_u`` a literal
    boolean: without it, ``u`` and ``a`` are not read), in ``out``'s dtype; stored past the
    caches (:func:`_affine`; the caller ends with :func:`store_fence`) when the runs are
    unit-stride and at least :data:`STREAM_MIN` elements long, by a plain loop else."""
    kind = out.dtype.type
    a, b, centre, shift = kind(a), kind(b), kind(centre), kind(shift)
    size = out.itemsize
    if (out.size >= STREAM_MIN and out.strides[0] == size and v.strides[0] == size
            and (u.strides[0] == size or not with_u)):
        _affine(u, v, out, a, b, centre, shift, with_u)
    elif with_u:
        for i in range(out.size):
            out[i] = a * u[i] + b * (v[i] - centre) + shift
    else:
        for i in range(out.size):
            out[i] = b * (v[i] - centre) + shift


@numba.njit(nogil=True, cache=True, inline="always")
def stream_copy(source, out):
    """``out[:] = source[:len(out)]`` for 1-D unit-stride runs of one float dtype, stored past
    the caches whatever the length (:func:`_affine`; scalar stores for the elements before
    the first line of ``out`` that starts in it and after the last it ends). For short runs of
    whole lines in an array the caches do not hold; the caller ends with :func:`store_fence`.
    Bit for bit: ``1·(v − 0) + (−0)`` is ``v`` for every ``v``, −0 included."""
    kind = out.dtype.type
    _affine(source, source, out, kind(0.0), kind(1.0), kind(0.0), kind(-0.0), False)


@numba.njit(nogil=True, cache=True, inline="always")
def normalized_row(x, gamma, beta, out, mean, rstd, stream):
    """``out = (x − mean)·rstd·gamma + beta`` over contiguous 1-D runs (layer norm's forward
    row; :func:`_normalized`), stored past the caches when ``stream`` (the caller then ends
    with :func:`store_fence`)."""
    kind = out.dtype.type
    mean, rstd, zero = kind(mean), kind(rstd), kind(0.0)
    if stream:
        _normalized(x, x, gamma, beta, out, mean, rstd, zero, zero, False, True)
    else:
        _normalized(x, x, gamma, beta, out, mean, rstd, zero, zero, False, False)


@numba.njit(nogil=True, cache=True, inline="always")
def normalized_row_backward(x, dy, gamma, out, mean, rstd, a, c, stream):
    """``out = rstd·(gamma·dy − a − (x − mean)·rstd·c)`` over contiguous 1-D runs (layer norm's
    ``dx`` row; :func:`_normalized`), stored past the caches when ``stream``."""
    kind = out.dtype.type
    mean, rstd, a, c = kind(mean), kind(rstd), kind(a), kind(c)
    if stream:
        _normalized(x, dy, gamma, gamma, out, mean, rstd, a, c, True, True)
    else:
        _normalized(x, dy, gamma, gamma, out, mean, rstd, a, c, True, False)

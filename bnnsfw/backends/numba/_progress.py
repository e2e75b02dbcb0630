"""Counters compiled loops advance and wait on, across threads.

The threads that share out each step of one layer (:func:`._lstm_forward._steps_threads`)
:func:`claim` its pieces and :func:`count_up` the pieces done, and each :func:`wait_for`\\ s
the count of the step before; in the overlapped backward (:func:`._lstm_backward._backward_overlapped`)
one thread counts the pieces it has walked and the other waits for them.

Numba has no atomic operations on arrays, and a plain store or load may be moved or kept in a
register by the compiler (and reordered by the processor outside x86), so these are Numba
intrinsics: a load with *acquire* ordering (nothing after it is read before it), in a loop that
waits with the processor's spin hint (``pause`` on x86), and atomic read-modify-write
operations (an exchange, an increment) with acquire and release ordering (every write before
them is visible to a thread that sees the new count).
"""

from __future__ import annotations

import platform

import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import _cache

_cache.install()  # before any kernel: their cache entries' stamps cover the sources they carry

__all__ = ["claim", "count_up", "wait_for"]

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def _counter_pointer(context, builder, array_type, array):
    """The address of element 0 of a 1-D int64 array."""
    return context.make_array(array_type)(context, builder, array).data


def _is_counter(counter) -> bool:
    return isinstance(counter, types.Array) and counter.ndim == 1 and counter.dtype == types.int64


@intrinsic
def count_up(typingctx, counter):
    """``counter[0] += 1`` as one atomic operation with acquire and release ordering: every
    thread's increments count, and the writes before each are visible to a thread that sees
    the new value with :func:`wait_for`."""
    if not _is_counter(counter):
        return None

    def codegen(context, builder, sig, args):
        pointer = _counter_pointer(context, builder, sig.args[0], args[0])
        builder.atomic_rmw("add", pointer, ir.Constant(ir.IntType(64), 1), "acq_rel")
        return context.get_dummy_value()

    return types.void(counter), codegen


@intrinsic
def claim(typingctx, flags, index):
    """True for the one thread whose call first sets ``flags[index]`` (from 0 to 1, one atomic
    exchange): pieces of work that whichever thread comes first takes."""
    if not _is_counter(flags) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        base = _counter_pointer(context, builder, sig.args[0], args[0])
        offset = context.cast(builder, args[1], sig.args[1], types.intp)
        pointer = builder.gep(base, [offset])
        before = builder.atomic_rmw("xchg", pointer, ir.Constant(ir.IntType(64), 1), "acq_rel")
        return builder.icmp_signed("==", before, ir.Constant(ir.IntType(64), 0))

    return types.boolean(flags, index), codegen


@intrinsic
def _load_acquire(typingctx, counter):
    """``counter[0]`` with acquire ordering."""
    if not _is_counter(counter):
        return None

    def codegen(context, builder, sig, args):
        pointer = _counter_pointer(context, builder, sig.args[0], args[0])
        return builder.load_atomic(pointer, "acquire", 8)

    return types.int64(counter), codegen


@intrinsic
def _spin_hint(typingctx):
    """The processor's hint for a waiting loop (``pause`` on x86, nothing elsewhere)."""
    def codegen(context, builder, sig, args):
        if _X86:
            pause = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                   "llvm.x86.sse2.pause")
            builder.call(pause, [])
        return context.get_dummy_value()

    return types.void(), codegen


@numba.njit(nogil=True, cache=True)
def wait_for(counter, value):
    """Return once ``counter[0]`` is at least ``value`` (spinning: the waits this serves last
    a few steps of an LSTM layer, microseconds)."""
    while _load_acquire(counter) < value:
        _spin_hint()

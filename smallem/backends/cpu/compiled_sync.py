"""The synchronization the CPU pool's compiled loop is built from (compiled_team.py, beside it):
atomic loads, stores and adds on int64 arrays (sequentially consistent), x86's PAUSE for a spin,
an array's address and a float32 pointer back from one, and Linux's futex through libc's
syscall(): a helper past its spin sleeps in the kernel inside the compiled loop, without the GIL.
numba has no atomics of its own: each is an intrinsic writing the LLVM instruction.
"""

from __future__ import annotations

import ctypes
import platform
import sys

import llvmlite.binding as llvm
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .compiled_linear import EXACT  # compiled_cache first: numba's cache keyed on every compiled*.py


@intrinsic
def _load(typingctx, arr, i):
    """arr[i], an atomic (sequentially consistent) load."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(cgutils.gep(builder, ary.data, args[1]), "seq_cst", 8)
    return types.int64(arr, i), codegen


@intrinsic
def _store(typingctx, arr, i, value):
    """arr[i] = value, an atomic (sequentially consistent) store."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        value = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.store_atomic(value, cgutils.gep(builder, ary.data, args[1]), "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(arr, i, value), codegen


@intrinsic
def _add(typingctx, arr, i, value):
    """arr[i] += value atomically; the value before."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        value = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", cgutils.gep(builder, ary.data, args[1]), value, "seq_cst")
    return types.int64(arr, i, value), codegen


@intrinsic
def _relax(typingctx):
    """A spin loop's pause (x86's PAUSE; elsewhere nothing): the core's sibling thread and its
    power are spared while the loop waits."""
    def codegen(context, builder, signature, args):
        if "x86_64" in builder.module.triple:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _address(typingctx, arr):
    """An array's first element's address."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, ir.IntType(64))
    return types.int64(arr), codegen


@intrinsic
def _floats(typingctx, address):
    """The float32 pointer at an address _address gave."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.FloatType()))
    return types.CPointer(types.float32)(address), codegen


# Linux's futex through libc's syscall(): a helper past its spin sleeps in the kernel inside the
# compiled loop, without the GIL, until its word changes (FUTEX_WAIT returns at once if it already
# has: no wake-up is lost). Elsewhere SLEEPS is False and a helper returns to its queue.
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine()) if sys.platform == "linux" else None
FUTEX_WAIT, FUTEX_WAKE = 128, 129  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE
SLEEPS = False
if SYS_FUTEX is not None:
    try:
        _libc_syscall = ctypes.CDLL(None).syscall
    except (OSError, AttributeError):
        pass
    else:
        llvm.add_symbol("smallem_syscall", ctypes.cast(_libc_syscall, ctypes.c_void_p).value)
        _I64 = types.int64
        _syscall = types.ExternalFunction("smallem_syscall", _I64(_I64, _I64, _I64, _I64, _I64, _I64, _I64))
        SLEEPS = True

if SLEEPS:
    @numba.njit(**EXACT)
    def _wait(state, i, value):
        """Sleep while state[i]'s low 32 bits (the futex's word) still hold `value`."""
        _syscall(SYS_FUTEX, _address(state) + 8 * i, FUTEX_WAIT, value & 0xFFFFFFFF, 0, 0, 0)

    @numba.njit(**EXACT)
    def _wake(state, i):
        """state[i] moved on, and the one sleeper on it woken."""
        _add(state, i, 1)
        _syscall(SYS_FUTEX, _address(state) + 8 * i, FUTEX_WAKE, 1, 0, 0, 0)
else:
    @numba.njit(**EXACT)
    def _wait(state, i, value):
        pass

    @numba.njit(**EXACT)
    def _wake(state, i):
        _add(state, i, 1)

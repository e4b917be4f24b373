"""The pool's jobs beyond the Linears (issue 38, round 11): the fused attention's compiled blocks
(compiled_attention.py's forward and rule), GELU's and LayerNorm's (compiled_kernels.py) taken by
compiled_team.py's helpers inside their loop, without the GIL, where team.run hands each block to
a Python call that takes it twice.

A job is published as int64 values (compiled_team.publish_job): the full (B, H, T, D) shape,
each array's address and strides (the heads are strided views, nothing is copied), the scale's
address, the causal flag, the BLAS rows and leads; a piece is a slice a:z of the batch, the same
slices attention.py's _each cuts, each one the same call on the same views: team.run's bits.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from . import compiled_attention, compiled_kernels, compiled_passes
from .compiled_linear import EXACT

# values: the shape, then the scale's address, causal, rows, the 8 leads, then 5 an array
B_, H_, T_, D_, SCALE, CAUSAL, ROWS = range(7)
LEADS = 7
VIEWS = LEADS + 8
Q, K, V, GRAD, OUT, LSE, DQ, DK, DV = range(9)  # the arrays, in that order
SIZE = VIEWS + 5 * 9
FORWARD, RULE = 0, 1  # a piece's kind, as compiled_team passes it
# a rows job's values: rows, width, eps's address, backward, then up to 5 arrays' addresses
N_, C_, EPS, BACK, ARRAYS = range(5)
# its kinds, as compiled_team passes them (the cross-entropy's rule since round 14: round 11 had
# found its fastmath kernel, compiled inside the pool's loop, an ulp off team.run's in 125 of 2,590
# elements, the linked copy _own_code now keeps from running)
GELU, GELU_RULE, LAYER_NORM, LAYER_NORM_RULE, CROSS_ENTROPY, ADAMW, CROSS_ENTROPY_RULE = range(7)
ADAMW_SCALARS = 8  # compiled_passes.adamw's float32 scalars, a piece's row


@intrinsic
def _view4(typingctx, address, shape, strides):
    """A float32 (4-D, any layout) view of memory at `address` with these shape and strides (in
    bytes): a strided array rebuilt from what the caller published, owning nothing."""
    array = types.Array(types.float32, 4, "A")

    def codegen(context, builder, signature, args):
        ary = context.make_array(array)(context, builder)
        data = builder.inttoptr(args[0], context.get_data_type(types.float32).as_pointer())
        populate_array(ary, data=data, shape=cgutils.unpack_tuple(builder, args[1], 4),
                       strides=cgutils.unpack_tuple(builder, args[2], 4),
                       itemsize=context.get_constant(types.intp, 4), meminfo=None)
        return ary._getvalue()
    return array(address, shape, strides), codegen


@intrinsic
def _pointer(typingctx, address):
    """The float32 pointer at an address."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_data_type(types.float32).as_pointer())
    return types.CPointer(types.float32)(address), codegen


@numba.njit(**EXACT)
def _view(values, j, last):
    at = VIEWS + 5 * j
    return _view4(values[at], (values[B_], values[H_], values[T_], last),
                  (values[at + 1], values[at + 2], values[at + 3], values[at + 4]))


@numba.njit(**EXACT)
def _lse(values):
    """lse, (B, H, T, 1) and C-contiguous (attention.py makes it so): typed as team.run's is."""
    return numba.carray(_pointer(values[VIEWS + 5 * LSE]),
                        (values[B_], values[H_], values[T_], 1))


@numba.njit(**EXACT)
def attention_piece(values, kind, a, z):
    """Sequences a:z of the published attention's forward (kind FORWARD) or rule."""
    d, scale, causal, rows = values[D_], _pointer(values[SCALE])[0], values[CAUSAL] != 0, values[ROWS]
    q, k, v, out = _view(values, Q, d)[a:z], _view(values, K, d)[a:z], _view(values, V, d)[a:z], \
        _view(values, OUT, d)[a:z]
    lse = _lse(values)[a:z]
    if kind == FORWARD:
        compiled_attention.forward(q, k, v, scale, causal, out, lse, values[LEADS:LEADS + 4], rows)
    else:
        compiled_attention.rule(q, k, v, _view(values, GRAD, d)[a:z], out, lse, scale, causal,
                                _view(values, DQ, d)[a:z], _view(values, DK, d)[a:z],
                                _view(values, DV, d)[a:z], values[LEADS:LEADS + 8], rows)


def _pointer_to(kind: Any) -> Any:
    @intrinsic
    def pointer(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_data_type(kind).as_pointer())
        return types.CPointer(kind)(address), codegen
    return pointer


_indices, _doubles = _pointer_to(types.int64), _pointer_to(types.float64)  # targets; sums (floats)


@numba.njit(**EXACT)
def _rows(values, j, width):
    """Array j of a rows job, (rows, width), C-contiguous as team.run's are."""
    return numba.carray(_pointer(values[ARRAYS + j]), (values[N_], width))


@numba.njit(**EXACT)
def _flat(values, j):
    """Array j of an elementwise job, (rows,)."""
    return numba.carray(_pointer(values[ARRAYS + j]), (values[N_],))


@numba.njit(**EXACT)
def rows_piece(values, kind, a, z, slot):
    """Rows (or elements) a:z of a published GELU or LayerNorm (forward or rule) or cross-entropy,
    or AdamW's pieces a:z: the kernels numpy_fused.py (products.py) hands team.run, on the same
    slices; the LayerNorm rule's (Σ dy·x̂, Σ dy) and the cross-entropy's sum into their parts' row
    `slot` (numpy_fused adds them in order)."""
    back = values[BACK] != 0
    if kind == ADAMW:  # pieces a:z of products.adamw's: (p, g, m, v, size) and their scalars
        pieces = numba.carray(_indices(values[ARRAYS]), (z, 5))
        scalars = numba.carray(_pointer(values[ARRAYS + 1]), (z, ADAMW_SCALARS))
        for i in range(a, z):
            n, row = pieces[i, 4], scalars[i]
            compiled_passes.adamw(numba.carray(_pointer(pieces[i, 0]), (n,)),
                                  numba.carray(_pointer(pieces[i, 1]), (n,)),
                                  numba.carray(_pointer(pieces[i, 2]), (n,)),
                                  numba.carray(_pointer(pieces[i, 3]), (n,)),
                                  row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7])
    elif kind == CROSS_ENTROPY:  # arrays: the logits (N, C), the targets, the block sums
        x = _rows(values, 0, values[C_])[a:z]
        targets = numba.carray(_indices(values[ARRAYS + 1]), (values[N_],))[a:z]
        # a Python float in team.run's route: float64, exactly
        _doubles(values[ARRAYS + 2])[slot] = compiled_kernels.cross_entropy(x, targets)
    elif kind == CROSS_ENTROPY_RULE:  # arrays: the logits, the targets, the gradient; the scale at EPS
        c = values[C_]
        targets = numba.carray(_indices(values[ARRAYS + 1]), (values[N_],))[a:z]
        compiled_kernels.cross_entropy_rule(_rows(values, 0, c)[a:z], targets, _pointer(values[EPS])[0],
                                            _rows(values, 2, c)[a:z])
    elif kind == GELU:
        compiled_kernels.gelu(_flat(values, 0)[a:z], _flat(values, 1)[a:z], back)
    elif kind == GELU_RULE:
        compiled_kernels.gelu_rule(_flat(values, 0)[a:z], _flat(values, 1)[a:z], _flat(values, 2)[a:z],
                                   back)
    else:
        c, eps = values[C_], _pointer(values[EPS])[0]
        w = numba.carray(_pointer(values[ARRAYS + 1 + (kind == LAYER_NORM_RULE)]), (c,))
        if kind == LAYER_NORM:
            compiled_kernels.layer_norm(_rows(values, 0, c)[a:z], w,
                                        numba.carray(_pointer(values[ARRAYS + 2]), (c,)), eps,
                                        _rows(values, 3, c)[a:z])
        else:
            dw, db = compiled_kernels.layer_norm_rule(_rows(values, 0, c)[a:z], _rows(values, 1, c)[a:z],
                                                      w, eps, _rows(values, 3, c)[a:z])
            parts = numba.carray(_pointer(values[ARRAYS + 4]), (slot + 1, 2, c))
            parts[slot, 0, :] = dw
            parts[slot, 1, :] = db


def rows_values(arrays: list[np.ndarray], rows: int, width: int, eps: np.ndarray | None = None,
                backward: bool = False) -> np.ndarray:
    """The int64 values a rows job publishes (`eps` a float32 array of one, kept alive by the
    caller)."""
    values = np.zeros(ARRAYS + 5, np.int64)
    values[N_], values[C_], values[BACK] = rows, width, int(backward)
    values[EPS] = 0 if eps is None else eps.ctypes.data
    for j, x in enumerate(arrays):
        values[ARRAYS + j] = x.ctypes.data
    return values


def attention_values(arrays: dict[int, np.ndarray], scale: np.ndarray, causal: bool, rows: int,
                     leads: np.ndarray) -> np.ndarray:
    """The int64 values an attention job publishes: `arrays` by their index (Q, K, ...; those a
    forward does not read left out), `scale` a float32 array of one (kept alive by the caller)."""
    values = np.zeros(SIZE, np.int64)
    values[B_:D_ + 1] = arrays[Q].shape
    values[SCALE], values[CAUSAL], values[ROWS] = scale.ctypes.data, int(causal), rows
    values[LEADS:LEADS + leads.size] = leads
    for j, x in arrays.items():
        at = VIEWS + 5 * j
        values[at] = x.ctypes.data
        values[at + 1:at + 5] = x.strides
    return values


def cuts_of(cut: Any) -> np.ndarray:
    """attention.py's slices of the batch as the pool's cuts (slice i: cuts[i]:cuts[i + 1])."""
    return np.array([s.start for s in cut] + [cut[-1].stop], np.int64)


def _own_code() -> None:
    """Load (or compile) the kernels' own code for the types the pool's jobs call them with, before
    any of the pool's functions (rows_piece, attention_piece, compiled_team's loop) is compiled or
    loaded. numba links a callee's optimized module into its caller's as a weak (linkonce_odr)
    copy, optimizes it once more there (with fastmath's reassociation, other bits: LayerNorm's, 37
    × 70, by an ulp in 638 of 2,590 elements, and so the GELU after it), and LLVM's JIT binds the
    call to whichever definition of the symbol it holds first. Compiled in this process, the kernel
    comes first (it is compiled as the callee); loaded from numba's cache, the caller's library
    comes alone, so its copy would run, and team.run's kernel would not be the pool's: the pool
    lost team.run's bits once the cache was warm (round 13). Loaded here first, the kernel's own
    code is what both run."""
    f32, i64 = types.float32, types.int64
    flat, rows, indices = types.Array(f32, 1, "C"), types.Array(f32, 2, "C"), types.Array(i64, 1, "C")
    heads, lse, flag = types.Array(f32, 4, "A"), types.Array(f32, 4, "C"), types.boolean
    for kernel, signature in (
            (compiled_kernels.gelu, (flat, flat, flag)),
            (compiled_kernels.gelu_rule, (flat, flat, flat, flag)),
            (compiled_kernels.layer_norm, (rows, flat, flat, f32, rows)),
            (compiled_kernels.layer_norm_rule, (rows, rows, flat, f32, rows)),
            (compiled_kernels.cross_entropy, (rows, indices)),
            (compiled_kernels.cross_entropy_rule, (rows, indices, f32, rows)),
            (compiled_passes.adamw, (flat,) * 4 + (f32,) * ADAMW_SCALARS),
            (compiled_attention.forward, (heads, heads, heads, f32, flag, heads, lse, indices, i64)),
            (compiled_attention.rule, (heads,) * 5 + (lse, f32, flag) + (heads,) * 3 + (indices, i64))):
        kernel.compile(signature)


_own_code()

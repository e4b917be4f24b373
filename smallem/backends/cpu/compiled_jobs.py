"""The pool's jobs beyond the Linears (issue 38, round 11): the fused attention's compiled blocks
(compiled_attention.py's forward and rule) taken by compiled_team.py's helpers inside their loop,
without the GIL, where team.run hands each block to a Python call that takes it twice.

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

from . import compiled_attention
from .compiled_linear import EXACT

# values: the shape, then the scale's address, causal, rows, the 8 leads, then 5 an array
B_, H_, T_, D_, SCALE, CAUSAL, ROWS = range(7)
LEADS = 7
VIEWS = LEADS + 8
Q, K, V, GRAD, OUT, LSE, DQ, DK, DV = range(9)  # the arrays, in that order
SIZE = VIEWS + 5 * 9
FORWARD, RULE = 0, 1  # a piece's kind, as compiled_team passes it


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

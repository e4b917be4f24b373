"""Row gathers and atomic scatter-adds on the GPU: an embedding's forward and its gradient.

cupy.py's `gather_rows` and `scatter_add_rows` launch these on contiguous float32 values and
int64 rows; an index outside the table reads NaN and writes nowhere, never a stray address.
"""

from __future__ import annotations

from typing import Any

from .common import HEADER, kernel, launch

SOURCE = HEADER + r"""
// out[i, :] = table[rows[i], :]; an index outside the table gives NaN rather than a stray read.
extern "C" __global__ void gather_rows(const float* table, const long long* rows, float* out,
                                       long long n, long long width, long long table_rows) {
    GRID_STRIDE(i, n) {
        long long r = rows[i / width];
        out[i] = (r >= 0 && r < table_rows) ? table[r * width + i % width] : NAN_F;
    }
}

// out[rows[i], :] += values[i, :]. A row index may repeat (a byte seen three times in a batch):
// threads then add into the same cell, and only an atomic add keeps every contribution.
extern "C" __global__ void scatter_add_rows(const float* values, const long long* rows,
                                            float* out, long long n, long long width,
                                            long long out_rows) {
    GRID_STRIDE(i, n) {
        long long r = rows[i / width];
        if (r >= 0 && r < out_rows) atomicAdd(out + r * width + i % width, values[i]);
    }
}
"""


def gather_rows(table: Any, rows: Any, out: Any, width: int) -> None:
    """out[i, :] = table[rows[i], :], one launch."""
    launch(kernel(SOURCE, "gather_rows"), out.size,
           (table, rows, out, out.size, width, table.shape[0]))


def scatter_add_rows(values: Any, rows: Any, out: Any, width: int, num_rows: int) -> None:
    """out[rows[i], :] += values[i, :] into a zeroed `out`, with atomicAdd, one launch."""
    launch(kernel(SOURCE, "scatter_add_rows"), values.size,
           (values, rows, out, values.size, width, num_rows))

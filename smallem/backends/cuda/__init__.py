"""The GPU backend's kernel room: one file per concept, each with its CUDA SOURCE and the Python
that launches it; common.py holds the shared header, helpers and the one compile cache.

FUSED and FUSED_FORWARD are the one table of fused rules and operation forwards (name -> function,
the tape's rule contract): cupy.py's backend checks itself against them, and tools/calls.py and
the tests derive from them. A new kernel is its file here plus its entry below (and its test).
Importable without CuPy: the CPU tests read every source through `all_sources()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    attention,
    attention_f32,
    attention_f32_tc,
    attention_f32_tc_grad,
    attention_mma,
    cross_entropy,
    elementwise,
    gelu,
    gemm,
    halves,
    indexing,
    layer_norm,
    linear,
    optimizers,
    qkv,
    reductions,
    scaler,
    softmax,
)

# name -> fused rule (be, grad, out, *inputs, *args) -> one gradient per input, or None (declined)
FUSED: dict[str, Callable[..., Any]] = {
    "add": elementwise.add_rule, "tanh": elementwise.tanh_rule, "gelu": gelu.gelu_rule,
    "matmul": gemm.matmul_rule, "cross_entropy": cross_entropy.cross_entropy_rule,
    "softmax": softmax.softmax_rule, "layer_norm": layer_norm.layer_norm_rule,
    "attention": attention.attention_rule, "linear": linear.linear_rule,
    "linear_add": linear.linear_add_rule, "qkv_attention": qkv.qkv_attention_rule}
# operation name -> fused forward (be, *inputs, op) -> the output, or None (declined)
FUSED_FORWARD: dict[str, Callable[..., Any]] = {
    "cross_entropy": cross_entropy.cross_entropy_forward, "softmax": softmax.softmax_forward,
    "layer_norm": layer_norm.layer_norm_forward, "attention": attention.attention_forward,
    "linear": linear.linear_forward, "linear_add": linear.linear_add_forward,
    "qkv_attention": qkv.qkv_attention_forward}

# the files whose SOURCE is compiled as one module each
KERNEL_FILES = (elementwise, reductions, indexing, cross_entropy, softmax, layer_norm, gelu,
                attention, halves, scaler, qkv)


def fused_names() -> tuple[str, ...]:
    """Every rule or operation the GPU fuses (a rule, a forward or both), in table order."""
    return tuple(dict.fromkeys([*FUSED, *FUSED_FORWARD]))


def all_sources() -> dict[str, str]:
    """Every CUDA source the backend compiles, by name: one per kernel file, one per optimizer
    kernel (for a compile check without a device, and the kernel-name test)."""
    out = {module.__name__.rsplit(".", 1)[-1]: module.SOURCE for module in KERNEL_FILES}
    return {**out, "attention_f32": attention_f32.SOURCE,
            "attention_f32_tc": attention_f32_tc.SOURCE,
            "attention_f32_tc_grad": attention_f32_tc_grad.SOURCE,
            "attention_mma": attention_mma.source(), **optimizers.sources(), **scaler.sources()}


def switched_off() -> set[str]:
    """The table's entries a backend made now leaves out, as linear.py's switches say: the
    Linear's epilogues (EPILOGUES), the residual read by the product (RESIDUAL), q, k, v as one
    product (qkv.QKV)."""
    off = set()
    if not linear.EPILOGUES:  # nn.Linear records matmul and add, as before the epilogues
        off |= {"linear", "linear_add"}
    if not linear.RESIDUAL:
        off.add("linear_add")
    if not qkv.QKV:  # three Linears and `attention`, as before
        off.add("qkv_attention")
    return off


def check_table(fused: dict[str, Callable[..., Any]], fused_forward: dict[str, Callable[..., Any]]
                ) -> None:
    """A backend's fused tables must be this room's: the same names, the same functions."""
    for kind, have, want in (("fused", fused, FUSED), ("fused_forward", fused_forward,
                                                       FUSED_FORWARD)):
        if have != want:
            wrong = sorted(set(have) ^ set(want)) or sorted(n for n in have if have[n] is not
                                                            want[n])
            raise RuntimeError(f"the GPU backend's {kind} table differs from "
                               f"backends/cuda's at {wrong}: register kernels in one place")

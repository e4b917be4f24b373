"""The attention kernels read without a GPU (backends/cuda/attention.py, attention_f32.py,
attention_mma.py): which
kernel a precision takes, which shapes they take, every name the launchers build defined in the
sources, block sizes and shared memory within the H200's limits. Their numbers are checked on a
GPU (test_attention_fused_gpu.py)."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from smallem.backends.cuda import attention, attention_f32, attention_mma
from smallem.backends.precision import PRECISIONS

DEFINED = "extern \"C\" __global__ void {}("
BOUNDED = "extern \"C\" __global__ __launch_bounds__(256, 2) void {}("  # attention_mma's forward at D 64


@pytest.fixture(autouse=True)
def no_sm90a_route(monkeypatch):
    """Every test here reads the modules as a process on a machine without sm_90a has them (SM90A
    resolved False, common.compiled NVRTC's own, cached), whichever compile route this process
    took: a device run resolves "auto" to NVRTC's sm_90a, and benchmarks/cubins.py's install sets
    SM90A True and replaces common.compiled (round 14's device calls failed three tests here on
    it). A test that asks for another route sets it itself."""
    from smallem.backends.cuda import common

    monkeypatch.setattr(attention_mma, "SM90A", False)
    monkeypatch.setattr(common, "compiled", getattr(common.compiled, "nvrtc", common.compiled))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("d", [8, 16, 32, 64, 128, 256])
def test_bf16_and_fp16_take_the_tensor_core_kernels_and_fp32_tf32_the_float32_ones(precision, d):
    fmt = attention.tensor_format(SimpleNamespace(precision=precision), d)
    if precision in ("bf16", "fp16") and d in attention_mma.WIDTHS:
        assert fmt == precision
    else:
        assert fmt is None


def test_a_backend_without_a_precision_is_float32():
    assert attention.tensor_format(SimpleNamespace(), 64) is None


@pytest.mark.parametrize("q, k, v, takes", [
    ((2, 4, 64, 64), (2, 4, 64, 64), (2, 4, 64, 64), True),
    ((2, 4, 64, 128), (2, 4, 80, 128), (2, 4, 80, 128), True),
    ((3, 50, 16), (3, 70, 16), (3, 70, 16), True),
    ((2, 4, 64, 8), (2, 4, 64, 8), (2, 4, 64, 8), False),  # a width without kernels
    ((2, 4, 64, 48), (2, 4, 64, 48), (2, 4, 64, 48), False),
    ((2, 4, 64, 64), (2, 4, 64, 64), (2, 4, 64, 32), False),  # v narrower than k
    ((2, 4, 64, 64), (2, 2, 64, 64), (2, 2, 64, 64), False),  # other heads
    ((70000, 1, 4, 32), (70000, 1, 4, 32), (70000, 1, 4, 32), False)])  # B·H past the grid
def test_the_kernels_take_these_shapes_and_decline_the_rest(q, k, v, takes):
    shaped = [SimpleNamespace(shape=s) for s in (q, k, v)]
    assert attention.takes(*shaped) is takes


def test_every_float32_kernel_is_defined_for_every_width():
    for d in attention.WIDTHS:
        for kind in ("forward", "key_grads", "query_grads", "delta"):
            assert DEFINED.format(f"flash_{kind}_{d}") in attention.SOURCE, (kind, d)


def test_another_float32_configuration_renames_nothing():
    """A bench compiles other (G, ROWS) as SOURCE: the same kernel names, other templates."""
    other = attention.source({64: (4, 32), 128: (8, 32)})
    assert DEFINED.format("flash_forward_64") in other and "forward<64, 4, 32>" in other
    assert "forward<64, 2, 64>" in attention.SOURCE


@pytest.mark.parametrize("d", attention.WIDTHS)
def test_each_float32_configuration_fits_a_warp_and_the_registers(d):
    g, rows = attention.CONFIG[d]
    assert 32 % g == 0 and (d // 4) % g == 0  # G threads of a row in one warp, whole float4s
    assert d // g <= 32  # what the kernels keep per thread: four rows of 32 numbers at most
    assert (rows * g) % 32 == 0 and rows * g <= 256


def test_the_sources_are_in_the_room_s_compile_list():
    from smallem.backends.cuda import all_sources

    sources = all_sources()
    assert sources["attention"] == attention.SOURCE
    assert "attention_tc" not in sources  # round 6's kernels, deleted in round 9
    assert sources["attention_mma"] == attention_mma.source()


@pytest.mark.parametrize("fmt", attention_mma.FORMATS)
@pytest.mark.parametrize("d", attention_mma.WIDTHS)
def test_every_tensor_core_kernel_is_defined_and_fits_shared_memory(fmt, d):
    for text in (attention_mma.source(), attention_mma.source(formats=(fmt,), widths=(d,))):
        for kind in ("convert", "forward", "keyq"):
            name = f"flash_mma_{kind}_{fmt}_{d}"
            assert DEFINED.format(name) in text or BOUNDED.format(name) in text
        # round 11: dQ by its own pass (query, with key's dK, dV) removed; keyq's atomics it is
        for kind in ("query", "key"):
            assert f"flash_mma_{kind}_{fmt}_{d}(" not in text
    for kind in ("forward", "keyq"):
        warps, n, *_ = attention_mma.CONFIG["key" if kind == "keyq" else kind][d]
        assert attention_mma.shared_bytes(kind, d) <= 227 * 1024
        # ldmatrix pairs of n-tiles; tiles whole in the padded copies
        assert n % 16 == 0 and attention_mma.padded(1) % n == 0
        assert n <= 32 * warps  # the key kernel's threads each read one lse and δ of a tile
    warps, n, *_ = attention_mma.CONFIG["key"][d]
    parts = max(1, warps // (n // 16))  # keyq's dQ: each warp 16 queries × d / parts columns
    assert (d // 8) % parts == 0 and (d // 8 // parts) % 2 == 0


def test_the_tiled_key_kernel_is_keyq_where_config_says_and_takes_its_transposed_tile():
    """CONFIG["tiled"] (round 9b): keyq runs FlashAttention-2's 2-D tiling (mma_key2d); the block
    holds Pᵀ beside dSᵀ; a key layout it was not written for keeps mma_key."""
    import copy

    cfg = copy.deepcopy(attention_mma.CONFIG)
    cfg["tiled"][64], cfg["key"][64], cfg["staged"][64] = 0, (4, 64, 1, 0), (0, 0)
    cfg["key_wg"][64] = 0  # (round 11's wgmma keyq, on by default at D 64, takes tiled's place)
    assert "{ mma_key2d<" not in attention_mma.source(cfg, ("bf16",), (64,))
    plain = attention_mma.shared_bytes("keyq", 64, cfg)
    cfg["tiled"][64] = 1
    text = attention_mma.source(cfg, ("bf16",), (64,))
    assert "flash_mma_keyq_bf16_64(MMA_GRAD_ARGS) { mma_key2d<0, 64, 4, 1>(" in text
    assert attention_mma.shared_bytes("keyq", 64, cfg) == plain + 2 * 64 * (64 + 8) <= 227 * 1024 // 2
    cfg["key"][64] = (8, 64, 0, 2)  # 128 keys a block: twice the rows of Pᵀ, dSᵀ
    assert "{ mma_key2d<0, 64, 8, 0>(" in attention_mma.source(cfg, ("bf16",), (64,))
    assert attention_mma.shared_bytes("keyq", 64, cfg) == 2 * (256 + 256) * 72 + 16 * 64 + 4 * 128 * 72
    for key, staged in (((4, 32, 1, 0), (0, 0)), ((4, 64, 1, 0), (0, 1)), ((2, 64, 0, 0), (0, 0))):
        cfg["key"][64], cfg["staged"][64] = key, staged
        text = attention_mma.source(cfg, ("bf16",), (64,))
        assert "{ mma_key2d<" not in text and "flash_mma_keyq_bf16_64(MMA_GRAD_ARGS) { mma_key<" in text
        assert attention_mma.shared_bytes("keyq", 64, cfg) == attention_mma.shared_bytes(
            "keyq", 64, {**cfg, "tiled": {**cfg["tiled"], 64: 0}})


def test_a_module_holds_one_format_and_width():
    """Each (format, width) compiles as a module of its own: a process compiles what it runs."""
    text = attention_mma.source(formats=("fp16",), widths=(128,))
    assert "flash_mma_forward_fp16_128(" in text
    assert "flash_mma_forward_bf16_128(" not in text and "flash_mma_forward_fp16_64(" not in text


def test_round_9_s_register_variants_compile_other_templates():
    """QR (the forward's Q fragments in registers), KR (the key kernels' K, V fragments), and
    the key kernels' register cap (blocks a multiprocessor): template arguments and bounds."""
    other = {**attention_mma.CONFIG, "forward": {**attention_mma.CONFIG["forward"], 64: (4, 128, 2, 1)},
             "key": {**attention_mma.CONFIG["key"], 64: (8, 32, 1, 2)}}
    text = attention_mma.source(other, ("bf16",), (64,))
    assert "mma_forward<0, 64, 128, 4, 2, 0, 1, 1, 1>" in text
    assert "{ mma_key<0, 64, 32, 8, 0, 1>(" in text
    assert "__launch_bounds__(256, 2) void flash_mma_keyq_bf16_64(" in text
    assert "__launch_bounds__(128, 2) void flash_mma_forward_bf16_64(" not in text  # 4 warps x 2 rows
    assert attention_mma.shared_bytes("forward", 64, other) == 2 * (128 + 4 * 128) * 72


def test_another_tensor_core_configuration_compiles_other_templates():
    other = {**attention_mma.CONFIG, "forward": {**attention_mma.CONFIG["forward"], 64: (8, 32, 2, 0)},
             "staged": {**attention_mma.CONFIG["staged"], 64: (1, 1)},
             "tiled": {w: 0 for w in attention_mma.WIDTHS},  # mma_key's bytes below, either switch
             "key_wg": {w: 0 for w in attention_mma.WIDTHS}}
    text = attention_mma.source(other)
    assert "mma_forward<0, 64, 32, 8, 2, 1, 0, 1, 1>" in text
    assert "mma_forward<0, 64, 32, 8, 2, 1, 0, 1, 1>" not in attention_mma.source()
    # staged (round 8): one 16-bit buffer of K, V and their float32 stage; unstaged: two buffers
    assert attention_mma.shared_bytes("forward", 64, other) == 2 * (256 + 2 * 32) * 72 + 2 * 32 * 64 * 4
    unstaged = {**other, "staged": {**other["staged"], 64: (0, 0)}}
    assert "mma_forward<0, 64, 32, 8, 2, 0, 0, 1, 1>" in attention_mma.source(unstaged)
    assert attention_mma.shared_bytes("forward", 64, unstaged) == 2 * (256 + 4 * 32) * 72
    key = attention_mma.shared_bytes("keyq", 64, unstaged)
    assert attention_mma.shared_bytes("keyq", 64, other) == key + 64 * 64 * 4  # + Q's stage


def test_the_kernels_write_16_bit_copies_and_the_key_kernel_counts_its_adders():
    """O's, dQ's, dK's and dV's 16-bit copies are written where their float32 numbers are (the
    products reading them then round nothing); with dQ by atomics, the last key block adding to
    a query tile writes dQ's copy, counted per (B·H, query tile) and left at zero."""
    text = attention_mma.source()
    # O; dK, dV; dQ (keyq's copy tail); dK, dV (keyq tiled, round 9b); O (the forward by wgmma,
    # round 10); dK, dV (keyq by wgmma, round 11, every operand from shared memory); O (the long
    # sequences' forward, round 13)
    assert text.count("put_pair<F16>(") == 1 + 2 + 1 + 2 + 1 + 2 + 1
    # each writes only where the caller passed a copy (the null pointer: no store), and a module
    # for the passes without copies compiles every store and dQ's copy tail out
    assert "if (COPIES && h) *(unsigned*)(h + (at - x))" in text
    assert text.count("if (COPIES && hz)\n        dq_copy_tail<") == 3  # keyq's each way
    assert "#define COPIES 1\n" in text
    plain = attention_mma.source(copies=False)
    assert "#define COPIES 0\n" in plain and plain.replace("COPIES 0", "COPIES 1") == text
    assert "atomicAdd(count, 1u) == adders - 1" in text and "*count = 0u" in text


def test_strides_of_a_heads_view_are_in_floats():
    """(B, H, T, D) viewed from (B, T, H, D): the kernels' (b, h, t) strides, in floats."""
    x = np.zeros((2, 5, 3, 8), np.float32).transpose(0, 2, 1, 3)
    assert tuple(int(s) for s in attention._strides(x)) == (5 * 3 * 8, 8, 3 * 8)
    y = np.zeros((4, 5, 8), np.float32)
    assert tuple(int(s) for s in attention._strides(y)) == (5 * 8, 0, 8)


@pytest.mark.parametrize("t, tp", [(1, 128), (63, 128), (128, 128), (129, 256), (4096, 4096)])
def test_the_converted_copies_hold_whole_tiles(t, tp):
    """Rounded up to 128 rows: every tile a tensor-core kernel copies (128, 64 or 32 rows, from
    a multiple of its size) lies inside the copy, and the convert kernel's 32-row blocks divide it."""
    assert attention_mma.padded(t) == tp
    for tile in (32, 64, 128):
        assert all(first + tile <= tp for first in range(0, t, tile))
    assert tp % 32 == 0


def test_the_flash_float32_kernels_take_widths_32_to_128_when_switched_on(monkeypatch):
    assert attention.FLOAT32 in ("rows", "flash", "auto")
    monkeypatch.setattr(attention, "FLOAT32", "auto")  # where measured faster than the rows
    assert [attention.float32_kernels(d) for d in (16, 32, 64, 128)] == ["rows", "flash", "flash",
                                                                          "flash"]
    monkeypatch.setattr(attention_f32, "MEASURED", (32, 64))  # a width not measured takes the rows
    assert attention.float32_kernels(128) == "rows"
    monkeypatch.setattr(attention, "FLOAT32", "flash")
    assert [attention.float32_kernels(d) for d in (16, 32, 64, 128)] == ["rows", "flash", "flash",
                                                                          "flash"]
    monkeypatch.setattr(attention, "FLOAT32", "rows")
    assert {attention.float32_kernels(d) for d in (16, 32, 64, 128)} == {"rows"}


def test_every_flash_float32_kernel_is_defined_for_every_width():
    for d in attention_f32.WIDTHS:
        for kind in ("forward", "backward", "delta"):
            pattern = rf'extern "C" __global__ void (__launch_bounds__\([\d, ]+\) )?flash32_{kind}_{d}\('
            assert re.search(pattern, attention_f32.SOURCE), (kind, d)


@pytest.mark.parametrize("kind", ["forward", "backward"])
@pytest.mark.parametrize("d", attention_f32.WIDTHS)
def test_each_flash_float32_configuration_makes_whole_thread_tiles_and_fits(kind, d):
    assert attention_f32.fits(kind, d, attention_f32.CONFIG[d][kind])
    assert set(attention_f32.MEASURED) <= set(attention_f32.WIDTHS)


@pytest.mark.parametrize("kind, d, tiles", [
    ("forward", 64, (64, 40, 256)),  # 40 keys are not 16 threads' whole columns
    ("forward", 64, (40, 64, 256)),  # 40 rows are not 16 threads' whole rows
    ("backward", 128, (64, 64, 96)),  # 96 threads: not whole warps
    ("backward", 32, (64, 16, 256)),  # 32 rows of 8 threads each: 16 keys leave some idle
    ("forward", 128, (128, 128, 256))])  # 411 KiB of shared memory
def test_tiles_that_leave_threads_idle_or_overflow_shared_memory_do_not_fit(kind, d, tiles):
    assert not attention_f32.fits(kind, d, tiles)


def test_a_flash_configuration_with_a_block_count_caps_the_registers():
    src = attention_f32.source({64: {"forward": (64, 64, 256, 2), "backward": (32, 64, 128)}})
    assert "__launch_bounds__(256, 2) flash32_forward_64(" in src
    assert "__launch_bounds__(128) flash32_backward_64(" in src
    assert "fwd<64, 64, 64, 256, 16>" in src and "bwd<64, 32, 64, 128, 16, 1, 1>" in src
    assert "flash32_forward_32(" not in src  # only the widths asked for


def test_the_flash_float32_sources_are_in_the_room_s_compile_list():
    from smallem.backends.cuda import all_sources

    assert attention_f32.SOURCE in all_sources().values()


def test_eight_threads_across_the_keys_are_a_configuration_of_their_own():
    """KX (the fifth number) sets the threads across S's keys; 16 unless given, and P's pitch
    BN + KX with it."""
    assert attention_f32.tiles_of((64, 32, 256)) == (64, 32, 256, 0, 16, 1, 1)
    assert attention_f32.tiles_of((64, 32, 128, 2, 8)) == (64, 32, 128, 2, 8, 1, 1)
    src = attention_f32.source({128: {"forward": (64, 32, 128, 2, 8), "backward": (64, 32, 256, 0, 8)}})
    assert "fwd<128, 64, 32, 128, 8>" in src and "bwd<128, 64, 32, 256, 8, 1, 1>" in src
    assert "__launch_bounds__(256) flash32_backward_128(" in src  # 0: no register cap
    small, wide = ({128: {"forward": (64, 32, 256, 0, kx)}} for kx in (8, 16))
    assert attention_f32.shared_bytes("forward", 128, wide) - attention_f32.shared_bytes(
        "forward", 128, small) == 4 * 64 * 8
    assert attention_f32.fits("forward", 128, (64, 32, 128, 2, 8))
    assert not attention_f32.fits("forward", 128, (64, 32, 128, 2, 4))  # 4 across: not taken


def test_two_query_buffers_are_a_backward_configuration_of_their_own():
    """QB (the sixth number) gives the backward a second Q, dO, lse, δ buffer to load the next
    query tile into; 1 unless given, the forward has none."""
    assert attention_f32.tiles_of((32, 64, 256, 0, 16, 2)) == (32, 64, 256, 0, 16, 2, 1)
    src = attention_f32.source({128: {"forward": (64, 32, 256), "backward": (32, 64, 256, 0, 16, 2)}})
    assert "bwd<128, 32, 64, 256, 16, 2, 1>" in src and "fwd<128, 64, 32, 256, 16>(" in src
    one, two = ({128: {"backward": (32, 64, 256, 0, 16, qb)}} for qb in (1, 2))
    assert attention_f32.shared_bytes("backward", 128, two) - attention_f32.shared_bytes(
        "backward", 128, one) == 4 * (2 * 32 * 132 + 2 * 32)  # Q, dO and lse, δ once more
    assert attention_f32.fits("backward", 128, (32, 64, 256, 0, 16, 2))
    assert not attention_f32.fits("forward", 128, (64, 32, 256, 0, 16, 2))  # K, V have two
    assert not attention_f32.fits("backward", 128, (32, 64, 256, 0, 16, 4))


def test_one_buffer_loaded_during_dq_s_product_is_a_backward_configuration_of_its_own():
    """QB = 3 (round 11) issues the next query tile's Q, dO, lse, δ into the one buffer while dQ's
    product runs: QB 1's shared memory, not QB 2's."""
    assert attention_f32.tiles_of((64, 64, 256, 0, 16, 3)) == (64, 64, 256, 0, 16, 3, 1)
    src = attention_f32.source({128: {"forward": (64, 32, 128, 2, 8), "backward": (64, 64, 256, 0, 16, 3)}})
    assert "bwd<128, 64, 64, 256, 16, 3, 1>" in src
    one, three = ({128: {"backward": (64, 64, 256, 0, 16, qb)}} for qb in (1, 3))
    assert attention_f32.shared_bytes("backward", 128, three) == attention_f32.shared_bytes(
        "backward", 128, one)
    assert attention_f32.fits("backward", 128, (64, 64, 256, 0, 16, 3))  # QB 2 would not fit
    assert not attention_f32.fits("backward", 128, (64, 64, 256, 0, 16, 2))
    assert not attention_f32.fits("forward", 128, (64, 32, 128, 2, 8, 3))


def test_an_eighth_number_is_no_configuration_any_more():
    """Round 11's SP (S and dP in two passes, never adopted) was deleted in round 13: a tuple
    that still gives one is refused, not silently read as another."""
    with pytest.raises(ValueError):
        attention_f32.tiles_of((64, 64, 256, 0, 16, 3, 1, 2))


def test_dk_dv_by_warps_of_sixteen_keys_is_a_backward_configuration_of_its_own():
    """DL (the seventh number) = 2 gives each warp 16 keys × 64 columns of dK, dV: the block's
    warps must tile BN keys × HD columns exactly."""
    assert attention_f32.tiles_of((64, 64, 256, 0, 16, 1, 2)) == (64, 64, 256, 0, 16, 1, 2)
    src = attention_f32.source({128: {"forward": (64, 32, 256), "backward": (64, 64, 256, 0, 16, 1, 2)}})
    assert "bwd<128, 64, 64, 256, 16, 1, 2>" in src
    assert attention_f32.fits("backward", 128, (64, 64, 256, 0, 16, 1, 2))  # 4 × 2 warps
    assert not attention_f32.fits("backward", 128, (64, 32, 256, 0, 16, 1, 2))  # 2 × 2: not 8
    assert not attention_f32.fits("backward", 32, (64, 64, 256, 0, 16, 1, 2))  # 32 columns
    assert not attention_f32.fits("forward", 128, (64, 32, 256, 0, 16, 1, 2))
    # 3: dQ too, by warps of 16 query rows × 64 columns: BM 64 at 256 threads, not 32
    assert attention_f32.fits("backward", 128, (64, 64, 256, 0, 16, 1, 3))
    assert not attention_f32.fits("backward", 128, (32, 64, 256, 0, 16, 1, 3))
    assert not attention_f32.fits("backward", 128, (64, 64, 256, 0, 16, 1, 4))


def test_the_forward_s_round_10_switches_are_template_arguments():
    """CONFIG["forward_opts"] (LF: the grid (B·H, query blocks), the longest blocks of every head
    first; LZ: O rescaled only where a row's max moved) reach the forward's template; the
    other kernels and the shared memory stay as they were."""
    import copy

    cfg = copy.deepcopy(attention_mma.CONFIG)
    cfg["forward_opts"][64] = (0, 0, 0)
    plain = attention_mma.source(cfg, ("bf16",), (64,))
    assert "{ mma_forward<0, 64, 64, 8, 1, 0, 0, 0, 0>(" in plain
    cfg["forward_opts"][64] = (1, 1, 0)
    text = attention_mma.source(cfg, ("bf16",), (64,))
    assert "{ mma_forward<0, 64, 64, 8, 1, 0, 0, 1, 1>(" in text
    assert text.replace("0, 0, 1, 1>(", "0, 0, 0, 0>(") == plain
    assert attention_mma.shared_bytes("forward", 64, cfg) == 2 * (128 + 4 * 64) * 72  # mma_forward's


def test_the_wgmma_forward_is_taken_where_config_says_and_its_layout_allows():
    """CONFIG["forward_opts"]'s WG (round 10): the forward by wgmma at D 64 with 4 or 8 warps of 16
    rows and 64-key tiles; its shared memory the swizzled K, V tiles (unpadded, 1 KiB to align
    them) and Q's padded rows; any other layout keeps mma_forward; compiled for sm_90a only."""
    import copy

    cfg = copy.deepcopy(attention_mma.CONFIG)
    cfg["forward"][64], cfg["staged"][64] = (8, 64, 1, 1), (0, 0)
    cfg["forward_opts"][64] = (1, 1, 1)
    text = attention_mma.source(cfg, ("bf16",), (64,))
    assert "flash_mma_forward_bf16_64(MMA_FORWARD_ARGS) { mma_forward_wg<0, 8, 1, 1>(" in text
    assert "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)" in text and "__trap();" in text
    assert attention_mma.shared_bytes("forward", 64, cfg) == 1024 + 6 * 64 * 64 * 2 + 128 * 72 * 2
    cfg["forward"][64] = (4, 64, 1, 1)
    assert "{ mma_forward_wg<1, 4, 1, 1>(" in attention_mma.source(cfg, ("fp16",), (64,))
    for layout, staged in (((8, 128, 1, 1), (0, 0)), ((4, 64, 2, 1), (0, 0)), ((8, 64, 1, 1), (1, 0))):
        cfg["forward"][64], cfg["staged"][64] = layout, staged
        assert "{ mma_forward_wg<" not in attention_mma.source(cfg, ("bf16",), (64,))
    cfg = copy.deepcopy(attention_mma.CONFIG)
    cfg["forward_opts"][128] = (1, 1, 1)  # D 128: mma_forward
    assert "{ mma_forward_wg<" not in attention_mma.source(cfg, ("bf16",), (128,))


def test_the_long_sequences_forward_is_compiled_beside_the_wgmma_one_and_runs_from_its_t(monkeypatch):
    """CONFIG["forward_wg"] (round 13): where the forward is wgmma's (WG) at D 64, a module also holds
    flash_mma_forwardwg (its warps, keys, stages; registers capped for its blocks a multiprocessor;
    B·H its last argument) and its convert with rows swizzled; shared memory: 1 KiB to align, Q's
    swizzled rows, the stages of K, V, two mbarriers a stage; attention_mma.forward launches it
    from T = forward_wg_from on, round 10's forward below, with K, V from the swizzling convert and
    a block an item (B·H x query tiles of warps·16 rows)."""
    import copy

    cfg = copy.deepcopy(attention_mma.CONFIG)
    cfg["forward_opts"][64], cfg["staged"][64], cfg["forward_wg"][64] = (1, 1, 1), (0, 0), (8, 64, 3, 2)
    text = attention_mma.source(cfg, ("fp16",), (64,))
    assert "__launch_bounds__(256, 2) void flash_mma_forwardwg_fp16_64(MMA_FORWARD_ARGS, int bhs) { " \
           "mma_forward_wgq<1, 8, 64, 3>(" in text and ", bhs); }" in text
    assert "void flash_mma_convertsw_fp16_64(MMA_CONVERT_ARGS) { to_rows<1, 64, 1>(" in text
    assert attention_mma.shared_bytes("forwardwg", 64, cfg) == 1024 + 128 * 64 * 2 + 3 * 2 * 64 * 64 * 2 + 48
    cfg["forward_wg"][64] = (4, 64, 2, 4)  # one warpgroup, 2 stages, 4 blocks a multiprocessor
    assert "__launch_bounds__(128, 4) void flash_mma_forwardwg_fp16_64(MMA_FORWARD_ARGS, int bhs) { " \
           "mma_forward_wgq<1, 4, 64, 2>(" in attention_mma.source(cfg, ("fp16",), (64,))
    assert attention_mma.shared_bytes("forwardwg", 64, cfg) == 1024 + 64 * 64 * 2 + 2 * 2 * 64 * 64 * 2 + 32
    for change in (("forward_opts", (1, 1, 0)), ("forward_wg", ()), ("staged", (1, 0))):
        other = copy.deepcopy(cfg)
        other[change[0]][64] = change[1]
        assert "forwardwg" not in attention_mma.source(other, ("fp16",), (64,))
    monkeypatch.setattr(attention_mma, "SM90A", True)
    monkeypatch.setitem(attention_mma.CONFIG, "forward_wg_from", {64: 2048})
    launched = []

    class Fake:  # records what forward launches (no device here)
        def __init__(self, kind):
            self.kind = kind

        def __call__(self, grid, block, args, shared_mem=0):
            launched.append((self.kind, grid, block, shared_mem, args[-1]))

    monkeypatch.setattr(attention_mma, "mma_kernel", lambda kind, *a: Fake(kind))
    monkeypatch.setattr(attention_mma, "_empty", lambda shape, dtype: np.zeros(shape, dtype))
    monkeypatch.setattr(attention_mma, "strides", lambda x: (0, 0, 0))
    for t, w in ((2047, 8), (2048, 8), (4000, 8), (4000, 12)):
        monkeypatch.setitem(attention_mma.CONFIG, "forward_wg", {64: (w, 64, 3, 2)})
        launched.clear()
        x = np.zeros((3, 2, t, 64), np.float32)
        attention_mma.forward(x, x, x, x, x, "bf16", (3, 2), 0.125, True)
        long = t >= 2048
        assert [k for k, *_ in launched] == (["convertsw"] * 2 + ["forwardwg"] if long else
                                            ["convert"] * 2 + ["forward"])
        items = 6 * -(-t // (16 * w))
        if long:
            assert launched[-1][1:] == ((items,), (32 * w,),
                                        attention_mma.shared_bytes("forwardwg", 64), 6)


def test_the_wgmma_forward_runs_only_where_the_modules_are_built_for_sm_90a(monkeypatch):
    """NVRTC's compile (CuPy's RawModule) targets plain sm_90, where the wgmma forward is a trap:
    with WG asked for, the modules keep mma_forward unless SM90A says they are nvcc's sm_90a
    (benchmarks/cubins.py); LF and LZ stay either way."""
    monkeypatch.setitem(attention_mma.CONFIG, "forward_opts", {**attention_mma.CONFIG["forward_opts"],
                                                                64: (1, 1, 1)})
    monkeypatch.setattr(attention_mma, "SM90A", False)
    assert attention_mma.effective()["forward_opts"][64] == (1, 1, 0)
    text = attention_mma.source(formats=("bf16",), widths=(64,))
    assert "{ mma_forward<0, 64, 64, 8, 1, 0, 0, 1, 1>(" in text and "{ mma_forward_wg<" not in text
    monkeypatch.setattr(attention_mma, "SM90A", True)
    assert attention_mma.effective() is attention_mma.CONFIG
    assert "{ mma_forward_wg<0, 8, 1, 1>(" in attention_mma.source(formats=("bf16",), widths=(64,))
    three = 1024 + 3 * 2 * 64 * 64 * 2 + 128 * 72 * 2  # three buffers of K, V, Q's rows
    assert attention_mma.shared_bytes("forward", 64, attention_mma.effective()) == three


def test_sm90a_by_nvrtc_compiles_the_modules_with_that_option(monkeypatch):
    """SM90A = "nvrtc": the modules (the wgmma forward in them) compiled by CuPy's NVRTC with
    -arch=sm_90a (common.kernel's arch), one module a source."""
    from smallem.backends.cuda import common

    made = []

    class Function:  # hashable, as CuPy's (mma_kernel remembers which it has sized)
        def __init__(self, name):
            self.name = name

    class Module:
        def __init__(self, code, options):
            made.append((code, options))

        def get_function(self, name):
            return Function(name)

    monkeypatch.setattr(common, "cupy", SimpleNamespace(RawModule=Module))
    monkeypatch.setattr(attention_mma, "SM90A", "nvrtc")
    monkeypatch.setattr(attention_mma, "_READY", set())
    common.compiled.cache_clear(), common.kernel.cache_clear()
    fn = attention_mma.mma_kernel("forward", "bf16", 64, False)
    again = attention_mma.mma_kernel("keyq", "bf16", 64, False)
    assert fn.name == "flash_mma_forward_bf16_64" and again.name == "flash_mma_keyq_bf16_64"
    assert len(made) == 1 and made[0][1] == ("-arch=sm_90a",)
    assert "{ mma_forward_wg<0, 8, 1, 1>(" in made[0][0]
    assert fn.max_dynamic_shared_size_bytes == attention_mma.shared_bytes("forward", 64)
    common.compiled.cache_clear(), common.kernel.cache_clear()


@pytest.mark.parametrize("capability, resolved", [("90", "nvrtc"), ("80", False), ("100", False),
                                                  ("", False)])
def test_sm90a_auto_compiles_for_sm_90a_only_on_a_9_0_device(capability, resolved, monkeypatch):
    """SM90A = "auto" (the default): NVRTC's -arch=sm_90a on an H100/H200 (compute capability
    9.0), so a user's run takes the wgmma forward there; elsewhere (an A100, a Blackwell, no
    device) plain NVRTC and mma_forward, whose WG is switched off in the modules' source."""
    monkeypatch.setattr(attention_mma, "SM90A", "auto")
    monkeypatch.setattr(attention_mma, "_capability", lambda: capability)
    assert attention_mma.sm90a() == resolved
    text = attention_mma.source(formats=("bf16",), widths=(64,))
    assert ("{ mma_forward_wg<" in text) == bool(resolved)


def test_the_wgmma_key_kernel_is_keyq_where_config_says_and_its_layout_allows(monkeypatch):
    """CONFIG["key_wg"] (round 11): keyq by wgmma (mma_key_ss, every operand from shared memory) at D
    64 with key's layout of one warpgroup (4 warps of 16 keys, 64-query tiles, converted rows), in
    place of the tiled keyq; its shared memory two swizzled Q, dO tiles (1 KiB to align them), K, V,
    Pᵀ, dSᵀ, lse and δ; CONFIG["key_lf"] not 0 (round 13): the LF twin beside it; any other layout or
    width keeps the mma.sync kernels."""
    import copy

    monkeypatch.setattr(attention_mma, "SM90A", True)
    cfg = copy.deepcopy(attention_mma.CONFIG)
    cfg["key"][64], cfg["staged"][64], cfg["key_wg"][64] = (4, 64, 1, 0), (0, 0), 1
    for fmt, f16 in (("bf16", 0), ("fp16", 1)):
        for lf in (0, 1, 4096):
            cfg["key_lf"][64] = lf
            text = attention_mma.source(cfg, (fmt,), (64,))
            assert f"void flash_mma_keyq_{fmt}_64(MMA_GRAD_ARGS) {{ mma_key_ss<{f16}, 0>(" in text
            twin = f"void flash_mma_keyq_lf_{fmt}_64(MMA_GRAD_ARGS) {{ mma_key_ss<{f16}, 1>("
            assert (twin in text) == bool(lf)
            assert f"__launch_bounds__(128, 3) void flash_mma_keyq_{fmt}_64(" in text  # 3 blocks at least
    total = 1024 + 8 * 64 * 64 * 2 + 4 * 64 * 4
    assert attention_mma.shared_bytes("keyq", 64, cfg) == total <= 227 * 1024 // 3
    cfg["key"][64] = (4, 64, 1, 3)  # a register cap for 3 blocks: its bounds, on both kernels
    text = attention_mma.source(cfg, ("bf16",), (64,))
    assert "__launch_bounds__(128, 3) void flash_mma_keyq_bf16_64(MMA_GRAD_ARGS) { mma_key_ss<" in text
    assert "__launch_bounds__(128, 3) void flash_mma_keyq_lf_bf16_64(MMA_GRAD_ARGS) { mma_key_ss<" in text
    for layout, staged in (((8, 64, 1, 0), (0, 0)), ((4, 32, 1, 0), (0, 0)), ((4, 64, 1, 0), (0, 1))):
        cfg["key"][64], cfg["staged"][64] = layout, staged
        text = attention_mma.source(cfg, ("bf16",), (64,))
        assert "{ mma_key_ss<" not in text and "keyq_lf" not in text
    cfg = copy.deepcopy(attention_mma.CONFIG)
    cfg["key_wg"] = {w: 1 for w in attention_mma.WIDTHS}  # D 128 (and the others): mma_key
    assert "{ mma_key_ss<" not in attention_mma.source(cfg, ("bf16",), (128,))
    assert "{ mma_key_ss<" not in attention_mma.source(cfg, ("bf16",), (32,))


@pytest.mark.parametrize("capability, taken", [("90", True), ("80", False), ("100", False), ("", False)])
def test_the_wgmma_key_kernel_runs_only_on_a_9_0_device(capability, taken, monkeypatch):
    """With key_wg asked for and SM90A = "auto": keyq by wgmma on an H100/H200 (NVRTC's sm_90a);
    on an A100, a Blackwell or no device the tiled mma.sync keyq, sized as that kernel is."""
    monkeypatch.setitem(attention_mma.CONFIG, "key_wg", {**attention_mma.CONFIG["key_wg"], 64: 1})
    monkeypatch.setattr(attention_mma, "SM90A", "auto")
    monkeypatch.setattr(attention_mma, "_capability", lambda: capability)
    text = attention_mma.source(formats=("bf16",), widths=(64,))
    assert ("{ mma_key_ss<" in text) == taken
    assert ("{ mma_key2d<" in text) == (not taken)
    assert attention_mma.effective()["key_wg"][64] == int(taken)
    tiled = attention_mma.shared_bytes("keyq", 64, {**attention_mma.CONFIG, "key_wg": {64: 0}})
    assert (attention_mma.shared_bytes("keyq", 64, attention_mma.effective()) == tiled) == (not taken)


def test_the_wgmma_key_kernel_s_grid_is_heads_first_where_key_lf_says(monkeypatch):
    """CONFIG["key_lf"] (round 11; round 13: the T from which, the LF twin kernel): the wgmma keyq
    launched on the grid (B·H, key blocks) at T at or past it, so that blocks starting x fastest take
    every head's first (longest causal) key block first, the plain kernel on (key blocks, B·H) below;
    the mma.sync keyq (no key_wg) keeps (key blocks, B·H) with the switch on."""
    launched = []

    class Kernel:
        def __init__(self, kind):
            self.kind = kind

        def __call__(self, grid, block, args, shared_mem=0):
            launched.append((self.kind, grid, block))

    monkeypatch.setattr(attention_mma, "SM90A", True)
    monkeypatch.setattr(attention_mma, "mma_kernel", lambda kind, *a: Kernel(kind))
    monkeypatch.setattr(attention_mma, "to_rows", lambda *a, **k: np.zeros(1))
    monkeypatch.setattr(attention_mma, "_copy", lambda *a: 0)
    monkeypatch.setattr(attention_mma, "strides", lambda x: (0, 0, 0))
    x = np.zeros((2, 3, 200, 64), np.float32)  # (B, H, T, D): 4 key blocks of 64 a head
    for way, lf, launch in ((1, 1, ("keyq_lf", (6, 4), (128,))), (1, 200, ("keyq_lf", (6, 4), (128,))),
                            (1, 201, ("keyq", (4, 6), (128,))), (1, 4096, ("keyq", (4, 6), (128,))),
                            (1, 0, ("keyq", (4, 6), (128,))), (0, 1, ("keyq", (4, 6), (128,)))):
        monkeypatch.setitem(attention_mma.CONFIG, "key_wg", {**attention_mma.CONFIG["key_wg"], 64: way})
        monkeypatch.setitem(attention_mma.CONFIG, "key_lf", {**attention_mma.CONFIG["key_lf"], 64: lf})
        attention_mma.backward(x, x, x, x, x, x, (x, x, x), "bf16", (2, 3), 0.125, True)
        assert launched.pop() == launch


def test_the_backward_reads_the_forward_s_q_rows_and_zeros_dq_in_do_s_convert(monkeypatch):
    """Round 14: attention_mma.forward hands the key kernel's Q rows (to_rows' layout, which the
    forward's kernel fills: its argument after `causal`) back, except where the key kernel reads Q
    itself (staged); given them, the backward converts dO alone (δ and dQ's zeros in that pass) and
    the key kernel reads them; without, Q is converted (zeroing dQ) as before."""
    launched, converted = [], []

    class Kernel:
        def __init__(self, kind):
            self.kind = kind

        def __call__(self, grid, block, args, shared_mem=0):
            launched.append((self.kind, args))

    def to_rows(x, fmt, heads, o=None, delta=None, zero=None, copies=False, sw=False):
        converted.append((x, o, zero))
        return np.full(1, len(converted))

    monkeypatch.setattr(attention_mma, "SM90A", True)
    monkeypatch.setattr(attention_mma, "mma_kernel", lambda kind, *a: Kernel(kind))
    monkeypatch.setattr(attention_mma, "_empty", lambda shape, dtype: np.zeros(shape, dtype))
    monkeypatch.setattr(attention_mma, "strides", lambda x: (0, 0, 0))
    monkeypatch.setattr(attention_mma, "to_rows", to_rows)
    q, k, v, g, o, dq = (np.zeros((2, 3, 200, 64), np.float32) for _ in range(6))
    kept = attention_mma.forward(q, k, v, o, o, "bf16", (2, 3), 0.125, True)
    assert [(x is k, x is v) for x, *_ in converted] == [(True, False), (False, True)]
    converted.clear()
    assert kept.shape == (2 * 3 * 256 * 64,) and kept.dtype == np.uint16
    assert launched[-1][1][27] is kept  # after q, k, v, kr, vr, o, oh, lse, 12 strides, 7 scalars
    attention_mma.backward(q, k, v, g, o, o, (dq, k, v), "bf16", (2, 3), 0.125, True, out=o, q_rows=kept)
    assert [(x is g, y is o, z is dq) for x, y, z in converted] == [(True, True, True)]
    assert launched[-1][1][4] is kept  # the key kernel's qr
    converted.clear()
    attention_mma.backward(q, k, v, g, o, o, (dq, k, v), "bf16", (2, 3), 0.125, True, out=o)
    assert [(x is q, z is dq) for x, _, z in converted] == [(False, False), (True, True)]
    assert int(launched[-1][1][4][0]) == 2  # Q's convert's rows
    monkeypatch.setitem(attention_mma.CONFIG, "staged", {**attention_mma.CONFIG["staged"], 64: (0, 1)})
    assert attention_mma.forward(q, k, v, o, o, "bf16", (2, 3), 0.125, True) is None

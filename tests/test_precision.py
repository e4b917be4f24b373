"""The precision policy (backends/precision.py): formats, rounding, the tape's matrix products in
each precision against float64's gradients, the loss scaler, float32 master weights."""

import ml_dtypes
import numpy as np
import pytest

from smallem.autodiff.operations import CrossEntropy
from smallem.autodiff.tape import Tape
from smallem.backends import get_backend
from smallem.backends.precision import FORMATS, LossScaler, get_format, round_tf32, round_to, tolerance
from smallem.errors import SmallemError
from smallem.nn import Linear
from smallem.optim import AdamW
from smallem.training.step import train_step

LOW = ("tf32", "bf16", "fp16")


@pytest.mark.parametrize("name, info", [("fp32", np.finfo(np.float32)), ("fp16", np.finfo(np.float16)),
                                        ("bf16", ml_dtypes.finfo(ml_dtypes.bfloat16))])
def test_format_constants_are_the_formats_own(name, info):
    f = FORMATS[name]
    assert (f.eps, f.max, f.tiny, f.smallest) == (float(info.eps), float(info.max),
                                                 float(info.tiny), float(info.smallest_subnormal))
    assert f.bits == info.bits


def test_tf32_rounds_to_nearest_even_on_ten_bits():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(20000) * 10.0 ** rng.uniform(-30, 30, 20000)).astype(np.float32)
    m, e = np.frexp(x.astype(np.float64))  # x = m·2^e, 0.5 <= |m| < 1: 11 significant bits kept
    want = np.ldexp(np.round(m * 2 ** 11) / 2 ** 11, e)  # np.round: ties to even
    np.testing.assert_array_equal(round_tf32(x).astype(np.float64), want)
    one = np.float32(1.0)
    tie = np.float32(1.0 + 2.0 ** -11)  # halfway between 1 and 1 + 2^-10: to the even one, 1
    assert round_tf32(np.array([tie]))[0] == one
    assert np.isinf(round_tf32(np.array([np.inf], np.float32))[0])
    assert np.isnan(round_tf32(np.array([np.nan], np.float32))[0])


def test_fp16_rounding_is_numpys_float16_bit_for_bit():
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(50000) * 2.0 ** rng.uniform(-30, 18, 50000)).astype(np.float32)
    x = np.concatenate([x, np.float32([65504, 65519.99, 65520, -65520, 2.0 ** -25, 3 * 2.0 ** -25, 0.0])])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(round_to(x, "fp16"), want)


def test_fp16_overflows_to_inf_and_underflows_to_zero():
    x = np.array([70000.0, 65504.0, 1e-8, 3e-8 * 1.01], np.float32)
    r = round_to(x, "fp16")
    assert np.isinf(r[0]) and r[1] == 65504.0 and r[2] == 0.0 and r[3] == FORMATS["fp16"].smallest


def test_unknown_precision_is_one_sentence():
    with pytest.raises(SmallemError, match="unknown precision 'fp8'.*fp32, tf32, bf16, fp16"):
        get_format("fp8")
    with pytest.raises(SmallemError, match="unknown precision"):
        Tape("cpu", precision="fp8")


@pytest.mark.parametrize("precision", LOW)
def test_matmul_reads_rounded_inputs_and_sums_in_float32(precision):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 5, 7)), rng.standard_normal((7, 3))
    tape = Tape("cpu", precision=precision)
    out = tape.value(tape.leaf(a) @ tape.leaf(b))
    want = round_to(a, precision) @ round_to(b, precision)  # float32 products and sums
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    plain = Tape("cpu")
    assert not np.allclose(out, plain.value(plain.leaf(a) @ plain.leaf(b)), rtol=1e-6, atol=0)


def _gradients(backend, precision, seed=3):
    """A two-layer net's loss and gradients: matmul, tanh, matmul, cross-entropy."""
    rng = np.random.default_rng(seed)
    x, w1, w2 = rng.standard_normal((16, 12)), rng.standard_normal((12, 20)) * 0.3, \
        rng.standard_normal((20, 9)) * 0.3
    targets = rng.integers(0, 9, 16)
    tape = Tape(backend, precision=precision)
    leaves = [tape.leaf(v) for v in (x, w1, w2)]
    loss = tape.apply(CrossEntropy(targets), [tape.tanh(leaves[0] @ leaves[1]) @ leaves[2]])
    grads = tape.backward(loss)
    return [np.asarray(grads[v], np.float64) for v in leaves]


@pytest.mark.parametrize("precision", ("fp32",) + LOW)
def test_gradients_match_float64_within_the_formats_tolerance(precision):
    truth = _gradients("cpu64", None)
    got = _gradients("cpu", precision)
    errors = [np.abs(g - t).max() / np.abs(t).max() for g, t in zip(got, truth)]
    assert max(errors) <= tolerance(precision), (precision, errors)
    if precision != "fp32":  # and it really rounded: far more error than float32 makes
        assert max(errors) > 10 * tolerance("fp32"), (precision, errors)


def test_loss_scaler_skips_and_halves_on_overflow_doubles_after_clean_steps():
    s = LossScaler(scale=1024.0, interval=3)
    assert s.update(False) is False and s.scale == 512.0 and s.skipped == 1
    assert [s.update(True) for _ in range(2)] == [True, True] and s.scale == 512.0
    assert s.update(True) is True and s.scale == 1024.0 and s.clean == 0
    assert s.update(True) and s.update(False) is False and s.scale == 512.0 and s.clean == 0


def _layer_step(precision, scaler, lr=1e-2):
    layer = Linear(6, 4, backend="cpu")
    rng = np.random.default_rng(4)
    x, targets = rng.standard_normal((8, 6)), rng.integers(0, 4, 8)
    opt = AdamW(lr=lr)
    before = layer.weight.numpy().copy()
    train_step(get_backend("cpu", precision), layer, opt,
               lambda tape: tape.apply(CrossEntropy(targets), [layer(tape, tape.constant(x))]),
               scaler=scaler)
    return before, layer.weight.numpy()


def test_an_overflowing_fp16_step_is_skipped_and_the_weights_stay():
    scaler = LossScaler(scale=2.0 ** 40)  # loss·scale beyond 65,504: the gradients overflow
    before, after = _layer_step("fp16", scaler)
    assert scaler.skipped == 1 and scaler.scale == 2.0 ** 39
    np.testing.assert_array_equal(before, after)


def test_a_clean_fp16_step_updates_with_the_scale_undone():
    scaler = LossScaler(scale=2.0 ** 10)
    before, after = _layer_step("fp16", scaler)
    _, plain = _layer_step("fp32", None)
    assert scaler.skipped == 0 and scaler.clean == 1
    # AdamW's first step moves each weight by about lr, whatever the gradient's scale: the
    # scale was undone, or eps would have made the step a little larger
    np.testing.assert_allclose(after - before, plain - before, rtol=1e-3, atol=1e-5)


def test_master_weights_stay_float32_after_a_bf16_update():
    before, after = _layer_step("bf16", None, lr=1e-5)
    assert after.dtype == np.float32
    moved = after != before
    assert moved.all()
    # an update of 1e-5 on weights ~0.02 is under half a bf16 ulp: only float32 weights keep it
    assert (round_to(after, "bf16") == round_to(before, "bf16")).mean() > 0.5


def test_train_takes_a_precision_and_refuses_an_unknown_one():
    from smallem.tools.cli import build_parser
    from smallem.training import TrainConfig

    with pytest.raises(SmallemError, match="unknown precision 'fp64'"):
        TrainConfig(precision="fp64")
    args = build_parser().parse_args(["train", "--precision", "bf16"])
    assert args.precision == "bf16"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_training_run_in_a_lower_precision_keeps_float32_weights(precision):
    from smallem.training import TrainConfig, train

    config = TrainConfig(model="transformer", backend="cpu", steps=4, batch=2, precision=precision,
                         log_every=2, eval_every=4, eval_batches=1,
                         sizes={"layers": 1, "width": 16, "heads": 2, "context": 8})
    result = train(config, progress=False, log=None)
    assert result.model.parameters()[0].backend.precision == precision
    assert all(p.value.dtype == np.float32 for p in result.model.parameters())
    assert np.isfinite(result.held_out_loss) and result.to_json()["config"]["precision"] == precision


@pytest.mark.parametrize("precision", ("fp32",) + LOW)
def test_every_gradcheck_case_matches_float64_within_the_formats_tolerance(precision):
    from smallem.autodiff.gradcheck import compare_backends

    results = compare_backends(get_backend("cpu", precision), "cpu64", tolerance=tolerance(precision))
    assert len(results) > 50 and all(r.passed for r in results), [
        (r.name, r.max_error) for r in results if not r.passed]
    products = [r.max_error for r in results if "matmul" in r.name or "head" in r.name]
    if precision != "fp32":  # the products really read the format: more error than float32 makes
        assert max(products) > 10 * tolerance("fp32")


def test_gradcheck_command_takes_a_precision(capsys):
    from smallem.tools.cli import main

    assert main(["gradcheck", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "bf16 matrix inputs" in out and "6.2e-02" in out and " 0 failed" in out
    assert main(["gradcheck", "--precision", "fp8"]) != 0
    assert "unknown precision 'fp8': choose one of fp32, tf32, bf16, fp16" in capsys.readouterr().err

"""Finite differences for every primitive and operation, and the registry that demands them."""

import numpy as np
import pytest

from smallem import Tape
from smallem.autodiff.gradcheck import CASES, COVERED, TOLERANCE, check_gradients
from smallem.autodiff.operations import OPERATIONS


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule_matches_finite_differences(case):
    result = case.run("cpu64")
    assert result.elements > 0
    assert result.max_error <= TOLERANCE, f"{case.name}: max relative error {result.max_error:.2e}"


def test_every_primitive_and_operation_has_a_gradient_check():
    covered = {c.covers for c in CASES}
    missing = [name for name in COVERED if name not in covered]
    assert not missing, f"no gradient check for: {missing}"


def test_every_operation_class_is_registered():
    """An operation written in the engine's room but not decorated with @register would escape
    the registry, and with it the demand for a gradient check."""
    import importlib
    import inspect
    import pkgutil

    import smallem.autodiff as room

    modules = [importlib.import_module(f"{room.__name__}.{m.name}")
               for m in pkgutil.iter_modules(room.__path__)]
    classes = {cls.name for module in modules
               for _, cls in inspect.getmembers(module, inspect.isclass)
               if cls.__module__ == module.__name__ and hasattr(cls, "forward")
               and hasattr(cls, "backward") and getattr(cls, "name", "")}
    assert classes == set(OPERATIONS)


def test_every_rule_belongs_to_a_primitive_or_an_operation():
    """RULES is the one table backward reads: nothing in it escapes the checks above."""
    from smallem.autodiff.primitives import PRIMITIVES, RULES

    assert set(RULES) == set(PRIMITIVES) | set(OPERATIONS)
    assert all(name in Tape.__dict__ or hasattr(Tape, name) for name in PRIMITIVES)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_every_binary_op_has_all_broadcast_variants(op):
    names = {c.name for c in CASES if c.covers == op}
    for variant in ("[4,3]+[3]", "[4,3]+[4,1]", "[2,4,3]+[3]", "[4,3]+scalar"):
        assert f"{op} {variant}" in names


def test_a_wrong_rule_is_caught():
    """The checker itself must fail on a planted error, or its passes mean nothing."""
    wrong = {"tanh": lambda be, g, out, a: (be.mul(g, be.sub(1.0, out)),)}
    result = check_gradients(lambda t, a: t.tanh(a), [np.linspace(-1, 1, 6)], rules=wrong)
    assert result.max_error > 1e-2
    assert check_gradients(lambda t, a: t.tanh(a), [np.linspace(-1, 1, 6)]).passed  # one tape only


def test_a_wrong_mul_rule_fails_only_the_cases_that_use_mul():
    """gradcheck's own weighting goes through backward's starting gradient, not through the
    tape's mul and sum: a planted wrong mul stands alone (it used to fail all 49 cases)."""
    wrong = {"mul": lambda be, g, out, a, b: (be.mul(g, a), be.mul(g, b))}  # swapped
    failed = {c.name for c in CASES if not c.run(rules=wrong).passed}
    assert failed == {c.name for c in CASES if c.covers == "mul"}


def test_a_rule_of_the_wrong_shape_is_that_cases_failure_not_a_crash():
    wrong = {"sum": lambda be, g, out, a, dim, keepdim: (be.full((1, 3), 1.0),)}
    results = {c.name: c.run(rules=wrong) for c in CASES if c.covers in ("sum", "exp")}
    assert not results["sum all"].passed and "the rule of sum" in results["sum all"].error
    assert results["exp"].passed
    from smallem.autodiff.gradcheck import format_table

    assert "FAIL  (the rule of sum returned a gradient of shape [1, 3]" in format_table(
        list(results.values()))


def test_random_weights_catch_swapped_elements_that_a_plain_sum_misses():
    """A rule that swaps two gradient elements passes a plain sum, fails random weights."""

    def swapped(be, g, out, a):
        flipped = be.tensor(np.asarray(be.to_numpy(g))[::-1].copy())
        return (be.mul(be.mul(flipped, 2.0), a),)

    x = np.array([0.5, -1.0, 1.0, -0.5])  # symmetric, so swapping g's halves keeps their sum
    plain = check_gradients(lambda t, a: t.square(a), [x], weights=np.ones(4),
                            rules={"square": swapped})
    weighted = check_gradients(lambda t, a: t.square(a), [x], rules={"square": swapped})
    assert plain.max_error <= TOLERANCE
    assert weighted.max_error > 1e-2


def test_float32_cpu_agrees_with_cpu64_and_a_wrong_kernel_is_caught():
    """compare_backends: the float32 CPU's tape gradients lie within 1e-4 of cpu64's on every
    case; a backend kernel that applies a rule wrongly (planted here) fails its cases."""
    from smallem.autodiff.gradcheck import compare_backends
    from smallem.backends import get_backend

    assert all(r.passed for r in compare_backends("cpu"))
    cpu = get_backend("cpu")
    right = cpu.fused["cross_entropy"]

    def doubled(be, g, out, logits, op):  # the right forward, a backward twice too large
        return tuple(2.0 * d for d in right(be, g, out, logits, op))

    try:
        cpu.fused["cross_entropy"] = doubled
        failed = {r.name for r in compare_backends("cpu") if not r.passed}
    finally:
        cpu.fused["cross_entropy"] = right
    assert failed == {c.name for c in CASES if c.covers == "cross_entropy"}

"""Finite differences for every primitive and operation, and the registry that demands them."""

import numpy as np
import pytest

from smallem import Tape
from smallem.gradcheck import CASES, COVERED, TOLERANCE, check_gradients
from smallem.operations import OPERATIONS


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
    """An operation written in operations.py but not decorated with @register would escape the
    registry, and with it the demand for a gradient check."""
    import inspect

    from smallem import operations

    classes = {cls.name for _, cls in inspect.getmembers(operations, inspect.isclass)
               if cls.__module__ == operations.__name__ and hasattr(cls, "forward")
               and hasattr(cls, "backward") and hasattr(cls, "name")}
    assert classes == set(OPERATIONS)


def test_every_rule_belongs_to_a_listed_primitive():
    """A primitive added with a rule but left out of PRIMITIVES would escape the check above."""
    from smallem.primitives import RULES

    assert set(RULES) == set(Tape.PRIMITIVES)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_every_binary_op_has_all_broadcast_variants(op):
    names = {c.name for c in CASES if c.covers == op}
    for variant in ("[4,3]+[3]", "[4,3]+[4,1]", "[2,4,3]+[3]", "[4,3]+scalar"):
        assert f"{op} {variant}" in names


def test_a_wrong_rule_is_caught():
    """The checker itself must fail on a planted error, or its passes mean nothing."""

    class WrongTanh(Tape):
        pass

    from smallem import tape as tape_module

    right = tape_module.RULES["tanh"]
    try:
        tape_module.RULES["tanh"] = lambda B, g, out, a: (B.mul(g, B.sub(1.0, out)),)
        result = check_gradients(lambda t, a: t.tanh(a), [np.linspace(-1, 1, 6)], tape_class=WrongTanh)
    finally:
        tape_module.RULES["tanh"] = right
    assert result.max_error > 1e-2


def test_random_weights_catch_swapped_elements_that_a_plain_sum_misses():
    """A rule that swaps two gradient elements passes a plain sum, fails random weights."""
    from smallem import tape as tape_module

    def swapped(B, g, out, a):
        flipped = B.tensor(np.asarray(B.to_numpy(g))[::-1].copy())
        return (B.mul(flipped, 2.0),)

    right = tape_module.RULES["square"]
    x = np.array([0.5, -1.0, 1.0, -0.5])  # symmetric, so swapping g's halves keeps their sum
    try:
        tape_module.RULES["square"] = lambda B, g, out, a: (B.mul(swapped(B, g, out, a)[0], a),)
        plain = check_gradients(lambda t, a: t.square(a), [x], weights=np.ones(4))
        weighted = check_gradients(lambda t, a: t.square(a), [x])
    finally:
        tape_module.RULES["square"] = right
    assert plain.max_error <= TOLERANCE
    assert weighted.max_error > 1e-2


def test_float32_cpu_agrees_with_cpu64_and_a_wrong_kernel_is_caught():
    """compare_backends: the float32 CPU's tape gradients lie within 1e-4 of cpu64's on every
    case; a backend kernel that applies a rule wrongly (planted here) fails its cases."""
    from smallem.backends import get_backend
    from smallem.gradcheck import compare_backends

    assert all(r.passed for r in compare_backends("cpu"))
    cpu = get_backend("cpu")
    right = cpu.kernels["cross_entropy"]

    class Doubled:  # the right forward, a backward twice too large
        def forward(self, backend, op, inputs):
            return right.forward(backend, op, inputs)

        def backward(self, backend, op, inputs, output, grad):
            return [2.0 * g for g in right.backward(backend, op, inputs, output, grad)]

    try:
        cpu.kernels["cross_entropy"] = Doubled()
        failed = {r.name for r in compare_backends("cpu") if not r.passed}
    finally:
        cpu.kernels["cross_entropy"] = right
    assert failed == {c.name for c in CASES if c.covers == "cross_entropy"}

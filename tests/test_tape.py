"""The tape: order, accumulation, unbroadcast, leaves vs constants, and its clear errors."""

import numpy as np
import pytest

from smallem import SmallemError, Tape, get_backend, unbroadcast


def host(backend, x):
    return np.asarray(backend.to_numpy(x), dtype=np.float64)


def test_chain_rule_of_the_seed(backend):
    """c = a·b, loss = c + a  →  d loss/da = 1 + b, d loss/db = a."""
    tape = Tape(backend)
    a, b = tape.leaf(3.0), tape.leaf(-2.5)
    loss = tape.add(tape.mul(a, b), a)
    grads = tape.backward(loss)
    assert host(backend, grads[a]) == pytest.approx(1 + -2.5)
    assert host(backend, grads[b]) == pytest.approx(3.0)


def test_nodes_are_in_execution_order():
    tape = Tape()
    a = tape.leaf(2.0)
    c = a * a + a
    assert [n.name for n in tape.nodes] == ["leaf", "mul", "add"]
    assert all(max(n.inputs, default=-1) < k for k, n in enumerate(tape.nodes))
    assert c.index == len(tape) - 1


def test_value_used_twice_gets_the_sum():
    tape = Tape()
    x = tape.leaf(np.array([1.0, 2.0]))
    loss = tape.sum(tape.add(tape.mul(x, 3.0), tape.mul(x, 4.0)))
    assert host(tape.backend, tape.backward(loss)[x]).tolist() == [7.0, 7.0]


def test_replacing_instead_of_accumulating_is_wrong():
    """Pitfall 1, planted on purpose: only the last contribution would survive."""

    class Forgetful(Tape):
        def accumulate(self, grads, index, grad):
            grads[index] = grad

    tape = Forgetful()
    a, b = tape.leaf(3.0), tape.leaf(-2.5)
    grads = tape.backward(a * b + a)
    # a's last contribution (from the multiplication, b) overwrote the first (1): b, not 1 + b
    assert float(grads[a]) == pytest.approx(-2.5)


def test_broadcast_bias_gets_column_sums(backend):
    tape = Tape(backend)
    x = tape.constant(np.arange(12.0).reshape(4, 3))
    bias = tape.leaf(np.zeros(3))
    w = np.random.default_rng(0).normal(size=(4, 3))
    grads = tape.backward(tape.sum(tape.mul(tape.add(x, bias), w)))
    g = host(backend, grads[bias])
    assert g.shape == (3,)
    np.testing.assert_allclose(g, w.sum(axis=0), rtol=1e-6)


def test_unbroadcast_reduces_added_and_stretched_dimensions(cpu64):
    g = np.ones((2, 4, 3))
    assert unbroadcast(cpu64, g, (3,)).shape == (3,)
    assert unbroadcast(cpu64, g, (4, 1)).tolist() == [[6.0]] * 4
    assert unbroadcast(cpu64, g, ()).shape == () and float(unbroadcast(cpu64, g, ())) == 24.0


def test_without_unbroadcast_the_bias_gradient_has_the_wrong_shape_and_is_refused():
    class NoUnbroadcast(Tape):
        def unbroadcast(self, grad, shape):
            return grad

    tape = NoUnbroadcast()
    bias = tape.leaf(np.zeros(3))
    with pytest.raises(SmallemError, match=r"the rule of add returned a gradient of shape "
                                           r"\[4, 3\] for its input 1 of shape \[3\]"):
        tape.backward(tape.sum(tape.add(tape.constant(np.ones((4, 3))), bias)))


def test_a_custom_operation_returning_the_wrong_shape_is_named():
    """A rule's [1, 3] for a [4, 3] input used to be broadcast silently into the update."""
    from smallem.autodiff.operations import Operation

    class Bad(Operation):
        name = "bad"

        def forward(self, be, x):
            return be.mul(x, 2.0)

        def backward(self, be, grad, out, x):
            return (be.sum(grad, 0, keepdim=True),)

    from smallem.autodiff.operations import register
    from smallem.autodiff.primitives import RULES

    register(Bad)
    try:
        tape = Tape()
        x = tape.leaf(np.ones((4, 3)))
        with pytest.raises(SmallemError, match=r"the rule of bad returned a gradient of shape "
                                               r"\[1, 3\] for its input 0 of shape \[4, 3\]"):
            tape.backward(tape.sum(tape.apply(Bad(), [x])))
    finally:
        from smallem.autodiff.operations import OPERATIONS

        del OPERATIONS["bad"], RULES["bad"]


def test_a_second_backward_is_refused_once_an_optimizer_used_the_first():
    """After an update the parameters no longer match the recorded activations: a second
    backward would read new weights against stale ones (PyTorch refuses it too). Before any
    update (a notebook cell run twice) it gives the same gradients back."""
    from smallem.nn import Parameter
    from smallem.optim import SGD

    w = Parameter(np.array([2.0]))
    tape = Tape()
    loss = tape.sum(w.var(tape) * w.var(tape))
    first = tape.backward(loss)
    assert tape.backward(loss) is first and w.grad(first)[0] == 4.0
    SGD(0.1).step([w], first)
    with pytest.raises(SmallemError, match="backward already ran on tape"):
        tape.backward(loss)


def test_numpy_defers_to_vars_and_constant_powers_work():
    tape = Tape()
    a = tape.leaf(np.array([1.0, 2.0]))
    left = np.array([3.0, 4.0]) * a
    assert isinstance(left, type(a)) and len(tape) == 3  # one node, not an object array
    cube = a ** 3
    grads = tape.backward(tape.sum(left + cube))
    np.testing.assert_allclose(grads[a], [3.0 + 3.0, 4.0 + 12.0])
    with pytest.raises(SmallemError, match="the exponent must be a number"):
        a ** a


def test_planted_rules_live_on_one_tape():
    wrong = {"mul": lambda be, g, out, a, b: (g, g)}
    planted, plain = Tape(rules=wrong), Tape()
    for tape, expected in ((planted, 1.0), (plain, 3.0)):
        a = tape.leaf(2.0)
        assert float(tape.backward(a * 3.0)[a]) == expected
    with pytest.raises(SmallemError, match="'mull' is no primitive or operation"):
        Tape(rules={"mull": wrong["mul"]})


def test_backward_steps_are_backward_one_node_at_a_time():
    from smallem.autodiff.primitives import formula

    tape = Tape()
    a, b = tape.leaf(2.0), tape.leaf(3.0)
    c = a * b
    loss = c + a
    steps = list(tape.backward_steps(loss))
    assert [s.op for s in steps] == ["add", "mul"] and [s.index for s in steps] == [3, 2]
    assert steps[1].formula == formula("mul") == "c = a·b  →  da = dc·b, db = dc·a"
    assert float(steps[1].grad) == 1.0 and [float(x) for x in steps[1].contributions] == [3.0, 2.0]
    assert float(tape.gradients[a]) == 1.0 + 3.0 and float(tape.gradients[b]) == 2.0


def test_constants_receive_no_gradient():
    tape = Tape()
    a, k = tape.leaf(2.0), tape.constant(5.0)
    grads = tape.backward(a * k)
    assert grads.get(k) is None
    with pytest.raises(SmallemError, match="no gradient"):
        grads[k]


def test_gather_rows_scatter_adds_repeated_rows(backend):
    tape = Tape(backend)
    table = tape.leaf(np.arange(10.0).reshape(5, 2))
    rows = np.array([1, 3, 1, 1])
    grads = tape.backward(tape.sum(tape.gather_rows(table, rows)))
    np.testing.assert_allclose(host(backend, grads[table]), [[0, 0], [3, 3], [0, 0], [1, 1], [0, 0]])


def test_batched_matmul_weight_gradient_sums_over_the_batch(cpu64):
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(2, 4, 3)), rng.normal(size=(3, 5))
    tape = Tape(cpu64)
    wv = tape.leaf(w)
    grads = tape.backward(tape.sum(tape.matmul(tape.constant(x), wv)))
    np.testing.assert_allclose(grads[wv], x.reshape(8, 3).T @ np.ones((8, 5)))


@pytest.mark.parametrize("make, message", [
    (lambda t: t.add(t.leaf(np.ones((4, 3))), t.leaf(np.ones(4))), r"add: shapes \[4, 3\] and \[4\]"),
    (lambda t: t.matmul(t.leaf(np.ones((4, 3))), t.leaf(np.ones((4, 3)))),
     r"matmul: shapes \[4, 3\] and \[4, 3\]"),
    (lambda t: t.reshape(t.leaf(np.ones((4, 3))), (5, 2)), "reshape: cannot reshape"),
    (lambda t: t.reshape(t.leaf(np.ones((4, 3))), (-1, 5)), "reshape: cannot reshape"),
    (lambda t: t.broadcast_to(t.leaf(np.ones((4, 3))), (4, 1)), "broadcast_to: .* cannot be stretched"),
    (lambda t: t.sum(t.leaf(np.ones((4, 3))), 2), "sum: dimension 2 is out of range"),
    (lambda t: t.gather_rows(t.leaf(np.ones((4, 3))), [0, 4]),
     r"gather_rows: row indices must be integers in \[0, 4\)"),
    (lambda t: t.backward(t.leaf(np.ones(3))), "backward: the loss must be a scalar"),
    (lambda t: t.clip(t.leaf(1.0), 1.0, 0.0), "clip: low"),
])
def test_clear_errors_name_the_operation(make, message):
    with pytest.raises(SmallemError, match=message):
        make(Tape())


def test_var_of_another_tape_is_a_clear_error():
    first, second = Tape(), Tape()
    a = first.leaf(1.0)
    with pytest.raises(SmallemError, match=f"a Var of tape #{first.id} was used on tape #{second.id}"):
        second.mul(a, 2.0)


def test_closed_tape_refuses_new_nodes():
    tape = Tape()
    a = tape.leaf(1.0)
    tape.backward(a * 2.0)
    with pytest.raises(SmallemError, match="closed"):
        a * 3.0


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(SmallemError, match="unknown backend 'tpu'"):
        get_backend("tpu")


def test_tape_html_view_lists_every_node_with_gradients():
    tape = Tape()
    a, b = tape.leaf(3.0), tape.leaf(4.0)
    tape.backward(a * b + a)
    html = tape._repr_html_()
    assert html.count("<tr>") == 5 and "<b>mul</b>" in html and "<code>5</code>" in html


def test_print_and_float_of_a_var_give_its_number():
    """`print(loss)` shows the value a learner expects, `float(loss)` is that number."""
    tape = Tape(get_backend("cpu64"))
    a, b = tape.leaf(3.0), tape.leaf(-2.5)
    loss = a * b + a
    assert float(loss) == -4.5
    assert repr(loss).startswith("Var(\u22124.5, op=add, shape=()")
    matrix = tape.leaf(np.arange(40.0).reshape(8, 5))
    assert "[0, 1, 2, 3, 4, 5, …]" in str(matrix)  # a few numbers of a big tensor, not all 40
    with pytest.raises(SmallemError, match=r"one number; this one has shape \[8, 5\]"):
        float(matrix)


def test_a_rules_maths_is_read_from_the_one_table_of_rules():
    """RULES is the one table: a rule's formula is its docstring's first line (an operation's rule
    carries its backward's), with no second dict to keep in step beside it."""
    import smallem.autodiff as autodiff
    from smallem.autodiff import RULES, formula, primitives
    from smallem.autodiff.operations import OPERATIONS

    assert "FORMULAS" not in vars(autodiff) and "FORMULAS" not in vars(primitives)  # no second dict
    with pytest.warns(DeprecationWarning, match="formula"):
        assert autodiff.FORMULAS == {name: formula(name) for name in RULES}  # 0.3's name, derived
    for name, rule in RULES.items():
        assert formula(name) == rule.__doc__.strip().splitlines()[0] != name, name
    for name, cls in OPERATIONS.items():
        assert formula(name) == cls.backward.__doc__.strip().splitlines()[0], name
    assert formula("no such rule") == "no such rule"


def test_backward_calls_on_final_once_per_leaf_with_its_whole_sum():
    """The hook a data-parallel step starts its all-reduce from (smallem/ranks): a leaf's call
    comes once every use of it is differentiated, with the sum backward returns, top leaf first;
    `a`, used twice, is called with both contributions (1 + b), never with one alone."""
    tape = Tape("cpu64")
    a, b = tape.leaf(np.array(2.0)), tape.leaf(np.array(3.0))
    z = tape.add(tape.mul(a, b), a)
    calls = []
    grads = tape.backward(z, on_final=lambda index, grad: calls.append((index, float(grad))))
    assert calls == [(b.index, 2.0), (a.index, 4.0)]
    assert float(grads[a]) == 4.0 and float(grads[b]) == 2.0

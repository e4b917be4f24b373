"""Parameters bound once per tape, modules walked by name, Linear and Embedding against plain
NumPy, the Bengio MLP's 402,721 parameters, and its gradients against finite differences."""

import gc

import numpy as np
import pytest

from smallem import SmallemError, Tape
from smallem.models.bigram import Bigram, BigramConfig
from smallem.models.mlp import Mlp, MlpConfig
from smallem.nn import Embedding, Linear, Module, Parameter


def host(backend, x):
    return np.asarray(backend.to_numpy(x), dtype=np.float64)


def test_parameter_binds_one_leaf_per_tape(backend):
    p = Parameter(np.ones(3), backend)
    tape = Tape(backend)
    first, again = p.var(tape), p.var(tape)
    assert first == again and len(tape) == 1
    other = Tape(backend)
    assert p.var(other).tape is other and len(other) == 1


def test_parameter_used_twice_gets_the_sum(backend):
    p = Parameter(np.array([1.0, 2.0]), backend)
    tape = Tape(backend)
    loss = tape.sum(tape.add(tape.mul(p.var(tape), 3.0), tape.mul(p.var(tape), 4.0)))
    np.testing.assert_allclose(host(backend, p.grad(tape.backward(loss))), [7.0, 7.0])


def test_binding_keeps_no_tape_alive():
    p = Parameter(np.ones(2))
    tape = Tape()
    grads = tape.backward(tape.sum(p.var(tape)))
    del tape
    gc.collect()
    assert all(ref() is None for ref in p._readers)  # weak: the tape is gone
    np.testing.assert_allclose(p.grad(grads), [1.0, 1.0])  # its gradient is still found


def test_grad_is_found_on_its_own_tape_whatever_was_bound_since():
    """The binding belongs to the tape: a parameter read by a newer tape still finds its
    gradient in the older tape's Gradients (it used to get None, and be skipped silently)."""
    p = Parameter(np.ones(2))
    tape = Tape()
    grads = tape.backward(tape.sum(p.var(tape)))
    newer = Tape()
    p.var(newer)  # bound since to a newer tape
    np.testing.assert_allclose(p.grad(grads), [1.0, 1.0])
    other = Tape()
    assert p.grad(other.backward(other.leaf(1.0))) is None  # a tape that never read it


def test_one_default_backend_and_a_parameter_on_another_backend_is_refused():
    from smallem.backends import DEFAULT_BACKEND

    p = Parameter(np.ones(2))
    assert p.backend.name == DEFAULT_BACKEND == Tape().backend.name == "cpu64"
    assert Linear(2, 3).weight.backend.name == DEFAULT_BACKEND
    with pytest.raises(SmallemError, match=r"a parameter on backend cpu64 \(float64\) was read on "
                                           r"a tape on cpu \(float32\)"):
        p.var(Tape("cpu"))


def test_linear_matches_the_seed_example(backend):
    layer = Linear(3, 2, backend=backend)
    layer.weight.assign(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    layer.bias.assign(np.array([10.0, 20.0]))
    tape = Tape(backend)
    y = layer(tape, tape.constant(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])))
    np.testing.assert_array_equal(host(backend, y.value), [[14, 25], [20, 31]])


def test_linear_on_a_batch_of_sequences(backend):
    rng = np.random.default_rng(1)
    layer = Linear(4, 3, backend=backend, rng=rng)
    x = rng.normal(size=(2, 5, 4))  # (B, T, C)
    tape = Tape(backend)
    y = layer(tape, tape.constant(x))
    assert y.shape == (2, 5, 3)
    w = rng.normal(size=(2, 5, 3))
    grads = tape.backward(tape.sum(tape.mul(y, w)))
    np.testing.assert_allclose(host(backend, layer.weight.grad(grads)),
                               np.einsum("btc,btd->cd", x, w), rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(host(backend, layer.bias.grad(grads)), w.sum((0, 1)),
                               rtol=2e-5, atol=1e-5)


def test_embedding_rows_and_repeated_tokens(backend):
    emb = Embedding(5, 2, backend=backend, rng=np.random.default_rng(0))
    table = emb.weight.numpy()
    tape = Tape(backend)
    tokens = np.array([[1, 3, 1], [1, 0, 4]])
    out = emb(tape, tokens)
    np.testing.assert_allclose(host(backend, out.value), table[tokens], rtol=1e-6)
    grad = host(backend, emb.weight.grad(tape.backward(tape.sum(out))))
    np.testing.assert_array_equal(grad[:, 0], [1, 3, 0, 1, 1])  # token 1 read three times


def test_mlp_has_the_seed_parameters():
    model = Mlp()
    assert model.parameter_names() == ["embedding.weight", "hidden.weight", "hidden.bias",
                                       "output.weight", "output.bias"]
    assert model.parameter_count() == 402_721
    shapes = {n: p.shape for n, p in model.named_parameters()}
    assert shapes["hidden.weight"] == (512, 512) and shapes["output.weight"] == (512, 257)
    assert [p.decay for p in model.parameters()] == [False, True, False, True, False]


def test_initialisation_is_the_same_on_every_backend():
    a, b = Mlp(backend="cpu", seed=3), Mlp(backend="cpu64", seed=3)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert p.value.dtype == np.float32 and q.value.dtype == np.float64
        np.testing.assert_array_equal(p.numpy(), q.numpy().astype(np.float32), err_msg=name)
    w = b.hidden.weight.numpy()
    assert abs(w.std() - 0.02) < 0.001 and abs(w.mean()) < 0.001
    assert not b.hidden.bias.numpy().any() and not b.output.bias.numpy().any()
    assert not np.array_equal(Mlp(seed=4).hidden.weight.numpy(), a.hidden.weight.numpy())


def test_walk_names_nested_modules_and_lists():
    class Block(Module):
        def __init__(self):
            self.proj = Linear(2, 2)
            self.adapter = None  # optional parts add no name

    class Net(Module):
        def __init__(self):
            self.blocks = [Block(), Block()]
            self.head = Linear(2, 1, bias=False)
            self.label = "not a parameter"

    net = Net()
    assert net.parameter_names() == ["blocks.0.proj.weight", "blocks.0.proj.bias",
                                     "blocks.1.proj.weight", "blocks.1.proj.bias", "head.weight"]
    seen = []
    net.walk("model", lambda name, p: seen.append(name))
    assert seen[0] == "model.blocks.0.proj.weight"
    assert net.parameter_count() == 2 * (4 + 2) + 2


def test_assign_checks_the_shape():
    p = Parameter(np.zeros((2, 3)))
    with pytest.raises(SmallemError, match="'w' has shape \\[2, 3\\]"):
        p.assign(np.zeros((3, 2)), "w")


def test_mlp_gradients_match_finite_differences():
    """The whole model, wired from nn.py's layers, against central differences in float64."""
    config = MlpConfig(context=3, embed=2, hidden=4, vocab=5)
    model = Mlp(config, "cpu64", seed=1)
    for p in model.parameters():  # larger weights than 0.02, so every term matters
        p.assign(p.numpy() * 25 + 0.1)
    rng = np.random.default_rng(2)
    contexts, targets = rng.integers(0, 5, size=(6, 3)), rng.integers(0, 5, size=6)

    def loss() -> float:
        tape = Tape("cpu64")
        value = float(model.loss(tape, contexts, targets).value)
        tape.close()
        return value

    tape = Tape("cpu64")
    grads = tape.backward(model.loss(tape, contexts, targets))
    analytic = {name: p.grad(grads) for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        numeric = np.zeros(p.shape)
        for i in np.ndindex(p.shape):
            saved = p.value[i]
            p.value[i] = saved + 1e-6
            up = loss()
            p.value[i] = saved - 1e-6
            numeric[i] = (up - loss()) / 2e-6
            p.value[i] = saved
        np.testing.assert_allclose(analytic[name], numeric, rtol=1e-5, atol=1e-8, err_msg=name)


def test_bigram_reads_the_last_token_only():
    model = Bigram(BigramConfig(vocab=5), "cpu64")
    table = model.table.weight.numpy()
    tape = Tape("cpu64")
    logits = model.logits(tape, np.array([[0, 0, 3], [4, 1, 2]]))
    np.testing.assert_array_equal(logits.value, table[[3, 2]])


def _fusing_linear(dtype="float64", names=("linear",)):
    """A CPU backend of its own that declares a fused `linear` (and `linear_add`) which always
    declines: nn.Linear records the one node a GPU records, and the reference forward and rule
    compute it."""
    from smallem.backends.numpy import NumpyBackend

    be = NumpyBackend(dtype)
    be.fused_forward = {**be.fused_forward, **{name: (lambda *args: None) for name in names}}
    return be


@pytest.mark.parametrize("shape", [(5, 3), (2, 5, 3)])
def test_linear_with_a_residual_as_one_node_is_linear_then_add_bit_for_bit(shape):
    """Given a residual r, a Linear where the backend fuses `linear_add` (the GPU) is one node,
    r + (x·W + b); its reference forward and rule give exactly the numbers of the nodes recorded
    elsewhere (matmul, bias add, then r + y as the Transformer's blocks wrote it), dr = dy."""
    rng = np.random.default_rng(8)
    x, r, up = rng.normal(size=shape), rng.normal(size=shape[:-1] + (4,)), rng.normal(size=shape[:-1] + (4,))
    bias, results = rng.normal(size=4), []
    for be in ("cpu64", _fusing_linear(names=("linear", "linear_add"))):
        layer = Linear(3, 4, backend=be, rng=np.random.default_rng(1))
        layer.bias.assign(bias)
        tape = Tape(be)
        xv, rv = tape.leaf(x), tape.leaf(r)
        y = layer(tape, xv, residual=rv)
        g = tape.backward(tape.sum(tape.mul(y, tape.constant(up))))
        ops = [node.op for node in tape.nodes if node.op in ("matmul", "add", "linear", "linear_add")]
        results.append((ops, [y.value, g[xv], g[rv], layer.weight.grad(g), layer.bias.grad(g)]))
    (ops_ref, ref), (ops_one, one) = results
    assert ops_ref[:3] == ["matmul", "add", "add"] and ops_one[0] == "linear_add"
    assert "matmul" not in ops_one and "linear" not in ops_one
    for a, b in zip(ref, one):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("shape", [(5, 3), (2, 5, 3)])
def test_linear_as_one_node_is_matmul_then_add_bit_for_bit(shape):
    """Where a backend fuses `linear` (the GPU), a Linear is one node; its reference forward and
    rule give exactly the numbers of the matmul and add nodes recorded everywhere else."""
    rng = np.random.default_rng(7)
    x, up = rng.normal(size=shape), rng.normal(size=shape[:-1] + (4,))
    results = []
    for be in ("cpu64", _fusing_linear()):
        layer = Linear(3, 4, backend=be, rng=np.random.default_rng(1))
        layer.bias.assign(rng.normal(size=4) if not results else results[0][3])
        tape = Tape(be)
        xv = tape.leaf(x)
        y = layer(tape, xv)
        g = tape.backward(tape.sum(tape.mul(y, tape.constant(up))))
        ops = [node.op for node in tape.nodes if node.op in ("matmul", "add", "linear")]
        results.append((ops, y.value, [g[xv], layer.weight.grad(g), layer.bias.grad(g)],
                        layer.bias.numpy()))
    (ops_ref, y_ref, g_ref, _), (ops_one, y_one, g_one, _) = results
    assert ops_ref[:2] == ["matmul", "add"] and ops_one[0] == "linear" and "matmul" not in ops_one
    assert np.array_equal(y_ref, y_one)
    for a, b in zip(g_ref, g_one):
        assert np.array_equal(a, b)


def test_linear_records_matmul_and_add_where_rules_are_planted_or_fused_is_off():
    """A lesson planting its own matmul rule (lesson 13's engine) must find matmul nodes, and
    a tape with fused=False runs every reference rule as the lessons show them."""
    be = _fusing_linear()
    layer = Linear(3, 2, backend=be)
    mine = lambda be_, grad, out, a, b: (be_.matmul(grad, be_.transpose(b, 0, 1)), None)  # noqa: E731
    for tape in (Tape(be, rules={"matmul": mine}), Tape(be, fused=False), Tape("cpu64")):
        layer_here = layer if tape.backend is be else Linear(3, 2, backend="cpu64")
        layer_here(tape, tape.leaf(np.ones((4, 3))))
        assert [n.op for n in tape.nodes if n.op] == ["matmul", "add"]
    tape = Tape(be)
    layer(tape, tape.leaf(np.ones((4, 3))))
    assert [n.op for n in tape.nodes if n.op] == ["linear"]


def test_linear_operation_refuses_shapes_that_do_not_fit():
    from smallem.autodiff.operations import linear

    tape = Tape("cpu64")
    with pytest.raises(SmallemError, match=r"linear: input \[4, 3\] needs a weight \[3, N\]"):
        linear(tape, tape.leaf(np.ones((4, 3))), tape.leaf(np.ones((2, 5))), tape.leaf(np.ones(5)))
    with pytest.raises(SmallemError, match="bias"):
        linear(tape, tape.leaf(np.ones((4, 3))), tape.leaf(np.ones((3, 5))), tape.leaf(np.ones(4)))

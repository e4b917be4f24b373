"""The GPU kernel room (backends/cuda/) read without a GPU: every kernel the Python looks up is
defined in the CUDA sources, all_sources() holds every source, and the one fused table names
real rules with the rule contract's signatures. Then, on a GPU, every table entry against its
reference rule, from cases this file keeps for each entry (a new entry without one fails here).
"""

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import numpy as np
import pytest

from smallem import Tape
from smallem.autodiff.attention import Attention
from smallem.autodiff.operations import (
    OPERATIONS,
    CrossEntropy,
    LayerNorm,
    Linear,
    LinearAdd,
    Softmax,
)
from smallem.autodiff.primitives import PRIMITIVES, RULES
from smallem.autodiff.qkv_attention import QkvAttention
from smallem.backends import cuda, gpu_available
from smallem.backends.cuda import optimizers

ROOM = Path(cuda.__file__).parent
# (a kernel may name its launch bounds before or after its type: attention_mma.py's forward at
# D 64, attention_f32.py's kernels)
BOUNDS = r"(?:__launch_bounds__\([^)]*\)\s+)?"
DEFINED = re.compile(r'extern\s+"C"\s+__global__\s+' + BOUNDS + r"void\s+" + BOUNDS + r"(\w+)\s*\(")


def defined(source: str) -> set[str]:
    return set(DEFINED.findall(source))


def _lookups(tree: ast.AST, namespace: dict, table: dict | None = None) -> list[tuple[str, str, int]]:
    """(kernel name, source, line) of every kernel looked up by name in a module: kernel(SOURCE,
    name) and elementwise(name), a name given as a literal or as an f-string whose one
    placeholder is a parameter of the function around it, filled with every literal that
    callers of that function pass (self._binary("add", ...) -> binary_add), or, for a function
    named in `table`, with each name the table gives it (cupy.py's `_unary`: UNARY's keys)."""
    callers: dict[str, list[str]] = {fn: list(names) for fn, names in (table or {}).items()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", None)
            callers.setdefault(fn, []).append(node.args[0].value)
    found = []

    def visit(node: ast.AST, function: ast.FunctionDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            visit(child, child if isinstance(child, ast.FunctionDef) else function)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            return
        if node.func.id == "kernel" and len(node.args) == 2:
            if not isinstance(node.args[0], ast.Name):  # optimizers.py's source(k): own test
                return
            source, name = namespace[node.args[0].id], node.args[1]
        elif node.func.id == "elementwise" and len(node.args) == 1:
            source, name = cuda.elementwise.SOURCE, node.args[0]
        else:
            return
        if isinstance(name, ast.Constant):
            found.append((name.value, source, node.lineno))
            return
        params = [a.arg for a in function.args.args] if function else []
        if isinstance(name, ast.Name) and name.id in params:  # a helper passing its argument on
            return  # (elementwise(name)): its callers are scanned instead
        assert isinstance(name, ast.JoinedStr), f"line {node.lineno}: a kernel name I cannot read"
        holes = [v.value.id for v in name.values if isinstance(v, ast.FormattedValue)]
        assert len(holes) == 1 and function is not None, f"line {node.lineno}: one placeholder"
        assert holes[0] in [a.arg for a in function.args.args], f"line {node.lineno}"
        values = callers.get(function.name, [])
        assert values, f"line {node.lineno}: no caller of {function.name} passes a literal name"
        for value in values:
            text = "".join(str(value) if isinstance(v, ast.FormattedValue) else v.value
                           for v in name.values)
            found.append((text, source, node.lineno))

    visit(tree, None)
    return found


def missing_kernels(path: Path, namespace: dict, table: dict | None = None) -> list[str]:
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{line}: {name}" for name, source, line in _lookups(tree, namespace, table)
            if name not in defined(source)]


CUPY_TABLE = {"_unary": cuda.elementwise.UNARY}  # cupy.py's unary methods come from this table


def _room_modules():
    return [importlib.import_module(f"smallem.backends.cuda.{m.name}")
            for m in pkgutil.iter_modules([str(ROOM)])]


def test_every_kernel_looked_up_in_python_is_defined_in_its_source():
    """Each room file against its own SOURCE; cupy.py's elementwise launches (unary_<name>,
    binary_<name>_scalar_a, ...) against elementwise.py's."""
    missing, count = [], 0
    for module in _room_modules():
        path = Path(module.__file__)
        missing += missing_kernels(path, vars(module))
        count += len(_lookups(ast.parse(path.read_text()), vars(module)))
    cupy_py = ROOM.parent / "cupy.py"
    missing += missing_kernels(cupy_py, {}, CUPY_TABLE)
    count += len(_lookups(ast.parse(cupy_py.read_text()), {}, CUPY_TABLE))
    assert count > 25  # the scan really found the launches (unary and binary names included)
    assert missing == []


def test_every_defined_kernel_is_launched():
    """No dead kernel: each one defined in a room file's SOURCE is looked up by name somewhere."""
    used = set()
    for module in _room_modules():
        used |= {n for n, *_ in _lookups(ast.parse(Path(module.__file__).read_text()),
                                         vars(module))}
    used |= {n for n, *_ in _lookups(ast.parse((ROOM.parent / "cupy.py").read_text()), {},
                                     CUPY_TABLE)}
    unused = set().union(*(defined(m.SOURCE) for m in _room_modules() if hasattr(m, "SOURCE")))
    assert unused - used == set()


def test_the_name_scan_finds_a_kernel_that_is_not_defined(tmp_path):
    """The scan above can fail: a planted lookup of a kernel no source defines is reported,
    literal or through a caller's name."""
    planted = tmp_path / "planted.py"
    planted.write_text('def f(x):\n    return kernel(SOURCE, "softmax_fwd")\n\n'
                       'def g(name):\n    return elementwise(f"unary_{name}")\n\n'
                       'g("exp")\ng("cube")\n')
    namespace = {"SOURCE": cuda.softmax.SOURCE}
    assert missing_kernels(planted, namespace) == ["planted.py:2: softmax_fwd",
                                                   "planted.py:5: unary_cube"]


def test_every_optimizer_kernel_is_defined_for_every_slot_count():
    for kind, (source, name) in optimizers.KINDS.items():
        for k in range(1, optimizers.MAX_SLOTS + 1):
            assert name.format(k=k) in defined(source(k)), (kind, k)


def test_every_finite_check_kernel_is_defined_for_every_slot_count():
    from smallem.backends.cuda import scaler

    for k in range(1, optimizers.MAX_SLOTS + 1):
        assert f"find_nonfinite_{k}" in defined(scaler.check_source(k)), k
    assert set(scaler.sources().values()) <= set(cuda.all_sources().values())


def test_all_sources_holds_every_source_of_the_room():
    """Every room file with a SOURCE and every optimizer kernel: what compile_kernels.py and a
    compile check read. Each kernel is defined once across them."""
    sources = cuda.all_sources()
    held = set(sources.values())
    for module in _room_modules():
        if hasattr(module, "SOURCE"):
            assert module.SOURCE in held, module.__name__
    assert set(optimizers.sources().values()) <= held
    names = [n for s in sources.values() for n in DEFINED.findall(s)]
    assert len(names) == len(set(names))


def test_the_shared_header_is_defined_once():
    """HEADER, F32, fast and the compile cache live in common.py; no other room file redefines
    them (two caches would compile a source twice)."""
    for module in _room_modules():
        if module is cuda.common:
            continue
        text = Path(module.__file__).read_text()
        for pattern in (r"^HEADER\s*=", r"^F32\s*=", r"^def fast\(", r"^def _fast\(", r"@cache\n"
                        r"def (compiled|_module)\(", r"^_empty\s*=", r"cupy\.RawModule"):
            assert not re.search(pattern, text, re.M), (module.__name__, pattern)


# the fused table -------------------------------------------------------------------------------
def _arity(fn) -> int | None:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


@pytest.mark.parametrize("name", list(cuda.FUSED))
def test_each_fused_rule_names_a_reference_rule_and_follows_its_contract(name):
    """(be, grad, out, *inputs, *args): a primitive's fused rule takes what RULES[name] takes;
    an operation's takes its backward's arguments and the operation (in self's place)."""
    assert name in RULES, f"fused[{name!r}] has no reference rule"
    fn = cuda.FUSED[name]
    assert list(inspect.signature(fn).parameters)[:3] == ["be", "grad", "out"]
    want = _arity(OPERATIONS[name].backward) if name in OPERATIONS else _arity(RULES[name])
    assert name in OPERATIONS or name in PRIMITIVES
    assert _arity(fn) == want


@pytest.mark.parametrize("name", list(cuda.FUSED_FORWARD))
def test_each_fused_forward_names_an_operation_and_takes_its_inputs(name):
    assert name in OPERATIONS, f"fused_forward[{name!r}] is no operation"
    fn = cuda.FUSED_FORWARD[name]
    assert list(inspect.signature(fn).parameters)[0] == "be"
    assert _arity(fn) == _arity(OPERATIONS[name].forward)  # (be, *inputs, op) for (self, be, ...)


def test_call_counts_read_the_table():
    """Notebook 10's counts fuse what the GPU fuses: tools/calls.py derives its names."""
    from smallem.tools.calls import GPU_FUSED

    assert GPU_FUSED == cuda.fused_names()
    assert set(GPU_FUSED) == set(cuda.FUSED) | set(cuda.FUSED_FORWARD)


def test_a_backend_table_that_differs_from_the_rooms_is_refused():
    cuda.check_table(dict(cuda.FUSED), dict(cuda.FUSED_FORWARD))
    with pytest.raises(RuntimeError, match=r"fused table differs .* \['relu'\]"):
        cuda.check_table({**cuda.FUSED, "relu": cuda.FUSED["tanh"]}, cuda.FUSED_FORWARD)
    with pytest.raises(RuntimeError, match=r"fused_forward table differs .* \['softmax'\]"):
        cuda.check_table(cuda.FUSED, {**cuda.FUSED_FORWARD,
                                      "softmax": cuda.FUSED_FORWARD["layer_norm"]})


# every table entry has a case: on a GPU, fused against cpu64's reference ------------------------
def _rng():
    return np.random.default_rng(31)


CASES = {  # name -> (build(tape, *leaves) -> Var, inputs)
    "add": (lambda t, x, b: t.add(x, b), [_rng().normal(size=(4, 8, 16)), _rng().normal(size=16)]),
    "tanh": (lambda t, x: t.tanh(x), [_rng().normal(size=(64, 33))]),
    "gelu": (lambda t, x: t.gelu(x), [2 * _rng().normal(size=(8, 65))]),
    "matmul": (lambda t, x, w: t.matmul(x, w), [_rng().normal(size=(4, 8, 16)),
                                                _rng().normal(size=(16, 12))]),
    "cross_entropy": (lambda t, x: t.apply(CrossEntropy(_rng().integers(0, 257, 64)), [x]),
                      [10 * _rng().normal(size=(64, 257))]),
    "softmax": (lambda t, x: t.apply(Softmax(causal=True), [x]), [_rng().normal(size=(2, 3, 16, 16))]),
    "layer_norm": (lambda t, x, w, b: t.apply(LayerNorm(), [x, w, b]),
                   [3 + _rng().normal(size=(4, 7, 48)), _rng().normal(size=48),
                    _rng().normal(size=48)]),
    "linear": (lambda t, x, w, b: t.apply(Linear(), [x, w, b]),
               [_rng().normal(size=(4, 8, 16)), _rng().normal(size=(16, 12)), _rng().normal(size=12)]),
    "linear_add": (lambda t, x, w, b, r: t.apply(LinearAdd(), [x, w, b, r]),
                   [_rng().normal(size=(4, 8, 16)), _rng().normal(size=(16, 12)),
                    _rng().normal(size=12), _rng().normal(size=(4, 8, 12))]),
    "attention": (lambda t, q, k, v: t.apply(Attention(causal=True), [q, k, v]),
                  [_rng().normal(size=(2, 3, 70, 32)) for _ in range(3)]),
    "qkv_attention": (lambda t, x, *ps: t.apply(QkvAttention(2), [x, *ps]),
                      [_rng().normal(size=(2, 70, 64))] + [0.2 * _rng().normal(size=s) for s in
                                                           [(64, 64), (64,)] * 3]),
}


def test_every_table_entry_has_a_case_that_runs_it():
    """A kernel added to the table without a case here fails; each case makes a node of that
    name (checked on cpu64, so on any machine)."""
    assert set(CASES) == set(cuda.fused_names())
    for name, (build, inputs) in CASES.items():
        tape = Tape("cpu64")
        build(tape, *[tape.leaf(x) for x in inputs])
        assert name in [node.op for node in tape.nodes], name


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")
@pytest.mark.parametrize("name", list(CASES))
def test_every_fused_entry_runs_fused_and_matches_the_reference(name, monkeypatch):
    """Every entry, those a switch leaves out by default too (a backend of its own with every
    switch on)."""
    from smallem.backends.cuda import linear
    from smallem.backends.cupy import CupyBackend

    for switch in ("EPILOGUES", "RESIDUAL"):
        monkeypatch.setattr(linear, switch, True)
    build, inputs = CASES[name]
    results = []
    for backend in (CupyBackend(), "cpu64"):
        tape = Tape(backend)
        leaves = [tape.leaf(x) for x in inputs]
        out = build(tape, *leaves)
        up = np.random.default_rng(5).normal(size=out.shape)
        loss = tape.sum(tape.mul(out, tape.constant(up)))
        steps = list(tape.backward_steps(loss))
        be = tape.backend
        results.append((be.to_numpy(out.value), [be.to_numpy(tape.gradients[v]) for v in leaves],
                        any(s.op == name and s.fused for s in steps)))
    (out32, grads32, fused), (out64, grads64, reference_fused) = results
    assert (fused, reference_fused) == (name in cuda.FUSED, False)
    scale = max(1.0, float(np.abs(out64).max()))
    np.testing.assert_allclose(out32, out64, rtol=1e-4, atol=2e-5 * scale)
    for got, want in zip(grads32, grads64):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * max(1.0, np.abs(want).max()))

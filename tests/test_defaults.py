"""Every default is written once: the vocabulary (data.VOCAB), the batch size
(training.registry.BATCH), the bench's steps, warm-up and block (tools.bench), the backend
`smallem sample` and `load_model` use (backends.DEFAULT_BACKEND), Adam's betas and ε (optim),
LayerNorm's ε (autodiff.operations), the held-out batches and the health interval
(training.config), the MLP's window (data.CONTEXT). The sources are read as syntax trees, so a
number in a comment, a docstring, a message or a learner's solution text does not count, and 256
counts only where it is a batch size (it is also the number of byte values, and data.BOUNDARY)."""

import ast
import inspect
from pathlib import Path

import smallem
from smallem.backends import DEFAULT_BACKEND
from smallem.data import BOUNDARY, VOCAB
from smallem.tools import bench
from smallem.tools.cli import build_parser
from smallem.training import TrainConfig, load_model
from smallem.training.config import BATCH, EVAL_BATCHES, HEALTH_EVERY

PACKAGE = Path(smallem.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))  # the course included: its graders read the same constants


def bound_numbers(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(name, value, line) for every int written as the value of a name: a parameter's default,
    a keyword argument, an assignment (annotated or not, the whole right-hand side), and
    argparse's `add_argument("--name", default=...)`."""
    out = []

    def ints(node: ast.AST) -> list[ast.Constant]:
        return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and type(n.value) is int]

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            out += [(arg.arg, c.value, c.lineno) for arg, d in pairs for c in ints(d)]
        elif isinstance(node, ast.Call):
            flag = (node.args[0].value.lstrip("-") if node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) else None)
            for k in node.keywords:
                name = flag if k.arg == "default" and flag else k.arg
                out += [(name or "", c.value, c.lineno) for c in ints(k.value)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            if node.value is not None:
                out += [(name, c.value, c.lineno) for name in names for c in ints(node.value)]
    return out


def literal_uses(value: int, named: callable, skip: set[tuple[str, str]] = frozenset(),
                 sources: list[Path] = SOURCES) -> list[str]:
    found = []
    for path in sources:
        where = str(path.relative_to(PACKAGE))
        for name, v, line in bound_numbers(ast.parse(path.read_text())):
            if v == value and named(name) and (where, name) not in skip:
                found.append(f"{where}: {name} = {value} (line {line})")
    return sorted(set(found))


def test_the_vocabulary_is_written_once():
    assert VOCAB == BOUNDARY + 1 == 257
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value == 257:
                found.append(f"{path.relative_to(PACKAGE)} (line {node.lineno})")
    assert [f.split()[0] for f in found] == ["data.py"], f"write data.VOCAB instead of 257: {found}"


def test_the_batch_size_is_written_once():
    assert BATCH == 256 and TrainConfig().batch == BATCH
    found = literal_uses(256, lambda name: "batch" in name.lower())
    assert [f.split(" (line")[0] for f in found] == ["training/registry.py: BATCH = 256"], \
        f"read training.registry.BATCH: {found}"


def test_the_bench_defaults_are_written_once():
    defaults = {"steps": bench.STEPS, "warmup": bench.WARMUP, "block": bench.BLOCK}
    assert defaults == {"steps": 500, "warmup": 50, "block": 50}
    found = []
    for value in set(defaults.values()):
        found += literal_uses(value, lambda name: name.lower() in defaults,
                              skip={("tools/bench.py", n.upper()) for n in defaults})
    found = [f for f in found if f.startswith("tools/")]
    assert not found, f"read tools.bench.STEPS, WARMUP, BLOCK: {found}"
    args = build_parser().parse_args(["bench"])
    assert {k: getattr(args, k) for k in defaults} == defaults


def test_sample_and_load_model_default_to_one_backend():
    args = build_parser().parse_args(["sample", "--checkpoint", "run.npz"])
    assert args.backend == DEFAULT_BACKEND
    assert inspect.signature(load_model).parameters["backend"].default == DEFAULT_BACKEND


def float_uses(value: float) -> list[str]:
    """Every float `value` written in the package's code (strings, a solution's text, do not
    count), as "where (line n)"."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is float and node.value == value:
                found.append(f"{path.relative_to(PACKAGE)} (line {node.lineno})")
    return found


def test_adams_betas_and_epsilon_are_written_once():
    from smallem.optim import ADAMW_BETAS, ADAMW_EPS, AdamW
    from smallem.tools.bench_reference import HandMlp

    assert ADAMW_BETAS == (0.9, 0.999) and ADAMW_EPS == 1e-8
    for value in (0.999, 1e-8):
        assert [f.split()[0] for f in float_uses(value)] == ["optim.py"], \
            f"read optim.ADAMW_BETAS and ADAMW_EPS: {float_uses(value)}"
    betas = [f for f in float_uses(0.9) if f.split()[0] != "optim.py"]
    named = []
    for path in SOURCES:
        for name, v, line in bound_floats(ast.parse(path.read_text())):
            if v == 0.9 and "beta" in name.lower() and path.name != "optim.py":
                named.append(f"{path.relative_to(PACKAGE)}: {name} (line {line})")
    assert not named, f"read optim.ADAMW_BETAS: {named} (0.9 elsewhere: {betas})"
    adamw = AdamW()
    assert (adamw.beta1, adamw.beta2, adamw.eps) == (*ADAMW_BETAS, ADAMW_EPS)
    assert inspect.signature(HandMlp).parameters["betas"].default is ADAMW_BETAS


def bound_floats(tree: ast.AST) -> list[tuple[str, float, int]]:
    """(name, value, line) for every float given as a parameter's default or a keyword."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            out += [(arg.arg, c.value, c.lineno) for arg, d in pairs for c in ast.walk(d)
                    if isinstance(c, ast.Constant) and type(c.value) is float]
        elif isinstance(node, ast.Call):
            out += [(k.arg or "", c.value, c.lineno) for k in node.keywords for c in ast.walk(k.value)
                    if isinstance(c, ast.Constant) and type(c.value) is float]
    return out


def test_layer_norms_epsilon_is_written_once():
    from smallem.autodiff.operations import LAYER_NORM_EPS, LayerNorm
    from smallem.nn import LayerNorm as Module

    assert LAYER_NORM_EPS == 1e-5
    # Other numbers that happen to be equal: gradcheck's EPSILON (the finite-difference step) and
    # lesson 6's scale of small gradients (where ε's place in AdamW shows).
    assert sorted(f.split()[0] for f in float_uses(1e-5)) == \
        ["autodiff/gradcheck.py", "autodiff/operations.py", "course/l06_adamw/exercises.py"], float_uses(1e-5)
    assert LayerNorm().eps == Module(3, backend="cpu64").eps == LAYER_NORM_EPS


def test_the_runs_defaults_are_written_once():
    """The held-out batches, the health interval and the MLP's window."""
    from smallem.data import CONTEXT
    from smallem.models import MlpConfig
    from smallem.tools.figures import Runs
    from smallem.training.health import HealthMonitor

    assert (EVAL_BATCHES, HEALTH_EVERY, CONTEXT) == (32, 100, 16)
    for value, names, home in ((EVAL_BATCHES, {"eval_batches"}, "training/config.py: EVAL_BATCHES"),
                               (HEALTH_EVERY, {"every", "health-every"},
                                "training/config.py: HEALTH_EVERY"),
                               (CONTEXT, {"context"}, "data.py: CONTEXT")):
        found = literal_uses(value, lambda name: name.lower() in names | {home.split()[-1].lower()},
                             sources=SOURCES)
        assert [f.split(" =")[0] for f in found] == [home], f"read {home.split()[-1]}: {found}"
    assert TrainConfig().eval_batches == Runs().eval_batches == EVAL_BATCHES
    assert build_parser().parse_args(["train"]).health_every == HEALTH_EVERY
    assert inspect.signature(HealthMonitor).parameters["every"].default == HEALTH_EVERY
    assert MlpConfig().context == CONTEXT


def test_no_batch_is_drawn_at_a_size_written_on_the_spot():
    """The batch argument of every call that draws batches is a name (BATCH, EVAL_BATCH, a
    parameter), never a number: the capstone's held-out batch once read 256 by hand."""
    makers = {"fixed_batches", "held_out_sequences", "BatchSampler", "SequenceSampler",
              "distinct_batch", "sequence_batches"}
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if called in makers:
                given = node.args[1:2] + [k.value for k in node.keywords if k.arg == "batch"]
                found += [f"{path.relative_to(PACKAGE)} (line {node.lineno}): {called}"
                          for a in given if isinstance(a, ast.Constant)]
    assert not found, f"pass BATCH or EVAL_BATCH: {found}"

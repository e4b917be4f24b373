"""A small mutator of Python source, for testing the graders (tests/test_mutants.py): each mutant
is the solution cell with one small change a learner could make (an operator swapped, a constant
or an axis off by one, a term dropped, arguments or outputs reordered, a rounding swapped, a
guard or a statement removed). Mutants are made from the AST and written back as source."""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_OPS = {ast.Add: [ast.Sub, ast.Mult], ast.Sub: [ast.Add], ast.Mult: [ast.Div, ast.Add],
        ast.Div: [ast.Mult, ast.FloorDiv], ast.FloorDiv: [ast.Div, ast.Mod], ast.Mod: [ast.FloorDiv],
        ast.Pow: [ast.Mult], ast.MatMult: [ast.Mult]}
_COMPARE = {ast.Lt: [ast.LtE, ast.Gt], ast.LtE: [ast.Lt, ast.GtE], ast.Gt: [ast.GtE, ast.Lt],
            ast.GtE: [ast.Gt, ast.LtE], ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq], ast.In: [ast.NotIn],
            ast.NotIn: [ast.In], ast.Is: [ast.IsNot], ast.IsNot: [ast.Is]}
# a function swapped for its neighbour: a rounding mode, a reduction, a direction
_NAMES = {"min": "max", "max": "min", "sum": "mean", "mean": "sum", "floor": "ceil", "ceil": "floor",
          "round": "floor", "rint": "trunc", "trunc": "rint", "argmax": "argmin", "argmin": "argmax",
          "exp": "exp2", "sqrt": "abs", "log": "log2", "maximum": "minimum", "minimum": "maximum",
          "zeros_like": "ones_like", "ones": "zeros", "zeros": "ones", "any": "all", "all": "any",
          "float32": "float64", "float64": "float32", "uint32": "int32", "int": "round"}


@dataclass(frozen=True)
class Mutant:
    line: int
    what: str  # "line 3: + -> -"
    source: str


def _statement_lists(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        value = getattr(node, name, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            yield value


def _docstring(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _changes(node: ast.AST) -> Iterator[tuple[str, Callable[[ast.AST], ast.AST | None]]]:
    """(description, change) for each mutation of `node`; a change edits the node (a copy) in place
    and returns what replaces it (None: the node itself)."""
    text = ast.unparse(node) if not isinstance(node, ast.stmt) else ""
    if isinstance(node, ast.BinOp):
        for new in _OPS.get(type(node.op), []):
            yield (f"{type(node.op).__name__} -> {new.__name__} in {text}",
                   lambda n, new=new: setattr(n, "op", new()))
        yield f"{text} -> {ast.unparse(node.left)} (a term dropped)", lambda n: n.left
        yield f"{text} -> {ast.unparse(node.right)} (a term dropped)", lambda n: n.right
    elif isinstance(node, ast.AugAssign):
        for new in _OPS.get(type(node.op), []):
            yield f"{type(node.op).__name__}= -> {new.__name__}= in {ast.unparse(node)}", \
                lambda n, new=new: setattr(n, "op", new())
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        yield f"{text} -> {ast.unparse(node.operand)} (sign or not dropped)", lambda n: n.operand
    elif isinstance(node, ast.Compare):
        for new in _COMPARE.get(type(node.ops[0]), []):
            yield f"{type(node.ops[0]).__name__} -> {new.__name__} in {text}", \
                lambda n, new=new: n.ops.__setitem__(0, new())
    elif isinstance(node, ast.BoolOp):
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield f"{type(node.op).__name__} -> {other.__name__} in {text}", lambda n: setattr(n, "op", other())
        for k in range(len(node.values)):
            yield f"{text}: operand {k} dropped", lambda n, k=k: (
                ast.BoolOp(n.op, n.values[:k] + n.values[k + 1:]) if len(n.values) > 2 else n.values[1 - k])
    elif isinstance(node, ast.Constant) and not isinstance(node.value, str) and node.value is not None \
            and node.value is not Ellipsis:
        v = node.value
        if isinstance(v, bool):
            yield f"{v} -> {not v}", lambda n: setattr(n, "value", not v)
        elif isinstance(v, int):
            for new in (v + 1, v - 1):
                yield f"constant {v} -> {new}", lambda n, new=new: setattr(n, "value", new)
        elif isinstance(v, float):
            new = v * 2 if v else 1.0
            yield f"constant {v!r} -> {new!r}", lambda n: setattr(n, "value", new)
    elif isinstance(node, (ast.Tuple, ast.List)) and isinstance(node.ctx, ast.Load) and len(node.elts) >= 2:
        for k in range(len(node.elts) - 1):
            yield f"elements {k}, {k + 1} of {text} swapped", lambda n, k=k: n.elts.__setitem__(
                slice(k, k + 2), [n.elts[k + 1], n.elts[k]])
    elif isinstance(node, ast.Call):
        for k in range(len(node.args) - 1):
            if not any(isinstance(a, ast.Starred) for a in node.args[k:k + 2]):
                yield f"arguments {k}, {k + 1} of {text} swapped", lambda n, k=k: n.args.__setitem__(
                    slice(k, k + 2), [n.args[k + 1], n.args[k]])
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in _NAMES:
            def rename(n: ast.Call, new: str = _NAMES[name]) -> None:
                if isinstance(n.func, ast.Attribute):
                    n.func.attr = new
                else:
                    n.func.id = new
            yield f"{name} -> {_NAMES[name]} in {text}", rename
    elif isinstance(node, ast.Attribute) and node.attr in ("float32", "float64", "uint32", "T"):
        if node.attr == "T":
            yield f"{text} -> {ast.unparse(node.value)} (transpose dropped)", lambda n: n.value
        else:
            yield f"{node.attr} -> {_NAMES[node.attr]}", lambda n: setattr(n, "attr", _NAMES[n.attr])
    elif isinstance(node, ast.If):
        yield f"guard `if {ast.unparse(node.test)}` removed (its body never runs)", \
            lambda n: n.orelse or [ast.Pass()]
        yield f"guard `if {ast.unparse(node.test)}` always taken", lambda n: n.body
    elif isinstance(node, ast.IfExp):
        yield f"{text} -> its `if` value always", lambda n: n.body
        yield f"{text} -> its `else` value always", lambda n: n.orelse
    elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr, ast.Break, ast.Continue)) \
            and not _docstring(node):
        yield f"statement `{ast.unparse(node)}` deleted", lambda n: [ast.Pass()]


def mutants(source: str) -> list[Mutant]:
    """Every single-change mutant of `source`, in a fixed order, without duplicates or mutants that
    do not compile."""
    tree = ast.parse(source)
    count = sum(1 for _ in ast.walk(tree))
    seen, found = {ast.unparse(tree)}, []
    for k in range(count):
        node = list(ast.walk(tree))[k]
        for what, change in list(_changes(node)):
            copied = copy.deepcopy(tree)
            target = list(ast.walk(copied))[k]
            parent = _parent(copied, target)
            replacement = change(target)
            if replacement is not None and replacement is not target:
                _replace(parent, target, replacement)
            ast.fix_missing_locations(copied)
            try:
                text = ast.unparse(copied)
                compile(text, "<mutant>", "exec")
            except (SyntaxError, ValueError, TypeError, AttributeError):
                continue
            if text not in seen:
                seen.add(text)
                line = getattr(node, "lineno", 0)
                found.append(Mutant(line, f"line {line}: {what}", text))
    return found


def _parent(tree: ast.AST, target: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if child is target:
                return node
    raise LookupError("the node has no parent")


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST | list) -> None:
    for field, value in ast.iter_fields(parent):
        if isinstance(value, list) and any(v is old for v in value):
            k = next(i for i, v in enumerate(value) if v is old)
            value[k:k + 1] = new if isinstance(new, list) else [new]
            return
        if value is old:
            if isinstance(new, list):  # a statement's place wants one statement
                raise ValueError("a list where one node goes")
            setattr(parent, field, new)
            return

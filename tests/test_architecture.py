"""The layering DESIGN.md promises, read from the sources: backends never import the tape,
and the package's module-level imports have no circle."""

import ast
from pathlib import Path

import smallem

PACKAGE = Path(smallem.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path) -> set[str]:
    """smallem modules imported at module level (not inside functions or TYPE_CHECKING)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("smallem")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("smallem"):
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in found if m in modules and m != name}


GRAPH = {module_name(p): top_level_imports(p) for p in PACKAGE.rglob("*.py")}


def test_no_backend_module_imports_the_tape_or_the_rules():
    """Not even lazily, inside a function (the GPU's tanh rule once did, for its fallback)."""
    for path in (PACKAGE / "backends").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert node.module not in ("tape", "primitives", "operations"), path.name


def test_no_import_circle():
    def visit(name, path):
        for dep in GRAPH.get(name, ()):
            if dep.startswith(name + "."):  # a package importing its own submodules
                continue
            assert dep not in path, " → ".join(path + [dep])
            visit(dep, path + [dep])

    for name in GRAPH:
        visit(name, [name])


def test_the_tape_looks_a_rule_up_in_one_place():
    source = (PACKAGE / "tape.py").read_text()
    assert source.count("RULES[") == 1 and source.count(".fused.get(") == 2  # rule; forward

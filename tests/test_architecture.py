"""The layering DESIGN.md promises, read from the sources: the rooms are folders, backends never
import the tape, and no module imports another that imports it back, at module level or inside a
function (a lazy import is still a dependency)."""

import ast
from pathlib import Path

import smallem

PACKAGE = Path(smallem.__file__).parent
ROOMS = {"autodiff", "backends", "models", "training", "lessons", "exercises", "tools"}
LIBRARY = {"nn.py", "optim.py", "data.py", "errors.py", "tokens.py"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """smallem modules `path` imports anywhere: at module level, inside functions, under
    TYPE_CHECKING alike. `from x import name` counts x, and x.name when that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
    return {m for m in found if m in MODULES and m != name}


GRAPH = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_the_listing_shows_the_rooms():
    top = {p.name for p in PACKAGE.iterdir() if not p.name.startswith("__")}
    assert ROOMS <= top, sorted(ROOMS - top)
    loose = {n for n in top if n.endswith(".py")} - LIBRARY
    assert not loose, f"modules outside a room: {sorted(loose)}"


def test_no_backend_module_imports_the_tape_or_the_rules():
    for name, deps in GRAPH.items():
        if name.startswith("smallem.backends"):
            assert not {d for d in deps if d.startswith("smallem.autodiff")}, name


def test_nothing_in_the_package_imports_the_tools_or_the_lessons():
    """`smallem/__main__.py` is exempt: it is the command line itself (`python -m smallem`
    runs tools.cli), and nothing imports it."""
    for name, deps in GRAPH.items():
        if name.startswith(("smallem.tools", "smallem.lessons", "smallem.exercises",
                            "smallem.__main__")):
            continue
        bad = {d for d in deps if d.startswith(("smallem.tools", "smallem.lessons"))}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_no_import_circle():
    """Depth-first over every import, lazy ones included; a package's __init__ importing its
    own submodules is how rooms export, not a circle."""
    def visit(name, path):
        for dep in GRAPH.get(name, ()):
            if dep.startswith(name + "."):
                continue
            assert dep not in path, " → ".join(path + [dep])
            visit(dep, path + [dep])

    for name in GRAPH:
        visit(name, [name])


def test_the_tape_looks_a_rule_up_in_one_place():
    source = (PACKAGE / "autodiff" / "tape.py").read_text()
    for lookup in ("RULES[", ".fused.get(", ".fused_forward.get("):
        assert source.count(lookup) == 1, lookup

"""benchmarks/ holds tools that still run, on the CPU as far as a CPU can check: every script
compiles, every `smallem` import it makes resolves (the module exists and defines each name it
takes, read from the sources, so GPU-only modules are checked without CuPy), every shell script
parses and names only scripts that exist, and benchmarks/README.md lists every tool."""

from __future__ import annotations

import ast
import py_compile
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import smallem

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
PACKAGE = Path(smallem.__file__).parent
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
SHELL = sorted(BENCHMARKS.glob("*.sh"))


def source_of(module: str) -> Path | None:
    """The file of a smallem module (a package's __init__.py), or None."""
    base = PACKAGE.parent.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def defined(path: Path) -> set[str] | None:
    """Names a module binds at its top level; None when it answers any name (`__getattr__`)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            stored = (n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
            names |= {n.id for n in stored}
    return None if "__getattr__" in names else names


def unresolved(script: Path) -> list[str]:
    problems = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            wanted = [(a.name, None) for a in node.names if a.name.startswith("smallem")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("smallem"):
            wanted = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in wanted:
            path = source_of(module)
            if path is None:
                problems.append(f"no module {module}")
            elif name is not None and source_of(f"{module}.{name}") is None:
                names = defined(path)
                if names is not None and name not in names:
                    problems.append(f"{module} has no {name}")
    return problems


def test_there_are_tools_to_check():
    assert len(SCRIPTS) >= 8 and (BENCHMARKS / "gpu_session.sh") in SHELL


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_script_compiles_and_its_imports_resolve(script, tmp_path):
    py_compile.compile(str(script), cfile=str(tmp_path / "x.pyc"), doraise=True)
    assert not unresolved(script), f"{script.name}: {unresolved(script)}"
    assert ast.get_docstring(ast.parse(script.read_text())), f"{script.name} says nothing of its use"


def test_the_resolver_finds_a_missing_name(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("from smallem.backends.cupy import no_such_name\nimport smallem.no_such_module\n")
    assert unresolved(broken) == ["smallem.backends.cupy has no no_such_name",
                                  "no module smallem.no_such_module"]


@pytest.mark.parametrize("script", SHELL, ids=lambda p: p.name)
def test_every_shell_script_parses_and_names_scripts_that_exist(script):
    if shutil.which("bash"):
        run = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    named = set(re.findall(r"benchmarks/([\w.]+\.(?:py|sh))", script.read_text()))
    assert all((BENCHMARKS / name).exists() for name in named), named


def test_the_index_lists_every_tool():
    index = (BENCHMARKS / "README.md").read_text()
    missing = [p.name for p in SCRIPTS + SHELL if f"`{p.name}`" not in index]
    assert not missing, f"benchmarks/README.md does not list {missing}"

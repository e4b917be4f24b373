"""The layering DESIGN.md promises, read from the sources: the rooms are folders, backends never
import the tape, and no module imports another that imports it back, at module level or inside a
function (a lazy import is still a dependency); the file helpers are one floor module; training
(`smallem train --health`) loads no view; the library never imports the course, no lesson imports
another, and importing one loads no widget library; no module passes 400 lines; the old paths
still import."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import smallem
from smallem.course.common import LESSON

PACKAGE = Path(smallem.__file__).parent
ROOMS = {"autodiff", "backends", "models", "training", "course", "tools"}
LIBRARY = {"nn.py", "optim.py", "data.py", "errors.py", "files.py", "tokens.py"}
LONGEST = 400  # lines a module may hold (DESIGN.md: small modules, one concept each)


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


def test_the_library_imports_neither_the_tools_nor_the_course():
    """Everything but course/ and tools/ is the library: it never imports them. `smallem/__main__.py`
    is exempt: it is the command line itself (`python -m smallem` runs tools.cli), and nothing
    imports it. (The table of moved names, smallem.MOVED, names course modules as strings.)"""
    for name, deps in GRAPH.items():
        if name.startswith(("smallem.tools", "smallem.course", "smallem.__main__")):
            continue
        bad = {d for d in deps if d.startswith(("smallem.tools", "smallem.course"))}
        assert not bad, f"{name} imports {sorted(bad)}"


def lesson_of(module: str) -> str | None:
    """The lesson folder a module is in ("l14_precision"), None outside one."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "course" and LESSON.fullmatch(parts[2]) else None


def test_no_lesson_imports_another_lesson():
    """A lesson's folder imports the library and the course's common part, never another lesson's
    folder: what several lessons use lives in common/ (issue 34)."""
    lessons = {lesson_of(name) for name in GRAPH} - {None}
    assert {"l01_chain_rule", "l13_your_engine", "l14_precision"} <= lessons, sorted(lessons)
    for name, deps in GRAPH.items():
        mine = lesson_of(name)
        bad = {d for d in deps if lesson_of(d) not in (None, mine)} if mine else set()
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_course_common_part_imports_no_lesson():
    for name, deps in GRAPH.items():
        if name.startswith("smallem.course.common"):
            assert not {d for d in deps if lesson_of(d)}, name


def test_a_lesson_folder_holds_its_parts_and_is_found_alone():
    """Every lesson folder is a package with a face; it is discovered by its name alone, and its
    recorded data is found by `recorded()` without naming the lesson."""
    from smallem.course import lesson_folders
    from smallem.course.common.recordings import names

    assert lesson_folders() == FOLDERS and len(FOLDERS) >= 16, FOLDERS
    assert all((PACKAGE / "course" / f / "__init__.py").is_file() for f in FOLDERS)
    shipped = sorted(p.stem for p in (PACKAGE / "course").glob("l*/recorded/*.json"))
    assert names() == shipped and len(set(shipped)) == len(shipped)  # each name once


FOLDERS = sorted(p.name for p in (PACKAGE / "course").iterdir() if LESSON.fullmatch(p.name))


IMPORTED_ALONE = ["smallem.course", "smallem.course.common.grading", "smallem.course.common.graders",
                  "smallem.course.common.recordings", *[f"smallem.course.{folder}" for folder in FOLDERS]]


def test_importing_a_lesson_the_graders_or_the_recordings_loads_no_widget_library():
    """In a fresh interpreter: a lesson's folder, every lesson's exercises (load_lessons: the
    graders) and a recorded result import no ipywidgets (the device that records a lesson has none).
    One interpreter imports each in turn and looks after every import, naming the first that loads
    it: a module loads ipywidgets alone exactly when it does there, or an earlier one, named, did."""
    code = ("import sys, importlib, json; loaded = []\n"
            f"for module in {IMPORTED_ALONE!r}:\n"
            "    importlib.import_module(module); loaded.append([module, 'ipywidgets' in sys.modules])\n"
            "import smallem.course as c; c.load_lessons(); c.recorded('bench_h200')\n"
            "loaded.append(['load_lessons, recorded', 'ipywidgets' in sys.modules])\n"
            "print(json.dumps(loaded))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert [m for m, _ in loaded[:-1]] == IMPORTED_ALONE and len(IMPORTED_ALONE) >= 20
    first = next((m for m, widgets in loaded if widgets), None)
    assert first is None, f"importing {first} loads ipywidgets"


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


def test_the_file_helpers_are_one_floor_module():
    """smallem.files (atomic writes, safe paths) imports nothing of smallem but errors, so every
    room that writes (training, tools, exercises) uses it without reaching into another room."""
    assert GRAPH["smallem.files"] <= {"smallem.errors"}, GRAPH["smallem.files"]
    users = {name.split(".")[1] for name, deps in GRAPH.items() if "smallem.files" in deps}
    assert {"training", "tools", "course"} <= users, users


def test_training_imports_no_view():
    for name, deps in GRAPH.items():
        if name.startswith("smallem.training"):
            assert not {d for d in deps if d.startswith("smallem.course")}, name


def test_train_with_health_loads_neither_ipywidgets_nor_matplotlib(tmp_path):
    """`smallem train --health` for two steps, in a fresh interpreter: the monitor is a training
    observer, so the run never imports a widget or a plotting library."""
    corpus = tmp_path / "corpus.txt"
    words = np.random.default_rng(0).choice(["def", "return", "self", "value", "(x):", "\n"], 3000)
    corpus.write_text(" ".join(words))
    health = tmp_path / "health.jsonl"
    code = ("import sys, json; from smallem.tools.cli import main; "
            f"code = main(['train', '--backend', 'cpu', '--steps', '2', '--batch', '8', '--corpus', "
            f"{str(corpus)!r}, '--health', {str(health)!r}, '--health-every', '1', '--eval-every', '2']); "
            "print(json.dumps([code, sorted(m for m in ('ipywidgets', 'matplotlib') if m in sys.modules)]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    status, loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert status == 0 and health.read_text().count("\n") >= 2  # it ran, and the monitor wrote
    assert loaded == [], f"smallem train --health imported {loaded}"


def test_no_module_passes_400_lines():
    lines = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {name: n for name, n in lines.items() if n > LONGEST}
    assert not long, f"modules over {LONGEST} lines (split one by concept): {long}"


def test_the_old_module_paths_import_their_new_home_and_warn_once():
    """Each path of 0.2 (smallem.tape, smallem.train, ...) and 0.3 (smallem.training.paths,
    smallem.lessons.health) names a real module, and importing it, twice, in a fresh
    interpreter, gives that module with one DeprecationWarning naming the new path; the face's
    train() and sample() stay functions."""
    assert all(new in MODULES and old not in MODULES for old, new in smallem.MOVED.items())
    code = """if True:
        import importlib, json, warnings
        import smallem
        seen = {}
        for old, new in smallem.MOVED.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                same = importlib.import_module(old) is importlib.import_module(new)
                exec(f"import {old}")
                spec = importlib.import_module(new).__spec__.name
            seen[old] = [same, spec, [str(w.message) for w in caught if w.category is DeprecationWarning]]
        print(json.dumps([seen, callable(smallem.train), callable(smallem.sample)]))
    """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen, train_is_function, sample_is_function = json.loads(run.stdout)
    for old, new in smallem.MOVED.items():
        same, spec, warned = seen[old]
        assert same and spec == new, (old, same, spec)
        assert len(warned) == 1 and f"{old} is now {new}" in warned[0], (old, warned)
    assert train_is_function and sample_is_function


def test_the_old_course_faces_give_their_names():
    """0.4's `from smallem.exercises import check, ...` and `from smallem.lessons import plots, ...`
    (every name their __all__ listed) still work, through the course's face, with one warning."""
    code = """if True:
        import json, warnings
        warnings.simplefilter("ignore")
        from smallem.exercises import (EXERCISES, check, grade, hint, load_lessons, progress, reveal,
                                       show_solution, solution, use, answers, data_folder, load, record,
                                       reset, capstone, pieces, your_transformer)
        from smallem.lessons import (AttentionView, OneHeadLM, attention_weights, losses_at,
                                     opener_distances, recorded_curve, recorded_run, render_html,
                                     samples_html, strongest, recorded, trained, closing_windows,
                                     plot_head_maps, weight_on, weights_of, heads, progress_bar, attention,
                                     byhand, dashboard, plots, LiveDashboard, HealthMonitor, BackwardWalk,
                                     StepThrough, LearningRateCliff, LiveFigure, dead_fraction, dead_units)
        import smallem.lessons, smallem.exercises.lesson14, smallem.course
        found = "rows" in smallem.lessons.recorded("bench_h200")
        print(json.dumps([sorted(EXERCISES), callable(progress), found,
                          smallem.exercises.lesson14.RuleScaler.__module__, pieces.diagnose.__module__]))
    """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    ids, progress_is_callable, found, rule_scaler, diagnose = json.loads(run.stdout)
    from smallem.course import EXERCISES

    assert ids == sorted(EXERCISES) and progress_is_callable and found
    assert rule_scaler == "smallem.course.l14_precision.exercises"
    assert diagnose == "smallem.course.l13_your_engine.diagnosis"

"""errors.fmt, the one way smallem writes a number or a small tensor in a sentence, a figure, a
tape's printout or the step-through walk; and no module writes a formatter of its own."""

import re
from pathlib import Path

import numpy as np

import smallem
from smallem.errors import fmt


def test_a_number_has_a_true_minus_and_no_negative_zero():
    assert fmt(-0.805) == "\u22120.805"
    assert fmt(-0.0) == "0"
    assert fmt(0.66125, 5) == "0.66125" and fmt(0.66125) == "0.6613"


def test_a_small_tensor_in_one_line():
    assert fmt(np.array([[1.0, 2.0], [3.0, 4.0]])) == "[1, 2; 3, 4]"
    assert fmt(np.array([[1.0], [2.0]])) == "[1; 2]"
    assert fmt(np.arange(8.0)) == "[0, 1, 2, 3, 4, 5, …]"


def test_the_tape_prints_its_values_with_fmt():
    tape = smallem.Tape("cpu64")
    tape.mul(tape.leaf(-1.23456), 2.0)
    assert [row["value"] for row in tape.rows()] == ["\u22121.235", "2", "\u22122.469"]


def test_no_module_writes_its_own_formatter():
    """The formatters errors.fmt replaced (tape._short, stepthrough.fmt, plots.num, grading.fmt)
    stay gone."""
    root = smallem.__path__[0]
    pattern = re.compile(r"^def (fmt|num|_short)\(", re.M)
    found = []
    for path in sorted(Path(root).rglob("*.py")):
        if path.name == "errors.py":
            continue
        found += [f"{path.relative_to(root)}: def {m.group(1)}"
                  for m in pattern.finditer(path.read_text())]
    assert not found, found

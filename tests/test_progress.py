"""The learner's progress file: where it lives, what `check` records in it, how `progress()` shows
it, and that a damaged file or an unwritable folder never stops grading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from smallem.course import EXERCISES, answers, check, data_folder, load, progress, record, reset, solution
from smallem.course.common.progress import _warned, progress_file, source_of
from smallem.errors import SmallemWarning


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SMALLEM_HOME", str(tmp_path / "home"))
    _warned.clear()
    return tmp_path / "home"


def test_the_test_run_never_writes_the_real_user_folder():
    assert os.environ["SMALLEM_HOME"] and "smallem-test-home-" in os.environ["SMALLEM_HOME"]


def test_data_folder_follows_smallem_home_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("SMALLEM_HOME", str(tmp_path / "x"))
    assert data_folder() == tmp_path / "x"
    monkeypatch.delenv("SMALLEM_HOME")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_folder() == tmp_path / "xdg" / "smallem"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_folder() == tmp_path / ".local" / "share" / "smallem"
    # elsewhere, the folder platformdirs gives (macOS: ~/Library/Application Support/smallem)
    import platformdirs

    monkeypatch.setattr(platformdirs, "user_data_dir",
                        lambda name, appauthor=None: f"/{name}-as-{appauthor}-of-platformdirs")
    assert data_folder() == Path("/smallem-as-False-of-platformdirs")


def test_check_records_verdicts_and_the_source_of_passing_answers(home, capsys):
    def exp_rule(be, grad, out, a):
        return (grad * out,)

    check("02.exp_rule", exp_rule)
    check("02.div_rule", lambda be, grad, out, a, b: (grad / b, grad * a / b**2))  # wrong
    check("02.accumulate", ...)  # a stub earns no verdict
    check("07.first_death_lr", solution("07.first_death_lr"))
    entries = load()
    assert set(entries) == {"02.exp_rule", "02.div_rule", "07.first_death_lr"}
    assert entries["02.exp_rule"]["passed"] and not entries["02.div_rule"]["passed"]
    assert entries["02.div_rule"]["source"] is None and "T" in entries["02.exp_rule"]["when"]
    sources = answers()
    assert set(sources) == {"02.exp_rule", "07.first_death_lr"}
    namespace: dict = {}
    exec(sources["02.exp_rule"], namespace)  # the capstone rebuilds the answer from its source
    assert namespace["exp_rule"](None, 2.0, 3.0, None) == (6.0,)
    assert float(sources["07.first_death_lr"]) == solution("07.first_death_lr")
    assert json.loads((home / "progress.json").read_text())["version"] == 1


def cut_into_heads(tape, x, heads):  # 11.split_heads's pair, under names of the learner's own
    b, t, c = x.shape
    return tape.transpose(tape.reshape(x, (b, t, heads, c // heads)), 1, 2)


def glue_heads(tape, y):
    b, h, t, d = y.shape
    return tape.reshape(tape.transpose(y, 1, 2), (b, t, h * d))


def test_a_pair_of_functions_is_kept_so_the_capstone_rebuilds_it(home, capsys):
    """A pair passed to check() was once kept as `(def ..., def ...)`, which no kernel can run:
    the capstone quietly put the package's split_heads in the learner's place."""
    from smallem import Tape
    from smallem.course.l13_your_engine.pieces import rebuild

    assert check("11.split_heads", (cut_into_heads, glue_heads)).ok
    split, merge = rebuild("11.split_heads", answers()["11.split_heads"])
    tape = Tape("cpu64")
    x = tape.leaf(np.arange(24.0).reshape(1, 4, 6))
    assert split(tape, x, 2).shape == (1, 2, 4, 3)
    assert np.array_equal(tape.backend.to_numpy(merge(tape, split(tape, x, 2)).value), x.value)


def test_a_value_is_kept_as_the_lesson_uses_it(home, capsys):
    check("07.first_death_lr", np.array([solution("07.first_death_lr")]))  # a 1-element array
    assert float(answers()["07.first_death_lr"]) == solution("07.first_death_lr")


def test_a_later_wrong_attempt_keeps_the_pass_and_its_source(home):
    record("02.exp_rule", True, "def exp_rule(be, grad, out, a):\n    return (grad * out,)\n")
    record("02.exp_rule", False, None)
    assert load()["02.exp_rule"]["passed"] and "grad * out" in answers()["02.exp_rule"]
    reset()
    assert load() == {} and not progress_file().exists()


def test_the_file_is_written_atomically_with_no_temp_left(home):
    record("01.two_paths", True, "(7.0, 2.0)")
    record("01.backward_221", False, None)
    assert sorted(p.name for p in home.iterdir()) == [".progress.json.lock", "progress.json"]


def test_source_of_values_and_functions():
    assert source_of((7.0, 2.0)) == "(7.0, 2.0)"
    assert source_of([np.float64(1.5)]) == "[1.5]"
    assert eval(source_of(np.array([[1.0, 2.0]])), {"np": np}).shape == (1, 2)  # noqa: S307
    assert source_of(object()) is None
    assert "def test_source_of_values_and_functions" in source_of(test_source_of_values_and_functions)


def test_progress_shows_each_lesson_done_and_to_do_and_where_it_is_kept(home):
    record("01.two_paths", True, "(7.0, 2.0)")
    record("01.backward_221", False, None)
    shown = progress()
    text = repr(shown)
    assert shown.done == 1 and shown.total == len(EXERCISES)
    first = text.splitlines()[0]
    assert first.startswith("01  the chain rule by hand") and "1/2" in first
    assert "✓ two_paths" in first and "✗ backward_221" in first
    assert "0/3" in next(line for line in text.splitlines() if line.startswith("02"))
    assert f"1 of {len(EXERCISES)} exercises done" in text and str(home / "progress.json") in text
    html = shown._repr_html_()
    assert html.startswith("<table>") and "backprop by hand" in html and "progress.json" in html


def _aside(home: Path) -> list[Path]:
    return sorted(home.glob("progress-*.json"))


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"exercises": 3}', "\udcff",
                                     '{"exercises": {}}', '{"version": 2, "exercises": {}}'])
def test_a_damaged_or_foreign_file_is_moved_aside_as_it_was_with_one_warning(home, content, capsys):
    home.mkdir()
    damaged = content.encode("utf-8", "surrogateescape")
    (home / "progress.json").write_bytes(damaged)
    with pytest.warns(SmallemWarning, match="moved aside to") as caught:
        assert load() == {}
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    [kept] = _aside(home)
    assert kept.read_bytes() == damaged and str(kept) in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once is enough: no second warning
        assert check("01.two_paths", (7.0, 2.0)).ok  # grading works, in a new file
    assert load()["01.two_paths"]["passed"] and _aside(home) == [kept]


def test_a_file_cut_short_keeps_its_passes_aside(home, capsys):
    for k in range(6):
        record(f"01.earned_{k}", True, f"({k}.0, 2.0)")
    whole = (home / "progress.json").read_bytes()
    (home / "progress.json").write_bytes(whole[:-5])  # its last 5 bytes lost
    with pytest.warns(SmallemWarning, match="moved aside"):
        check("01.two_paths", (7.0, 2.0))
    [kept] = _aside(home)
    assert kept.read_bytes() == whole[:-5]  # recoverable by hand: the 6 passes are all in it
    assert json.loads(kept.read_text() + "}}")["exercises"].keys() >= {f"01.earned_{k}" for k in range(5)}
    assert set(load()) == {"01.two_paths"}


def test_an_unreadable_file_is_moved_aside_never_replaced(home, monkeypatch, capsys):
    record("01.backward_221", True, "1.0")
    before = (home / "progress.json").read_bytes()
    real_open = os.open

    def denied(path, *args, **kwargs):  # root's 0600 file, as a learner's kernel meets it
        if Path(path) == home / "progress.json":
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    with monkeypatch.context() as patched, \
            pytest.warns(SmallemWarning, match="Permission denied.*moved aside to"):
        patched.setattr(os, "open", denied)
        assert check("01.two_paths", (7.0, 2.0)).ok
    [kept] = _aside(home)
    assert "unreadable" in kept.name and kept.read_bytes() == before
    assert set(load()) == {"01.two_paths"}


def test_a_named_pipe_in_its_place_is_refused_in_one_sentence_never_waited_on(home, capsys):
    home.mkdir()
    os.mkfifo(home / "progress.json")
    with pytest.warns(SmallemWarning, match="is a named pipe, not a regular file") as caught:
        assert load() == {}
        assert check("01.two_paths", (7.0, 2.0)).ok  # grading goes on; the pipe stays a pipe
    assert all("\n" not in str(w.message) for w in caught)
    assert (home / "progress.json").is_fifo() and not _aside(home)


def test_fields_it_does_not_know_are_kept_when_it_rewrites(home, capsys):
    home.mkdir()
    (home / "progress.json").write_text(json.dumps({"version": 1, "theme": "dark", "exercises": {
        "01.backward_221": {"passed": True, "source": "1.0", "when": "2026-01-01T00:00:00+00:00",
                            "attempts": 3},
        "01.later_kind": {"passed": "partly", "note": "a newer smallem's entry"}}}))
    assert check("01.two_paths", (7.0, 2.0)).ok
    data = json.loads((home / "progress.json").read_text())
    assert data["theme"] == "dark" and data["exercises"]["01.backward_221"]["attempts"] == 3
    assert data["exercises"]["01.later_kind"] == {"passed": "partly", "note": "a newer smallem's entry"}
    assert data["exercises"]["01.two_paths"]["passed"] and set(load()) == {"01.backward_221", "01.two_paths"}


RECORDER = """
import sys, time
from smallem.course.common.progress import record
start = float(sys.argv[2])
while time.time() < start:  # both processes begin at the same moment
    pass
for k in range(100):
    record(f"{sys.argv[1]}.pass_{k}", True, repr(k))
"""


def test_two_processes_recording_at_once_keep_every_pass(home, tmp_path):
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    start = f"{__import__('time').time() + 3:.3f}"  # after both interpreters have imported smallem
    env = {**os.environ, "SMALLEM_HOME": str(home)}
    runs = [subprocess.Popen([sys.executable, str(script), name, start], env=env,
                             stderr=subprocess.PIPE, text=True) for name in ("11", "13")]
    for run in runs:
        assert run.wait(timeout=300) == 0, run.stderr.read()
        assert "Warning" not in run.stderr.read()
    kept = load()
    assert len(kept) == 200 and all(kept[f"{n}.pass_{k}"]["passed"] for n in ("11", "13") for k in range(100))


def test_bad_entries_are_dropped_and_good_ones_kept(home):
    home.mkdir()
    (home / "progress.json").write_text(json.dumps({"version": 1, "exercises": {
        "01.two_paths": {"passed": True, "source": "(7.0, 2.0)", "when": "2026-01-01T00:00:00+00:00"},
        "01.backward_221": {"passed": "yes"}}}))
    assert list(load()) == ["01.two_paths"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_folder_warns_once_and_grading_still_works(home, capsys):
    home.mkdir()
    home.chmod(0o500)
    try:
        with pytest.warns(SmallemWarning, match="cannot keep your progress") as caught:
            assert check("01.two_paths", (7.0, 2.0)).ok
            assert check("01.two_paths", (7.0, 2.0)).ok
        assert len(caught) == 1
    finally:
        home.chmod(0o700)


def test_a_data_folder_that_is_a_file_warns_and_grading_still_works(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SMALLEM_HOME", str(blocker / "smallem"))
    _warned.clear()
    with pytest.warns(SmallemWarning, match="cannot keep your progress") as caught:
        assert check("01.two_paths", (7.0, 2.0)).ok
    assert len(caught) == 1 and "SMALLEM_HOME" in str(caught[0].message)
    assert load() == {} and isinstance(data_folder(), Path)

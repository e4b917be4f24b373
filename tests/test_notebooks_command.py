"""`smallem notebooks DEST` copies the course's notebooks into a folder the learner chooses and
never replaces one there: an edited notebook is kept and the shipped one written beside it."""

from pathlib import Path

from cli_run import one_line_error, run

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_notebooks_are_copied_and_an_edited_one_is_kept(capsys, tmp_path):
    dest = tmp_path / "my course"
    code, out, _ = run(capsys, "notebooks", dest)
    assert code == 0 and f"the {len(SHIPPED)} notebooks are in {dest}" in out
    assert sorted(p.name for p in dest.iterdir()) == [p.name for p in SHIPPED]
    assert all((dest / p.name).read_bytes() == p.read_bytes() for p in SHIPPED)
    edited = dest / SHIPPED[2].name
    edited.write_text("my answers")
    said = []
    for _ in range(2):  # a second copy writes nothing new
        code, out, _ = run(capsys, "notebooks", dest)
        assert code == 0 and edited.read_text() == "my answers"  # nothing a learner had is lost
        said.append(out)
    beside = sorted(dest.glob(f"{edited.stem}.smallem-*.ipynb"))
    assert len(beside) == 1 and beside[0].read_bytes() == SHIPPED[2].read_bytes()
    assert f"{edited.name} is there and differs" in said[0] and beside[0].name in said[0]
    assert "differs" not in said[1]


def test_a_destination_that_is_a_file_is_one_sentence(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    code, _, err = run(capsys, "notebooks", tmp_path / "f")
    assert code == 2 and one_line_error(err) and "not a folder" in err, err


def test_the_help_names_the_command_a_wheel_user_has(capsys):
    import pytest

    with pytest.raises(SystemExit):
        run(capsys, "--help")
    out = capsys.readouterr().out
    assert "smallem notebooks DIR" in out and "jupyter lab notebooks/" not in out

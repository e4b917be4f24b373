"""Output paths: checked before the work by the code that writes them, written atomically, and
never a device, a pipe or another output's file."""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from smallem import SmallemError
from smallem.files import atomic_write, check_distinct, check_writable, write_json


def test_a_name_of_254_characters_can_be_written(tmp_path):
    path = tmp_path / ("a" * 250 + ".npz")  # the longest names file systems allow, nearly
    write_json(path, {"ok": 1})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("make, message", [
    (lambda d: d / ("a" * 300 + ".json"), "too long"),
    (lambda d: (d / "file").write_text("x") and d / "file" / "x.json", "not a folder"),
    (lambda d: d / "missing" / "x.json", "does not exist; create it first"),
    (lambda d: d, "is a folder: name a file in it"),
])
def test_what_cannot_be_written_is_refused_up_front(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(SmallemError, match=message) as info:
        check_writable(path, "--json")
    assert str(path) in str(info.value) and "--json" in str(info.value)


def test_a_folder_where_files_cannot_be_created():
    with pytest.raises(SmallemError, match="cannot create files in folder '/proc'"):
        check_writable("/proc/run.json", "--json")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(SmallemError, match="permission denied"):
            check_writable(folder / "x.npz", "--save")
    finally:
        folder.chmod(0o755)


def test_the_check_leaves_nothing_behind_and_returns_the_destination(tmp_path):
    target = check_writable(tmp_path / "x.npz", "--save")
    assert target == tmp_path / "x.npz" and os.listdir(tmp_path) == []


def test_tilde_means_home_when_checking_and_when_writing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert check_writable("~/r.json", "--json") == tmp_path / "r.json"
    write_json("~/r.json", [1])
    assert json.loads((tmp_path / "r.json").read_text()) == [1]
    assert not (tmp_path / "~").exists()


def test_a_pipe_or_device_is_never_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SmallemError, match="is a named pipe, not a regular file"):
        write_json(fifo, {})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the pipe
    with pytest.raises(SmallemError, match="'/dev/null' is a character device"):
        check_writable("/dev/null", "--json")
    link = tmp_path / "link"
    link.symlink_to(fifo)
    with pytest.raises(SmallemError, match="not a regular file .through a link to"):
        check_writable(link, "--json")


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_json(link, {"a": 1})
    assert link.is_symlink() and json.loads(real.read_text()) == {"a": 1}
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "new.json")
    write_json(dangling, [2])
    assert dangling.is_symlink() and json.loads((tmp_path / "new.json").read_text()) == [2]


def test_the_mode_of_a_replaced_file_is_kept_and_a_new_file_follows_the_umask(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, [1])
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask  # not mkstemp's 0600
    path.chmod(0o640)
    write_json(path, [2])
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def saving_child(path, write):
    """Another process in the middle of an atomic save to `path` (its temp file exists), which
    `write` (Python source, the body of the writer) keeps busy for a minute."""
    code = ("import sys, time; from smallem.files import atomic_write; "
            f"atomic_write(sys.argv[1], lambda fh: {write})")
    child = subprocess.Popen([sys.executable, "-c", code, str(path)])
    for _ in range(200):
        if os.listdir(path.parent):
            break
        time.sleep(0.05)
    return child


def test_a_killed_save_leaves_a_temp_file_that_the_next_save_removes(tmp_path):
    path = tmp_path / "run.json"
    child = saving_child(path, "(fh.write(b'half'), fh.flush(), time.sleep(60))")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert len(os.listdir(tmp_path)) == 1 and not path.exists()  # the killed save's temp file
    write_json(path, [1])
    assert os.listdir(tmp_path) == ["run.json"]


def test_another_process_saving_keeps_its_temp_file(tmp_path):
    """Only temp files of processes that are gone are removed."""
    path = tmp_path / "run.json"
    child = saving_child(path, "time.sleep(60)")
    try:
        write_json(path, [1])
        assert len(os.listdir(tmp_path)) == 2
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_a_failed_write_is_one_sentence_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "run.json"
    write_json(path, [1])

    def broken(fh):
        raise OSError(28, "No space left on device")

    with pytest.raises(SmallemError, match="No space left on device.*is unchanged"):
        atomic_write(path, broken, what="results")
    assert json.loads(path.read_text()) == [1] and os.listdir(tmp_path) == ["run.json"]


def test_the_folder_is_synced_after_the_rename(tmp_path, monkeypatch):
    """fsync of the file, then of its folder once the new name is in place: the rename itself
    survives a power cut."""
    import smallem.files as files

    path, synced, real = tmp_path / "run.json", [], os.fsync
    write_json(path, [1])

    def fsync(fd):
        info = os.fstat(fd)
        folder = stat.S_ISDIR(info.st_mode)
        synced.append(("folder", info.st_ino == os.stat(tmp_path).st_ino,
                       json.loads(path.read_text())) if folder else ("file",))
        real(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    write_json(path, [2])
    assert synced == [("file",), ("folder", True, [2])]  # the folder after the rename


def test_outputs_are_checked_against_each_other_and_the_input(tmp_path):
    x = tmp_path / "x.npz"
    link = tmp_path / "link.npz"
    link.symlink_to(x)
    with pytest.raises(SmallemError, match="--save and --json name the same file"):
        check_distinct({"--save": x, "--json": x})
    with pytest.raises(SmallemError, match="--save and --json name the same file"):
        check_distinct({"--save": x, "--json": link})
    with pytest.raises(SmallemError, match="--json .* is the file given to --resume"):
        check_distinct({"--json": x}, {"--resume": x})
    check_distinct({"--save": x, "--json": tmp_path / "x.json"}, {"--resume": x},
                   may_replace={"--save"})  # saving back to the resumed file is the default
    check_distinct({"--save": None, "--json": None}, {"--resume": None})

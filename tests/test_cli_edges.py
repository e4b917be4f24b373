"""The command line's rough edges (issue 31): Ctrl-C from the first instant, an out-of-memory run
naming the option that asked too much, an edited checkpoint's config naming the file, terminals
that cannot show a byte, the help for `smallem` alone and a "did you mean" for a typo."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from smallem.tools.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--model", "transformer", "--layers", "1", "--width", "8", "--heads", "2",
        "--context", "8", "--backend", "cpu", "--log-every", "1", "--eval-every", "2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 200 KB of text: enough held-out bytes for a 20,000-byte window."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "(x):", "\n"]
    for k in range(12):
        (folder / f"doc{k:02d}.py").write_text(" ".join(rng.choice(words, 3000)))
    return folder


@pytest.fixture(scope="module")
def checkpoint(corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "tiny.ckpt.npz"
    assert main(["train", *TINY, "--steps", "2", "--batch", "2", "--corpus", str(corpus),
                 "--save", str(path)]) == 0
    return path


def smallem(*argv, env=None, limit_memory=False, timeout=300):
    """`python -m smallem ARGV` in a child process: (status, stdout, stderr)."""
    def cap():  # an address-space limit turns a huge allocation into MemoryError, never swap
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    threads = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}  # no per-core buffers
    child = subprocess.run([sys.executable, "-m", "smallem", *argv], capture_output=True,
                           env={**os.environ, **(threads if limit_memory else {}), **(env or {})},
                           timeout=timeout, cwd=ROOT, preexec_fn=cap if limit_memory else None)
    return (child.returncode, child.stdout.decode("utf-8", "replace"),
            child.stderr.decode("utf-8", "replace"))


def edited(checkpoint, tmp_path, edit):
    """A copy of `checkpoint` with its config edited by `edit(config)`."""
    with np.load(checkpoint, allow_pickle=False) as archive:
        content = {k: archive[k] for k in archive.files}
    meta = json.loads(str(content["meta"]))
    edit(meta["config"])
    content["meta"] = np.array(json.dumps(meta))
    path = tmp_path / "edited.ckpt.npz"
    np.savez(path, **content)
    return path


# Ctrl-C -----------------------------------------------------------------------------------
STOP_IN_IMPORT = """
import sys

class CtrlC:  # Ctrl-C pressed while the backends (NumPy with them) load: the first second
    def find_spec(self, name, path=None, target=None):
        if name == "smallem.backends":
            raise KeyboardInterrupt

sys.meta_path.insert(0, CtrlC())
from smallem.tools.cli import main  # what the `smallem` console script runs
sys.exit(main(["train", "--steps", "1"]))
"""


def test_ctrl_c_while_the_command_imports_is_one_line():
    child = subprocess.run([sys.executable, "-c", STOP_IN_IMPORT], capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
    assert child.returncode == 128 + signal.SIGINT, child.stderr
    assert child.stderr == "smallem: interrupted\n", child.stderr


def test_ctrl_c_while_the_bigram_fits_is_one_line(capsys, monkeypatch, corpus):
    from smallem.models.bigram import Bigram

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Bigram, "fit", pressed)
    assert main(["train", "--steps", "1", "--corpus", str(corpus), "--backend", "cpu"]) == 130
    assert capsys.readouterr().err == "smallem train: interrupted\n"


# out of memory names what asked for it ----------------------------------------------------------
def test_out_of_memory_in_train_names_the_context(corpus):
    code, _, err = smallem("train", "--model", "transformer", "--context", "20000", "--batch", "2",
                           "--steps", "1", "--backend", "cpu", "--corpus", str(corpus),
                           limit_memory=True)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "out of memory" in err and "a smaller --context: it is 20,000, 312× the " \
        "transformer's default 64 (attention's memory grows with its square)" in err, err


def test_out_of_memory_in_sample_names_the_checkpoints_context(checkpoint, tmp_path):
    path = edited(checkpoint, tmp_path, lambda c: c["sizes"].update(context=10**9))
    code, _, err = smallem("sample", "--checkpoint", str(path), "--bytes", "5",
                           limit_memory=True)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"checkpoint {str(path)!r} asks for a model larger than this machine's memory" in err
    assert "its context is 1,000,000,000, 15,625,000× the transformer's default 64" in err, err


# an edited checkpoint's config is the file's problem ---------------------------------------------
def as_0_3(config, **edits):
    """A config as 0.3 wrote it: the Transformer's sizes flat, the vocabulary under "mlp"."""
    sizes = config.pop("sizes")
    config.update({k: sizes[k] for k in ("layers", "width", "heads", "context")}, **edits,
                  mlp={"vocab": sizes["vocab"]})


@pytest.mark.parametrize("edit, says", [
    (lambda c: c["sizes"].update(heads=3), "must split evenly into 3 heads"),
    (lambda c: as_0_3(c), None),  # 0.3's flat form, unedited: it samples and resumes
    (lambda c: as_0_3(c, layers="1"), "config.layers is '1', not a whole number"),  # edited
])
@pytest.mark.parametrize("command", ["sample", "resume"])
def test_a_bad_config_in_a_checkpoint_names_the_file(capsys, checkpoint, tmp_path, edit, says,
                                                     command):
    path = edited(checkpoint, tmp_path, edit)
    argv = (["sample", "--checkpoint", str(path), "--bytes", "3"] if command == "sample" else
            ["train", "--resume", str(path), "--steps", "3", "--save", str(tmp_path / "o.npz")])
    code = main(argv)
    err = capsys.readouterr().err
    if says is None:
        assert code == 0, err
        return
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"checkpoint {str(path)!r}" in err and says in err and "edited or damaged" in err, err


# terminals that cannot show a byte ---------------------------------------------------------------
def test_sample_to_an_ascii_terminal(checkpoint):
    code, out, err = smallem("sample", "--checkpoint", str(checkpoint), "--prompt", "caf\u00e9 ",
                             "--bytes", "20", env={"PYTHONIOENCODING": "ascii"})
    assert code == 0 and "Traceback" not in err, err
    assert out.startswith("caf\\xe9 "), out


def test_train_json_with_a_latin_1_name_on_a_strict_utf_8_stdout(corpus, tmp_path):
    name = os.fsencode(tmp_path) + b"/r\xe9sultats.json"  # Latin-1 é: not UTF-8
    child = subprocess.run(
        [sys.executable, "-m", "smallem", "train", "--steps", "2", "--batch", "4", "--backend",
         "cpu", "--corpus", str(corpus), "--log-every", "1", "--eval-every", "2", "--json", name],
        capture_output=True, env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"}, cwd=ROOT,
        timeout=300)
    err = child.stderr.decode("utf-8", "replace")
    assert child.returncode == 0 and "Traceback" not in err, err
    assert json.loads(open(name, "rb").read())["steps"] == 2
    assert b"results written to " in child.stdout and b"r\\udce9sultats.json" in child.stdout


# the option as typed, the help, a typo -----------------------------------------------------------
def test_health_every_0_names_the_option_as_typed(capsys, tmp_path):
    assert main(["train", "--health", str(tmp_path / "h.jsonl"), "--health-every", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "smallem train: error: --health-every must be a whole number, 1 or more, got 0\n"


def test_smallem_alone_prints_the_help(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: smallem") and "`smallem COMMAND --help`" in err
    assert all(command in err for command in ("gradcheck", "train", "sample", "checks", "bench"))


@pytest.mark.parametrize("argv, says", [
    (["train", "--stpes", "5"],
     "smallem train: error: unrecognized argument '--stpes': did you mean --steps?"),
    (["sample", "--checkpoint", "x", "--temprature=0.5"], "did you mean --temperature?"),
    (["train", "--zzz"], "unrecognized argument '--zzz'; `smallem train --help` lists the options"),
    (["trian", "--steps", "5"], "smallem: error: unknown command 'trian': did you mean train?"),
    (["--bogus"], "smallem: error: unknown option '--bogus'; `smallem --help` lists the commands"),
    (["train", "--steps", "abc"], "smallem train: error: argument --steps: invalid int value: 'abc'"),
])
def test_a_mistyped_option_or_value_is_one_sentence_with_the_nearest_option(capsys, argv, says):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and err.endswith(says + "\n"), err


def test_a_bad_value_is_one_sentence_whether_argparse_or_the_package_refuses_it(capsys):
    for value in ("abc", "-5"):
        try:
            code = main(["train", "--steps", value])
        except SystemExit as stop:
            code = stop.code
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1 and "usage" not in err, err
        assert err.startswith("smallem train: error: ") and "--steps" in err, err


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed: the "
                    "compiled kernels are not loaded before the run")
@pytest.mark.parametrize("grain", ["0", "x"])
def test_a_bad_grain_read_as_the_kernels_load_is_one_sentence(grain):
    """SMALLEM_GRAIN is read when team.py is imported, which the CLI does before the run (to load
    numba's kernels under its Ctrl-C guard), outside the run's error handling: a traceback until
    round 17. Now the run's own import says it."""
    status, _, err = smallem("train", "--steps", "1", env={"SMALLEM_GRAIN": grain}, timeout=120)
    assert status == 2 and err.strip() == (
        f"smallem train: error: SMALLEM_GRAIN='{grain}': give the units of work (~20 µs each) worth one "
        "more thread, more than 0 (or unset it for the default, 8)"), err


def test_the_names_checked_before_loading_are_the_parsers():
    from smallem.tools.names import OPTIONS
    from smallem.tools.parser import _subparsers, build_parser

    parsed = {name: sorted(o for a in sub._actions for o in a.option_strings if o.startswith("--"))
              for name, sub in _subparsers(build_parser()).items()}
    assert {name: sorted(names) for name, names in OPTIONS.items()} == parsed, \
        "an option was added or renamed: say it in smallem/tools/names.py too"


@pytest.mark.parametrize("argv", [["--version"], ["train", "--stpes", "5"], ["trian"],
                                  ["sample", "--checkpiont", "x"], ["--bogus"]])
def test_the_version_and_a_typo_are_answered_without_loading_numpy(argv):
    child = subprocess.run([sys.executable, "-X", "importtime", "-m", "smallem", *argv],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    imported = [line.split("|")[-1].strip() for line in child.stderr.splitlines()
                if line.startswith("import time:")]
    assert "smallem.tools.cli" in imported and "numpy" not in imported, imported
    answer = [line for line in (child.stdout + child.stderr).splitlines()
              if not line.startswith("import time:")]
    assert len(answer) == 1 and answer[0].startswith("smallem"), answer


def test_sample_help_says_each_option_once_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    help_of = {o: out.split(o, 2)[-1][:200] for o in ("--checkpoint FILE", "--seed SEED",
                                                       "--bytes BYTES", "--temperature TEMPERATURE")}
    assert all(len(text.split("--")[0].strip()) > 10 for text in help_of.values()), help_of
    assert "(default 200)" in help_of["--bytes BYTES"] and "(default 1.0)" in help_of[
        "--temperature TEMPERATURE"]
    backend = out.split("--backend {auto,cpu,cpu64,gpu}")[-1]
    assert all(backend.count(name) == 1 for name in ("auto", "cpu64", "gpu")), backend
    assert backend.count("cpu") == 3  # cpu, cpu64 and the cpu auto falls back to


# `python -m smallem ARGV`, saying on stderr when Python itself has started (a Ctrl-C before that
# is Python's own "Fatal Python error", no part of smallem)
STARTED = """
import runpy, sys
sys.stderr.write("started\\n"); sys.stderr.flush()
sys.argv = ["smallem", *sys.argv[1:]]
runpy.run_module("smallem", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_at_any_moment_of_the_start_is_one_line_never_a_traceback(corpus):
    # SIGINT at several moments of the first second and a half: the imports (NumPy and
    # ml_dtypes' C extensions among them, where a KeyboardInterrupt came out as an ImportError),
    # the corpus, the first steps.
    for delay in (0.05, 0.1, 0.2, 0.3, 0.3, 0.4, 0.6, 0.9, 1.5):
        child = subprocess.Popen([sys.executable, "-c", STARTED, "train", "--steps", "3",
                                  "--backend", "cpu", "--corpus", str(corpus)], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stderr.readline() == "started\n"
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=300)
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, (delay, err)
        # A run whose results are out when Ctrl-C comes, Python already finalizing (its
        # handlers back to the system's), ends by the signal itself: nothing was left to save.
        finished = child.returncode == -signal.SIGINT and not err and "held-out loss" in out
        assert child.returncode == 0 or err.rstrip().endswith("interrupted") or (
            "stopped by SIGINT" in err) or finished, (delay, child.returncode, err)


def test_the_progress_module_imports_as_a_module_and_progress_still_works():
    import smallem.course.common.progress as store
    from smallem.course import progress

    assert callable(store.record) and callable(store.load)
    assert type(progress()).__name__ == "Progress"


def test_the_face_is_whole_though_imported_on_first_use():
    """`import smallem` loads nothing heavy (so the command catches a Ctrl-C from its first
    instant), and every name of the face, and every room, is there when read."""
    code = ("import sys, smallem; light = 'numpy' not in sys.modules; "
            "from smallem import *; import smallem.errors; "
            "print(light, all(hasattr(smallem, n) for n in smallem.__all__), "
            "set(smallem.__all__) <= set(dir(smallem)), smallem.training.checkpoint.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.split()
    assert out == ["True", "True", "True", "smallem.training.checkpoint"], out

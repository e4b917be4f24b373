"""A run is never lost to its files: a save that fails mid-run or at the end goes to a rescue
file, says where, and training goes on."""

import pytest

import smallem.training.checkpoint
from smallem import SmallemError
from smallem.data import load_corpus
from smallem.errors import SmallemWarning
from smallem.models.mlp import MlpConfig
from smallem.training.checkpoint import load_checkpoint
from smallem.training.config import TrainConfig
from smallem.training.loop import train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    for k in range(12):
        (folder / f"doc{k:02d}.py").write_text(f"def f{k}(x):\n    return x + {k}\n" * 40)
    return load_corpus(folder)


def test_a_periodic_save_that_fails_does_not_stop_the_run(corpus, tmp_path, monkeypatch):
    path = tmp_path / "run.npz"
    real, calls = smallem.training.checkpoint.atomic_write, []

    def fails_once(target, write, what="file"):
        calls.append(str(target))
        if len(calls) == 1:
            raise SmallemError(f"cannot write checkpoint {str(target)!r}: disk full")
        return real(target, write, what=what)

    monkeypatch.setattr(smallem.training.checkpoint, "atomic_write", fails_once)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    config = TrainConfig(backend="cpu", steps=10, batch=8, log_every=5, eval_every=10,
                         save_every=5, sizes=MlpConfig(context=16, embed=4, hidden=8))
    with pytest.warns(SmallemWarning, match="could not save the checkpoint of step 5: .*disk "
                      "full; saved it to .*smallem-rescued-.*run.npz instead; training goes on, "
                      "and the next save tries .*run.npz' again"):
        result = train(config, corpus=corpus, save=path, progress=False, log=None)
    rescued = list((tmp_path / "work").glob("smallem-rescued-*-run.npz"))
    assert result.steps == 10 and len(rescued) == 1
    assert load_checkpoint(rescued[0]).step == 5 and load_checkpoint(path).step == 10
    assert result.checkpoint == str(path)

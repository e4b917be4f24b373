"""The trained models shipped as package data (course/l12_transformer/recorded/*.npz): what the files hold,
that they load on every CPU backend, that they are the recorded GPU runs, and that they learnt."""

from __future__ import annotations

import json
import zipfile
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

import smallem.course
from smallem import Tape
from smallem.course import trained
from smallem.course.common.recordings import trained_names
from smallem.data import SequenceSampler, load_corpus
from smallem.errors import SmallemError

RESULTS = Path(__file__).parents[2] / "benchmarks/results/round5"
RUNS = {"transformer_trained": "train_transformer.json", "mlp_trained": "train_mlp.json"}


def test_the_shipped_models_are_float16_weights_and_no_optimizer():
    assert trained_names() == sorted(RUNS)
    for name in RUNS:
        file = next(Path(smallem.course.__file__).parent.glob(f"*/recorded/{name}.npz"))  # its lesson's
        with resources.as_file(file) as path:
            with np.load(path) as archive:
                params = [k for k in archive.files if k.startswith("param/")]
                assert params and all(archive[k].dtype == np.float16 for k in params)
                assert not [k for k in archive.files if k.startswith("optim/")]
            assert path.stat().st_size < 1_200_000  # about 1 MB each: what a wheel can carry
            assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in zipfile.ZipFile(path).infolist())


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_is_the_recorded_gpu_run(name):
    _, meta = trained(name)
    run = json.loads((RESULTS / RUNS[name]).read_text())
    evaluated = [h for h in meta["history"] if h.get("held_out_loss") is not None]
    assert meta["step"] == run["steps"] and evaluated[-1]["held_out_loss"] == run["held_out_loss"]


def test_the_transformer_learnt_and_loads_on_both_cpu_precisions():
    corpus = load_corpus()
    x, y = SequenceSampler(corpus.held_out, batch=16, context=64, seed=0).next()
    losses = {}
    for backend in ("cpu", "cpu64"):
        model, meta = trained("transformer_trained", backend)
        assert model.token.weight.numpy().dtype == (np.float32 if backend == "cpu" else np.float64)
        tape = Tape(backend)
        losses[backend] = float(model.loss(tape, x, y).value)
        tape.close()
    # 5.55 untrained (ln 257), 2.40 the bigram's; the run scored 1.14 on the H200's own corpus
    assert losses["cpu"] < 1.6 and abs(losses["cpu"] - losses["cpu64"]) < 1e-3, losses


def test_an_unknown_name_is_one_sentence():
    with pytest.raises(SmallemError, match="no trained model named 'gpt2': there are mlp_trained"):
        trained("gpt2")

"""Checkpoints: a round trip by name, atomic writes, no pickle, and a clear error naming the
parameter when a checkpoint does not fit the model."""

import json
import os

import numpy as np
import pytest

from smallem import SmallemError
from smallem.checkpoint import load_checkpoint, load_parameters, save_checkpoint
from smallem.models.mlp import Mlp, MlpConfig
from smallem.optim import AdamW
from smallem.step import loss_and_gradients

SMALL = MlpConfig(context=4, embed=3, hidden=5, vocab=7)


def trained(seed=0):
    model, opt = Mlp(SMALL, "cpu", seed=seed), AdamW()
    contexts, targets = np.arange(8).reshape(2, 4) % 7, np.array([1, 2])
    _, grads = loss_and_gradients("cpu", lambda tape: model.loss(tape, contexts, targets))
    opt.step(model.parameters(), grads)
    return model, opt


def test_round_trip(tmp_path):
    model, opt = trained()
    path = save_checkpoint(tmp_path / "a.ckpt.npz", model, opt, {"step": 7, "note": "hi"})
    ck = load_checkpoint(path)
    assert ck.step == 7 and ck.meta["note"] == "hi" and ck.meta["optimizer"]["steps"] == 1
    assert list(ck.parameters) == model.parameter_names()
    other = Mlp(SMALL, "cpu64", seed=5)
    load_parameters(other, ck.parameters)
    for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy().astype(np.float32), err_msg=name)
    np.testing.assert_array_equal(ck.optimizer["tensors"]["hidden.weight.m"],
                                  opt.m[model.hidden.weight])


def test_write_is_atomic(tmp_path, monkeypatch):
    model, opt = trained()
    path = tmp_path / "a.ckpt.npz"
    save_checkpoint(path, model, opt, {"step": 1})
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, opt, {"step": 2})
    assert path.read_bytes() == before  # the old checkpoint is whole
    assert os.listdir(tmp_path) == ["a.ckpt.npz"]  # no temporary file left behind


def test_never_unpickles(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, meta=np.array(json.dumps({"format": "smallem-checkpoint"})),
             **{"param/x": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(SmallemError, match="cannot be read"):
        load_checkpoint(path)


@pytest.mark.parametrize("content, message", [(None, "does not exist"),
                                              (b"not a zip", "cannot be read")])
def test_missing_or_damaged_files(tmp_path, content, message):
    path = tmp_path / "x.ckpt.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SmallemError, match=message):
        load_checkpoint(path)


def test_a_checkpoint_that_does_not_fit_names_the_parameter(tmp_path):
    model, opt = trained()
    ck = load_checkpoint(save_checkpoint(tmp_path / "a.npz", model, opt, {}))
    wider = Mlp(MlpConfig(context=4, embed=3, hidden=6, vocab=7), "cpu")
    with pytest.raises(SmallemError, match="'hidden.weight' has shape \\[12, 5\\]"):
        load_parameters(wider, ck.parameters)
    missing = {k: v for k, v in ck.parameters.items() if k != "output.bias"}
    with pytest.raises(SmallemError, match="no parameter 'output.bias'"):
        load_parameters(model, missing)
    with pytest.raises(SmallemError, match="holds parameter 'extra.weight'"):
        load_parameters(model, {**ck.parameters, "extra.weight": np.zeros(3)})
    before = model.hidden.weight.numpy()
    with pytest.raises(SmallemError):
        load_parameters(model, {**ck.parameters, "hidden.weight": np.ones((12, 5)),
                                "output.bias": np.zeros(3)})
    np.testing.assert_array_equal(model.hidden.weight.numpy(), before)  # checked before changing


def test_saving_into_a_missing_folder(tmp_path):
    model, _ = trained()
    with pytest.raises(SmallemError, match="does not exist"):
        save_checkpoint(tmp_path / "nope" / "a.npz", model)


def test_results_json_is_written_atomically(tmp_path, monkeypatch):
    from smallem.checkpoint import write_json

    path = tmp_path / "run.json"
    write_json(path, {"held_out_loss": 1.5})
    assert json.loads(path.read_text()) == {"held_out_loss": 1.5}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dumps", broken)
    with pytest.raises(OSError, match="disk full"):
        write_json(path, {"held_out_loss": 9.9})
    assert json.loads(path.read_text()) == {"held_out_loss": 1.5}  # the old results are whole
    assert os.listdir(tmp_path) == ["run.json"]
    with pytest.raises(SmallemError, match="it is a folder"):
        write_json(tmp_path, {})

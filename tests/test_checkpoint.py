"""Checkpoints: a round trip by name, atomic writes, no pickle, and a clear error naming the
parameter when a checkpoint does not fit the model."""

import json
import os

import numpy as np
import pytest

from smallem import SmallemError
from smallem.models.mlp import Mlp, MlpConfig
from smallem.optim import AdamW
from smallem.training.checkpoint import load_checkpoint, load_parameters, save_checkpoint
from smallem.training.step import loss_and_gradients

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
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "a.ckpt.npz"
    save_checkpoint(path, model, opt, {"step": 1})
    path = "a.ckpt.npz"
    before = (tmp_path / path).read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(SmallemError, match="disk full; 'a.ckpt.npz' is unchanged"):
        save_checkpoint(path, model, opt, {"step": 2})
    assert (tmp_path / path).read_bytes() == before  # the old checkpoint is whole
    assert os.listdir(tmp_path) == ["a.ckpt.npz"]  # no temporary file left behind


def test_never_unpickles(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, meta=np.array(json.dumps({"format": "smallem-checkpoint"})),
             **{"param/x": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(SmallemError, match="holds Python objects, which are never unpickled"):
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
    from smallem.files import write_json

    path = tmp_path / "run.json"
    write_json(path, {"held_out_loss": 1.5})
    assert json.loads(path.read_text()) == {"held_out_loss": 1.5}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dumps", broken)
    with pytest.raises(SmallemError, match="disk full; '.*run.json' is unchanged"):
        write_json(path, {"held_out_loss": 9.9})
    assert json.loads(path.read_text()) == {"held_out_loss": 1.5}  # the old results are whole
    assert os.listdir(tmp_path) == ["run.json"]
    with pytest.raises(SmallemError, match="is a folder: name a file in it"):
        write_json(tmp_path, {})


# edited or damaged checkpoints: one sentence each, before anything is allocated or changed ---
def rewrite(path, edit_meta=None, arrays=None):
    """Rewrite checkpoint `path` with its meta edited and some arrays replaced."""
    with np.load(path, allow_pickle=False) as archive:
        content = {k: archive[k] for k in archive.files}
    meta = json.loads(str(content["meta"]))
    if edit_meta:
        edit_meta(meta)
    content["meta"] = np.array(json.dumps(meta))
    content.update(arrays or {})
    np.savez(path, **content)
    return path


@pytest.fixture
def saved(tmp_path):
    model, opt = trained()
    meta = {"step": 3, "config": {"model": "mlp", "mlp": {"context": 4, "embed": 3,
                                                            "hidden": 5, "vocab": 7}},
            "sampler": np.random.default_rng(0).bit_generator.state,
            "history": [], "initial_loss": 2.0, "interval": [0.0, 0]}
    return save_checkpoint(tmp_path / "m.npz", model, opt, meta)


@pytest.mark.parametrize("edit, message", [
    (dict(arrays={"param/hidden.weight": np.full((12, 5), "x")}),
     "'param/hidden.weight' holds <U1 values, not numbers"),
    (dict(edit_meta=lambda m: m["config"].update(mlp="big")),
     "config.mlp is 'big', not a mapping of sizes"),
    (dict(edit_meta=lambda m: m["config"]["mlp"].update(hidden="5")),
     "config.mlp.hidden is '5', not a whole number"),
    (dict(edit_meta=lambda m: m["config"].update(sizes={"layers": "1"})),
     "config.sizes.layers is '1', not a whole number"),
    (dict(edit_meta=lambda m: m["config"].update(sizes=[2])), "config.sizes is \\[2\\], not a mapping"),
    (dict(edit_meta=lambda m: m.update(step="three")), "step is 'three', not a whole number"),
    (dict(edit_meta=lambda m: m.update(step=2.5)), "step is 2.5, not a whole number"),
    (dict(edit_meta=lambda m: m.update(step=-1)), "step is -1, not a whole number"),
    (dict(edit_meta=lambda m: m["sampler"]["state"].update(state="x")),
     "sampler state cannot be restored"),
    (dict(edit_meta=lambda m: m.update(sampler=[1, 2])), "sampler state cannot be restored"),
    (dict(edit_meta=lambda m: m.update(config=[])), "config is \\[\\], not a mapping"),
    (dict(edit_meta=lambda m: m.update(history={})), "history is {}, not a list"),
])
def test_an_edited_checkpoint_is_one_sentence(saved, edit, message):
    rewrite(saved, **edit)
    with pytest.raises(SmallemError, match=message) as info:
        load_checkpoint(saved)
    assert str(saved) in str(info.value) and "edited or damaged" in str(info.value)


def write_npy_member(path, name, header, data=b""):
    import io
    import zipfile

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(f"{name}.npy", buffer.getvalue() + data)


def test_a_header_claiming_a_trillion_elements_is_refused_before_allocating(saved):
    import zipfile

    with np.load(saved, allow_pickle=False) as archive:  # all but hidden.weight
        content = {k: archive[k] for k in archive.files if k != "param/hidden.weight"}
    np.savez(saved, **content)
    write_npy_member(saved, "param/hidden.weight", {"descr": "<f4", "fortran_order": False,
                                                    "shape": (10**6, 10**6)}, b"\0" * 240)
    assert "param/hidden.weight.npy" in zipfile.ZipFile(saved).namelist()
    with pytest.raises(SmallemError, match="claims shape \\[1000000, 1000000\\] of float32 "
                       "\\(4000000000000 bytes\\) but holds 240 bytes"):
        load_checkpoint(saved)


def test_an_object_array_is_refused_without_unpickling(saved):
    with np.load(saved, allow_pickle=False) as archive:
        content = {k: archive[k] for k in archive.files if k != "param/hidden.bias"}
    np.savez(saved, **content)
    write_npy_member(saved, "param/hidden.bias", {"descr": "|O", "fortran_order": False,
                                                  "shape": (5,)}, b"\x80\x04N." * 5)
    with pytest.raises(SmallemError, match="holds Python objects"):
        load_checkpoint(saved)


def test_a_folder_given_as_checkpoint(tmp_path):
    with pytest.raises(SmallemError, match="is a folder, not a checkpoint: pass a file"):
        load_checkpoint(tmp_path)


def test_an_unreadable_checkpoint_is_not_called_damaged(saved, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("smallem.training.checkpoint.open", denied, raising=False)
    with pytest.raises(SmallemError, match="cannot be opened: permission denied") as info:
        load_checkpoint(saved)
    assert "damaged" not in str(info.value)


def test_a_checkpoint_path_with_tilde(saved, monkeypatch):
    monkeypatch.setenv("HOME", str(saved.parent))
    assert load_checkpoint("~/m.npz").step == 3

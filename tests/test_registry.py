"""The registry of models: a new model is its file plus one entry (a throwaway model registered
here trains from the command line), every caller reads the entries, options of another model's
config are refused in one sentence, and 0.3's checkpoints (flat Transformer sizes) still load."""

import json
import re
from dataclasses import dataclass, fields

import numpy as np
import pytest

from smallem.autodiff.operations import cross_entropy
from smallem.data import VOCAB
from smallem.errors import SmallemError
from smallem.models import LanguageModel, MlpConfig, TransformerConfig
from smallem.nn import Embedding, Linear, Module
from smallem.tools.cli import main
from smallem.training import registry
from smallem.training.config import TrainConfig, build_model, config_from


@dataclass
class TinyConfig:  # the throwaway model's sizes
    context: int = 4
    vocab: int = VOCAB
    width: int = 8


class Tiny(Module):
    """The last byte's vector, then a Linear to the scores: a model small enough to define here."""

    def __init__(self, config=None, backend="cpu", seed=0):
        self.config = config or TinyConfig()
        rng = np.random.default_rng(seed)
        self.embedding = Embedding(self.config.vocab, self.config.width, backend=backend, rng=rng)
        self.output = Linear(self.config.width, self.config.vocab, backend=backend, rng=rng)

    def logits(self, tape, contexts):
        return self.output(tape, self.embedding(tape, np.asarray(contexts)[:, -1]))

    def loss(self, tape, contexts, targets):
        return cross_entropy(tape, self.logits(tape, contexts), targets)


TINY = registry.ModelEntry("tiny", Tiny, TinyConfig, registry.WINDOWS, batch=8, steps=2,
                           learning_rates={"adamw": 1e-2, "sgd": 0.1}, summary="tiny (a test's)",
                           options={"width": "numbers per byte"})


@pytest.fixture
def tiny():
    with registry.registered(TINY) as entry:
        yield entry
    assert "tiny" not in registry.names()  # taken away again




def test_a_throwaway_model_trains_two_steps_from_the_command_line(tiny, corpus, tmp_path, capsys):
    report = tmp_path / "tiny.json"
    assert main(["train", "--model", "tiny", "--steps", "2", "--width", "4", "--backend", "cpu",
                 "--corpus", str(corpus), "--log-every", "1", "--eval-every", "2",
                 "--json", str(report)]) == 0
    assert "held-out loss" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["steps"] == 2 and data["config"]["model"] == "tiny"
    assert data["config"]["sizes"] == {"context": 4, "vocab": VOCAB, "width": 4}
    assert data["config"]["batch"] == 8 and data["config"]["lr"] == 1e-2  # the entry's defaults
    assert data["parameters"] == VOCAB * 4 + 4 * VOCAB + VOCAB
    assert [r["step"] for r in data["history"]] == [0, 1, 2]


def test_a_model_meets_the_protocol_and_builds_from_its_entry():
    for entry in registry.entries():
        model = entry.build(entry.config(), "cpu", seed=0)
        assert isinstance(model, LanguageModel), entry.name
        assert type(model.config) is entry.config
        assert registry.for_config(model.config) is entry
        config = TrainConfig(model=entry.name)
        assert config.batch == entry.batch and config.steps == entry.steps
        assert config.learning_rate == entry.learning_rates["adamw"]
        assert build_model(config, "cpu").parameter_count() == model.parameter_count()
        quoted = re.search(r"([\d,]+) parameters", entry.summary)  # --model's help
        assert quoted is None or int(quoted[1].replace(",", "")) == model.parameter_count()


def test_the_command_line_offers_what_the_entries_say(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping: "log-sum-exp" stays one word
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "{" + ",".join(registry.names()) + "}" in out
    for name, text in registry.get("transformer").options.items():
        default, flag = getattr(TransformerConfig(), name), "--" + name.replace("_", "-")
        if isinstance(default, bool):  # a switch: --name / --no-name
            assert f"{flag}, --no-{flag[2:]} transformer: {text}" in out
        else:
            shown = f"{default:,}" if isinstance(default, int) else default
            assert f"{flag} {name.upper()} transformer: {text} (default {shown})" in out


def test_a_registered_model_shows_up_and_goes_away(tiny, capsys):
    assert "tiny" in registry.names()
    assert TrainConfig(model="tiny").sizes == TinyConfig()
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert registry.names()[-1] == "tiny"  # the last registered, listed after every other model
    assert "{" + ",".join(registry.names()) + "}" in out and "tiny: numbers per byte (default 8)" in out


@pytest.mark.parametrize("argv, option, owner", [
    (["--model", "mlp", "--context", "32"], "--context", "transformer"),
    (["--model", "mlp", "--layers", "0"], "--layers", "transformer"),
    (["--layers", "3"], "--layers", "transformer"),  # mlp by default
    (["--model", "bigram", "--heads", "2"], "--heads", "transformer"),
])
def test_a_size_of_another_models_config_is_refused(capsys, argv, option, owner):
    code = main(["train", "--steps", "1", *argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{option} is a size of the {owner}, not of the " in err
    assert f"train --model {owner}" in err


def test_the_throwaway_models_size_is_refused_for_the_transformer_and_shared_names_list_both(
        tiny, capsys):
    assert main(["train", "--model", "transformer", "--steps", "1", "--width", "7",
                 "--heads", "2"]) == 2  # --width is the Transformer's too: accepted, then 7 % 2
    assert "split evenly" in capsys.readouterr().err
    assert main(["train", "--model", "mlp", "--width", "4"]) == 2
    assert "--width is a size of the transformer and the tiny, not of the mlp" in \
        capsys.readouterr().err


def test_an_mlp_run_carries_only_the_mlps_sizes():
    saved = TrainConfig().to_json()
    assert saved["sizes"] == {f.name: getattr(MlpConfig(), f.name) for f in fields(MlpConfig)}
    assert not {"layers", "width", "heads", "context", "transformer"} & set(saved)
    assert 64 not in saved["sizes"].values()
    transformer = TrainConfig(model="transformer").to_json()
    assert transformer["sizes"]["context"] == 64 and "embed" not in transformer["sizes"]


def test_sizes_that_are_not_the_models_are_one_sentence():
    with pytest.raises(SmallemError, match="sizes is a TransformerConfig, but the mlp is configured "
                                           "by a MlpConfig"):
        TrainConfig(sizes=TransformerConfig())
    with pytest.raises(SmallemError, match="the mlp has no size 'layers'"):
        TrainConfig(sizes={"layers": 2})
    with pytest.raises(SmallemError, match="unknown model 'gpt': choose one of mlp, bigram"):
        TrainConfig(model="gpt")
    with pytest.raises(SmallemError, match="registered already"):
        registry.register(registry.get("mlp"))
    with pytest.raises(SmallemError, match="TinyConfig has no field 'depth'"):
        registry.ModelEntry("t", Tiny, TinyConfig, registry.WINDOWS, 1, 1, {}, "",
                            options={"depth": "?"})


# 0.3's checkpoints: the MLP's sizes under "mlp", the Transformer's flat beside them ---------------
V03_MLP = {"model": "mlp", "backend": "cpu", "steps": 10, "batch": 16, "optimizer": "adamw",
           "lr": 1e-3, "weight_decay": 0.01, "clip": None, "seed": 0, "corpus": None,
           "log_every": 5, "eval_every": 10, "capture": True, "layers": 2, "width": 128,
           "heads": 4, "context": 64, "eval_batches": 32, "save_every": 5000,
           "mlp": {"context": 16, "embed": 8, "hidden": 32, "vocab": VOCAB}}


def test_a_0_3_config_reads_as_the_nested_one():
    mlp = config_from(V03_MLP)
    assert mlp.sizes == MlpConfig(context=16, embed=8, hidden=32)
    assert mlp.batch == 16 and mlp.learning_rate == 1e-3
    transformer = config_from({**V03_MLP, "model": "transformer", "layers": 1, "width": 16,
                               "heads": 2, "context": 8})
    assert transformer.sizes == TransformerConfig(layers=1, width=16, heads=2, context=8)
    assert config_from({**V03_MLP, "model": "bigram"}).sizes == registry.get("bigram").config()
    with pytest.raises(SmallemError, match="split evenly"):
        config_from({**V03_MLP, "model": "transformer", "width": 10, "heads": 4})


def test_a_0_3_checkpoint_samples_and_resumes(tmp_path, capsys, corpus):
    """A checkpoint written as 0.3 wrote its config: loaded, sampled from, resumed."""
    from smallem.training.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / "new.ckpt.npz"
    assert main(["train", "--model", "transformer", "--steps", "2", "--batch", "2",
                 "--layers", "1", "--width", "8", "--heads", "2", "--context", "8",
                 "--backend", "cpu", "--corpus", str(corpus), "--log-every", "1",
                 "--eval-every", "2", "--save", str(path)]) == 0
    checkpoint = load_checkpoint(path)
    meta = dict(checkpoint.meta)
    sizes = meta["config"].pop("sizes")
    meta["config"].update(mlp={"context": 16, "embed": 32, "hidden": 512, "vocab": sizes["vocab"]},
                          **{k: sizes[k] for k in ("layers", "width", "heads", "context")})
    old = tmp_path / "old.ckpt.npz"
    model = build_model(config_from(checkpoint.config), "cpu")
    for name, p in model.named_parameters():
        p.assign(checkpoint.parameters[name], name)
    from smallem.optim import make_optimizer

    optimizer = make_optimizer("adamw", 1e-3)
    optimizer.load_state_dict(model.named_parameters(), checkpoint.optimizer)
    save_checkpoint(old, model, optimizer, {k: v for k, v in meta.items()
                                           if k not in ("format", "version", "optimizer")})
    assert "sizes" not in load_checkpoint(old).config and load_checkpoint(old).config["layers"] == 1
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(old), "--bytes", "5", "--prompt", "def"]) == 0
    assert capsys.readouterr().out.startswith("def")
    assert main(["train", "--resume", str(old), "--steps", "3", "--save",
                 str(tmp_path / "on.ckpt.npz")]) == 0
    assert main(["train", "--resume", str(old), "--steps", "4", "--heads", "4"]) == 2
    assert "heads is 4 but the checkpoint was trained with 2" in capsys.readouterr().err


def test_the_checks_read_the_registry():
    from smallem.training.checks import checked_models, run_checks

    checked = [e.name for e in registry.entries() if e.checked]
    assert checked_models() == tuple(checked) and {"mlp", "transformer"} <= set(checked)
    unchecked = [name for name in registry.names() if name not in checked]
    assert "bigram" in unchecked
    for name in unchecked:
        with pytest.raises(SmallemError, match=f"the checks do not apply to the {name}"):
            run_checks("cpu", model=name)
    unknown = "_".join(registry.names())  # a name no entry has
    with pytest.raises(SmallemError, match=f"unknown model '{unknown}'"):
        run_checks("cpu", model=unknown)

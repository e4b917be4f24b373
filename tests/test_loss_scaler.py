"""fp16's loss scaler (backends/precision.LossScaler): its arguments checked, its state saved in a
run's checkpoint, so that an fp16 run resumed is the run continued (issue 40)."""

import numpy as np
import pytest

from smallem.backends.precision import LossScaler
from smallem.data import load_corpus
from smallem.errors import SmallemError
from smallem.models.mlp import MlpConfig
from smallem.training.config import TrainConfig
from smallem.training.loop import train


@pytest.mark.parametrize("kwargs, words", [
    (dict(scale=float("inf")), "must be finite, got inf"),
    (dict(scale=float("nan")), "must be finite, got nan"),
    (dict(scale=0.0), "must be above 0, got 0.0"),
    (dict(scale=-8.0), "must be above 0, got -8.0"),
    (dict(scale="65536"), "must be a number"),
    (dict(interval=0), "interval must be a whole number of steps, 1 or more, got 0: with 0 the "
                       "scale would never grow"),
    (dict(interval=2.5), "interval must be a whole number"),
    (dict(clean=-1), "clean must be a whole number of steps, 0 or more, got -1"),
])
def test_a_scaler_that_cannot_work_is_refused_in_one_sentence(kwargs, words):
    with pytest.raises(SmallemError, match=words.replace("(", r"\(")) as caught:
        LossScaler(**kwargs)
    assert "\n" not in str(caught.value)


def test_the_state_round_trips_and_a_damaged_one_is_refused():
    s = LossScaler(scale=1024.0, interval=3)
    for finite in (True, False, True, True):
        s.update(finite)
    t = LossScaler()
    t.load_state(s.state())
    assert t == s and t.state() == {"scale": 512.0, "interval": 3, "clean": 2, "skipped": 1}
    with pytest.raises(SmallemError, match="edited or damaged"):
        t.load_state({"scale": 1.0})
    with pytest.raises(SmallemError, match="must be finite"):
        t.load_state({**s.state(), "scale": float("inf")})


SMALL = MlpConfig(context=16, embed=8, hidden=32)


def _config(steps):
    return TrainConfig(backend="cpu", precision="fp16", steps=steps, batch=32, log_every=10,
                       eval_every=130, eval_batches=1, save_every=0, sizes=SMALL)


def test_an_fp16_run_resumed_is_the_run_continued(tmp_path):
    """230 steps, saved, resumed to 260, against 260 straight: the scale doubled at step 200
    (interval 200), so a resumed run that restarts at 2^16 takes other steps from there."""
    corpus = load_corpus(max_bytes=300_000)
    quiet = dict(corpus=corpus, progress=False, log=None)
    straight = train(_config(260), **quiet)
    path = tmp_path / "fp16.ckpt.npz"
    train(_config(230), save=path, **quiet)
    resumed = train(_config(260), resume=path, **quiet)
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)
    assert straight.optimizer.loss_scaler.scale == 2.0 ** 17  # the doubling happened
    assert resumed.optimizer.loss_scaler == straight.optimizer.loss_scaler

"""The hostile-input audit's last answers (issue 22): power's gradient where the base is 0, an
unreadable folder inside a corpus, and a corpus too small for its held-out evaluation."""

import os
import warnings

import numpy as np
import pytest

from smallem import Tape
from smallem.data import CONTEXT, HELD_OUT_FRACTION, fixed_batches, load_corpus
from smallem.errors import SmallemWarning

INF, NAN = float("inf"), float("nan")
# d/da aᵖ summed over a = [0, 2, -2], as PyTorch 2.13 (CPU, float64) gives it.
TORCH = {0.0: [0.0, 0.0, 0.0], 1.0: [1.0, 1.0, 1.0], 2.0: [0.0, 4.0, -4.0], 3.0: [0.0, 12.0, 12.0],
         0.5: [INF, 0.35355339059327373, NAN], 1.5: [0.0, 2.121320343559643, NAN],
         -1.0: [-INF, -0.25, -0.25], -0.5: [-INF, -0.1767766952966369, NAN],
         -2.0: [-INF, -0.25, 0.25]}


@pytest.mark.parametrize("backend", ["cpu64", "cpu"])
@pytest.mark.parametrize("p", list(TORCH))
def test_power_gradient_at_zero_is_pytorchs(backend, p):
    tape = Tape(backend)
    a = tape.leaf(np.array([0.0, 2.0, -2.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 0 ** -1 in the forward
        grad = np.asarray(tape.backward(tape.sum(tape.power(a, p)))[a], dtype=np.float64)
    np.testing.assert_allclose(grad, TORCH[p], rtol=1e-6)  # inf and NaN where PyTorch has them


def _docs(folder, count, text="def f(x):\n    return x * 2\n" * 30):
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        (folder / f"doc{k:02d}.py").write_text(text)


def test_a_folder_listed_but_not_entered_is_named_once(tmp_path, monkeypatch):
    """A folder readable but not searchable (mode 644) lists its files, none of which can be
    looked at; pathlib's is_file() answers False for them on Python 3.14, so the files were
    skipped in silence. (Root ignores modes: permission errors are raised by hand here.)"""
    _docs(tmp_path, 12)
    _docs(tmp_path / "locked", 6)
    real_stat, real_is_file = type(tmp_path).stat, type(tmp_path).is_file

    def stat(self, *args, **kwargs):
        if self.parent.name == "locked":
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)

    def is_file(self, *args, **kwargs):
        return False if self.parent.name == "locked" else real_is_file(self, *args, **kwargs)

    monkeypatch.setattr(type(tmp_path), "stat", stat)
    monkeypatch.setattr(type(tmp_path), "is_file", is_file)
    with pytest.warns(SmallemWarning) as caught:
        corpus = load_corpus(tmp_path)
    messages = [str(w.message) for w in caught if "skipped" in str(w.message)]
    assert messages == ["skipped corpus folder 'locked', which cannot be read: permission denied; "
                        "fix its permissions to include it"]
    assert len(corpus.names) == 12


def test_a_corpus_too_small_for_its_evaluation_says_what_is_enough(tmp_path):
    _docs(tmp_path, 12)  # 12 × 810 bytes: 1 KB held out
    corpus = load_corpus(tmp_path)
    with pytest.warns(SmallemWarning, match=r"fewer than the 8,192 an evaluation reads \(32 "
                      r"batches of 256\): its loss measures little; a corpus of 82,080 bytes"):
        fixed_batches(corpus.held_out, 256, 32)
    enough = int(np.ceil((8192 + CONTEXT) / HELD_OUT_FRACTION))
    _docs(tmp_path / "more", 12, "x = 1\n" * (enough // 60))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallemWarning)
        fixed_batches(load_corpus(tmp_path).held_out, 256, 32)  # large enough: not a word
    assert os.path.isdir(tmp_path / "more")

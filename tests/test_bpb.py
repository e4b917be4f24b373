"""Bits per byte: the definition checked on models whose losses are known (uniform, the
bigram's table, the MLP's windows, one Transformer window), each target scored once, and a
token model scored on the tokens that cover exactly the same bytes."""

import math

import numpy as np
import pytest

from smallem import SmallemError
from smallem import tokens as T
from smallem.autodiff.tape import Tape
from smallem.backends import get_backend
from smallem.data import BOUNDARY, PAD, load_corpus
from smallem.models.bigram import Bigram
from smallem.models.mlp import Mlp, MlpConfig
from smallem.models.transformer import Transformer, TransformerConfig
from smallem.training.bpb import bits_per_byte, held_out_span

BE = get_backend("cpu64")
TEXT = open(T.__file__, "rb").read()


def stream_of(data: bytes, docs: int = 3) -> np.ndarray:
    parts = []
    for k in range(docs):
        parts += [BOUNDARY] + list(data[k * 500:(k + 1) * 500])
    return np.array(parts, dtype=np.int64)


def test_the_span_is_one_boundary_then_the_first_bytes_of_the_held_out_part():
    held = stream_of(TEXT)  # three documents of 500 bytes
    span = held_out_span(held, 1200)
    assert span[0] == BOUNDARY and span.size == 1 + 1200
    assert np.array_equal(span, held[:1201])  # the boundaries between documents are in it
    inside = held[1:]  # a held-out part split inside a stream: no boundary to start with
    assert np.array_equal(held_out_span(inside, 100), np.concatenate([[BOUNDARY], inside[:100]]))
    with pytest.raises(SmallemError, match="held-out part is empty"):
        held_out_span(np.array([BOUNDARY]))


def test_a_uniform_model_scores_log2_of_its_vocabulary_per_target():
    m = Transformer(TransformerConfig(layers=1, width=8, heads=2, context=16), BE)
    m.head.weight.assign(np.zeros((8, 257)), "head.weight")  # logits = bias = 0: uniform
    span = held_out_span(stream_of(TEXT), 400)
    score = bits_per_byte(m, span)
    assert score.bits_per_byte == pytest.approx(math.log2(257), rel=1e-12)
    assert score.nats_per_target == pytest.approx(math.log(257), rel=1e-12)
    assert score.targets == score.bytes == 400


def test_the_bigram_scores_its_table_on_every_byte():
    train = stream_of(TEXT[1500:], docs=4)
    bigram = Bigram.fit(train, backend=BE)
    span = held_out_span(stream_of(TEXT), 500)
    table = bigram.table.weight.numpy()
    log_p = table - np.log(np.exp(table).sum(axis=1, keepdims=True))
    nats = -sum(log_p[a, b] for a, b in zip(span[:-1], span[1:]))
    score = bits_per_byte(bigram, span)
    assert score.bytes == 500 and score.bits_per_byte == pytest.approx(nats / math.log(2) / 500,
                                                                       rel=1e-12)


def test_the_mlp_reads_the_window_before_each_byte_padded_at_the_start():
    m = Mlp(MlpConfig(context=4, embed=3, hidden=8), BE, seed=1)
    span = held_out_span(stream_of(TEXT), 200)
    padded = np.concatenate([[PAD] * 3, span])
    tape = Tape(BE)
    contexts = np.array([padded[j:j + 4] for j in range(200)])
    nats = BE.item(tape.value(m.loss(tape, contexts, span[1:]))) * 200
    assert bits_per_byte(m, span).bits_per_byte == pytest.approx(nats / math.log(2) / 200,
                                                               rel=1e-12)


def test_a_transformer_scores_each_target_once_with_half_a_window_before_it():
    m = Transformer(TransformerConfig(layers=1, width=8, heads=2, context=8), BE, seed=2)
    span = held_out_span(stream_of(TEXT), 30)

    def window_nats(start, first):  # targets start+first+1 .. start+8 scored in this window
        tape = Tape(BE)
        z = np.asarray(tape.value(m.logits(tape, span[None, start:start + 8])))[0]
        z = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return -sum(z[j, span[start + j + 1]] for j in range(first, 8))

    # 30 targets, windows of 8 moved by 4: starts 0, 4, ..., 20, 22 (the last one flush)
    expected = window_nats(0, 0) + sum(window_nats(s, 4) for s in range(4, 21, 4)) + window_nats(22, 6)
    score = bits_per_byte(m, span)
    assert score.targets == 30
    assert score.bits_per_byte == pytest.approx(expected / math.log(2) / 30, rel=1e-12)


def test_a_token_model_is_scored_on_the_tokens_covering_exactly_the_bytes():
    corpus = load_corpus(max_bytes=300_000)
    tokenizer = T.Tokenizer(T.train(corpus.train, 400))
    span = held_out_span(corpus.held_out, 5_000)
    ids = tokenizer.encode(span)
    assert ids[0] == BOUNDARY and np.array_equal(tokenizer.decode(ids), span)
    m = Transformer(TransformerConfig(layers=1, width=8, heads=2, context=16, vocab=400), BE)
    m.head.weight.assign(np.zeros((8, 400)), "head.weight")
    score = bits_per_byte(m, span, tokenizer)
    assert score.targets == ids.size - 1 < score.bytes == span.size - 1
    # uniform over 400 ids: log2(400) bits per token, fewer tokens than bytes
    assert score.bits_per_byte == pytest.approx(math.log2(400) * score.targets / score.bytes,
                                                rel=1e-12)

"""`sample`'s arguments refused in one sentence: a prompt that is no text, a tokenizer that is
not the model's (its ids were looked up in the wrong table: an IndexError)."""

import re

import pytest

from smallem import SmallemError
from smallem import tokens as T
from smallem.backends import get_backend
from smallem.models.transformer import Transformer, TransformerConfig
from smallem.training.generate import sample


def model(vocab=257):
    return Transformer(TransformerConfig(layers=1, width=8, heads=2, context=8, vocab=vocab),
                       get_backend("cpu64"), seed=0)


def test_an_int_prompt_is_refused_not_read_as_an_empty_one():
    with pytest.raises(SmallemError, match=r"the prompt must be text or bytes, got int 42: write it "
                                           r"as text, e.g. sample\(model, '42'\)"):
        sample(model(), 42)


def test_a_token_model_sampled_with_another_tokenizer_is_one_sentence():
    tokens = model(vocab=260)
    other = T.Tokenizer([(97, 98)])  # 258 ids
    for tokenizer, said in [(other, "a tokenizer of 258 ids"), (None, "bytes (257 ids)")]:
        with pytest.raises(SmallemError, match=re.escape(f"this model scores 260 ids, but was given {said}")):
            sample(tokens, "ab", 20, temperature=1.0, tokenizer=tokenizer)
    with pytest.raises(SmallemError, match="scores 257 ids, but was given a tokenizer of 258"):
        sample(model(), "ab", 20, tokenizer=other)
    own = T.Tokenizer([(97, 98), (257, 99), (32, 97)])
    assert isinstance(sample(tokens, "ab", 20, tokenizer=own), str)

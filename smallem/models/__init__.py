"""Models, built from nn.py's modules: the bigram baseline (bigram.py), the Bengio 2003 byte
MLP (mlp.py), a small GPT for lessons 11-12 (transformer.py), a vanilla RNN for lesson 08
(rnn.py), and the 2-2-1 ReLU network of lessons 01 and 07 (toy.py), written straight on the
tape so every number of it can be shown. protocol.py says what a language model provides."""

from . import toy
from .bigram import Bigram, BigramConfig
from .mlp import Mlp, MlpConfig
from .protocol import LanguageModel, ModelConfig
from .rnn import RNN, hidden_gradient_norms, spectral_radius
from .transformer import Transformer, TransformerConfig

__all__ = ["Bigram", "BigramConfig", "LanguageModel", "ModelConfig", "Mlp", "MlpConfig", "RNN",
           "hidden_gradient_norms", "spectral_radius", "toy", "Transformer", "TransformerConfig"]

"""Models: the bigram baseline (bigram.py) and the Bengio 2003 byte MLP (mlp.py), built from
nn.py's modules; a vanilla RNN (rnn.py) for lesson 08; and the 2-2-1 ReLU network of lessons 01
and 07 (toy.py), written straight on the tape so every number of it can be shown. Import each
from its own module."""

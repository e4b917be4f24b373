"""Models built from nn.py's modules: the bigram baseline (bigram.py), the Bengio 2003 byte
MLP (mlp.py), the 2-2-1 ReLU network of the hand-computed lesson (toy.py), a vanilla RNN
(rnn.py). Import each from its own module."""

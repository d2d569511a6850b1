"""Decoder building blocks shared by every model family (and by vision/ decoders).

Each layer owns its parameters under the names the models use and, where a
checkpoint stores a parameter in pieces (q/k/v, gate/up), a `weight_loader`
attribute on the parameter that places one piece (see llm/weights.py).
"""

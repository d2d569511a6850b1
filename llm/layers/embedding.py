"""Token embedding and the LM head (optionally tied to the embedding, optionally soft-capped)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from vlchat.kernels.ops import linear
from vlchat.llm.layers.linear import default_weight_loader


class VocabEmbedding(nn.Module):
    """Token id -> row of weight [vocab, hidden]; `scale` multiplies the rows (Gemma uses sqrt(hidden))."""

    def __init__(self, vocab_size: int, hidden_size: int, scale: float | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.scale = scale
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [tokens] -> [tokens, hidden]
        x = F.embedding(input_ids, self.weight)
        if self.scale is not None:
            x = x * _rounded(self.scale, x.dtype)
        return x


@functools.cache
def _rounded(scale: float, dtype: torch.dtype) -> float:
    """`scale` rounded to `dtype`, as transformers rounds the normaliser; a host float, so CUDA graphs can capture."""
    return float(torch.tensor(scale, dtype=dtype))


class LMHead(nn.Module):
    """hidden -> fp32 logits over the vocabulary; `tie(embedding)` shares the embedding's weight.

    `softcap` > 0 applies `softcap * tanh(logits / softcap)` (Gemma's final logit soft-capping).
    """

    def __init__(self, vocab_size: int, hidden_size: int, softcap: float = 0.0) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.softcap = softcap
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def tie(self, embedding: VocabEmbedding) -> None:
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [rows, hidden] -> [rows, vocab] fp32
        logits = linear(hidden, self.weight, out_dtype=torch.float32)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

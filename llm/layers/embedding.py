"""Token embedding and the LM head (optionally tied to the embedding, optionally soft-capped).

Vocab-parallel over a `TPGroup` of size > 1: each rank holds a contiguous slice of
ceil(vocab / size) rows (the last rank's tail past the vocabulary is zeros). The
embedding looks up the ids in its slice, zeroes the others and all-reduces; the
head computes its slice's logits and all-gathers them.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from vlchat.kernels.ops import linear
from vlchat.llm.layers.linear import copy_weight
from vlchat.llm.parallel import SINGLE, TPGroup, all_gather, all_reduce


def _vocab_rows(vocab_size: int, tp: TPGroup) -> tuple[int, int]:
    """(first row, rows per rank) of this rank's vocabulary slice."""
    per_rank = -(-vocab_size // tp.size)
    return tp.rank * per_rank, per_rank


def _vocab_loader(vocab_size: int, tp: TPGroup):
    start, per_rank = _vocab_rows(vocab_size, tp)

    def load(param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
        if tp.size == 1:
            copy_weight(param, loaded)
            return
        if loaded.shape[0] != vocab_size:
            raise ValueError(f"shape: checkpoint {tuple(loaded.shape)} has not the vocabulary's {vocab_size} rows")
        rows = loaded[start : start + per_rank]
        param.data[rows.shape[0] :].zero_()
        copy_weight(param.data[: rows.shape[0]], rows)

    return load


class VocabEmbedding(nn.Module):
    """Token id -> row of weight [vocab, hidden]; `scale` multiplies the rows (Gemma uses sqrt(hidden))."""

    def __init__(
        self, vocab_size: int, hidden_size: int, scale: float | None = None, tp: TPGroup = SINGLE, quant=None
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.scale = scale
        self.tp = tp
        self.quant = quant  # rows served from quantized blocks (llm/gguf_layers.py), or None
        self.vocab_start, rows = _vocab_rows(vocab_size, tp)
        if quant is not None:
            self.weight = quant.embedding_param(self)
        else:
            self.weight = nn.Parameter(torch.empty(rows, hidden_size), requires_grad=False)
            self.weight.weight_loader = _vocab_loader(vocab_size, tp)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [tokens] -> [tokens, hidden]
        if self.quant is not None:
            x = self.quant.lookup(self, input_ids)
        elif self.tp.size == 1:
            x = F.embedding(input_ids, self.weight)
        else:
            local = input_ids - self.vocab_start
            mine = (local >= 0) & (local < self.weight.shape[0])  # [tokens]
            x = F.embedding(local * mine, self.weight) * mine.unsqueeze(1).to(self.weight.dtype)
            all_reduce(x)
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

    def __init__(
        self, vocab_size: int, hidden_size: int, softcap: float = 0.0, tp: TPGroup = SINGLE, quant=None
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.softcap = softcap
        self.tp = tp
        self.quant = quant  # logits from quantized blocks (llm/gguf_layers.py), or None
        _, rows = _vocab_rows(vocab_size, tp)
        if quant is not None:
            self.weight = quant.embedding_param(self)
        else:
            self.weight = nn.Parameter(torch.empty(rows, hidden_size), requires_grad=False)
            self.weight.weight_loader = _vocab_loader(vocab_size, tp)

    def tie(self, embedding: VocabEmbedding) -> None:
        self.weight = embedding.weight
        if self.quant is not None:
            self._tied = [embedding]  # a list, not a submodule: the embedding's blocks arrive after tying

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [rows, hidden] -> [rows, vocab] fp32
        if self.quant is not None:
            logits = self.quant.head_logits(self._tied[0] if hasattr(self, "_tied") else self, hidden)
        else:
            logits = linear(hidden, self.weight, out_dtype=torch.float32)
        if self.tp.size > 1:  # [rows, vocab / tp] per rank -> [rows, vocab]
            logits = all_gather(logits, self.tp.size)[:, : self.vocab_size]
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

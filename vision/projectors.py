"""Projectors from vision features to the LLM's hidden size (HF names: linear_1, linear_2, layer_norm)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from vlchat.llm.weights import load_tensors
from vlchat.vision.layers import activation


class MultiModalProjector(nn.Module):
    """[optional LayerNorm] -> linear_1 -> act -> linear_2: LLaVA's MLP projector and InternVL's (with the norm)."""

    def __init__(self, in_dim: int, out_dim: int, act: str, bias: bool = True, norm: bool = False) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(in_dim) if norm else None
        self.linear_1 = nn.Linear(in_dim, out_dim, bias=bias)
        self.act = activation(act)()
        self.linear_2 = nn.Linear(out_dim, out_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.linear_2(self.act(self.linear_1(x)))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_tensors(self, weights, [], "the projector")

"""Gated MLP activations over a fused [gate | up] projection (kernels.ops)."""

from __future__ import annotations

import torch
from torch import nn

from vlchat.kernels.ops import gelu_tanh_and_mul, silu_and_mul
from vlchat.llm.errors import UnsupportedModelError


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [tokens, 2 * inter] -> [tokens, inter]
        return silu_and_mul(x)


class GeluTanhAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [tokens, 2 * inter] -> [tokens, inter]
        return gelu_tanh_and_mul(x)


_ACTIVATIONS = {
    "silu": SiluAndMul,
    "swish": SiluAndMul,
    "gelu_pytorch_tanh": GeluTanhAndMul,
    "gelu_tanh": GeluTanhAndMul,
}


def get_act_and_mul(hidden_act: str) -> nn.Module:
    """The gated activation for a config's `hidden_act` (or `hidden_activation`)."""
    if hidden_act not in _ACTIVATIONS:
        raise UnsupportedModelError(f"hidden_act={hidden_act!r}", list(_ACTIVATIONS))
    return _ACTIVATIONS[hidden_act]()

"""RMSNorm over the last dim, optionally fused with the residual add (kernels.ops.rms_norm)."""

from __future__ import annotations

import torch
from torch import nn

from vlchat.kernels.ops import rms_norm


class RMSNorm(nn.Module):
    """RMSNorm with weight [hidden]; `weight_offset=1.0` gives Gemma's `(1 + weight)` scale.

    `forward(x)` -> normed; `forward(x, residual)` -> (normed, x + residual), the
    decoder's fused "add the residual, then normalise" step. Works on any leading
    shape (e.g. [tokens, heads, head_dim] for q/k norms).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight_offset = weight_offset
        init = torch.zeros if weight_offset else torch.ones
        self.weight = nn.Parameter(init(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        shape = x.shape
        x2 = x.reshape(-1, self.hidden_size)  # [rows, hidden]
        if residual is None:
            return rms_norm(x2, self.weight, self.eps, weight_offset=self.weight_offset).view(shape)
        out, new_residual = rms_norm(
            x2, self.weight, self.eps, residual=residual.reshape(-1, self.hidden_size), weight_offset=self.weight_offset
        )
        return out.view(shape), new_residual.view(shape)

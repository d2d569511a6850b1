"""Linear layers, including the fused ones whose weights come from several checkpoint tensors.

A fused layer runs one GEMM for what the checkpoint stores as several matrices
(q/k/v, gate/up). Its parameters carry `weight_loader(param, tensor, shard)`
placing one piece at its rows, and `shards`, the pieces a complete load needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlchat.kernels.ops import linear
from vlchat.kernels.ops.linear import GEMV_MAX_TOKENS


def copy_weight(param: torch.Tensor, loaded: torch.Tensor, what: str = "") -> None:
    """Copy `loaded` into `param` (casting dtype); a shape mismatch raises ValueError naming `what`."""
    if tuple(param.shape) != tuple(loaded.shape):
        label = f" {what}" if what else ""
        raise ValueError(f"shape{label}: checkpoint {tuple(loaded.shape)} vs model {tuple(param.shape)}")
    param.data.copy_(loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
    copy_weight(param, loaded)


class Linear(nn.Module):
    """y = x W^T + b with W: [out_features, in_features]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        for p in self._own_params():
            p.weight_loader = self.weight_loader
            p.shards = self.shard_ids()

    def _own_params(self) -> list[nn.Parameter]:
        return [p for p in (self.weight, self.bias) if p is not None]

    def shard_ids(self) -> tuple:
        return (None,)

    def shard_range(self, shard) -> tuple[int, int]:
        """Rows [start, end) of the fused output that hold checkpoint piece `shard`."""
        return 0, self.out_features

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
        if shard is None:
            copy_weight(param, loaded)
            return
        start, end = self.shard_range(shard)
        copy_weight(param.data[start:end], loaded, f"of piece {shard!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]; a graph-captured decode step's one row takes the GEMV.
        # More rows run the GEMM whatever the backend (kernels.ops.linear): called here without the dispatch's
        # host cost (docs/PERF.md#gemv-and-linear)
        if x.numel() > GEMV_MAX_TOKENS * self.in_features:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        return linear(rows, self.weight, self.bias).view(*x.shape[:-1], self.out_features)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output (e.g. gate_up); pieces are 0, 1, ..."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(in_features, sum(output_sizes), bias)

    def shard_ids(self) -> tuple:
        return tuple(range(len(self.output_sizes)))

    def shard_range(self, shard) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard])
        return start, start + self.output_sizes[shard]


class QKVLinear(Linear):
    """The fused q/k/v projection: rows [q heads | k heads | v heads], pieces "q", "k", "v"."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False) -> None:
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias)

    def shard_ids(self) -> tuple:
        return ("q", "k", "v")

    def shard_range(self, shard) -> tuple[int, int]:
        start = {"q": 0, "k": self.q_size, "v": self.q_size + self.kv_size}[shard]
        return start, start + (self.q_size if shard == "q" else self.kv_size)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # qkv: [tokens, q_size + 2 * kv_size] -> q [tokens, heads, d], k/v [tokens, kv_heads, d]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return (
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
        )

"""Linear layers, including the fused ones whose weights come from several checkpoint tensors.

A fused layer runs one GEMM for what the checkpoint stores as several matrices
(q/k/v, gate/up). Its parameters carry `weight_loader(param, tensor, shard)`
placing one piece at its rows, and `shards`, the pieces a complete load needs.

Built with a `QuantConfig` (llm/quantization.py), a layer holds 4-bit codes instead of `weight`: `qweight`,
`scales`, and where the format has them `zeros` and `g_idx`, in the W4A16 kernel's layout (output columns last,
so a piece of a fused layer fills columns, not rows). The loader converts each checkpoint tensor to that layout;
the pieces of a fused layer share one g_idx (they read the same input), and a piece with another is refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlchat.kernels.ops import linear
from vlchat.kernels.ops.linear import GEMV_MAX_TOKENS
from vlchat.kernels.ops.quant_linear import w4a16_linear


def copy_weight(param: torch.Tensor, loaded: torch.Tensor, what: str = "") -> None:
    """Copy `loaded` into `param` (casting dtype); a shape mismatch raises ValueError naming `what`."""
    if tuple(param.shape) != tuple(loaded.shape):
        label = f" {what}" if what else ""
        raise ValueError(f"shape{label}: checkpoint {tuple(loaded.shape)} vs model {tuple(param.shape)}")
    param.data.copy_(loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
    copy_weight(param, loaded)


class Linear(nn.Module):
    """y = x W^T + b with W: [out_features, in_features], or W held as 4-bit codes when `quant` is given."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, quant=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.quant = quant
        if quant is None:
            self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        else:
            self.weight = None
            self.register_parameter("zeros", None)
            self.register_parameter("g_idx", None)
            for role, (shape, dtype) in quant.param_shapes(in_features, out_features).items():
                param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
                param.quant_role = role
                setattr(self, role, param)
            self._g_idx_pieces: set = set()
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        for p in self._own_params():
            p.weight_loader = self.weight_loader
            p.shards = self.shard_ids()

    def _own_params(self) -> list[nn.Parameter]:
        return [p for p in self.parameters(recurse=False) if p is not None]

    def shard_ids(self) -> tuple:
        return (None,)

    def shard_range(self, shard) -> tuple[int, int]:
        """Rows [start, end) of the fused output that hold checkpoint piece `shard`."""
        return 0, self.out_features

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
        role = getattr(param, "quant_role", None)
        if role is not None:
            self._load_quantized(param, role, self.quant.to_kernel_layout(role, loaded), shard)
            return
        if shard is None:
            copy_weight(param, loaded)
            return
        start, end = self.shard_range(shard)
        copy_weight(param.data[start:end], loaded, f"of piece {shard!r}")

    def _load_quantized(self, param: nn.Parameter, role: str, loaded: torch.Tensor, shard) -> None:
        if role == "g_idx":  # one input, one row order: every piece must bring the same g_idx
            if self._g_idx_pieces and not torch.equal(param.data, loaded.to(param.device)):
                raise ValueError(f"piece {shard!r} has another g_idx than the pieces before it of this fused layer")
            copy_weight(param, loaded)
            self._g_idx_pieces.add(shard)
            return
        if shard is None:
            copy_weight(param, loaded)
            return
        start, end = self.shard_range(shard)
        copy_weight(param.data[:, start:end], loaded, f"of piece {shard!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]; a graph-captured decode step's one row takes the GEMV.
        # More rows run the GEMM whatever the backend (kernels.ops.linear): called here without the dispatch's
        # host cost (4 us a call on the H200's host)
        if self.quant is not None:
            rows = x.reshape(-1, self.in_features)
            y = w4a16_linear(rows, self.qweight, self.scales, self.zeros, self.g_idx, self.quant.group_size, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        if x.numel() > GEMV_MAX_TOKENS * self.in_features:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        return linear(rows, self.weight, self.bias).view(*x.shape[:-1], self.out_features)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output (e.g. gate_up); pieces are 0, 1, ..."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False, quant=None) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(in_features, sum(output_sizes), bias, quant)

    def shard_ids(self) -> tuple:
        return tuple(range(len(self.output_sizes)))

    def shard_range(self, shard) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard])
        return start, start + self.output_sizes[shard]


class QKVLinear(Linear):
    """The fused q/k/v projection: rows [q heads | k heads | v heads], pieces "q", "k", "v"."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False, quant=None
    ) -> None:
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias, quant)

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

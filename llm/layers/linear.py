"""Linear layers, including the fused ones whose weights come from several checkpoint tensors.

A fused layer runs one GEMM for what the checkpoint stores as several matrices
(q/k/v, gate/up). Its parameters carry `weight_loader(param, tensor, shard)`
placing one piece at its rows, and `shards`, the pieces a complete load needs.

Built with a quantization config (llm/quantization.py, llm/quant_fp8.py), a layer holds the parameters the
config names in its kernel's layout instead of a 16-bit `weight`, converts each checkpoint tensor to that layout
(`to_kernel_layout`) and runs the config's product (`forward`). A fused layer's pieces lie along the config's
`shard_dim` (the 4-bit codes keep the output columns last); a one-value (per-tensor) scale fills its piece; the
pieces of a fused layer share one g_idx (they read the same input), and a piece with another is refused.
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
            for role, (shape, dtype) in quant.buffer_shapes(in_features, out_features).items():
                self.register_buffer(role, torch.empty(shape, dtype=dtype))  # filled with the weight it belongs to
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
            for part, tensor in self.quant.to_kernel_layout(role, loaded).items():
                self._load_quantized(part, tensor, shard)
            return
        if shard is None:
            copy_weight(param, loaded)
            return
        start, end = self.shard_range(shard)
        copy_weight(param.data[start:end], loaded, f"of piece {shard!r}")

    def _load_quantized(self, role: str, loaded: torch.Tensor, shard) -> None:
        target = getattr(self, role)
        if role == "g_idx":  # one input, one row order: every piece must bring the same g_idx
            if self._g_idx_pieces and not torch.equal(target.data, loaded.to(target.device)):
                raise ValueError(f"piece {shard!r} has another g_idx than the pieces before it of this fused layer")
            copy_weight(target, loaded)
            self._g_idx_pieces.add(shard)
            return
        dst = target.data
        if shard is not None:
            start, end = self.shard_range(shard)
            dst = dst.narrow(self.quant.shard_dim(role), start, end - start)
        if loaded.numel() == 1 and dst.numel() > 1:  # a per-tensor scale: every row of the piece takes it
            loaded = loaded.reshape(()).expand(dst.shape)
        copy_weight(dst, loaded, f"of piece {shard!r}" if shard is not None else "")

    def finish_loading(self) -> None:
        """Called once every checkpoint tensor is in (llm/weights.py): the quantization config may re-lay them."""
        if self.quant is not None:
            self.quant.finish(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]; a graph-captured decode step's one row takes the GEMV.
        # More rows run the GEMM whatever the backend (kernels.ops.linear): called here without the dispatch's
        # host cost (4 us a call on the H200's host)
        if self.quant is not None:
            return self.quant.forward(self, x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)
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

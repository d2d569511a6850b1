"""Linear layers, including the fused ones whose weights come from several checkpoint tensors.

A fused layer runs one GEMM for what the checkpoint stores as several matrices
(q/k/v, gate/up). Its parameters carry `weight_loader(param, tensor, shard)`
placing one piece at its rows, and `shards`, the pieces a complete load needs.

Tensor parallelism (Megatron): given a `TPGroup` (llm/parallel.py) of size > 1,
`Linear` and its fused subclasses are column-parallel: each rank holds its slice
of every piece's output rows (for q/k/v: its query heads and their KV heads), and
the loader cuts that slice from the full checkpoint tensor. `RowParallelLinear`
splits the input columns and sums the ranks' partial outputs with one all-reduce.
The default group of one rank is the plain replicated layer (vision towers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlchat.kernels.ops import linear
from vlchat.kernels.ops.linear import GEMV_MAX_TOKENS
from vlchat.llm.parallel import SINGLE, TPGroup, all_reduce


def copy_weight(param: torch.Tensor, loaded: torch.Tensor, what: str = "") -> None:
    """Copy `loaded` into `param` (casting dtype); a shape mismatch raises ValueError naming `what`."""
    if tuple(param.shape) != tuple(loaded.shape):
        label = f" {what}" if what else ""
        raise ValueError(f"shape{label}: checkpoint {tuple(loaded.shape)} vs model {tuple(param.shape)}")
    param.data.copy_(loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
    copy_weight(param, loaded)


class Linear(nn.Module):
    """y = x W^T + b with W: [out_features, in_features]; column-parallel over `tp` (out_features is this rank's)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.tp = tp
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
        """Rows [start, end) of this rank's fused output that hold its part of checkpoint piece `shard`."""
        return 0, self.out_features

    def rank_rows(self, shard) -> tuple[int, int, int]:
        """(start, end, total): the rows [start, end) of checkpoint piece `shard` (of `total` rows) this rank holds."""
        start, end = self.shard_range(shard)
        n = end - start
        return self.tp.rank * n, (self.tp.rank + 1) * n, n * self.tp.size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
        start, end = self.shard_range(shard)
        what = "" if shard is None else f"of piece {shard!r}"
        if self.tp.size > 1:
            lo, hi, total = self.rank_rows(shard)
            if loaded.shape[0] != total:
                raise ValueError(f"shape {what}: checkpoint {tuple(loaded.shape)} vs model {tuple(param.shape)} "
                                 f"on each of {self.tp.size} ranks")  # fmt: skip
            loaded = loaded[lo:hi]
        copy_weight(param.data[start:end], loaded, what)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x, self.bias)

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]; a graph-captured decode step's one row takes the GEMV.
        # More rows run the GEMM whatever the backend (kernels.ops.linear): called here without the dispatch's
        # host cost (docs/PERF.md#gemv-and-linear)
        if x.numel() > GEMV_MAX_TOKENS * self.in_features:
            return F.linear(x, self.weight, bias)
        rows = x.reshape(-1, self.in_features)
        return linear(rows, self.weight, bias).view(*x.shape[:-1], self.out_features)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output (e.g. gate_up); pieces are 0, 1, ...

    `output_sizes` are the full pieces; each rank holds 1 / tp.size of every piece.
    """

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False, tp: TPGroup = SINGLE) -> None:
        self.output_sizes = [tp.split(n, "intermediate_size") for n in output_sizes]
        super().__init__(in_features, sum(self.output_sizes), bias, tp)

    def shard_ids(self) -> tuple:
        return tuple(range(len(self.output_sizes)))

    def shard_range(self, shard) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard])
        return start, start + self.output_sizes[shard]


class QKVLinear(Linear):
    """The fused q/k/v projection: rows [q heads | k heads | v heads], pieces "q", "k", "v".

    `num_heads`/`num_kv_heads` are the model's; the layer keeps this rank's (`TPGroup.kv_heads`:
    KV heads are split, or replicated when there are fewer than ranks).
    """

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False,
        tp: TPGroup = SINGLE,
    ) -> None:  # fmt: skip
        self.head_dim = head_dim
        self.num_heads = tp.split(num_heads, "num_attention_heads")
        self.total_kv_heads = num_kv_heads
        self.num_kv_heads, self.first_kv_head = tp.kv_heads(num_kv_heads)
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias, tp)

    def shard_ids(self) -> tuple:
        return ("q", "k", "v")

    def shard_range(self, shard) -> tuple[int, int]:
        start = {"q": 0, "k": self.q_size, "v": self.q_size + self.kv_size}[shard]
        return start, start + (self.q_size if shard == "q" else self.kv_size)

    def rank_rows(self, shard) -> tuple[int, int, int]:
        if shard == "q":
            return self.tp.rank * self.q_size, (self.tp.rank + 1) * self.q_size, self.q_size * self.tp.size
        start = self.first_kv_head * self.head_dim
        return start, start + self.kv_size, self.total_kv_heads * self.head_dim

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # qkv: [tokens, q_size + 2 * kv_size] -> q [tokens, heads, d], k/v [tokens, kv_heads, d]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return (
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
        )


class RowParallelLinear(Linear):
    """y = sum over ranks of x_r W_r^T, plus b: each rank holds in_features / tp.size input columns of W
    (x arrives split the same way, from a column-parallel layer) and the whole bias, added once after the
    all-reduce."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup = SINGLE) -> None:
        super().__init__(tp.split(in_features, "the row-parallel input width"), out_features, bias, tp)
        if self.bias is not None:
            self.bias.weight_loader = default_weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
        n = self.in_features
        if loaded.dim() != 2 or loaded.shape[1] != n * self.tp.size:
            raise ValueError(f"shape: checkpoint {tuple(loaded.shape)} vs model {tuple(param.shape)} "
                             f"on each of {self.tp.size} ranks")  # fmt: skip
        copy_weight(param, loaded[:, self.tp.rank * n : (self.tp.rank + 1) * n])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features / tp] -> [..., out_features]
        if self.tp.size == 1:
            return self._matmul(x, self.bias)
        y = all_reduce(self._matmul(x, None))
        return y if self.bias is None else y + self.bias

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

Built with a quantization config (llm/quantization.py, llm/quant_fp8.py), a layer holds the parameters the
config names in its kernel's layout instead of a 16-bit `weight`, converts each checkpoint tensor to that layout
(`to_kernel_layout`) and runs the config's product (`forward`). A fused layer's pieces lie along the config's
`shard_dim` (the 4-bit codes keep the output columns last); a one-value (per-tensor) scale fills its piece; the
pieces of a fused layer share one g_idx (they read the same input), and a piece with another is refused.
Under tensor parallelism a quantized layer is cut from the converted tensor like a 16-bit one: column-parallel
along `shard_dim` (output columns; g_idx and per-tensor scales whole), row-parallel along the config's
`input_dim` (4-bit codes by rows of 8, scales and zeros by groups, so a rank's inputs must be whole groups;
FP8 per-row scales whole). Act-order 4-bit layers cannot be split by input and are refused
(`QuantConfig.check_row_shard`).
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
    """y = x W^T + b with W: [out_features, in_features], or W held quantized when `quant` is given;
    column-parallel over `tp` (out_features is this rank's)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup = SINGLE, quant=None
    ) -> None:
        super().__init__()
        self.tp = tp
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
        """Rows [start, end) of this rank's fused output that hold its part of checkpoint piece `shard`."""
        return 0, self.out_features

    def rank_rows(self, shard) -> tuple[int, int, int]:
        """(start, end, total): the rows [start, end) of checkpoint piece `shard` (of `total` rows) this rank holds."""
        start, end = self.shard_range(shard)
        n = end - start
        return self.tp.rank * n, (self.tp.rank + 1) * n, n * self.tp.size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
        role = getattr(param, "quant_role", None)
        if role is not None and hasattr(self.quant, "load"):  # the config keeps the tensor its own way (GGUF)
            self.quant.load(self, param, loaded, shard)
            return
        if role is not None:
            for part, tensor in self.quant.to_kernel_layout(role, loaded).items():
                self._load_quantized(part, self._rank_part(part, tensor, shard), shard)
            return
        start, end = self.shard_range(shard)
        what = "" if shard is None else f"of piece {shard!r}"
        if self.tp.size > 1:
            lo, hi, total = self.rank_rows(shard)
            if loaded.shape[0] != total:
                raise ValueError(f"shape {what}: checkpoint {tuple(loaded.shape)} vs model {tuple(param.shape)} "
                                 f"on each of {self.tp.size} ranks")  # fmt: skip
            loaded = loaded[lo:hi]
        copy_weight(param.data[start:end], loaded, what)

    def _rank_part(self, role: str, loaded: torch.Tensor, shard) -> torch.Tensor:
        """This rank's output columns of one quantized tensor in the kernel's layout (a whole checkpoint piece)."""
        if self.tp.size == 1 or role == "g_idx" or loaded.numel() == 1:
            return loaded
        dim = self.quant.shard_dim(role)
        lo, hi, total = self.rank_rows(shard)
        if loaded.shape[dim] != total:
            raise ValueError(f"shape of {role} piece {shard!r}: checkpoint {tuple(loaded.shape)} has not {total} "
                             f"outputs along dim {dim} for {self.tp.size} ranks")  # fmt: skip
        return loaded.narrow(dim, lo, hi - lo)

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
        return self._matmul(x, self.bias)

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]; a graph-captured decode step's one row takes the GEMV.
        # More rows run the GEMM whatever the backend (kernels.ops.linear): called here without the dispatch's
        # host cost (docs/PERF.md#gemv-and-linear)
        if self.quant is not None:
            return self.quant.forward(self, x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)
        if x.numel() > GEMV_MAX_TOKENS * self.in_features:
            return F.linear(x, self.weight, bias)
        rows = x.reshape(-1, self.in_features)
        return linear(rows, self.weight, bias).view(*x.shape[:-1], self.out_features)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output (e.g. gate_up); pieces are 0, 1, ...

    `output_sizes` are the full pieces; each rank holds 1 / tp.size of every piece.
    """

    def __init__(
        self, in_features: int, output_sizes: list[int], bias: bool = False, tp: TPGroup = SINGLE, quant=None
    ) -> None:
        self.output_sizes = [tp.split(n, "intermediate_size") for n in output_sizes]
        super().__init__(in_features, sum(self.output_sizes), bias, tp, quant)

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
        tp: TPGroup = SINGLE, quant=None,
    ) -> None:  # fmt: skip
        self.head_dim = head_dim
        self.num_heads = tp.split(num_heads, "num_attention_heads")
        self.total_kv_heads = num_kv_heads
        self.num_kv_heads, self.first_kv_head = tp.kv_heads(num_kv_heads)
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias, tp, quant)

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

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup = SINGLE, quant=None
    ) -> None:
        local = tp.split(in_features, "the row-parallel input width")
        if quant is not None and tp.size > 1:
            quant.check_row_shard(local, tp.size)
        super().__init__(local, out_features, bias, tp, quant)
        if self.bias is not None:
            self.bias.weight_loader = default_weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard=None) -> None:
        if getattr(param, "quant_role", None) is not None:
            super().weight_loader(param, loaded, shard)
            return
        n = self.in_features
        if loaded.dim() != 2 or loaded.shape[1] != n * self.tp.size:
            raise ValueError(f"shape: checkpoint {tuple(loaded.shape)} vs model {tuple(param.shape)} "
                             f"on each of {self.tp.size} ranks")  # fmt: skip
        copy_weight(param, loaded[:, self.tp.rank * n : (self.tp.rank + 1) * n])

    def _rank_part(self, role: str, loaded: torch.Tensor, shard) -> torch.Tensor:
        # this rank's inputs of one quantized tensor: rows of 8 codes, groups of scales/zeros, FP8 columns
        dim = self.quant.input_dim(role)
        if self.tp.size == 1 or dim is None or loaded.numel() == 1:
            return loaded
        n = getattr(self, role).shape[dim]
        if loaded.shape[dim] != n * self.tp.size:
            raise ValueError(f"shape of {role}: checkpoint {tuple(loaded.shape)} vs {n} along dim {dim} "
                             f"on each of {self.tp.size} ranks")  # fmt: skip
        return loaded.narrow(dim, self.tp.rank * n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features / tp] -> [..., out_features]
        if self.tp.size == 1:
            return self._matmul(x, self.bias)
        y = all_reduce(self._matmul(x, None))
        return y if self.bias is None else y + self.bias

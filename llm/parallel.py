"""Tensor parallelism: this process's place in the group and the two collectives the sharded layers use.

The group is torch.distributed's default process group, set up by the worker
(llm/engine/worker.py): NCCL on GPUs, gloo on CPU. A process that never set one
up is rank 0 of 1, and the layers run unsharded. `TPGroup` is what a layer keeps
(its shard is fixed when it is built); the collectives act on the default group.

Every rank runs the same forward: `all_reduce` after a row-parallel layer (sum of
partial outputs), `all_gather` of vocab-parallel logits. Both are plain torch
collectives, so with NCCL they are captured in the ranks' CUDA graphs like any
kernel (the communicator must have run once before capture: the worker's warm-up).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlchat.llm.errors import TensorParallelError


@dataclass(frozen=True, slots=True)
class TPGroup:
    rank: int = 0
    size: int = 1

    def split(self, n: int, what: str) -> int:
        """n / size, the part of `n` one rank holds; raises TensorParallelError when `size` does not divide it."""
        if n % self.size:
            raise TensorParallelError(
                f"{what}={n} is not divisible by tensor_parallel_size={self.size}; "
                f"pick a tensor_parallel_size that divides it"
            )
        return n // self.size

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """(KV heads this rank holds, index of its first): split when there are at least `size` of them,
        else each rank holds one, shared by size / num_kv_heads ranks (its query heads' group)."""
        if num_kv_heads >= self.size:
            per_rank = self.split(num_kv_heads, "num_key_value_heads")
            return per_rank, self.rank * per_rank
        if self.size % num_kv_heads:
            raise TensorParallelError(
                f"num_key_value_heads={num_kv_heads} neither divides nor is divisible by "
                f"tensor_parallel_size={self.size}; pick a tensor_parallel_size that divides or is a multiple of it"
            )
        return 1, self.rank * num_kv_heads // self.size


SINGLE = TPGroup()
# torch >= 2.14 names all_gather_into_tensor all_gather_single (and warns on the old name)
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_shardable(hf_config, size: int) -> None:
    """Raise TensorParallelError now, before any worker starts, when the decoder's heads or MLP do not split
    over `size` ranks (every rank's layers check again as they are built)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    group = TPGroup(0, size)
    heads = text.num_attention_heads
    group.split(heads, "num_attention_heads")
    group.kv_heads(getattr(text, "num_key_value_heads", None) or heads)
    group.split(text.intermediate_size, "intermediate_size")
    from vlchat.llm.quantization import quant_config_from_hf  # imported here: it needs the layers' kernels

    quant = quant_config_from_hf(hf_config)
    if quant is not None and size > 1:  # the row-parallel inputs: o_proj's and down_proj's
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        for width in (heads * head_dim, text.intermediate_size):
            quant.check_row_shard(width // size, size)


def tp_group() -> TPGroup:
    """This process's place in the default process group (rank 0 of 1 when none is set up)."""
    if dist.is_available() and dist.is_initialized():
        return TPGroup(dist.get_rank(), dist.get_world_size())
    return SINGLE


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the ranks, in place; returns it."""
    dist.all_reduce(x)
    return x


def all_gather(x: torch.Tensor, size: int) -> torch.Tensor:
    """x: [rows, n] on each of `size` ranks -> [rows, size * n], rank r's columns at [r * n, (r + 1) * n)."""
    rows, n = x.shape
    out = torch.empty((size * rows, n), dtype=x.dtype, device=x.device)  # the ranks' blocks of rows, in rank order
    _all_gather_into(out, x.contiguous())
    return out.view(size, rows, n).permute(1, 0, 2).reshape(rows, size * n)


def agree_min(value: int, device: torch.device) -> int:
    """The smallest of every rank's `value` (each rank's KV pool must hold the same number of blocks)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())

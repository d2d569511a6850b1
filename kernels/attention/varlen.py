"""Non-causal (or causal) varlen attention over contiguous Q/K/V, for vision encoders.

Each sequence of the packed batch (one image's patches) attends only to itself.
It runs the prefill kernel of `prefill.py` with contiguous K/V rows (PAGED=False).
"""

from __future__ import annotations

import torch

from kernels.attention.configs import PrefillConfig, check_dtype, table_for
from kernels.attention.prefill import launch


def varlen_attention(
    q, k, v, cu_seqlens, max_seqlen, scale, causal=False, *, device=None, config: PrefillConfig | None = None, out=None
):
    """Triton varlen attention; `device`/`config` override the arch table (tests run other archs' configs); `out` receives the result."""
    # q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]; cu_seqlens: [batch + 1] int32
    from kernels.attention import device_for

    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError("q must be [tokens, heads, head_dim] and k, v [tokens, kv_heads, head_dim]")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"heads {q.shape[1]} is not a multiple of kv_heads {k.shape[1]}")
    if q.dtype != k.dtype or v.dtype != k.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("the last (head_dim) dimension of q, k and v must be contiguous")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError("cu_seqlens must be int32")
    device = device or device_for(q)
    table = table_for(device)
    check_dtype(table, q.dtype)
    config = config or table.prefill_config(q.shape[-1])
    out = torch.empty_like(q) if out is None else out
    if q.shape[0] == 0:
        return out
    return launch(q, k, v, out, cu_seqlens, cu_seqlens, cu_seqlens, scale, max_seqlen, causal, None, 0.0, False, config)

"""Non-causal (or causal) varlen attention over contiguous Q/K/V, for vision encoders.

Each sequence of the packed batch (one image's patches) attends only to itself.
It runs the prefill kernel of `prefill.py` with contiguous K/V rows (PAGED=False), or on sm_90 at head_dim
64/128/256 the warp-specialized kernel of `prefill_ws.py`; non-causal calls (the vision towers) take the arch
table's `vision_prefill` Triton config where it has one.
"""

from __future__ import annotations

import torch

from vlchat.kernels.attention import prefill_ws
from vlchat.kernels.attention.configs import PrefillConfig, table_for
from vlchat.kernels.attention.prefill import launch, prepare, ws_plan
from vlchat.kernels.device import device_for


def plan(q, k, v, causal, device=None, config: PrefillConfig | None = None):
    """(Triton config or None, Gluon config or None) of a call: a config given stays; non-causal calls take the
    table's vision_prefill config where it has one; else the Gluon kernel where `prefill.ws_plan` allows."""
    if config is None and not causal:
        config = table_for(device or device_for(q)).vision_prefill_config(q.shape[-1], q.dtype)
    return config, ws_plan(q, k, v, None, None, causal, None, 0.0, device, config)


def varlen_attention(
    q, k, v, cu_seqlens, max_seqlen, scale, causal=False, *, device=None, config: PrefillConfig | None = None, out=None
):
    """Varlen attention on the Gluon kernel where `prefill.ws_plan` allows (sm_90), else the Triton kernel;
    non-causal, the Triton kernel with the table's `vision_prefill` config where there is one. `device`/`config`
    override the arch table (tests run other archs' configs; a config forces Triton)."""
    # q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]; cu_seqlens: [batch + 1] int32
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError("q must be [tokens, heads, head_dim] and k, v [tokens, kv_heads, head_dim]")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError("cu_seqlens must be int32")
    config, ws = plan(q, k, v, causal, device, config)
    config, out = prepare(q, k, v, device, config, out)
    if q.shape[0] == 0:
        return out
    if ws is not None:
        return prefill_ws.launch(q, k, v, None, None, out, cu_seqlens, None, None, scale, max_seqlen, causal, None, ws)
    return launch(
        q, k, v, None, None, out, cu_seqlens, cu_seqlens, cu_seqlens, scale, max_seqlen, causal, None, 0.0, config
    )

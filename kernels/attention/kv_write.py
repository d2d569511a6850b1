"""Store new K/V rows into their slots of the paged cache, in Triton.

One program per token: it reads its slot (block_id * block_size + offset; a
negative slot, e.g. a padding token of a CUDA-graph batch, is skipped) and
copies the token's [kv_heads, head_dim] rows of K and V into the caches. With
programmatic dependent launch (sm_90, `pdl.dependent_launch`) it lets the
decode kernel after it launch at once and waits for the kernel before it (which
wrote k and v) before its first load. Of a decoded sequence's rows it may write
only the last (the step's token), as a decode step does: the rule and why are in
docs/INTERFACES.md (`write_kv_cache`) and `decode_ws.py`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vlchat.kernels.attention.configs import check_dtype, table_for
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch, stride_db, stride_dt, stride_dh,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    launch_next_then_wait(PDL)  # decode attention (next) may start its prologue; k and v are the last kernel's
    slot = tl.load(slots_ptr + t).to(tl.int64)
    block = slot // PAGE
    offset = slot % PAGE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < KV_HEADS) & (offs_d[None, :] < HEAD_DIM) & (slot >= 0)
    src = offs_h[:, None] * stride_kh + offs_d[None, :]
    k = tl.load(k_ptr + t.to(tl.int64) * stride_kt + src, mask=mask)
    dst = block * stride_cb + offset * stride_ct + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    src = offs_h[:, None] * stride_vh + offs_d[None, :]
    v = tl.load(v_ptr + t.to(tl.int64) * stride_vt + src, mask=mask)
    dst = block * stride_db + offset * stride_dt + offs_h[:, None] * stride_dh + offs_d[None, :]
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping, *, device=None):
    """Triton KV write; slots < 0 are skipped. k, v: [tokens, kv_heads, head_dim]."""
    if k.dim() != 3 or k.shape != v.shape or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k, v must be [tokens, kv_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim]"
        )
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]) or slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"k {tuple(k.shape)} does not fit the cache {tuple(k_cache.shape)} / slots {tuple(slot_mapping.shape)}"
        )
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the last (head_dim) dimension of k, v and the caches must be contiguous")
    device = device or device_for(k_cache)
    check_dtype(table_for(device), k_cache.dtype)
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    pdl = dependent_launch(device)
    launch_compiled(_kv_write_kernel, (tokens,),
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        KV_HEADS=kv_heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim), PAGE=k_cache.shape[1], PDL=pdl,
        num_warps=4 if kv_heads * head_dim >= 1024 else 2, **pdl_options(pdl),
    )  # fmt: skip

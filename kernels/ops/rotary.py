"""Rotary position embedding applied to q and k from a cos/sin cache indexed by position.

`cos_sin_cache` is [max_positions, rotary_dim] fp32: the cos half then the sin
half, each rotary_dim / 2 wide, attention scaling already folded in
(llm/rope.py builds it for every RoPE variant). Only the first `rotary_dim`
channels of each head rotate (partial rotary); the rest pass through.

- neox style (Llama, Qwen, ...): channel i pairs with i + rotary_dim / 2.
- GPT-J style: channels 2i and 2i + 1 form a pair.

The reference rounds like transformers (cos/sin cast to the input dtype, the
products in that dtype); the kernel computes in fp32 and rounds once. Both
return new tensors and leave q and k untouched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled

OP = "ops.apply_rotary"


def _rotate_reference(x, cos, sin, rot, is_neox):
    # x: [tokens, heads, head_dim]; cos, sin: [tokens, rot / 2] fp32
    cos = cos.to(x.dtype)[:, None, :]
    sin = sin.to(x.dtype)[:, None, :]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if is_neox:
        x1, x2 = x_rot.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    else:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


def apply_rotary_reference(q, k, positions, cos_sin_cache, rotary_dim=None, is_neox=True):
    rot = rotary_dim or cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [tokens, rot / 2] each
    return _rotate_reference(q, cos, sin, rot, is_neox), _rotate_reference(k, cos, sin, rot, is_neox)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh, stride_c,
    num_q_heads, num_k_heads, q_blocks,
    HEAD_DIM: tl.constexpr, ROT: tl.constexpr, IS_NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    # grid: (tokens, q head blocks + k head blocks); one launch rotates both
    launch_next_then_wait(PDL)  # q and k are the previous kernel's output
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    if block < q_blocks:
        x_ptr, out_ptr, num_heads = q_ptr, q_out_ptr, num_q_heads
        stride_xt, stride_xh, stride_ot, stride_oh = stride_qt, stride_qh, stride_qot, stride_qoh
    else:
        x_ptr, out_ptr, num_heads = k_ptr, k_out_ptr, num_k_heads
        stride_xt, stride_xh, stride_ot, stride_oh = stride_kt, stride_kh, stride_kot, stride_koh
        block -= q_blocks
    heads = block * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    d = tl.arange(0, BLOCK_D)  # [BLOCK_D] channel index
    in_rot = d < ROT
    if IS_NEOX:
        first = d < (ROT // 2)
        partner = tl.where(first, d + (ROT // 2), d - (ROT // 2))
        freq = tl.where(first, d, d - (ROT // 2))
    else:
        first = (d % 2) == 0
        partner = tl.where(first, d + 1, d - 1)
        freq = d // 2
    pos = tl.load(pos_ptr + token)
    cos = tl.load(cache_ptr + pos * stride_c + freq, mask=in_rot, other=1.0)  # channels past ROT pass through
    sin = tl.load(cache_ptr + pos * stride_c + (ROT // 2) + freq, mask=in_rot, other=0.0)
    sin = tl.where(first, -sin, sin)
    mask = (heads[:, None] < num_heads) & (d[None, :] < HEAD_DIM)  # [BLOCK_H, BLOCK_D]
    row = x_ptr + token * stride_xt + heads[:, None] * stride_xh
    x = tl.load(row + d[None, :], mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(row + partner[None, :], mask=mask & in_rot[None, :], other=0.0).to(tl.float32)
    out = x * cos[None, :] + x_partner * sin[None, :]
    out_row = out_ptr + token * stride_ot + heads[:, None] * stride_oh
    tl.store(out_row + d[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def apply_rotary_triton(q, k, positions, cos_sin_cache, rotary_dim=None, is_neox=True):
    # q, k: [tokens, heads, head_dim]; one launch rotates both (a decode step of a small model is launch-bound)
    rot = rotary_dim or cos_sin_cache.shape[-1]
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    positions = positions.contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    tokens, q_heads, head_dim = q.shape
    k_heads = k.shape[1]
    q_out = torch.empty((tokens, q_heads, head_dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((tokens, k_heads, head_dim), dtype=k.dtype, device=k.device)
    if tokens == 0:
        return q_out, k_out
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(max(q_heads, k_heads)), max(1, 2048 // block_d))
    q_blocks = triton.cdiv(q_heads, block_h)
    grid = (tokens, q_blocks + triton.cdiv(k_heads, block_h))
    pdl = dependent_launch(device_for(q))
    launch_compiled(_rotary_kernel, grid,
        q, k, q_out, k_out, positions, cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), q_out.stride(0), q_out.stride(1), k_out.stride(0),
        k_out.stride(1), cache.stride(0), q_heads, k_heads, q_blocks,
        HEAD_DIM=head_dim, ROT=rot, IS_NEOX=is_neox, BLOCK_H=block_h, BLOCK_D=block_d, PDL=pdl, num_warps=4,
        **pdl_options(pdl),
    )  # fmt: skip
    return q_out, k_out


dispatch.register(OP, apply_rotary_reference, apply_rotary_triton)


def apply_rotary(q, k, positions, cos_sin_cache, rotary_dim=None, is_neox=True):
    """Rotate q and k by the angles of their token's position; returns new (q, k).

    Args:
        q: [tokens, q_heads, head_dim]; k: [tokens, kv_heads, head_dim].
        positions: [tokens] int64 rows of the cache.
        cos_sin_cache: [max_positions, rotary_dim] fp32, cos half then sin half.
        rotary_dim: channels that rotate (default: the cache width); the rest pass through.
        is_neox: neox (half split) pairing, else GPT-J (interleaved) pairing.
    """
    rot = rotary_dim or cos_sin_cache.shape[-1]
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"apply_rotary expects q, k [tokens, heads, head_dim]; got {tuple(q.shape)}, {tuple(k.shape)}")
    if rot % 2 or rot > q.shape[-1] or cos_sin_cache.shape[-1] != rot:
        raise ValueError(
            f"rotary_dim {rot} must be even, at most head_dim {q.shape[-1]}, and equal the cache width "
            f"{cos_sin_cache.shape[-1]}"
        )
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions must be [tokens]={q.shape[0]}; got {tuple(positions.shape)}")
    impl = dispatch.get_impl(OP, q.dtype, device_for(q))
    return impl(q, k, positions, cos_sin_cache, rot, is_neox)

"""Store new K/V rows into their slots of the paged cache, in Triton.

One program per token: it reads its slot (block_id * block_size + offset; a
negative slot, e.g. a padding token of a CUDA-graph batch, is skipped) and
copies the token's [kv_heads, head_dim] rows of K and V into the caches,
quantized where the cache is (kv_quant.py: fp8 codes rounded here by integer
operations, the same on every arch and under the interpreter; int8 and int4
codes with each row's scale and zero point). With programmatic dependent launch (sm_90,
`pdl.dependent_launch`) it lets the decode kernel after it launch at once and
waits for the kernel before it (which wrote k and v) before its first load. Of
a decoded sequence's rows it may write only the last (the step's token), as a
decode step does: the rule and why are in docs/INTERFACES.md (`write_kv_cache`)
and `decode_ws.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlchat.kernels.attention import kv_quant
from vlchat.kernels.attention.configs import check_dtype, table_for
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled


@triton.jit
def fp8_bits(x):
    """e4m3 bits (uint8) of fp32 x: clamped to +-448, rounded to nearest even (torch's float8_e4m3fn cast)."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    sign = (x.to(tl.int32, bitcast=True) >> 24) & 0x80
    a = tl.abs(x)
    bits = a.to(tl.int32, bitcast=True)
    r = bits + 0x7FFFF + ((bits >> 20) & 1)  # round the fp32 mantissa to 3 bits, carrying into the exponent
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)  # exponent bias 127 -> 7
    sub = ((a * 512.0 + 12582912.0) - 12582912.0).to(tl.int32)  # subnormal codes: round(a / 2**-9), half to even
    code = tl.where(a >= 0.015625, normal, sub)
    return (code | sign).to(tl.uint8)


@triton.jit
def _int_codes(x, lo, step, LEVELS: tl.constexpr):
    """Codes of x (fp32) on the grid lo + step * code, rounded half up, in [0, LEVELS] (kv_quant.quantize_int)."""
    safe = tl.where(step > 0, step, 1.0)
    code = tl.floor(tl.math.div_rn(x - lo[:, None], safe[:, None]) + 0.5)
    return tl.minimum(tl.maximum(code, 0.0), LEVELS).to(tl.int32)


@triton.jit
def _write_rows(
    x_ptr, cache_ptr, sz_ptr, t, block, offset, offs_h, slot_ok, fp8_scale,
    stride_xt, stride_xh, stride_cb, stride_ct, stride_ch, stride_sb, stride_st, stride_sh,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    """One token's rows [kv_heads, head_dim] of K or V from x_ptr into their slot of the cache, quantized as QUANT
    says (kv_quant.QUANT_CODES), int8/int4 with each row's (scale, zero) at sz_ptr."""
    src = x_ptr + t.to(tl.int64) * stride_xt + offs_h[:, None] * stride_xh
    row = block * stride_cb + offset * stride_ct + offs_h[:, None] * stride_ch
    sz_dst = block * stride_sb + offset * stride_st + offs_h * stride_sh
    row_ok = (offs_h < KV_HEADS) & slot_ok
    if QUANT == 3:  # int4: dimension 2j in byte j's low nibble, 2j + 1 in its high one
        offs_j = tl.arange(0, BLOCK_D // 2)
        mask = row_ok[:, None] & (offs_j[None, :] < HEAD_DIM // 2)
        even = tl.load(src + 2 * offs_j[None, :], mask=mask).to(tl.float32)  # [BLOCK_H, BLOCK_D // 2]
        odd = tl.load(src + 2 * offs_j[None, :] + 1, mask=mask).to(tl.float32)
        lo = tl.minimum(tl.min(tl.where(mask, even, float("inf")), 1), tl.min(tl.where(mask, odd, float("inf")), 1))
        hi = tl.maximum(tl.max(tl.where(mask, even, float("-inf")), 1), tl.max(tl.where(mask, odd, float("-inf")), 1))
        step = tl.math.div_rn(hi - lo, 15.0)
        byte = _int_codes(even, lo, step, 15.0) | (_int_codes(odd, lo, step, 15.0) << 4)
        tl.store(cache_ptr + row + offs_j[None, :], byte.to(tl.uint8), mask=mask)
        tl.store(sz_ptr + sz_dst, step, mask=row_ok)
        tl.store(sz_ptr + sz_dst + 1, lo, mask=row_ok)
    else:
        offs_d = tl.arange(0, BLOCK_D)
        mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
        x = tl.load(src + offs_d[None, :], mask=mask)  # [BLOCK_H, BLOCK_D]
        dst = cache_ptr + row + offs_d[None, :]
        if QUANT == 1:
            tl.store(dst, fp8_bits(tl.math.div_rn(x.to(tl.float32), fp8_scale)), mask=mask)  # IEEE division, as torch's
        elif QUANT == 2:
            x = x.to(tl.float32)
            lo = tl.min(tl.where(mask, x, float("inf")), 1)
            step = tl.math.div_rn(tl.max(tl.where(mask, x, float("-inf")), 1) - lo, 255.0)
            tl.store(dst, _int_codes(x, lo, step, 255.0).to(tl.uint8), mask=mask)
            tl.store(sz_ptr + sz_dst, step, mask=row_ok)
            tl.store(sz_ptr + sz_dst + 1, lo, mask=row_ok)
        else:
            tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, ksz_ptr, vsz_ptr, slots_ptr, k_scale, v_scale,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch, stride_db, stride_dt, stride_dh,
    stride_sb, stride_st, stride_sh, stride_ub, stride_ut, stride_uh,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, QUANT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    launch_next_then_wait(PDL)  # decode attention (next) may start its prologue; k and v are the last kernel's
    slot = tl.load(slots_ptr + t).to(tl.int64)
    block = slot // PAGE
    offset = slot % PAGE
    offs_h = tl.arange(0, BLOCK_H)
    _write_rows(
        k_ptr, k_cache_ptr, ksz_ptr, t, block, offset, offs_h, slot >= 0, k_scale,
        stride_kt, stride_kh, stride_cb, stride_ct, stride_ch, stride_sb, stride_st, stride_sh,
        KV_HEADS, HEAD_DIM, BLOCK_D, QUANT,
    )  # fmt: skip
    _write_rows(
        v_ptr, v_cache_ptr, vsz_ptr, t, block, offset, offs_h, slot >= 0, v_scale,
        stride_vt, stride_vh, stride_db, stride_dt, stride_dh, stride_ub, stride_ut, stride_uh,
        KV_HEADS, HEAD_DIM, BLOCK_D, QUANT,
    )  # fmt: skip


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, *, device=None):
    """Triton KV write; slots < 0 are skipped. k, v: [tokens, kv_heads, head_dim]. k_scale/v_scale: as the cache's
    format takes them (kv_quant.py)."""
    if k.dim() != 3 or k.shape != v.shape or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k, v must be [tokens, kv_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim]"
        )
    if k.shape[1] != k_cache.shape[2] or slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"k {tuple(k.shape)} does not fit the cache {tuple(k_cache.shape)} / slots {tuple(slot_mapping.shape)}"
        )
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the last (head_dim) dimension of k, v and the caches must be contiguous")
    fmt = kv_quant.check_scales(k_cache, v_cache, k_scale, v_scale, k.shape[-1])
    device = device or device_for(k_cache)
    check_dtype(table_for(device), k.dtype if fmt != "auto" else k_cache.dtype)
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    fp8_k = fp8_v = 1.0
    ksz = vsz = k_cache  # unused unless int8
    sz_strides = (0,) * 6
    if fmt == "fp8":
        fp8_k, fp8_v = kv_quant.fp8_scale(k_scale), kv_quant.fp8_scale(v_scale)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    elif fmt in kv_quant.LEVELS:
        ksz, vsz = k_scale, v_scale
        sz_strides = (*k_scale.stride()[:3], *v_scale.stride()[:3])
    pdl = dependent_launch(device)
    launch_compiled(_kv_write_kernel, (tokens,),
        k, v, k_cache, v_cache, ksz, vsz, slot_mapping, float(fp8_k), float(fp8_v),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], *sz_strides,
        KV_HEADS=kv_heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim), PAGE=k_cache.shape[1], QUANT=kv_quant.QUANT_CODES[fmt], PDL=pdl,
        num_warps=4 if kv_heads * head_dim >= 1024 else 2, **pdl_options(pdl),
    )  # fmt: skip

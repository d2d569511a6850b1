"""GGUF (llama.cpp) quantized blocks -> floats: Q8_0, Q5_0, Q4_K, Q5_K, Q6_K.

A quantized GGUF matrix [rows, cols] is stored row by row as `cols / BLOCK_ELEMS` blocks of `BLOCK_BYTES`
bytes each (`blocks`: [rows, cols / BLOCK_ELEMS * BLOCK_BYTES] uint8). Layouts, as gguf-py's `quants.py`
(the reference these are tested against) and ggml-quants.c read them (d, dmin: fp16; element e of a block):
- Q8_0 (32 elements, 34 bytes): d, 32 int8 codes q. w = q * d.
- Q5_0 (32, 22): d, qh (uint32), 16 bytes qs. q = (qs[e % 16] >> 4 * (e // 16) & 15) | (qh >> e & 1) << 4;
  w = d * (q - 16).
- Q4_K (256, 144): d, dmin, 12 bytes of eight 6-bit scales sc and mins m, 128 bytes qs.
  q = qs[32 * (e // 64) + e % 32] >> 4 * (e // 32 % 2) & 15; j = e // 32; w = (d * sc[j]) * q - dmin * m[j].
- Q5_K (256, 176): as Q4_K with 32 bytes qh before qs: q |= (qh[e % 32] >> e // 32 & 1) << 4.
- Q6_K (256, 210): 128 bytes ql, 64 bytes qh, 16 int8 scales, d. With h = e // 128, r = e % 128:
  q = (ql[64h + r % 64] >> 4 * (r // 64) & 15) | (qh[32h + r % 32] >> 2 * (r // 32) & 3) << 4;
  w = (d * scales[e // 16]) * (q - 32).
Every product is formed in fp32 in the reference's order, so both implementations give gguf-py's floats.

`dequantize_rows(blocks, qtype, cols, dtype)` dispatches: the Triton kernel (a program per eight blocks of a row;
the K-quants' bytes loaded once each by `kquant_tile`, the 32-element types' codes gathered per element) on a
GPU, the torch reference elsewhere. The model layers
(llm/gguf_layers.py) dequantize one layer's weight or the gathered rows of an embedding per call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled

OP = "ops.gguf_dequantize"
F32, F16, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K = 0, 1, 6, 8, 12, 13, 14  # GGMLQuantizationType ids
BLOCKS = {Q8_0: (32, 34), Q5_0: (32, 22), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}  # (elems, bytes)
NAMES = {Q8_0: "Q8_0", Q5_0: "Q5_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}


def _f16(b: torch.Tensor) -> torch.Tensor:
    # b: [n, 2] uint8 -> [n, 1] fp32
    return b.contiguous().view(torch.float16).float()


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # s: [n, 12] uint8 -> sc, m: [n, 8] fp32 (the 6-bit scales and mins of Q4_K/Q5_K)
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def _low_high(qs: torch.Tensor, groups: int) -> torch.Tensor:
    # qs: [n, 32 * groups] uint8 -> [n, 64 * groups] nibbles: per 32 bytes, their low nibbles then their high
    q = qs.reshape(qs.shape[0], groups, 1, 32) >> torch.tensor([0, 4], dtype=torch.uint8).view(1, 1, 2, 1)
    return (q & 0x0F).reshape(qs.shape[0], -1)


def _blocks_reference(b: torch.Tensor, qtype: int) -> torch.Tensor:
    # b: [n, BLOCK_BYTES] uint8 -> [n, BLOCK_ELEMS] fp32
    n = b.shape[0]
    if qtype == Q8_0:
        return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])
    if qtype == Q5_0:
        qh = b[:, 2:6].contiguous().view(torch.int32)  # [n, 1]
        high = ((qh >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.uint8)  # [n, 32]
        qs = b[:, 6:22]
        q = torch.cat([qs & 0x0F, qs >> 4], dim=1) | (high << 4)
        return _f16(b[:, :2]) * (q.to(torch.int8) - 16).float()
    if qtype in (Q4_K, Q5_K):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _k_scale_min(b[:, 4:16])
        scale = (d * sc).view(n, 8, 1)
        offset = (dmin * mn).view(n, 8, 1)
        if qtype == Q4_K:
            q = _low_high(b[:, 16:144], 4)
        else:
            qh = b[:, 16:48].reshape(n, 1, 1, 32) >> torch.arange(8, dtype=torch.uint8).view(1, 1, 8, 1)
            q = _low_high(b[:, 48:176], 4) | ((qh & 1).reshape(n, 256) << 4)
        return (scale * q.view(n, 8, 32).float() - offset).reshape(n, 256)
    if qtype == Q6_K:
        ql, qh = b[:, 0:128], b[:, 128:192]
        scales = b[:, 192:208].contiguous().view(torch.int8).float()
        d = _f16(b[:, 208:210])
        shifts = torch.tensor([0, 4], dtype=torch.uint8).view(1, 1, 2, 1)
        low = ((ql.reshape(n, 2, 1, 64) >> shifts) & 0x0F).reshape(n, 256)  # [half, shift, 64 bytes]
        high = qh.reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
        q = (low | ((high & 3).reshape(n, 256) << 4)).to(torch.int8) - 32
        return ((d * scales).view(n, 16, 1) * q.view(n, 16, 16).float()).reshape(n, 256)
    raise ValueError(f"no dequantizer for ggml type {qtype}")


def dequantize_reference(blocks: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    elems, nbytes = BLOCKS[qtype]
    rows = blocks.shape[0]
    out = _blocks_reference(blocks.reshape(-1, nbytes).cpu() if blocks.is_cuda else blocks.reshape(-1, nbytes), qtype)
    return out.reshape(rows, cols).to(device=blocks.device, dtype=dtype)


@triton.jit
def _f16_at(ptr):
    lo = tl.load(ptr).to(tl.uint16)
    hi = tl.load(ptr + 1).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k_scale(sp, j):
    # the 6-bit scale (and, from sp + 4, the min) of sub-block j of a Q4_K/Q5_K block; j: [E] int32
    lowj = tl.where(j < 4, j, j - 4)
    a = tl.load(sp + lowj).to(tl.int32)
    c = tl.load(sp + 8 + lowj).to(tl.int32)
    return tl.where(j < 4, a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)).to(tl.float32)


@triton.jit
def _k_min(sp, j):
    lowj = tl.where(j < 4, j, j - 4)
    m = tl.load(sp + 4 + lowj).to(tl.int32)
    c = tl.load(sp + 8 + lowj).to(tl.int32)
    return tl.where(j < 4, m & 0x3F, (c >> 4) | ((m >> 2) & 0x30)).to(tl.float32)


@triton.jit
def kquant_tile(bp, QTYPE: tl.constexpr, BLOCK_R: tl.constexpr):
    """fp32 values [BLOCK_R, 256] of the K-quant blocks (Q4_K, Q5_K, Q6_K) at byte pointers `bp` [BLOCK_R], formed
    as the module docstring's formulas in the reference's order, each byte of a block loaded once (contiguous runs
    of codes, eight or sixteen scales a row)."""
    b3 = bp[:, None, None]
    if QTYPE == 14:  # Q6_K: codes [half h, shift n, 64 bytes] and high bits [half, shift s, 32 bytes]
        ql = tl.load(b3 + 64 * tl.arange(0, 2)[None, :, None] + tl.arange(0, 64)[None, None, :]).to(tl.int32)
        low = (ql[:, :, None, :] >> (4 * tl.arange(0, 2))[None, None, :, None]) & 15  # [R, 2, 2, 64]
        qh = tl.load(b3 + 128 + 32 * tl.arange(0, 2)[None, :, None] + tl.arange(0, 32)[None, None, :]).to(tl.int32)
        high = (qh[:, :, None, :] >> (2 * tl.arange(0, 4))[None, None, :, None]) & 3  # [R, 2, 4, 32]
        q = tl.reshape(low, (BLOCK_R, 256)) | (tl.reshape(high, (BLOCK_R, 256)) << 4)
        sc = tl.load(bp[:, None] + 192 + tl.arange(0, 16)[None, :]).to(tl.int8, bitcast=True).to(tl.float32)
        scale = _f16_at(bp + 208)[:, None] * sc  # [R, 16]
        scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_R, 16, 16)), (BLOCK_R, 256))
        w = scale * (q - 32).to(tl.float32)
    else:  # Q4_K, Q5_K: codes [64-element chunk c, nibble h, 32 bytes]: sub-block j = 2c + h
        QS: tl.constexpr = 16 if QTYPE == 12 else 48
        qs = tl.load(b3 + QS + 32 * tl.arange(0, 4)[None, :, None] + tl.arange(0, 32)[None, None, :]).to(tl.int32)
        q = (qs[:, :, None, :] >> (4 * tl.arange(0, 2))[None, None, :, None]) & 15  # [R, 4, 2, 32]
        if QTYPE == 13:
            qh = tl.load(bp[:, None] + 16 + tl.arange(0, 32)[None, :]).to(tl.int32)  # [R, 32]: bit j of sub-block j
            j = 2 * tl.arange(0, 4)[:, None] + tl.arange(0, 2)[None, :]  # [4, 2]
            q = q | (((qh[:, None, None, :] >> j[None, :, :, None]) & 1) << 4)
        q = tl.reshape(q, (BLOCK_R, 256))
        j = tl.arange(0, 8)[None, :]
        scale = _f16_at(bp)[:, None] * _k_scale(bp[:, None] + 4, j)  # [R, 8]
        offset = _f16_at(bp + 2)[:, None] * _k_min(bp[:, None] + 4, j)
        scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_R, 8, 32)), (BLOCK_R, 256))
        offset = tl.reshape(tl.broadcast_to(offset[:, :, None], (BLOCK_R, 8, 32)), (BLOCK_R, 256))
        w = scale * q.to(tl.float32) - offset
    return w


@triton.jit
def small_tile(bp, QTYPE: tl.constexpr, BLOCK_R: tl.constexpr, NBLK: tl.constexpr):
    """fp32 values [BLOCK_R, NBLK * 32] of NBLK 32-element blocks (Q8_0, Q5_0) a row at byte pointers `bp`
    [BLOCK_R, NBLK], formed as the module docstring's formulas, each byte loaded once (a block's codes as one run,
    its fp16 d once)."""
    b3 = bp[:, :, None]
    if QTYPE == 8:  # Q8_0
        q = tl.load(b3 + 2 + tl.arange(0, 32)[None, None, :]).to(tl.int8, bitcast=True).to(tl.float32)
        w = q * _f16_at(bp)[:, :, None]
    else:  # Q5_0: low nibbles then high nibbles of 16 bytes, the fifth bits from a little-endian uint32
        qs = tl.load(b3 + 6 + tl.arange(0, 16)[None, None, :]).to(tl.int32)
        low = (qs[:, :, None, :] >> (4 * tl.arange(0, 2))[None, None, :, None]) & 15  # [R, NBLK, 2, 16]
        qh = tl.load(b3 + 2 + tl.arange(0, 4)[None, None, :]).to(tl.int32)
        word = tl.sum(qh << (8 * tl.arange(0, 4))[None, None, :], axis=2)  # [R, NBLK]: disjoint bytes, a sum is an OR
        high = (word[:, :, None] >> tl.arange(0, 32)[None, None, :]) & 1
        q = tl.reshape(low, (BLOCK_R, NBLK, 32)) | (high << 4)
        w = _f16_at(bp)[:, :, None] * (q - 16).to(tl.float32)
    return tl.reshape(w, (BLOCK_R, NBLK * 32))


TILE_BLOCKS = 8  # blocks per program of the dequantizing kernel: 256 elements of a 32-element type, 2048 of a K-quant


@triton.jit
def _gguf_dequant_kernel(blocks_ptr, out_ptr, blocks_per_row, row_stride, out_stride,
                         QTYPE: tl.constexpr, ELEMS: tl.constexpr, NBYTES: tl.constexpr, TILE: tl.constexpr):  # fmt: skip
    # one program: blocks blk0 .. blk0 + TILE - 1 of row `row` -> out[row, blk0 * ELEMS : (blk0 + TILE) * ELEMS]
    row = tl.program_id(0)
    blk = tl.program_id(1) * TILE + tl.arange(0, TILE)  # [TILE]
    mask = (blk < blocks_per_row)[:, None]
    bp = blocks_ptr + row.to(tl.int64) * row_stride + tl.where(blk < blocks_per_row, blk, 0) * NBYTES  # [TILE]
    if QTYPE == 12 or QTYPE == 13 or QTYPE == 14:  # Q4_K, Q5_K, Q6_K
        w = kquant_tile(bp, QTYPE, TILE)  # [TILE, ELEMS]
    else:
        w = tl.reshape(small_tile(bp[None, :], QTYPE, 1, TILE), (TILE, ELEMS))
    dst = out_ptr + row.to(tl.int64) * out_stride + blk[:, None] * ELEMS + tl.arange(0, ELEMS)[None, :]
    tl.store(dst, w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_triton(blocks: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """TILE_BLOCKS blocks per program: a program per block would leave each too few bytes to keep its loads in
    flight (a 32-element block is 22-34 bytes)."""
    elems, nbytes = BLOCKS[qtype]
    rows = blocks.shape[0]
    out = torch.empty((rows, cols), dtype=dtype, device=blocks.device)
    if rows == 0:
        return out
    blocks = blocks if blocks.stride(-1) == 1 else blocks.contiguous()
    launch_compiled(_gguf_dequant_kernel, (rows, triton.cdiv(cols // elems, TILE_BLOCKS)),
                    blocks, out, cols // elems, blocks.stride(0), out.stride(0),
                    QTYPE=qtype, ELEMS=elems, NBYTES=nbytes, TILE=TILE_BLOCKS, num_warps=4)  # fmt: skip
    return out


def _reference_impl(blocks, qtype, cols, dtype):
    return dequantize_reference(blocks, qtype, cols, dtype)


dispatch.register(OP, _reference_impl, dequantize_triton)


def dequantize_rows(blocks: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows of a GGUF-quantized matrix as floats.

    Args:
        blocks: [rows, cols / BLOCK_ELEMS * BLOCK_BYTES] uint8, each row its blocks (the file's bytes).
        qtype: a GGMLQuantizationType id in BLOCKS.
        cols: the matrix's columns, a multiple of the type's block elements.
        dtype: the output's dtype.

    Returns:
        [rows, cols] in `dtype`, on the blocks' device.
    """
    if qtype not in BLOCKS:
        raise ValueError(f"ggml type {qtype} is not kept quantized; types: {sorted(NAMES.values())}")
    elems, nbytes = BLOCKS[qtype]
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or cols % elems or blocks.shape[1] != cols // elems * nbytes:
        raise ValueError(f"{NAMES[qtype]} blocks of a {cols}-column matrix must be uint8 [rows, "
                         f"{cols // max(elems, 1) * nbytes}]; got {tuple(blocks.shape)} {blocks.dtype}")  # fmt: skip
    impl = dispatch.get_impl(OP, dtype, device_for(blocks))
    return impl(blocks, qtype, cols, dtype)

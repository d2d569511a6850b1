"""y = x W^T with W [N, K] held as GGUF blocks (Q8_0, Q5_0, Q4_K, Q5_K, Q6_K; kernels/ops/gguf_dequant.py gives
the layouts), for decode rows: the weight is dequantized inside the product, never written out in 16 bits.

A split-k GEMV: program (pid_n, pid_s) takes BLOCK_N output rows of W and all (up to 16, padded) rows of x over
one slice of K, STEP = 256 elements a step (one K-quant block or eight 32-element blocks): the [BLOCK_N, STEP]
tile of the rows' blocks is dequantized in registers (fp32, rounded once to x's dtype as a dequantized 16-bit
weight would be; `kquant_tile` / `small_tile`, which load each byte once) and fed to tl.dot with an fp32
accumulator. The slices' partials meet as in the W4A16 GEMV (`finish_split_k`: the last slice of a column tile
reduces). Rows past N read row 0's blocks (their outputs are not stored), so every byte load stays inside the
tensor.

`gguf_linear` serves up to GEMV_MAX_ROWS rows with it and more by dequantizing the weight and calling F.linear
(prefill reads x many times per weight byte: the transient 16-bit weight is cheap there). The reference
dequantizes with the torch reference and calls F.linear (the CPU path). Launch tiles: GGUF_GEMV_CONFIG, one
entry for every arch until a GPU run of benchmarks/gguf_linear.py gives a reason for more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled
from vlchat.kernels.ops.gguf_dequant import (
    BLOCKS,
    NAMES,
    dequantize_reference,
    dequantize_triton,
    kquant_tile,
    small_tile,
)
from vlchat.kernels.ops.quant_linear import finish_split_k, split_k_program, split_plan

OP = "ops.gguf_linear"
GEMV_MAX_ROWS = 16  # rows per call that take the fused kernel; more dequantize, then F.linear


STEP = 256  # K per GEMV step: one K-quant block or eight 32-element blocks


@dataclass(frozen=True, slots=True)
class GGUFGemvConfig:
    block_m: int  # tl.dot's smallest M
    block_n: int
    num_warps: int
    waves: int = 4  # programs per SM the split count aims at
    block_k: int = STEP  # K per step (split_plan's slices are whole steps)


GGUF_GEMV_CONFIG = GGUFGemvConfig(16, 32, 4)


@triton.jit
def _gguf_gemv_kernel(x_ptr, blocks_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_w, stride_om,
                      k_per_split, QTYPE: tl.constexpr, ELEMS: tl.constexpr, NBYTES: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                      SPLIT: tl.constexpr, CHUNK: tl.constexpr, STEP: tl.constexpr):  # fmt: skip
    # x: [M, K]; blocks: [N, K / ELEMS * NBYTES] uint8; out: [M, N]; part/count: finish_split_k's.
    pid_n, pid_s, splits, offs_m, offs_n, m_mask, n_mask, k_begin, k_end = split_k_program(
        M, N, K, k_per_split, BLOCK_M, BLOCK_N)  # fmt: skip
    rows = tl.where(n_mask, offs_n, 0)
    w_rows = blocks_ptr + rows.to(tl.int64) * stride_w  # [BN] byte pointers
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BM, 1]
    e = tl.arange(0, STEP)[None, :]  # [1, STEP]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, STEP):
        # a 32-element type's last step may run past K: those x columns load as 0 against block 0's values
        x = tl.load(x_rows + k0 + e, mask=m_mask[:, None] & (k0 + e < K), other=0.0)  # [BM, STEP]
        if QTYPE == 12 or QTYPE == 13 or QTYPE == 14:  # Q4_K, Q5_K, Q6_K: ELEMS == STEP
            w = kquant_tile(w_rows + (k0 // ELEMS) * NBYTES, QTYPE, BLOCK_N)
        else:
            blk = k0 // ELEMS + tl.arange(0, STEP // ELEMS)
            bp = w_rows[:, None] + tl.where(blk < K // ELEMS, blk, 0)[None, :] * NBYTES  # [BN, STEP // ELEMS]
            w = small_tile(bp, QTYPE, BLOCK_N, STEP // ELEMS)
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=DOT_PRECISION)
    finish_split_k(acc, pid_n, pid_s, splits, offs_m, offs_n, M, N, stride_om, out_ptr, out_ptr, part_ptr, count_ptr,
                   False, SPLIT, CHUNK, BLOCK_M, BLOCK_N)  # fmt: skip


def gguf_gemv_triton(x: torch.Tensor, blocks: torch.Tensor, qtype: int, out_dtype: torch.dtype | None = None,
                     config: GGUFGemvConfig | None = None, splits: int | None = None) -> torch.Tensor:  # fmt: skip
    """The fused Triton product for up to 16 rows (gguf_linear sends it decode rows); `config` and `splits`
    override the tiles and the K slices (tests, benchmarks)."""
    elems, nbytes = BLOCKS[qtype]
    cfg = config or GGUF_GEMV_CONFIG
    m, k = x.shape
    n = blocks.shape[0]
    if m > cfg.block_m:
        raise ValueError(f"the fused GGUF product takes at most {cfg.block_m} rows; got {m}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    plan = split_plan(x, n, cfg, cfg.block_m, splits, device_for(x).sm_count, out_dtype)
    launch_compiled(_gguf_gemv_kernel, (plan.tiles, plan.splits),
        x, blocks, plan.out, plan.part, plan.counters, m, n, k, x.stride(0), blocks.stride(0), plan.out.stride(0),
        plan.k_per_split, QTYPE=qtype, ELEMS=elems, NBYTES=nbytes, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SPLIT=plan.splits > 1, CHUNK=plan.chunk,
        STEP=STEP, num_warps=cfg.num_warps,
    )  # fmt: skip
    return plan.out


def _triton_impl(x, blocks, qtype, out_dtype):
    if x.shape[0] <= GEMV_MAX_ROWS:
        return gguf_gemv_triton(x, blocks, qtype, out_dtype)
    y = F.linear(x, dequantize_triton(blocks, qtype, x.shape[1], x.dtype))
    return y if out_dtype is None else y.to(out_dtype)


def gguf_reference(x, blocks, qtype, out_dtype=None):
    y = F.linear(x, dequantize_reference(blocks, qtype, x.shape[1], x.dtype))
    return y if out_dtype is None else y.to(out_dtype)


dispatch.register(OP, gguf_reference, _triton_impl)


def gguf_linear(x: torch.Tensor, blocks: torch.Tensor, qtype: int, out_dtype: torch.dtype | None = None):
    """y = x W^T with W held as GGUF blocks.

    Args:
        x: [tokens, K] fp16, bf16 or fp32.
        blocks: [N, K / BLOCK_ELEMS * BLOCK_BYTES] uint8, W's rows as the file stores them.
        qtype: a GGMLQuantizationType id in BLOCKS.
        out_dtype: the output's dtype (default x's).

    Returns:
        [tokens, N].
    """
    if qtype not in BLOCKS:
        raise ValueError(f"ggml type {qtype} has no GGUF product; types: {sorted(NAMES.values())}")
    elems, nbytes = BLOCKS[qtype]
    if x.dim() != 2 or x.shape[1] % elems or blocks.dim() != 2 or blocks.dtype != torch.uint8 \
            or blocks.shape[1] != x.shape[1] // elems * nbytes:  # fmt: skip
        raise ValueError(f"gguf_linear expects x [tokens, K] and {NAMES[qtype]} blocks uint8 [N, K / {elems} * "
                         f"{nbytes}]; got {tuple(x.shape)}, {tuple(blocks.shape)} {blocks.dtype}")  # fmt: skip
    return dispatch.get_impl(OP, x.dtype, device_for(x))(x, blocks, qtype, out_dtype)

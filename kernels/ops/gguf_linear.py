"""y = x W^T with W [N, K] held as GGUF blocks (Q8_0, Q5_0, Q4_K, Q5_K, Q6_K; kernels/ops/gguf_dequant.py gives
the layouts), for decode rows: the weight is dequantized inside the product, never written out in 16 bits.

One program takes BLOCK_N output rows of W and BLOCK_M rows of x and walks K one GGUF block at a time: the
[BLOCK_N, ELEMS] tile of the rows' blocks is dequantized in registers (`block_values`, fp32, rounded once to x's
dtype as a dequantized 16-bit weight would be) and fed to tl.dot with an fp32 accumulator. Rows past N read
row 0's blocks (their outputs are not stored), so every byte load stays inside the tensor.

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
from vlchat.kernels.ops.gguf_dequant import BLOCKS, NAMES, block_values, dequantize_reference, dequantize_triton

OP = "ops.gguf_linear"
GEMV_MAX_ROWS = 16  # rows per call that take the fused kernel; more dequantize, then F.linear


@dataclass(frozen=True, slots=True)
class GGUFGemvConfig:
    block_m: int  # tl.dot's smallest M
    block_n: int
    num_warps: int


GGUF_GEMV_CONFIG = GGUFGemvConfig(16, 32, 4)


@triton.jit
def _gguf_gemv_kernel(x_ptr, blocks_ptr, out_ptr, M, N, k_blocks, stride_xm, stride_w, stride_om,
                      QTYPE: tl.constexpr, ELEMS: tl.constexpr, NBYTES: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):  # fmt: skip
    # x: [M, K]; blocks: [N, k_blocks * NBYTES] uint8; out: [M, N]. Program (pid_n, pid_m): one output tile.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    rows = tl.where(n_mask, offs_n, 0)
    w_rows = blocks_ptr + rows.to(tl.int64)[:, None] * stride_w  # [BN, 1] byte pointers
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BM, 1]
    e = tl.arange(0, ELEMS)[None, :]  # [1, ELEMS]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(k_blocks):
        x = tl.load(x_rows + kb * ELEMS + e, mask=m_mask[:, None], other=0.0)  # [BM, ELEMS]
        w = block_values(w_rows + kb * NBYTES, e, QTYPE).to(x.dtype)  # [BN, ELEMS]
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def gguf_gemv_triton(x: torch.Tensor, blocks: torch.Tensor, qtype: int, out_dtype: torch.dtype | None = None,
                     config: GGUFGemvConfig | None = None) -> torch.Tensor:  # fmt: skip
    """The fused Triton product for any row count (gguf_linear sends it decode rows)."""
    cfg = config or GGUF_GEMV_CONFIG
    elems, nbytes = BLOCKS[qtype]
    m, k = x.shape
    n = blocks.shape[0]
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    launch_compiled(_gguf_gemv_kernel, grid,
        x, blocks, out, m, n, k // elems, x.stride(0), blocks.stride(0), out.stride(0),
        QTYPE=qtype, ELEMS=elems, NBYTES=nbytes, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=cfg.num_warps,
    )  # fmt: skip
    return out


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

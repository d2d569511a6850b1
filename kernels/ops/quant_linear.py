"""y = x W^T (+ b) with W stored as 4-bit integers in groups along K (W4A16): the weight is dequantized inside the
product, never written out in 16 bits.

Storage (the one layout every 4-bit checkpoint format is converted to at load, llm/quantization.py):
- qweight: [K // 8, N] int32; nibble j (bits 4j..4j+3) of qweight[r, n] is the unsigned code q of W[n, 8r + j]
- scales:  [K // group, N] in the activation dtype
- zeros:   [K // group, N] uint8 (0..16), or None for symmetric codes (zero 8)
- g_idx:   [K] int32, the group of each input row (GPTQ act-order), or None: row k is in group k // group
W[n, k] = (q[k, n] - zeros[g, n]) * scales[g, n] with g = g_idx[k] (or k // group).

Two kernels, chosen by the number of rows M:
- M <= GEMV_MAX_ROWS (decode): `_w4a16_gemv_kernel`, a split-k GEMV. Each program takes BLOCK_N output columns and
  one slice of K, sized so that the programs fill every SM (a decode step's time is the weight read). One or a few
  rows multiply on the CUDA cores (no padding to tl.dot's 16 rows);
  more take tl.dot with 16-row tiles (`dot_rows`). Without g_idx a K step lies in one group, so the codes enter the
  product as exact integers q - z and the group's scale multiplies the step's sums, once per column; tl.dot takes
  K permuted in both operands so that the codes are made, two per instruction, in its operand registers
  (`_dot_codes`). The slices' fp32 partials meet in a workspace; the last program of a column tile to finish (a
  counter per tile) adds them, adds the bias and writes the output, then sets its counter back to zero: one launch
  per product. With programmatic dependent launch (sm_90) a program loads its first codes before waiting for the
  kernel before it. One fp16 row without g_idx takes `_w4a16_gemv_pairs_kernel` on the same grid and finish: its
  products and sums are half2, two codes an instruction (`_pair_step`); it takes up to PAIRS_MAX_ROWS rows when a
  config asks (not measured yet for more than one).
- More rows (large decode batches): `_w4a16_gemm_kernel`, one program per [BLOCK_M, BLOCK_N] tile and K slice
  (slices only where the output tiles alone would leave SMs idle, reduced as the GEMV's), the weight tile
  dequantized to the activation dtype and fed to tl.dot.
- DEQUANT_ROWS rows and more (prefill): `_w4_dequant_kernel` writes the whole weight in the activation dtype (a
  transient [K, N] tensor) and torch's matmul multiplies: the tiled GEMM dequantizes each weight tile once per row
  tile of x, while one pass over the weight costs about one 16-bit weight read and write beside a product whose
  time grows with the rows (docs/PERF.md#w4a16).
Codes become floats without conversion instructions (a GPU converts integers to floats at a fraction of its
arithmetic rate): a code OR'd into the mantissa of a float whose last mantissa bit weighs 1 (2^23 for fp32, 1024
for fp16, 128 for bf16) is that float plus the code, and subtracting (that float + zero) leaves q - z exactly.

Launch tiles come from a per-arch table (`W4A16_CONFIGS`). The reference (`w4a16_reference`) dequantizes the whole
weight to the activation dtype and calls F.linear: the ground truth for the tests and the CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options
from vlchat.kernels.device import DeviceInfo, TritonMode, device_for
from vlchat.kernels.launch import launch_compiled

OP = "ops.w4a16_linear"
GEMV_MAX_ROWS = 16  # rows per call that take the split-k GEMV; more take the tiled GEMM
DEQUANT_ROWS = 256  # rows per call from which the weight is dequantized whole and torch multiplies
PACK = 8  # 4-bit codes per int32
GROUP_SIZES = (32, 64, 128)
PAIRS_MAX_ROWS = 4  # rows the half2 pairs GEMV takes (its x pairs and sums per row stay in registers)
REDUCE_VALUES = 8192  # partial sums the reducing program loads at once ([slices, BLOCK_M, BLOCK_N])
COUNTER_TILES = 4096  # output tiles the kept split counters cover; a wider product takes fresh zeros per call
# per activation dtype, the bits of the float whose last mantissa bit weighs 1 (1024, 128, 2^23): a code OR'd in
MAGIC = {torch.float16: 0x6400, torch.bfloat16: 0x4300, torch.float32: 0x4B000000}


@dataclass(frozen=True, slots=True)
class W4Config:
    """The GEMM's tiles (M > GEMV_MAX_ROWS)."""

    block_m: int
    block_n: int
    block_k: int  # capped at the group size (a K step stays in one group)
    num_warps: int
    num_stages: int
    waves: int = 2  # programs per SM the K slices aim at where the output tiles alone leave SMs idle


@dataclass(frozen=True, slots=True)
class W4GemvConfig:
    """The split-k GEMV's tiles (M <= GEMV_MAX_ROWS)."""

    block_n: int  # output columns per program: block_n int32 words of each packed row, loaded 16 bytes a thread
    block_k: int  # K per loop step, capped at the group size (a step stays in one group); a multiple of 32
    num_warps: int
    waves: int  # programs per SM the split count aims at
    dot: bool  # tl.dot on 16-row tiles (tensor cores), else products and sums on the CUDA cores
    tf32: bool = False  # with dot and 16-bit x: the fp32 codes of the CUDA-core path in a tf32 dot (exact too)
    pairs: bool = False  # fp16 rows (`pairs_apply`): half2 products, block_k // 8 word rows a step


@dataclass(frozen=True, slots=True)
class W4ArchConfigs:
    gemv_cores: W4GemvConfig  # M < dot_rows: CUDA-core products
    gemv_dot: W4GemvConfig  # dot_rows <= M <= GEMV_MAX_ROWS: tl.dot
    dot_rows: int
    gemm_small: W4Config  # GEMV_MAX_ROWS < M <= 64
    gemm: W4Config  # M > 64
    gemv_pairs: W4GemvConfig | None = None  # one fp16 row without g_idx (`pairs_apply`): half2 products


# Per compute capability. The GEMV entries are those an H100 (sm_90) measured fastest (docs/PERF.md#w4a16),
# taken for every arch until each is measured. sm_70/75 have no cp.async (one or two stages) and 64-96 KB of
# shared memory; sm_86/89 have 100 KB per SM, sm_80 164 KB, sm_90 228 KB (deeper pipelines, 128 x 128 GEMM tiles).
# An unknown newer arch takes the closest older entry; the interpreter sm_80's.
_CORES = W4GemvConfig(128, 128, 4, 8, False)
_DOT = W4GemvConfig(64, 128, 4, 2, True)
# tl.dot from two rows: 2 waves the fastest of the H100's sweep at 2-16 rows, ahead of the pairs kernel at two and of
# the CUDA cores' tiles (docs/PERF.md#w4a16); one row stays on the CUDA cores
_DOT_ROWS = 2
# one fp16 row: the half2 pairs kernel took 52.0 us a layer against 71.8 for _CORES on the H100 (its read floor 41.7)
_PAIRS = W4GemvConfig(512, 32, 4, 4, False, pairs=True)
W4A16_CONFIGS = {
    (7, 0): W4ArchConfigs(_CORES, _DOT, _DOT_ROWS, W4Config(32, 64, 32, 4, 1), W4Config(64, 64, 32, 4, 1), _PAIRS),
    (7, 5): W4ArchConfigs(_CORES, _DOT, _DOT_ROWS, W4Config(32, 64, 32, 4, 2), W4Config(64, 64, 32, 4, 2), _PAIRS),
    (8, 0): W4ArchConfigs(_CORES, _DOT, _DOT_ROWS, W4Config(64, 64, 64, 4, 3), W4Config(128, 128, 64, 8, 3), _PAIRS),
    (8, 6): W4ArchConfigs(_CORES, _DOT, _DOT_ROWS, W4Config(64, 64, 64, 4, 2), W4Config(128, 64, 64, 4, 2), _PAIRS),
    (8, 9): W4ArchConfigs(_CORES, _DOT, _DOT_ROWS, W4Config(64, 64, 64, 4, 2), W4Config(128, 64, 64, 4, 2), _PAIRS),
    (9, 0): W4ArchConfigs(_CORES, _DOT, _DOT_ROWS, W4Config(64, 128, 64, 4, 4), W4Config(128, 128, 64, 8, 4), _PAIRS),
}


def arch_configs(device: DeviceInfo) -> W4ArchConfigs:
    cap = device.capability or (8, 0)
    known = [c for c in W4A16_CONFIGS if c <= cap]
    return W4A16_CONFIGS[max(known)] if known else W4A16_CONFIGS[min(W4A16_CONFIGS)]


def launch_config(
    m: int, group_size: int, has_g_idx: bool, device: DeviceInfo, dtype: torch.dtype | None = None
) -> W4Config | W4GemvConfig:
    """The tiles for M rows of `dtype` (a W4GemvConfig up to GEMV_MAX_ROWS); without g_idx the K step is capped at
    the group size."""
    table = arch_configs(device)
    if table.gemv_pairs is not None and m == 1 and pairs_apply(m, dtype, has_g_idx):  # more rows: not measured
        cfg = table.gemv_pairs
    elif m <= GEMV_MAX_ROWS:
        cfg = table.gemv_cores if m < table.dot_rows else table.gemv_dot
    else:
        cfg = table.gemm_small if m <= 64 else table.gemm
    if not has_g_idx and cfg.block_k > group_size:
        cfg = replace(cfg, block_k=group_size)
    return cfg


def split_count(n: int, k: int, cfg, sm_count: int, row_tiles: int = 1) -> int:
    """K slices of a product with cfg's block_n, block_k and waves (a W4GemvConfig, W4Config or fp8_linear's) over
    `row_tiles` row tiles: enough programs for `cfg.waves` per SM, each slice at least one K step (one slice once
    the output tiles alone fill them)."""
    tiles = triton.cdiv(n, cfg.block_n) * row_tiles
    steps = triton.cdiv(k, cfg.block_k)
    return max(1, min(steps, triton.cdiv(cfg.waves * sm_count, tiles)))


@triton.jit
def _biased_codes(packed, MAGIC: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    # packed: [BK // 8, BN] int32 -> [BK, BN] offset + q in the activation dtype (MAGIC's float), row 8 * i + j
    # from nibble j of word row i: [BK // 8, 8, BN] reshaped row-major is [BK, BN] in K order
    shifts = tl.arange(0, 8) * 4
    codes = _magic((packed[:, None, :] >> shifts[None, :, None]) & 0xF, MAGIC)
    return tl.reshape(codes, (BLOCK_K, BLOCK_N))


@triton.jit
def _magic(ints, MAGIC: tl.constexpr):
    # int32 values in 0..16 -> offset + value in MAGIC's float type, with no conversion instruction
    bits = ints | MAGIC
    if MAGIC == 0x4B000000:
        return bits.to(tl.float32, bitcast=True)
    elif MAGIC == 0x6400:
        return bits.to(tl.int16).to(tl.float16, bitcast=True)
    else:
        return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _dot_codes(packed, zq, MAGIC: tl.constexpr, ASM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    # packed: [BK // 8, BN] int32, zq: [BN] int32 zeros -> [BN, BK] q - z in MAGIC's 16-bit float, K permuted
    # (`_dot_order` permutes x alike): entry 32a + 8s + 2c + h of a column is nibble s + 4h of its word row 4a + c.
    # That is tl.dot's first-operand layout for 16-bit inputs: h pairs two codes of one word in one 32-bit register,
    # c (K bits 1-2) is the lane, a and s the register. Only the int32 words change layout (8 codes each); the codes
    # are made where the tensor cores read them, with no shared-memory round trip.
    words = tl.reshape(tl.trans(packed), (BLOCK_N, BLOCK_K // 32, 4))  # [BN, a, c]: word row 4a + c
    if ASM:
        pairs = _code_pairs(words[:, :, :, None], zq[:, None, None, None], MAGIC)  # [BN, a, c, s]
        lo = pairs.to(tl.int16)
        hi = (pairs >> 16).to(tl.int16)
        codes = tl.join(lo, hi).to(tl.float16 if MAGIC == 0x6400 else tl.bfloat16, bitcast=True)
    else:  # the interpreter (no inline PTX): the same values, one nibble at a time
        shifts = 4 * (tl.arange(0, 4)[:, None] + 4 * tl.arange(0, 2)[None, :])  # [s, h]: nibble s + 4h
        nibbles = (words[:, :, :, None, None] >> shifts[None, None, None, :, :]) & 0xF  # [BN, a, c, s, h]
        codes = _magic(nibbles, MAGIC) - _magic(zq, MAGIC)[:, None, None, None, None]
    return tl.reshape(tl.permute(codes, (0, 1, 3, 2, 4)), (BLOCK_N, BLOCK_K))  # [BN, a, s, c, h]


@triton.jit
def _code_pairs(words, zq, MAGIC: tl.constexpr):
    # words: [..., 1] int32 -> [..., 4] int32, s-th the 16-bit floats q - z of nibbles s (low half) and s + 4 (high
    # half): one LOP3 (mask | offset) and one HFMA2 (times 1, minus offset + z) per two codes, exact. fp16 takes
    # nibbles 1 and 3 in place, 1024 + 16q times 1/16 minus 64 + z, so a word needs one shift; bf16 (7 mantissa
    # bits) needs three.
    s = tl.arange(0, 4)
    if MAGIC == 0x6400:
        shifted = words >> 8 * (s // 2)
        odd = s % 2 == 1
        mask = tl.where(odd, 0x00F000F0, 0x000F000F)
        scale = tl.where(odd, 0x2C002C00, 0x3C003C00)  # 1/16 or 1 in both halves
        neg_zero = tl.where(odd, 0xD400 + 16 * zq, 0xE400 + zq) * 0x10001  # -(64 + z) or -(1024 + z)
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; lop3.b32 t, $1, $2, 0x64006400, 0xEA; fma.rn.f16x2 $0, t, $3, $4; }", "=r,r,r,r,r",
            [shifted, mask, scale, neg_zero], dtype=tl.int32, is_pure=True, pack=1)  # fmt: skip
    else:
        shifted = words >> 4 * s
        neg_zero = (0xC300 + zq) * 0x10001  # -(128 + z)
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, one; mov.b32 one, 0x3F803F80; lop3.b32 t, $1, 0x000F000F, 0x43004300, 0xEA;"
            " fma.rn.bf16x2 $0, t, one, $2; }", "=r,r,r", [shifted, neg_zero], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _dot_order(x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # x: [BM, BK] -> its columns in `_dot_codes`' order: entry 32a + 8s + 2c + h is input 32a + 8c + 4h + s
    x = tl.reshape(x, (BLOCK_M, BLOCK_K // 32, 4, 2, 4))  # [BM, a, c, h, s]
    return tl.reshape(tl.permute(x, (0, 1, 4, 2, 3)), (BLOCK_M, BLOCK_K))  # [BM, a, s, c, h]


@triton.jit
def _scaled_codes(packed, z, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    # packed: [BK // 8, BN] int32, z: [BN] fp32 -> [BK, BN] fp32 (q - z) * 16^(k % 4), exact. Nibble j = 4h + i of a
    # word is taken where it lies in half h (bits 4i..4i+3, one shift per half instead of one per nibble), under
    # 2^23's exponent: the float 2^23 + q * 16^i. `_unscale` gives the factors 16^-(k % 4) for x.
    halves = packed[:, None, :] >> (tl.arange(0, 2) * 16)[None, :, None]  # [BK // 8, 2, BN]
    places = tl.arange(0, 4) * 4
    bits = (halves[:, :, None, :] & (0xF << places)[None, None, :, None]) | 0x4B000000  # [BK // 8, 2, 4, BN]
    weight = (1 << places).to(tl.float32)  # 16^i
    zero = 8388608.0 + z[None, None, None, :] * weight[None, None, :, None]
    return tl.reshape(bits.to(tl.float32, bitcast=True) - zero, (BLOCK_K, BLOCK_N))


@triton.jit
def _unscale(BLOCK_K: tl.constexpr):
    # [BK] fp32 16^-(k % 4), built from its exponent bits (exact)
    return ((127 - 4 * (tl.arange(0, BLOCK_K) % 4)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def split_k_program(M, N, K, k_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # A split-k GEMV program (pid_n, pid_s) of a (column tiles, splits) grid: its ids, the slice count, its rows
    # and columns with their masks, and its K slice [k_begin, k_end).
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_begin = pid_s * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    return pid_n, pid_s, tl.num_programs(1), offs_m, offs_n, offs_m < M, offs_n < N, k_begin, k_end


@triton.jit
def finish_split_k(acc, pid_n, pid_s, splits, offs_m, offs_n, M, N, stride_om, b_ptr, out_ptr, part_ptr, count_ptr,
                   HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):  # fmt: skip
    # A split-k GEMV program's end: acc [BM, BN] fp32 is its K slice's sum for rows offs_m, columns offs_n. Without
    # SPLIT it is the whole sum: add the bias, store. With SPLIT the slice's partial goes to part [splits, M, N]
    # and the tile's last slice to finish (count [column tiles], zero between calls) reduces, stores and zeroes
    # its counter.
    m_mask = offs_m < M
    n_mask = offs_n < N
    mask = m_mask[:, None] & n_mask[None, :]
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    if SPLIT:
        parts = part_ptr + offs_m[:, None] * N + offs_n[None, :]  # slice 0's [BM, BN]; slice s is s * M * N on
        tl.store(parts + pid_s * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial stored before the counter says so (acq_rel, GPU scope)
        if tl.atomic_add(count_ptr + pid_n, 1) == splits - 1:  # the tile's last slice to end: reduce
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s0 in range(0, splits, CHUNK):  # CHUNK slices' loads in flight at once, not one after the other
                offs_s = s0 + tl.arange(0, CHUNK)
                slices = tl.load(parts[None, :, :] + (offs_s * M * N)[:, None, None],
                                 mask=(offs_s < splits)[:, None, None] & mask[None, :, :], other=0.0,
                                 cache_modifier=".cg")  # [CHUNK, BM, BN]  # fmt: skip
                acc += tl.sum(slices, axis=0)
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
            tl.store(count_ptr + pid_n, 0)  # zero for the next call
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _group_scales(s_ptr, z_ptr, g, N, offs_n, mask, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr):
    # group g's scales [BN] fp32 and zeros [BN] int32 (8 without zeros) of columns offs_n
    s = tl.load(s_ptr + g * N + offs_n, mask=mask, other=0.0).to(tl.float32)
    if HAS_ZEROS:
        return s, tl.load(z_ptr + g * N + offs_n, mask=mask, other=0).to(tl.int32)
    return s, tl.full((BLOCK_N,), 8, tl.int32)


@triton.jit
def _x_tile(x_ptr, offs_m, m_mask, stride_xm, k0, k_end, BLOCK_K: tl.constexpr):
    # x's [BM, BK] tile of K rows k0 .. k0 + BK (zeros past k_end)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                   mask=m_mask[:, None] & (offs_k < k_end)[None, :], other=0.0)  # fmt: skip


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, g_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, stride_xm, stride_om, k_per_split,
    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_GIDX: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, MAGIC: tl.constexpr,
    SPLIT: tl.constexpr, CHUNK: tl.constexpr, TF32: tl.constexpr, PDL: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    # x: [M, K]; qweight: [K // 8, N] int32; scales/zeros: [K // GROUP, N]; out: [M, N]; part: [splits, M, N] fp32;
    # count: [column tiles] int32, zero between calls. Program (pid_n, pid_s): BLOCK_N columns over K slice pid_s.
    pid_n, pid_s, splits, offs_m, offs_n, m_mask, n_mask, k_begin, k_end = split_k_program(
        M, N, K, k_per_split, BLOCK_M, BLOCK_N)  # fmt: skip
    offs_w = tl.arange(0, BLOCK_K // 8)
    w_ptrs = qw_ptr + (k_begin // 8 + offs_w).to(tl.int64)[:, None] * N + offs_n[None, :]  # [BK // 8, BN]
    # the first codes and their group's scales and zeros before the wait: weights are no kernel's output, so their
    # read overlaps the kernel before this one (dependent launch); x, the counters and every store come after it
    packed = tl.load(w_ptrs, mask=(k_begin + 8 * offs_w < k_end)[:, None] & n_mask[None, :], other=0)
    s, zq = _group_scales(s_ptr, z_ptr, k_begin // GROUP, N, offs_n, n_mask, HAS_ZEROS, BLOCK_N)
    launch_next_then_wait(PDL)
    x = _x_tile(x_ptr, offs_m, m_mask, stride_xm, k_begin, k_end, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        # the next step's codes, scales, zeros and x are in flight while this step's are multiplied
        w_ptrs += (BLOCK_K // 8) * N
        more = k0 + BLOCK_K < k_end
        following = tl.load(w_ptrs, mask=(k0 + BLOCK_K + 8 * offs_w < k_end)[:, None] & n_mask[None, :], other=0)
        next_x = _x_tile(x_ptr, offs_m, m_mask, stride_xm, k0 + BLOCK_K, k_end, BLOCK_K)
        next_s, next_zq = _group_scales(s_ptr, z_ptr, (k0 + BLOCK_K) // GROUP, N, offs_n, n_mask & more, HAS_ZEROS,
                                        BLOCK_N)  # fmt: skip
        if HAS_GIDX:  # each row its own group: the weight dequantized as the reference rounds it, then multiplied
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < k_end
            g = tl.load(g_ptr + offs_k, mask=k_mask, other=0)
            sz = g.to(tl.int64)[:, None] * N + offs_n[None, :]  # [BK, BN]
            sz_mask = k_mask[:, None] & n_mask[None, :]
            s_k = tl.load(s_ptr + sz, mask=sz_mask, other=0.0)
            if HAS_ZEROS:
                z = tl.load(z_ptr + sz, mask=sz_mask, other=0).to(tl.float32)
            else:
                z = tl.full((BLOCK_K, BLOCK_N), 8.0, tl.float32)
            codes = _biased_codes(packed, 0x4B000000, BLOCK_K, BLOCK_N)
            w = ((codes - (8388608.0 + z)) * s_k.to(tl.float32)).to(x.dtype)  # [BK, BN]
            if DOT:
                acc = tl.dot(x, w, acc, input_precision="ieee" if MAGIC == 0x4B000000 else "tf32")
            else:
                acc += tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)
        else:  # one group per step: products of x with the exact q - z, summed, then times the group's scale
            if DOT and MAGIC != 0x4B000000 and not TF32:  # 16-bit q - z against 16-bit x: exact products
                # computed transposed ([BN, BK] x [BK, BM]): the dequantized codes are the product's first operand,
                # which the tensor cores take from registers; K permuted alike in both (`_dot_codes`)
                codes = _dot_codes(packed, zq, MAGIC, ASM, BLOCK_K, BLOCK_N)  # [BN, BK]
                part = tl.trans(tl.dot(codes, tl.trans(_dot_order(x, BLOCK_M, BLOCK_K))))
            else:
                xs = x.to(tl.float32) * _unscale(BLOCK_K)[None, :]  # [BM, BK]
                codes = _scaled_codes(packed, _magic(zq, 0x4B000000) - 8388608.0, BLOCK_K, BLOCK_N)  # [BK, BN]
                if DOT:  # x (11 significant bits at most) and q - z (5) are exact in tf32
                    part = tl.dot(xs, codes, input_precision="ieee" if MAGIC == 0x4B000000 else "tf32")
                else:
                    part = tl.sum(xs[:, :, None] * codes[None, :, :], axis=1)  # [BM, BN]
            acc += part * s[None, :]
        packed, x, s, zq = following, next_x, next_s, next_zq
    finish_split_k(acc, pid_n, pid_s, splits, offs_m, offs_n, M, N, stride_om, b_ptr, out_ptr, part_ptr, count_ptr,
                   HAS_BIAS, SPLIT, CHUNK, BLOCK_M, BLOCK_N)


# The pairs kernel's half2 products are x * (q - z) / PAIR_FACTOR (the codes made scaled, exactly): a step adds
# 4 * ROWS of them per fp16 lane (16 with the tables' tiles), which stay finite unless those x sum to more than
# 32 * 65504 / 15 in magnitude; products under 2**-14 lose precision as fp16 subnormals (relative error above fp16's)
PAIR_FACTOR = tl.constexpr(32.0)


@triton.jit
def _hmul2(a, b):
    return tl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)  # fmt: skip


@triton.jit
def _hadd2(a, b):
    return tl.inline_asm_elementwise("add.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)  # fmt: skip


@triton.jit
def _nibble_pairs(words, MASK: tl.constexpr, SCALE: tl.constexpr, neg_zero):
    # `_code_pairs` for one s: the fp16 pair q - z of the nibbles under MASK (times SCALE, minus the offset + z)
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t, c; mov.b32 c, $3; lop3.b32 t, $1, $2, 0x64006400, 0xEA; fma.rn.f16x2 $0, t, c, $4; }",
        "=r,r,n,n,r", [words, MASK, SCALE, neg_zero], dtype=tl.int32, is_pure=True, pack=1)  # fmt: skip


@triton.jit
def _pair_products(lo, hi, c0, c1, c2, c3, SHAPE: tl.constexpr):
    # lo, hi: fp16 x of K rows 8r + s and 8r + s + 4 ([*SHAPE, 4], r the last of SHAPE) -> [*SHAPE, BN] half2: each
    # row's pairs s times the code pairs cs ([ROWS, BN]), the four added
    pairs = (lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16)
    even, odd = tl.split(tl.reshape(pairs, SHAPE + (2, 2)))
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)  # [*SHAPE]
    d: tl.constexpr = len(SHAPE)  # x's pairs broadcast along the columns
    return _hadd2(_hadd2(_hmul2(tl.expand_dims(x0, d), c0), _hmul2(tl.expand_dims(x1, d), c1)),
                  _hadd2(_hmul2(tl.expand_dims(x2, d), c2), _hmul2(tl.expand_dims(x3, d), c3)))  # fmt: skip


@triton.jit
def _pair_step(packed, zq, x_ptr, k0, offs_m, m_mask, stride_xm, ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
               ASM: tl.constexpr):  # fmt: skip
    # packed: [ROWS, BN] words of K rows k0 .. k0 + 8 ROWS, zq: [BN] -> [BM, BN] fp32 sums of x * (q - z) /
    # PAIR_FACTOR for x's rows offs_m. Word row r's pair s (s < 4) holds the codes of K rows 8r + s and 8r + s + 4
    # (`_code_pairs`); x is paired alike, the products and their sum over the pairs and rows are half2, then the
    # two halves are added in fp32. The codes are made once for all rows.
    xk = k0 + 8 * tl.arange(0, ROWS)[:, None] + tl.arange(0, 4)[None, :]  # [ROWS, 4]: K of pair s's low half
    if ASM:
        high = packed >> 8  # nibbles 2, 3, 6, 7 where 0, 1, 4, 5 were
        # (q - z) / 32, exact: 1024 + q times 2**-5 minus 32 + z / 32; 1024 + 16q times 2**-9 minus 2 + z / 32
        nz_even = ((0xD000 + zq) * 0x10001)[None, :]
        nz_odd = ((0xC000 + 16 * zq) * 0x10001)[None, :]
        c0 = _nibble_pairs(packed, 0x000F000F, 0x28002800, nz_even)
        c1 = _nibble_pairs(packed, 0x00F000F0, 0x18001800, nz_odd)
        c2 = _nibble_pairs(high, 0x000F000F, 0x28002800, nz_even)
        c3 = _nibble_pairs(high, 0x00F000F0, 0x18001800, nz_odd)
        if BLOCK_M == 1:  # x's pairs as [ROWS]: no row dimension to lay out
            sums = _pair_products(tl.load(x_ptr + xk), tl.load(x_ptr + xk + 4), c0, c1, c2, c3, (ROWS,))
            sums = tl.reduce(sums, 0, _hadd2)[None, :]  # [1, BN]
        else:
            xo = offs_m[:, None, None] * stride_xm + xk[None, :, :]  # [BM, ROWS, 4]
            lo = tl.load(x_ptr + xo, mask=m_mask[:, None, None], other=0.0)
            hi = tl.load(x_ptr + xo + 4, mask=m_mask[:, None, None], other=0.0)
            sums = tl.reduce(_pair_products(lo, hi, c0, c1, c2, c3, (BLOCK_M, ROWS)), 1, _hadd2)  # [BM, BN]
        lo = sums.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return lo + (sums >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:  # the interpreter (no inline PTX): the same sums in fp32
        shifts = 4 * tl.arange(0, 4)
        xo = offs_m[:, None, None] * stride_xm + xk[None, :, :]  # [BM, ROWS, 4]
        lo = tl.load(x_ptr + xo, mask=m_mask[:, None, None], other=0.0).to(tl.float32)[:, :, None, :]
        hi = tl.load(x_ptr + xo + 4, mask=m_mask[:, None, None], other=0.0).to(tl.float32)[:, :, None, :]
        q_lo = ((packed[:, :, None] >> shifts[None, None, :]) & 0xF) - zq[None, :, None]  # [ROWS, BN, 4]
        q_hi = ((packed[:, :, None] >> (shifts + 16)[None, None, :]) & 0xF) - zq[None, :, None]
        sums = tl.sum(lo * q_lo.to(tl.float32)[None] + hi * q_hi.to(tl.float32)[None], axis=3)  # [BM, ROWS, BN]
        return tl.sum(sums, axis=1) / PAIR_FACTOR


@triton.jit
def _w4a16_gemv_pairs_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, b_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_om, k_per_split,
    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    # M <= PAIRS_MAX_ROWS fp16 rows x [M, K] (K a multiple of 8 ROWS, no g_idx) against qweight [K // 8, N]:
    # `_w4a16_gemv_kernel`'s split grid and finish, each step ROWS word rows of BLOCK_N columns (all of a column's
    # rows in one thread), its products in half2 pairs (`_pair_step`): two codes made, multiplied and added per
    # instruction.
    pid_n, pid_s, splits, offs_m, offs_n, m_mask, n_mask, k_begin, k_end = split_k_program(
        M, N, K, k_per_split, BLOCK_M, BLOCK_N)  # fmt: skip
    offs_r = tl.arange(0, ROWS)
    w_ptrs = qw_ptr + (k_begin // 8 + offs_r).to(tl.int64)[:, None] * N + offs_n[None, :]  # [ROWS, BN]
    packed = tl.load(w_ptrs, mask=n_mask[None, :], other=0)  # before the wait, as `_w4a16_gemv_kernel`
    launch_next_then_wait(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, 8 * ROWS):
        w_ptrs += ROWS * N
        following = tl.load(w_ptrs, mask=(k0 + 8 * ROWS < k_end) & n_mask[None, :], other=0)
        s, zq = _group_scales(s_ptr, z_ptr, k0 // GROUP, N, offs_n, n_mask, HAS_ZEROS, BLOCK_N)
        step = _pair_step(packed, zq, x_ptr, k0, offs_m, m_mask, stride_xm, ROWS, BLOCK_M, ASM)
        acc += step * (s * PAIR_FACTOR)[None, :]
        packed = following
    finish_split_k(acc, pid_n, pid_s, splits, offs_m, offs_n, M, N, stride_om, b_ptr, out_ptr, part_ptr, count_ptr,
                   HAS_BIAS, SPLIT, CHUNK, BLOCK_M, BLOCK_N)  # fmt: skip


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, g_ptr, b_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_om,
    k_per_split,
    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_GIDX: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MAGIC: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SPLIT: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    # x: [M, K]; qweight: [K // 8, N] int32; scales/zeros: [K // GROUP, N]; out: [M, N]; part/count: finish_split_k's
    # (one counter per output tile). Program (pid_n, pid_m, pid_s): a [BLOCK_M, BLOCK_N] tile of the output over K
    # slice pid_s: with few row tiles the K slices fill the GPU that the output tiles alone would leave idle.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_begin = pid_s * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_end
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # [BM, BK]
        offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(qw_ptr + offs_w.to(tl.int64)[:, None] * N + offs_n[None, :],
                         mask=(offs_w < k_end // 8)[:, None] & n_mask[None, :], other=0)  # [BK // 8, BN] int32  # fmt: skip
        if HAS_GIDX:  # each row its own group: gather the scales (and zeros) per row
            g = tl.load(g_ptr + offs_k, mask=k_mask, other=0)
            sz_offs = g.to(tl.int64)[:, None] * N + offs_n[None, :]  # [BK, BN]
            sz_mask = k_mask[:, None] & n_mask[None, :]
        else:  # the K step lies in one group: one row of scales (and zeros) for the tile
            sz_offs = ((k0 // GROUP) * N + offs_n)[None, :]  # [1, BN]
            sz_mask = n_mask[None, :]
        s = tl.load(s_ptr + sz_offs, mask=sz_mask, other=0.0)
        if HAS_ZEROS:
            zero = _magic(tl.load(z_ptr + sz_offs, mask=sz_mask, other=0).to(tl.int32), MAGIC)  # offset + z
        else:
            zero = _magic(tl.full((1, BLOCK_N), 8, tl.int32), MAGIC)
        # (offset + q) - (offset + z) is q - z exactly; one product with the scale rounds it as the reference does
        w = (_biased_codes(packed, MAGIC, BLOCK_K, BLOCK_N) - zero) * s  # [BK, BN] in x's dtype
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    tile = pid_m * tl.num_programs(0) + pid_n  # the output tile's counter
    finish_split_k(acc, tile, pid_s, tl.num_programs(2), offs_m, offs_n, M, N, stride_om, b_ptr, out_ptr, part_ptr,
                   count_ptr, HAS_BIAS, SPLIT, CHUNK, BLOCK_M, BLOCK_N)  # fmt: skip


@triton.jit
def _w4_dequant_kernel(qw_ptr, s_ptr, z_ptr, g_ptr, w_ptr, K, N, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr,
                       HAS_GIDX: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    # qweight: [K // 8, N] int32; scales/zeros: [K // GROUP, N]; w: [K, N] out. Program (pid_k, pid_n): a
    # [BLOCK_K, BLOCK_N] tile of W^T, (q - z) * s in fp32 (exact) rounded once to w's dtype, as dequantize_w4.
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_w = pid_k * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_mask = offs_k < K
    n_mask = offs_n < N
    packed = tl.load(qw_ptr + offs_w.to(tl.int64)[:, None] * N + offs_n[None, :],
                     mask=(offs_w < K // 8)[:, None] & n_mask[None, :], other=0)  # fmt: skip
    codes = _biased_codes(packed, 0x4B000000, BLOCK_K, BLOCK_N)  # 2^23 + q, fp32
    g = tl.load(g_ptr + offs_k, mask=k_mask, other=0) if HAS_GIDX else offs_k // GROUP
    sz = g.to(tl.int64)[:, None] * N + offs_n[None, :]
    mask = k_mask[:, None] & n_mask[None, :]
    s = tl.load(s_ptr + sz, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + sz, mask=mask, other=0).to(tl.float32) if HAS_ZEROS else 8.0
    w = (codes - (8388608.0 + z)) * s
    tl.store(w_ptr + offs_k.to(tl.int64)[:, None] * N + offs_n[None, :], w.to(w_ptr.dtype.element_ty), mask=mask)


def dequantize_w4_triton(qweight, scales, zeros, g_idx, group_size, dtype) -> torch.Tensor:
    """dequantize_w4's values in one launch, transposed: W^T [K, N] in `dtype` (contiguous)."""
    k, n = qweight.shape[0] * PACK, qweight.shape[1]
    w = torch.empty((k, n), dtype=dtype, device=qweight.device)
    block_k, block_n = min(64, group_size), 128
    launch_compiled(_w4_dequant_kernel, (triton.cdiv(k, block_k), triton.cdiv(n, block_n)),
        qweight, scales, zeros if zeros is not None else qweight, g_idx if g_idx is not None else qweight, w, k, n,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_GIDX=g_idx is not None, BLOCK_K=block_k,
        BLOCK_N=block_n, num_warps=4,
    )  # fmt: skip
    return w


_counters: dict = {}


def split_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 counters for a split product over `tiles` output tiles; each call's last slice of a tile sets its
    counter back to zero. Kept per device and shared by every call: the calls on a device follow one another on
    one stream (the engine's), and a call touches the counters only after its dependent-launch wait, when the call
    before it has ended. Not kept when first asked for during a CUDA-graph capture (memory allocated there belongs
    to the graph) or for more than COUNTER_TILES tiles: fresh zeros then (the capture records their fill)."""
    kept = _counters.get(device)
    if kept is not None and tiles <= COUNTER_TILES:
        return kept
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if tiles > COUNTER_TILES or capturing:
        return torch.zeros(tiles, dtype=torch.int32, device=device)
    kept = _counters[device] = torch.zeros(COUNTER_TILES, dtype=torch.int32, device=device)
    return kept


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """A split-k GEMV launch's slices and buffers (`split_plan`)."""

    splits: int
    k_per_split: int
    tiles: int  # column tiles, the grid's first axis
    chunk: int  # slices the reducing program loads at once
    out: torch.Tensor  # [M, N] in x's dtype
    part: torch.Tensor  # [splits, M, N] fp32 (out when there is one slice)
    counters: torch.Tensor  # split_counters (out, unread, when there is one slice)


def split_plan(x: torch.Tensor, n: int, cfg, block_m: int, splits: int | None, sm_count: int,
               out_dtype: torch.dtype | None = None, row_tiles: int = 1) -> SplitPlan:  # fmt: skip
    """The K slices (`splits`, else split_count's) of a GEMV of x [M, K] into N columns with cfg's block_n/block_k,
    no slice empty, and its output (x's dtype unless `out_dtype`), partials and counters (one per column tile and
    each of `row_tiles` row tiles)."""
    m, k = x.shape
    splits = splits or split_count(n, k, cfg, sm_count, row_tiles)
    k_per_split = triton.cdiv(triton.cdiv(k, splits), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)
    tiles = triton.cdiv(n, cfg.block_n)
    chunk = min(triton.next_power_of_2(splits), max(1, REDUCE_VALUES // (block_m * cfg.block_n)))
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    counters = split_counters(x.device, tiles * row_tiles) if splits > 1 else out  # unread with one slice
    return SplitPlan(splits, k_per_split, tiles, chunk, out, part, counters)


def inline_codes(device: DeviceInfo, dtype: torch.dtype) -> bool:
    """Whether `_dot_codes` makes the codes with inline PTX: compiled kernels only (the interpreter runs no PTX),
    and bf16 pairs (fma.rn.bf16x2) from sm_80."""
    if device.triton != TritonMode.COMPILED:
        return False
    return dtype != torch.bfloat16 or (device.capability or (0, 0)) >= (8, 0)


def _gemv(x, qweight, scales, zeros, g_idx, group_size, bias, cfg: W4GemvConfig, splits, device: DeviceInfo):
    m, k = x.shape
    n = qweight.shape[1]
    pairs = cfg.pairs and pairs_apply(m, x.dtype, g_idx is not None) and k % cfg.block_k == 0
    # (a pairs config given for a call it cannot run: its tiles on the general kernel)
    block_m = max(16, triton.next_power_of_2(m)) if cfg.dot else triton.next_power_of_2(m)
    plan = split_plan(x, n, cfg, block_m, splits, device.sm_count)
    pdl = dependent_launch(device)
    if pairs:
        launch_compiled(_w4a16_gemv_pairs_kernel, (plan.tiles, plan.splits),
            x, qweight, scales, zeros if zeros is not None else qweight, bias if bias is not None else scales,
            plan.out, plan.part, plan.counters, m, n, k, x.stride(0), plan.out.stride(0), plan.k_per_split,
            GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, BLOCK_M=block_m,
            BLOCK_N=cfg.block_n, ROWS=cfg.block_k // PACK, SPLIT=plan.splits > 1, CHUNK=plan.chunk, PDL=pdl,
            ASM=device.triton == TritonMode.COMPILED, num_warps=cfg.num_warps, **pdl_options(pdl),
        )  # fmt: skip
        return plan.out
    launch_compiled(_w4a16_gemv_kernel, (plan.tiles, plan.splits),
        x, qweight, scales, zeros if zeros is not None else qweight, g_idx if g_idx is not None else qweight,
        bias if bias is not None else scales, plan.out, plan.part, plan.counters, m, n, k, x.stride(0),
        plan.out.stride(0), plan.k_per_split,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_GIDX=g_idx is not None, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT=cfg.dot, MAGIC=MAGIC[x.dtype],
        SPLIT=plan.splits > 1, CHUNK=plan.chunk, TF32=cfg.tf32, PDL=pdl, ASM=inline_codes(device, x.dtype),
        num_warps=cfg.num_warps, **pdl_options(pdl),
    )  # fmt: skip
    return plan.out


def pairs_apply(m: int, dtype: torch.dtype | None, has_g_idx: bool) -> bool:
    """Whether `_w4a16_gemv_pairs_kernel` can take the product: up to PAIRS_MAX_ROWS fp16 rows, groups without
    g_idx (fp16 because its sums are half2: bf16's 8-bit mantissa would lose too much)."""
    return m <= PAIRS_MAX_ROWS and dtype == torch.float16 and not has_g_idx


def w4a16_triton(x, qweight, scales, zeros, g_idx, group_size, bias=None, *,
                 config: W4Config | W4GemvConfig | None = None, splits: int | None = None):  # fmt: skip
    """The Triton W4A16 product. `config` (a W4GemvConfig: the split-k GEMV at any row count; a W4Config: the GEMM)
    and `splits` (the K slices of either) override the per-arch choice (tests and benchmarks)."""
    m, k = x.shape
    n = qweight.shape[1]
    x = x if x.stride(-1) == 1 else x.contiguous()
    device = device_for(x)
    cfg = config or launch_config(m, group_size, g_idx is not None, device, x.dtype)
    if g_idx is None and group_size % cfg.block_k:
        raise ValueError(f"without g_idx a K step must lie in one group: block_k {cfg.block_k}, group {group_size}")
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=x.dtype, device=x.device)
    if config is None and m >= DEQUANT_ROWS:
        w = dequantize_w4_triton(qweight, scales, zeros, g_idx, group_size, x.dtype)
        return torch.addmm(bias, x, w) if bias is not None else x @ w
    if isinstance(cfg, W4GemvConfig):  # up to GEMV_MAX_ROWS rows, or more when a benchmark asks for the GEMV
        return _gemv(x, qweight, scales, zeros, g_idx, group_size, bias, cfg, splits, device)
    row_tiles = triton.cdiv(m, cfg.block_m)
    plan = split_plan(x, n, cfg, cfg.block_m, splits, device.sm_count, row_tiles=row_tiles)
    launch_compiled(_w4a16_gemm_kernel, (plan.tiles, row_tiles, plan.splits),
        x, qweight, scales, zeros if zeros is not None else qweight, g_idx if g_idx is not None else qweight,
        bias if bias is not None else scales, plan.out, plan.part, plan.counters, m, n, k, x.stride(0),
        plan.out.stride(0), plan.k_per_split,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_GIDX=g_idx is not None, HAS_BIAS=bias is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, MAGIC=MAGIC[x.dtype],
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SPLIT=plan.splits > 1, CHUNK=plan.chunk,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return plan.out


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """[K // 8, N] int32 -> [K, N] uint8 codes (nibble j of word r is row 8r + j)."""
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)  # [8]
    codes = (qweight[:, None, :] >> shifts[None, :, None]) & 0xF  # [K // 8, 8, N]
    return codes.reshape(-1, qweight.shape[1]).to(torch.uint8)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """[K, N] codes in 0..15 -> [K // 8, N] int32 (the inverse of unpack_int4; K a multiple of 8)."""
    k, n = codes.shape
    if k % PACK:
        raise ValueError(f"pack_int4 needs K a multiple of {PACK}; got {k}")
    grouped = codes.to(torch.int64).reshape(k // PACK, PACK, n)  # [K // 8, 8, N]
    shifts = torch.arange(0, 32, 4, device=codes.device, dtype=torch.int64)
    words = (grouped << shifts[None, :, None]).sum(1)  # [K // 8, N] in 0..2^32-1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def dequantize_w4(qweight, scales, zeros, g_idx, group_size, dtype=None) -> torch.Tensor:
    """The weight [N, K] the stored codes stand for, computed in fp32 and rounded once to `dtype`
    (default the scales')."""
    codes = unpack_int4(qweight).to(torch.float32)  # [K, N]
    k = codes.shape[0]
    groups = g_idx.long() if g_idx is not None else torch.arange(k, device=codes.device) // group_size
    zero = zeros[groups].to(torch.float32) if zeros is not None else 8.0
    w = (codes - zero) * scales[groups].to(torch.float32)  # [K, N]
    return w.T.to(dtype or scales.dtype)


def w4a16_reference(x, qweight, scales, zeros, g_idx, group_size, bias=None):
    return F.linear(x, dequantize_w4(qweight, scales, zeros, g_idx, group_size, x.dtype), bias)


dispatch.register(OP, w4a16_reference, w4a16_triton)


def w4a16_linear(x, qweight, scales, zeros, g_idx, group_size, bias=None):
    """y = x W^T + bias with W held as 4-bit codes (the module docstring gives the layout).

    Args:
        x: [tokens, K] fp16, bf16 or fp32.
        qweight: [K // 8, N] int32.
        scales: [K // group_size, N], x's dtype.
        zeros: [K // group_size, N] uint8, or None (symmetric: zero 8).
        g_idx: [K] int32 group of each input row, or None (row k in group k // group_size).
        group_size: 32, 64 or 128.
        bias: optional [N].

    Returns:
        [tokens, N] in x's dtype.
    """
    if x.dim() != 2 or qweight.dim() != 2 or x.shape[1] != qweight.shape[0] * PACK:
        raise ValueError(f"w4a16_linear expects x [tokens, K] and qweight [K // 8, N]; got {tuple(x.shape)}, "
                         f"{tuple(qweight.shape)}")  # fmt: skip
    k, n = x.shape[1], qweight.shape[1]
    if qweight.dtype != torch.int32:
        raise ValueError(f"qweight must be int32; got {qweight.dtype}")
    if group_size not in GROUP_SIZES or k % group_size:
        raise ValueError(f"group_size must be one of {GROUP_SIZES} and divide K={k}; got {group_size}")
    if scales.shape != (k // group_size, n) or scales.dtype != x.dtype:
        raise ValueError(f"scales must be [{k // group_size}, {n}] in {x.dtype}; got {tuple(scales.shape)} "
                         f"{scales.dtype}")  # fmt: skip
    if zeros is not None and (zeros.shape != scales.shape or zeros.dtype != torch.uint8):
        raise ValueError(f"zeros must be uint8 shaped like the scales; got {tuple(zeros.shape)} {zeros.dtype}")
    if g_idx is not None and g_idx.shape != (k,):
        raise ValueError(f"g_idx must be [{k}]; got {tuple(g_idx.shape)}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must be [{n}]; got {tuple(bias.shape)}")
    impl = dispatch.get_impl(OP, x.dtype, device_for(x))
    return impl(x, qweight, scales, zeros, g_idx, group_size, bias)

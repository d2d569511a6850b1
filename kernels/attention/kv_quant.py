"""Quantized KV cache formats: storage, sizes and the plain-torch quantize/dequantize every kernel matches.

A cache's format is told by its dtype (`cache_format`):

- the model's dtype (float16 / bfloat16 / float32): unquantized ("auto");
- torch.float8_e4m3fn: "fp8", FP8 e4m3 with one scale per tensor: x ~= fp8(x / scale) * scale, values clamped
  to +-FP8_MAX before rounding to nearest even. The scale is a Python float (`k_scale`/`v_scale` of the
  attention ops; 1.0 unless the checkpoint gives one);
- torch.uint8 [..., head_dim]: "int8", asymmetric 8-bit codes per token and KV head with a scale and zero point
  beside them (lmdeploy's per-token-per-head layout): x ~= code * scale + zero, where zero is the row's minimum
  (so the dequantization is one multiply-add and a constant row is exact) and scale = (max - min) / 255. The
  scales and zero points live in a float32 tensor [num_blocks, block_size, kv_heads, 2] per cache (`k_scale`/
  `v_scale` of the attention ops), written by the KV write with the codes;
- torch.uint8 [..., head_dim // 2]: "int4", the same with 4-bit codes (scale = (max - min) / 15), two per byte:
  byte j holds dimension 2j in its low nibble and 2j + 1 in its high one. A cache's format therefore depends on
  the head_dim of the rows it stores (`cache_format(cache, head_dim)`).

int8 and int4 caches hold each K/V row rotated by a Hadamard matrix (`rotation`): the attention layer rotates
q, k and v before the write and the kernels, and the output back after them; the kernels and the formats above
do not know about it.

The kernels read the fp8 cache as its uint8 bits and convert them with integer operations (`fp8_bits_to_half`'s
rule), so the same kernels run on every arch (e4m3 conversions are native from sm_89 only) and under the
interpreter.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "fp8", "int8", "int4")
FP8_MAX = 448.0  # the largest finite e4m3 value
# e4m3 bits with the exponent field moved into a float16's read as float16 are the value * 2**-8 (both normal and
# subnormal e4m3 values land exactly: 3 mantissa bits, exponent bias 7 vs 15): the kernels multiply by this back.
FP8_HALF_FACTOR = 256.0
LEVELS = {"int8": 255, "int4": 15}  # the largest code of the integer formats
QUANT_CODES = {"auto": 0, "fp8": 1, "int8": 2, "int4": 3}  # the QUANT constexpr of the kernels writing/reading a cache


class KVCacheFormatError(ValueError):
    """A cache/scale combination the attention ops cannot read; the message says what to pass."""


def cache_format(cache: torch.Tensor, head_dim: int) -> str:
    """The format of a cache holding rows of `head_dim` from its dtype (and, for uint8, its last dimension):
    "auto" (unquantized), "fp8", "int8" or "int4"."""
    if cache.dtype == torch.float8_e4m3fn:
        return "fp8"
    if cache.dtype == torch.uint8:
        return "int4" if 2 * cache.shape[-1] == head_dim else "int8"
    return "auto"


def storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    check_name(kv_cache_dtype)
    return {"auto": model_dtype, "fp8": torch.float8_e4m3fn, "int8": torch.uint8, "int4": torch.uint8}[kv_cache_dtype]


def storage_dim(kv_cache_dtype: str, head_dim: int) -> int:
    """The cache's last dimension for rows of `head_dim` (int4 packs two codes a byte)."""
    if kv_cache_dtype == "int4" and head_dim % 2:
        raise KVCacheFormatError(f"an int4 cache packs two dimensions a byte: head_dim {head_dim} is odd; use int8")
    return head_dim // 2 if kv_cache_dtype == "int4" else head_dim


def check_name(kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise KVCacheFormatError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")


def bytes_per_token(kv_cache_dtype: str, kv_heads: int, head_dim: int, model_dtype: torch.dtype) -> int:
    """Bytes one token takes in one layer's K and V caches, the int8/int4 scales and zero points included."""
    element = torch.empty(0, dtype=storage_dtype(kv_cache_dtype, model_dtype)).element_size()
    per_head = storage_dim(kv_cache_dtype, head_dim) * element + (2 * 4 if kv_cache_dtype in LEVELS else 0)
    return 2 * kv_heads * per_head


def allocate(kv_cache_dtype: str, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
             model_dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor, object, object]:  # fmt: skip
    """(k_cache, v_cache, k_scale, v_scale) of one layer, zero-filled; the scales are 1.0 for fp8, the per-token
    scale/zero tensors for int8 and int4 and None unquantized."""
    shape = (num_blocks, block_size, kv_heads, storage_dim(kv_cache_dtype, head_dim))
    dtype = storage_dtype(kv_cache_dtype, model_dtype)
    k = torch.zeros(shape, dtype=dtype, device=device)
    v = torch.zeros(shape, dtype=dtype, device=device)
    if kv_cache_dtype in LEVELS:
        sz = (num_blocks, block_size, kv_heads, 2)
        return k, v, torch.zeros(sz, dtype=torch.float32, device=device), torch.zeros(sz, dtype=torch.float32,
                                                                                       device=device)  # fmt: skip
    if kv_cache_dtype == "fp8":
        return k, v, 1.0, 1.0
    return k, v, None, None


def check_scales(k_cache, v_cache, k_scale, v_scale, head_dim: int) -> str:
    """The format of caches holding rows of `head_dim`, after checking that the scales fit it (typed error saying
    what to pass)."""
    fmt = cache_format(k_cache, head_dim)
    if cache_format(v_cache, head_dim) != fmt or v_cache.shape != k_cache.shape:
        raise KVCacheFormatError(f"k and v caches must share a format, got {k_cache.dtype} and {v_cache.dtype}")
    if storage_dim(fmt, head_dim) != k_cache.shape[-1]:
        raise KVCacheFormatError(f"a cache of {k_cache.dtype} with rows of {k_cache.shape[-1]} cannot hold head_dim "
                                 f"{head_dim} (int8: as many bytes, int4: half)")  # fmt: skip
    if fmt in LEVELS:
        want = (*k_cache.shape[:3], 2)
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not isinstance(s, torch.Tensor) or tuple(s.shape) != want or s.dtype != torch.float32:
                raise KVCacheFormatError(
                    f"an {fmt} cache needs {name} as a float32 tensor {want} of per-token scales and zero points "
                    "(kv_quant.allocate makes them)"
                )
            if s.stride(-1) != 1 or s.stride(-2) != 2:
                raise KVCacheFormatError(f"{name} must have its (scale, zero) pairs contiguous per head")
    elif fmt == "fp8":
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None and (isinstance(s, torch.Tensor) or not s > 0):
                raise KVCacheFormatError(f"an fp8 cache takes {name} as a positive Python float, got {s!r}")
    elif k_scale is not None or v_scale is not None:
        raise KVCacheFormatError("k_scale/v_scale are for quantized (fp8 or int8) caches only")
    return fmt


def fp8_scale(s) -> float:
    return 1.0 if s is None else float(s)


# -- plain-torch quantization (the ground truth of the kernels) ---------------------------------------------------


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x [..., head_dim] -> e4m3 codes: x / scale clamped to +-FP8_MAX, rounded to nearest even."""
    return (x.float() / _divisor(scale, x)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _divisor(value: float, like: torch.Tensor) -> torch.Tensor:
    """`value` as a float32 tensor on `like`'s device: CUDA torch divides by a Python number as a multiply by its
    rounded reciprocal, by a device tensor with IEEE division, as the kernels divide."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def quantize_int(x: torch.Tensor, fmt: str = "int8") -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (codes uint8 [..., head_dim], or packed [..., head_dim // 2] for int4; scale/zero float32
    [..., 2]) per row (the module doc)."""
    levels = LEVELS[fmt]
    x = x.float()
    lo = x.amin(dim=-1)
    scale = (x.amax(dim=-1) - lo) / _divisor(levels, x)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.floor((x - lo[..., None]) / safe[..., None] + 0.5).clamp(0, levels).to(torch.uint8)
    if fmt == "int4":
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return codes, torch.stack((scale, lo), dim=-1)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_int(x, "int8")


def unpack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Packed int4 codes [..., head_dim // 2] -> one code a byte [..., head_dim]."""
    return torch.stack((codes & 15, codes >> 4), dim=-1).flatten(-2)


def hadamard_block(head_dim: int) -> int:
    """The size of the Hadamard blocks rotating rows of `head_dim` (`rotation`): the largest power of two dividing
    it, at most 256."""
    return min(head_dim & -head_dim, 256)


def rotation(head_dim: int, device=None) -> torch.Tensor:
    """The +-1 block-diagonal Sylvester Hadamard matrix H [head_dim, head_dim] that int8 and int4 caches store their
    rows in (x @ H, quantized). H is symmetric and H @ H = n * I (n = `hadamard_block`), so q @ H / n against
    k @ H gives q . k and (p @ (v @ H)) @ H / n gives p @ v; every factor is a power of two, exact in every float
    dtype. Rotating spreads a row's outlier dimensions over the whole block, which narrows the per-row min/max
    grid (llm/layers/attention.py applies it; docs/KV_CACHE.md)."""
    n = hadamard_block(head_dim)
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return torch.block_diag(*[h] * (head_dim // n)).to(device)


def dequantize(cache: torch.Tensor, scale, dtype: torch.dtype = torch.float32, fmt: str | None = None) -> torch.Tensor:
    """Rows of a cache (any leading shape, head_dim last) as `dtype`; `scale` as the format takes it (for int8 and
    int4 the scale/zero rows matching the cache rows' leading shape). `fmt`: the cache's format, needed for int4
    (by default fp8, int8 or auto from the dtype)."""
    fmt = fmt or cache_format(cache, cache.shape[-1])
    if fmt == "fp8":
        return cache.to(dtype) * fp8_scale(scale)
    if fmt in LEVELS:
        codes = unpack_int4(cache) if fmt == "int4" else cache
        sz = scale.float()  # in float32 then rounded once to `dtype`, as the kernels do
        return (codes.float() * sz[..., 0:1] + sz[..., 1:2]).to(dtype)
    return cache.to(dtype)


def write_rows(x: torch.Tensor, cache: torch.Tensor, scale, slots: torch.Tensor) -> None:
    """Store rows x [tokens, kv_heads, head_dim] at slots (all >= 0) of the paged `cache`, quantized as its format."""
    num_blocks, block_size, kv_heads, width = cache.shape
    rows = num_blocks * block_size
    fmt = cache_format(cache, x.shape[-1])
    if fmt == "fp8":  # index_copy_ has no float8 kernel on the CPU: copy the bits
        codes = quantize_fp8(x, fp8_scale(scale)).view(torch.uint8)
        cache.view(torch.uint8).view(rows, kv_heads, width).index_copy_(0, slots, codes)
    elif fmt in LEVELS:
        codes, sz = quantize_int(x, fmt)
        cache.view(rows, kv_heads, width).index_copy_(0, slots, codes)
        scale.view(rows, kv_heads, 2).index_copy_(0, slots, sz)
    else:
        cache.view(rows, kv_heads, width).index_copy_(0, slots, x.to(cache.dtype))

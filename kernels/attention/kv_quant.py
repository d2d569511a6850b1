"""Quantized KV cache formats: storage, sizes and the plain-torch quantize/dequantize every kernel matches.

A cache's format is told by its dtype (`cache_format`):

- the model's dtype (float16 / bfloat16 / float32): unquantized ("auto");
- torch.float8_e4m3fn: "fp8", FP8 e4m3 with one scale per tensor: x ~= fp8(x / scale) * scale, values clamped
  to +-FP8_MAX before rounding to nearest even. The scale is a Python float (`k_scale`/`v_scale` of the
  attention ops; 1.0 unless the checkpoint gives one);
- torch.uint8: "int8", asymmetric 8-bit codes per token and KV head with a scale and zero point beside them
  (lmdeploy's per-token-per-head layout): x ~= code * scale + zero, where zero is the row's minimum (so the
  dequantization is one multiply-add and a constant row is exact) and scale = (max - min) / 255. The scales
  and zero points live in a float32 tensor [num_blocks, block_size, kv_heads, 2] per cache (`k_scale`/`v_scale`
  of the attention ops), written by the KV write with the codes.

The kernels read the fp8 cache as its uint8 bits and convert them with integer operations (`fp8_bits_to_half`'s
rule), so the same kernels run on every arch (e4m3 conversions are native from sm_89 only) and under the
interpreter.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "fp8", "int8")
FP8_MAX = 448.0  # the largest finite e4m3 value
# e4m3 bits with the exponent field moved into a float16's read as float16 are the value * 2**-8 (both normal and
# subnormal e4m3 values land exactly: 3 mantissa bits, exponent bias 7 vs 15): the kernels multiply by this back.
FP8_HALF_FACTOR = 256.0
INT8_LEVELS = 255
QUANT_CODES = {"auto": 0, "fp8": 1, "int8": 2}  # the QUANT constexpr of the kernels writing/reading a cache


class KVCacheFormatError(ValueError):
    """A cache/scale combination the attention ops cannot read; the message says what to pass."""


def cache_format(cache: torch.Tensor) -> str:
    """The format of a cache from its dtype: "auto" (unquantized), "fp8" or "int8"."""
    if cache.dtype == torch.float8_e4m3fn:
        return "fp8"
    if cache.dtype == torch.uint8:
        return "int8"
    return "auto"


def storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    check_name(kv_cache_dtype)
    return {"auto": model_dtype, "fp8": torch.float8_e4m3fn, "int8": torch.uint8}[kv_cache_dtype]


def check_name(kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise KVCacheFormatError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")


def bytes_per_token(kv_cache_dtype: str, kv_heads: int, head_dim: int, model_dtype: torch.dtype) -> int:
    """Bytes one token takes in one layer's K and V caches, the int8 scales and zero points included."""
    element = torch.empty(0, dtype=storage_dtype(kv_cache_dtype, model_dtype)).element_size()
    per_head = head_dim * element + (2 * 4 if kv_cache_dtype == "int8" else 0)
    return 2 * kv_heads * per_head


def allocate(kv_cache_dtype: str, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
             model_dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor, object, object]:  # fmt: skip
    """(k_cache, v_cache, k_scale, v_scale) of one layer, zero-filled; the scales are 1.0 for fp8, the per-token
    scale/zero tensors for int8 and None unquantized."""
    shape = (num_blocks, block_size, kv_heads, head_dim)
    dtype = storage_dtype(kv_cache_dtype, model_dtype)
    k = torch.zeros(shape, dtype=dtype, device=device)
    v = torch.zeros(shape, dtype=dtype, device=device)
    if kv_cache_dtype == "int8":
        sz = (num_blocks, block_size, kv_heads, 2)
        return k, v, torch.zeros(sz, dtype=torch.float32, device=device), torch.zeros(sz, dtype=torch.float32,
                                                                                       device=device)  # fmt: skip
    if kv_cache_dtype == "fp8":
        return k, v, 1.0, 1.0
    return k, v, None, None


def check_scales(k_cache, v_cache, k_scale, v_scale) -> str:
    """The caches' format after checking that the scales fit it (typed error saying what to pass)."""
    fmt = cache_format(k_cache)
    if cache_format(v_cache) != fmt:
        raise KVCacheFormatError(f"k and v caches must share a format, got {k_cache.dtype} and {v_cache.dtype}")
    if fmt == "int8":
        want = (*k_cache.shape[:3], 2)
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not isinstance(s, torch.Tensor) or tuple(s.shape) != want or s.dtype != torch.float32:
                raise KVCacheFormatError(
                    f"an int8 cache needs {name} as a float32 tensor {want} of per-token scales and zero points "
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
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (codes uint8 [..., head_dim], scale/zero float32 [..., 2]) per row (the module doc)."""
    x = x.float()
    lo = x.amin(dim=-1)
    scale = (x.amax(dim=-1) - lo) / INT8_LEVELS
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.floor((x - lo[..., None]) / safe[..., None] + 0.5).clamp(0, INT8_LEVELS)
    return codes.to(torch.uint8), torch.stack((scale, lo), dim=-1)


def dequantize(cache: torch.Tensor, scale, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows of a cache (any leading shape, head_dim last) as `dtype`; `scale` as the format takes it (for int8 the
    scale/zero rows matching the cache rows' leading shape)."""
    fmt = cache_format(cache)
    if fmt == "fp8":
        return cache.to(dtype) * fp8_scale(scale)
    if fmt == "int8":
        sz = scale.to(dtype)
        return cache.to(dtype) * sz[..., 0:1] + sz[..., 1:2]
    return cache.to(dtype)


def write_rows(x: torch.Tensor, cache: torch.Tensor, scale, slots: torch.Tensor) -> None:
    """Store rows x [tokens, kv_heads, head_dim] at slots (all >= 0) of the paged `cache`, quantized as its format."""
    num_blocks, block_size, kv_heads, head_dim = cache.shape
    rows = num_blocks * block_size
    fmt = cache_format(cache)
    if fmt == "fp8":  # index_copy_ has no float8 kernel on the CPU: copy the bits
        codes = quantize_fp8(x, fp8_scale(scale)).view(torch.uint8)
        cache.view(torch.uint8).view(rows, kv_heads, head_dim).index_copy_(0, slots, codes)
    elif fmt == "int8":
        codes, sz = quantize_int8(x)
        cache.view(rows, kv_heads, head_dim).index_copy_(0, slots, codes)
        scale.view(rows, kv_heads, 2).index_copy_(0, slots, sz)
    else:
        cache.view(rows, kv_heads, head_dim).index_copy_(0, slots, x.to(cache.dtype))

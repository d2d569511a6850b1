"""Quantized KV caches (kernels/attention/kv_quant.py): the KV write's codes against the torch quantization, the
fp8 bit conversion over every code, and paged decode/prefill over fp8, int8 and int4 caches against the float64
reference reading the same codes. CPU: tiny shapes under TRITON_INTERPRET=1; GPU: real shapes."""

from functools import partial

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels.attention_helpers import (
    ARCHS,
    DEV,
    DTYPES,
    ON_GPU,
    assert_close,
    make_paged,
    plan_inputs,
    poisoned_like,
    sim_device,
)
from vlchat.kernels.attention import decode, kv_quant, kv_write, plan, prefill, reference
from vlchat.kernels.attention.configs import TABLES, DecodeConfig, PrefillConfig, WsDecodeConfig

FORMATS = ["fp8", "int8", "int4"]
KV_HEADS = 8 if ON_GPU else 2


def _scales(fmt, cache, k_scale=1.0, v_scale=1.0):
    """(k_scale, v_scale) for a cache of `fmt` shaped like `cache`, as kv_quant.allocate gives them."""
    if fmt in kv_quant.LEVELS:
        shape = (*cache.shape[:3], 2)
        return torch.zeros(shape, device=DEV), torch.zeros(shape, device=DEV)
    return (k_scale, v_scale) if fmt == "fp8" else (None, None)


def quantized_paged(fmt, lens, page, kv_heads, head_dim, dtype, k_scale=1.0, v_scale=1.0, magnitude=1.0):
    """(k_cache, v_cache, tables, k_scale, v_scale): random unquantized K/V (shuffled pages; times `magnitude`,
    offset by 3 * magnitude) written into caches of `fmt` through the reference write, every slot of every block."""
    k16, v16, tables = make_paged(lens, page, kv_heads, head_dim, dtype)
    if magnitude != 1.0:
        k16, v16 = ((x.float() * magnitude + 3 * magnitude).to(dtype) for x in (k16, v16))
    num_blocks = k16.shape[0]
    k_cache, v_cache, ks, vs = kv_quant.allocate(fmt, num_blocks, page, kv_heads, head_dim, dtype, DEV)
    ks, vs = (k_scale, v_scale) if fmt == "fp8" else (ks, vs)
    slots = torch.arange(num_blocks * page, device=DEV)
    reference.write_kv_cache(
        k16.view(-1, kv_heads, head_dim), v16.view(-1, kv_heads, head_dim), k_cache, v_cache, slots, ks, vs
    )
    return k_cache, v_cache, tables, ks, vs


# -- the torch quantization itself -------------------------------------------------------------------------------


def test_fp8_quantization_rounds_to_nearest_and_clamps():
    x = torch.tensor([0.0, 1.0, 1.0625, 1.1875, 500.0, -500.0, 2.0**-9, 2.0**-11, 7.77], dtype=torch.float64)
    codes = kv_quant.quantize_fp8(x, 1.0).to(torch.float64)
    # 1.0625 lies halfway between 1.0 and 1.125: to even (1.0); 1.1875 halfway to 1.25: to even (1.25)
    assert codes.tolist() == [0.0, 1.0, 1.0, 1.25, 448.0, -448.0, 2.0**-9, 0.0, 8.0]
    exact = torch.tensor([0.0, 1.0, 1.5, -0.75, 640.0], dtype=torch.float64)  # 640 would clamp at scale 1
    assert kv_quant.dequantize(kv_quant.quantize_fp8(exact, 2.0), 2.0, torch.float64).tolist() == exact.tolist()


def test_int8_quantization_error_is_at_most_half_a_step():
    x = torch.randn(7, 3, 64, dtype=torch.float64) * torch.tensor([0.01, 1.0, 30.0]).view(1, 3, 1)
    x[0, 0] = 2.5  # a constant row: exact (scale 0, zero = the value)
    codes, sz = kv_quant.quantize_int8(x)
    back = kv_quant.dequantize(codes, sz, torch.float64)
    step = sz[..., 0:1].double()
    assert torch.all((back - x).abs() <= step / 2 + 1e-6 * x.abs().amax(-1, keepdim=True))
    assert torch.equal(back[0, 0], x[0, 0]) and float(sz[0, 0, 0]) == 0.0
    assert int(codes.amin()) == 0 and int(codes.amax()) == 255


def test_int4_codes_pack_two_dimensions_a_byte_within_half_a_step():
    x = torch.randn(5, 2, 64, dtype=torch.float64)
    codes, sz = kv_quant.quantize_int(x, "int4")
    assert codes.shape == (5, 2, 32) and codes.dtype == torch.uint8
    unpacked = kv_quant.unpack_int4(codes)
    assert int(unpacked.amax()) == 15 and int(unpacked.amin()) == 0
    assert torch.equal(unpacked[..., 1::2], codes >> 4)  # odd dimensions in the high nibble
    back = kv_quant.dequantize(codes, sz, torch.float64, "int4")
    assert torch.all((back - x).abs() <= sz[..., 0:1].double() / 2 + 1e-6)
    assert kv_quant.cache_format(codes, 64) == "int4" and kv_quant.cache_format(codes, 32) == "int8"


@pytest.mark.parametrize("head_dim,block", [(64, 64), (80, 16), (96, 32), (128, 128), (256, 256), (512, 256)])
def test_rotation_is_a_symmetric_block_hadamard(head_dim, block):
    h = kv_quant.rotation(head_dim)
    assert kv_quant.hadamard_block(head_dim) == block
    assert set(h.unique().tolist()) <= {-1.0, 0.0, 1.0} and torch.equal(h, h.T)
    torch.testing.assert_close(h @ h, block * torch.eye(head_dim), atol=0, rtol=0)
    assert int(h[:block, :block].abs().sum()) == block * block and int(h.abs().sum()) == head_dim * block


def test_bytes_per_token_counts_codes_and_scales():
    assert kv_quant.bytes_per_token("auto", 8, 128, torch.bfloat16) == 2 * 8 * 128 * 2
    assert kv_quant.bytes_per_token("fp8", 8, 128, torch.bfloat16) == 2 * 8 * 128
    assert kv_quant.bytes_per_token("int8", 8, 128, torch.float16) == 2 * 8 * (128 + 8)
    assert kv_quant.bytes_per_token("int4", 8, 128, torch.float16) == 2 * 8 * (64 + 8)


@pytest.mark.parametrize(
    "fmt,k_scale,message",
    [
        ("int8", None, "float32 tensor"),
        ("int4", None, "float32 tensor"),
        ("fp8", -1.0, "positive Python float"),
        ("auto", 1.0, "quantized"),
    ],  # fmt: skip
)
def test_scales_that_do_not_fit_the_format_raise_typed_errors(fmt, k_scale, message):
    cache = torch.zeros(2, 16, 1, kv_quant.storage_dim(fmt, 64), dtype=kv_quant.storage_dtype(fmt, torch.float16))
    v_scale = torch.zeros(2, 16, 1, 2) if fmt in kv_quant.LEVELS else None
    with pytest.raises(kv_quant.KVCacheFormatError, match=message):
        kv_quant.check_scales(cache, cache, k_scale, v_scale, 64)


def test_an_odd_head_dim_has_no_int4_cache():
    with pytest.raises(kv_quant.KVCacheFormatError, match="odd"):
        kv_quant.allocate("int4", 2, 16, 1, 81, torch.float16, "cpu")


# -- the KV write ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_heads,head_dim,page", [(2, 80, 16), (5, 64, 32)], ids=str)
def test_kv_write_quantizes_as_the_reference(fmt, dtype, kv_heads, head_dim, page):
    """Codes (and int8/int4 scale/zero pairs) bit-identical to the torch quantization; skipped slots keep their
    bytes."""
    num_blocks, tokens = 4, 11
    k = torch.randn(tokens, kv_heads, head_dim, device=DEV) * 3
    k[0] *= 300  # clamped to +-448 in fp8
    k[1] *= 1e-4  # fp8 subnormals
    k[2, 0] = 0.75  # a constant row: int8/int4 scale 0
    k = k.to(dtype)
    v = torch.randn(tokens, kv_heads, head_dim, device=DEV).to(dtype)
    slots = torch.randperm(num_blocks * page, device=DEV)[:tokens]
    slots[4] = -1
    storage = kv_quant.storage_dtype(fmt, dtype)
    width = kv_quant.storage_dim(fmt, head_dim)
    caches = [torch.randint(0, 255, (num_blocks, page, kv_heads, width), device=DEV, dtype=torch.uint8)
              .view(storage) for _ in range(2)]  # fmt: skip
    scales = _scales(fmt, caches[0], 0.5, 2.0)
    if fmt in kv_quant.LEVELS:
        scales = tuple(s.normal_() for s in scales)
    expected = [c.clone() for c in caches]
    expected_scales = tuple(s.clone() if isinstance(s, torch.Tensor) else s for s in scales)
    kv_write.write_kv_cache(k, v, *caches, slots, *scales)
    reference.write_kv_cache(k, v, *expected, slots, *expected_scales)
    for got, want in zip(caches, expected, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    if fmt in kv_quant.LEVELS:
        for got, want in zip(scales, expected_scales, strict=True):
            assert torch.equal(got, want)


@triton.jit
def _fp8_to_float_kernel(bits_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, decode.fp8_to_half(tl.load(bits_ptr + offs)).to(tl.float32))


def test_fp8_bits_convert_exactly_for_every_finite_code():
    """The kernels' integer conversion of e4m3 bits (times 256) equals torch's float8_e4m3fn value, all 254 finite
    codes (normal and subnormal, both signs)."""
    bits = torch.arange(256, dtype=torch.uint8, device=DEV)
    out = torch.empty(256, device=DEV)
    _fp8_to_float_kernel[(1,)](bits, out, N=256)
    finite = (bits & 0x7F) != 0x7F
    want = bits.view(torch.float8_e4m3fn).float()
    assert torch.equal((out * kv_quant.FP8_HALF_FACTOR)[finite], want[finite])


# -- decode and prefill over quantized caches ----------------------------------------------------------------------


def _lens(page):
    return [1, page - 1, page + 1, 4133 if ON_GPU else 2 * page + 5]


def decode_quant_case(fmt, group, head_dim, dtype, splits, page, window=None, softcap=0.0, device=None,
                      config=None, scales=(1.0, 1.0), magnitude=1.0):  # fmt: skip
    lens = _lens(page)
    kv_heads = KV_HEADS
    k_cache, v_cache, tables, ks, vs = quantized_paged(fmt, lens, page, kv_heads, head_dim, dtype, *scales,
                                                       magnitude=magnitude)  # fmt: skip
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(len(lens), kv_heads * group, head_dim, device=DEV).to(dtype)
    out = poisoned_like(q)
    scale = head_dim**-0.5
    decode.paged_decode_attention(
        q, k_cache, v_cache, tables, seq_lens, scale, window, splits, out, softcap, device=device, config=config,
        k_scale=ks, v_scale=vs,
    )  # fmt: skip
    ref = reference.paged_decode_attention(
        q.double(), k_cache, v_cache, tables, seq_lens, scale, window, None, None, softcap, k_scale=ks, v_scale=vs
    )
    return out, ref


DECODE_CASES = [  # group, head_dim, splits, page, dtype on CPU
    (4, 64, 1, 16, torch.float16),
    (8, 128, 3, 16, torch.float16),
    (1, 80, 2, 32, torch.float32),
]
DECODE_PARAMS = [(*c[:4], d) for c in DECODE_CASES for d in DTYPES] if ON_GPU else DECODE_CASES


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("group,head_dim,splits,page,dtype", DECODE_PARAMS, ids=str)
def test_decode_over_quantized_cache_matches_reference(fmt, group, head_dim, splits, page, dtype):
    out, ref = decode_quant_case(fmt, group, head_dim, dtype, splits, page)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_quantized_with_window_softcap_and_fp8_scales(fmt):
    out, ref = decode_quant_case(fmt, 4, 64, torch.float16, 3, 16, window=20, softcap=30.0, scales=(0.25, 4.0))
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("magnitude", [1e-4, 1e2], ids=str)
def test_decode_int_cache_of_small_and_large_rows_with_offsets(fmt, magnitude):
    """Rows far from unit size and off zero: the kernel applies the K scales and zero points to the scores
    (scale * q . code + zero * sum(q)) and the V scales to p, normalized by the tile's largest scale (small
    scales times p alone would underflow float16), with the zero points' share summed beside."""
    out, ref = decode_quant_case(fmt, 4, 128, torch.float16, 3, 16, magnitude=magnitude)
    assert not torch.isnan(out).any()
    err = float((out.double() - ref).norm() / ref.norm())
    assert err <= 2e-3, f"relative error {err:.3g}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arch", list(ARCHS) if ON_GPU else ["sm_70", "sm_80", "sm_90"], ids=str)
def test_decode_quantized_every_arch_config(fmt, arch):
    """Every decode config of the arch (the quantized cache's, with twice the keys a tile, and the 2-byte ones)
    over the cache; on sm_89+ the fp8 codes convert with the native instructions."""
    device = sim_device(ARCHS[arch])
    table = TABLES[arch]
    configs = [table.decode_config(128, cache_format=fmt), table.decode_deep_config(128, cache_format=fmt)]
    configs += [table.decode_config(128), table.decode_deep_config(128)]
    for config in dict.fromkeys(c for c in configs if c is not None):
        out, ref = decode_quant_case(fmt, 4, 128, torch.float16, 2, 16, device=device, config=config)
        assert_close(out, ref, torch.float16)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_caches_plan_triton_configs_on_sm90(fmt):
    """The plan never puts a quantized cache on the Gluon kernels (decode_ws.supports refuses it), and a Gluon
    config passed in for one falls back to the Triton kernel."""
    device = sim_device(ARCHS["sm_90"], sm_count=132)
    storage = kv_quant.storage_dtype(fmt, torch.float16)
    for batch, ctx in [(1, 131072), (64, 4096), (256, 1024)]:
        q, k_cache, tables = plan_inputs(batch, ctx)
        _, config = plan.decode_plan(q, k_cache.to(storage), tables, device)
        assert isinstance(config, DecodeConfig)
    _, config = plan.bound_plan(4, 32, 8, 128, torch.float16, 16, 131072, device, cache_dtype=storage)
    assert isinstance(config, DecodeConfig)
    ws = TABLES["sm_90"].decode_ws_config(128, torch.float16)
    assert isinstance(ws, WsDecodeConfig)
    out, ref = decode_quant_case(fmt, 4, 128, torch.float16, 2, 16, device=device, config=ws)
    assert_close(out, ref, torch.float16)


def test_int8_caches_plan_their_own_config_on_grids_of_several_waves():
    """On sm_90 an int8 cache's grids of several waves take decode_int8 (measured there), fp8's and int4's the
    doubled tiles; bound_plan tells int4 (two codes a byte) from int8 by the cache's width."""
    device = sim_device(ARCHS["sm_90"], sm_count=132)
    table = TABLES["sm_90"]
    q, k_cache, tables = plan_inputs(128, 512, kv_heads=32)
    int8 = plan.decode_plan(q, k_cache.to(torch.uint8), tables, device)[1]
    assert int8 == table.decode_int8[128] != table.decode_config(128, cache_format="fp8")
    packed = torch.empty(*k_cache.shape[:-1], 64, dtype=torch.uint8, device="meta")  # int4
    int4 = plan.decode_plan(q, packed, tables, device)
    assert int4[1] == table.decode_config(128, cache_format="int4")
    assert plan.decode_plan(q, k_cache.to(torch.float8_e4m3fn), tables, device)[1] == int4[1]
    bound = partial(plan.bound_plan, 128, 32, 32, 128, torch.float16, 16, 512, device, cache_dtype=torch.uint8)
    assert bound() == (1, int8) and bound(cache_width=64) == int4


SMALL = None if ON_GPU else PrefillConfig(16, 16, 4, 1)


def _prefill_batch(page):
    if ON_GPU:
        return [(700, 700), (3 * page + 1, 1), (2100, 1000), (page - 1, page - 1)]
    return [(5, 5), (page + 1, 1), (2 * page + 3, page + 2)]


PREFILL_CASES = [(4, 64, 16, torch.float16), (2, 128, 32, torch.float32)]
PREFILL_PARAMS = [(*c[:3], d) for c in PREFILL_CASES for d in DTYPES] if ON_GPU else PREFILL_CASES


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [False, True], ids=["pages", "rows"])
@pytest.mark.parametrize("group,head_dim,page,dtype", PREFILL_PARAMS, ids=str)
def test_prefill_over_quantized_prefix_matches_reference(fmt, rows, group, head_dim, page, dtype):
    """A cached prefix read from quantized pages; the chunk's keys from its pages too, or (rows) from its
    unquantized rows as the engine passes them."""
    pairs = _prefill_batch(page)
    lens = [kv for kv, _ in pairs]
    k_cache, v_cache, tables, ks, vs = quantized_paged(fmt, lens, page, KV_HEADS, head_dim, dtype, 0.5, 2.0)
    new = [n for _, n in pairs]
    cu = torch.tensor([0] + new, device=DEV).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(sum(new), KV_HEADS * group, head_dim, device=DEV).to(dtype)
    kv = (None, None)
    if rows:  # fresh rows near (not equal to) what the pages hold: the kernel must read these, not the pages
        kv = tuple(torch.randn(sum(new), KV_HEADS, head_dim, device=DEV).to(dtype) for _ in range(2))
    out = poisoned_like(q)
    args = (tables, cu, seq_lens, head_dim**-0.5, max(new), True, None, 0.0)
    prefill.paged_prefill_attention(q, k_cache, v_cache, *args, *kv, config=SMALL, out=out, k_scale=ks, v_scale=vs)
    ref = reference.paged_prefill_attention(
        q.double(), k_cache, v_cache, *args, *(None if t is None else t.double() for t in kv), k_scale=ks, v_scale=vs
    )
    assert_close(out, ref, dtype)

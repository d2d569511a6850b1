"""The W4A16 op: the Triton kernels (interpreted on CPU, tiny shapes; real 7B shapes on a GPU) against float64
products of the dequantized weight, over group sizes, zeros, g_idx, split-k decode rows (CUDA-core and tl.dot
products) and GEMM rows; its packing, tile and split rules, the split counters, dispatch and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.attention_helpers import ARCHS, DEV, ON_GPU, sim_device
from vlchat.kernels import dispatch
from vlchat.kernels.device import device_for
from vlchat.kernels.ops.quant_linear import (
    DEQUANT_ROWS,
    GEMV_MAX_ROWS,
    OP,
    W4A16_CONFIGS,
    W4Config,
    W4GemvConfig,
    dequantize_w4,
    dequantize_w4_triton,
    launch_config,
    pack_int4,
    split_count,
    split_counters,
    unpack_int4,
    w4a16_linear,
    w4a16_triton,
)

TOLS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else [])  # the interpreter's bf16 dot is off
K, N = (4096, 4096) if ON_GPU else (256, 40)  # N not a multiple of the tile: masked columns


def _weights(k, n, group, zeros, g_idx, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (k, n), generator=gen)
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.005).to(dtype)
    z = torch.randint(0, 17, (k // group, n), generator=gen).to(torch.uint8) if zeros else None
    gi = (torch.randperm(k, generator=gen) // group).to(torch.int32) if g_idx else None
    to = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    return to(pack_int4(codes)), to(scales), to(z), to(gi)


def _want(x, qweight, scales, zeros, g_idx, group, bias=None):
    """float64 product of x with the weight the kernel sees (dequantized, rounded once to x's dtype)."""
    w = dequantize_w4(qweight, scales, zeros, g_idx, group, x.dtype).double()
    y = x.double() @ w.T
    return y if bias is None else y + bias.double()


def _assert_close(got, want, dtype):
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    assert err <= TOLS[dtype], err


def test_pack_and_unpack_are_inverse():
    codes = torch.randint(0, 16, (64, 24))
    codes[7::8] = 15  # the top nibble set: the word is negative as int32
    packed = pack_int4(codes)
    assert packed.dtype == torch.int32 and packed.shape == (8, 24) and (packed < 0).any()
    assert torch.equal(unpack_int4(packed).long(), codes)
    assert torch.equal(packed[0, 0], torch.tensor(sum(int(codes[j, 0]) << (4 * j) for j in range(8))).to(torch.int32))


CASES = [  # (rows, group, zeros, g_idx, bias)
    (1, 128, False, False, False),
    (1, 32, True, True, True),
    (5, 64, True, False, False),
    (GEMV_MAX_ROWS, 32, False, True, False),
    (GEMV_MAX_ROWS + 1, 128, True, False, True),
    (80, 64, False, False, False),
    (80, 128, True, True, False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows, group, zeros, g_idx, bias", CASES, ids=lambda v: str(v))
def test_kernel_matches_float64(dtype, rows, group, zeros, g_idx, bias):
    qweight, scales, z, gi = _weights(K, N, group, zeros, g_idx, dtype, seed=rows + group)
    x = torch.randn(rows, K, device=DEV).to(dtype)
    b = torch.randn(N, device=DEV).to(dtype) if bias else None
    got = w4a16_triton(x, qweight, scales, z, gi, group, b)
    assert got.shape == (rows, N) and got.dtype == dtype
    _assert_close(got, _want(x, qweight, scales, z, gi, group, b), dtype)


GEMV_ROWS = list(range(1, GEMV_MAX_ROWS + 1))


@pytest.mark.parametrize("dot, tf32", [(False, False), (True, False), (True, True)], ids=["cores", "dot", "tf32"])
@pytest.mark.parametrize("rows", GEMV_ROWS, ids=lambda r: f"rows{r}")
def test_every_decode_row_count_matches_float64(rows, dot, tf32):
    """The GEMV at 1..16 rows on each product (CUDA cores, 16-bit tl.dot, tf32 tl.dot), over every group size, with and without zeros and g_idx, split
    over K; masked columns (N not a multiple of the tile)."""
    dtype = torch.float16
    group = GROUP_SIZES_CYCLE[rows % 3]
    zeros, g_idx = bool(rows % 2), rows % 4 in (1, 2)
    qweight, scales, z, gi = _weights(K, N, group, zeros, g_idx, dtype, seed=rows)
    x = torch.randn(rows, K, device=DEV).to(dtype)
    cfg = W4GemvConfig(32, min(32, group), 4, 4, dot, tf32)
    got = w4a16_triton(x, qweight, scales, z, gi, group, config=cfg, splits=3)
    _assert_close(got, _want(x, qweight, scales, z, gi, group), dtype)


GROUP_SIZES_CYCLE = (32, 64, 128)


@pytest.mark.parametrize("splits", [1, 2, 3, 7], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("rows", [1, 3], ids=lambda r: f"rows{r}")
def test_every_split_of_k_gives_the_same_sums(rows, splits):
    """Uneven slices (K steps do not divide evenly), a slice count rounded down to whole steps; the bias added once
    by the last slice of each column tile; the counters back at zero after each call."""
    qweight, scales, z, gi = _weights(K, N, 32, True, False, torch.float32, seed=splits)
    x = torch.randn(rows, K, device=DEV)
    b = torch.randn(N, device=DEV)
    for _ in range(2):  # the second call runs on the counters the first left
        got = w4a16_triton(x, qweight, scales, z, gi, 32, b, splits=splits)
        _assert_close(got, _want(x, qweight, scales, z, gi, 32, b), torch.float32)
        assert not split_counters(x.device, 1).any()


@pytest.mark.parametrize("splits", [1, 3, 5], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("g_idx", [False, True], ids=["groups", "g_idx"])
def test_the_gemm_split_over_k_gives_the_same_sums(splits, g_idx):
    """The GEMM (more rows than the GEMV takes) over K slices: several row and column tiles, each output tile
    reduced by its own last slice with the bias added once; the counters back at zero after each call."""
    qweight, scales, z, gi = _weights(K, N, 32, True, g_idx, torch.float16, seed=10 + splits)
    x = torch.randn(40, K, device=DEV).to(torch.float16)  # three 16-row tiles, the last one masked
    b = torch.randn(N, device=DEV).half()
    for _ in range(2):  # the second call runs on the counters the first left
        got = w4a16_triton(x, qweight, scales, z, gi, 32, b, config=W4Config(16, 16, 32, 2, 1), splits=splits)
        _assert_close(got, _want(x, qweight, scales, z, gi, 32, b), torch.float16)
        assert not split_counters(x.device, 1).any()


def test_the_gemm_splits_k_where_its_tiles_leave_the_gpu_idle():
    cfg = W4Config(64, 128, 64, 4, 4)
    assert split_count(4096, 4096, cfg, 132, row_tiles=1) == 9  # 32 output tiles: 9 slices of 7-8 steps for 2 waves
    assert split_count(22016, 4096, cfg, 132, row_tiles=2) == 1  # 344 output tiles fill 2 waves alone
    assert split_count(4096, 128, cfg, 132, row_tiles=1) == 2  # never more slices than K steps


PAIRS_CASES = [  # (rows, group, zeros, bias, block_k, splits)
    (1, 128, True, False, 64, 3),
    (1, 32, False, True, 32, 1),
    (1, 64, True, True, 64, 7),
    (2, 128, True, False, 32, 3),
    (3, 64, False, True, 16, 2),
    (4, 32, True, False, 16, 1),
]


@pytest.mark.parametrize("rows, group, zeros, bias, block_k, splits", PAIRS_CASES, ids=lambda v: str(v))
def test_the_pairs_gemv_matches_float64(rows, group, zeros, bias, block_k, splits):
    """fp16 rows on the half2 pairs kernel (its inline PTX compiled on a GPU, its fp32 twin interpreted), split
    over K, masked rows and columns; activations up to 3000 stay finite in its half2 sums; the counters back at
    zero."""
    n = N - 8  # not a multiple of the tile on either device
    qweight, scales, z, _ = _weights(K, n, group, zeros, False, torch.float16, seed=group + rows)
    x = torch.randn(rows, K, device=DEV)
    x[:, :16] = 3000.0 * torch.tensor([1, -1] * 8)  # a few massive activations, as real decoder layers have
    x = x.half()
    b = torch.randn(n, device=DEV).half() if bias else None
    cfg = W4GemvConfig(512 if ON_GPU else 32, block_k, 4, 4, False, pairs=True)
    for _ in range(2):  # the second call runs on the counters the first left
        got = w4a16_triton(x, qweight, scales, z, None, group, b, config=cfg, splits=splits)
        _assert_close(got, _want(x, qweight, scales, z, None, group, b), torch.float16)
    assert not split_counters(x.device, 1).any()


@pytest.mark.parametrize("rows, dtype, g_idx", [(5, torch.float16, False), (1, torch.float32, False),
                                                (1, torch.float16, True)], ids=str)  # fmt: skip
def test_a_pairs_config_takes_the_general_kernel_where_it_does_not_apply(rows, dtype, g_idx):
    qweight, scales, z, gi = _weights(K, N, 64, True, g_idx, dtype, seed=rows)
    x = torch.randn(rows, K, device=DEV).to(dtype)
    got = w4a16_triton(x, qweight, scales, z, gi, 64, config=W4GemvConfig(32, 64, 4, 4, False, pairs=True))
    _assert_close(got, _want(x, qweight, scales, z, gi, 64), dtype)


def test_a_strided_input_row_and_smaller_tiles():
    qweight, scales, z, gi = _weights(K, N, 64, True, False, torch.float16, seed=9)
    x = torch.randn(2, 2 * K, device=DEV).to(torch.float16)[:, ::2]  # last stride 2
    got = w4a16_triton(x, qweight, scales, z, gi, 64, config=W4GemvConfig(16, 32, 2, 4, False))
    _assert_close(got, _want(x, qweight, scales, z, gi, 64), torch.float16)
    x = torch.randn(20, 2 * K, device=DEV).to(torch.float16)[:, ::2]
    got = w4a16_triton(x, qweight, scales, z, gi, 64, config=W4Config(16, 16, 32, 2, 1))
    _assert_close(got, _want(x, qweight, scales, z, gi, 64), torch.float16)


def test_tile_and_split_rules():
    for cap in ARCHS.values():
        device = sim_device(cap, sm_count=132)
        for group in (32, 64, 128):
            table = W4A16_CONFIGS[cap]
            assert not table.gemv_cores.dot and table.gemv_dot.dot and 1 <= table.dot_rows <= GEMV_MAX_ROWS + 1
            for rows in (1, max(1, table.dot_rows - 1), table.dot_rows, GEMV_MAX_ROWS):
                gemv = launch_config(rows, group, False, device)
                assert gemv.dot == (rows >= table.dot_rows) and gemv.block_k <= group and group % gemv.block_k == 0
            assert launch_config(GEMV_MAX_ROWS + 1, group, False, device).block_m > GEMV_MAX_ROWS
        assert launch_config(1, 32, True, device).block_k >= 32  # with g_idx a step may span groups
        # one fp16 row without g_idx: the pairs kernel; bf16, g_idx or a second row: the others
        assert launch_config(1, 128, False, device, torch.float16) == table.gemv_pairs and table.gemv_pairs.pairs
        for other in (launch_config(1, 128, False, device, torch.bfloat16), launch_config(1, 128, True, device,
                      torch.float16), launch_config(2, 128, False, device, torch.float16)):  # fmt: skip
            assert not other.pairs
    assert set(W4A16_CONFIGS) == set(ARCHS.values())
    cfg = W4GemvConfig(64, 128, 4, 4, False)
    assert split_count(4096, 4096, cfg, 132) == 9  # 64 column tiles, 528 programs wanted
    assert split_count(22016, 4096, cfg, 132) == 2
    assert split_count(64, 256, cfg, 132) == 2  # never more slices than K steps


def test_dispatch_runs_the_reference_on_cpu_and_the_kernel_when_forced():
    qweight, scales, z, gi = _weights(64, 16, 32, True, False, torch.float32)
    x = torch.randn(2, 64, device=DEV)
    cpu = sim_device((8, 0)) if ON_GPU else device_for(x)
    if not ON_GPU:
        assert dispatch.choose(OP, torch.float32, cpu) == "torch"
    assert dispatch.choose(OP, torch.float32, cpu, backend="triton") == "triton"
    w = dequantize_w4(qweight, scales, z, gi, 32)
    _assert_close(w4a16_linear(x, qweight, scales, z, gi, 32), F.linear(x.double(), w.double()), torch.float32)


def test_bad_inputs_are_refused():
    qweight, scales, z, gi = _weights(64, 16, 32, True, True, torch.float32)
    x = torch.randn(2, 64, device=DEV)
    with pytest.raises(ValueError, match=r"qweight \[K // 8, N\]"):
        w4a16_linear(x[:, :32], qweight, scales, z, gi, 32)
    with pytest.raises(ValueError, match="group_size must be one of"):
        w4a16_linear(x, qweight, scales, z, gi, 16)
    with pytest.raises(ValueError, match="scales must be"):
        w4a16_linear(x, qweight, scales.half(), z, gi, 32)
    with pytest.raises(ValueError, match="zeros must be uint8"):
        w4a16_linear(x, qweight, scales, z.int(), gi, 32)
    with pytest.raises(ValueError, match=r"g_idx must be \[64\]"):
        w4a16_linear(x, qweight, scales, z, gi[:32], 32)
    with pytest.raises(ValueError, match="one group"):
        w4a16_triton(x, qweight, scales, z, None, 32, config=W4GemvConfig(16, 64, 2, 4, False))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("rows", [1, 16, 256], ids=lambda r: f"rows{r}")
def test_a_captured_product_replays(rows):
    """The decode path (split over K, reduced by each tile's last slice) and the GEMM path both capture into a CUDA
    graph, and replay with the counters left by the calls before."""
    qweight, scales, z, gi = _weights(4096, 11008, 128, True, False, torch.float16, seed=rows)
    x = torch.randn(rows, 4096, device=DEV, dtype=torch.float16)
    w4a16_triton(x, qweight, scales, z, gi, 128)  # compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = w4a16_triton(x, qweight, scales, z, gi, 128)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        _assert_close(y, _want(x, qweight, scales, z, gi, 128), torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group, zeros, g_idx", [(32, True, False), (128, False, False), (64, True, True)], ids=str)
def test_whole_weight_dequantization_equals_the_reference(dtype, group, zeros, g_idx):
    """The one-launch dequantization (ragged N, per-row groups with g_idx) is bitwise dequantize_w4, transposed."""
    qweight, scales, z, gi = _weights(K, N, group, zeros, g_idx, dtype, seed=group)
    got = dequantize_w4_triton(qweight, scales, z, gi, group, dtype)
    assert got.shape == (K, N) and got.dtype == dtype and got.is_contiguous()
    assert torch.equal(got, dequantize_w4(qweight, scales, z, gi, group, dtype).T)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_rows_multiply_the_dequantized_weight(dtype):
    """From DEQUANT_ROWS rows the product is the dequantized weight through torch's matmul, with the bias."""
    qweight, scales, z, gi = _weights(K, N, 64, True, False, dtype, seed=3)
    x = torch.randn(DEQUANT_ROWS + 3, K, device=DEV).to(dtype)
    bias = torch.randn(N, device=DEV).to(dtype)
    got = w4a16_linear(x, qweight, scales, z, gi, 64, bias) if ON_GPU else w4a16_triton(x, qweight, scales, z, gi, 64,
                                                                                          bias)  # fmt: skip
    assert got.shape == (DEQUANT_ROWS + 3, N) and got.dtype == dtype
    _assert_close(got, _want(x, qweight, scales, z, gi, 64, bias), dtype)


@pytest.mark.parametrize("rows", [17, 40], ids=lambda r: f"rows{r}")
def test_the_dot_gemv_takes_more_rows_when_asked(rows):
    """Given its config, the split-k GEMV's tl.dot path runs past GEMV_MAX_ROWS (x's rows padded to a power of two;
    the benchmark times it there against the GEMM) and matches float64."""
    qweight, scales, z, gi = _weights(K, N, 64, True, False, torch.float16, seed=rows)
    x = torch.randn(rows, K, device=DEV).to(torch.float16)
    got = w4a16_triton(x, qweight, scales, z, gi, 64, config=W4GemvConfig(32, 32, 4, 4, True), splits=2)
    assert got.shape == (rows, N)
    _assert_close(got, _want(x, qweight, scales, z, gi, 64), torch.float16)

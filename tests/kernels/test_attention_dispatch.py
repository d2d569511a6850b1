"""Dispatch of the attention ops for every (capability, dtype) pair, the arch tables and the forced backends."""

import pytest
import torch

import vlchat.kernels.attention as attention
from tests.kernels.attention_helpers import ARCHS, DEV, make_paged, sim_device
from vlchat.kernels import dispatch, settings
from vlchat.kernels.attention import configs
from vlchat.kernels.device import TritonMode

OPS = [attention.WRITE_KV, attention.DECODE, attention.PREFILL, attention.VARLEN]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("arch", list(ARCHS), ids=str)
def test_every_capability_dtype_pair(arch, dtype):
    device = sim_device(ARCHS[arch], mode=TritonMode.COMPILED)
    no_bf16 = dtype == torch.bfloat16 and ARCHS[arch] < (8, 0)
    assert configs.table_for(device).arch == arch
    for op in OPS:
        assert dispatch.choose(op, dtype, device, "auto") == ("torch" if no_bf16 else "triton")
        assert dispatch.choose(op, dtype, device, "torch") == "torch"
        if no_bf16:
            with pytest.raises(dispatch.KernelUnavailableError, match="bf16"):
                dispatch.choose(op, dtype, device, "triton")
        else:
            assert dispatch.choose(op, dtype, device, "triton") == "triton"
    if no_bf16:
        with pytest.raises(configs.UnsupportedDtypeError, match="float16"):
            configs.check_dtype(configs.table_for(device), dtype)
    else:
        configs.check_dtype(configs.table_for(device), dtype)


@pytest.mark.parametrize("arch", list(ARCHS), ids=str)
def test_every_config_fits_its_shared_memory(arch):
    table = configs.TABLES[arch]
    for head_dim in (64, 80, 96, 128, 256):
        for dtype in (torch.float16, torch.float32):
            pre, dec = table.prefill_config(head_dim, dtype), table.decode_config(head_dim, dtype)
            assert configs.prefill_smem_bytes(pre, head_dim, dtype.itemsize) <= table.smem_kb * 1024
            assert configs.decode_smem_bytes(dec, head_dim, dtype.itemsize) <= table.smem_kb * 1024
            if dtype == torch.float16:  # the tuned 2-byte configs are used as written
                assert pre == table.prefill[configs._bucket(head_dim)]
                assert dec == table.decode[configs._bucket(head_dim)]


def test_fp32_shrinks_the_tuned_tiles_where_they_overflow():
    # sm_80 prefill at head_dim 128: 128x64 tiles, 3 stages take 129 KB in fp16; fp32 would need 257 KB of the 163
    fp32 = configs.TABLES["sm_80"].prefill_config(128, torch.float32)
    assert (fp32.block_m, fp32.block_n, fp32.num_stages) == (128, 32, 2)
    assert configs.TABLES["sm_80"].prefill_config(80, torch.float32) == fp32  # 80 pads to 128
    # sm_90: head_dim 256 (64x64, 2 stages) drops to 32 keys; decode (one K/V tile ahead: 78 KB in fp32) fits
    assert configs.TABLES["sm_90"].prefill_config(256, torch.float32).block_n == 32
    assert configs.TABLES["sm_90"].decode_config(128, torch.float32) == configs.TABLES["sm_90"].decode[128]
    # sm_90 head_dim 128 (128x64, 2 stages: 96 KB in fp16) fits fp32 as tuned
    assert configs.TABLES["sm_90"].prefill_config(128, torch.float32) == configs.TABLES["sm_90"].prefill[128]


def test_unknown_archs_take_the_closest_older_table():
    assert configs.table_for(sim_device((8, 7))).arch == "sm_86"
    assert configs.table_for(sim_device((12, 0))).arch == "sm_90"
    assert configs.table_for(sim_device((10, 0))).arch == "sm_90"


def test_cpu_runs_the_reference_unless_triton_is_forced():
    cpu = attention.device_for(torch.empty(1))
    assert cpu.type == "cpu"
    assert dispatch.choose(attention.DECODE, torch.float16, cpu, "auto") == "torch"
    if cpu.triton == TritonMode.UNAVAILABLE:
        with pytest.raises(dispatch.KernelUnavailableError):
            dispatch.choose(attention.DECODE, torch.float16, cpu, "triton")


def test_a_forced_triton_without_triton_fails_loudly_and_float64_takes_the_reference():
    gone = sim_device((9, 0), mode=TritonMode.UNAVAILABLE)
    assert dispatch.choose(attention.DECODE, torch.float16, gone, "auto") == "torch"
    with pytest.raises(dispatch.KernelUnavailableError, match="Triton cannot run here"):
        dispatch.choose(attention.DECODE, torch.float16, gone, "triton")
    gpu = sim_device((9, 0), mode=TritonMode.COMPILED)
    for op in dispatch.registered_ops():
        assert dispatch.choose(op, torch.float64, gpu, "auto") == "torch", op
    with pytest.raises(dispatch.KernelUnavailableError, match="float64"):
        dispatch.choose(attention.DECODE, torch.float64, gpu, "triton")


def test_bf16_kernel_call_on_pre_ampere_fails_with_a_clear_error():
    from vlchat.kernels.attention import decode

    k_cache, v_cache, tables = make_paged([5], 16, 2, 64, torch.bfloat16)
    q = torch.randn(1, 4, 64, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor([5], dtype=torch.int32, device=DEV)
    with pytest.raises(configs.UnsupportedDtypeError, match="run the model in float16"):
        decode.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, device=sim_device((7, 5)))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_public_decode_follows_the_forced_backend(backend):
    k_cache, v_cache, tables = make_paged([3, 20], 16, 2, 64, torch.float32)
    q = torch.randn(2, 4, 64, device=DEV)
    lens = torch.tensor([3, 20], dtype=torch.int32, device=DEV)
    with settings.forced(backend):
        out = attention.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, num_splits=2)
    ref = attention.reference.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_decode_smem_matches_what_triton_allocates():
    """Probed on sm_90 with Triton 3.6 and 3.8 (64 keys, head_dim 128, fp16): the block-table load takes a
    pipeline stage of its own, so stages 3-4 hold one K/V tile, 5-6 two, 8 three."""
    for stages, size in ((3, 39168), (4, 39168), (5, 72192), (6, 72192), (8, 105216)):
        assert configs.decode_smem_bytes(configs.DecodeConfig(64, 4, stages, 4), 128, 2) == size
    assert configs.decode_smem_bytes(configs.DecodeConfig(32, 4, 12, 4), 128, 2) == 87680


def test_deep_decode_configs_fit_the_ctas_per_sm_they_are_meant_for():
    for table in configs.TABLES.values():
        for head_dim in table.decode_deep:
            deep = table.decode_deep_config(head_dim, torch.bfloat16)
            assert deep.ctas_per_sm * configs.decode_smem_bytes(deep, head_dim, 2) <= table.smem_kb * 1024
            assert table.decode_deep_config(head_dim, torch.float32) is None
            quant = table.decode_deep_config(head_dim, torch.bfloat16, "fp8")
            assert quant.block_n == 2 * deep.block_n
            assert quant.ctas_per_sm * configs.decode_smem_bytes(quant, head_dim, 2, 1) <= table.smem_kb * 1024


@pytest.mark.parametrize("arch", list(ARCHS), ids=str)
def test_quantized_cache_configs_take_twice_the_keys_and_fit(arch):
    """A quantized cache's tiles hold twice the keys of the tuned 2-byte tiles (configs.quantized_tiles), and fit
    the arch's shared memory at one byte an element with the int formats' scale/zero pairs."""
    table = configs.TABLES[arch]
    for head_dim in (64, 80, 128, 256):
        for dtype in (torch.float16, torch.float32):
            quant = table.decode_config(head_dim, dtype, "fp8")
            assert configs.decode_smem_bytes(quant, head_dim, dtype.itemsize, 1) <= table.smem_kb * 1024
            if dtype == torch.float16:
                assert quant == configs.quantized_tiles(table.decode[configs._bucket(head_dim)])
            int8 = table.decode_config(head_dim, dtype, "int8")
            assert configs.decode_smem_bytes(int8, head_dim, dtype.itemsize, 1) <= table.smem_kb * 1024
            if dtype == torch.float16:
                assert int8 == table.decode_int8.get(head_dim, quant)


def test_decode_smem_of_a_quantized_cache_matches_what_triton_allocates():
    """Probed on sm_90 with Triton 3.8 (head_dim 128, fp16 queries, int8 cache): the 1-byte tiles and their
    float32 (scale, zero) pairs, at 128 keys a tile."""
    for stages, size in ((4, 43520), (6, 78848)):
        assert configs.decode_smem_bytes(configs.DecodeConfig(128, 4, stages, 2), 128, 2, 1) == size


def test_sm90_prefill_tiles_leave_room_for_two_ctas_per_sm():
    # the reason for 128x64 tiles, one warp group, 2 stages: two CTAs share an SM's 228 KB and overlap their
    # softmax with each other's matrix products (configs.py); a change of tiles must keep that or re-measure
    cfg = configs.TABLES["sm_90"].prefill_config(128, torch.bfloat16)
    assert cfg.num_warps == 4 and 2 * configs.prefill_smem_bytes(cfg, 128, 2) <= 228 * 1024

"""The warp-specialized sm_90 decode (Gluon) against the float64 torch reference, and when it is chosen.

The kernel runs on an sm_90 GPU only (Gluon has no interpreter); when it can serve a call
(`decode_ws.available`/`supports`) and the Triton fallback's numerics are checked everywhere, the plan that picks it
in test_split_heuristic.py."""

import dataclasses

import pytest
import torch

from tests.kernels.attention_helpers import (
    DEV,
    SM90,
    assert_close,
    decode_case,
    make_paged,
    needs_sm90,
    plan_inputs,
    poisoned_like,
    sim_device,
)
from vlchat.kernels.attention import decode, decode_ws, gluon_sm90, plan, reference
from vlchat.kernels.attention.configs import TABLES, WsDecodeConfig
from vlchat.kernels.device import DeviceInfo, TritonMode, device_for

CONFIG = TABLES["sm_90"].decode_ws_config(128)


def test_only_sm90_has_a_warp_specialized_decode_config():
    for arch, table in TABLES.items():
        for head_dim in (64, 80, 128, 256):
            for dtype in (torch.float16, torch.bfloat16, torch.float32):
                config = table.decode_ws_config(head_dim, dtype)
                expected = arch == "sm_90" and head_dim in (64, 128, 256) and dtype != torch.float32
                assert (config is not None) == expected, (arch, head_dim, dtype)
                assert config is None or isinstance(config, WsDecodeConfig)


def test_ws_configs_hold_exactly_the_ctas_per_sm_the_plan_counts():
    """The plan's wave is ctas_per_sm CTAs per SM. Resident per SM: what the H200's 228 KB hold (1 KB of it
    reserved per CTA) and its 64K registers (256 threads: the loader warp is padded to a warpgroup, x the config's
    registers per thread)."""
    table = TABLES["sm_90"]
    for configs in (table.decode_ws, table.decode_ws_waves, table.decode_ws_long, table.decode_ws_short):
        for head_dim, config in configs.items():
            for group in (1, 4, 7, 8, 16, 64):
                per_cta = decode_ws.smem_bytes(config, head_dim, 2, group) + 1024
                resident = min(228 * 1024 // per_cta, 65536 // (256 * decode_ws.launch_options(config)["maxnreg"]))
                assert resident == config.ctas_per_sm, (head_dim, config, group)
    # the short-split config: the two-CTA config's ring at one CTA per SM, held there by its registers
    for head_dim, config in table.decode_ws_short.items():
        assert config.ctas_per_sm == table.decode_ws[head_dim].ctas_per_sm == 1 and config.registers > 128
        assert 228 * 1024 // (decode_ws.smem_bytes(config, head_dim, 2, 64) + 1024) >= 2  # shared memory for two


def test_query_columns_pad_the_group_for_wgmma():
    assert [decode_ws.query_columns(g) for g in (1, 4, 7, 8, 9, 64)] == [8, 8, 8, 8, 16, 64]


def test_page_lanes_cover_a_group_of_tiles():
    assert decode_ws.page_lanes(WsDecodeConfig(64, 4, 1), 16) == 16  # 4 tiles of 4 pages
    assert decode_ws.page_lanes(WsDecodeConfig(64, 3, 1), 32) == 8  # 3 tiles of 2 pages, to a power of two
    assert decode_ws.page_lanes(WsDecodeConfig(64, 4, 1), 64) == 4  # a box per tile
    assert decode_ws.page_lanes(WsDecodeConfig(128, 2, 1), 16) == 16


def test_packed_heads_size_the_query_box_and_the_page_lookup():
    """With pack_heads KV heads per CTA a tile holds block_n // pack_heads tokens of each (so fewer pages per tile to
    look up) and the query box the heads' groups."""
    packed = WsDecodeConfig(64, 2, 2, pack_heads=4)
    assert decode_ws.page_lanes(packed, 16) == 2  # 2 tiles of one 16-token page
    assert decode_ws.page_lanes(WsDecodeConfig(64, 2, 2, pack_heads=2), 16) == 4
    plain = WsDecodeConfig(64, 2, 2)
    assert decode_ws.smem_bytes(packed, 128, 2, 4) - decode_ws.smem_bytes(plain, 128, 2, 4) == 8 * (128 + 64) * 2
    assert decode_ws.smem_bytes(packed, 128, 2, 1) == decode_ws.smem_bytes(plain, 128, 2, 1)  # 8 columns either way


def test_packs_only_whole_pages_of_dividing_heads_within_its_columns():
    config = WsDecodeConfig(64, 2, 2)
    assert decode_ws.packs(config, 4, 8, 16, 4) and decode_ws.packs(config, 4, 8, 16, 2)
    assert decode_ws.packs(config, 16, 4, 16, 4)  # 64 query columns
    assert not decode_ws.packs(config, 32, 4, 16, 4)  # 128 columns
    assert not decode_ws.packs(config, 4, 6, 16, 4)  # 4 does not divide 6 KV heads
    assert not decode_ws.packs(config, 4, 8, 32, 4)  # 16 tokens per tile: half a 32-token page
    assert decode_ws.packs(config, 4, 8, 32, 2) and not decode_ws.packs(config, 4, 8, 64, 2)


@pytest.mark.skipif(gluon_sm90.gluon is None, reason="needs Triton's Gluon")
def test_launch_refuses_a_packing_the_kernel_cannot_take():
    q = torch.zeros(2, 24, 128, dtype=torch.float16)
    cache = torch.zeros(4, 16, 6, 128, dtype=torch.float16)
    tables, lens = torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="cannot take 4 KV heads per CTA here: 6 KV heads"):
        decode_ws.launch(q, cache, cache, tables, lens, 1.0, None, 1, q, q, q, WsDecodeConfig(64, 2, 2, pack_heads=4))


def test_available_only_where_the_kernel_can_serve_the_model():
    sm90 = sim_device((9, 0), sm_count=132)
    cpu = DeviceInfo("cpu", "cpu", None, 2, 0, 0, True, TritonMode.INTERPRETED)
    assert decode_ws.available(sm90, 4, 16) == (gluon_sm90.gluon is not None)
    assert not decode_ws.available(sim_device((8, 0)), 4, 16)
    assert not decode_ws.available(cpu, 4, 16)
    assert not decode_ws.available(sm90, 65, 16)  # more query heads per KV head than its 64 query columns
    assert not decode_ws.available(sm90, 4, 128)  # pages of 128 tokens: one TMA box per page holds 64 rows at most


def test_supports_refuses_what_it_cannot_read():
    q = torch.zeros(2, 8, 128, dtype=torch.float16, device=DEV)
    cache = torch.zeros(4, 16, 2, 128, dtype=torch.float16, device=DEV)
    assert decode_ws.supports(q, cache, cache, 0.0) == SM90
    assert not decode_ws.supports(q, cache, cache, 30.0)  # softcap: the Triton kernel
    strided_v = torch.zeros(4, 16, 2, 256, dtype=torch.float16, device=DEV)[..., :128]
    assert not decode_ws.supports(q, cache, strided_v, 0.0)  # pages are read as rows of a contiguous cache
    spread = torch.zeros(2, 8, 256, dtype=torch.float16, device=DEV)[..., :128]
    assert not decode_ws.supports(spread, cache, cache, 0.0)  # heads not adjacent: no TMA box over them


def test_a_ws_config_falls_back_to_the_triton_kernel_where_it_cannot_run():
    """On CPU (and for a softcap anywhere) a WsDecodeConfig runs the Triton kernel with the same split count."""
    out, ref = decode_case([1, 17, 40], 16, 8, 2, 64, torch.float16, None, 3, WsDecodeConfig(64, 4, 1), softcap=20.0)
    assert_close(out, ref, torch.float16)


LENS = [1, 15, 16, 17, 63, 64, 65, 129, 1000, 4097]
RUNS = [(None, 1), (None, 3), (None, 32), (1, 1), (7, 2), (100, 4), (1000, 16)]  # (window, splits)


@needs_sm90
@pytest.mark.parametrize(
    "page,q_heads,kv_heads,head_dim,dtype",
    [
        (16, 32, 8, 128, torch.float16),
        (16, 32, 8, 128, torch.bfloat16),
        (32, 8, 8, 128, torch.float16),  # MHA
        (64, 28, 4, 128, torch.bfloat16),  # a group of 7
        (16, 64, 1, 64, torch.float16),  # MQA, 64 query columns; head_dim 64
        (16, 32, 2, 128, torch.bfloat16),  # a group of 16: 16 query columns
        (64, 32, 8, 64, torch.bfloat16),
        (16, 8, 4, 256, torch.bfloat16),  # head_dim 256 (Gemma 3): a group of 2
        (64, 4, 1, 256, torch.float16),  # a group of 4, pages of 64
        (32, 64, 1, 256, torch.float16),  # 64 query columns at head_dim 256 (the consumer spills a little)
    ],
    ids=str,
)
def test_ws_decode_matches_reference(page, q_heads, kv_heads, head_dim, dtype):
    for window, splits in RUNS:
        config = TABLES["sm_90"].decode_ws_config(head_dim, dtype)
        out, ref = decode_case(LENS, page, q_heads, kv_heads, head_dim, dtype, window, splits, config)
        assert_close(out, ref, dtype)


@needs_sm90
@pytest.mark.parametrize("early_k", [False, True], ids=["release_after_pv", "early_k"])
@pytest.mark.parametrize("block_n,stages,page", [(64, 4, 64), (128, 2, 16), (64, 3, 32), (128, 3, 64)], ids=str)
def test_ws_decode_tile_shapes(block_n, stages, page, early_k):
    """Tiles of one page and of several (a box per page), rings of 2-4 stages, K released with V after the PV
    product or after its QK product (whichever the table holds for a config)."""
    config = WsDecodeConfig(block_n, stages, 1, early_k_release=early_k)
    for window, splits in RUNS[1:4]:
        out, ref = decode_case(LENS, page, 32, 8, 128, torch.float16, window, splits, config)
        assert_close(out, ref, torch.float16)


@needs_sm90
def test_the_long_split_config_matches_reference_at_any_count():
    """decode_ws_long over ragged lengths, windows and 1-32 splits (at 1 split the halving is off; at 3 a sequence
    of at most 256 visible keys runs on 1)."""
    config = TABLES["sm_90"].decode_ws_config(128, grid="long")
    for window, splits in RUNS:
        out, ref = decode_case(LENS, 16, 32, 8, 128, torch.float16, window, splits, config)
        assert_close(out, ref, torch.float16)


@needs_sm90
def test_the_short_split_config_at_its_registers_matches_reference():
    """decode_ws_short (the two-CTA config's ring compiled at more registers per thread) over ragged lengths,
    windows and 1-32 splits."""
    config = TABLES["sm_90"].decode_ws_config(128, grid="short")
    assert config.registers > 128
    for window, splits in RUNS:
        out, ref = decode_case(LENS, 16, 32, 8, 128, torch.bfloat16, window, splits, config)
        assert_close(out, ref, torch.bfloat16)


@needs_sm90
@pytest.mark.parametrize(
    "dtype,head_dim", [(torch.float16, 128), (torch.bfloat16, 128), (torch.bfloat16, 256)], ids=str
)
def test_ws_waves_config_over_a_grid_of_several_waves(dtype, head_dim):
    """The config for grids beyond one wave (two CTAs per SM at head_dim 128, one at 256) over more (sequence,
    KV head) units than one wave holds: ragged lengths, 1 and 3 splits, a window."""
    config = TABLES["sm_90"].decode_ws_config(head_dim, dtype, grid="waves")
    lens = [(37 * i) % 700 + 1 for i in range(40)]  # 40 sequences x 8 KV heads = 320 units: > 264, > 132
    for window, splits in ((None, 1), (None, 3), (200, 1)):
        out, ref = decode_case(lens, 16, 32, 8, head_dim, dtype, window, splits, config)
        assert_close(out, ref, dtype)


@needs_sm90
def test_ws_waves_config_over_long_sequences():
    """The same config over many waves of long splits (32-55 tiles each, MHA and GQA): every stage of the ring is
    refilled many times while two CTAs share an SM, where a release that came too early would show as wrong rows
    (a variant with a barrier left unused did, on the H200)."""
    config = TABLES["sm_90"].decode_ws_config(128, torch.float16, grid="waves")
    lens = [2048 + 37 * i for i in range(40)]
    for q_heads, kv_heads in ((32, 32), (32, 8)):
        out, ref = decode_case(lens, 16, q_heads, kv_heads, 128, torch.float16, None, 1, config)
        assert_close(out, ref, torch.float16)


@needs_sm90
@pytest.mark.parametrize("ramp", [40.0, -40.0, 5.0], ids=["rising", "falling", "within_the_threshold"])
@pytest.mark.parametrize("grid", ["one_wave", "waves", "short"])
def test_ws_decode_keeps_a_stale_maximum_only_within_its_threshold(grid, ramp):
    """Logits that rise (or fall) by `ramp` along each sequence: the consumer computes a tile's probabilities
    against the running maximum and redoes them only where the tile's maximum passes it by more than
    decode_ws.RESCALE_LOG2 (8 in base 2). Rising by 40 (58 in base 2; 1.2-5 per 64-key tile) it does so every 2-7
    tiles, at least once within every split at S=5; falling, only at each split's first tile; rising by 5 (7.2 in
    base 2, plus the keys' noise) hardly ever after the first tile, its probabilities reaching about 2^7. fp16 and
    bf16, MHA and GQA, against the float64 reference."""
    lens = [3000, 1500, 700]
    config = TABLES["sm_90"].decode_ws_config(128, grid=grid)
    for dtype, q_heads, kv_heads in ((torch.float16, 8, 8), (torch.bfloat16, 32, 8)):
        k_cache, v_cache, tables = make_paged(lens, 16, kv_heads, 128, dtype)
        direction = torch.randn(len(lens), kv_heads, 128, device=DEV)
        # a group's query heads share their KV head's direction (plus noise), so every head's logits ramp
        q = direction.repeat_interleave(q_heads // kv_heads, dim=1) + 0.1 * torch.randn(
            len(lens), q_heads, 128, device=DEV
        )
        unit = direction / direction.norm(dim=-1, keepdim=True) ** 2 * 128**0.5  # scale * q . unit = 1
        for i, n in enumerate(lens):
            pos = torch.arange(n, device=DEV)
            rows, slots = tables[i, pos // 16].long(), pos % 16
            ramped = 0.3 * k_cache[rows, slots].float() + (ramp * pos / n)[:, None, None] * unit[i]
            k_cache[rows, slots] = ramped.to(dtype)
        q, seq_lens = q.to(dtype), torch.tensor(lens, dtype=torch.int32, device=DEV)
        ref = reference.paged_decode_attention(
            q.double(), k_cache.double(), v_cache.double(), tables, seq_lens, 128**-0.5, None, None, None, 0.0
        )
        for splits in (1, 5):
            out = poisoned_like(q)
            decode.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 128**-0.5, None, splits, out,
                                          config=config)  # fmt: skip
            assert_close(out, ref, dtype)


@needs_sm90
@pytest.mark.parametrize(
    "pack,page,q_heads,kv_heads,dtype",
    [
        (4, 16, 32, 8, torch.float16),  # GQA: 16 query columns
        (2, 16, 32, 8, torch.bfloat16),
        (2, 32, 8, 8, torch.float16),  # MHA, 32-token pages: one page per 32-token tile
        (4, 16, 32, 32, torch.bfloat16),
        (4, 16, 64, 4, torch.float16),  # groups of 16: 64 query columns
        (2, 16, 28, 4, torch.bfloat16),  # groups of 7: 14 heads' rows in 16 columns
    ],
    ids=str,
)
def test_ws_decode_packs_kv_heads_per_cta(pack, page, q_heads, kv_heads, dtype):
    """pack_heads KV heads per CTA (a tile of 64 // pack tokens x pack heads, each query column seeing its own
    head's rows): ragged lengths across page and tile edges, windows, 1-16 splits, the many-wave config the plan
    packs, against the float64 reference."""
    config = dataclasses.replace(TABLES["sm_90"].decode_ws_config(128, dtype, grid="waves"), pack_heads=pack)
    for window, splits in RUNS:
        out, ref = decode_case(LENS, page, q_heads, kv_heads, 128, dtype, window, splits, config)
        assert_close(out, ref, dtype)
    lens = [(37 * i) % 700 + 1 for i in range(96)]  # several waves of packed CTAs
    out, ref = decode_case(lens, page, q_heads, kv_heads, 128, dtype, None, 1, config)
    assert_close(out, ref, dtype)


@needs_sm90
def test_the_plan_packs_kv_heads_on_a_grid_it_turns_into_one_wave():
    """Unplanned, 128 sequences of 512 keys with 8 KV heads (1024 units) run 4 KV heads per CTA on an H200: one wave
    of 256 CTAs."""
    count, config = plan.decode_plan(*plan_inputs(128, 512), device_for(torch.empty(0, device=DEV)))
    assert (count, config.pack_heads) == (1, 4)
    out, ref = decode_case([512 - (7 * i) % 500 for i in range(128)], 16, 32, 8, 128, torch.float16, None, None, None)
    assert_close(out, ref, torch.float16)


@needs_sm90
def test_ws_decode_reads_a_query_inside_a_fused_projection():
    qkv = torch.randn(5, 32 + 2 * 8, 128, device=DEV, dtype=torch.float16)
    out, ref = decode_case([5, 100, 300, 17, 64], 16, 32, 8, 128, torch.float16, None, 4, CONFIG, q=qkv[:, :32])
    assert_close(out, ref, torch.float16)


@needs_sm90
def test_the_plan_runs_the_ws_kernel_on_a_small_batch():
    """Without a config a one-wave call (one sequence, 8 KV heads) is planned onto the Gluon kernel: its
    short-split config, 4096 keys split 16 ways on an H200."""
    count, config = plan.decode_plan(*plan_inputs(1, 4096), device_for(torch.empty(0, device=DEV)))
    assert config == TABLES["sm_90"].decode_ws_config(128, grid="short") and count > 1
    out, ref = decode_case([4096], 16, 32, 8, 128, torch.float16, None, None, None)
    assert_close(out, ref, torch.float16)


@needs_sm90
def test_the_long_split_config_halves_the_splits_of_short_sequences():
    """decode_ws_long at 32 splits: a sequence whose visible range 16 splits read in at most 256 keys each runs on
    the first 16 (the others write lse -inf and zeros), a longer one on all 32; ragged lengths across the boundary,
    with a window that makes a long sequence short. The partials are checked, then the merged output."""
    config = TABLES["sm_90"].decode_ws_config(128, grid="long")
    assert config.half_splits_keys == 256
    lens = [100, 16 * 256, 16 * 256 + 1, 40000, 2000]
    k_cache, v_cache, tables = make_paged(lens, 16, 8, 128, torch.float16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(len(lens), 32, 128, device=DEV).to(torch.float16)
    for window, halved in ((None, [True, True, False, False, True]), (1100, [True] * 5)):
        part = torch.full((len(lens), 32, 32, 128), float("nan"), device=DEV)
        lse = torch.full((len(lens), 32, 32), float("nan"), device=DEV)
        decode_ws.launch(q, k_cache, v_cache, tables, seq_lens, 128**-0.5, window, 32, q.clone(), part, lse, config)
        assert not torch.isnan(part).any() and not torch.isnan(lse).any()
        # unhalved, every length but 100 would reach split 16 (with the window: 1104-1152 visible keys, 18 splits)
        for i, half in enumerate(halved):
            assert bool(torch.isneginf(lse[i, :, 16:]).all()) == half, (window, i)
            assert bool((part[i, :, 16:] == 0).all()) == half, (window, i)
            assert torch.isfinite(lse[i, :, 0]).all(), (window, i)
        out = poisoned_like(q)  # these partials, merged
        decode.reduce_partials(part, lse, out, False)
        ref = reference.paged_decode_attention(
            q.double(), k_cache.double(), v_cache.double(), tables, seq_lens, 128**-0.5, window, None, None, 0.0
        )
        assert_close(out, ref, torch.float16)


def test_launch_options_take_the_configs_registers():
    """128 registers per thread let two CTAs of 256 threads share an SM's 64K; more leave room for one."""
    assert decode_ws.launch_options(WsDecodeConfig(64, 2, 1)) == {"num_warps": 4, "maxnreg": 128}
    for registers, per_sm in ((128, 2), (168, 1)):
        options = decode_ws.launch_options(WsDecodeConfig(64, 2, 1, registers=registers))
        assert 65536 // (256 * options["maxnreg"]) == per_sm


WAVES = TABLES["sm_90"].decode_ws_config(128, grid="waves")


def test_tile_stealing_takes_split_grids_of_one_kv_head_per_cta():
    """The kernel steals on split grids of configs with steal_tiles, one KV head per CTA; the loader looks up a
    whole unit's pages at once."""
    assert WAVES.steal_tiles == 4
    assert decode_ws.steals(WAVES, 2) == 4 and decode_ws.steals(WAVES, 1) == 0
    assert decode_ws.steals(dataclasses.replace(WAVES, pack_heads=2), 2) == 0
    assert decode_ws.steals(dataclasses.replace(WAVES, steal_tiles=0), 8) == 0
    assert decode_ws.page_lanes(WAVES, 16) == 16  # 4 tiles x 4 pages (the 2-stage ring alone: 8)
    assert decode_ws.page_lanes(dataclasses.replace(WAVES, steal_tiles=0), 16) == 8
    consts = decode_ws.constexprs(32, 8, 128, 16, TABLES["sm_90"].decode_ws_config(128, grid="long"), 32, True)
    assert consts["STEAL"] == 4 and consts["HALF_KEYS"] == 0  # stealing, no halving
    assert decode_ws.constexprs(32, 8, 128, 16, WAVES, 1, True)["STEAL"] == 0


def test_steal_counters_are_kept_per_owner_and_refused_past_their_size():
    cpu = torch.device("cpu")
    memo = {}
    counters = decode_ws.steal_counters(cpu, 10, memo)
    assert counters.dtype == torch.int32 and counters.numel() == 2 * decode_ws.STEAL_MAX_UNITS
    assert not counters.any() and decode_ws.steal_counters(cpu, 300, memo) is counters  # one buffer per owner
    assert decode_ws.steal_counters(cpu, 10, None).shape == (20,)  # no owner: fresh zeros for the call
    assert decode_ws.steal_counters(cpu, decode_ws.STEAL_MAX_UNITS + 1, memo) is None


@needs_sm90
@pytest.mark.parametrize("unit", [1, 4, 8])
@pytest.mark.parametrize(
    "grid,page,q_heads,kv_heads,dtype",
    [("waves", 16, 32, 8, torch.float16), ("long", 16, 32, 8, torch.bfloat16), ("waves", 32, 8, 8, torch.float16),
     ("waves", 64, 28, 4, torch.bfloat16)],
    ids=str,
)  # fmt: skip
def test_tile_stealing_matches_reference(grid, page, q_heads, kv_heads, dtype, unit):
    """Splits taking units of 1-8 tiles from their (sequence, KV head)'s counter: ragged lengths (one key, a page
    and a tile either side, 4097), windows, 1-32 splits (one: no stealing), MHA and GQA, pages of 16-64 tokens."""
    config = dataclasses.replace(TABLES["sm_90"].decode_ws_config(128, dtype, grid), steal_tiles=unit)
    for window, splits in RUNS:
        out, ref = decode_case(LENS, page, q_heads, kv_heads, 128, dtype, window, splits, config)
        assert_close(out, ref, dtype)


@needs_sm90
def test_tile_stealing_leaves_its_counters_at_zero_call_after_call_and_in_graph_replays():
    """With a kept counter buffer (the layer's cache memo): each call's last loader of a pair sets the pair back,
    so the next call, and each replay of a CUDA graph of the call with other lengths (a padding row of none among
    them: zeros), divides the work anew."""
    lens = [5000, 1, 300, 9000, 64, 4096]
    k_cache, v_cache, tables = make_paged([9001] * len(lens), 16, 8, 128, torch.float16)  # pages for any length
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(len(lens), 32, 128, device=DEV).to(torch.float16)
    memo = {}

    def call(out):
        return decode.paged_decode_attention(
            q, k_cache, v_cache, tables, seq_lens, 128**-0.5, None, 8, out, config=WAVES, cache_memo=memo
        )

    def reference_now():
        return reference.paged_decode_attention(
            q.double(), k_cache.double(), v_cache.double(), tables, seq_lens, 128**-0.5, None, None, None, 0.0
        )

    for _ in range(3):
        out = call(poisoned_like(q))
        torch.cuda.synchronize()
        assert not memo["steal_counters"].any()
        assert_close(out, reference_now(), torch.float16)
    out = poisoned_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(out)
    for new in ([9000, 2, 4097, 1, 5000, 128], [17, 8000, 0, 65, 3000, 9001]):  # 0: a graph's padding row
        seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not memo["steal_counters"].any()
        assert_close(out, reference_now(), torch.float16)

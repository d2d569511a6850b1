"""The decode split-count heuristic (plain Python, no GPU): its decisions and its wave model, and the decode plan
built on it (kernels/attention/plan.py: which config, how many splits, the Triton fallback's config)."""

import dataclasses

import pytest
import torch

from tests.kernels.attention_helpers import plan_inputs, sim_device
from vlchat.kernels.attention import decode_ws, splits
from vlchat.kernels.attention.configs import TABLES
from vlchat.kernels.attention.plan import (
    bound_plan,
    decode_plan,
    decode_splits,
    one_wave_configs,
    stealing_config,
    triton_config,
)

H200 = dict(sm_count=132, ctas_per_sm=4, block_n=64, bandwidth_gbs=4000.0)


def choose(batch, kv_heads, ctx, group=4, **hw):
    return splits.choose_num_splits(batch, kv_heads, group, ctx, 128, 2, **{**H200, **hw})


# sm_90's configs at head_dim 128 that a grid of one wave can plan: deep Triton, one-CTA Gluon (and its short-split
# variant), two-CTA Gluon (and its variant for long splits)
DEEP, WS, SHORT, WAVES, LONG = (TABLES["sm_90"].decode_deep_config(128), TABLES["sm_90"].decode_ws_config(128),
                                TABLES["sm_90"].decode_ws_config(128, grid="short"),
                                TABLES["sm_90"].decode_ws_config(128, grid="waves"),
                                TABLES["sm_90"].decode_ws_config(128, grid="long"))  # fmt: skip
# the two-CTA configs as the plan gives them to split grids whose splits are too short for tile stealing
# (splits.STEAL_MIN_KEYS), and the long one where it keeps the stealing (without its halving)
FIXED_WAVES, FIXED_LONG = (dataclasses.replace(c, steal_tiles=0) for c in (WAVES, LONG))
STEALING_LONG = dataclasses.replace(LONG, half_splits_keys=0)


def test_a_full_batch_is_not_split():
    assert choose(128, 8, 2048) == 1
    assert choose(64, 32, 1024, group=1) == 1


def test_small_batch_long_context_splits_to_fill_the_gpu():
    s = choose(1, 8, 32768)
    assert 132 <= 8 * s <= 132 * 4 * 2  # at least a CTA per SM, at most two waves of CTAs


def test_short_context_is_never_split_below_one_chunk():
    assert choose(1, 8, 64) == 1
    assert choose(1, 8, 200) <= 4  # ceil(200 / 64)


@pytest.mark.parametrize("batch,kv_heads", [(1, 8), (1, 32), (4, 8), (16, 8)], ids=str)
def test_splits_grow_with_context_and_stay_bounded(batch, kv_heads):
    counts = [choose(batch, kv_heads, ctx) for ctx in (512, 2048, 8192, 32768, 131072)]
    assert counts == sorted(counts)
    assert all(1 <= s <= splits.MAX_SPLITS for s in counts)


def test_choice_is_within_the_tie_band_of_the_modelled_best():
    args = (1, 8, 4, 4096, 128, 2, 132, 4, 64, 4000.0)
    times = [splits.modelled_time_us(s, *args) for s in range(1, 65)]
    chosen = splits.choose_num_splits(*args)
    assert times[chosen - 1] <= min(times) * splits.TIE
    assert all(t > min(times) * splits.TIE for t in times[: chosen - 1])  # the smallest such count


def test_wave_model_charges_a_partial_last_wave():
    # 132 SMs x 1 slot: 133 CTAs need two waves; 132 CTAs one
    one = splits.modelled_time_us(1, 132, 1, 1, 4096, 128, 2, 132, 1, 64, 4000.0)
    two = splits.modelled_time_us(1, 133, 1, 1, 4096, 128, 2, 132, 1, 64, 4000.0)
    assert two > one + splits.T0_US


def test_grids_of_two_waves_of_short_sequences_run_unsplit():
    """splits.UNSPLIT_WAVES: the model's own count would split these (its lockstep waves charge the last partial
    one in full); the rule keeps them unsplit, only up to UNSPLIT_MAX_KEYS keys and from two full waves on."""
    sm90 = sim_device((9, 0), sm_count=132)
    for batch, ctx, kv_heads in ((200, 4096, 8), (100, 8192, 8), (544, 2048, 8), (256, 2048, 32)):
        q, k_cache, tables = plan_inputs(batch, ctx, kv_heads=kv_heads)
        config = decode_plan(q, k_cache, tables, sm90)[1]
        assert config == WAVES and decode_plan(q, k_cache, tables, sm90)[0] == 1, (batch, ctx)
        assert decode_splits(q, k_cache, tables, sm90, config, unsplit_rule=False) > 1, (batch, ctx)
    assert decode_plan(*plan_inputs(128, 32768), sm90)[0] > 1  # longer CTAs: the model's count
    assert decode_plan(*plan_inputs(48, 32768), sm90)[0] > 1  # 1.45 waves
    # the rule on its own: from UNSPLIT_WAVES waves of slots, up to UNSPLIT_MAX_KEYS keys
    assert splits.unsplit(528, 8192, 264) and not splits.unsplit(527, 8192, 264)
    assert not splits.unsplit(528, 8193, 264)


def test_fewer_sms_need_fewer_splits():
    assert choose(1, 8, 32768, sm_count=40) < choose(1, 8, 32768, sm_count=132)


def test_decode_splits_reads_only_host_values():
    """The engine-facing helper: the context bound is the block table's width, the SM count the device's."""
    q, k_cache, tables = plan_inputs(2, 4096)  # meta tensors: 2 sequences, 8 KV heads, a table of 4096 tokens
    dev = sim_device((9, 0), sm_count=132)
    cfg = TABLES["sm_90"].decode_config(128)
    want = choose(2, 8, 4096, ctas_per_sm=cfg.ctas_per_sm, block_n=cfg.block_n)
    assert decode_splits(q, k_cache, tables, dev, cfg) == want > 1  # a given config: the wave model's count
    for ctx in (144, 272):  # not a whole number of tiles: the model's own count, its last split a partial tile
        q_short, k_short, tables_short = plan_inputs(1, ctx)
        short = choose(1, 8, ctx, ctas_per_sm=cfg.ctas_per_sm, block_n=cfg.block_n)
        assert decode_splits(q_short, k_short, tables_short, dev, cfg) == short == -(-ctx // cfg.block_n)
    dev114 = sim_device((9, 0), sm_count=114)  # not the 132 SMs the CPU interpreter plans with
    want114 = choose(2, 8, 4096, sm_count=114, ctas_per_sm=cfg.ctas_per_sm, block_n=cfg.block_n)
    assert decode_splits(q, k_cache, tables, dev114, cfg) == want114 != want


def test_deep_pipeline_takes_a_one_wave_grid_of_long_splits():
    # 132 SMs x 2 CTAs: 264 slots
    assert splits.deep_splits(256, 2048, 132, 2) == 1  # 32 sequences x 8 KV heads fill the wave unsplit
    assert splits.deep_splits(8, 32768, 132, 2) == 32  # one sequence: 264 // 8 = 33, down to a power of two
    assert splits.deep_splits(8, 4096, 132, 2) == 32  # splits of 128 keys: two chunks each
    assert splits.deep_splits(1, 1 << 20, 132, 2) == splits.MAX_SPLITS
    assert splits.deep_splits(16, 4096, 132, 1) == 8 and splits.deep_splits(16, 4096, 132, 2) == 16


def test_deep_pipeline_is_not_for_many_waves_or_short_splits():
    assert splits.deep_splits(512, 1 << 20, 132, 2) is None  # more units than the wave holds
    assert splits.deep_splits(8, 2048, 132, 2) is None  # 32 splits of 64 keys: too short
    assert splits.deep_splits(0, 4096, 132, 2) is None
    assert not splits.in_one_deep_wave(8, 34, 1 << 20, 132, 2)  # 272 CTAs: two waves


def test_decode_plan_takes_a_one_wave_config_only_where_one_applies():
    """sm_90 at head_dim 128 (where Gluon is there): the Gluon kernel at one CTA per SM on a grid of one wave of
    it that it runs unsplit, splits 32+ ways, or 16 ways into splits of at most SHORT_SPLIT_KEYS keys (its
    short-split config where the splits read at most SHORT_SPLIT_KEYS keys), at two CTAs per SM on the other
    one-wave grids, those it would split 16 ways into longer splits included (grids of several waves: the next
    test); the Triton configs elsewhere."""
    dev90, dev80 = sim_device((9, 0), sm_count=132), sim_device((8, 0), sm_count=108)

    def plan(batch, ctx, dev, dtype=torch.float16, gluon=True):
        return decode_plan(*plan_inputs(batch, ctx, dtype=dtype), dev, gluon=gluon)

    table = TABLES["sm_90"]
    if decode_ws.available(dev90, 4, 16):
        assert plan(32, 2048, dev90) == (1, WAVES)  # 256 units: one wave of two CTAs per SM, not of one
        # 8 units: one wave of the Gluon kernel's one CTA per SM would split 16 ways into 8192 keys: two CTAs per SM
        assert plan(1, 131072, dev90) == (32, FIXED_LONG)
        assert plan(1, 131072, dev90, torch.bfloat16) == (32, FIXED_LONG)
        assert plan(1, 32768, dev90) == (16, SHORT)  # splits of 2048 keys: the short-split config
        assert plan(1, 2048, dev90) == (16, SHORT)  # 128 keys per split (at two CTAs per SM 32 would read 64)
        # grids the one-CTA config would split 2-8 ways: two CTAs per SM, twice the splits
        assert plan(2, 32768, dev90) == (16, FIXED_WAVES)  # 16 units
        assert plan(4, 32768, dev90) == (8, FIXED_WAVES)  # 32 units
        assert plan(8, 4096, dev90) == (4, FIXED_WAVES)  # 64 units
        assert plan(16, 4096, dev90) == (1, WS)  # 128 units: unsplit at one CTA per SM
        assert plan(16, 2048, dev90) == (1, SHORT)  # the same, unsplit over 2048 keys
        ws64 = table.decode_ws_config(64)  # head_dim 64 has no two-CTA Gluon config: the one-CTA one keeps them
        assert decode_plan(*plan_inputs(4, 32768, head_dim=64), dev90) == (4, ws64)
    # no config given, 16 KV-head units on 132 SMs: the one-wave plan at two CTAs per SM, the Gluon kernel's (its
    # one-CTA config would split them 8 ways) or the deep Triton config's
    assert plan(2, 4096, dev90)[0] == 16
    assert DEEP.ctas_per_sm == 2
    assert plan(2, 4096, dev90, gluon=False) == (16, DEEP)
    # the Triton configs (a Triton without Gluon, or a call the Gluon kernel cannot run)
    assert plan(32, 2048, dev90, gluon=False) == (1, DEEP)
    assert plan(1, 32768, dev90, gluon=False) == (32, DEEP)
    assert plan(1, 32768, dev90, torch.float32)[1] == table.decode_config(128, torch.float32)
    assert plan(32, 2048, dev90, torch.float32)[1] == table.decode_config(128, torch.float32)
    assert plan(32, 2048, dev80)[1] == TABLES["sm_80"].decode_config(128)  # no deep config measured there


def test_short_splits_take_the_short_split_config_at_the_same_count():
    """A one-wave grid of the one-CTA Gluon config keeps its split count and runs the short-split config where every
    split reads at most SHORT_SPLIT_KEYS keys, and only then: one page more and it stays; head_dim 64 and 256, fp32
    and the Triton configs have no such config."""
    sm90 = sim_device((9, 0), sm_count=132)
    assert splits.SHORT_SPLIT_KEYS == 2048
    assert (SHORT.ctas_per_sm, SHORT.num_stages, SHORT.early_k_release, SHORT.registers) == (1, 2, True, 168)
    assert (WS.ctas_per_sm, WS.num_stages) == (1, 4)
    if decode_ws.available(sm90, 4, 16):
        for batch, ctx, count in ((1, 4096, 16), (1, 32768, 16), (12, 2048, 1), (16, 2048, 1)):
            plan = decode_plan(*plan_inputs(batch, ctx), sm90)
            assert plan == (count, SHORT), (batch, ctx, plan)  # 256, 2048, 2048 and 2048 keys per split
        assert decode_plan(*plan_inputs(1, 32768 + 16), sm90) == (32, FIXED_LONG)  # 2049 keys per split (the next test)
        assert decode_plan(*plan_inputs(12, 4096), sm90) == (1, WS)  # unsplit over 4096 keys
        assert decode_plan(*plan_inputs(2, 2048), sm90) == (
            16,
            FIXED_WAVES,
        )  # 8-way on one CTA: the two-CTA config first
        assert decode_plan(*plan_inputs(1, 4096, 28, 4), sm90) == (32, SHORT)  # 4 units, 32 splits of 128 keys
        assert decode_plan(*plan_inputs(1, 4096, head_dim=64), sm90)[1] == TABLES["sm_90"].decode_ws_config(64)
        assert decode_plan(*plan_inputs(1, 4096, 4, 1, 256), sm90)[1] == TABLES["sm_90"].decode_ws_config(256)
    assert decode_plan(*plan_inputs(1, 4096), sm90, gluon=False)[1] == DEEP
    assert decode_plan(*plan_inputs(1, 4096, dtype=torch.float32), sm90)[1] == TABLES["sm_90"].decode_config(128)


def test_long_splits_take_the_halving_two_cta_config_at_twice_the_count():
    """A one-wave grid the one-CTA Gluon config would split 16 ways (5-8 units) into splits of more than
    SHORT_SPLIT_KEYS keys runs the two-CTA kernel at 32 splits, on the config that halves them for a sequence whose
    visible range 16 read in 256 keys each; not at other counts, other head_dims, fp32 or Triton."""
    sm90 = sim_device((9, 0), sm_count=132)
    assert splits.LONG_TWO_CTA_COUNTS == (16,)
    assert LONG == dataclasses.replace(WAVES, half_splits_keys=256, pack_max_keys=0)  # one-wave grids: no packing
    assert all(c.half_splits_keys == 0 for c in (WS, SHORT, WAVES))
    assert LONG.registers == WAVES.registers == 128  # two CTAs per SM
    if decode_ws.available(sm90, 4, 16):
        for batch, ctx, q_heads, kv_heads in ((1, 131072, 32, 8), (1, 32768 + 16, 32, 8), (2, 65536, 16, 4),
                                              (1, 65536, 20, 5)):  # fmt: skip
            plan = decode_plan(*plan_inputs(batch, ctx, q_heads, kv_heads), sm90)
            assert plan == (32, FIXED_LONG), (batch, ctx, q_heads, kv_heads, plan)
        assert decode_plan(*plan_inputs(1, 32768), sm90) == (16, SHORT)  # 2048 keys per split
        assert decode_plan(*plan_inputs(1, 131072, 28, 4), sm90) == (32, WS)  # 4 units: 32 ways, not 16
        # 32 units: 4 ways on one CTA; splits of 16k keys steal tiles
        assert decode_plan(*plan_inputs(1, 131072, 32, 32), sm90) == (8, WAVES)
        assert decode_plan(*plan_inputs(1, 131072, head_dim=64), sm90)[1] == TABLES["sm_90"].decode_ws_config(64)
        assert decode_plan(*plan_inputs(1, 131072, 8, 4, 256), sm90)[1] == TABLES["sm_90"].decode_ws_config(256)
        # a given count: the long config's own, else the next config whose own count it is
        assert decode_plan(*plan_inputs(1, 131072), sm90, num_splits=32) == (32, FIXED_LONG)
    assert decode_plan(*plan_inputs(1, 131072), sm90, gluon=False)[1] == DEEP
    assert decode_plan(*plan_inputs(1, 131072, dtype=torch.float32), sm90)[1] == TABLES["sm_90"].decode_config(128)
    for arch, table in TABLES.items():  # sm_90 at head_dim 128 only
        assert set(table.decode_ws_long) == ({128} if arch == "sm_90" else set()), arch
    assert TABLES["sm_90"].decode_ws_config(128, torch.float32, grid="long") is None
    with pytest.raises(ValueError, match="one_wave, waves, short, long"):
        TABLES["sm_90"].decode_ws_config(128, grid="wave")


def test_decode_plan_of_a_grid_of_several_waves():
    """Beyond one wave of every one-wave config (or with splits too short for one), sm_90 at head_dim 128 plans
    the Gluon kernel at two CTAs per SM (where Gluon is there), and head_dim 64, fp32 and other archs the Triton
    config, each with the wave model's split count for that config (head_dim 256: the next test)."""
    sm90, sm80 = sim_device((9, 0), sm_count=132), sim_device((8, 0), sm_count=108)
    inputs = plan_inputs(40, 32768)  # 40 sequences of 32k keys, 8 KV heads: 320 units
    triton = TABLES["sm_90"].decode_config(128)
    # the wave model: 9 splits at two CTAs per SM (2880 CTAs, ~11 waves of 264), 3 at the Triton config's four
    if decode_ws.available(sm90, 4, 16):
        assert decode_plan(*inputs, sm90) == (9, FIXED_WAVES)  # 3641 keys per split
        # 1024 units: packed 4 KV heads per CTA into one wave (the next test)
        assert decode_plan(*plan_inputs(128, 512), sm90) == (1, dataclasses.replace(WAVES, pack_heads=4))
        assert decode_plan(*plan_inputs(128, 2048), sm90) == (1, WAVES)  # 1024 units, 8192 keys per packed CTA
        assert decode_plan(*plan_inputs(1, 1024), sm90)[1] == FIXED_WAVES  # 8 units, splits too short for one wave
    assert decode_plan(*inputs, sm90, gluon=False) == (3, triton)
    assert decode_plan(*plan_inputs(128, 512), sm90, gluon=False)[1] == triton
    assert decode_plan(*plan_inputs(1, 1024), sm90, gluon=False)[1] == triton
    assert decode_plan(*inputs, sm80)[1] == TABLES["sm_80"].decode_config(128)
    fp32 = plan_inputs(40, 32768, dtype=torch.float32)
    assert decode_plan(*fp32, sm90)[1] == TABLES["sm_90"].decode_config(128, torch.float32)
    assert decode_plan(*plan_inputs(40, 32768, head_dim=64), sm90)[1] == TABLES["sm_90"].decode_config(64)


def test_pack_heads_turns_an_unsplit_grid_of_several_waves_into_one():
    """splits.pack_heads: the largest of 4 and 2 KV heads per CTA that divides the heads and makes a grid of more
    than one wave one wave (at least 90% of its slots) of CTAs reading at most max_keys keys; else 1."""

    def pack(units, ctx, kv_heads=8, sm_count=132, max_keys=2048):
        return splits.pack_heads(units, kv_heads, ctx, sm_count, 2, max_keys)

    assert pack(1024, 512) == 4  # 256 CTAs of 264 slots
    assert pack(1024, 256) == 4 and pack(2048, 256) == 1  # 512 CTAs at 4: two waves
    assert pack(512, 1024) == 2 and pack(512, 256) == 2  # at 4: 128 CTAs, half a wave
    assert pack(512, 2048) == 1 and pack(1024, 1024) == 1  # 4096 keys per packed CTA
    assert pack(768, 256) == 1  # 384 or 192 CTAs: no whole wave
    assert pack(256, 256) == 1 and pack(264, 256) == 1  # one wave already
    assert pack(1024, 512, kv_heads=6) == 1 and pack(1024, 512, kv_heads=2) == 1  # 4 divides neither
    assert pack(1024, 512, max_keys=0) == 1  # a config without packing
    assert pack(1024, 512, sm_count=114) == 1  # 228 slots: 256 CTAs are more than a wave, 512 two


def test_decode_plan_packs_heads_only_on_unsplit_grids_of_its_many_wave_config():
    """sm_90 at head_dim 128 in fp16/bf16 (where Gluon is there): the many-wave config with pack_heads where
    splits.pack_heads and the kernel (decode_ws.packs: whole pages per tile, at most 64 query columns) allow."""
    sm90 = sim_device((9, 0), sm_count=132)
    if not decode_ws.available(sm90, 4, 16):
        pytest.skip("needs Triton's Gluon")
    packed = {p: dataclasses.replace(WAVES, pack_heads=p) for p in (2, 4)}
    assert decode_plan(*plan_inputs(64, 1024), sm90) == (1, packed[2])  # 32/8: 512 units
    assert decode_plan(*plan_inputs(32, 512, 32, 32), sm90) == (1, packed[4])  # MHA: 1024 units
    assert decode_plan(*plan_inputs(256, 512, 64, 4), sm90) == (1, packed[4])  # groups of 16: 64 columns
    assert decode_plan(*plan_inputs(128, 512, 32, 32), sm90) == (1, WAVES)  # 4096 units
    assert decode_plan(*plan_inputs(96, 512), sm90) == (1, WAVES)  # 768 units
    assert decode_plan(*plan_inputs(128, 512, page=32), sm90) == (1, WAVES)  # 4 heads: half a page per tile
    assert decode_plan(*plan_inputs(128, 512, page=64), sm90) == (1, WAVES)
    assert decode_plan(*plan_inputs(128, 512), sm90, gluon=False)[1] == TABLES["sm_90"].decode_config(128)
    assert decode_plan(*plan_inputs(128, 512, dtype=torch.float32), sm90)[1] == TABLES["sm_90"].decode_config(
        128, torch.float32
    )
    assert decode_plan(*plan_inputs(128, 512, 16, 8, 256), sm90)[1].pack_heads == 1  # head_dim 256
    assert decode_plan(*plan_inputs(128, 512), sim_device((8, 0), sm_count=108))[1] == TABLES["sm_80"].decode_config(
        128
    )


def test_bound_plan_reads_the_bound_as_the_block_tables_width():
    """plan.bound_plan (a batch given by shapes, as the engine plans its buckets): the plan of a block table as wide
    as the bound needs."""
    sm90 = sim_device((9, 0), sm_count=132)
    # the wave model splits 128 sequences 9 ways at a 32k bound, not at 1k (the engine's bucket for 1k keys)
    assert bound_plan(128, 32, 8, 128, torch.float16, 16, 32768, sm90)[0] > 1
    assert bound_plan(128, 32, 8, 128, torch.float16, 16, 1024, sm90)[0] == 1
    assert bound_plan(1, 32, 8, 128, torch.float16, 16, 4000, sm90) == decode_plan(*plan_inputs(1, 4000), sm90)


def test_gluon_splits_read_two_tiles_at_least_beyond_one_wave_too():
    """Where no one-wave config applies, the wave model's count on the Gluon kernel leaves every split at
    least DEEP_MIN_TOKENS keys (the model alone gives it 64-key splits at short contexts); the Triton kernel's splits
    keep their floor of one tile."""
    sm90 = sim_device((9, 0), sm_count=132)
    assert splits.DEEP_MIN_TOKENS == 128
    if decode_ws.available(sm90, 4, 16):
        assert decode_plan(*plan_inputs(1, 3072, 28, 4), sm90) == (24, FIXED_WAVES)  # the model alone: 48 splits
        assert decode_plan(*plan_inputs(1, 1024), sm90) == (8, FIXED_WAVES)  # 16
        ws256 = TABLES["sm_90"].decode_ws_config(256)
        assert decode_plan(*plan_inputs(1, 4096, 4, 1, 256), sm90) == (32, ws256)  # Gemma 3's heads: 64
        for q_heads, kv_heads, head_dim in ((32, 8, 128), (28, 4, 128), (16, 2, 128), (4, 1, 256)):
            for ctx in range(256, 8193, 256):
                count, config = decode_plan(*plan_inputs(1, ctx, q_heads, kv_heads, head_dim), sm90)
                assert count * splits.DEEP_MIN_TOKENS <= ctx or count == 1, (q_heads, ctx, count, config)
    assert decode_plan(*plan_inputs(1, 3072, 28, 4), sm90, gluon=False)[0] == 48  # 64-key splits
    assert decode_splits(*plan_inputs(1, 3072, 28, 4), sm90, WAVES) == 3072 // splits.DEEP_MIN_TOKENS  # a given config


def test_head_dim_256_plans_its_one_gluon_config_for_every_grid():
    """Gemma 3's head_dim on sm_90: one Gluon config at one CTA per SM for one-wave grids and beyond (no two-CTA
    config to give way to at TWO_CTA_COUNTS); fp32 plans the Triton config."""
    sm90, table = sim_device((9, 0), sm_count=132), TABLES["sm_90"]
    ws256 = table.decode_ws_config(256)
    assert ws256 == table.decode_ws_config(256, grid="waves") and ws256.ctas_per_sm == 1
    assert one_wave_configs(table, 256, torch.float16, True) == [ws256]  # listed once

    def plan(batch, ctx, q_heads=8, kv_heads=4, dtype=torch.float16):
        return decode_plan(*plan_inputs(batch, ctx, q_heads, kv_heads, 256, dtype), sm90)

    if decode_ws.available(sm90, 2, 16):
        assert plan(1, 4096) == (32, ws256)  # one wave: 4 units x 32 splits of 128 keys
        assert plan(8, 4096) == (4, ws256)  # 32 units split 4 ways: the count stays 4, on the same config
        assert plan(64, 2048, 16, 8)[1] == ws256  # 512 units: several waves
    assert plan(1, 4096, dtype=torch.float32)[1] == table.decode_config(256, torch.float32)  # no Gluon fp32


def test_a_given_count_keeps_a_one_wave_config_only_where_it_is_that_configs_own():
    """One sequence's 8 KV heads on 8 SMs: one CTA per SM with one split runs the one-CTA Gluon config (where
    Gluon is there); a given count runs the config it is the own count of, else the next one."""
    # test_decode_attention's one-wave case on a GPU: its 8 KV heads on 8 SMs, make_paged's 70 pages for 1100 tokens
    device = sim_device((9, 0), sm_count=8)
    q, k_cache, tables = plan_inputs(1, 70 * 16)
    if decode_ws.available(device, 4, 16):
        assert decode_plan(q, k_cache, tables, device) == (1, SHORT)  # 1120 keys: the short-split config
        assert decode_plan(q, k_cache, tables, device, num_splits=1) == (1, SHORT)  # the plan's own count: same
        assert decode_plan(q, k_cache, tables, device, num_splits=2) == (2, FIXED_WAVES)  # two CTAs per SM
        assert decode_plan(q, k_cache, tables, device, num_splits=4) == (4, FIXED_WAVES)  # two waves of it
    assert decode_plan(q, k_cache, tables, device, gluon=False) == (2, DEEP)
    assert decode_plan(q, k_cache, tables, device, 2, gluon=False) == (2, DEEP)  # deep's own count
    assert decode_plan(q, k_cache, tables, device, 4, gluon=False) == (4, TABLES["sm_90"].decode_config(128))


def test_the_fallback_takes_the_deep_triton_config_where_the_count_is_its_own():
    """A call the Gluon kernel cannot run keeps its planned split count on the Triton kernel: the deep config
    where that count is the deep config's own one-wave count, else the arch's config."""
    sm90 = sim_device((9, 0), sm_count=132)
    deep, shallow = DEEP, TABLES["sm_90"].decode_config(128)

    def fallback(batch, ctx, splits):
        return triton_config(sm90, *plan_inputs(batch, ctx), splits)

    assert fallback(32, 2048, 1) == deep  # 256 units: one wave of two CTAs per SM, unsplit
    assert fallback(32, 2048, 3) == shallow  # not the deep config's count
    assert fallback(1, 32768, 16) == shallow  # the one-CTA Gluon count; the deep config's would be 32
    assert fallback(1, 32768, 32) == deep
    assert fallback(128, 2048, 1) == shallow  # many waves


@pytest.mark.parametrize("sm_count", [78, 114, 132])
def test_a_planned_split_count_runs_the_config_it_was_planned_with(sm_count):
    """A caller that passes only a planned count (no config: the engine passes both) gets back the config the
    count was planned with."""
    dev = sim_device((9, 0), sm_count=sm_count)
    for kv_heads in (1, 8, 32):
        for batch in (1, 2, 8, 32, 128):
            for ctx in (128, 512, 2048, 32768, 131072):
                q, k_cache, tables = plan_inputs(batch, ctx, kv_heads=kv_heads)
                count, config = decode_plan(q, k_cache, tables, dev)
                assert decode_plan(q, k_cache, tables, dev, count) == (count, config), (kv_heads, batch, ctx)


def test_the_plan_is_the_one_the_committed_h200_result_measured():
    """On a simulated H200 (its SM count, sm_90, compiled) the plan picks, for each of the 32 decode shapes of
    benchmarks/results/attention_NVIDIA_H200.json, the config and split count that run measured: a change of the
    wave model or the config choice shows here until the benchmark is run again (shapes only: meta tensors)."""
    import json
    from pathlib import Path

    from benchmarks.attention import HEAD_DIM, PAGE, config_name
    from vlchat.kernels.device import TritonMode

    result = json.loads((Path(__file__).parents[2] / "benchmarks/results/attention_NVIDIA_H200.json").read_text())
    device = sim_device((9, 0), sm_count=result["sm_count"], mode=TritonMode.COMPILED)
    assert len(result["decode"]) == 32
    for row in result["decode"]:
        dtype = getattr(torch, row["dtype"])
        q = torch.empty(row["batch"], row["q_heads"], HEAD_DIM, dtype=dtype, device="meta")
        k_cache = torch.empty(8, PAGE, row["kv_heads"], HEAD_DIM, dtype=dtype, device="meta")
        tables = torch.empty(row["batch"], row["ctx"] // PAGE, dtype=torch.int32, device="meta")
        count, config = decode_plan(q, k_cache, tables, device)
        assert (count, config_name(config, count)) == (row["heuristic_splits"], row["heuristic_config"]), row


def test_the_plan_steals_tiles_where_each_split_reads_enough_keys():
    """The two-CTA configs steal tiles (decode_ws.py) on split grids whose splits read splits.STEAL_MIN_KEYS keys of
    the bound each (the long config then without its halving); shorter splits take fixed ranges, unsplit grids keep
    the table's config (nothing to steal), and so do configs without steal_tiles."""
    sm90 = sim_device((9, 0), sm_count=132)
    assert WAVES.steal_tiles == LONG.steal_tiles == 4 and WS.steal_tiles == SHORT.steal_tiles == 0
    assert splits.STEAL_MIN_KEYS == 8192 and splits.steals(65536, 8) and not splits.steals(65535, 8)
    if decode_ws.available(sm90, 4, 16):
        for ctx, tiles in ((32768, 0), (65536 - 16, 0), (65536, 4), (131072, 4)):  # MHA B=1: 8 splits
            count, config = decode_plan(*plan_inputs(1, ctx, 32, 32), sm90)
            assert (count, config.steal_tiles) == (8, tiles), ctx
        assert decode_plan(*plan_inputs(1, 262144), sm90) == (32, STEALING_LONG)
        assert decode_plan(*plan_inputs(32, 2048), sm90) == (1, WAVES)
    assert stealing_config(WAVES, 8, 1 << 20, decode_ws.STEAL_MAX_UNITS + 1) == FIXED_WAVES
    assert stealing_config(dataclasses.replace(WAVES, pack_heads=2), 8, 1 << 20, 8).steal_tiles == 0
    assert stealing_config(WAVES, 1, 1 << 20, 8) == WAVES
    assert stealing_config(DEEP, 8, 1 << 20, 8) == DEEP
    assert stealing_config(WS, 8, 1 << 20, 8) == WS

"""The decode split-count heuristic (plain Python, no GPU): its decisions and its wave model."""

import pytest
import torch

from kernels.attention import splits
from kernels.attention.configs import TABLES
from kernels.attention.decode import decode_splits
from tests.kernels.attention_helpers import sim_device

H200 = dict(sm_count=132, ctas_per_sm=4, block_n=64, bandwidth_gbs=4000.0)


def choose(batch, kv_heads, ctx, group=4, **hw):
    return splits.choose_num_splits(batch, kv_heads, group, ctx, 128, 2, **{**H200, **hw})


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


def test_fewer_sms_need_fewer_splits():
    assert choose(1, 8, 32768, sm_count=40) < choose(1, 8, 32768, sm_count=132)


def test_decode_splits_reads_only_host_values():
    """The engine-facing helper: the context bound is the block table's width, the SM count the device's."""
    q = torch.empty(2, 32, 128, dtype=torch.float16)
    k_cache = torch.empty(1, 16, 8, 128, dtype=torch.float16)
    tables = torch.empty(2, 256, dtype=torch.int32)  # 4096 tokens
    dev = sim_device((9, 0), sm_count=132)
    cfg = TABLES["sm_90"].decode_config(128)
    want = splits.choose_num_splits(2, 8, 4, 4096, 128, 2, 132, cfg.ctas_per_sm, cfg.block_n, 4000.0)
    assert decode_splits(q, k_cache, tables, dev) == want > 1

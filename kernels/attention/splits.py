"""How many KV splits a decode step uses: a wave model of the GPU, in plain Python.

Decode reads every K/V byte of the batch once and does almost no arithmetic, so
its time is the time to stream those bytes. One CTA handles one (sequence, KV
head, split); with few sequences and heads, there are too few CTAs to keep the
memory system busy, and splitting the context multiplies them. Splits cost a
reduce kernel, a fixed prologue per CTA and fp32 partial outputs.

The model (all inputs are host-known, so it runs under CUDA graph capture):

    ctas     = batch * kv_heads * splits
    slots    = sm_count * ctas_per_sm              # CTAs per wave (the config's fitted ctas_per_sm)
    per-CTA rate r = bandwidth / (SAT_CTAS_PER_SM * sm_count)
                                                   # one CTA alone cannot saturate HBM
    a wave of `a` CTAs, each streaming b bytes, takes  T0 + b / min(r, bandwidth / a)
    time(splits) = sum over waves (full waves of `slots`, then the remainder)
                 + (splits > 1) * (T_REDUCE + partial bytes / bandwidth)

and the choice is the split count of the least modelled time (the smallest on a tie). Compared with a fixed
"fill the SMs once" rule (lmdeploy's GetSplitCount, SGLang's num_kv_splits)
this accounts for the last partial wave, for CTAs that do not saturate memory on
their own, and for the reduce's cost, and it never splits below BLOCK_N tokens
(below DEEP_MIN_TOKENS on the sm_90 Gluon kernel: `plan.decode_splits`).

Context length: the engine passes `max_context` as the longest KV length of the
batch it knows on the host (the scheduler has it). Under CUDA graph capture the
graph is captured with one split count for a range of lengths; the engine passes
the upper end of its length bucket (llm/engine/cuda_graphs.context_buckets: doubling
from 512 to max_model_len) and the kernel divides each sequence's own length (read on
the device) among that many splits, so a too-large count costs time (empty and
short CTAs, and their merge), never correctness.

One-wave rule (`deep_splits`): where the whole grid fits one wave of a one-wave config (the arch's `decode_deep`
Triton config or its `decode_ws*` Gluon configs: more K/V tiles loaded ahead per CTA, so fewer CTAs per SM;
plan.decode_plan says which takes which grid, with TWO_CTA_COUNTS, SHORT_SPLIT_KEYS and LONG_TWO_CTA_COUNTS), that
is units = batch * kv_heads <= slots = sm_count * ctas_per_sm, the split count is the largest power of two
<= slots // units (every split's tiles whole, the reduce's tile tight), provided each split still reads
DEEP_MIN_TOKENS keys. Other grids take the wave model's count for their config, except that grids of at least
UNSPLIT_WAVES waves of sequences of at most UNSPLIT_MAX_KEYS keys run unsplit (`unsplit`: the model's lockstep
waves overcharge their last partial wave).

Every constant below was chosen by the benchmarks docs/PERF.md#decode-splits names, which has the measurements.
"""

from __future__ import annotations

import functools
import math

MAX_SPLITS = 64  # upper bound of any split count; sizes the partial buffers [batch, q_heads, splits, head_dim] fp32
# Wave-model parameters fitted on the H200 sweep of benchmarks/attention.py: decode streams at full bandwidth only
# with ~3 CTAs per SM in flight; the fixed costs are small next to it (docs/PERF.md#decode-splits).
SAT_CTAS_PER_SM = 3  # CTAs per SM needed to saturate HBM with 3-stage decode pipelines
T0_US = 1.0  # per-wave prologue/epilogue latency (block-table, q and seq_len loads; partial write)
T_REDUCE_US = 2.0  # the reduce kernel's launch and dependent read of the partials
TIE = 1.0  # prefer fewer splits only on an exact tie of the modelled time
# Keys a split must read for a one-wave config to pay (two 64-key tiles at head_dim 128), and the shortest split the
# wave model gives the Gluon kernel, where 64-key splits ran slower than the model has them.
# Chosen by benchmarks/decode_short_context.py; see docs/PERF.md#decode-splits.
DEEP_MIN_TOKENS = 128
# One-wave counts of the one-CTA Gluon config (decode_ws) at which the two-CTA one (decode_ws_waves, twice the splits)
# runs the grid instead. Chosen on benchmarks/attention.py's shapes; see docs/PERF.md#decode-splits.
TWO_CTA_COUNTS = (2, 4, 8)
# Keys per split at most which a one-wave grid of the one-CTA Gluon config runs the table's decode_ws_short (a
# shallower ring) instead. See docs/PERF.md#gluon-sm_90-decode (decode_ws_short).
SHORT_SPLIT_KEYS = 2048
# One-wave counts of the one-CTA Gluon config at which splits of more than SHORT_SPLIT_KEYS keys give way to the
# table's decode_ws_long at twice the count. See docs/PERF.md#gluon-sm_90-decode (decode_ws_long).
LONG_TWO_CTA_COUNTS = (16,)
# KV heads per CTA the plan tries, largest first, on a config with pack_max_keys (pack_heads below), and the share of
# one wave the packed grid must fill. Chosen by benchmarks/decode_packing.py; see docs/PERF.md#decode-splits.
PACK_COUNTS = (4, 2)
PACK_MIN_WAVE = 0.9
# Keys of the context bound each split must read for the plan to keep a config's tile stealing (decode_ws.py): the
# CTAs of one wave stream at unequal rates, and stealing evens their ends for a counter round trip per unit, which
# shorter splits do not repay. The engine plans with its context bucket's upper end, at most twice the length it
# runs. Chosen by benchmarks/decode_stealing.py; see docs/PERF.md#decode-splits.
STEAL_MIN_KEYS = 8192
# Full waves of (sequence, KV head) units from which a grid whose sequences read at most UNSPLIT_MAX_KEYS keys runs
# unsplit, whatever the model says of its last partial wave (the GPU starts each CTA as an earlier one ends; longer
# CTAs end further apart, so splitting can pay there). Chosen by benchmarks/decode_many_waves.py; see
# docs/PERF.md#decode-splits.
UNSPLIT_WAVES = 2
UNSPLIT_MAX_KEYS = 8192


def modelled_time_us(
    splits: int, batch: int, kv_heads: int, group: int, max_context: int, head_dim: int, elem_size: int,
    sm_count: int, ctas_per_sm: int, block_n: int, bandwidth_gbs: float,
) -> float:  # fmt: skip
    """Modelled decode time (microseconds) for one split count; see the module docstring."""
    bw = bandwidth_gbs * 1e3  # bytes per microsecond
    ctas = batch * kv_heads * splits
    slots = max(1, sm_count * ctas_per_sm)
    rate_cta = bw / (SAT_CTAS_PER_SM * sm_count)
    tokens = math.ceil(math.ceil(max_context / splits) / block_n) * block_n
    bytes_cta = tokens * 2 * head_dim * elem_size  # K and V rows of one KV head
    full, rest = divmod(ctas, slots)  # full waves of `slots` CTAs, then one partial wave
    time = full * (T0_US + bytes_cta / min(rate_cta, bw / slots))
    if rest:
        time += T0_US + bytes_cta / min(rate_cta, bw / rest)
    if splits > 1:
        partial_bytes = batch * kv_heads * group * splits * (head_dim + 1) * 4 * 2  # written then read
        time += T_REDUCE_US + partial_bytes / bw
    return time


@functools.lru_cache(maxsize=4096)  # called per layer in eager steps: the answer depends on host ints only
def choose_num_splits(
    batch: int, kv_heads: int, group: int, max_context: int, head_dim: int, elem_size: int,
    sm_count: int, ctas_per_sm: int, block_n: int, bandwidth_gbs: float, max_splits: int = MAX_SPLITS,
    unsplit_rule: bool = True,
) -> int:  # fmt: skip
    """Split count for a decode step (at most max_splits and MAX_SPLITS); 1 when the context is short or (with
    `unsplit_rule`) the batch alone fills the GPU UNSPLIT_WAVES times over with CTAs of at most UNSPLIT_MAX_KEYS
    keys."""
    if batch <= 0 or max_context <= block_n:
        return 1
    if unsplit_rule and unsplit(batch * kv_heads, max_context, sm_count * ctas_per_sm):
        return 1
    limit = max(1, min(max_splits, MAX_SPLITS, math.ceil(max_context / block_n)))
    args = (batch, kv_heads, group, max_context, head_dim, elem_size, sm_count, ctas_per_sm, block_n, bandwidth_gbs)
    times = [modelled_time_us(s, *args) for s in range(1, limit + 1)]
    best = min(times)
    return next(s for s, t in enumerate(times, start=1) if t <= best * TIE)


def unsplit(units: int, max_context: int, slots: int) -> bool:
    """Whether a grid of `units` (sequence, KV head) pairs of at most `max_context` keys runs unsplit by the
    UNSPLIT_WAVES rule, `slots` CTAs making a wave."""
    return units >= UNSPLIT_WAVES * slots and max_context <= UNSPLIT_MAX_KEYS


def deep_splits(units: int, max_context: int, sm_count: int, ctas_per_sm: int, max_splits: int = MAX_SPLITS):
    """Split count for a one-wave config (one wave of sm_count * ctas_per_sm CTAs), or None where the
    rule does not apply: more (sequence, KV head) units than the wave holds, or splits shorter than
    DEEP_MIN_TOKENS keys. See the module docstring."""
    slots = sm_count * ctas_per_sm
    if units < 1 or units > slots:
        return None
    count = 1 << (min(max_splits, slots // units).bit_length() - 1)
    return count if in_one_deep_wave(units, count, max_context, sm_count, ctas_per_sm) else None


def steals(max_context: int, count: int) -> bool:
    """Whether each of `count` splits of `max_context` keys reads at least STEAL_MIN_KEYS of them."""
    return max_context >= count * STEAL_MIN_KEYS


def short_splits(max_context: int, count: int) -> bool:
    """Whether each of `count` splits of `max_context` keys reads at most SHORT_SPLIT_KEYS of them."""
    return max_context <= count * SHORT_SPLIT_KEYS


def in_one_deep_wave(units: int, splits: int, max_context: int, sm_count: int, ctas_per_sm: int) -> bool:
    """Whether a grid of units * splits CTAs suits a one-wave config: one wave, each split >= DEEP_MIN_TOKENS keys."""
    return units * splits <= sm_count * ctas_per_sm and max_context >= splits * DEEP_MIN_TOKENS


def pack_heads(units: int, kv_heads: int, max_context: int, sm_count: int, ctas_per_sm: int, max_keys: int) -> int:
    """KV heads per CTA for an unsplit grid of `units` (sequence, KV head) CTAs (1: none packed): the largest of
    PACK_COUNTS that divides kv_heads and turns a grid of more than one wave into one wave (at least PACK_MIN_WAVE of
    its slots) of CTAs reading at most max_keys keys each (the count times the context bound).

    Each CTA pays a fixed cost (the block-table lookup, the query's load and the first tile's round trip) and a grid
    of several waves a ragged last wave; packing heads makes fewer, longer CTAs reading a token's packed heads as one
    row. That pays on short contexts, not long ones, and only onto a full wave (benchmarks/decode_packing.py;
    docs/PERF.md#decode-splits)."""
    slots = sm_count * ctas_per_sm
    if max_keys <= 0 or units <= slots:
        return 1
    for pack in PACK_COUNTS:
        if kv_heads % pack == 0 and pack * max_context <= max_keys and PACK_MIN_WAVE * slots <= units / pack <= slots:
            return pack
    return 1

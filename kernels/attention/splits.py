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
(below DEEP_MIN_TOKENS on the sm_90 Gluon kernel, where 64-key splits measured
slower than the model has them: `plan.decode_splits`, and DEEP_MIN_TOKENS below).

Context length: the engine passes `max_context` as the longest KV length of the
batch it knows on the host (the scheduler has it). Under CUDA graph capture the
graph is captured with one split count for a range of lengths; the engine passes
the upper end of its length bucket (llm/engine/cuda_graphs.context_buckets: doubling
from 512 to max_model_len) and the kernel divides each sequence's own length (read on
the device) among that many splits, so a too-large count costs time (empty and
short CTAs, and their merge: up to 2.6x at a 32k bound over sequences of 512 keys,
benchmarks/decode_context_plan.py), never correctness.

A second, simpler rule picks a one-wave config (the arch's `decode_ws` Gluon
kernel, `decode_ws_short`, `decode_ws_waves`, `decode_ws_long` or its
`decode_deep` Triton config: more K/V tiles loaded ahead per CTA, so fewer CTAs
per SM; plan.decode_plan says which takes which grid, TWO_CTA_COUNTS,
SHORT_SPLIT_KEYS and LONG_TWO_CTA_COUNTS below the measurements behind it) when
the whole grid fits one wave of it:
with units = batch * kv_heads <= slots = sm_count * ctas_per_sm, the split count
is the largest power of two <= slots // units (a power of two keeps every
split's tiles whole and the reduce's tile tight: 33 splits of 32k keys ran 3%
slower than 32), and the rule applies only if each split still reads
DEEP_MIN_TOKENS keys. Measured on the H200 for the deep config
(2026-11-30, 16 shapes x two configs x splits 1..64): 1-7% faster than the
shallow config's best split where it applies (B=32 L=2k, 8 KV heads: 65.1 vs
69.7 us; B=1 L=4k: 12.5 vs 12.8), while grids of several waves and splits of
one chunk keep the shallow config (64-key splits: 15.0 us deep vs 13.2). Grids
of several waves take the wave model's count for their config (plan.decode_plan),
except that grids of at least UNSPLIT_WAVES waves of sequences of at most
UNSPLIT_MAX_KEYS keys run unsplit (the model's lockstep waves overcharge their last
partial wave; the measurements are beside the constants).
"""

from __future__ import annotations

import functools
import math

MAX_SPLITS = 64  # upper bound of any split count; sizes the partial buffers [batch, q_heads, splits, head_dim] fp32
# Fitted on an H200 sweep (benchmarks/results/attention_NVIDIA_H200.*: 16 shapes x splits 1..64): decode streams at
# full bandwidth only with ~3 CTAs per SM in flight (about 512 CTAs on 132 SMs); the fixed costs are small next to it.
SAT_CTAS_PER_SM = 3  # CTAs per SM needed to saturate HBM with 3-stage decode pipelines
T0_US = 1.0  # per-wave prologue/epilogue latency (block-table, q and seq_len loads; partial write)
T_REDUCE_US = 2.0  # the reduce kernel's launch and dependent read of the partials
TIE = 1.0  # prefer fewer splits only on an exact tie of the modelled time
# Keys a split must read for a one-wave config to pay (two 64-key tiles at head_dim 128), and the shortest split the
# wave model gives the Gluon kernel. The model alone split short contexts into 64-key splits there; at 128 keys or
# more, on the H200 (2026-11-30, benchmarks/results/decode_short_context_NVIDIA_H200.md, its 17:56 UTC run: fp16,
# 20 shapes whose count that halves, heads 32/8, 28/4, 16/2, 32/32 at head_dim 128 and 4/1, 8/4, 16/8 at 256, B=1-8,
# L=256-4k) the decode took 0.80-0.95 of the time (28/4 B=1 L=3k 5.68 against 6.85 us; Gemma 3's 4/1 B=1 L=4k 6.21
# against 7.54), and the count was the best of the sweep on 18 shapes, within 1.4% on the other two (its 21:19 run,
# medians: 0.80-0.96, the best on 18, within 0.5%).
DEEP_MIN_TOKENS = 128
# One-wave counts of the one-CTA Gluon config (decode_ws) at which the two-CTA one (decode_ws_waves, twice the splits)
# runs the grid instead. On the H200 (2026-11-30, swapped-operand consumer, fp16 head_dim 128, GQA 32/8 B=1-16 and
# MHA B=1-4 at L=1k/4k/16k, each config at its own one-wave count): where the one-CTA config splits 2-8 ways the
# two-CTA one took 1.2-8.4% less time on 19 of 20 shapes (32/8 B=3 L=16k 52.6 vs 57.4 us; 3% more at B=6 L=16k); at 16
# ways (B=1 GQA; 32 splits) 4.5% more at L=4k (but see LONG_TWO_CTA_COUNTS for longer splits); unsplit (96-128 units)
# up to 6% more at L=1k-4k, within 0.5% at 16k.
TWO_CTA_COUNTS = (2, 4, 8)
# Keys per split at most which a one-wave grid of the one-CTA Gluon config runs the table's decode_ws_short (a
# shallower ring) instead; configs.py's sm_90 table has the measurements: less time on every grid of splits of 2048
# keys or fewer (0.844-0.999x), mixed at 4096 (unsplit 32/8 B=12 1.039x, 32/32 B=4 0.987x), more at 8192 (1.014x).
SHORT_SPLIT_KEYS = 2048
# One-wave counts of the one-CTA Gluon config at which splits of more than SHORT_SPLIT_KEYS keys give way to the
# table's decode_ws_long at twice the count (configs.py's sm_90 table has the measurements; at 32 it lost).
LONG_TWO_CTA_COUNTS = (16,)
# KV heads per CTA the plan tries, largest first, on a config with pack_max_keys (pack_heads below), and the share of
# one wave the packed grid must fill (256 CTAs of 264 slots: 0.97; packed grids of 384 or 192, 0.73, lost).
PACK_COUNTS = (4, 2)
PACK_MIN_WAVE = 0.9
# Keys of the context bound each split must read for the plan to keep a config's tile stealing (decode_ws.py). The
# CTAs of one wave stream at unequal rates (up to 1.3x apart at MHA B=1 L=128k), so fixed splits end unevenly and the
# grid waits for the slowest; stealing units of 4 tiles evens them, for a counter round trip per unit. On the H200
# (2026-12-01, probe runs, fp16, engine's pages, medians of 5-7 interleaved, two machines) against fixed splits:
# 8192-16384 keys per split gained (MHA B=1 L=128k S=8 1.5-3.4%, L=64k 1.4%), 4096 about broke even (MHA L=32k
# -0.4-+0.4%, GQA B=1 L=128k S=32 +0.9-1.0%, B=4 L=32k +0.4%), 2048 and fewer lost (MHA L=16k 1.4-2.5%, GQA L=64k
# S=32 1.4%, MHA L=4k 8%); benchmarks/results/decode_stealing_NVIDIA_H200.md (2026-12-02) has a run of both sides.
# The engine plans with its context bucket's upper end, at most twice the length it runs.
STEAL_MIN_KEYS = 8192
# Full waves of (sequence, KV head) units from which a grid whose sequences read at most UNSPLIT_MAX_KEYS keys runs
# unsplit, whatever the model says of its last partial wave. The model has waves run in lockstep, so a grid of 16.5
# waves pays a 17th for its half wave and splitting in two looks cheaper; the GPU starts each CTA as an earlier one
# ends, and on the H200 (2026-12-02, probe runs, fp16, head_dim 128, the two-CTA Gluon config, engine's pages,
# medians of 5 interleaved, 19 grids of 1.9-31 waves at L=1k-8k) the unsplit grid was the fastest of 1-4 splits and
# the model's count on all but one (32/32 B=72 L=4k, 8.7 waves: 2 splits 0.6% faster); where the model split 2-8 ways
# its count took 1.1-5.2% more time (32/8 B=200 L=4k 762.6 against 724.9 us, B=100 L=8k 755.6 against 721.4, 32/32
# B=256 L=2k 1859.0 against 1836.4). Longer CTAs end further apart (their streaming rates differ: decode_ws.py's
# tile stealing), so splitting can pay there: at L=32k, 3-4 waves, the model's 9-16 splits took 0.986x (32/8 B=128)
# and 1.016x (B=100) the unsplit time. Under 1.9 waves the model's splits stay ahead at any length (32/32 B=9 L=4k,
# 1.1 waves: 8 splits 137.7 against 159.4 us unsplit; 32/8 B=48 L=32k, 1.45 waves: 11 splits 1437 against 1552).
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
    row. Measured where that pays (configs.py's sm_90 table, benchmarks/decode_packing.py): short contexts
    (1.02-1.10x at 512-2048 keys per CTA), not long ones (0.99-1.01x at 4096-8192), and only onto a full wave."""
    slots = sm_count * ctas_per_sm
    if max_keys <= 0 or units <= slots:
        return 1
    for pack in PACK_COUNTS:
        if kv_heads % pack == 0 and pack * max_context <= max_keys and PACK_MIN_WAVE * slots <= units / pack <= slots:
            return pack
    return 1

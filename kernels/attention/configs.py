"""Per-architecture launch configs for the attention kernels, with the reasons next to them.

One `ArchTable` per compute capability we tune for (sm_70, sm_75, sm_80, sm_86,
sm_89, sm_90). `table_for(device)` picks the table of the device (an unknown
newer arch takes the closest older one; the CPU interpreter takes sm_80's).
`check_dtype` refuses bf16 where the hardware has none, so the engine can fall
back to fp16 with a clear message.

Facts the tables rest on (per SM unless said otherwise):
- sm_70 (V100): 96 KB shared memory, HBM2 ~900 GB/s, no bf16, no cp.async.
  Triton >= 3 has no Volta MMA path, so tl.dot lowers to FMA: small tiles,
  one stage (no asynchronous copies to pipeline).
- sm_75 (T4, RTX 20xx): 64 KB shared memory, fp16 mma.m16n8k8, no bf16, no
  cp.async: one stage, tiles that fit 64 KB.
- sm_80 (A100): 164 KB shared memory, cp.async, bf16 mma; HBM2e ~2 TB/s:
  3-4 stages, 128-row prefill tiles.
- sm_86 / sm_89 (A10/A6000/RTX 30xx, L4/L40/RTX 40xx): 100 KB shared memory
  per SM (99 KB per block): 2-stage prefill with 64-row tiles for head_dim 128;
  3-stage decode (see the table).
- sm_90 (H100/H200): 228 KB shared memory (227 KB per block), wgmma for
  tl.dot with 4-warp groups and M >= 64, TMA, HBM3(e) 3.3-4.8 TB/s: the Triton
  prefill takes (at head_dim 128) 128-row tiles for one warp group, two CTAs per SM, contiguous
  rows through TMA descriptors; at head_dim 64/128/256 in fp16/bf16 the
  warp-specialized Gluon prefill (`prefill_ws`: two 64-row warpgroups, one CTA
  per SM) runs instead. Decode wants many CTAs in flight (see splits.py), or,
  on a grid of one wave, deeper pipelines (`decode_deep`) or the warp-specialized
  Gluon kernel (`decode_ws`, `decode_ws_short` where its splits are short,
  `decode_ws_waves` for larger grids and `decode_ws_long` for one-wave grids of
  long splits);
  `plan.decode_plan` says which config takes which grid.

Decode is memory-bound: its tile is one KV chunk of BLOCK_N tokens for the
packed query heads of one KV head (in Triton the heads are M = 16 rows, the
smallest tl.dot; the Gluon kernel takes the keys as wgmma's M and the heads,
padded to 8, as N). Prefill
is compute-bound: BLOCK_M x BLOCK_N tiles sized to the shared memory.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch

from vlchat.kernels.device import DeviceInfo


class UnsupportedDtypeError(TypeError):
    """The attention kernels cannot run this dtype on this GPU."""


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    block_n: int  # KV tokens per loop iteration
    num_warps: int
    num_stages: int
    # CTAs per SM that the split heuristic counts as one wave (splits.py). A model parameter fitted on the H200
    # sweeps, not the occupancy: the sm_90 config's 39 KB of shared memory would admit five CTAs per SM; counting
    # four keeps the wave model within 4% of the best fixed split on all 32 benchmark shapes. For a deep config
    # (ArchTable.decode_deep) it is the grid it is meant for: at most this many CTAs per SM, one wave.
    ctas_per_sm: int


@dataclass(frozen=True, slots=True)
class PrefillConfig:
    block_m: int  # query rows per program
    block_n: int  # KV tokens per loop iteration
    num_warps: int
    num_stages: int
    tma: bool = False  # contiguous rows (fresh chunk K/V, vision Q/K/V) through TMA tensor descriptors (sm_90+)


@dataclass(frozen=True, slots=True)
class WsPrefillConfig:
    """The warp-specialized Gluon prefill of `prefill_ws.py` (two 64-row consumer warpgroups, one loader warp)."""

    block_n: int  # KV tokens per tile
    num_stages: int  # K/V tiles in the loader's ring
    pingpong: bool = True  # the consumers take turns issuing their matrix products
    # release a stage's K once its QK product completes (else K and V together, after PV): prefill_ws.py says where
    # it pays
    early_k_release: bool = False


@dataclass(frozen=True, slots=True)
class WsDecodeConfig:
    """The warp-specialized Gluon decode of `decode_ws.py` (one loader warp, one wgmma consumer warpgroup); the
    table's `decode_ws`, `decode_ws_short`, `decode_ws_waves` and `decode_ws_long` hold them, `plan.decode_plan`
    picks one and its split count."""

    block_n: int  # KV tokens per tile
    num_stages: int  # K/V tiles in the loader's ring
    # CTAs per SM the plan counts as a wave: what its shared memory and its registers (below) admit
    # (decode_ws_short: shared memory for 2, registers for 1)
    ctas_per_sm: int
    # release a stage's K once its QK product completes (else K and V together, after PV); the table says where
    early_k_release: bool = False
    # with > 0 (and 2+ splits) a sequence whose visible range the first half of the splits would read in at most this
    # many keys each runs on that half, the other half empty: a split count chosen on the device, per sequence, from
    # two the grid holds (decode_ws_long)
    half_splits_keys: int = 0
    # registers per thread (decode_ws.launch_options): at 128 a CTA of another call (the next one, launched early)
    # can share the SM; above 128 it cannot (decode_ws_short says where that measured faster)
    registers: int = 128
    # KV heads one CTA reads (decode_ws's PACK: a tile of BLOCK_N // pack_heads tokens x pack_heads heads); the table
    # keeps 1, plan.decode_plan sets more where splits.pack_heads says so
    pack_heads: int = 1
    # with > 0, the plan may pack KV heads on this config where each CTA then reads at most this many keys
    # (pack_heads x the context bound; splits.pack_heads)
    pack_max_keys: int = 0
    # with > 0, on split grids the splits of a (sequence, KV head) take units of this many tiles from a counter
    # instead of a fixed range each (decode_ws.py's tile stealing); the table sets it where measured, the plan keeps
    # it where each split reads at least splits.STEAL_MIN_KEYS keys of the context bound
    steal_tiles: int = 0


@dataclass(frozen=True, slots=True)
class ArchTable:
    arch: str
    supports_bf16: bool
    bandwidth_gbs: float  # typical HBM bandwidth of the family, for the split heuristic's wave model
    smem_kb: int  # shared memory one block may use
    # keyed by the padded head dim bucket: 64 (<= 64), 128 (<= 128), 256 (<= 256); tuned for 2-byte dtypes
    decode: dict[int, DecodeConfig] = field(default_factory=dict)
    prefill: dict[int, PrefillConfig] = field(default_factory=dict)
    # deeper decode pipelines for grids of one wave (splits.deep_splits picks when); only where measured
    decode_deep: dict[int, DecodeConfig] = field(default_factory=dict)
    # the warp-specialized prefill (sm_90 only), keyed by the exact head_dim it runs; with a sliding window
    prefill_ws: dict[int, WsPrefillConfig] = field(default_factory=dict)
    prefill_ws_window: dict[int, WsPrefillConfig] = field(default_factory=dict)
    # the warp-specialized decode (sm_90 only), keyed by the exact head_dim it runs: for grids of one wave of it,
    # and (decode_ws_waves) for larger grids (plan.decode_plan decides); only where measured
    decode_ws: dict[int, WsDecodeConfig] = field(default_factory=dict)
    decode_ws_waves: dict[int, WsDecodeConfig] = field(default_factory=dict)
    # the one-wave grids of decode_ws whose splits read at most splits.SHORT_SPLIT_KEYS keys take this config instead
    decode_ws_short: dict[int, WsDecodeConfig] = field(default_factory=dict)
    # the one-wave grids decode_ws would split splits.LONG_TWO_CTA_COUNTS ways into longer splits take this config,
    # at twice the count (plan.long_splits_config)
    decode_ws_long: dict[int, WsDecodeConfig] = field(default_factory=dict)
    # programmatic dependent launch (griddepcontrol, sm_90+): the decode kernels start while their predecessor
    # runs and wait for it only before the loads that depend on it
    pdl: bool = False

    def decode_config(self, head_dim: int, dtype: torch.dtype = torch.float16) -> DecodeConfig:
        return _fit(self.decode[_bucket(head_dim)], head_dim, dtype.itemsize, self.smem_kb)

    def decode_deep_config(self, head_dim: int, dtype: torch.dtype = torch.float16) -> DecodeConfig | None:
        """The deep-pipeline decode config, or None: where none was measured, and for fp32 (twice the bytes per
        tile: the two CTAs per SM the config is meant for no longer fit)."""
        return self.decode_deep.get(_bucket(head_dim)) if dtype.itemsize == 2 else None

    def decode_ws_config(
        self, head_dim: int, dtype: torch.dtype = torch.float16, grid: str = "one_wave"
    ) -> WsDecodeConfig | None:
        """The warp-specialized decode's config for `grid`: "one_wave" (grids of one wave of it, `decode_ws`),
        "waves" (larger grids, `decode_ws_waves`), "short" / "long" (the one-wave grids of short / long splits,
        `decode_ws_short` / `decode_ws_long`); or None (not this arch, head_dim or dtype: fp32 has no kernel)."""
        configs = {"one_wave": self.decode_ws, "waves": self.decode_ws_waves, "short": self.decode_ws_short,
                   "long": self.decode_ws_long}  # fmt: skip
        if grid not in configs:
            raise ValueError(f"grid must be one of {', '.join(configs)}, got {grid!r}")
        return configs[grid].get(head_dim) if dtype in (torch.float16, torch.bfloat16) else None

    def prefill_config(self, head_dim: int, dtype: torch.dtype = torch.float16) -> PrefillConfig:
        return _fit(self.prefill[_bucket(head_dim)], head_dim, dtype.itemsize, self.smem_kb)

    def prefill_ws_config(
        self, head_dim: int, dtype: torch.dtype = torch.float16, window: bool = False
    ) -> WsPrefillConfig | None:
        """The warp-specialized prefill's config, or None (not this arch, head_dim or dtype: fp32 has no kernel)."""
        if dtype not in (torch.float16, torch.bfloat16):
            return None
        return (self.prefill_ws_window if window else self.prefill_ws).get(head_dim)


def prefill_smem_bytes(c: PrefillConfig, head_dim: int, itemsize: int) -> int:
    """Shared memory Triton allocates for the prefill kernel: the Q tile plus num_stages K and V tiles (and
    barriers); matched the 295,936 bytes Triton 3.6 reported for 128x128 tiles, 4 stages, head_dim 128, fp16."""
    d = _pow2(head_dim)
    return (c.block_m * d + c.num_stages * 2 * c.block_n * d) * itemsize + 1024


def decode_smem_bytes(c: DecodeConfig, head_dim: int, itemsize: int) -> int:
    """Shared memory Triton allocates for the decode kernel: the 16-row query and probability tiles plus the
    K/V tiles (and their page indices) it loads ahead. The block-table load takes its own pipeline stage ahead of
    the K/V loads, so num_stages s buffers max(1, (s - 1) // 2) tiles: compiled for sm_90 with Triton 3.6 and 3.8,
    64 keys at head_dim 128 in fp16 took 39,168 bytes at 3-4 stages, 72,192 at 5-6 and 105,216 at 8."""
    d = _pow2(head_dim)
    buffers = max(1, (c.num_stages - 1) // 2)
    return (16 * d + 16 * c.block_n) * itemsize + buffers * (2 * c.block_n * d * itemsize + 4 * c.block_n)


@functools.cache  # called on every kernel launch (per layer in eager steps); the answer depends on its args only
def _fit(config, head_dim: int, itemsize: int, smem_kb: int):
    """The tuned config made to fit (fp32 doubles every tile): down to two stages, then fewer keys per tile,
    then one stage, then (prefill) fewer query rows. Decode's stage steps free memory only above 4 stages
    (decode_smem_bytes: 1-4 stages buffer one tile)."""
    prefill = isinstance(config, PrefillConfig)
    smem_bytes = prefill_smem_bytes if prefill else decode_smem_bytes

    def over(c) -> bool:
        return smem_bytes(c, head_dim, itemsize) > smem_kb * 1024

    while over(config) and config.num_stages > 2:
        config = replace(config, num_stages=config.num_stages - 1)
    while over(config) and config.block_n > 16:
        config = replace(config, block_n=config.block_n // 2)
    while over(config) and config.num_stages > 1:
        config = replace(config, num_stages=config.num_stages - 1)
    while prefill and over(config) and config.block_m > 16:
        config = replace(config, block_m=config.block_m // 2)
    return config


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _bucket(head_dim: int) -> int:
    if head_dim > 256:
        raise ValueError(f"head_dim {head_dim} is above the 256 the attention kernels support")
    return 64 if head_dim <= 64 else 128 if head_dim <= 128 else 256


D, P, W, WD = DecodeConfig, PrefillConfig, WsPrefillConfig, WsDecodeConfig

TABLES: dict[str, ArchTable] = {
    # FMA dot, 96 KB smem, no async copy: one stage; prefill 64x32 keeps the FMA register tile small.
    "sm_70": ArchTable(
        "sm_70", False, 900.0, 96,
        decode={64: D(32, 4, 1, 4), 128: D(32, 4, 1, 4), 256: D(16, 4, 1, 2)},
        prefill={64: P(64, 32, 4, 1), 128: P(64, 32, 4, 1), 256: P(32, 16, 4, 1)},
    ),
    # mma.m16n8k8 fp16 but only 64 KB smem and no cp.async: one stage, K+V tiles <= 32 KB.
    "sm_75": ArchTable(
        "sm_75", False, 320.0, 64,
        decode={64: D(64, 4, 1, 4), 128: D(32, 4, 1, 4), 256: D(16, 4, 1, 2)},
        prefill={64: P(64, 64, 4, 1), 128: P(64, 32, 4, 1), 256: P(32, 16, 4, 1)},
    ),
    # 164 KB smem and cp.async: deep pipelines; 128x64 prefill tiles at head_dim <= 128.
    "sm_80": ArchTable(
        "sm_80", True, 2000.0, 163,
        decode={64: D(64, 4, 3, 4), 128: D(64, 4, 3, 3), 256: D(32, 4, 3, 2)},
        prefill={64: P(128, 64, 4, 3), 128: P(128, 64, 8, 3), 256: P(64, 32, 4, 2)},
    ),
    # 100 KB smem: two-stage prefill, 64-row tiles at head_dim 128. Decode takes three stages: with two, Triton
    # loads the block table synchronously in every iteration; three make that load asynchronous as well for the
    # same 39 KB (decode_smem_bytes). On the H200, as a proxy: 3 stages within -1%..+2% of 2 on five shapes.
    "sm_86": ArchTable(
        "sm_86", True, 900.0, 99,
        decode={64: D(64, 4, 3, 4), 128: D(64, 4, 3, 2), 256: D(32, 4, 3, 2)},
        prefill={64: P(128, 64, 4, 2), 128: P(64, 64, 4, 2), 256: P(64, 32, 4, 1)},
    ),
    # Same smem as sm_86 (Ada); more L2 (48-96 MB) but the same tile limits.
    "sm_89": ArchTable(
        "sm_89", True, 800.0, 99,
        decode={64: D(64, 4, 3, 4), 128: D(64, 4, 3, 2), 256: D(32, 4, 3, 2)},
        prefill={64: P(128, 64, 4, 2), 128: P(64, 64, 4, 2), 256: P(64, 32, 4, 1)},
    ),
    # 227 KB smem per block, wgmma. Prefill at head_dim 128: 128x64 tiles for one warp group (4 warps), 2 stages,
    # 96 KB, so two CTAs share an SM and one's softmax overlaps the other's matrix products (what FA3 schedules by
    # hand); on the H200 (2026-11-30, 9 candidates x 6 shapes) it beat 128x128/8 warps/3 stages by 4-13% at 4k-16k
    # and came within 2% at 64k. Decode: 64 keys, 4 stages (one K/V tile loaded ahead, 39 KB) suits grids of many
    # CTAs (8 candidates x 4 shapes in benchmarks/attention.py --tune: best or within 1%). A grid of at most two
    # CTAs per SM streams better with two tiles ahead (6 stages, 72 KB): on the H200 (2026-11-30, 16 shapes x
    # splits) it was 1-7% faster wherever each CTA still reads >= 128 keys, slower on grids of many CTAs. Decode at
    # head_dim 64 takes 128-key tiles, the same 16 KB per K/V tile: on the H200 (2026-11-30, 7 candidates x 8
    # shapes, B=8-128, L=512-8k, fp16) 3-20% less time than 64-key tiles at each one's own split count, best or
    # within 1% of the best candidate on 7 of 8; the 8th (32 sequences x 8 KV heads, L=2k: one wave of two CTAs
    # per SM) ran 36.4 instead of 39.7 us on 6 stages, its deep config.
    "sm_90": ArchTable(
        "sm_90", True, 4000.0, 227,
        decode={64: D(128, 4, 4, 4), 128: D(64, 4, 4, 4), 256: D(32, 4, 3, 2)},
        prefill={64: P(128, 64, 4, 3, True), 128: P(128, 64, 4, 2, True), 256: P(64, 64, 8, 2, True)},
        decode_deep={64: D(128, 4, 6, 2), 128: D(64, 4, 6, 2)},
        # warp-specialized prefill (prefill_ws.py): 128-key tiles in a 3-stage ring (225 KB at head_dim 128; 2
        # stages were 6-22% slower on the H200). With a sliding window, head_dim 128 takes 64-key tiles: the
        # window's bookkeeping made the 128-key consumers spill (compiled for sm_90, Triton 3.6). At head_dim 256
        # (Gemma 3) 64-key tiles in a 2-stage ring (Q 64 KB + 2 x 64 KB), the only multi-stage ring that fits: on
        # the H200 (2026-11-30, benchmarks/attention_head_dim.py: bf16, heads 8/4 and 16/8, B=1-4, L=4k-16k)
        # 1.66-1.96x the Triton kernel's TFLOP/s, causal and with a 1024-token window (436-521 against 239-268
        # causal), 0.77-1.07x SDPA; with or without pingpong within 1%. Releasing each K tile after its QK product
        # (early_k_release) took 1.20-1.38x the TFLOP/s of the kernel before it causal, 1.10-1.18x with a window
        # (same-run A/Bs, prefill_ws.py); the 19:02 run: 539-643 TFLOP/s causal, 0.94-1.43x SDPA.
        prefill_ws={64: W(128, 3), 128: W(128, 3), 256: W(64, 2, early_k_release=True)},
        prefill_ws_window={64: W(128, 3), 128: W(64, 4), 256: W(64, 2, early_k_release=True)},
        # warp-specialized decode (decode_ws.py) for grids of at most one CTA per SM (4 stages at head_dim 64/128; 256
        # below; plan.decode_plan says which config takes which grid). On the H200
        # (2026-11-30; one-wave shapes x tiles x stages x splits for 1-2 CTAs per SM): at head_dim 128, 64-key tiles
        # (131 KB) never slower than the deep Triton plan, 3-19% less time on the latency-bound shapes (B=1 and B=8
        # at L=4k); at head_dim 64, 128-key tiles (131 KB) 6-14% less time than the Triton kernel's plan on all 14
        # one-wave shapes tried (B=1-16, L=2k-32k, GQA and MHA, fp16 and bf16).
        # At head_dim 256 (Gemma 3) a 2-stage ring of 64-key tiles (K/V 128 KB, one CTA per SM) serves every grid:
        # on the H200 (2026-11-30, benchmarks/attention_head_dim.py: fp16/bf16, heads 4/1, 8/4, 16/8, B=1-64,
        # L=2k-32k) it took 0.44-0.82 of the Triton kernel plan's time (16/8 B=64 L=2k 243 vs 335 us; 8/4 B=1 L=4k
        # 9.2 vs 13.4), and 0-3% less than a 3-stage ring (K/V 192 KB) everywhere but 4/1 B=1 L=32k (15.2 vs 14.4
        # us). Two stages also leave room for a query box of 64 columns (three stages for 32: decode_ws.smem_bytes).
        decode_ws={64: WD(128, 4, 1), 128: WD(64, 4, 1), 256: WD(64, 2, 1)},
        # at head_dim 128 the same kernel with a 2-stage ring (67-88 KB, and registers for two CTAs per SM) for the
        # grids beyond one wave of decode_ws (measured once the loader looked a group of tiles' pages up at once). On
        # the H200 (2026-11-30, the 16 fp16 decode shapes, best split each): 0.3-2.1% less time than the Triton plan
        # on 8 of the 9 grids of more than 132 (sequence, KV head) units (32/32 B=32 L=2k 237.9 vs 241.8 us, 32/8
        # B=32 L=2k 64.1 vs 65.4), 0.8% more at 32/8 B=128 L=512. Since the swapped-operand consumer it also ran
        # most one-wave grids decode_ws would split 2-8 ways faster (splits.TWO_CTA_COUNTS says by how much; on the
        # other one-wave grids the one-CTA config stays ahead). At head_dim 64 (H200, 2026-11-30,
        # fp16, 7 grids beyond one wave: heads 14/2, 32/8, 32/4, B=32-256, L=512-4k) the kernel at two CTAs per SM
        # (128-key tiles, 2 stages; 3 stages and 64-key tiles no better) ran from 3.4% less time than the Triton
        # plan (14/2 B=128 L=2k 34.4 vs 35.6 us) to 4.2% more (32/8 B=128 L=512 39.4 vs 37.8): the Triton
        # configs stay there. At head_dim 128 each K tile is released after its QK product (early_k_release), so
        # the loader refills K while V is still in use: on the H200 (2026-11-30, fp16, the plan's split counts,
        # best of 7 interleaved, two runs on two machines) 0.986-1.011x the time of the release after PV on the 9
        # and 12 grids this config took, less time on 19 of the 21 (32/32 B=128 L=2k 927.0 vs 937.4 and 945.9
        # vs 955.0 us, 32/8 B=1 L=1k 4.54 vs 4.60; 1.1% more at 32/8 B=8 L=4k in one run, 0.3% less in the
        # other). On decode_ws's 4-stage ring (4 grids) it measured 0.985-1.022x, so decode_ws keeps the release
        # after PV (as does head_dim 256, not measured). At head_dim 128 the plan packs 2 or 4 KV heads per CTA
        # (decode_ws's PACK) where that turns an unsplit grid of several waves into one wave of CTAs reading at most
        # 2048 keys each (splits.pack_heads). On the H200 (2026-12-01 00:14 UTC, benchmarks/decode_packing.py: fp16,
        # heads 32/8, 64/8, 16/8, 28/4, 32/32, B=32-256, L=256-2k, medians of 7 interleaved, shuffled 16-token
        # pages) the unpacked time over the packed on the 20 grids the plan packs: 1.055-1.095x at L=256, 1.019-1.038x
        # at 512, 1.016-1.024x at 1k (32/8 B=128 L=512 1.031x, B=64 L=1k 1.024x); one wave of longer CTAs
        # 0.994-1.009x at 4096 keys per CTA, 0.987-1.003x at 8192; packed grids short of a wave 0.94-0.99x at L >= 512.
        # Its split grids steal tiles in units of 4 (steal_tiles; the plan keeps it where splits.STEAL_MIN_KEYS says).
        # Three CTAs per SM (80 registers, which the consumer takes without spilling; 69 KB of shared memory each)
        # did not help: on the H200 (2026-12-02, probe, the plan's split counts, medians of 7 interleaved, 13 grids of
        # 1-31 waves, MHA and GQA, B=1-256) they took 0.999-1.036x the time of two on the engine's pages (32/32
        # B=128 L=2k 922.9 against 921.2 us, 32/8 B=8 L=4k 35.5 against 34.3), 0.999-1.032x on shuffled ones.
        decode_ws_waves={128: WD(64, 2, 2, early_k_release=True, pack_max_keys=2048, steal_tiles=4),
                         256: WD(64, 2, 1)},
        # at head_dim 128 the one-wave grids of decode_ws whose splits read at most splits.SHORT_SPLIT_KEYS keys run a
        # 2-stage ring with the early K release at one CTA per SM (decode_ws_waves's kernel): decode_ws's 4-stage
        # ring asks for a whole short split at once, and with every CTA doing so the first tiles come late. On the
        # H200 (2026-11-30, fp16, the plan's counts, best of 5 interleaved), against decode_ws: 32/8 B=1 at L=2k
        # 5.31 against 6.29 us, L=4k 7.36 against 8.31 (1.61x SDPA's 11.83), L=8k-32k 0.967-0.992x; 28/4 B=1 L=8k
        # (32 splits) 0.967x, 16/2 B=1 L=8k (64) 0.979x; unsplit 32/8 B=16 L=2k 0.999x. Longer splits stay on
        # decode_ws: B=1 L=128k (8k keys per split) 1.014x, unsplit 32/8 B=12 L=4k 1.039x, 32/32 B=4 L=4k 0.987x.
        # A 3-stage ring with the early release: 0.862-1.044x. In the attention grid's sweep the same kernel at 16
        # splits took 7.95 / 7.98 us at B=1 L=4k against decode_ws's 8.44 / 8.49 (fp16 / bf16; SDPA 12.08 / 12.07).
        # It runs at 168 registers per thread, so that no other CTA fits beside one (at 128 the next call's CTAs,
        # launched early, share its SMs): on the H200 (2026-11-30 20:2x UTC, medians of 20 interleaved
        # measurements, the plan's counts) 168 against 128 registers took at 32/8 B=1 L=4k 7.75 against 8.01 us
        # fp16 (1.53x SDPA's 11.86) and 7.89 against 8.12 bf16, L=2k 6.25 against 6.33, 8k 12.05 against 12.27, 16k
        # 20.28 against 20.45, 32k 35.02 against 35.50; unsplit B=16 L=2k 33.81 against 33.91; 28/4 B=1 L=8k
        # (32 splits) 8.05 against 8.12. The outputs are bit-identical.
        decode_ws_short={128: WD(64, 2, 1, early_k_release=True, registers=168)},
        # at head_dim 128 the one-wave grids decode_ws would split 16 ways (5-8 (sequence, KV head) units: B=1 with
        # 5-8 KV heads, B=2 with 3-4) into splits of
        # more than splits.SHORT_SPLIT_KEYS keys (a long context bound: the engine plans with max_model_len) run the
        # two-CTA config at 32 splits, where a sequence that 16 splits read in at most 256 keys each (L <= 4k) uses
        # 16 of them (half_splits_keys). On the H200 (2026-11-30, fp16, best of 5 interleaved, two probes), against
        # decode_ws at 16 splits: 32/8 B=1, 128k bound, L=128k 126.7 / 126.3 against 127.9 / 127.5 us, L=32k 36.2 /
        # 36.0 against 37.0 / 36.7, L=16k 21.0 against 21.2, L=4k (halved) 8.28 against 8.49, L=2k 6.15 against
        # 6.26; 64k bound, L=64k 66.3 / 66.0 against 67.6 / 67.0, L=4k 8.23 against 8.52; 16/4 B=2, L=128k 126.9 /
        # 126.8 against 128.6 / 127.9, L=8k 12.7 against 12.7-12.8. Halving where 16 splits read up to 2048 keys
        # lost at L=16k and 32k (21.8 and 38.2 us; the 16-split grid of the same kernel took 20.7 and 36.4: the
        # halved grid, half its CTAs empty, ran 1-5% slower than it, the more the longer the splits). At 32 one-CTA
        # splits (28/4 B=1) the two-CTA config at 64 took more time (67.9 against 67.7 us at L=128k, 7.53 against
        # 6.68 at 4k): not there.
        # It steals tiles as decode_ws_waves does, where its splits are long enough (then without the halving).
        decode_ws_long={128: WD(64, 2, 2, early_k_release=True, half_splits_keys=256, steal_tiles=4)},
        # programmatic dependent launch: a KV write + decode step at B=1 L=4k (32/8 heads) took 10.5 instead of
        # 12.7 us on the H200 (2026-11-30), decode alone 9.8 instead of 10.8; grids of many waves within 1%
        pdl=True,
    ),
}  # fmt: skip

_ORDER = sorted(TABLES, key=lambda a: int(a[3:]))


def table_for(device: DeviceInfo) -> ArchTable:
    """The table of `device`'s arch; a newer unknown arch takes the closest older table; CPU takes sm_80."""
    if device.capability is None:
        return TABLES["sm_80"]
    cap = device.capability[0] * 10 + device.capability[1]
    best = _ORDER[0]
    for arch in _ORDER:
        if int(arch[3:]) <= cap:
            best = arch
    return TABLES[best]


def check_dtype(table: ArchTable, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and not table.supports_bf16:
        raise UnsupportedDtypeError(
            f"bfloat16 attention needs compute capability >= 8.0 ({table.arch} has no bf16); run the model in float16"
        )
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise UnsupportedDtypeError(f"attention kernels take float16, bfloat16 or float32, got {dtype}")

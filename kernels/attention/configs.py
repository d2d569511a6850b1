"""Per-architecture launch configs for the attention kernels, with the reasons next to them.

The sm_90 configs were chosen by the benchmarks docs/PERF.md names (#decode-configs-per-arch, #gluon-sm_90-decode,
#prefill), which has the measurements behind each.

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
    # CTAs per SM that the split heuristic counts as one wave (splits.py): a wave-model parameter fitted by
    # benchmarks/attention.py, not the occupancy (docs/PERF.md#decode-splits). For a deep config
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
    # can share the SM; above 128 it cannot (decode_ws_short takes more: docs/PERF.md#gluon-sm_90-decode)
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
    # the decode config over an int8 cache, keyed by the exact head_dim it was measured at (benchmarks/
    # kv_cache_dtype.py --sweep), in place of the quantized_tiles of `decode`; only where measured
    decode_int8: dict[int, DecodeConfig] = field(default_factory=dict)
    # the warp-specialized prefill (sm_90 only), keyed by the exact head_dim it runs; with a sliding window
    prefill_ws: dict[int, WsPrefillConfig] = field(default_factory=dict)
    prefill_ws_window: dict[int, WsPrefillConfig] = field(default_factory=dict)
    # non-causal varlen attention (the vision towers: images of a few hundred to a few thousand tokens), keyed by the
    # exact head_dim it was measured at: the Triton kernel with this config, faster there than the table's others
    vision_prefill: dict[int, PrefillConfig] = field(default_factory=dict)
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
    # e4m3 -> float16 conversion instructions (sm_89+): the decode kernel converts fp8 caches with them instead of
    # integer operations (decode._codes)
    native_fp8: bool = False

    def decode_config(
        self, head_dim: int, dtype: torch.dtype = torch.float16, cache_format: str = "auto"
    ) -> DecodeConfig:
        """The decode config for queries of `dtype` over a cache of `cache_format` (kv_quant.cache_format): a
        quantized one (one byte an element or less) with twice the keys per tile (quantized_tiles), int8
        decode_int8's where measured."""
        config = self.decode[_bucket(head_dim)]
        quantized = cache_format != "auto"
        if quantized:
            config = (self.decode_int8.get(head_dim) if cache_format == "int8" else None) or quantized_tiles(config)
        return _fit(config, head_dim, dtype.itemsize, self.smem_kb, 1 if quantized else dtype.itemsize)

    def decode_deep_config(
        self, head_dim: int, dtype: torch.dtype = torch.float16, cache_format: str = "auto"
    ) -> DecodeConfig | None:
        """The deep-pipeline decode config, or None: where none was measured, and for fp32 (twice the bytes per
        tile: the two CTAs per SM the config is meant for no longer fit). Over a quantized cache with twice the
        keys per tile, as decode_config."""
        config = self.decode_deep.get(_bucket(head_dim)) if dtype.itemsize == 2 else None
        return quantized_tiles(config) if cache_format != "auto" and config is not None else config

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

    def vision_prefill_config(self, head_dim: int, dtype: torch.dtype = torch.float16) -> PrefillConfig | None:
        """The Triton config for non-causal varlen attention, or None (the prefill's kernels decide)."""
        config = self.vision_prefill.get(head_dim)
        return None if config is None else _fit(config, head_dim, dtype.itemsize, self.smem_kb)

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


def decode_smem_bytes(c: DecodeConfig, head_dim: int, itemsize: int, cache_itemsize: int | None = None) -> int:
    """Shared memory Triton allocates for the decode kernel: the 16-row query and probability tiles plus the
    K/V tiles (and their page indices) it loads ahead. The block-table load takes its own pipeline stage ahead of
    the K/V loads, so num_stages s buffers max(1, (s - 1) // 2) tiles: compiled for sm_90 with Triton 3.6 and 3.8,
    64 keys at head_dim 128 in fp16 took 39,168 bytes at 3-4 stages, 72,192 at 5-6 and 105,216 at 8. A quantized
    cache (`cache_itemsize` 1) buffers its tiles at one byte an element and the int formats' (scale, zero) pairs
    beside them (Triton 3.8: 128 keys of int8 at 6 stages, 78,848 bytes)."""
    d = _pow2(head_dim)
    buffers = max(1, (c.num_stages - 1) // 2)
    cache_itemsize = cache_itemsize or itemsize
    pairs = 16 * c.block_n if cache_itemsize == 1 else 0
    return (16 * d + 16 * c.block_n) * itemsize + buffers * (2 * c.block_n * d * cache_itemsize + 4 * c.block_n + pairs)


def quantized_tiles(config: DecodeConfig) -> DecodeConfig:
    """`config` for a quantized cache: twice the keys per tile, the bytes of a 2-byte tile. The kernel converts
    every element in registers, and the per-tile work that does not grow with the keys (the softmax's running max,
    the loop, the block-table load) then comes once per twice the bytes: compiled for sm_90, an int8 tile of 128
    keys took 0.73 of the instructions per key of a 64-key tile (docs/PERF.md#quantized-kv-decode)."""
    return replace(config, block_n=2 * config.block_n)


@functools.cache  # called on every kernel launch (per layer in eager steps); the answer depends on its args only
def _fit(config, head_dim: int, itemsize: int, smem_kb: int, cache_itemsize: int | None = None):
    """The tuned config made to fit (fp32 doubles every tile): down to two stages, then fewer keys per tile,
    then one stage, then (prefill) fewer query rows. Decode's stage steps free memory only above 4 stages
    (decode_smem_bytes: 1-4 stages buffer one tile)."""
    prefill = isinstance(config, PrefillConfig)

    def over(c) -> bool:
        if prefill:
            return prefill_smem_bytes(c, head_dim, itemsize) > smem_kb * 1024
        return decode_smem_bytes(c, head_dim, itemsize, cache_itemsize) > smem_kb * 1024

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
    # same 39 KB (decode_smem_bytes; docs/PERF.md#decode-configs-per-arch).
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
        native_fp8=True,
    ),
    # 227 KB smem per block, wgmma. Prefill at head_dim 128: 128x64 tiles for one warp group (4 warps), 2 stages,
    # 96 KB, so two CTAs share an SM and one's softmax overlaps the other's matrix products (what FA3 schedules by
    # hand). Decode: 64 keys, 4 stages (one K/V tile loaded ahead, 39 KB) suits grids of many CTAs; a grid of at
    # most two CTAs per SM streams better with two tiles ahead (decode_deep: 6 stages, 72 KB) wherever each CTA
    # still reads >= 128 keys. Decode at head_dim 64 takes 128-key tiles, the same 16 KB per K/V tile.
    # Chosen by benchmarks/attention.py --tune; see docs/PERF.md#decode-configs-per-arch and #prefill.
    "sm_90": ArchTable(
        "sm_90", True, 4000.0, 227,
        decode={64: D(128, 4, 4, 4), 128: D(64, 4, 4, 4), 256: D(32, 4, 3, 2)},
        prefill={64: P(128, 64, 4, 3, True), 128: P(128, 64, 4, 2, True), 256: P(64, 64, 8, 2, True)},
        decode_deep={64: D(128, 4, 6, 2), 128: D(64, 4, 6, 2)},
        # over int8 caches on grids of several waves: 64-key tiles 6 deep, 1.07x the doubled tiles at 128-256 x 512
        # keys (benchmarks/kv_cache_dtype.py --sweep; docs/PERF.md#quantized-kv-decode)
        decode_int8={128: D(64, 4, 6, 4)},
        # warp-specialized prefill (prefill_ws.py): 128-key tiles in a 3-stage ring (225 KB at head_dim 128). With a
        # sliding window, head_dim 128 takes 64-key tiles: the window's bookkeeping made the 128-key consumers spill
        # (compiled for sm_90, Triton 3.6). At head_dim 256 (Gemma 3) 64-key tiles in a 2-stage ring (Q 64 KB + 2 x
        # 64 KB), the only multi-stage ring that fits, releasing each K tile after its QK product (early_k_release).
        # Chosen by benchmarks/attention.py and attention_head_dim.py; see docs/PERF.md#prefill.
        prefill_ws={64: W(128, 3), 128: W(128, 3), 256: W(64, 2, early_k_release=True)},
        prefill_ws_window={64: W(128, 3), 128: W(64, 4), 256: W(64, 2, early_k_release=True)},
        # the vision towers' non-causal attention: the Triton kernel, ahead of the Gluon prefill at head_dim 64 (CLIP,
        # 577-token images) and of the prefill's config at Qwen2-VL's head_dim 80 (split heads), tiles picked at 32 /
        # 8 images by benchmarks/vision_tune.py (docs/PERF.md#vision-towers); other heads keep the prefill's kernels
        vision_prefill={64: P(64, 64, 4, 3, True), 80: P(128, 64, 4, 3, False)},
        # warp-specialized decode (decode_ws.py) for grids of at most one CTA per SM (4 stages at head_dim 64/128; 256
        # below; plan.decode_plan says which config takes which grid): 64-key tiles at head_dim 128, 128-key tiles at
        # 64 (131 KB each). At head_dim 256 (Gemma 3) a 2-stage ring of 64-key tiles (K/V 128 KB, one CTA per SM)
        # serves every grid; two stages also leave room for a query box of 64 columns (three stages for 32:
        # decode_ws.smem_bytes). Chosen by benchmarks/attention.py and attention_head_dim.py; see
        # docs/PERF.md#gluon-sm_90-decode.
        decode_ws={64: WD(128, 4, 1), 128: WD(64, 4, 1), 256: WD(64, 2, 1)},
        # at head_dim 128 the same kernel with a 2-stage ring (67-88 KB, and registers for two CTAs per SM) for the
        # grids beyond one wave of decode_ws, and for the one-wave grids decode_ws would split splits.TWO_CTA_COUNTS
        # ways; at head_dim 64 the Triton configs stay there. At head_dim 128 each K tile is released after its QK
        # product (early_k_release), so the loader refills K while V is still in use (decode_ws keeps the release
        # after PV, as does head_dim 256); the plan packs 2 or 4 KV heads per CTA (decode_ws's PACK) where that turns
        # an unsplit grid of several waves into one wave of CTAs reading at most 2048 keys each (splits.pack_heads);
        # its split grids steal tiles in units of 4 (steal_tiles; the plan keeps it where splits.STEAL_MIN_KEYS
        # says). Three CTAs per SM (80 registers) did not help. Chosen by benchmarks/attention.py, decode_packing.py
        # and decode_stealing.py; see docs/PERF.md#gluon-sm_90-decode.
        decode_ws_waves={128: WD(64, 2, 2, early_k_release=True, pack_max_keys=2048, steal_tiles=4),
                         256: WD(64, 2, 1)},
        # at head_dim 128 the one-wave grids of decode_ws whose splits read at most splits.SHORT_SPLIT_KEYS keys run a
        # 2-stage ring with the early K release at one CTA per SM (decode_ws_waves's kernel): decode_ws's 4-stage
        # ring asks for a whole short split at once, and with every CTA doing so the first tiles come late. It runs
        # at 168 registers per thread, so that no other CTA fits beside one (at 128 the next call's CTAs, launched
        # early, share its SMs; the outputs are bit-identical either way). Chosen by benchmarks/attention.py probes; see
        # docs/PERF.md#gluon-sm_90-decode.
        decode_ws_short={128: WD(64, 2, 1, early_k_release=True, registers=168)},
        # at head_dim 128 the one-wave grids decode_ws would split 16 ways (5-8 (sequence, KV head) units: B=1 with
        # 5-8 KV heads, B=2 with 3-4) into splits of more than splits.SHORT_SPLIT_KEYS keys (a long context bound: the
        # engine plans with max_model_len) run the two-CTA config at 32 splits, where a sequence that 16 splits read
        # in at most 256 keys each (L <= 4k) uses 16 of them (half_splits_keys). Not at 32 one-CTA splits
        # (splits.LONG_TWO_CTA_COUNTS). It steals tiles as decode_ws_waves does, where its splits are long enough
        # (then without the halving). Chosen by benchmarks/attention.py probes; see docs/PERF.md#gluon-sm_90-decode.
        decode_ws_long={128: WD(64, 2, 2, early_k_release=True, half_splits_keys=256, steal_tiles=4)},
        # programmatic dependent launch: a decode starts while the KV write before it runs
        # (docs/PERF.md#decode-configs-per-arch)
        pdl=True,
        native_fp8=True,
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

"""The decode plan: which kernel config a paged decode call runs and with how many KV splits.

Everything here reads host-known values only (shapes, the block table's width as the context bound, the arch
table, the SM count), so the engine plans once per batch bucket and the plan holds under CUDA graph capture.
`splits.py` holds the wave model and the one-wave rules the plan applies; `decode.py` runs the plan.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from vlchat.kernels.attention import decode_ws, kv_quant
from vlchat.kernels.attention import splits as split_model
from vlchat.kernels.attention.configs import DecodeConfig, WsDecodeConfig, table_for


def decode_plan(
    q, k_cache, block_tables, device, num_splits: int | None = None, gluon: bool = True
) -> tuple[int, DecodeConfig | WsDecodeConfig]:
    """(split count, config) for a decode call from host-known values (the context bound is the block table's
    width). Where the whole grid fits one wave of a one-wave config (splits.deep_splits), that config: the first of
    one_wave_configs' order, except that the one-CTA Gluon config gives way to the two-CTA one at the counts of
    splits.TWO_CTA_COUNTS where the two-CTA config fits the grid in one wave too, its splits reading
    DEEP_MIN_TOKENS keys, and to its short-split config at the same count where its splits read at most
    SHORT_SPLIT_KEYS keys (short_splits_config); at splits.LONG_TWO_CTA_COUNTS with longer splits it gives way to the
    arch's decode_ws_long at the two-CTA config's count (long_splits_config). Else the arch's config for grids of
    several waves (many_wave_config) with the wave model's split count (decode_splits); unsplit, with 2 or 4 KV heads
    per CTA where that makes one wave of short CTAs (packed_config).

    On sm_90 in fp16/bf16 (where Gluon is there) that makes, at head_dim 128: the Gluon kernel at one CTA per SM on
    one-wave grids it runs unsplit, splits 32+ ways, or 16 ways into splits of at most SHORT_SPLIT_KEYS keys (or 2-8
    ways where twice the splits would read under DEEP_MIN_TOKENS keys), on its 2-stage short-split ring where the
    splits read at most SHORT_SPLIT_KEYS keys; at two CTAs per SM on the other one-wave grids it would split 2-8 ways
    (with twice the splits), on those it would split 16 ways into longer splits (with 32, each sequence that 16
    read in at most the config's half_splits_keys keys each using 16 of them: decode_ws_long) and on larger
    grids.
    At head_dim 64 the one-CTA Gluon config on one-wave grids, the Triton configs beyond; at head_dim 256 one Gluon
    config on every grid. A given `num_splits` is kept, with a one-wave config only where it is that config's own
    count (the engine passes the config it planned with too: `config=`). gluon=False plans the Triton configs only
    (for a call the Gluon kernel cannot run); so does a quantized cache (kv_quant.py), on configs with twice the keys
    per tile (configs.quantized_tiles)."""
    table = table_for(device)
    batch, q_heads, head_dim = q.shape
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    units, max_context = batch * kv_heads, block_tables.shape[1] * page
    # quantized caches run the Triton kernel (decode_ws.supports refuses them)
    fmt = kv_quant.cache_format(k_cache, head_dim)
    ws = gluon and fmt == "auto" and decode_ws.available(device, q_heads // kv_heads, page)
    plans = [
        (c, split_model.deep_splits(units, max_context, _sm_count(device), c.ctas_per_sm))
        for c in one_wave_configs(table, head_dim, q.dtype, ws, fmt)
    ]
    # only the one-CTA Gluon config can be followed by a Gluon config at more CTAs per SM (the two-CTA one, head_dim
    # 128): where that one fits the grid in one wave too, the one-CTA config gives way to it at TWO_CTA_COUNTS
    if len(plans) > 1 and isinstance(plans[1][0], WsDecodeConfig) and plans[1][1] is not None:
        if plans[1][0].ctas_per_sm > plans[0][0].ctas_per_sm:
            long = long_splits_config(table, head_dim, q.dtype, max_context, plans[0][1])
            if long is not None:  # the two-CTA config's count, on the config that halves it for short sequences
                plans[:2] = [(long, plans[1][1])]
            elif plans[0][1] in split_model.TWO_CTA_COUNTS:
                del plans[0]
    for one_wave, count in plans:
        if count is not None and num_splits in (None, count):
            config = short_splits_config(table, one_wave, head_dim, q.dtype, max_context, count)
            return count, stealing_config(config, count, max_context, units)
    config = many_wave_config(table, head_dim, q.dtype, ws, fmt)
    if num_splits is None:
        num_splits = decode_splits(q, k_cache, block_tables, device, config)
    config = packed_config(config, q_heads // kv_heads, kv_heads, page, units, max_context, num_splits, device)
    return num_splits, stealing_config(config, num_splits, max_context, units)


def bound_plan(
    batch: int, q_heads: int, kv_heads: int, head_dim: int, dtype, page: int, max_context: int, device,
    cache_dtype=None, cache_width: int | None = None,
) -> tuple[int, DecodeConfig | WsDecodeConfig]:  # fmt: skip
    """decode_plan for a batch given by its shapes and a context bound, with no tensors (the engine plans its
    batch and context buckets before any step runs them): the query and cache (of `cache_dtype`, default the
    query's) on the meta device, the block table as wide as `max_context` keys need."""
    q = torch.empty(batch, q_heads, head_dim, dtype=dtype, device="meta")
    k_cache = torch.empty(1, page, kv_heads, cache_width or head_dim, dtype=cache_dtype or dtype, device="meta")
    tables = torch.empty(batch, -(-max_context // page), dtype=torch.int32, device="meta")
    return decode_plan(q, k_cache, tables, device)


def packed_config(config, group: int, kv_heads: int, page: int, units: int, max_context: int, num_splits: int,
                  device):  # fmt: skip
    """`config` with the KV heads per CTA splits.pack_heads gives an unsplit grid of several waves, where the config
    has pack_max_keys and the Gluon kernel can take that many (decode_ws.packs); else `config`."""
    if not isinstance(config, WsDecodeConfig) or not config.pack_max_keys or num_splits != 1:
        return config
    pack = split_model.pack_heads(
        units, kv_heads, max_context, _sm_count(device), config.ctas_per_sm, config.pack_max_keys
    )
    if pack == 1 or not decode_ws.packs(config, group, kv_heads, page, pack):
        return config
    return replace(config, pack_heads=pack)


def stealing_config(config, num_splits: int, max_context: int, units: int):
    """`config` keeping its steal_tiles (decode_ws.py's tile stealing) where its splits read at least
    splits.STEAL_MIN_KEYS keys of the context bound each, on a grid of one KV head per CTA and at most
    decode_ws.STEAL_MAX_UNITS (sequence, KV head) pairs; then without halving (half_splits_keys: the stealing
    splits share out a short sequence's units themselves). On other split grids `config` without stealing; unsplit
    ones steal nothing, and keep `config` as it is."""
    if not isinstance(config, WsDecodeConfig) or not config.steal_tiles or num_splits == 1:
        return config
    if (
        decode_ws.steals(config, num_splits)
        and split_model.steals(max_context, num_splits)
        and units <= decode_ws.STEAL_MAX_UNITS
    ):
        return replace(config, half_splits_keys=0)
    return replace(config, steal_tiles=0)


def short_splits_config(table, config, head_dim: int, dtype, max_context: int, count: int):
    """The arch's decode_ws_short in place of the one-CTA Gluon config (decode_ws) where each of the `count` splits
    reads at most SHORT_SPLIT_KEYS keys; `config` otherwise."""
    short = table.decode_ws_config(head_dim, dtype, grid="short")
    one_cta = table.decode_ws_config(head_dim, dtype)
    if short is None or config != one_cta or not split_model.short_splits(max_context, count):
        return config
    return short


def long_splits_config(table, head_dim: int, dtype, max_context: int, count: int) -> WsDecodeConfig | None:
    """The arch's decode_ws_long where the one-CTA Gluon config would split a one-wave grid `count` ways (one of
    splits.LONG_TWO_CTA_COUNTS) into splits of more than SHORT_SPLIT_KEYS keys; else None."""
    if count not in split_model.LONG_TWO_CTA_COUNTS or split_model.short_splits(max_context, count):
        return None
    return table.decode_ws_config(head_dim, dtype, grid="long")


def one_wave_configs(table, head_dim: int, dtype, ws: bool, cache_format: str = "auto") -> list:
    """The arch's configs for grids of one wave, in the order decode_plan tries them: with `ws` (decode_ws is
    available for the model's query group and page size) the warp-specialized Gluon kernel's at one CTA per SM,
    then its config for larger grids (decode_ws_waves: at head_dim 128 two CTAs per SM; at 256 the same config,
    listed once); then the deep Triton config (over a quantized `cache_format` its variant: configs.quantized_tiles).
    decode_plan says which takes which grid."""
    gluon = [table.decode_ws_config(head_dim, dtype, grid) for grid in ("one_wave", "waves")] if ws else []
    configs = gluon + [table.decode_deep_config(head_dim, dtype, cache_format)]
    return list(dict.fromkeys(c for c in configs if c is not None))


def many_wave_config(
    table, head_dim: int, dtype, ws: bool, cache_format: str = "auto"
) -> DecodeConfig | WsDecodeConfig:
    """The arch's config for grids of several waves: with `ws` (as one_wave_configs) the warp-specialized Gluon
    kernel's decode_ws_waves where there is one, else the Triton config (ArchTable.decode_config's for
    `cache_format`)."""
    waves = table.decode_ws_config(head_dim, dtype, grid="waves") if ws else None
    return waves or table.decode_config(head_dim, dtype, cache_format)


def decode_splits(
    q, k_cache, block_tables, device, config: DecodeConfig | WsDecodeConfig, max_splits: int | None = None,
    unsplit_rule: bool = True,
) -> int:  # fmt: skip
    """The wave model's split count for a decode call on `config` (splits.choose_num_splits, with its unsplit rule
    unless told not to), at most `max_splits`: by default, on the Gluon kernel, as many as still read
    DEEP_MIN_TOKENS keys each (splits.py says why); the wave model itself stops at splits of one tile."""
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    max_context = block_tables.shape[1] * k_cache.shape[1]
    if max_splits is None:
        gluon = isinstance(config, WsDecodeConfig)
        max_splits = max_context // split_model.DEEP_MIN_TOKENS if gluon else split_model.MAX_SPLITS
    return split_model.choose_num_splits(
        batch, kv_heads, q_heads // kv_heads, max_context, head_dim, k_cache.element_size(),
        _sm_count(device), config.ctas_per_sm, config.block_n, table_for(device).bandwidth_gbs, max_splits,
        unsplit_rule,
    )  # fmt: skip


def triton_config(device, q, k_cache, block_tables, num_splits: int) -> DecodeConfig:
    """The Triton config for a call planned onto the Gluon kernel that cannot run it (decode_ws.supports): what
    decode_plan pairs with `num_splits` among the Triton configs (the deep one where the count is its own)."""
    return decode_plan(q, k_cache, block_tables, device, num_splits, gluon=False)[1]


def _sm_count(device) -> int:
    return device.sm_count if device.is_cuda else 132  # the CPU interpreter plans with an H200's SM count

"""The decode plan: which kernel config a paged decode call runs and with how many KV splits.

Everything here reads host-known values only (shapes, the block table's width as the context bound, the arch
table, the SM count), so the engine plans once per batch bucket and the plan holds under CUDA graph capture.
`splits.py` holds the wave model and the one-wave rules the plan applies; `decode.py` runs the plan.
"""

from __future__ import annotations

from kernels.attention import decode_ws
from kernels.attention import splits as split_model
from kernels.attention.configs import DecodeConfig, WsDecodeConfig, table_for
from kernels.attention.splits import TWO_CTA_COUNTS


def decode_plan(
    q, k_cache, block_tables, device, num_splits: int | None = None, gluon: bool = True
) -> tuple[int, DecodeConfig | WsDecodeConfig]:
    """(split count, config) for a decode call from host-known values (the context bound is the block table's
    width). Where the whole grid fits one wave of a one-wave config (splits.deep_splits), that config (the first of
    one_wave_configs' order, except that the one-CTA Gluon config gives way to the two-CTA one at the counts of
    splits.TWO_CTA_COUNTS); else the arch's config for grids of several waves (many_wave_config) with the wave
    model's split count. A given `num_splits` is kept, with a one-wave config only where it is that config's own
    count (the engine passes the config it planned with too: `config=`). gluon=False plans the Triton configs only
    (for a call the Gluon kernel cannot run)."""
    table = table_for(device)
    batch, q_heads, head_dim = q.shape
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    units, max_context = batch * kv_heads, block_tables.shape[1] * page
    ws = gluon and decode_ws.available(device, q_heads // kv_heads, page)
    plans = [
        (c, split_model.deep_splits(units, max_context, _sm_count(device), c.ctas_per_sm))
        for c in one_wave_configs(table, head_dim, q.dtype, ws)
    ]
    for (one_wave, count), (following, following_count) in zip(plans, plans[1:] + [(None, None)], strict=False):
        # only the one-CTA Gluon config is followed by a Gluon config (the two-CTA one); it gives way to it
        gives_way = isinstance(following, WsDecodeConfig) and following_count is not None
        if count is not None and num_splits in (None, count) and not (gives_way and count in TWO_CTA_COUNTS):
            return count, one_wave
    config = many_wave_config(table, head_dim, q.dtype, ws)
    if num_splits is None:
        num_splits = decode_splits(q, k_cache, block_tables, device, config)
    return num_splits, config


def one_wave_configs(table, head_dim: int, dtype, ws: bool) -> list:
    """The arch's configs for grids of one wave, in the order decode_plan tries them: with `ws` (decode_ws is
    available for the model's query group and page size) the warp-specialized Gluon kernel's at one CTA per SM,
    then at two (decode_ws_waves; it also takes the grids the one-CTA config would split 2-8 ways); then the deep
    Triton config."""
    gets = [table.decode_ws_config, table.decode_ws_waves_config] if ws else []
    configs = [get(head_dim, dtype) for get in gets] + [table.decode_deep_config(head_dim, dtype)]
    return [c for c in configs if c is not None]


def many_wave_config(table, head_dim: int, dtype, ws: bool) -> DecodeConfig | WsDecodeConfig:
    """The arch's config for grids of several waves: with `ws` (as one_wave_configs) the warp-specialized Gluon
    kernel's decode_ws_waves where there is one, else the Triton config."""
    return (table.decode_ws_waves_config(head_dim, dtype) if ws else None) or table.decode_config(head_dim, dtype)


def decode_splits(q, k_cache, block_tables, device, config: DecodeConfig | WsDecodeConfig) -> int:
    """The wave model's split count for a decode call on `config` (splits.choose_num_splits)."""
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    max_context = block_tables.shape[1] * k_cache.shape[1]
    return split_model.choose_num_splits(
        batch, kv_heads, q_heads // kv_heads, max_context, head_dim, q.element_size(),
        _sm_count(device), config.ctas_per_sm, config.block_n, table_for(device).bandwidth_gbs,
    )  # fmt: skip


def triton_config(device, q, k_cache, block_tables, num_splits: int) -> DecodeConfig:
    """The Triton config for a call planned onto the Gluon kernel that cannot run it (decode_ws.supports): what
    decode_plan pairs with `num_splits` among the Triton configs (the deep one where the count is its own)."""
    return decode_plan(q, k_cache, block_tables, device, num_splits, gluon=False)[1]


def _sm_count(device) -> int:
    return device.sm_count if device.is_cuda else 132  # the CPU interpreter plans with an H200's SM count

"""Attention kernels on a GPU: paged decode (the heuristic's plan vs swept split counts) and prefill, against SDPA.

    PYTHONPATH=. python benchmarks/attention.py [--out DIR] [--quick] [--tune] [--prefill-only | --decode-only]
                                                [--decode-shapes 1x4096,8x4096]

Decode grid: fp16/bf16, heads 32/32 and 32/8, head_dim 128, paged KV (block 16, shuffled blocks, and the plan again
on the pages the engine's block manager hands out after earlier traffic: benchmarks/engine_pages.py); the heuristic's
config and split count against fixed split counts for each of the arch's decode configs (the Triton config, the
deep one-wave config and, on sm_90, the warp-specialized Gluon kernel's one- and two-CTA configs, `gluon
blk/stages`, plus the plan's own where it is another: the short- or long-split config), timed as CUDA-graph replays
of at least 16 calls over enough KV copies to defeat the L2 (>= 256 MB per replay); the plan, the best fixed choice
and SDPA on contiguous KV again as the median of ROUNDS interleaved measurements; and the device-to-device copy
bandwidth measured in the same run; the
plan is also timed without programmatic dependent launch (sm_90), and a decode step (the KV write, then decode)
with and without it. Prefill: causal, heads 32/8, head_dim 128, TFLOP/s against SDPA (K/V expanded to 32 heads) for
fresh sequences, on the engine's path (the chunk's own K/V rows; the dispatch's kernel and the Triton kernel) and
with every key from the pages; plus chunks after a cached prefix. The decode grid took ~1 minute on an H200
(2026-11-30, four configs x 7 split counts per row, compiled kernels cached).
Writes attention_<device>.json and .md under --out and prints the tables.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics

import torch
import torch.nn.functional as F
import triton

from benchmarks.attention_report import config_name, markdown, targets
from benchmarks.engine_pages import PAGE, engine_pages
from benchmarks.gpu_timing import copy_bandwidth_gbs, graph_time_us, interleaved_us
from benchmarks.report import device_header, result_stem, save_results
from vlchat.kernels.attention import decode, decode_ws, kv_write, pdl, plan, prefill
from vlchat.kernels.attention import splits as split_model
from vlchat.kernels.attention.configs import DecodeConfig, PrefillConfig, table_for
from vlchat.kernels.device import get_device_info

DECODE_SHAPES = [(1, 4096), (1, 32768), (1, 131072), (8, 4096), (32, 2048), (64, 1024), (128, 512), (128, 2048)]
PREFILL_SHAPES = [(1, 4096), (4, 4096), (1, 16384), (4, 16384), (1, 65536), (4, 65536)]
EXTEND_SHAPES = [(1, 16384, 12288), (4, 8192, 4096)]  # (batch, kv length, cached prefix): a chunk after a prefix
STEP_SHAPES = [(1, 4096), (8, 4096), (64, 1024), (128, 2048)]  # (batch, context) of the KV write + decode step
SWEEP = [1, 2, 4, 8, 16, 32, 64]
L2_DEFEAT = 256 << 20
ROUNDS = 3  # interleaved measurements of a decode row's plan, best fixed choice and SDPA (bench_decode)
HEAD_DIM = 128  # of the decode grid and the prefill rows (attention_head_dim.py runs others)


def gluon_decode_device(group: int):
    """This machine's DeviceInfo, or SystemExit where the sm_90 Gluon decode kernel cannot take query groups of
    `group` on pages of PAGE (the benchmarks that measure that kernel alone)."""
    device = get_device_info()
    if not decode_ws.available(device, group, PAGE):
        raise SystemExit("needs the sm_90 Gluon decode kernel (an sm_90 GPU and a Triton with Gluon)")
    return device


def decode_inputs(dtype, q_heads, kv_heads, batch, ctx, head_dim=HEAD_DIM, page=PAGE):
    kv_bytes = 2 * batch * kv_heads * ctx * head_dim * dtype.itemsize
    sets = max(1, min(16, math.ceil(L2_DEFEAT / kv_bytes)))
    num_blocks = sets * batch * (ctx // page)
    k_cache = torch.randn(num_blocks, page, kv_heads, head_dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(sets, batch, ctx // page)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, q_heads, head_dim, device="cuda", dtype=dtype)
    return q, k_cache, v_cache, perm, seq_lens, kv_bytes


def decode_calls(q, k_cache, v_cache, perm, seq_lens, splits, out, config):
    """One decode call per block-table set (each set reads its own KV blocks), with one cache memo, as an attention
    layer keeps for its cache (descriptors, tile-stealing counters)."""
    scale = q.shape[-1] ** -0.5
    memo = {}
    return [
        lambda t=t: decode.paged_decode_attention(
            q, k_cache, v_cache, t, seq_lens, scale, None, splits, out, config=config, cache_memo=memo
        )
        for t in perm
    ]


def tune_decode(device):
    """Pick the sm_90 Triton decode config (block_n, warps, stages) by the sum of times normalised per shape; the
    run then forces it on every row (no deep or Gluon one-wave config)."""
    shapes = [(32, 8, 1, 32768, 64), (32, 32, 128, 2048, 1), (32, 8, 32, 2048, 2), (32, 32, 1, 4096, 16)]
    grid = [(64, 4, 3), (64, 4, 4), (64, 4, 6), (64, 4, 8), (128, 4, 3), (128, 8, 3), (32, 4, 4), (32, 4, 8)]
    cands = [DecodeConfig(n, w, st, 4) for n, w, st in grid]
    times = {c: [] for c in cands}
    for q_heads, kv_heads, batch, ctx, splits in shapes:
        q, k_cache, v_cache, perm, seq_lens, _ = decode_inputs(torch.float16, q_heads, kv_heads, batch, ctx)
        out = torch.empty_like(q)
        for c in cands:
            times[c].append(graph_time_us(decode_calls(q, k_cache, v_cache, perm, seq_lens, splits, out, c)))
        best = min(times[c][-1] for c in cands)
        for c in cands:
            times[c][-1] /= best
        torch.cuda.empty_cache()
    ranked = sorted(cands, key=lambda c: sum(times[c]))
    print("decode configs (normalised time per shape):", [(str(c), [round(x, 3) for x in times[c]]) for c in ranked])
    return ranked[0], {str(c): times[c] for c in cands}


def prefill_inputs(dtype, batch, length, prefix=0, q_heads=32, kv_heads=8, head_dim=HEAD_DIM):
    """Paged caches holding `length` tokens per sequence (shuffled pages), queries for the last length - prefix,
    and those queries' own K/V rows gathered back from the pages (what the engine hands the kernel)."""
    blocks = batch * length // PAGE
    k_cache = torch.randn(blocks, PAGE, kv_heads, head_dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(blocks, device="cuda").to(torch.int32).view(batch, length // PAGE)
    q_len = length - prefix
    q = torch.randn(batch * q_len, q_heads, head_dim, device="cuda", dtype=dtype)
    cu = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * q_len
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    k_all = k_cache[tables.long()].reshape(batch, length, kv_heads, head_dim)
    v_all = v_cache[tables.long()].reshape(batch, length, kv_heads, head_dim)
    k_rows = k_all[:, prefix:].reshape(-1, kv_heads, head_dim).contiguous()
    v_rows = v_all[:, prefix:].reshape(-1, kv_heads, head_dim).contiguous()
    return q, k_cache, v_cache, tables, cu, lens, k_rows, v_rows, k_all, v_all


def tune_prefill(device):
    """Pick the sm_90 Triton prefill config on the engine's path (fresh rows through TMA) at L=16k, fp16 (one shape:
    confirm a new pick at 4k and 64k too, as the 2026-11-30 choice of 128x64/4 warps/2 stages was). The run then
    forces it on every row, so the warp-specialized Gluon prefill does not run."""
    cands = [PrefillConfig(*c, tma=True) for c in
             [(128, 64, 4, 2), (128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 4), (128, 64, 8, 3), (128, 64, 8, 4),
              (128, 64, 4, 3), (128, 128, 4, 3), (64, 128, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4)]]  # fmt: skip
    length = 16384
    q, k_cache, v_cache, tables, cu, lens, k_rows, v_rows, _, _ = prefill_inputs(torch.float16, 1, length)
    times = {}
    ref = prefill.paged_prefill_attention(q, k_cache, v_cache, tables, cu, lens, 0.088, length, config=cands[0])
    for c in cands:

        def run(c=c):
            return prefill.paged_prefill_attention(
                q, k_cache, v_cache, tables, cu, lens, 0.088, length, k=k_rows, v=v_rows, config=c
            )

        try:
            diff = float((run().float() - ref.float()).abs().max())
            if not diff < 1e-2:
                print("prefill config", c, "disagrees with the pages-only run by", diff)
                continue
            times[c] = triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")
        except Exception as e:  # a config that does not fit the shared memory
            print("prefill config", c, "failed:", type(e).__name__, str(e)[:200])
    ranked = sorted(times, key=times.get)
    print("prefill configs (ms):", [(str(c), round(times[c], 3)) for c in ranked], flush=True)
    return ranked[0], {str(c): times[c] for c in times}


def bench_step(dtype, q_heads, kv_heads, batch, ctx, device):
    """A decode layer's attention as the engine runs it: the step's K/V rows written into the cache, then
    decode over it; with and without programmatic dependent launch (where the arch has it)."""
    q, k_cache, v_cache, perm, seq_lens, _ = decode_inputs(dtype, q_heads, kv_heads, batch, ctx)
    k_new = torch.randn(batch, kv_heads, q.shape[-1], device="cuda", dtype=dtype)
    v_new = torch.randn_like(k_new)
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5

    memo = {}

    def step(table, slots):
        kv_write.write_kv_cache(k_new, v_new, k_cache, v_cache, slots)
        decode.paged_decode_attention(q, k_cache, v_cache, table, seq_lens, scale, None, None, out, cache_memo=memo)

    last_rows = [t[:, -1].long() * PAGE + PAGE - 1 for t in perm]  # each sequence's last row is the step's token
    calls = [lambda t=t, s=s: step(t, s) for t, s in zip(perm, last_rows, strict=True)]
    row = {"dtype": str(dtype).removeprefix("torch."), "q_heads": q_heads, "kv_heads": kv_heads, "batch": batch}
    row["ctx"], row["pdl_us"] = ctx, graph_time_us(calls)
    with pdl.without_dependent_launch(device):
        row["no_pdl_us"] = graph_time_us(calls)
    return row


def bench_decode(dtype, q_heads, kv_heads, batch, ctx, device, config=None):
    """The heuristic's plan (config and splits; or `config` forced) against a sweep of fixed split counts for
    every decode config of the arch (the shallow one and, where there are, the deep one and the Gluon kernel's
    one- and two-CTA ones, plus the plan's config where it is another), and SDPA."""
    q, k_cache, v_cache, perm, seq_lens, kv_bytes = decode_inputs(dtype, q_heads, kv_heads, batch, ctx)
    out = torch.empty_like(q)

    def ours(splits, cfg):
        return decode_calls(q, k_cache, v_cache, perm, seq_lens, splits, out, cfg)

    if config is None:
        heur, chosen = plan.decode_plan(q, k_cache, perm[0], device)
        ws = decode_ws.available(device, q_heads // kv_heads, PAGE)
        table = table_for(device)
        candidates = [table.decode_config(HEAD_DIM, dtype)]
        candidates += reversed(plan.one_wave_configs(table, HEAD_DIM, dtype, ws))
        if chosen not in candidates:  # the short- and long-split configs: the plan's own, at every count too
            candidates.append(chosen)
    else:
        heur, chosen, candidates = plan.decode_splits(q, k_cache, perm[0], device, config), config, [config]
    row = {"batch": batch, "ctx": ctx, "q_heads": q_heads, "kv_heads": kv_heads, "kv_mb": kv_bytes / 2**20}
    row["heuristic_splits"], row["heuristic_config"] = heur, config_name(chosen, heur)
    row["ours_us"] = graph_time_us(ours(heur, chosen))
    with pdl.without_dependent_launch(device):
        row["ours_no_pdl_us"] = graph_time_us(ours(heur, chosen))
    sweep = {}  # (splits, config): us, each config as the plan runs it at that count (stealing_config)
    units, bound = batch * kv_heads, perm.shape[-1] * PAGE
    for c in candidates:
        for s in SWEEP:
            if s <= split_model.MAX_SPLITS and s <= max(1, ctx // 64):
                cs = plan.stealing_config(c, s, bound, units)
                sweep[s, cs] = row["ours_us"] if (s, cs) == (heur, chosen) else graph_time_us(ours(s, cs))
    best = min(sweep, key=sweep.get)
    row["sweep_us"] = {f"{config_name(c, s)} S={s}": us for (s, c), us in sweep.items()}
    row["best_fixed"] = f"{config_name(best[1], best[0])} S={best[0]}"
    # the three times the row compares, each the median of ROUNDS interleaved measurements: a latency-bound row's
    # single measurement moved with the GPU's state between them (B=1 L=4k GQA on one H200, 20 measurements of the
    # short-split config at 128 registers: 7.38 once, 7.93-8.14 otherwise), and the least would take a rare one
    calls = {"ours_us": ours(heur, chosen), "sdpa_us": sdpa_calls(q, kv_heads, ctx, perm.shape[0])}
    # the same plan on the pages the engine's block manager hands out (runs of blocks) instead of shuffled ones
    k_engine, v_engine, tables_engine = engine_pages(dtype, kv_heads, batch, ctx, perm.shape[0])
    calls["ours_engine_pages_us"] = decode_calls(q, k_engine, v_engine, tables_engine, seq_lens, heur, out, chosen)
    if best != (heur, chosen):
        calls["best_fixed_us"] = ours(*best)
    row["single_us"] = {"ours_us": row["ours_us"], "best_fixed_us": sweep[best]}
    times = interleaved_us(calls, ROUNDS)
    row.update({k: statistics.median(v) for k, v in times.items()})
    row.setdefault("best_fixed_us", row["ours_us"])
    row["rounds_us"] = times
    return row


def sdpa_calls(q, kv_heads, ctx, sets):
    """SDPA's peer of a decode call on contiguous K/V [batch, kv_heads, ctx, head_dim]: one call per L2-defeating
    copy (`sets`, as many as decode_inputs made)."""
    batch, q_heads, head_dim = q.shape
    kc = torch.randn(sets, batch, kv_heads, ctx, head_dim, device="cuda", dtype=q.dtype)
    vc = torch.randn_like(kc)
    q4 = q.view(batch, q_heads, 1, head_dim)
    scale, gqa = head_dim**-0.5, q_heads != kv_heads
    return [
        lambda s=s: F.scaled_dot_product_attention(q4, kc[s], vc[s], scale=scale, enable_gqa=gqa) for s in range(sets)
    ]


def time_ms(fn):
    """Median milliseconds of `fn` (triton.testing.do_bench): the prefill rows' timing."""
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def sdpa_prefill(q, k_all, v_all, out, scale):
    """SDPA's peer of a fresh causal prefill: K/V contiguous [batch, heads, L, d], expanded to the query heads.
    Returns (the relative error of `out`, ours on the same queries, against SDPA; a call running SDPA)."""
    batch, length, kv_heads, head_dim = k_all.shape
    q_heads = q.shape[1]
    k = k_all.repeat_interleave(q_heads // kv_heads, 2).transpose(1, 2).contiguous()
    v = v_all.repeat_interleave(q_heads // kv_heads, 2).transpose(1, 2).contiguous()
    q4 = q.view(batch, length, q_heads, head_dim).transpose(1, 2).contiguous()
    ref = F.scaled_dot_product_attention(q4, k, v, is_causal=True, scale=scale).float()
    mine = out.view(batch, length, q_heads, head_dim).transpose(1, 2).float()
    rel_err = float((mine - ref).norm() / ref.norm())
    return rel_err, lambda: F.scaled_dot_product_attention(q4, k, v, is_causal=True, scale=scale)


def bench_prefill(dtype, batch, length, device, config=None, prefix=0):
    """Causal prefill of the last length - prefix tokens: the engine's path (the chunk's keys from its own rows,
    the prefix from pages) on the dispatch's kernel and, where that is the Gluon kernel, on the Triton kernel;
    every key from the pages (Triton); and (fresh sequences) SDPA on contiguous K/V."""
    q_heads, kv_heads, head_dim = 32, 8, HEAD_DIM
    q, k_cache, v_cache, tables, cu, lens, k_rows, v_rows, k_all, v_all = prefill_inputs(
        dtype, batch, length, prefix, q_heads, kv_heads, head_dim
    )
    q_len, scale = length - prefix, head_dim**-0.5
    flops = 4 * batch * q_heads * head_dim * (q_len * prefix + q_len * q_len / 2)  # causal: half the new square
    args = (q, k_cache, v_cache, tables, cu, lens, scale, q_len)
    triton_config = config or table_for(device).prefill_config(head_dim, dtype)

    def ours():  # what the engine runs: the dispatch's choice (the warp-specialized kernel where it applies)
        return prefill.paged_prefill_attention(*args, k=k_rows, v=v_rows, config=config)

    def triton_rows():  # the Triton kernel on the same path
        return prefill.paged_prefill_attention(*args, k=k_rows, v=v_rows, config=triton_config)

    def pages():  # every key through the block table: without the chunk's rows only the Triton kernel applies
        return prefill.paged_prefill_attention(*args, config=config)

    ws = prefill.ws_plan(q, k_rows, v_rows, k_cache, v_cache, True, None, 0.0, device, config)
    row = {"batch": batch, "length": length, "prefix": prefix, "kernel": "gluon-ws" if ws else "triton"}
    row["ours_ms"], row["pages_ms"] = time_ms(ours), time_ms(pages)
    row["triton_ms"] = time_ms(triton_rows) if ws else row["ours_ms"]  # without the Gluon kernel: the same call
    for name in ("ours", "triton", "pages"):
        row[f"{name}_tflops"] = flops / row[f"{name}_ms"] / 1e9
    mine = ours()
    row["rows_vs_pages_max_diff"] = float((mine.float() - pages().float()).abs().max())
    if prefix == 0:
        row["rel_err_vs_sdpa"], sdpa = sdpa_prefill(q, k_all, v_all, mine, scale)
        row["sdpa_ms"] = time_ms(sdpa)
        row["sdpa_tflops"] = flops / row["sdpa_ms"] / 1e9
    return row


def _shapes(text):
    """'1x4096,8x4096' -> [(1, 4096), (8, 4096)]"""
    try:
        return [tuple(int(x) for x in pair.split("x")) for pair in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BATCHxCONTEXT[,BATCHxCONTEXT...], got {text!r}") from None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument(
        "--quick", action="store_true", help="two decode shapes, one decode-step shape and one prefill shape"
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="first pick the Triton decode/prefill configs by a sweep and run the decode and prefill rows with "
        "them (no deep or Gluon decode config, no warp-specialized prefill; the decode-step table keeps the plan)",
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--prefill-only", action="store_true", help="skip the decode grid")
    only.add_argument("--decode-only", action="store_true", help="skip the prefill shapes")
    parser.add_argument(
        "--decode-shapes", type=_shapes, help="decode (batch x context) pairs instead of the grid, e.g. 1x4096,8x4096"
    )
    args = parser.parse_args()
    device = get_device_info()
    table = table_for(device)
    res = {**device_header(device),
           "decode_config": str(table.decode_config(HEAD_DIM)),
           "decode_deep_config": str(table.decode_deep_config(HEAD_DIM)),
           "decode_ws_config": str(table.decode_ws_config(HEAD_DIM)),
           "decode_ws_waves_config": str(table.decode_ws_config(HEAD_DIM, grid="waves")),
           "decode_ws_short_config": str(table.decode_ws_config(HEAD_DIM, grid="short")),
           "decode_ws_long_config": str(table.decode_ws_config(HEAD_DIM, grid="long")),
           "prefill_config": str(table.prefill_config(HEAD_DIM)),
           "prefill_ws_config": str(table.prefill_ws_config(HEAD_DIM)), "rounds": ROUNDS}  # fmt: skip
    res["copy_gbs"] = copy_bandwidth_gbs()
    dec_cfg = pre_cfg = None
    if args.tune and not args.prefill_only:
        dec_cfg, res["tune_decode"] = tune_decode(device)
        res["decode_config"] = str(dec_cfg)
    if args.tune and not args.decode_only:
        pre_cfg, res["tune_prefill"] = tune_prefill(device)
        res["prefill_config"] = str(pre_cfg)
    bw = res["copy_gbs"] * 1e3  # bytes per microsecond
    res["decode"], res["prefill"] = [], []
    shapes = args.decode_shapes or (DECODE_SHAPES[:2] if args.quick else DECODE_SHAPES)
    shapes = [] if args.prefill_only else shapes
    for dtype in (torch.float16, torch.bfloat16):
        for q_heads, kv_heads in ((32, 32), (32, 8)):
            for batch, ctx in shapes:
                r = bench_decode(dtype, q_heads, kv_heads, batch, ctx, device, dec_cfg)
                r["dtype"] = str(dtype).removeprefix("torch.")
                r["bw_frac"] = r["kv_mb"] * 2**20 / r["ours_us"] / bw
                r["sdpa_bw_frac"] = r["kv_mb"] * 2**20 / r["sdpa_us"] / bw
                res["decode"].append(r)
                torch.cuda.empty_cache()
                print(f"decode {r['dtype']} {q_heads}/{kv_heads} B={batch} L={ctx}: ours {r['ours_us']:.1f}us "
                      f"({r['heuristic_config']} S={r['heuristic_splits']}) best {r['best_fixed_us']:.1f} "
                      f"({r['best_fixed']}) sdpa {r['sdpa_us']:.1f}", flush=True)  # fmt: skip
    res["step"] = []
    for batch, ctx in [] if args.prefill_only else STEP_SHAPES[:1] if args.quick else STEP_SHAPES:
        r = bench_step(torch.float16, 32, 8, batch, ctx, device)
        res["step"].append(r)
        torch.cuda.empty_cache()
        print(f"step 32/8 B={batch} L={ctx}: PDL {r['pdl_us']:.1f}us, without {r['no_pdl_us']:.1f}", flush=True)
    shapes = [(b, n, 0) for b, n in PREFILL_SHAPES] + EXTEND_SHAPES
    shapes = [] if args.decode_only else shapes[:1] if args.quick else shapes
    for dtype in (torch.float16, torch.bfloat16):
        for batch, length, prefix in shapes:
            r = bench_prefill(dtype, batch, length, device, pre_cfg, prefix)
            r["dtype"] = str(dtype).removeprefix("torch.")
            res["prefill"].append(r)
            torch.cuda.empty_cache()
            print(
                f"prefill {r['dtype']} B={batch} L={length} prefix={prefix}: ours ({r['kernel']}) "
                f"{r['ours_tflops']:.0f} triton {r['triton_tflops']:.0f} pages {r['pages_tflops']:.0f} "
                f"sdpa {r.get('sdpa_tflops', 0):.0f} TFLOP/s",
                flush=True,
            )
    res["targets"] = targets(res["decode"], res["prefill"])
    save_results(result_stem(args.out, "attention", device.name), res, markdown)


if __name__ == "__main__":
    main()

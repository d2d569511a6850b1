"""The attention benchmark's report, without a GPU: the names of decode configs, the targets each result row is
judged against, and the Markdown tables (benchmarks/attention.py writes them)."""

from __future__ import annotations

from benchmarks.report import versions_line
from vlchat.kernels.attention import decode_ws
from vlchat.kernels.attention.configs import DecodeConfig, WsDecodeConfig
from vlchat.kernels.attention.splits import LONG_TWO_CTA_COUNTS, SHORT_SPLIT_KEYS


def config_name(c: DecodeConfig | WsDecodeConfig, splits: int = 1) -> str:
    """blk/warps/stages of the Triton kernel; gluon blk/stages of the warp-specialized one (with `rN` where it runs at
    N registers per thread, not 128, `half N` where it halves the splits of sequences that half of them read in
    N keys each, `steal N` where its `splits` take units of N tiles from a counter, and `pack N` where a CTA reads N
    KV heads)."""
    if isinstance(c, WsDecodeConfig):
        registers = f" r{c.registers}" if c.registers != 128 else ""
        half = f" half {c.half_splits_keys}" if c.half_splits_keys else ""
        steal = f" steal {c.steal_tiles}" if decode_ws.steals(c, splits) else ""
        return f"gluon {c.block_n}/{c.num_stages}{registers}{half}{steal}" + (
            f" pack {c.pack_heads}" if c.pack_heads > 1 else ""
        )
    return f"{c.block_n}/{c.num_warps}/{c.num_stages}"


def targets(decode_rows, prefill_rows):
    checks = {"decode_never_slower_than_sdpa": [], "decode_never_slower_than_sdpa_on_the_engines_pages": [],
              "decode_1.5x_sdpa_where_sdpa_under_0.65_bw": [],
              "decode_0.95_copy_bw_where_kv_over_256MB": [], "heuristic_within_10pct_of_best_fixed": [],
              "prefill_0.9x_sdpa": []}  # fmt: skip
    for r in decode_rows:
        name = f"{r['dtype']} {r['q_heads']}/{r['kv_heads']} B={r['batch']} L={r['ctx']}"
        checks["decode_never_slower_than_sdpa"].append((name, r["ours_us"] <= r["sdpa_us"]))
        if "ours_engine_pages_us" in r:
            engine = r["ours_engine_pages_us"] <= r["sdpa_us"]
            checks["decode_never_slower_than_sdpa_on_the_engines_pages"].append((name, engine))
        if r["sdpa_bw_frac"] < 0.65:
            checks["decode_1.5x_sdpa_where_sdpa_under_0.65_bw"].append((name, r["sdpa_us"] / r["ours_us"] >= 1.5))
        if r["kv_mb"] >= 256:
            checks["decode_0.95_copy_bw_where_kv_over_256MB"].append((name, r["bw_frac"] >= 0.95))
        checks["heuristic_within_10pct_of_best_fixed"].append((name, r["ours_us"] <= 1.10 * r["best_fixed_us"]))
    for r in prefill_rows:
        if "sdpa_tflops" not in r:
            continue
        name = f"{r['dtype']} B={r['batch']} L={r['length']}"
        checks["prefill_0.9x_sdpa"].append((name, r["ours_tflops"] >= 0.9 * r["sdpa_tflops"]))
    return {
        k: {"met": all(ok for _, ok in v), "missed": [n for n, ok in v if not ok], "cases": len(v)}
        for k, v in checks.items()
    }


def _short(res) -> str:
    """The short-split config's clause of the configs line (results written before it existed have none)."""
    short = res.get("decode_ws_short_config")  # "None" on an arch without one
    return f" (where its splits read at most {SHORT_SPLIT_KEYS} keys: {short})" if short not in (None, "None") else ""


def _rounds(res) -> str:
    """How the compared times were taken (results written before the rounds have one measurement each; those
    written before `rounds` was recorded show it in their rows' `rounds_us`)."""
    counted = (len(r["rounds_us"]["ours_us"]) for r in res["decode"] if "rounds_us" in r)
    rounds = res.get("rounds") or max(counted, default=0)
    if not rounds:
        return ""
    return (f" Ours, best fixed and SDPA: the median of {rounds} interleaved measurements, each the median of a "
            "graph's replays (no PDL, and the sweep that picks the best fixed choice: one each).")  # fmt: skip


def _long(res) -> str:
    """The long-split config's clause of the configs line (results written before it existed have none)."""
    long = res.get("decode_ws_long_config")
    if long in (None, "None"):
        return ""
    counts = "/".join(map(str, LONG_TWO_CTA_COUNTS))
    return f" (where it would split {counts} ways into longer splits: {long}, twice the splits)"


def markdown(res):
    lines = [
        f"# Attention kernels on {res['device']}", "",
        f"{versions_line(res)}; copy bandwidth {res['copy_gbs']:.0f} GB/s (read + write).", "",
        f"Decode config {res['decode_config']} (for one-wave grids: warp-specialized "
        f"{res.get('decode_ws_config')}{_short(res)}{_long(res)}, deep {res.get('decode_deep_config')}; "
        "for grids of several waves: "
        f"warp-specialized {res.get('decode_ws_waves_config')}); "
        f"prefill config {res['prefill_config']} (warp-specialized: {res.get('prefill_ws_config')}).", "",
        "## Decode (paged, block 16; CUDA-graph replays, L2 defeated)", "",
        "ours: the calls launched with programmatic dependent launch where the arch has it (each call's prologue "
        "runs under the previous call's last kernel); no PDL: the same plan without it. Ours on shuffled pages (any "
        "block anywhere); engine's pages: the same plan on pages as the engine's block manager hands them out after "
        "earlier traffic (runs of consecutive blocks; benchmarks/engine_pages.py)."
        + _rounds(res), "",
        "| dtype | heads | B | L | KV MB | heuristic (config, splits) | ours us | no PDL us "
        "| best fixed (config, splits) us | SDPA us | speedup vs SDPA | engine's pages us | speedup vs SDPA "
        "| ours BW frac | SDPA BW frac |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["decode"]:
        engine = r.get("ours_engine_pages_us")
        engine_cells = f"{engine:.1f} | {r['sdpa_us'] / engine:.3f}x" if engine else "- | -"
        lines.append(
            f"| {r['dtype']} | {r['q_heads']}/{r['kv_heads']} | {r['batch']} | {r['ctx']} | {r['kv_mb']:.0f} | "
            f"{r['heuristic_config']} S={r['heuristic_splits']} | {r['ours_us']:.1f} | {r['ours_no_pdl_us']:.1f} | "
            f"{r['best_fixed_us']:.1f} ({r['best_fixed']}) | {r['sdpa_us']:.1f} | {r['sdpa_us'] / r['ours_us']:.3f}x | "
            f"{engine_cells} | {r['bw_frac']:.2f} | {r['sdpa_bw_frac']:.2f} |"
        )
    if res.get("step"):
        lines += [
            "", "## Decode step (KV write, then decode: a layer's attention as the engine runs it)", "",
            "| dtype | heads | B | L | PDL us | no PDL us | saved |", "|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        for r in res["step"]:
            lines.append(
                f"| {r['dtype']} | {r['q_heads']}/{r['kv_heads']} | {r['batch']} | {r['ctx']} | {r['pdl_us']:.1f} | "
                f"{r['no_pdl_us']:.1f} | {1 - r['pdl_us'] / r['no_pdl_us']:.1%} |"
            )
    lines += [
        "", "## Prefill (causal, heads 32/8, head_dim 128, paged block 16)", "",
        "ours: the engine's path (the chunk's keys from its own K/V rows, a cached prefix from the pages) on the "
        "kernel the dispatch picks; Triton: the Triton kernel on that path; pages: the Triton kernel gathering "
        "every key through the block table.", "",
        "| dtype | B | L | cached prefix | kernel | ours TFLOP/s | Triton TFLOP/s | pages TFLOP/s | SDPA TFLOP/s "
        "| ours / SDPA | rel err vs SDPA |", "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["prefill"]:
        sdpa = r.get("sdpa_tflops")
        vs = (f"{sdpa:.0f}", f"{r['ours_tflops'] / sdpa:.2f}", f"{r['rel_err_vs_sdpa']:.1e}") if sdpa else ("-",) * 3
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['length']} | {r['prefix']} | {r['kernel']} | {r['ours_tflops']:.0f} | "
            f"{r['triton_tflops']:.0f} | {r['pages_tflops']:.0f} | {' | '.join(vs)} |"
        )
    lines += ["", "## Targets", ""]
    for name, t in res["targets"].items():
        status = "met" if t["met"] else f"MISSED on {len(t['missed'])}/{t['cases']}: {', '.join(t['missed'])}"
        status = status if t["cases"] else "not measured in this run"
        lines.append(f"- {name}: {status}")
    return "\n".join(lines) + "\n"

"""Decode at short contexts on the sm_90 Gluon kernel: the plan's split count against the wave model's own
(down to one 64-key tile per split), a sweep of fixed counts, and SDPA.

    python -m benchmarks.decode_short_context [--out DIR]

Small batches of short sequences (L = 256-4k) are where no one-wave config applies and the wave model picks the
count; `plan.decode_splits` keeps the Gluon kernel's splits at splits.DEEP_MIN_TOKENS keys or more. fp16, paged KV
(block 16, shuffled), heads of Llama/Qwen/InternLM-like models at head_dim 128 and Gemma 3's at 256. Every time is
the median of ROUNDS interleaved CUDA-graph timings (graph_time_us: back-to-back calls, L2 defeated), as in the
attention grid:

- plan: the plan's config and split count (what the engine runs when its context bound is L);
- one-tile: the same config at the wave model's count without that floor (the plan before it);
- best fixed: the least time over the sweep's counts on the plan's config (and the two above);
- SDPA on contiguous KV.

Writes decode_short_context_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import torch

from benchmarks.attention import PAGE, SWEEP, decode_calls, decode_inputs, gluon_decode_device, sdpa_calls
from benchmarks.attention_report import config_name
from benchmarks.gpu_timing import interleaved_medians, interleaved_timings
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import plan, splits

SHAPES = [  # (q_heads, kv_heads, head_dim, batch, context)
    (32, 8, 128, 1, 512), (32, 8, 128, 1, 1024), (32, 8, 128, 1, 1536), (32, 8, 128, 2, 512),
    (28, 4, 128, 1, 1024), (28, 4, 128, 1, 2048), (28, 4, 128, 1, 3072), (28, 4, 128, 2, 1024),
    (32, 32, 128, 1, 256), (16, 2, 128, 1, 2048), (16, 2, 128, 1, 4096),
    (4, 1, 256, 1, 1024), (4, 1, 256, 1, 2048), (4, 1, 256, 1, 4096), (4, 1, 256, 2, 4096), (4, 1, 256, 8, 1024),
    (8, 4, 256, 1, 1024), (8, 4, 256, 1, 2048), (8, 4, 256, 4, 512), (16, 8, 256, 1, 1024),
]  # fmt: skip
ROUNDS = 3


def one_tile_count(q, k_cache, block_tables, device, config) -> int:
    """The wave model's count for `config` with splits down to one tile (plan.decode_splits without its floor)."""
    return plan.decode_splits(q, k_cache, block_tables, device, config, max_splits=splits.MAX_SPLITS)


def bench_shape(q_heads, kv_heads, head_dim, batch, ctx, device) -> dict:
    q, k_cache, v_cache, perm, seq_lens, kv_bytes = decode_inputs(
        torch.float16, q_heads, kv_heads, batch, ctx, head_dim
    )
    out = torch.empty_like(q)
    count, config = plan.decode_plan(q, k_cache, perm[0], device)
    one_tile = one_tile_count(q, k_cache, perm[0], device, config)
    counts = sorted({count, one_tile, *(s for s in SWEEP if s <= max(1, ctx // config.block_n))})
    calls = {s: decode_calls(q, k_cache, v_cache, perm, seq_lens, s, out, config) for s in counts}
    calls["sdpa"] = sdpa_calls(q, kv_heads, ctx, perm.shape[0])
    best = interleaved_medians(calls, ROUNDS)
    fixed = min(counts, key=lambda s: best[s])
    return {
        "q_heads": q_heads, "kv_heads": kv_heads, "head_dim": head_dim, "batch": batch, "ctx": ctx,
        "kv_mb": kv_bytes / 2**20, "config": config_name(config, count), "splits": count, "plan_us": best[count],
        "one_tile_splits": one_tile, "one_tile_us": best[one_tile], "best_fixed_splits": fixed,
        "best_fixed_us": best[fixed], "sdpa_us": best["sdpa"], "sweep_us": {str(s): best[s] for s in counts},
    }  # fmt: skip


def markdown(res: dict) -> str:
    lines = [
        f"# Decode at short contexts on {res['device']}", "",
        f"{versions_line(res)}. fp16, pages of {PAGE}; "
        + interleaved_timings(res["rounds"], "decode_short_context.py", res.get("statistic", "least")), "",
        "| heads | head_dim | B | L | KV MB | config | plan splits | plan us | one-tile splits | one-tile us "
        "| plan / one-tile | best fixed (splits) us | plan / best fixed | SDPA us | speedup vs SDPA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        cfg = r["config"].replace("WsDecodeConfig", "gluon")
        lines.append(
            f"| {r['q_heads']}/{r['kv_heads']} | {r['head_dim']} | {r['batch']} | {r['ctx']} | {r['kv_mb']:.1f} | "
            f"{cfg} | {r['splits']} | {r['plan_us']:.2f} | {r['one_tile_splits']} | {r['one_tile_us']:.2f} | "
            f"{r['plan_us'] / r['one_tile_us']:.3f} | {r['best_fixed_us']:.2f} ({r['best_fixed_splits']}) | "
            f"{r['plan_us'] / r['best_fixed_us']:.3f} | {r['sdpa_us']:.2f} | {r['sdpa_us'] / r['plan_us']:.2f}x |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = gluon_decode_device(group=4)
    res = {**device_header(device), "rounds": ROUNDS, "statistic": "median", "rows": []}
    for shape in SHAPES:
        row = bench_shape(*shape, device)
        res["rows"].append(row)
        print({k: v for k, v in row.items() if k != "sweep_us"}, flush=True)
        torch.cuda.empty_cache()
    save_results(result_stem(args.out, "decode_short_context", device.name), res, markdown)


if __name__ == "__main__":
    main()

"""Tile stealing in the sm_90 Gluon decode against the same plan on fixed split ranges (sm_90 only).

    python -m benchmarks.decode_stealing [--out DIR]

Each row: the plan's split count and two-CTA config with its tile stealing (decode_ws.py: a (sequence, KV head)'s
splits take units of tiles from a counter) and without (each split its fixed range), and SDPA on contiguous K/V;
on shuffled 16-token pages and on the engine's pages (benchmarks/engine_pages.py). fp16, head_dim 128; the median of
ROUNDS interleaved CUDA-graph timings of back-to-back calls, L2 defeated, as in the attention grid. Shapes: where the
plan steals (splits of splits.STEAL_MIN_KEYS keys or more) and below it, with the stealing forced on.

Writes decode_stealing_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import dataclasses

import torch

from benchmarks.attention import HEAD_DIM, decode_calls, decode_inputs, gluon_decode_device, sdpa_calls
from benchmarks.engine_pages import engine_pages
from benchmarks.gpu_timing import interleaved_medians, interleaved_timings
from benchmarks.report import add_row, device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import plan
from vlchat.kernels.attention.configs import TABLES

SHAPES = [  # (q_heads, kv_heads, batch, context)
    (32, 32, 1, 16384), (32, 32, 1, 32768), (32, 32, 1, 65536), (32, 32, 1, 131072), (32, 32, 1, 262144),
    (32, 32, 2, 131072), (32, 8, 1, 131072), (32, 8, 1, 262144), (32, 8, 4, 65536), (32, 8, 4, 131072),
]  # fmt: skip
ROUNDS = 7
STEAL_TILES = TABLES["sm_90"].decode_ws_config(HEAD_DIM, grid="waves").steal_tiles


def bench_shape(q_heads, kv_heads, batch, ctx, device) -> dict:
    q, k_cache, v_cache, perm, seq_lens, kv_bytes = decode_inputs(torch.float16, q_heads, kv_heads, batch, ctx)
    splits, planned = plan.decode_plan(q, k_cache, perm[0], device)
    stealing = dataclasses.replace(planned, steal_tiles=STEAL_TILES, half_splits_keys=0)
    fixed = dataclasses.replace(planned, steal_tiles=0)
    k_eng, v_eng, t_eng = engine_pages(torch.float16, kv_heads, batch, ctx, perm.shape[0])
    out = torch.empty_like(q)
    calls = {"sdpa": sdpa_calls(q, kv_heads, ctx, perm.shape[0])}
    for pages, (k, v, t) in (("shuffled", (k_cache, v_cache, perm)), ("engine", (k_eng, v_eng, t_eng))):
        calls[f"stealing {pages}"] = decode_calls(q, k, v, t, seq_lens, splits, out, stealing)
        calls[f"fixed {pages}"] = decode_calls(q, k, v, t, seq_lens, splits, out, fixed)
    us = interleaved_medians(calls, ROUNDS)
    del calls, k_cache, v_cache, k_eng, v_eng
    torch.cuda.empty_cache()
    return {"heads": f"{q_heads}/{kv_heads}", "batch": batch, "ctx": ctx, "kv_mb": kv_bytes / 2**20,
            "splits": splits, "keys_per_split": ctx // splits, "plan_steals": planned.steal_tiles > 0 and splits > 1,
            "us": us}  # fmt: skip


def markdown(res: dict) -> str:
    lines = [
        f"# Tile stealing in the decode on {res['device']}",
        "",
        f"{versions_line(res)}. fp16, head_dim 128, the plan's split count and two-CTA config with "
        f"tile stealing (units of {res['steal_tiles']} tiles) and without; "
        + interleaved_timings(res["rounds"], "decode_stealing.py"),
        "",
        "| heads | B | L | splits | keys per split | plan steals | SDPA us | shuffled: stealing / fixed us | speedup "
        "| vs SDPA | engine's pages: stealing / fixed us | speedup | vs SDPA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        us = r["us"]
        cells = []
        for pages in ("shuffled", "engine"):
            s, f = us[f"stealing {pages}"], us[f"fixed {pages}"]
            cells += [f"{s:.1f} / {f:.1f}", f"{f / s:.3f}x", f"{us['sdpa'] / s:.3f}x"]
        lines.append(
            f"| {r['heads']} | {r['batch']} | {r['ctx']} | {r['splits']} | {r['keys_per_split']} | "
            f"{'yes' if r['plan_steals'] else 'no'} | {us['sdpa']:.1f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = gluon_decode_device(4)
    res = {**device_header(device), "rounds": ROUNDS, "steal_tiles": STEAL_TILES, "rows": []}
    for shape in SHAPES:
        add_row(res, bench_shape(*shape, device), markdown)
    save_results(result_stem(args.out, "decode_stealing", device.name), res, markdown)


if __name__ == "__main__":
    main()

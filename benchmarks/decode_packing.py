"""KV heads packed per CTA on the sm_90 Gluon decode: unsplit grids of several waves of short sequences, each at
1, 2 and 4 KV heads per CTA, and what the plan picks.

    python -m benchmarks.decode_packing [--out DIR]

Decode reads each (sequence, KV head) unit's K/V once; an unsplit grid of many units runs one CTA per unit in
several waves. With `pack_heads` P one CTA reads P adjacent KV heads (decode_ws.py), so the grid has P times fewer,
P times longer CTAs. `splits.pack_heads` packs where that makes one wave of CTAs reading at most the config's
pack_max_keys keys; this sweep is what that rule rests on. fp16, head_dim 128, paged KV (block 16, shuffled), the
plan's config for grids of several waves (decode_ws_waves) at one split; each time the median of ROUNDS interleaved
CUDA-graph timings (graph_time_us: back-to-back calls, L2 defeated), as in the attention grid. Columns: the packed
grid's CTAs and its waves (of the config's slots), the time at each packing, and the unpacked time over each packed
one (above 1: packing is faster).

Writes decode_packing_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import dataclasses

import torch

from benchmarks.attention import PAGE, decode_calls, decode_inputs, gluon_decode_device
from benchmarks.gpu_timing import interleaved_medians, interleaved_timings
from benchmarks.report import add_row, device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import decode_ws, plan
from vlchat.kernels.attention.configs import table_for

HEADS = [(32, 8), (64, 8), (16, 8), (28, 4), (32, 32)]  # (q_heads, kv_heads)
BATCHES = [32, 64, 96, 128, 256]
CONTEXTS = [256, 512, 1024, 2048]
PACKS = (1, 2, 4)
ROUNDS = 7
MAX_KV_BYTES = 8 << 30  # the largest shapes (MHA at B=256 L=2k) are left out


def bench_shape(q_heads, kv_heads, batch, ctx, device) -> dict:
    q, k_cache, v_cache, perm, seq_lens, kv_bytes = decode_inputs(torch.float16, q_heads, kv_heads, batch, ctx)
    out = torch.empty_like(q)
    waves = table_for(device).decode_ws_config(128, torch.float16, grid="waves")
    packs = [p for p in PACKS if decode_ws.packs(waves, q_heads // kv_heads, kv_heads, PAGE, p)]
    calls = {
        p: decode_calls(q, k_cache, v_cache, perm, seq_lens, 1, out, dataclasses.replace(waves, pack_heads=p))
        for p in packs
    }
    us = interleaved_medians(calls, ROUNDS)
    count, chosen = plan.decode_plan(q, k_cache, perm[0], device)
    slots = device.sm_count * waves.ctas_per_sm
    return {
        "q_heads": q_heads, "kv_heads": kv_heads, "batch": batch, "ctx": ctx, "kv_mb": kv_bytes / 2**20,
        "units": batch * kv_heads, "slots": slots, "us": {str(p): t for p, t in us.items()},
        "plan_splits": count, "plan_pack": getattr(chosen, "pack_heads", 1),
    }  # fmt: skip


def markdown(res: dict) -> str:
    lines = [
        f"# KV heads packed per decode CTA on {res['device']}", "",
        f"{versions_line(res)}. fp16, head_dim 128, pages of {PAGE} (shuffled), the Gluon decode's config for grids "
        f"of several waves at one split; {interleaved_timings(res['rounds'], 'decode_packing.py')} Waves: the grid's "
        "CTAs over the config's slots (SMs x CTAs per SM); unpacked / packed above 1: packing is faster.", "",
        "| heads | B | L | KV MB | units | 1 us | 2: waves | 2 us | unpacked / 2 | 4: waves | 4 us | unpacked / 4 "
        "| plan (splits, heads per CTA) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        cells = [
            f"{r['q_heads']}/{r['kv_heads']}",
            str(r["batch"]),
            str(r["ctx"]),
            f"{r['kv_mb']:.0f}",
            str(r["units"]),
        ]
        base = r["us"]["1"]
        cells.append(f"{base:.1f}")
        for p in ("2", "4"):
            if p in r["us"]:
                waves = r["units"] / int(p) / r["slots"]
                cells += [f"{waves:.2f}", f"{r['us'][p]:.1f}", f"{base / r['us'][p]:.3f}"]
            else:
                cells += ["-", "-", "-"]
        cells.append(f"S={r['plan_splits']}, {r['plan_pack']}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = gluon_decode_device(group=4)
    res = {**device_header(device), "rounds": ROUNDS, "rows": []}
    for q_heads, kv_heads in HEADS:
        for batch in BATCHES:
            for ctx in CONTEXTS:
                if 2 * batch * kv_heads * ctx * 128 * 2 > MAX_KV_BYTES:
                    continue
                add_row(res, bench_shape(q_heads, kv_heads, batch, ctx, device), markdown)
                torch.cuda.empty_cache()
    save_results(result_stem(args.out, "decode_packing", device.name), res, markdown)


if __name__ == "__main__":
    main()

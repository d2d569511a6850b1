"""Paged decode at another head_dim (256: Gemma 3) on a GPU: the plan against the Triton kernel's plan and SDPA.

    PYTHONPATH=. python -m benchmarks.decode_head_dim [--head-dim 256] [--out DIR]

Heads of Gemma 3's models at head_dim 256 (4/1: 270M and 1B; 8/4: 4B; 16/8: 12B), fp16 and bf16, paged KV (block 16,
shuffled blocks), (batch, context) from one sequence at 4k and 32k to 64 sequences at 2k. Columns: the plan the
engine runs (plan.decode_plan: on sm_90 the warp-specialized Gluon kernel, decode_ws.py), the plan restricted to the
Triton kernel (what ran at this head_dim before the Gluon kernel took it), SDPA on contiguous KV, and the fraction
of the device-to-device copy bandwidth measured in the same run; the largest difference between the two kernels'
outputs is a sanity check (the tests compare each with a float64 reference). Every time is a CUDA-graph replay of
at least 16 calls over enough KV copies to defeat the L2, as in benchmarks/attention.py.
Writes decode_head_dim_<head_dim>_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.attention import decode_calls, decode_inputs, sdpa_calls
from benchmarks.attention_report import config_name
from benchmarks.gpu_timing import copy_bandwidth_gbs, graph_time_us
from benchmarks.report import result_stem, save_results, versions, versions_line
from kernels.attention import plan
from kernels.device import get_device_info

HEADS = ((4, 1), (8, 4), (16, 8))  # Gemma 3 270M/1B, 4B, 12B
SHAPES = ((1, 4096), (1, 32768), (8, 4096), (32, 2048), (64, 2048))  # (batch, context)


def bench_row(dtype, q_heads, kv_heads, batch, ctx, head_dim, device) -> dict:
    q, k_cache, v_cache, perm, seq_lens, kv_bytes = decode_inputs(dtype, q_heads, kv_heads, batch, ctx, head_dim)
    row = {"dtype": str(dtype).removeprefix("torch."), "q_heads": q_heads, "kv_heads": kv_heads, "batch": batch}
    row.update(ctx=ctx, kv_mb=kv_bytes / 2**20)
    outs = []
    for name, gluon in (("plan", True), ("triton", False)):
        splits, config = plan.decode_plan(q, k_cache, perm[0], device, gluon=gluon)
        out = torch.empty_like(q)
        row[f"{name}_config"], row[f"{name}_splits"] = config_name(config), splits
        row[f"{name}_us"] = graph_time_us(decode_calls(q, k_cache, v_cache, perm, seq_lens, splits, out, config))
        outs.append(out.float())
    row["max_diff"] = (outs[0] - outs[1]).abs().max().item()
    row["sdpa_us"] = graph_time_us(sdpa_calls(q, kv_heads, ctx, perm.shape[0]))
    return row


def markdown(res: dict) -> str:
    lines = [
        f"# Paged decode at head_dim {res['head_dim']} on {res['device']}", "",
        f"{versions_line(res)}; copy bandwidth {res['copy_gbs']:.0f} GB/s (read + write). Paged KV, block 16; "
        "CUDA-graph replays, L2 defeated (benchmarks/decode_head_dim.py says what each column runs).", "",
        "| dtype | heads | B | L | KV MB | plan (config, splits) | plan us | Triton plan (config, splits) | Triton us "
        "| SDPA us | plan / Triton | speedup vs SDPA | plan BW frac | max diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    bw = res["copy_gbs"] * 1e3  # bytes per microsecond
    for r in res["rows"]:
        lines.append(
            f"| {r['dtype']} | {r['q_heads']}/{r['kv_heads']} | {r['batch']} | {r['ctx']} | {r['kv_mb']:.0f} | "
            f"{r['plan_config']} S={r['plan_splits']} | {r['plan_us']:.1f} | {r['triton_config']} "
            f"S={r['triton_splits']} | {r['triton_us']:.1f} | {r['sdpa_us']:.1f} | "
            f"{r['plan_us'] / r['triton_us']:.2f} | {r['sdpa_us'] / r['plan_us']:.2f}x | "
            f"{r['kv_mb'] * 2**20 / r['plan_us'] / bw:.2f} | {r['max_diff']:.1e} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    device = get_device_info()
    res = {"device": device.name, "arch": device.arch, "sm_count": device.sm_count, **versions(),
           "head_dim": args.head_dim, "copy_gbs": copy_bandwidth_gbs(), "rows": []}  # fmt: skip
    for dtype in (torch.float16, torch.bfloat16):
        for q_heads, kv_heads in HEADS:
            for batch, ctx in SHAPES:
                r = bench_row(dtype, q_heads, kv_heads, batch, ctx, args.head_dim, device)
                res["rows"].append(r)
                torch.cuda.empty_cache()
                print(f"{r['dtype']} {q_heads}/{kv_heads} B={batch} L={ctx}: plan {r['plan_us']:.1f} us "
                      f"({r['plan_config']} S={r['plan_splits']}), Triton {r['triton_us']:.1f}, "
                      f"SDPA {r['sdpa_us']:.1f}", flush=True)  # fmt: skip
    save_results(result_stem(args.out, f"decode_head_dim_{args.head_dim}", device.name), res, markdown)


if __name__ == "__main__":
    main()

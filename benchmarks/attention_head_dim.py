"""Attention at another head_dim (256: Gemma 3) on a GPU: decode and prefill against the Triton kernel and SDPA.

    PYTHONPATH=. python -m benchmarks.attention_head_dim [--head-dim 256] [--out DIR]

Heads of Gemma 3's models at head_dim 256 (4/1: 270M and 1B; 8/4: 4B; 16/8: 12B), paged KV (block 16, shuffled
blocks).

- Decode, fp16 and bf16, (batch, context) from one sequence at 4k and 32k to 64 sequences at 2k: the plan the
  engine runs (plan.decode_plan: on sm_90 the warp-specialized Gluon kernel, decode_ws.py), the plan restricted to
  the Triton kernel (what ran at this head_dim before the Gluon kernel took it), SDPA on contiguous KV, and the
  fraction of the device-to-device copy bandwidth measured in the same run; the largest difference between the two
  kernels' outputs is a sanity check (the tests compare each with a float64 reference). Every time is a CUDA-graph
  replay of at least 16 calls over enough KV copies to defeat the L2, as in benchmarks/attention.py.
- Prefill, bf16, heads 8/4 and 16/8, fresh sequences (B=1 and 4 at 4k, B=1 at 16k), causal and with Gemma 3's
  1024-token sliding window: TFLOP/s (keys each query sees) of the engine's path (the chunk's own K/V rows; the
  dispatch's kernel: on sm_90 the Gluon kernel of prefill_ws.py), of the Triton kernel on the same path, and of
  SDPA on contiguous K/V expanded to the query heads (causal rows only: SDPA has no window), with the relative
  error of ours against SDPA.

Writes attention_head_dim_<head_dim>_<device>.json and .md under --out and prints the tables.
"""

from __future__ import annotations

import torch

from benchmarks.attention import decode_calls, decode_inputs, prefill_inputs, sdpa_calls, sdpa_prefill, time_ms
from benchmarks.attention_report import config_name
from benchmarks.gpu_timing import copy_bandwidth_gbs, graph_time_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import plan, prefill
from vlchat.kernels.attention.configs import table_for
from vlchat.kernels.device import get_device_info

HEADS = ((4, 1), (8, 4), (16, 8))  # Gemma 3 270M/1B, 4B, 12B
SHAPES = ((1, 4096), (1, 32768), (8, 4096), (32, 2048), (64, 2048))  # decode (batch, context)
PREFILL_HEADS = ((8, 4), (16, 8))
PREFILL_SHAPES = ((1, 4096), (4, 4096), (1, 16384))  # (batch, length)
WINDOW = 1024  # Gemma 3's sliding window (4B-27B)


def bench_decode(dtype, q_heads, kv_heads, batch, ctx, head_dim, device) -> dict:
    q, k_cache, v_cache, perm, seq_lens, kv_bytes = decode_inputs(dtype, q_heads, kv_heads, batch, ctx, head_dim)
    row = {"dtype": str(dtype).removeprefix("torch."), "q_heads": q_heads, "kv_heads": kv_heads, "batch": batch}
    row.update(ctx=ctx, kv_mb=kv_bytes / 2**20)
    outs = []
    for name, gluon in (("plan", True), ("triton", False)):
        splits, config = plan.decode_plan(q, k_cache, perm[0], device, gluon=gluon)
        out = torch.empty_like(q)
        row[f"{name}_config"], row[f"{name}_splits"] = config_name(config, splits), splits
        row[f"{name}_us"] = graph_time_us(decode_calls(q, k_cache, v_cache, perm, seq_lens, splits, out, config))
        outs.append(out.float())
    row["max_diff"] = (outs[0] - outs[1]).abs().max().item()
    row["sdpa_us"] = graph_time_us(sdpa_calls(q, kv_heads, ctx, perm.shape[0]))
    return row


def bench_prefill(dtype, q_heads, kv_heads, batch, length, window, head_dim, device) -> dict:
    q, k_cache, v_cache, tables, cu, lens, k_rows, v_rows, k_all, v_all = prefill_inputs(
        dtype, batch, length, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim
    )
    scale = head_dim**-0.5
    keys = sum(min(i + 1, window or length) for i in range(length))  # causal: keys each query row sees
    flops = 4 * batch * q_heads * head_dim * keys
    args = (q, k_cache, v_cache, tables, cu, lens, scale, length, True, window)
    triton_config = table_for(device).prefill_config(head_dim, dtype)

    def ours():
        return prefill.paged_prefill_attention(*args, k=k_rows, v=v_rows)

    def triton_rows():
        return prefill.paged_prefill_attention(*args, k=k_rows, v=v_rows, config=triton_config)

    def tflops(fn):
        return flops / time_ms(fn) / 1e9

    ws = prefill.ws_plan(q, k_rows, v_rows, k_cache, v_cache, True, window, 0.0, device, None)
    row = {"dtype": str(dtype).removeprefix("torch."), "q_heads": q_heads, "kv_heads": kv_heads, "batch": batch}
    row.update(length=length, window=window, kernel="gluon-ws" if ws else "triton")
    row["ours_tflops"] = tflops(ours)
    row["triton_tflops"] = tflops(triton_rows) if ws else row["ours_tflops"]  # without the Gluon kernel: the same
    mine = ours()
    row["max_diff_vs_triton"] = float((mine.float() - triton_rows().float()).abs().max())
    if window is None:  # SDPA has no window
        row["rel_err_vs_sdpa"], sdpa = sdpa_prefill(q, k_all, v_all, mine, scale)
        row["sdpa_tflops"] = tflops(sdpa)
    return row


def markdown(res: dict) -> str:
    lines = [
        f"# Attention at head_dim {res['head_dim']} on {res['device']}", "",
        f"{versions_line(res)}; copy bandwidth {res['copy_gbs']:.0f} GB/s (read + write). Paged KV, block 16 "
        "(benchmarks/attention_head_dim.py says what each column runs).", "",
        "## Decode (CUDA-graph replays, L2 defeated)", "",
        "| dtype | heads | B | L | KV MB | plan (config, splits) | plan us | Triton plan (config, splits) | Triton us "
        "| SDPA us | plan / Triton | speedup vs SDPA | plan BW frac | max diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    bw = res["copy_gbs"] * 1e3  # bytes per microsecond
    for r in res["decode"]:
        lines.append(
            f"| {r['dtype']} | {r['q_heads']}/{r['kv_heads']} | {r['batch']} | {r['ctx']} | {r['kv_mb']:.0f} | "
            f"{r['plan_config']} S={r['plan_splits']} | {r['plan_us']:.1f} | {r['triton_config']} "
            f"S={r['triton_splits']} | {r['triton_us']:.1f} | {r['sdpa_us']:.1f} | "
            f"{r['plan_us'] / r['triton_us']:.2f} | {r['sdpa_us'] / r['plan_us']:.2f}x | "
            f"{r['kv_mb'] * 2**20 / r['plan_us'] / bw:.2f} | {r['max_diff']:.1e} |"
        )  # fmt: skip
    lines += [
        "", "## Prefill (fresh sequences, causal; a window of 1024 where named)", "",
        "| dtype | heads | B | L | window | kernel | ours TFLOP/s | Triton TFLOP/s | SDPA TFLOP/s | ours / Triton "
        "| ours / SDPA | rel err vs SDPA | max diff vs Triton |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["prefill"]:
        sdpa = r.get("sdpa_tflops")
        vs_sdpa = (
            (f"{sdpa:.0f}", f"{r['ours_tflops'] / sdpa:.2f}", f"{r['rel_err_vs_sdpa']:.1e}") if sdpa else ("-",) * 3
        )
        lines.append(
            f"| {r['dtype']} | {r['q_heads']}/{r['kv_heads']} | {r['batch']} | {r['length']} | {r['window'] or '-'} | "
            f"{r['kernel']} | {r['ours_tflops']:.0f} | {r['triton_tflops']:.0f} | {vs_sdpa[0]} | "
            f"{r['ours_tflops'] / r['triton_tflops']:.2f} | {vs_sdpa[1]} | {vs_sdpa[2]} | "
            f"{r['max_diff_vs_triton']:.1e} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = results_parser(__doc__)
    parser.add_argument("--head-dim", type=int, default=256)
    args = parser.parse_args()
    device = get_device_info()
    res = {**device_header(device), "head_dim": args.head_dim, "copy_gbs": copy_bandwidth_gbs(), "decode": [],
           "prefill": []}  # fmt: skip
    for dtype in (torch.float16, torch.bfloat16):
        for q_heads, kv_heads in HEADS:
            for batch, ctx in SHAPES:
                r = bench_decode(dtype, q_heads, kv_heads, batch, ctx, args.head_dim, device)
                res["decode"].append(r)
                torch.cuda.empty_cache()
                print(f"decode {r['dtype']} {q_heads}/{kv_heads} B={batch} L={ctx}: plan {r['plan_us']:.1f} us "
                      f"({r['plan_config']} S={r['plan_splits']}), Triton {r['triton_us']:.1f}, "
                      f"SDPA {r['sdpa_us']:.1f}", flush=True)  # fmt: skip
    for q_heads, kv_heads in PREFILL_HEADS:
        for batch, length in PREFILL_SHAPES:
            for window in (None, WINDOW):
                r = bench_prefill(torch.bfloat16, q_heads, kv_heads, batch, length, window, args.head_dim, device)
                res["prefill"].append(r)
                torch.cuda.empty_cache()
                print(f"prefill {q_heads}/{kv_heads} B={batch} L={length} window={window}: ours ({r['kernel']}) "
                      f"{r['ours_tflops']:.0f} Triton {r['triton_tflops']:.0f} "
                      f"SDPA {r.get('sdpa_tflops', 0):.0f} TFLOP/s", flush=True)  # fmt: skip
    save_results(result_stem(args.out, f"attention_head_dim_{args.head_dim}", device.name), res, markdown)


if __name__ == "__main__":
    main()

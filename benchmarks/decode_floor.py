"""How far batch-1 decode is from the floor: the split plan's parts against reading the same bytes and nothing else.

    python -m benchmarks.decode_floor [--out DIR]

One sequence, heads 32/8, head_dim 128, fp16, paged KV (block 16, shuffled), the sm_90 one-CTA Gluon decode config
(where its splits read at most splits.SHORT_SPLIT_KEYS keys, as at all three lengths, the short-split config the
plan takes there: plan.short_splits_config) and its one-wave split count, at L = 1k, 4k, 16k. Every time is a
CUDA-graph replay of back-to-back calls with programmatic dependent launch where the arch has it, over enough KV
copies to defeat the L2 (graph_time_us):

- plan: the decode kernel and the reduce kernel that merges its splits (what a layer runs at 4k and 16k; at 1k
  the one-CTA config's one-wave count, 16, would read 64 keys per split, below splits.DEEP_MIN_TOKENS, and the
  engine's plan leaves that config: here it keeps it at 8 splits, the most that read 128 keys each);
- decode kernel: the decode kernel alone (its partials), reduce: the reduce kernel alone;
- read floor: a kernel that only reads the K/V bytes of the call (contiguous, each CTA's loads issued at once,
  the best of 8k-64k elements per CTA) and sums them - no page table, no arithmetic to speak of, no second kernel;
- empty kernel: a kernel that loads nothing (launch and dependent-launch wait);
- SDPA on contiguous KV, and the time 1.5x SDPA would be.

Writes decode_floor_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from benchmarks.attention import HEAD_DIM, PAGE, decode_calls, decode_inputs, gluon_decode_device, sdpa_calls
from benchmarks.gpu_timing import graph_time_us, read_floor_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import decode, decode_ws, plan, splits
from vlchat.kernels.attention.configs import table_for
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options

Q_HEADS, KV_HEADS = 32, 8  # on the attention benchmark's decode inputs (HEAD_DIM, pages of PAGE)
LENGTHS = (1024, 4096, 16384)


@triton.jit
def _empty_kernel(out_ptr, PDL: tl.constexpr):
    launch_next_then_wait(PDL)
    if tl.program_id(0) == 0:
        tl.store(out_ptr, 1.0)


def bench_length(length: int, device, config, pdl: bool) -> dict:
    q, k_cache, v_cache, perm, lens, kv_bytes = decode_inputs(torch.float16, Q_HEADS, KV_HEADS, 1, length)
    sets = perm.shape[0]
    out = torch.empty_like(q)
    scale = HEAD_DIM**-0.5
    # the one-wave split count, at most as many splits as still read DEEP_MIN_TOKENS keys each (at L=1k 8, where
    # the wave alone would take 16 and the plan then leaves the one-CTA config)
    most = length // splits.DEEP_MIN_TOKENS
    count = splits.deep_splits(KV_HEADS, length, device.sm_count, config.ctas_per_sm, max_splits=most)
    config = plan.short_splits_config(table_for(device), config, HEAD_DIM, torch.float16, length, count)
    part = torch.empty(1, Q_HEADS, count, HEAD_DIM, device="cuda", dtype=torch.float32)
    lse = torch.empty(1, Q_HEADS, count, device="cuda", dtype=torch.float32)

    def kernel(t):
        decode_ws.launch(q, k_cache, v_cache, t, lens, scale, None, count, out, part, lse, config, pdl)

    def reduce():
        decode.reduce_partials(part, lse, out, pdl)

    flag = torch.zeros(1, device="cuda")
    row = {"length": length, "kv_mb": kv_bytes / 2**20, "splits": count, "config": str(config)}
    row["plan_us"] = graph_time_us(decode_calls(q, k_cache, v_cache, perm, lens, count, out, config))
    row["kernel_us"] = graph_time_us([lambda t=t: kernel(t) for t in perm])
    row["reduce_us"] = graph_time_us([reduce], min_calls=64)
    row["read_floor_us"] = read_floor_us(kv_bytes // 2, sets, pdl)
    row["empty_us"] = graph_time_us([lambda: _empty_kernel[(128,)](flag, PDL=pdl, **pdl_options(pdl))], min_calls=64)
    row["sdpa_us"] = graph_time_us(sdpa_calls(q, KV_HEADS, length, sets))
    return row


def markdown(res: dict) -> str:
    lines = [
        f"# Batch-1 decode against its floor on {res['device']}", "",
        f"{versions_line(res)}; programmatic dependent launch: {res['pdl']}. Heads {Q_HEADS}/{KV_HEADS}, "
        f"head_dim {HEAD_DIM}, fp16, one sequence, "
        f"pages of {PAGE}; CUDA-graph replays of back-to-back calls, L2 defeated (benchmarks/decode_floor.py says "
        "what each column runs).", "",
        "| L | KV MB | splits | plan us | decode kernel us | reduce us | read floor us | empty kernel us | SDPA us "
        "| plan vs SDPA | 1.5x SDPA us | plan / read floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        lines.append(
            f"| {r['length']} | {r['kv_mb']:.0f} | {r['splits']} | {r['plan_us']:.2f} | {r['kernel_us']:.2f} | "
            f"{r['reduce_us']:.2f} | {r['read_floor_us']:.2f} | {r['empty_us']:.2f} | {r['sdpa_us']:.2f} | "
            f"{r['sdpa_us'] / r['plan_us']:.2f}x | {r['sdpa_us'] / 1.5:.2f} | {r['plan_us'] / r['read_floor_us']:.2f} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = gluon_decode_device(Q_HEADS // KV_HEADS)
    config = table_for(device).decode_ws_config(HEAD_DIM, torch.float16)
    pdl = dependent_launch(device)
    res = {**device_header(device), "pdl": pdl, "rows": []}
    for length in LENGTHS:
        res["rows"].append(bench_length(length, device, config, pdl))
        torch.cuda.empty_cache()
    save_results(result_stem(args.out, "decode_floor", device.name), res, markdown)


if __name__ == "__main__":
    main()

"""Decode attention planned at the engine's context bound against planned at the step's own context bucket.

    python -m benchmarks.decode_context_plan [--out DIR]

The engine plans decode attention (split count, kernel config) per batch bucket and context bucket
(llm/engine/cuda_graphs.py: buckets doubling from 512 to max_model_len, the step's longest sequence picking one).
Planned at max_model_len instead, a step of short sequences splits as if they were long. Each row: sequences of L
keys in a cache with a max_model_len bound, the plan at that bound against the plan at L's context bucket, both
run on the same calls (fp16, head_dim 128, paged KV of 16-token pages, shuffled; the median of ROUNDS interleaved
CUDA-graph timings, L2 defeated, as in the attention grid).

Writes decode_context_plan_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import torch

from benchmarks.attention import HEAD_DIM, PAGE, decode_calls, decode_inputs, gluon_decode_device
from benchmarks.attention_report import config_name
from benchmarks.gpu_timing import interleaved_medians, interleaved_timings
from benchmarks.report import add_row, device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import plan
from vlchat.llm.engine.cuda_graphs import context_bucket, context_buckets

SHAPES = [  # (q_heads, kv_heads, batch, context, max_model_len)
    (32, 8, 1, 1024, 32768), (32, 8, 4, 2048, 32768), (32, 8, 16, 1024, 32768), (32, 8, 64, 512, 32768),
    (32, 8, 128, 1024, 32768), (32, 8, 256, 1024, 32768), (32, 32, 32, 1024, 32768), (32, 8, 128, 512, 4096),
    (32, 8, 64, 1024, 131072), (32, 32, 8, 2048, 131072),
]  # fmt: skip
ROUNDS = 7


def bench_shape(q_heads, kv_heads, batch, ctx, max_model_len, device) -> dict:
    q, k_cache, v_cache, perm, seq_lens, kv_bytes = decode_inputs(torch.float16, q_heads, kv_heads, batch, ctx)
    out = torch.empty_like(q)
    bucket = context_bucket(context_buckets(max_model_len), ctx)
    plans = {
        "bound": plan.bound_plan(batch, q_heads, kv_heads, HEAD_DIM, q.dtype, PAGE, max_model_len, device),
        "bucket": plan.bound_plan(batch, q_heads, kv_heads, HEAD_DIM, q.dtype, PAGE, bucket, device),
    }
    calls = {key: decode_calls(q, k_cache, v_cache, perm, seq_lens, s, out, c) for key, (s, c) in plans.items()}
    us = interleaved_medians(calls, ROUNDS)
    return {
        "q_heads": q_heads, "kv_heads": kv_heads, "batch": batch, "ctx": ctx, "max_model_len": max_model_len,
        "kv_mb": kv_bytes / 2**20, "bucket": bucket, "us": us,
        "plans": {key: f"{config_name(c, s)} S={s}" for key, (s, c) in plans.items()},
    }  # fmt: skip


def markdown(res: dict) -> str:
    lines = [
        f"# Decode planned per context bucket on {res['device']}", "",
        f"{versions_line(res)}. fp16, head_dim 128, pages of {PAGE} (shuffled); "
        + interleaved_timings(res["rounds"], "decode_context_plan.py"), "",
        "| heads | B | L | max_model_len | KV MB | plan at max_model_len | us | context bucket | its plan | us "
        "| bound / bucket |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        lines.append(
            f"| {r['q_heads']}/{r['kv_heads']} | {r['batch']} | {r['ctx']} | {r['max_model_len']} | {r['kv_mb']:.0f} "
            f"| {r['plans']['bound']} | {r['us']['bound']:.1f} | {r['bucket']} | {r['plans']['bucket']} "
            f"| {r['us']['bucket']:.1f} | {r['us']['bound'] / r['us']['bucket']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = gluon_decode_device(group=4)
    res = {**device_header(device), "rounds": ROUNDS, "rows": []}
    for shape in SHAPES:
        add_row(res, bench_shape(*shape, device), markdown)
        torch.cuda.empty_cache()
    save_results(result_stem(args.out, "decode_context_plan", device.name), res, markdown)


if __name__ == "__main__":
    main()

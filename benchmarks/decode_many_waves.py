"""Split counts on decode grids of several waves: the plan (with the wave model's unsplit rule) against the wave
model's own count, fixed counts and SDPA.

    python -m benchmarks.decode_many_waves [--out DIR]

Grids of at least splits.UNSPLIT_WAVES waves of (sequence, KV head) units on the plan's many-wave config, whose
last wave is partial: the wave model, which has waves run in lockstep, splits them to fill that wave; the rule keeps
those of at most splits.UNSPLIT_MAX_KEYS keys unsplit. Also three grids at L=32k where the rule does not apply (two
of 3-4 waves, one of 1.45). fp16, head_dim 128, on the engine's pages (benchmarks/engine_pages.py); every time the
median of ROUNDS interleaved CUDA-graph timings of back-to-back calls, L2 defeated, as in the attention grid:

- plan: the plan's config and split count (what the engine runs at that context bound);
- model: the same config at the wave model's count without the rule;
- S=1..4: the plan's config at fixed counts (as the plan runs it at each: plan.stealing_config);
- SDPA on contiguous K/V.

Writes decode_many_waves_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import torch

from benchmarks.attention import HEAD_DIM, PAGE, decode_calls, decode_inputs, gluon_decode_device, sdpa_calls
from benchmarks.attention_report import config_name
from benchmarks.engine_pages import engine_pages
from benchmarks.gpu_timing import interleaved_medians, interleaved_timings
from benchmarks.report import add_row, device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import plan

SHAPES = [  # (q_heads, kv_heads, batch, context)
    (32, 32, 256, 2048), (32, 32, 136, 2048), (32, 8, 544, 2048), (32, 8, 200, 4096), (32, 8, 320, 4096),
    (32, 32, 96, 4096), (32, 32, 72, 4096), (32, 8, 100, 8192), (32, 8, 160, 8192),
    (32, 8, 128, 32768), (32, 8, 100, 32768), (32, 8, 48, 32768),
]  # fmt: skip
FIXED = (1, 2, 3, 4)
ROUNDS = 5


def bench_shape(q_heads, kv_heads, batch, ctx, device) -> dict:
    dtype = torch.float16
    q, k, v, perm, seq_lens, kv_bytes = decode_inputs(dtype, q_heads, kv_heads, batch, ctx)
    del k, v  # the shuffled copies are not timed: the engine's pages are
    torch.cuda.empty_cache()
    shape = torch.empty(1, PAGE, kv_heads, HEAD_DIM, device="cuda", dtype=dtype)  # what planning reads of a cache
    count, config = plan.decode_plan(q, shape, perm[0], device)
    model = plan.decode_splits(q, shape, perm[0], device, config, unsplit_rule=False)
    k, v, tables = engine_pages(dtype, kv_heads, batch, ctx, perm.shape[0])
    out = torch.empty_like(q)
    units = batch * kv_heads
    calls = {"sdpa": sdpa_calls(q, kv_heads, ctx, perm.shape[0])}
    for s in sorted({*FIXED, count, model}):
        calls[s] = decode_calls(q, k, v, tables, seq_lens, s, out, plan.stealing_config(config, s, ctx, units))
    us = interleaved_medians(calls, ROUNDS)
    del calls, k, v
    torch.cuda.empty_cache()
    return {
        "heads": f"{q_heads}/{kv_heads}", "batch": batch, "ctx": ctx, "kv_mb": kv_bytes / 2**20,
        "waves": units / (device.sm_count * config.ctas_per_sm), "config": config_name(config, count),
        "plan_splits": count, "model_splits": model, "us": {str(key): t for key, t in us.items()},
    }  # fmt: skip


def markdown(res: dict) -> str:
    lines = [
        f"# Decode split counts on grids of several waves on {res['device']}",
        "",
        f"{versions_line(res)}. fp16, head_dim 128, the engine's pages; plan: the plan's count (the wave model with "
        "its unsplit rule), model: the wave model's count without the rule, both on the plan's config; "
        + interleaved_timings(res["rounds"], "decode_many_waves.py"),
        "",
        "| heads | B | L | KV MB | waves | config | plan S | model S | plan us | model us | model / plan | "
        + " | ".join(f"S={s} us" for s in FIXED)
        + " | best fixed | SDPA us | SDPA / plan |",
        "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(FIXED) + "---|---|---|",
    ]
    for r in res["rows"]:
        us = r["us"]
        plan_us, model_us = us[str(r["plan_splits"])], us[str(r["model_splits"])]
        fixed = {s: us[str(s)] for s in FIXED}
        best = min(fixed, key=fixed.get)
        lines.append(
            f"| {r['heads']} | {r['batch']} | {r['ctx']} | {r['kv_mb']:.0f} | {r['waves']:.2f} | {r['config']} | "
            f"{r['plan_splits']} | {r['model_splits']} | {plan_us:.1f} | {model_us:.1f} | {model_us / plan_us:.3f}x | "
            + " | ".join(f"{t:.1f}" for t in fixed.values())
            + f" | S={best} | {us['sdpa']:.1f} | {us['sdpa'] / plan_us:.3f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = gluon_decode_device(4)
    res = {**device_header(device), "rounds": ROUNDS, "rows": []}
    for shape in SHAPES:
        add_row(res, bench_shape(*shape, device), markdown)
    save_results(result_stem(args.out, "decode_many_waves", device.name), res, markdown)


if __name__ == "__main__":
    main()

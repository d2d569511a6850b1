"""The FP8 GEMV's tiles (kernels/ops/fp8_linear.py, `Fp8GemvConfig`) against torch._scaled_mm over the four
projections of a Llama 2 7B layer (q/k/v fused 12288 x 4096, o 4096 x 4096, gate/up 22016 x 4096, down
4096 x 11008) at 1, 16 and 64 rows of fp16 x. Each time is a CUDA-graph replay over enough weight copies to
defeat the L2 and includes the row quantization both paths run; the layer column sums the four projections.

    python -m benchmarks.fp8_gemv_tune [--out DIR]

Writes fp8_gemv_tune_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import torch

from benchmarks.gpu_timing import graph_time_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}
ROWS = (1, 16, 64)
L2_DEFEAT_BYTES = 200e6
CANDIDATES = [  # block_n, block_k, num_warps, num_stages, waves
    (128, 128, 4, 4, 2), (64, 128, 4, 4, 4), (64, 256, 4, 3, 2), (64, 256, 4, 3, 4), (32, 256, 4, 3, 8),
    (64, 512, 4, 2, 2), (32, 512, 4, 2, 2), (32, 512, 4, 2, 4), (32, 512, 4, 3, 2), (32, 1024, 4, 2, 2),
]  # fmt: skip


def run() -> list[dict]:
    from vlchat.kernels.ops.fp8_linear import Fp8GemvConfig, fp8_gemv, fp8_scaled_mm, quantize_weight

    rows_out = []
    for name, (n, k) in SHAPES.items():
        weights = [quantize_weight(torch.randn(n, k, device="cuda") * 0.02)
                   for _ in range(max(2, int(L2_DEFEAT_BYTES // (n * k))))]  # fmt: skip
        for rows in ROWS:
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
            row = {"shape": name, "n": n, "k": k, "rows": rows,
                   "scaled_mm_us": graph_time_us([lambda w=w, x=x: fp8_scaled_mm(x, *w) for w in weights])}  # fmt: skip
            for fields in CANDIDATES:
                cfg = Fp8GemvConfig(*fields)
                row["/".join(map(str, fields))] = graph_time_us(
                    [lambda w=w, x=x, cfg=cfg: fp8_gemv(x, *w, config=cfg) for w in weights])  # fmt: skip
            rows_out.append(row)
            print(name, rows, {key: round(v, 1) for key, v in row.items() if isinstance(v, float)}, flush=True)
        del weights
        torch.cuda.empty_cache()
    return rows_out


def markdown(res: dict) -> str:
    keys = ["scaled_mm_us"] + ["/".join(map(str, f)) for f in res["candidates"]]
    lines = [f"# FP8 GEMV tiles (Llama 2 7B layer) on {res['device']}", "",
             f"{versions_line(res)}; us per layer (q/k/v + o + gate/up + down), fp16 x, CUDA-graph replays, L2 "
             "defeated; columns: torch._scaled_mm, then the GEMV at block_n/block_k/num_warps/num_stages/waves "
             "(benchmarks/fp8_gemv_tune.py).", "",
             "| rows | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]  # fmt: skip
    for count in sorted({r["rows"] for r in res["rows"]}):
        mine = [r for r in res["rows"] if r["rows"] == count]
        lines.append(f"| {count} | " + " | ".join(f"{sum(r[k] for r in mine):.1f}" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from vlchat.kernels.device import get_device_info

    args = results_parser(__doc__).parse_args()
    device = get_device_info()
    res = {**device_header(device), "candidates": CANDIDATES, "rows": run()}
    save_results(result_stem(args.out, "fp8_gemv_tune", device.name), res, markdown)
    print(markdown(res))


if __name__ == "__main__":
    main()

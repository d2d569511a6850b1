"""The one-row projections of a batch-1 decode step: the Triton GEMV against cuBLAS and the read floor.

    python -m benchmarks.gemv [--out DIR]

For each weight matrix of a Llama 1B and a Llama 2 7B layer (and their LM heads), bf16, one row of x:

- cuBLAS: torch's F.linear, back to back;
- GEMV: kernels/ops/linear.py's kernel at its tile rule (gemv_config), back to back, with programmatic dependent
  launch where the arch has it (each call's first weight tile loads while the call before it runs);
- best tile: the fastest of a sweep of rows per program x columns per step, and its time;
- after RMSNorm: pairs of (RMSNorm of x, then the projection), as the engine runs q/k/v and gate/up, with
  cuBLAS and with the GEMV (the RMSNorm lets the GEMV launch at its start);
- read floor: a kernel that only reads the same bytes (gpu_timing.read_floor_us).

Every time is a CUDA-graph replay over enough weight copies to defeat the L2 (graph_time_us). Writes
gemv_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.gpu_timing import graph_time_us, read_floor_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention.pdl import dependent_launch
from vlchat.kernels.device import get_device_info
from vlchat.kernels.ops.linear import GemvConfig, gemv, gemv_config
from vlchat.kernels.ops.rms_norm import rms_norm_triton

SHAPES = {  # name: (N, K) of W
    "1B q/k/v": (3072, 2048), "1B o": (2048, 2048), "1B gate/up": (16384, 2048), "1B down": (2048, 8192),
    "1B head": (32000, 2048), "7B q/k/v": (12288, 4096), "7B o": (4096, 4096), "7B gate/up": (22016, 4096),
    "7B down": (4096, 11008),
}  # fmt: skip
SWEEP = [GemvConfig(n, k, 4 if n * k >= 4096 else 2) for n in (1, 2, 4, 8, 16) for k in (512, 1024, 2048)]
L2_DEFEAT_BYTES = 400e6


def bench_shape(name: str, n: int, k: int, pdl: bool) -> dict:
    dtype = torch.bfloat16
    sets = max(2, int(L2_DEFEAT_BYTES // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=dtype) for _ in range(sets)]
    x = torch.randn(1, k, device="cuda", dtype=dtype)
    norm_w = torch.ones(k, device="cuda", dtype=dtype)
    want = F.linear(x.double(), ws[0].double())
    err = ((gemv(x, ws[0]).double() - want).abs().max() / want.abs().max()).item()
    row = {"shape": name, "n": n, "k": k, "mb": n * k * 2 / 2**20, "config": str(gemv_config(n, k)), "rel_err": err}
    row["cublas_us"] = graph_time_us([lambda w=w: F.linear(x, w) for w in ws])
    row["gemv_us"] = graph_time_us([lambda w=w: gemv(x, w) for w in ws])
    sweep = {str(c): graph_time_us([lambda w=w, c=c: gemv(x, w, config=c) for w in ws]) for c in SWEEP}
    row["best_config"] = min(sweep, key=sweep.get)
    row["best_us"] = sweep[row["best_config"]]
    row["sweep_us"] = sweep
    row["norm_cublas_us"] = graph_time_us([lambda w=w: F.linear(rms_norm_triton(x, norm_w, 1e-5), w) for w in ws])
    row["norm_gemv_us"] = graph_time_us([lambda w=w: gemv(rms_norm_triton(x, norm_w, 1e-5), w) for w in ws])
    row["read_floor_us"] = read_floor_us(n * k, sets, pdl)
    return row


def markdown(res: dict) -> str:
    lines = [
        f"# One-row projections (batch-1 decode) on {res['device']}", "",
        f"{versions_line(res)}; programmatic dependent launch: {res['pdl']}. bf16, x one row; CUDA-graph replays of "
        "back-to-back calls, L2 defeated (benchmarks/gemv.py says what each column runs).", "",
        "| W | MB | cuBLAS us | GEMV us | GEMV vs cuBLAS | best tile us | GEMV / best | RMSNorm + cuBLAS us "
        "| RMSNorm + GEMV us | pair speedup | read floor us | GEMV of floor rate | cuBLAS of floor rate | rel err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        lines.append(
            f"| {r['shape']} ({r['n']}x{r['k']}) | {r['mb']:.0f} | {r['cublas_us']:.2f} | {r['gemv_us']:.2f} | "
            f"{r['cublas_us'] / r['gemv_us']:.2f}x | {r['best_us']:.2f} ({r['best_config']}) | "
            f"{r['gemv_us'] / r['best_us']:.2f} | {r['norm_cublas_us']:.2f} | {r['norm_gemv_us']:.2f} | "
            f"{r['norm_cublas_us'] / r['norm_gemv_us']:.2f}x | {r['read_floor_us']:.2f} | "
            f"{r['read_floor_us'] / r['gemv_us']:.2f} | {r['read_floor_us'] / r['cublas_us']:.2f} | "
            f"{r['rel_err']:.1e} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = get_device_info()
    pdl = dependent_launch(device)
    res = {**device_header(device), "pdl": pdl, "rows": []}
    for name, (n, k) in SHAPES.items():
        row = bench_shape(name, n, k, pdl)
        res["rows"].append(row)
        print(f"{name}: cuBLAS {row['cublas_us']:.2f} us, GEMV {row['gemv_us']:.2f}", flush=True)
        torch.cuda.empty_cache()
    save_results(result_stem(args.out, "gemv", device.name), res, markdown)


if __name__ == "__main__":
    main()

"""The FP8 GEMV's tiles (kernels/ops/fp8_linear.py, `Fp8GemvConfig`) against torch._scaled_mm over the four
projections of a Llama 2 7B layer (q/k/v fused 12288 x 4096, o 4096 x 4096, gate/up 22016 x 4096, down
4096 x 11008) at 1, 16, 64 and 128 rows of fp16 x, each row count with its own candidates (the table's bucket
entries: FP8_GEMV up to 16 rows, FP8_GEMV_MID up to 64, FP8_GEMV_WIDE up to 128). Each time is a CUDA-graph
replay over enough weight copies to defeat the L2 and includes the row quantization both paths run; the layer
column sums the four projections. The picks: per bucket the fastest candidate over the layer, and the most rows
(16, 64 or 128) up to which the picked GEMV still beats _scaled_mm (`fp8_linear.GEMV_ROWS`).

    python -m benchmarks.fp8_gemv_tune [--out DIR] [--serve SERVING_ARGS...]

Writes fp8_gemv_tune_<device>.json and .md under --out and prints the table and the picks. With --serve the picks
are put into this process's fp8_linear and benchmarks/serving.py runs with the arguments after --serve (the way
to see the picked tiles in an engine before they are committed to the table).
"""

from __future__ import annotations

import sys

import torch

from benchmarks.gpu_timing import graph_time_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}
L2_DEFEAT_BYTES = 200e6
# per row count, the candidates: block_n, block_k, num_warps, num_stages, waves
CANDIDATES = {
    1: [(32, 512, 4, 2, 4), (32, 512, 4, 3, 2), (64, 256, 4, 3, 2)],
    16: [(32, 512, 4, 2, 4), (32, 512, 4, 3, 2), (64, 256, 4, 3, 2)],
    64: [(64, 256, 4, 3, 2), (64, 128, 4, 4, 2), (32, 512, 4, 2, 4), (64, 256, 4, 3, 1), (128, 128, 8, 3, 1)],
    128: [(128, 128, 8, 3, 2), (64, 128, 4, 4, 1), (64, 128, 4, 4, 2), (64, 256, 4, 3, 1), (64, 256, 8, 3, 1),
          (128, 128, 8, 3, 1), (128, 128, 4, 4, 1), (128, 256, 8, 3, 1), (32, 256, 4, 3, 2), (32, 512, 4, 2, 2),
          (256, 128, 8, 3, 1), (256, 128, 8, 4, 1)],
}  # fmt: skip
BUCKETS = {16: "FP8_GEMV", 64: "FP8_GEMV_MID", 128: "FP8_GEMV_WIDE"}  # largest rows of a bucket -> table entry


def key(fields) -> str:
    return "/".join(map(str, fields))


def run() -> list[dict]:
    from vlchat.kernels.ops.fp8_linear import Fp8GemvConfig, fp8_gemv, fp8_scaled_mm, quantize_weight

    rows_out = []
    for name, (n, k) in SHAPES.items():
        weights = [quantize_weight(torch.randn(n, k, device="cuda") * 0.02)
                   for _ in range(max(2, int(L2_DEFEAT_BYTES // (n * k))))]  # fmt: skip
        for rows, candidates in CANDIDATES.items():
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
            row = {"shape": name, "n": n, "k": k, "rows": rows,
                   "scaled_mm_us": graph_time_us([lambda w=w, x=x: fp8_scaled_mm(x, *w) for w in weights])}  # fmt: skip
            for fields in candidates:
                cfg = Fp8GemvConfig(*fields)
                calls = [lambda w=w, x=x, cfg=cfg: fp8_gemv(x, *w, config=cfg) for w in weights]
                try:
                    row[key(fields)] = graph_time_us(calls)
                except Exception as e:  # noqa: BLE001 - a tile that does not fit (shared memory) is skipped, not fatal
                    print(f"{name} {rows} {key(fields)}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    row[key(fields)] = float("inf")
            rows_out.append(row)
            print(name, rows, {k_: round(v, 1) for k_, v in row.items() if isinstance(v, float)}, flush=True)
        del weights
        torch.cuda.empty_cache()
    return rows_out


def layer_us(rows: list[dict], count: int) -> dict[str, float]:
    """Per column (scaled_mm_us and each candidate), the four projections' time summed at `count` rows."""
    mine = [r for r in rows if r["rows"] == count]
    return {k: sum(r[k] for r in mine) for k in ["scaled_mm_us"] + [key(f) for f in CANDIDATES[count]]}


def pick(rows: list[dict]) -> dict:
    """The fastest candidate per bucket (over the bucket's largest row count) and GEMV_ROWS: the largest bucket
    whose pick beats _scaled_mm there (16 at least: one row is where the GEMV is for)."""
    picks, gemv_rows, previous = {}, 16, 16
    for count, entry in BUCKETS.items():
        layer = layer_us(rows, count)
        best = min((k for k in layer if k != "scaled_mm_us"), key=layer.get)
        picks[entry] = [int(v) for v in best.split("/")]
        if count > 16 and gemv_rows == previous and layer[best] < layer["scaled_mm_us"]:
            gemv_rows = count
        previous = count
    return {**picks, "GEMV_ROWS": gemv_rows}


def markdown(res: dict) -> str:
    lines = [f"# FP8 GEMV tiles (Llama 2 7B layer) on {res['device']}", "",
             f"{versions_line(res)}; us per layer (q/k/v + o + gate/up + down), fp16 x, CUDA-graph replays, L2 "
             "defeated; torch._scaled_mm, then the GEMV at block_n/block_k/num_warps/num_stages/waves "
             "(benchmarks/fp8_gemv_tune.py), fastest first.", "",
             "| rows | tiles | layer us | vs _scaled_mm |", "|---|---|---|---|"]  # fmt: skip
    for count in CANDIDATES:
        layer = layer_us(res["rows"], count)
        ref = layer["scaled_mm_us"]
        for k in sorted(layer, key=layer.get):
            if layer[k] == float("inf"):
                lines.append(f"| {count} | {k} | did not run | - |")
                continue
            lines.append(f"| {count} | {'_scaled_mm' if k == 'scaled_mm_us' else k} | {layer[k]:.1f} | "
                         f"{ref / layer[k]:.2f}x |")  # fmt: skip
    lines += ["", "Picks: " + ", ".join(f"{k} = {v}" for k, v in res["picked"].items())]
    return "\n".join(lines) + "\n"


def apply(picked: dict) -> None:
    """Put the picks into this process's fp8_linear (its tables are read at every call)."""
    from vlchat.kernels.ops import fp8_linear

    for entry in BUCKETS.values():
        setattr(fp8_linear, entry, fp8_linear.Fp8GemvConfig(*picked[entry]))
    fp8_linear.GEMV_ROWS = picked["GEMV_ROWS"]


def main() -> None:
    from vlchat.kernels.device import get_device_info

    argv = sys.argv[1:]
    serve = argv[argv.index("--serve") + 1:] if "--serve" in argv else None
    args = results_parser(__doc__).parse_args(argv[: argv.index("--serve")] if serve is not None else argv)
    device = get_device_info()
    rows = run()
    res = {**device_header(device), "candidates": CANDIDATES, "rows": rows, "picked": pick(rows)}
    save_results(result_stem(args.out, "fp8_gemv_tune", device.name), res, markdown)
    print(markdown(res), flush=True)
    if serve is not None:
        from benchmarks import serving

        apply(res["picked"])
        serving.main(serve)


if __name__ == "__main__":
    main()

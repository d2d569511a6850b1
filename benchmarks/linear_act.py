"""The vision MLPs' fc1 with its activation on a GPU: cuBLAS's product followed by our QuickGELU kernel (what a
tower runs without a GEMM_ACT config), cuBLAS's product alone (the time the fused GEMM would have to match to
save the whole activation pass) and the fused GEMM (kernels/ops/linear_act.py) with the arch's config, or with
every config of a grid under --sweep (the candidates for GEMM_ACT), fastest first.

    python -m benchmarks.linear_act [--out DIR] [--sweep] [--smoke]

Shapes: CLIP ViT-L/336's fc1 (1024 -> 4096) over 8 and 32 images of 577 tokens, Qwen2-VL ViT's (1280 -> 5120)
over 8 images of 1024 tokens; bf16. Writes linear_act_<device>.json and .md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from benchmarks.vision_attention import time_ms
from vlchat.kernels.device import get_device_info
from vlchat.kernels.ops import linear_act as la
from vlchat.kernels.ops import quick_gelu

SHAPES = [("clip-l-336 fc1", 8 * 577, 1024, 4096), ("clip-l-336 fc1", 32 * 577, 1024, 4096),
          ("qwen2-vl fc1", 8 * 1024, 1280, 5120)]  # fmt: skip (name, rows, in, out)
SMOKE = [("tiny", 40, 64, 96)]
TILES = ((128, 128, 4), (128, 128, 8), (128, 256, 8), (64, 256, 4), (256, 128, 8), (64, 128, 4))  # (m, n, warps)
GRID = [la.GemmConfig(m, n, 64, st, w) for m, n, w in TILES for st in (3, 4)]
GRID += [la.GemmConfig(128, 256, 32, 4, 8), la.GemmConfig(128, 128, 128, 2, 8)]
SMOKE_GRID = [la.GemmConfig(16, 32, 32, 2, 4)]


def label(c: la.GemmConfig) -> str:
    return f"fused {c.block_m}x{c.block_n}x{c.block_k} s{c.stages} w{c.warps}"


def operands(rows, k, n, dtype, dev):
    x = torch.randn(rows, k, device=dev, dtype=dtype)
    w = (torch.randn(n, k, device=dev) / k**0.5).to(dtype)
    return x, w, torch.randn(n, device=dev, dtype=dtype)


def bench(name, rows, k, n, configs, dtype, dev) -> list[dict]:
    x, w, b = operands(rows, k, n, dtype, dev)
    flops = 2 * rows * k * n
    want = la.torch_act(F.linear(x.float(), w.float(), b.float()), "quick_gelu")
    base = {"shape": name, "rows": rows, "k": k, "n": n}
    timed = {"cublas+act": lambda: quick_gelu(F.linear(x, w, b)), "cublas": lambda: F.linear(x, w, b)}
    for c in configs:
        timed[label(c)] = lambda c=c: la.linear_act_triton(x, w, b, "quick_gelu", c)
    rows_out = []
    for kernel, call in timed.items():
        row = {**base, "kernel": kernel}
        try:
            got = call()
            row["rel_err"] = float((got.float() - want).norm() / want.norm())
            row["ms"] = time_ms(call, rep=100)
            row["tflops"] = flops / row["ms"] / 1e9
        except Exception as e:  # noqa: BLE001 - a config that cannot compile or fit is a result of the sweep
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        rows_out.append(row)
        print(f"{name} x{rows} {kernel}: {row.get('tflops', row.get('error'))}", flush=True)
    today = next(r["ms"] for r in rows_out if r["kernel"] == "cublas+act")
    for r in rows_out:
        if "ms" in r:
            r["speedup"] = today / r["ms"]
    return sorted(rows_out, key=lambda r: r.get("ms", float("inf")))


def markdown(res: dict) -> str:
    lines = [f"# fc1 + activation on {res['device']}", "", versions_line(res), "",
             f"{res['dtype']}, QuickGELU; `speedup` is over cuBLAS's product then our QuickGELU kernel (the unfused "
             f"path). Arch config: `{res['config']}`.", "",
             "| shape | rows | kernel | ms | TFLOP/s | speedup | rel err vs fp32 |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        got = (f"{r['ms']:.3f} | {r['tflops']:.0f} | {r['speedup']:.2f}x | {r['rel_err']:.1e}" if "ms" in r
               else f"- | - | - | {r['error']}")  # fmt: skip
        lines.append(f"| {r['shape']} | {r['rows']} | {r['kernel']} | {got} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = results_parser(__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check of the script)")
    parser.add_argument("--sweep", action="store_true", help="time the fused GEMM over a grid of tile configs")
    args = parser.parse_args()
    device = get_device_info()
    dev = "cuda" if device.is_cuda else "cpu"
    dtype = torch.bfloat16 if device.is_cuda else torch.float16
    config = la.GEMM_ACT.get(device.capability[0]) if device.capability else None
    configs = SMOKE_GRID if args.smoke else GRID if args.sweep else [config] if config else GRID[:4]
    rows = [r for shape in (SMOKE if args.smoke else SHAPES) for r in bench(*shape, configs, dtype, dev)]
    res = {**device_header(device), "dtype": str(dtype).removeprefix("torch."), "config": repr(config), "rows": rows}
    save_results(result_stem(args.out, "linear_act", device.name), res, markdown)
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()

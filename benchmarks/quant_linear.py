"""W4A16 projections of a Llama 2 7B layer against fp16 cuBLAS and the weight-read floor, and weight memory per format.

    python -m benchmarks.quant_linear [--out DIR] [--group 128]

For each projection of a 7B layer (q/k/v fused, o, gate/up fused, down) and each row count (1-16: the split-k GEMV
of decode steps; 128-4096: the tiled GEMM of prefill), fp16:

- fp16 us: torch's F.linear on the fp16 weight (cuBLAS);
- W4A16 us: kernels/ops/quant_linear.py at its per-arch tiles, group --group with zeros (GPTQ/AWQ asymmetric);
- read floor us: a kernel that only reads the W4A16 weight's bytes (codes, scales, zeros; gpu_timing.read_floor_us),
  and the fraction of that rate the W4A16 product reaches;
- layer rows: the four projections summed (the weight part of one decoder layer's step).

Times are CUDA-graph replays over enough weight copies to defeat the L2 (graph_time_us). The memory table gives
the weight bytes of the 7B and 13B shapes per format (decoder projections quantized; embeddings and head fp16).
Writes quant_linear_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.gpu_timing import graph_time_us, read_floor_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line

SHAPES = {"q/k/v": (12288, 4096), "o": (4096, 4096), "gate/up": (22016, 4096), "down": (4096, 11008)}  # (N, K)
ROWS = (1, 2, 4, 8, 16, 128, 512, 1024, 4096)
MODELS = {  # hidden, intermediate, layers, vocab (Llama 2, MHA)
    "7B": (4096, 11008, 32, 32000),
    "13B": (5120, 13824, 40, 32000),
}
FORMATS = ("fp16", "w4a16-g128", "w4a16-g128-sym", "w4a16-g64", "w4a16-g32")
L2_DEFEAT_BYTES = 400e6


def w4_bytes(n: int, k: int, group: int, zeros: bool = True) -> int:
    """Bytes the kernel reads for W [n, k]: 4-bit codes, fp16 scales and (asymmetric) uint8 zeros per group."""
    groups = k // group
    return n * k // 2 + groups * n * 2 + (groups * n if zeros else 0)


def format_bytes(n: int, k: int, fmt: str) -> int:
    if fmt == "fp16":
        return 2 * n * k
    group = int(fmt.split("-g")[1].split("-")[0])
    return w4_bytes(n, k, group, zeros=not fmt.endswith("-sym"))


def model_bytes(model: str, fmt: str) -> int:
    """Weight bytes of a Llama-shaped model: the decoder projections in `fmt`, embeddings and head in fp16."""
    hidden, inter, layers, vocab = MODELS[model]
    projections = [(3 * hidden, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]
    per_layer = sum(format_bytes(n, k, fmt) for n, k in projections) + 2 * 2 * hidden  # + two norms
    return layers * per_layer + 2 * 2 * vocab * hidden + 2 * hidden


def memory_table() -> list[dict]:
    return [{"model": m, "format": f, "gb": model_bytes(m, f) / 1e9} for m in MODELS for f in FORMATS]


def _random_w4(n: int, k: int, group: int):
    from vlchat.kernels.ops.quant_linear import pack_int4

    codes = torch.randint(0, 16, (k, n), device="cuda", dtype=torch.int32)
    qweight = pack_int4(codes)
    scales = (torch.rand(k // group, n, device="cuda") * 0.01).half()
    zeros = torch.randint(0, 16, (k // group, n), device="cuda", dtype=torch.uint8)
    return qweight, scales, zeros


def bench_shape(name: str, n: int, k: int, group: int) -> list[dict]:
    from vlchat.kernels.ops.quant_linear import dequantize_w4, w4a16_triton

    quant_bytes = w4_bytes(n, k, group)
    sets = max(2, int(L2_DEFEAT_BYTES // quant_bytes))
    quant = [_random_w4(n, k, group) for _ in range(sets)]
    fp16_sets = max(2, int(L2_DEFEAT_BYTES // (2 * n * k)))
    dense = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(fp16_sets)]
    floor = read_floor_us(quant_bytes // 2, sets, pdl=False)
    rows_out = []
    for rows in ROWS:
        x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        want = F.linear(x.float(), dequantize_w4(*quant[0], None, group, torch.float16).float())
        err = ((w4a16_triton(x, *quant[0], None, group).float() - want).abs().max() / want.abs().max()).item()
        fp16_us = graph_time_us([lambda w=w, x=x: F.linear(x, w) for w in dense])
        w4_us = graph_time_us([lambda q=q, x=x: w4a16_triton(x, *q, None, group) for q in quant])
        row = {"shape": name, "n": n, "k": k, "rows": rows, "fp16_us": fp16_us, "w4_us": w4_us,
               "read_floor_us": floor, "quant_mb": quant_bytes / 2**20, "rel_err": err}  # fmt: skip
        rows_out.append(row)
        print(f"{name} rows {rows}: fp16 {fp16_us:.2f} us, W4A16 {w4_us:.2f} us, floor {floor:.2f} us", flush=True)
    del quant, dense
    torch.cuda.empty_cache()
    return rows_out


def layer_rows(rows: list[dict]) -> list[dict]:
    """The four projections of one layer summed, per row count."""
    out = []
    for count in sorted({r["rows"] for r in rows}):
        mine = [r for r in rows if r["rows"] == count]
        out.append({"rows": count, **{key: sum(r[key] for r in mine) for key in ("fp16_us", "w4_us", "read_floor_us")}})
    return out


def markdown(res: dict) -> str:
    lines = [
        f"# W4A16 projections (Llama 2 7B layer) on {res['device']}", "",
        f"{versions_line(res)}; fp16 activations, group {res['group']} with zeros; CUDA-graph replays, L2 defeated "
        "(benchmarks/quant_linear.py says what each column runs).", "",
        "## One layer's projections (q/k/v + o + gate/up + down)", "",
        "| rows | fp16 us | W4A16 us | W4A16 vs fp16 | read floor us | W4A16 of floor rate |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in layer_rows(res["rows"]):
        lines.append(f"| {r['rows']} | {r['fp16_us']:.1f} | {r['w4_us']:.1f} | {r['fp16_us'] / r['w4_us']:.2f}x | "
                     f"{r['read_floor_us']:.1f} | {r['read_floor_us'] / r['w4_us']:.2f} |")  # fmt: skip
    lines += ["", "## Weight memory", "", "| model | " + " | ".join(FORMATS) + " |",
              "|---|" + "---|" * len(FORMATS)]  # fmt: skip
    for model in MODELS:
        cells = [next(m["gb"] for m in res["memory"] if m["model"] == model and m["format"] == f) for f in FORMATS]
        lines.append(f"| {model} | " + " | ".join(f"{gb:.2f} GB" for gb in cells) + " |")
    lines += ["", "## Per projection", "",
              "| W | rows | MB (W4A16) | fp16 us | W4A16 us | W4A16 vs fp16 | read floor us | of floor rate "
              "| rel err |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        lines.append(
            f"| {r['shape']} ({r['n']}x{r['k']}) | {r['rows']} | {r['quant_mb']:.1f} | {r['fp16_us']:.2f} | "
            f"{r['w4_us']:.2f} | {r['fp16_us'] / r['w4_us']:.2f}x | {r['read_floor_us']:.2f} | "
            f"{r['read_floor_us'] / r['w4_us']:.2f} | {r['rel_err']:.1e} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    from vlchat.kernels.device import get_device_info

    parser = results_parser(__doc__)
    parser.add_argument("--group", type=int, default=128, choices=(32, 64, 128))
    args = parser.parse_args()
    device = get_device_info()
    res = {**device_header(device), "group": args.group, "memory": memory_table(), "rows": []}
    for name, (n, k) in SHAPES.items():
        res["rows"] += bench_shape(name, n, k, args.group)
    save_results(result_stem(args.out, "quant_linear", device.name), res, markdown)


if __name__ == "__main__":
    main()

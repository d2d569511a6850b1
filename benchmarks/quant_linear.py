"""W4A16 projections of a Llama 2 7B layer against fp16 cuBLAS and the weight-read floor, and weight memory per format.

    python -m benchmarks.quant_linear [--out DIR] [--group 128]

For each projection of a 7B layer (q/k/v fused, o, gate/up fused, down) and each row count (1-16: the split-k GEMV
of decode steps; 128-4096: the tiled GEMM of prefill), fp16:

- fp16 us: torch's F.linear on the fp16 weight (cuBLAS);
- W4A16 us: kernels/ops/quant_linear.py at its per-arch tiles, group --group with zeros (GPTQ/AWQ asymmetric);
- read floor us: a kernel that only reads the W4A16 weight's bytes (codes, scales, zeros; gpu_timing.read_floor_us),
  and the fraction of that rate the W4A16 product reaches;
- best tile us: for decode rows (SWEEP_ROWS), the fastest of a sweep of GEMV tiles, stages and split counts
  (the per-arch table's candidates), and which;
- FP8 us: kernels/ops/fp8_linear.py (per-token FP8 activations, torch._scaled_mm) where the GPU has FP8 tensor
  cores (sm_89+), else "-";
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
FORMATS = ("fp16", "w4a16-g128", "w4a16-g128-sym", "w4a16-g64", "w4a16-g32", "fp8")
L2_DEFEAT_BYTES = 400e6
SWEEP_ROWS = (1, 16)


def w4_bytes(n: int, k: int, group: int, zeros: bool = True) -> int:
    """Bytes the kernel reads for W [n, k]: 4-bit codes, fp16 scales and (asymmetric) uint8 zeros per group."""
    groups = k // group
    return n * k // 2 + groups * n * 2 + (groups * n if zeros else 0)


def format_bytes(n: int, k: int, fmt: str) -> int:
    if fmt == "fp16":
        return 2 * n * k
    if fmt == "fp8":
        return n * k + 4 * n  # e4m3 weights, one fp32 scale per row
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


def sweep_configs(group: int) -> list:
    from vlchat.kernels.ops.quant_linear import W4Config

    tiles = [(bn, min(bk, group), stages) for bn in (32, 64, 128) for bk in (64, 128) for stages in (2, 4)]
    return [W4Config(16, bn, bk, 4, stages) for bn, bk, stages in dict.fromkeys(tiles)]


def sweep(x, quant, group: int, n: int, k: int) -> tuple[float, str]:
    """(us, description) of the fastest GEMV tile and split count for x's rows."""
    from triton.runtime.errors import OutOfResources

    from vlchat.kernels.device import get_device_info
    from vlchat.kernels.ops.quant_linear import arch_configs, split_count, w4a16_triton

    device = get_device_info()
    times = {}
    for cfg in sweep_configs(group):
        rule = split_count(n, k, cfg, device.sm_count, arch_configs(device).waves)
        for splits in sorted({max(1, rule // 2), rule, 2 * rule}):
            calls = [lambda q=q, c=cfg, s=splits: w4a16_triton(x, *q, None, group, config=c, splits=s) for q in quant]
            try:
                times[f"{cfg.block_n}x{cfg.block_k}/{cfg.num_stages}st/{splits}sp"] = graph_time_us(calls)
            except OutOfResources:  # a tile whose stages exceed this GPU's shared memory is not a candidate
                torch.cuda.synchronize()
                break
    best = min(times, key=times.get)
    return times[best], best


def _fp8_sets(n: int, k: int):
    from vlchat.kernels import dispatch
    from vlchat.kernels.device import get_device_info
    from vlchat.kernels.ops.fp8_linear import OP, quantize_weight

    if dispatch.choose(OP, torch.float16, get_device_info()) != "triton":
        return []
    sets = max(2, int(L2_DEFEAT_BYTES // (n * k)))
    return [quantize_weight(torch.randn(n, k, device="cuda") * 0.02) for _ in range(sets)]


def bench_shape(name: str, n: int, k: int, group: int) -> list[dict]:
    from vlchat.kernels.ops.fp8_linear import fp8_scaled_mm
    from vlchat.kernels.ops.quant_linear import dequantize_w4, w4a16_triton

    quant_bytes = w4_bytes(n, k, group)
    sets = max(2, int(L2_DEFEAT_BYTES // quant_bytes))
    quant = [_random_w4(n, k, group) for _ in range(sets)]
    fp16_sets = max(2, int(L2_DEFEAT_BYTES // (2 * n * k)))
    dense = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(fp16_sets)]
    fp8 = _fp8_sets(n, k)
    floor = read_floor_us(quant_bytes // 2, sets, pdl=False)
    rows_out = []
    for rows in ROWS:
        x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        want = F.linear(x.float(), dequantize_w4(*quant[0], None, group, torch.float16).float())
        err = ((w4a16_triton(x, *quant[0], None, group).float() - want).abs().max() / want.abs().max()).item()
        fp16_us = graph_time_us([lambda w=w, x=x: F.linear(x, w) for w in dense])
        w4_us = graph_time_us([lambda q=q, x=x: w4a16_triton(x, *q, None, group) for q in quant])
        fp8_us = graph_time_us([lambda w=w, x=x: fp8_scaled_mm(x, *w) for w in fp8]) if fp8 else None
        best_us, best = sweep(x, quant, group, n, k) if rows in SWEEP_ROWS else (None, None)
        row = {"shape": name, "n": n, "k": k, "rows": rows, "fp16_us": fp16_us, "w4_us": w4_us,
               "best_us": best_us, "best_config": best, "fp8_us": fp8_us,
               "read_floor_us": floor, "quant_mb": quant_bytes / 2**20, "rel_err": err}  # fmt: skip
        rows_out.append(row)
        print(f"{name} rows {rows}: fp16 {fp16_us:.2f} us, W4A16 {w4_us:.2f} us, floor {floor:.2f} us", flush=True)
    del quant, dense, fp8
    torch.cuda.empty_cache()
    return rows_out


def layer_rows(rows: list[dict]) -> list[dict]:
    """The four projections of one layer summed, per row count."""
    out = []
    for count in sorted({r["rows"] for r in rows}):
        mine = [r for r in rows if r["rows"] == count]
        sums = {key: sum(r[key] for r in mine) for key in ("fp16_us", "w4_us", "read_floor_us")}
        sums["fp8_us"] = sum(r["fp8_us"] for r in mine) if all(r.get("fp8_us") for r in mine) else None
        out.append({"rows": count, **sums})
    return out


def _us(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(base, value) -> str:
    return "-" if value is None else f"{base / value:.2f}x"


def markdown(res: dict) -> str:
    lines = [
        f"# W4A16 projections (Llama 2 7B layer) on {res['device']}", "",
        f"{versions_line(res)}; fp16 activations, group {res['group']} with zeros; CUDA-graph replays, L2 defeated "
        "(benchmarks/quant_linear.py says what each column runs).", "",
        "## One layer's projections (q/k/v + o + gate/up + down)", "",
        "| rows | fp16 us | W4A16 us | W4A16 vs fp16 | read floor us | W4A16 of floor rate | FP8 us | FP8 vs fp16 |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in layer_rows(res["rows"]):
        lines.append(f"| {r['rows']} | {r['fp16_us']:.1f} | {r['w4_us']:.1f} | {r['fp16_us'] / r['w4_us']:.2f}x | "
                     f"{r['read_floor_us']:.1f} | {r['read_floor_us'] / r['w4_us']:.2f} | {_us(r['fp8_us'], 1)} | "
                     f"{_ratio(r['fp16_us'], r['fp8_us'])} |")  # fmt: skip
    lines += ["", "## Weight memory", "", "| model | " + " | ".join(FORMATS) + " |",
              "|---|" + "---|" * len(FORMATS)]  # fmt: skip
    for model in MODELS:
        cells = [next(m["gb"] for m in res["memory"] if m["model"] == model and m["format"] == f) for f in FORMATS]
        lines.append(f"| {model} | " + " | ".join(f"{gb:.2f} GB" for gb in cells) + " |")
    lines += ["", "## Per projection", "",
              "| W | rows | MB (W4A16) | fp16 us | W4A16 us | W4A16 vs fp16 | read floor us | of floor rate "
              "| best tile us | FP8 us | rel err |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        best = f"{r['best_us']:.2f} ({r['best_config']})" if r.get("best_us") else "-"
        lines.append(
            f"| {r['shape']} ({r['n']}x{r['k']}) | {r['rows']} | {r['quant_mb']:.1f} | {r['fp16_us']:.2f} | "
            f"{r['w4_us']:.2f} | {r['fp16_us'] / r['w4_us']:.2f}x | {r['read_floor_us']:.2f} | "
            f"{r['read_floor_us'] / r['w4_us']:.2f} | {best} | {_us(r.get('fp8_us'), 2)} | {r['rel_err']:.1e} |"
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

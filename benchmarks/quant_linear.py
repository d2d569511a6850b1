"""W4A16 projections of a Llama 2 7B layer against fp16 cuBLAS and the weight-read floor, and weight memory per format.

    python -m benchmarks.quant_linear [--out DIR] [--group 128]

For each projection of a 7B layer (q/k/v fused, o, gate/up fused, down) and each row count (1-16: the split-k GEMV
of decode steps; 128-4096: the tiled GEMM of prefill), fp16:

- fp16 us: torch's F.linear on the fp16 weight (cuBLAS);
- W4A16 us: kernels/ops/quant_linear.py at its per-arch tiles, group --group with zeros (GPTQ/AWQ asymmetric);
- read floor us: a kernel that only reads the W4A16 weight's bytes (codes, scales, zeros; gpu_timing.read_floor_us),
  and the fraction of that rate the W4A16 product reaches;
- FP8 us: kernels/ops/fp8_linear.py as the engine runs it (per-token FP8 activations; the FP8 GEMV up to GEMV_ROWS,
  torch._scaled_mm above) where the GPU has FP8 tensor cores (sm_89+), else "-"; FP8 floor us: reading the FP8
  weight's bytes, and the fraction of that rate FP8 reaches; FP8 GEMV / _scaled_mm us: each of the two alone
  (the GEMV up to its 128 rows), which places fp8_linear.GEMV_ROWS; W4A16 GEMV-dot us: at 17-64 rows, the
  W4A16 split-k GEMV's tl.dot path (the engine runs the tiled GEMM there), which would place GEMV_MAX_ROWS;
- layer rows: the four projections summed (the weight part of one decoder layer's step).

Times are CUDA-graph replays over enough weight copies to defeat the L2 (graph_time_us). The memory table gives
the weight bytes of the 7B and 13B shapes per format (decoder projections quantized; embeddings and head fp16).
Writes quant_linear_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
import triton

from benchmarks.gpu_timing import graph_time_us, read_floor_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line

SHAPES = {"q/k/v": (12288, 4096), "o": (4096, 4096), "gate/up": (22016, 4096), "down": (4096, 11008)}  # (N, K)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 512, 4096)
MODELS = {  # hidden, intermediate, layers, vocab (Llama 2, MHA)
    "7B": (4096, 11008, 32, 32000),
    "13B": (5120, 13824, 40, 32000),
}
FORMATS = ("fp16", "w4a16-g128", "w4a16-g128-sym", "w4a16-g64", "w4a16-g32", "fp8")
L2_DEFEAT_BYTES = 400e6


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


# GEMV candidates per product: (block_n, block_k, num_warps); the sweep times each at WAVES. The CUDA-core kernel
# needs no layout conversion where 32 lanes x 4 columns x the warps along N cover block_n and the other warps take
# the 4 word rows of its [1, A, 4, block_n] tile: 128/4, 256/8, 64/2 (at any block_k) and 128x64/4.
# tl.dot makes its codes in the operand registers (no shared-memory round trip) from 4 warps on sm_90 (wgmma).
# pairs (up to PAIRS_MAX_ROWS fp16 rows): block_k // 8 word rows of 4 columns a thread; kept to rows x block_k <= 128
# (x's pairs and the sums per row in registers), where sm_90 compiles them without spilling.
GEMV_CANDIDATES = {
    "fma": ((128, 64, 4), (256, 64, 8), (128, 128, 4), (256, 64, 4), (512, 64, 8), (128, 64, 2), (256, 128, 4),
            (64, 128, 1), (256, 128, 8), (64, 64, 2)),
    "dot": ((64, 64, 2), (64, 128, 4), (128, 64, 4), (128, 128, 4), (128, 128, 8), (256, 64, 4), (256, 128, 8)),
    "tf32": ((64, 64, 2), (64, 128, 4), (128, 64, 4), (128, 128, 4)),
    "pairs": ((512, 64, 4), (256, 64, 2), (1024, 64, 8), (512, 32, 4), (256, 128, 4), (512, 128, 8), (256, 64, 4),
              (256, 32, 2), (512, 16, 4), (256, 16, 2)),
}  # fmt: skip
WAVES = (2, 4, 8, 16)
PAIRS_WAVES = (1, 2, 4, 8)  # the pairs tiles are wide: fewer column tiles, so more K slices at the same waves
SWEEP_ROWS = (1, 2, 4, 8, 16)
FMA_VALUES = 256  # products a thread holds per step (rows x its codes) beyond which CUDA-core tiles spill


def sweep_configs(group: int, rows: int, ranked: dict | None = None) -> list:
    """W4GemvConfigs to time at `rows`: every candidate at 1 and 16 rows (CUDA cores only up to 4 rows), else the
    two fastest of each product at one row (`ranked`: product -> tiles, fastest first) that fit FMA_VALUES."""
    from vlchat.kernels.ops.quant_linear import PAIRS_MAX_ROWS, W4GemvConfig

    products = ("fma", "dot", "tf32") if rows <= 4 else ("dot", "tf32")
    products += ("pairs",) if rows <= PAIRS_MAX_ROWS else ()
    configs = []
    for product in products:
        tiles = GEMV_CANDIDATES[product] if ranked is None or rows == 16 or product == "pairs" else ranked[product]
        if product == "fma":
            tiles = [(bn, bk, w) for bn, bk, w in tiles if rows * bn * min(bk, group) // (32 * w) <= FMA_VALUES]
        if product == "pairs":
            tiles = [(bn, bk, w) for bn, bk, w in tiles if rows * min(bk, group) <= 128]
        for bn, bk, warps in tiles[: len(tiles) if ranked is None or rows == 16 or product == "pairs" else 2]:
            configs += [W4GemvConfig(bn, min(bk, group), warps, waves, product in ("dot", "tf32"), product == "tf32",
                                     product == "pairs")
                        for waves in (PAIRS_WAVES if product == "pairs" else WAVES)]  # fmt: skip
    return list(dict.fromkeys(configs))


def config_name(cfg) -> str:
    product = ("tf32" if cfg.tf32 else "dot") if cfg.dot else ("pairs" if cfg.pairs else "fma")
    return f"{product} {cfg.block_n}x{cfg.block_k}/{cfg.num_warps}w/{cfg.waves}wv"


def sweep(x, quant, group: int, configs: list, want) -> dict:
    """config name -> (us, relative error) of each GEMV config for x's rows."""
    from triton.runtime.errors import OutOfResources

    from vlchat.kernels.ops.quant_linear import w4a16_triton

    times = {}
    for cfg in configs:
        try:
            got = w4a16_triton(x, *quant[0], None, group, config=cfg)
            err = ((got.float() - want).abs().max() / want.abs().max()).item()
            calls = [lambda q=q, c=cfg: w4a16_triton(x, *q, None, group, config=c) for q in quant]
            times[config_name(cfg)] = (graph_time_us(calls), err)
        except OutOfResources:  # more registers or shared memory than this GPU has: not a candidate
            torch.cuda.synchronize()
    return times


def run_sweep(group: int, sweep_rows=SWEEP_ROWS) -> dict:
    """The GEMV sweep over `sweep_rows` (the first must be 1) and the four projections; each config's layer sum
    (the four added)."""
    from vlchat.kernels.device import get_device_info
    from vlchat.kernels.ops.quant_linear import dequantize_w4, launch_config

    device = get_device_info()
    per_shape = {}  # (rows, config) -> {shape: (us, err)}
    floors = {}
    keep = None
    table = {}
    named = {}
    for rows in sweep_rows:
        for name, (n, k) in SHAPES.items():
            quant_bytes = w4_bytes(n, k, group)
            sets = max(2, int(L2_DEFEAT_BYTES // quant_bytes))
            torch.manual_seed(rows)
            quant = [_random_w4(n, k, group) for _ in range(sets)]
            if rows == 1:
                floors[name] = read_floor_us(quant_bytes // 2, sets, pdl=False)
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
            want = F.linear(x.float(), dequantize_w4(*quant[0], None, group, torch.float16).float())
            configs = sweep_configs(group, rows, keep)
            rule = launch_config(rows, group, False, device, torch.float16)
            configs = list(dict.fromkeys([rule, *configs]))
            table[rows] = config_name(rule)
            named.update({config_name(c): c for c in configs})
            for cfg_name, value in sweep(x, quant, group, configs, want).items():
                per_shape.setdefault((rows, cfg_name), {})[name] = value
            del quant
            torch.cuda.empty_cache()
        if rows == 1:
            sums = {c: sum(t for t, _ in v.values()) for (r, c), v in per_shape.items() if r == 1 and len(v) == 4}
            ranked = sorted(sums, key=sums.get)
            keep = {p: list(dict.fromkeys(_tiles(c) for c in ranked if c.startswith(p))) for p in GEMV_CANDIDATES}
        print(f"rows {rows} done", flush=True)
    out = []
    for (rows, cfg_name), shapes in per_shape.items():
        if len(shapes) == len(SHAPES):
            out.append({"rows": rows, "config": cfg_name, "table": cfg_name == table[rows],
                        "fields": dataclasses.asdict(named[cfg_name]),
                        "layer_us": sum(t for t, _ in shapes.values()), "max_err": max(e for _, e in shapes.values()),
                        "us": {s: t for s, (t, _) in shapes.items()}})  # fmt: skip
    return {"floor_us": floors, "layer_floor_us": sum(floors.values()), "rows": out}


def pick_gemv(rows: list[dict]) -> dict:
    """The GEMV entries of a table from a sweep's rows: the pairs config fastest over a layer at one row (None if
    none was swept), the other CUDA-core config fastest there (bf16 and g_idx rows), the tl.dot config fastest at
    16, and dot_rows: the fewest rows (of 1, 2, 4; else 8) at which the best tl.dot config measured beats the best
    CUDA-core one, and at most the row count whose row slots (a power of two) would hold more than FMA_VALUES
    products per thread in the CUDA-core tiles (they spill)."""
    best = {}
    for r in rows:
        fields = r["fields"]
        key = (r["rows"], "dot" if fields["dot"] else "pairs" if fields.get("pairs") else "cores")
        if key not in best or r["layer_us"] < best[key]["layer_us"]:
            best[key] = r
    dot_wins = [n for n in (1, 2, 4) if best[n, "dot"]["layer_us"] <= best[n, "cores"]["layer_us"]]
    cores = best[1, "cores"]["fields"]
    values = cores["block_n"] * cores["block_k"] // (32 * cores["num_warps"])  # products per thread and row slot
    spills = next(n for n in range(1, 18) if n > 16 or triton.next_power_of_2(n) * values > FMA_VALUES)
    dot_rows = min(dot_wins[0] if dot_wins else 8, spills)
    pairs = best.get((1, "pairs"))
    return {"gemv_cores": cores, "gemv_dot": best[16, "dot"]["fields"], "dot_rows": dot_rows,
            "gemv_pairs": pairs["fields"] if pairs else None}  # fmt: skip


def _tiles(name: str) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) back from config_name."""
    tiles, warps = name.split()[1].split("/")[:2]
    bn, bk = tiles.split("x")
    return int(bn), int(bk), int(warps.rstrip("w"))


def sweep_markdown(res: dict) -> str:
    lines = [
        f"# W4A16 GEMV sweep (Llama 2 7B layer, decode rows) on {res['device']}", "",
        f"{versions_line(res)}; fp16, group {res['group']} with zeros; each config's four projections summed "
        f"(CUDA-graph replays, L2 defeated; benchmarks/quant_linear.py --sweep). Layer read floor "
        f"{res['layer_floor_us']:.1f} us. `table` marks the per-arch table's choice; the five fastest per row count.",
        "", "| rows | config | layer us | of floor rate | q/k/v | o | gate/up | down | max rel err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for rows in SWEEP_ROWS:
        mine = sorted((r for r in res["rows"] if r["rows"] == rows), key=lambda r: r["layer_us"])
        shown = mine[:5] + [r for r in mine[5:] if r["table"]]
        for r in shown:
            us = " | ".join(f"{r['us'][s]:.2f}" for s in SHAPES)
            mark = " (table)" if r["table"] else ""
            lines.append(f"| {rows} | {r['config']}{mark} | {r['layer_us']:.1f} | "
                         f"{res['layer_floor_us'] / r['layer_us']:.2f} | {us} | {r['max_err']:.1e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _fp8_sets(n: int, k: int):
    from vlchat.kernels import dispatch
    from vlchat.kernels.device import get_device_info
    from vlchat.kernels.ops.fp8_linear import OP, quantize_weight

    if dispatch.choose(OP, torch.float16, get_device_info()) != "triton":
        return []
    sets = max(2, int(L2_DEFEAT_BYTES // (n * k)))
    return [quantize_weight(torch.randn(n, k, device="cuda") * 0.02) for _ in range(sets)]


def bench_shape(name: str, n: int, k: int, group: int) -> list[dict]:
    from vlchat.kernels.device import get_device_info
    from vlchat.kernels.ops.fp8_linear import MAX_GEMV_ROWS, fp8_gemv, fp8_scaled_mm, fp8_tensor_cores
    from vlchat.kernels.ops.quant_linear import GEMV_MAX_ROWS, arch_configs, dequantize_w4, w4a16_triton

    dot = dataclasses.replace(arch_configs(get_device_info()).gemv_dot, block_k=min(128, group))
    quant_bytes = w4_bytes(n, k, group)
    sets = max(2, int(L2_DEFEAT_BYTES // quant_bytes))
    quant = [_random_w4(n, k, group) for _ in range(sets)]
    fp16_sets = max(2, int(L2_DEFEAT_BYTES // (2 * n * k)))
    dense = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(fp16_sets)]
    fp8 = _fp8_sets(n, k)
    floor = read_floor_us(quant_bytes // 2, sets, pdl=False)
    fp8_floor = read_floor_us(n * k // 2, max(2, int(L2_DEFEAT_BYTES // (n * k))), pdl=False) if fp8 else None
    rows_out = []
    for rows in ROWS:
        x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        want = F.linear(x.float(), dequantize_w4(*quant[0], None, group, torch.float16).float())
        err = ((w4a16_triton(x, *quant[0], None, group).float() - want).abs().max() / want.abs().max()).item()
        fp16_us = graph_time_us([lambda w=w, x=x: F.linear(x, w) for w in dense])
        w4_us = graph_time_us([lambda q=q, x=x: w4a16_triton(x, *q, None, group) for q in quant])
        w4_dot_us = None  # the split-k GEMV's tl.dot path past its rows, where the engine runs the GEMM
        if GEMV_MAX_ROWS < rows <= 64:
            w4_dot_us = graph_time_us([lambda q=q, x=x: w4a16_triton(x, *q, None, group, config=dot) for q in quant])
        fp8_us = graph_time_us([lambda w=w, x=x: fp8_tensor_cores(x, *w) for w in fp8]) if fp8 else None
        fp8_gemv_us = fp8_mm_us = None
        if fp8 and rows <= MAX_GEMV_ROWS:
            fp8_gemv_us = graph_time_us([lambda w=w, x=x: fp8_gemv(x, *w) for w in fp8])
            fp8_mm_us = graph_time_us([lambda w=w, x=x: fp8_scaled_mm(x, *w) for w in fp8])
        row = {"shape": name, "n": n, "k": k, "rows": rows, "fp16_us": fp16_us, "w4_us": w4_us,
               "w4_dot_us": w4_dot_us, "fp8_us": fp8_us, "fp8_floor_us": fp8_floor, "fp8_gemv_us": fp8_gemv_us,
               "fp8_mm_us": fp8_mm_us,
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
        for key in ("w4_dot_us", "fp8_us", "fp8_floor_us", "fp8_gemv_us", "fp8_mm_us"):
            sums[key] = sum(r[key] for r in mine) if all(r.get(key) for r in mine) else None
        out.append({"rows": count, **sums})
    return out


def _us(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(base, value) -> str:
    return "-" if value is None else f"{base / value:.2f}x"


def _of(floor, value) -> str:
    return "-" if floor is None or value is None else f"{floor / value:.2f}"


def markdown(res: dict) -> str:
    lines = [
        f"# W4A16 projections (Llama 2 7B layer) on {res['device']}", "",
        f"{versions_line(res)}; fp16 activations, group {res['group']} with zeros; CUDA-graph replays, L2 defeated "
        "(benchmarks/quant_linear.py says what each column runs).", "",
        "## One layer's projections (q/k/v + o + gate/up + down)", "",
        "| rows | fp16 us | W4A16 us | W4A16 vs fp16 | read floor us | W4A16 of floor rate | FP8 us | FP8 vs fp16 "
        "| FP8 floor us | FP8 of floor rate | FP8 GEMV us | FP8 _scaled_mm us | W4A16 GEMV-dot us |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in layer_rows(res["rows"]):
        lines.append(f"| {r['rows']} | {r['fp16_us']:.1f} | {r['w4_us']:.1f} | {r['fp16_us'] / r['w4_us']:.2f}x | "
                     f"{r['read_floor_us']:.1f} | {r['read_floor_us'] / r['w4_us']:.2f} | {_us(r['fp8_us'], 1)} | "
                     f"{_ratio(r['fp16_us'], r['fp8_us'])} | {_us(r.get('fp8_floor_us'), 1)} | "
                     f"{_of(r.get('fp8_floor_us'), r['fp8_us'])} | {_us(r.get('fp8_gemv_us'), 1)} | "
                     f"{_us(r.get('fp8_mm_us'), 1)} | {_us(r.get('w4_dot_us'), 1)} |")  # fmt: skip
    lines += ["", "## Weight memory", "", "| model | " + " | ".join(FORMATS) + " |",
              "|---|" + "---|" * len(FORMATS)]  # fmt: skip
    for model in MODELS:
        cells = [next(m["gb"] for m in res["memory"] if m["model"] == model and m["format"] == f) for f in FORMATS]
        lines.append(f"| {model} | " + " | ".join(f"{gb:.2f} GB" for gb in cells) + " |")
    lines += ["", "## Per projection", "",
              "| W | rows | MB (W4A16) | fp16 us | W4A16 us | W4A16 vs fp16 | read floor us | of floor rate "
              "| FP8 us | rel err |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        lines.append(
            f"| {r['shape']} ({r['n']}x{r['k']}) | {r['rows']} | {r['quant_mb']:.1f} | {r['fp16_us']:.2f} | "
            f"{r['w4_us']:.2f} | {r['fp16_us'] / r['w4_us']:.2f}x | {r['read_floor_us']:.2f} | "
            f"{r['read_floor_us'] / r['w4_us']:.2f} | {_us(r.get('fp8_us'), 2)} | {r['rel_err']:.1e} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    from vlchat.kernels.device import get_device_info

    parser = results_parser(__doc__)
    parser.add_argument("--group", type=int, default=128, choices=(32, 64, 128))
    parser.add_argument("--sweep", action="store_true", help="only the GEMV sweep of decode rows")
    parser.add_argument("--sweep-rows", type=int, nargs="+", default=list(SWEEP_ROWS), help="its row counts (1 first)")
    args = parser.parse_args()
    device = get_device_info()
    if args.sweep:
        res = {**device_header(device), "group": args.group, **run_sweep(args.group, args.sweep_rows)}
        save_results(result_stem(args.out, "quant_linear_sweep", device.name), res, sweep_markdown)
        print(sweep_markdown(res))
        return
    res = {**device_header(device), "group": args.group, "memory": memory_table(), "rows": []}
    for name, (n, k) in SHAPES.items():
        res["rows"] += bench_shape(name, n, k, args.group)
    save_results(result_stem(args.out, "quant_linear", device.name), res, markdown)


if __name__ == "__main__":
    main()

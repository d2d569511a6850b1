"""The bandwidth-bound decode rows against what reading their bytes costs, and what the paged layout costs.

    python -m benchmarks.decode_bandwidth [--out DIR]

The attention grid's rows with the most KV (heads 32/32 and 32/8, head_dim 128, fp16 and bf16), where decode only
streams K/V and SDPA on contiguous K/V comes within a percent or two of our paged kernel. Each row, in the same
run, CUDA-graph replays of back-to-back calls (programmatic dependent launch where the arch has it) over enough KV
copies to defeat the L2:

- read floor: a kernel that only reads the row's K/V bytes, contiguous, and sums them (gpu_timing.read_floor_us:
  the best of its tiles): the ceiling any decode of these bytes is held to;
- SDPA on contiguous K/V [batch, kv_heads, L, head_dim];
- ours on shuffled pages of 16 tokens: the attention grid's layout, a cache whose blocks came back to the
  allocator in any order;
- ours on pages of 16 in order: each sequence's blocks consecutive, as the engine's block manager hands out a
  fresh prompt's;
- ours on pages of 16 as the engine's block manager hands them out after earlier traffic (`allocator_tables`):
  with blocks taken one at a time from its free lists ("free lists 16", the allocator before runs) and in runs
  ("runs 16", llm/engine/block_manager.py: RUN_BYTES of a layer's K cache per run; benchmarks/engine_pages.py);
- ours on pages of 64 in order (the largest block size the kernels take).

Ours is the plan (plan.decode_plan: config and split count) for each layout. SDPA and each of LAYOUTS are the
median of ROUNDS interleaved measurements; every time is also given as a fraction of the read floor's rate.

Then time against size: B=1 at LINE_CONTEXTS (MHA and GQA, fp16), the read floor, SDPA and ours on shuffled and
in-order 16-token pages, and per method the least-squares line through its times against the KV bytes. The slope
is the method's streaming rate, the intercept what it costs beyond streaming (launch, first loads, the last CTAs
alone, the split merge): which of the two a gap on the rows above comes from.
Writes decode_bandwidth_<device>.json and .md under --out and prints the tables.
"""

from __future__ import annotations

import statistics

import torch

from benchmarks.attention import HEAD_DIM, decode_calls, decode_inputs, sdpa_calls
from benchmarks.attention_report import config_name
from benchmarks.engine_pages import engine_pages
from benchmarks.gpu_timing import interleaved_us, read_floor_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import plan
from vlchat.kernels.attention.pdl import dependent_launch
from vlchat.kernels.device import get_device_info

SHAPES = [(32, 32, 1, 131072), (32, 32, 128, 2048), (32, 32, 128, 512), (32, 8, 128, 2048), (32, 8, 1, 131072)]
# name: (page, order): "shuffled", "in order", or the block manager's "free lists" (runs of one block) / "runs"
LAYOUTS = {"shuffled 16": (16, "shuffled"), "in order 16": (16, "in order"), "free lists 16": (16, "free lists"),
           "runs 16": (16, "runs"), "in order 64": (64, "in order")}  # fmt: skip
ROUNDS = 5
LINE_HEADS = [(32, 32), (32, 8)]
LINE_CONTEXTS = [16384, 32768, 65536, 131072, 262144]
LINE_LAYOUTS = ["shuffled 16", "in order 16"]


def layout_calls(dtype, q_heads, kv_heads, batch, ctx, page, order, device):
    """A decode call per L2-defeating copy on caches of `page`-token pages in `order` (LAYOUTS), at the plan's
    config and split count; with that plan's name, and what the peers take: the query, the copies' count and the
    KV bytes a call reads."""
    q, k_cache, v_cache, tables, lens, kv_bytes = decode_inputs(dtype, q_heads, kv_heads, batch, ctx, page=page)
    if order == "in order":
        tables = torch.arange(tables.numel(), device="cuda", dtype=torch.int32).view(tables.shape)
    elif order in ("free lists", "runs"):
        del k_cache, v_cache
        k_cache, v_cache, tables = engine_pages(dtype, kv_heads, batch, ctx, tables.shape[0], runs=order == "runs")
    splits, config = plan.decode_plan(q, k_cache, tables[0], device)
    calls = decode_calls(q, k_cache, v_cache, tables, lens, splits, torch.empty_like(q), config)
    return calls, f"{config_name(config, splits)} S={splits}", q, tables.shape[0], kv_bytes


def layout_times(dtype, q_heads, kv_heads, batch, ctx, layouts, device, pdl: bool):
    """ROUNDS interleaved measurements of each of `layouts`' decode (the plan) and of SDPA, then the read floor of the
    same bytes: (timings per method, each layout's plan, KV bytes, read floor us)."""
    calls, plans = {}, {}
    for name in layouts:
        page, order = LAYOUTS[name]
        calls[name], plans[name], q, sets, kv_bytes = layout_calls(
            dtype, q_heads, kv_heads, batch, ctx, page, order, device
        )
    calls["sdpa"] = sdpa_calls(q, kv_heads, ctx, sets)
    times = interleaved_us(calls, ROUNDS)
    del calls
    torch.cuda.empty_cache()
    return times, plans, kv_bytes, read_floor_us(kv_bytes // 2, sets, pdl)


def bench_row(dtype, q_heads, kv_heads, batch, ctx, device, pdl: bool) -> dict:
    times, plans, kv_bytes, floor = layout_times(dtype, q_heads, kv_heads, batch, ctx, LAYOUTS, device, pdl)
    return {"dtype": str(dtype).removeprefix("torch."), "q_heads": q_heads, "kv_heads": kv_heads, "batch": batch,
           "ctx": ctx, "kv_mb": kv_bytes / 2**20, "plans": plans, "rounds_us": times,
           "us": {name: statistics.median(t) for name, t in times.items()}, "read_floor_us": floor}  # fmt: skip


def line_points(q_heads, kv_heads, device, pdl: bool) -> list[dict]:
    """fp16 B=1 at each of LINE_CONTEXTS: the KV bytes and the median times of SDPA and ours (LINE_LAYOUTS, the
    plan), and the read floor's."""
    points = []
    for ctx in LINE_CONTEXTS:
        times, _, kv_bytes, floor = layout_times(torch.float16, q_heads, kv_heads, 1, ctx, LINE_LAYOUTS, device, pdl)
        us = {name: statistics.median(t) for name, t in times.items()}
        points.append({"ctx": ctx, "kv_gb": kv_bytes / 1e9, "us": {**us, "read floor": floor}})
    return points


def fit_line(xs, ys) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through the points."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def line_cells(points: list[dict], methods) -> dict[str, str]:
    """Per method, the table cells of its line through `points` ({"kv_gb", "us": {method: us}}) against the KV
    bytes: the rate in GB/s, its share of the "read floor" method's rate, the fixed cost in us."""
    gb = [p["kv_gb"] for p in points]
    fits = {m: fit_line(gb, [p["us"][m] for p in points]) for m in methods}
    floor_slope = fits["read floor"][0]
    return {
        m: f"{1e6 / slope:.0f} | {floor_slope / slope:.3f} | {intercept:.1f}" for m, (slope, intercept) in fits.items()
    }


def lines_markdown(res: dict) -> list[str]:
    """The time-against-size table: per heads and method, the streaming rate (GB/s, and its share of the read
    floor's) and the fixed cost (us)."""
    methods = ["read floor", "sdpa", *LINE_LAYOUTS]
    contexts = ", ".join(f"{c // 1024}k" for c in LINE_CONTEXTS)
    out = [
        "", "## Streaming rate and fixed cost", "",
        f"fp16, B=1, L = {contexts}; per method the least-squares line through its times (medians of "
        f"{res['rounds']} interleaved measurements; the read floor its best tile) against the KV bytes: the slope "
        "as a rate, the intercept as a fixed cost.", "",
        "| heads | method | GB/s | share of read floor rate | fixed cost us |", "|---|---|---|---|---|",
    ]  # fmt: skip
    for line in res["lines"]:
        cells = line_cells(line["points"], methods)
        for m in methods:
            name = "SDPA" if m == "sdpa" else m if m == "read floor" else f"ours, {m}"
            out.append(f"| {line['q_heads']}/{line['kv_heads']} | {name} | {cells[m]} |")
    return out


def markdown(res: dict) -> str:
    names = list(LAYOUTS)
    lines = [
        f"# Bandwidth-bound decode against the read floor on {res['device']}", "",
        f"{versions_line(res)}; programmatic dependent launch: {res['pdl']}. Head_dim {HEAD_DIM}; CUDA-graph "
        f"replays of back-to-back calls, L2 defeated; SDPA and ours the median of {res['rounds']} interleaved "
        "measurements (benchmarks/decode_bandwidth.py says what each column runs). Each time / its share of the "
        "read floor's rate; ours also against SDPA.", "",
        "| dtype | heads | B | L | KV MB | read floor us | SDPA us | "
        + " | ".join(f"ours, {n} (plan) us | vs SDPA" for n in names) + " |",
        "|" + "---|" * (7 + 2 * len(names)),
    ]  # fmt: skip
    for r in res["rows"]:
        us, floor = r["us"], r["read_floor_us"]
        cells = [f"{us['sdpa']:.1f} / {floor / us['sdpa']:.3f}"]
        for n in names:
            cells += [f"{us[n]:.1f} / {floor / us[n]:.3f} ({r['plans'][n]})", f"{us['sdpa'] / us[n]:.3f}x"]
        lines.append(
            f"| {r['dtype']} | {r['q_heads']}/{r['kv_heads']} | {r['batch']} | {r['ctx']} | {r['kv_mb']:.0f} | "
            f"{floor:.1f} | " + " | ".join(cells) + " |"
        )
    if res.get("lines"):
        lines += lines_markdown(res)
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = get_device_info()
    pdl = dependent_launch(device)
    res = {**device_header(device), "pdl": pdl, "rounds": ROUNDS, "rows": []}
    for dtype in (torch.float16, torch.bfloat16):
        for q_heads, kv_heads, batch, ctx in SHAPES:
            res["rows"].append(bench_row(dtype, q_heads, kv_heads, batch, ctx, device, pdl))
            torch.cuda.empty_cache()
    res["lines"] = [
        {"q_heads": q_heads, "kv_heads": kv_heads, "points": line_points(q_heads, kv_heads, device, pdl)}
        for q_heads, kv_heads in LINE_HEADS
    ]
    save_results(result_stem(args.out, "decode_bandwidth", device.name), res, markdown)


if __name__ == "__main__":
    main()

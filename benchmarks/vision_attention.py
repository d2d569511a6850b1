"""The vision towers' attention on a GPU: non-causal varlen attention over images of one size, ours (the dispatch's
kernel: the Triton kernel with the arch table's vision_prefill config where it has one, else the Gluon prefill
where `prefill.ws_plan` takes the call, else the Triton kernel), the Triton kernel with the table's prefill config,
and torch SDPA on the same images as a [images, heads, tokens, head_dim] batch.

    python -m benchmarks.vision_attention [--out DIR] [--sweep]

--sweep also times, at CLIP's 32 images and Qwen2-VL's 8, the Triton kernel over a grid of tile configs (query
rows, keys per tile, warps, stages, TMA) and, where the shape's head_dim has one, the Gluon prefill over its ring
configs (keys per tile, stages, pingpong): the candidates for the arch table's vision entry, fastest first, in a
second table.

Shapes: CLIP ViT-L/336 (577 tokens, 16 heads of 64) at 8 and 32 images, Qwen2-VL's ViT at 448 px (1024 tokens,
16 heads of 80) at 8 images, and Qwen2.5-VL's 112 px windows (64 tokens, 16 heads of 80) as 128 windows. TFLOP/s
count the attention's own FLOPs (4 x tokens^2 x head_dim per image and head), not padded tiles. Writes
vision_attention_<device>.json and .md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import prefill, prefill_ws, varlen
from vlchat.kernels.attention.configs import PrefillConfig, WsPrefillConfig, table_for
from vlchat.kernels.device import get_device_info

SHAPES = [  # (name, images or windows, tokens each, heads, head_dim)
    ("clip-l-336", 8, 577, 16, 64),
    ("clip-l-336", 32, 577, 16, 64),
    ("qwen2-vl-448", 8, 1024, 16, 80),
    ("qwen2.5-vl-window", 128, 64, 16, 80),
]
SMOKE = [("tiny", 2, 17, 2, 16), ("tiny-80", 2, 9, 2, 80)]
SWEEP_SHAPES = [SHAPES[1], SHAPES[2]]  # the towers' targets: CLIP at 32 images, Qwen2-VL at 8
TRITON_GRID = [PrefillConfig(m, n, w, st, tma) for m in (64, 128) for n in (64, 128) for w in (4, 8)
               for st in (2, 3) for tma in (False, True)]  # fmt: skip
WS_GRID = [WsPrefillConfig(n, st, pp) for n in (64, 128) for st in (2, 3, 4) for pp in (True, False)]


def time_ms(fn, rep: int = 200) -> float:
    if not torch.cuda.is_available():
        import time

        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def case(images, tokens, heads, head_dim, dtype):
    """Random q, k, v of `images` images of `tokens` each, their cu_seqlens, the softmax scale, the attention's
    FLOPs, SDPA's output (the reference, [tokens, heads, head_dim]) and SDPA's call on the batched views."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    total = images * tokens
    q, k, v = (torch.randn(total, heads, head_dim, device=dev, dtype=dtype) for _ in range(3))
    cu = (torch.arange(images + 1, device=dev, dtype=torch.int32) * tokens).contiguous()
    scale = head_dim**-0.5
    flops = 4 * images * heads * tokens * tokens * head_dim
    q4, k4, v4 = (t.view(images, tokens, heads, head_dim).transpose(1, 2) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q4, k4, v4, scale=scale).transpose(1, 2).reshape(total, heads, head_dim)
    return q, k, v, cu, scale, flops, ref, lambda: F.scaled_dot_product_attention(q4, k4, v4, scale=scale)


def bench(name, images, tokens, heads, head_dim, device, dtype) -> dict:
    q, k, v, cu, scale, flops, ref, sdpa = case(images, tokens, heads, head_dim, dtype)
    out = torch.empty_like(q)
    config = table_for(device).prefill_config(head_dim, dtype)
    ws = varlen.plan(q, k, v, False, device)[1]
    row = {"shape": name, "images": images, "tokens": tokens, "heads": heads, "head_dim": head_dim,
           "kernel": "gluon-ws" if ws else "triton",
           "split_head": list(prefill.head_split(head_dim))}  # fmt: skip
    calls = {
        "ours": lambda: varlen.varlen_attention(q, k, v, cu, tokens, scale, out=out),
        "triton": lambda: varlen.varlen_attention(q, k, v, cu, tokens, scale, config=config, out=out),
        "sdpa": sdpa,
    }
    for key, call in calls.items():
        row[f"{key}_ms"] = time_ms(call)
        row[f"{key}_tflops"] = flops / row[f"{key}_ms"] / 1e9
        if key != "sdpa":
            got = call()
            row[f"{key}_rel_err"] = float((got.float() - ref.float()).norm() / ref.float().norm())
    return row


def sweep(name, images, tokens, heads, head_dim, device, dtype, grid=TRITON_GRID, ws_grid=WS_GRID) -> list[dict]:
    """Every config of `grid` (Triton) and `ws_grid` (Gluon, where the arch table has a prefill_ws entry for this
    head_dim and the call is in its scope) on one shape: ms, TFLOP/s and error against SDPA, fastest first. A
    config that does not compile or fit records its error instead."""
    q, k, v, cu, scale, flops, ref, _ = case(images, tokens, heads, head_dim, dtype)
    out = torch.empty_like(q)
    calls = [("triton", c, lambda c=c: varlen.varlen_attention(q, k, v, cu, tokens, scale, config=c, out=out))
             for c in grid if not (c.tma and prefill.head_split(head_dim)[1])]  # fmt: skip (no TMA on a split head)
    if prefill.ws_plan(q, k, v, None, None, False, None, 0.0, device, None) is not None:
        calls += [("gluon-ws", c, lambda c=c: prefill_ws.launch(q, k, v, None, None, out, cu, None, None, scale,
                                                                 tokens, False, None, c)) for c in ws_grid]  # fmt: skip
    rows = []
    for kernel, config, call in calls:
        row = {"shape": name, "images": images, "kernel": kernel, "config": repr(config)}
        try:
            got = call()
            row["rel_err"] = float((got.float() - ref.float()).norm() / ref.float().norm())
            row["ms"] = time_ms(call, rep=50)
            row["tflops"] = flops / row["ms"] / 1e9
        except Exception as e:  # noqa: BLE001 - a config that cannot compile or fit is a result of the sweep
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        rows.append(row)
        print(f"{name} x{images} {kernel} {config}: {row.get('tflops', row.get('error'))}", flush=True)
    return sorted(rows, key=lambda r: r.get("ms", float("inf")))


def markdown(res: dict) -> str:
    lines = [f"# Vision attention on {res['device']}", "", versions_line(res), "",
             f"Non-causal varlen attention over images of one size, {res['dtype']}; TFLOP/s of the attention's own "
             "FLOPs.", "",
             "| shape | images | tokens | heads x head_dim | ours (kernel) | ours TFLOP/s | Triton TFLOP/s "
             "| SDPA TFLOP/s | ours / SDPA | rel err ours, Triton vs SDPA |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        lines.append(
            f"| {r['shape']} | {r['images']} | {r['tokens']} | {r['heads']} x {r['head_dim']} | {r['kernel']} | "
            f"{r['ours_tflops']:.0f} | {r['triton_tflops']:.0f} | {r['sdpa_tflops']:.0f} | "
            f"{r['sdpa_ms'] / r['ours_ms']:.2f}x | {r['ours_rel_err']:.1e}, {r['triton_rel_err']:.1e} |"
        )
    if res.get("sweep"):
        lines += ["", "## Sweep (fastest five per shape and kernel)", "",
                  "| shape | images | kernel | config | TFLOP/s | rel err vs SDPA |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        shown: dict = {}
        for r in res["sweep"]:
            key = (r["shape"], r["images"], r["kernel"])
            shown[key] = shown.get(key, 0) + 1
            if shown[key] <= 5:
                got = f"{r['tflops']:.0f} | {r['rel_err']:.1e}" if "ms" in r else f"- | {r['error']}"
                lines.append(f"| {r['shape']} | {r['images']} | {r['kernel']} | `{r['config']}` | {got} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = results_parser(__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check of the script)")
    parser.add_argument("--sweep", action="store_true", help="also time each shape over a grid of kernel configs")
    args = parser.parse_args()
    device = get_device_info()
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    rows = [bench(*shape, device, dtype) for shape in (SMOKE if args.smoke else SHAPES)]
    res = {**device_header(device), "dtype": str(dtype).removeprefix("torch."), "rows": rows}
    if args.sweep:
        res["sweep"] = [r for shape in (SMOKE if args.smoke else SWEEP_SHAPES) for r in sweep(*shape, device, dtype)]
    save_results(result_stem(args.out, "vision_attention", device.name), res, markdown)
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()

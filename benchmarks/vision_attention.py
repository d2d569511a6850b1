"""The vision towers' attention on a GPU: non-causal varlen attention over images of one size, ours (the dispatch's
kernel: the Gluon prefill where `prefill.ws_plan` takes the call, else the Triton kernel), the Triton kernel with
the arch table's config, and torch SDPA on the same images as a [images, heads, tokens, head_dim] batch.

    python -m benchmarks.vision_attention [--out DIR]

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
from vlchat.kernels.attention import prefill, varlen
from vlchat.kernels.attention.configs import table_for
from vlchat.kernels.device import get_device_info

SHAPES = [  # (name, images or windows, tokens each, heads, head_dim)
    ("clip-l-336", 8, 577, 16, 64),
    ("clip-l-336", 32, 577, 16, 64),
    ("qwen2-vl-448", 8, 1024, 16, 80),
    ("qwen2.5-vl-window", 128, 64, 16, 80),
]
SMOKE = [("tiny", 2, 17, 2, 16), ("tiny-80", 2, 9, 2, 80)]


def time_ms(fn) -> float:
    if not torch.cuda.is_available():
        import time

        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def bench(name, images, tokens, heads, head_dim, device, dtype) -> dict:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    total = images * tokens
    q, k, v = (torch.randn(total, heads, head_dim, device=dev, dtype=dtype) for _ in range(3))
    cu = (torch.arange(images + 1, device=dev, dtype=torch.int32) * tokens).contiguous()
    scale = head_dim**-0.5
    flops = 4 * images * heads * tokens * tokens * head_dim
    out = torch.empty_like(q)
    config = table_for(device).prefill_config(head_dim, dtype)
    ws = prefill.ws_plan(q, k, v, None, None, False, None, 0.0, device, None)
    q4, k4, v4 = (t.view(images, tokens, heads, head_dim).transpose(1, 2) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q4, k4, v4, scale=scale).transpose(1, 2).reshape(total, heads, head_dim)
    row = {"shape": name, "images": images, "tokens": tokens, "heads": heads, "head_dim": head_dim,
           "kernel": "gluon-ws" if ws else "triton",
           "split_head": list(prefill.head_split(head_dim))}  # fmt: skip
    calls = {
        "ours": lambda: varlen.varlen_attention(q, k, v, cu, tokens, scale, out=out),
        "triton": lambda: varlen.varlen_attention(q, k, v, cu, tokens, scale, config=config, out=out),
        "sdpa": lambda: F.scaled_dot_product_attention(q4, k4, v4, scale=scale),
    }
    for key, call in calls.items():
        row[f"{key}_ms"] = time_ms(call)
        row[f"{key}_tflops"] = flops / row[f"{key}_ms"] / 1e9
        if key != "sdpa":
            got = call()
            row[f"{key}_rel_err"] = float((got.float() - ref.float()).norm() / ref.float().norm())
    return row


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
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = results_parser(__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check of the script)")
    args = parser.parse_args()
    device = get_device_info()
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    rows = [bench(*shape, device, dtype) for shape in (SMOKE if args.smoke else SHAPES)]
    res = {**device_header(device), "dtype": str(dtype).removeprefix("torch."), "rows": rows}
    save_results(result_stem(args.out, "vision_attention", device.name), res, markdown)
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()

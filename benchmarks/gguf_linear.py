"""GGUF projections of a Llama 2 7B layer served from their blocks (dequantize, then multiply) against fp16.

    python -m benchmarks.gguf_linear [--out DIR]

For each projection of a 7B layer (benchmarks/quant_linear.py's SHAPES), each GGUF type (Q4_K, Q6_K, Q8_0) and
each row count (1 and 16: decode; 512: prefill), fp16:

- fp16 us: F.linear on the fp16 weight (cuBLAS);
- dequant us: kernels/ops/gguf_dequant.py writing the fp16 weight from its blocks;
- gguf us: what a GGUF layer runs per call (llm/gguf_layers.py): up to 16 rows the fused kernel
  (kernels/ops/gguf_linear.py, dequantizing in registers), more rows dequantize, then the 16-bit product;
- MB: the blocks' size.
Times are CUDA-graph replays over enough weight copies to defeat the L2 (graph_time_us). Prefill rows pay the
dequantization's write and read of a 16-bit weight on top of the product; the fused decode kernel's tile
(GGUF_GEMV_CONFIG) has not been tuned on a GPU yet.
Writes gguf_linear_<device>.json and .md under --out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.gpu_timing import graph_time_us
from benchmarks.quant_linear import L2_DEFEAT_BYTES, SHAPES
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line

TYPES = {"Q4_K": 12, "Q6_K": 14, "Q8_0": 8}
ROWS = (1, 16, 512)


def random_blocks(n: int, k: int, qtype: int) -> torch.Tensor:
    """Random blocks of an [n, k] matrix on the GPU with small finite fp16 scales (values do not change timing)."""
    from vlchat.kernels.ops.gguf_dequant import BLOCKS

    elems, nbytes = BLOCKS[qtype]
    blocks = torch.randint(0, 256, (n * k // elems, nbytes), dtype=torch.uint8, device="cuda")
    at = {8: (0,), 12: (0, 2), 14: (208,)}[qtype]
    scale = torch.full((blocks.shape[0], 1), 1e-3, dtype=torch.float16, device="cuda").view(torch.uint8)
    for a in at:
        blocks[:, a : a + 2] = scale
    return blocks.reshape(n, k // elems * nbytes)


def bench_shape(name: str, n: int, k: int) -> list[dict]:
    from vlchat.kernels.ops.gguf_dequant import dequantize_rows
    from vlchat.kernels.ops.gguf_linear import gguf_linear

    copies = max(2, int(L2_DEFEAT_BYTES // (2 * n * k)))
    dense = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
    out = []
    for type_name, qtype in TYPES.items():
        one = random_blocks(n, k, qtype)
        sets = [one] + [random_blocks(n, k, qtype) for _ in range(max(1, int(L2_DEFEAT_BYTES // one.numel())) - 1)]
        deq_us = graph_time_us([lambda b=b, t=qtype: dequantize_rows(b, t, k, torch.float16) for b in sets])
        for rows in ROWS:
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
            fp16_us = graph_time_us([lambda w=w, x=x: F.linear(x, w) for w in dense])
            gguf_us = graph_time_us([lambda b=b, x=x, t=qtype: gguf_linear(x, b, t)
                                     for b in sets])  # fmt: skip
            out.append({"shape": name, "n": n, "k": k, "type": type_name, "rows": rows, "mb": one.numel() / 2**20,
                        "fp16_us": fp16_us, "dequant_us": deq_us, "gguf_us": gguf_us})  # fmt: skip
            print(f"{name} {type_name} rows {rows}: fp16 {fp16_us:.1f} us, gguf {gguf_us:.1f} us", flush=True)
        del sets
    del dense
    torch.cuda.empty_cache()
    return out


def markdown(res: dict) -> str:
    lines = [
        f"# GGUF projections (Llama 2 7B layer) on {res['device']}", "",
        f"{versions_line(res)}; the GGUF layers' product per call (fused up to 16 rows, else dequantize then "
        "multiply), fp16, CUDA-graph replays "
        "(benchmarks/gguf_linear.py).", "",
        "| W | type | rows | MB | fp16 us | dequant us | gguf us | vs fp16 |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        lines.append(
            f"| {r['shape']} ({r['n']}x{r['k']}) | {r['type']} | {r['rows']} | {r['mb']:.1f} | {r['fp16_us']:.1f} | "
            f"{r['dequant_us']:.1f} | {r['gguf_us']:.1f} | {r['fp16_us'] / r['gguf_us']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    from vlchat.kernels.device import get_device_info

    args = results_parser(__doc__).parse_args()
    device = get_device_info()
    res = {**device_header(device), "rows": []}
    for name, (n, k) in SHAPES.items():
        res["rows"] += bench_shape(name, n, k)
    save_results(result_stem(args.out, "gguf_linear", device.name), res, markdown)


if __name__ == "__main__":
    main()

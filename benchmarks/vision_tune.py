"""Tune the vision towers' two table entries of this GPU in one run, then time the towers with them: the fused
fc1 GEMM's tiles (benchmarks/linear_act.py's grid at CLIP's 32 images and Qwen2-VL's 8) and the non-causal
attention's Triton config (benchmarks/vision_attention.py's Triton grid at the same two shapes). A pick goes
into this process's table (kernels.ops.linear_act.GEMM_ACT, the arch table's vision_prefill) only where it beat
what runs without it on every shape; then benchmarks/vision.py runs. Prints the entries to commit.

    python -m benchmarks.vision_tune [--out DIR] [--gemm-only]
"""

from __future__ import annotations

import json
import os
import sys

import torch

from benchmarks import linear_act, vision, vision_attention
from benchmarks.report import results_parser


def pick_gemm(rows: list[dict]):
    """The grid config with the least total time over the shapes, if it beat cuBLAS + activation on each."""
    shapes = {(r["shape"], r["rows"]) for r in rows}
    today = {(r["shape"], r["rows"]): r["ms"] for r in rows if r["kernel"] == "cublas+act"}
    totals: dict[str, float] = {}
    for r in rows:
        if r["kernel"].startswith("fused") and "ms" in r and r["rel_err"] < 1e-2:
            totals[r["kernel"]] = totals.get(r["kernel"], 0.0) + r["ms"]
    complete = [k for k in totals if sum(1 for r in rows if r["kernel"] == k and "ms" in r) == len(shapes)]
    if not complete:
        return None
    best = min(complete, key=totals.get)
    if all(r["ms"] < today[(r["shape"], r["rows"])] for r in rows if r["kernel"] == best):
        return best
    return None


def save(out: str, device, gemm_rows: list[dict], picked: dict) -> None:
    print(json.dumps(picked, indent=1), flush=True)
    with open(os.path.join(out, "vision_tune_picked.json"), "w") as f:
        json.dump({"device": device.name, "gemm_rows": gemm_rows, "picked": picked}, f, indent=1)


def main() -> None:
    from vlchat.kernels.attention.configs import table_for
    from vlchat.kernels.device import get_device_info
    from vlchat.kernels.ops import linear_act as la

    parser = results_parser(__doc__)
    parser.add_argument("--gemm-only", action="store_true", help="leave out the attention sweep (most of the run)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    device = get_device_info()
    dtype = torch.bfloat16
    gemm_rows = [r for shape in linear_act.SHAPES[1:] for r in linear_act.bench(*shape, linear_act.GRID, dtype, "cuda")]
    picked: dict = {"gemm": pick_gemm(gemm_rows)}
    if picked["gemm"]:
        config = next(c for c in linear_act.GRID if linear_act.label(c) == picked["gemm"])
        la.GEMM_ACT[device.capability[0]] = config
        picked["gemm_config"] = repr(config)
    save(args.out, device, gemm_rows, picked)  # each pick is kept as soon as it is made
    table = table_for(device)
    for shape in [] if args.gemm_only else vision_attention.SWEEP_SHAPES:
        head_dim = shape[-1]
        now = vision_attention.bench(*shape, device, dtype)
        rows = vision_attention.sweep(*shape, device, dtype, ws_grid=[])
        best = rows[0]
        picked[f"attention {shape[0]}"] = {"now_ms": now["ours_ms"], "now_kernel": now["kernel"], **best}
        if "ms" in best and best["rel_err"] < 1e-2 and best["ms"] < now["ours_ms"]:
            config = next(c for c in vision_attention.TRITON_GRID if repr(c) == best["config"])
            table.vision_prefill[head_dim] = config
    picked["vision_prefill"] = {k: repr(v) for k, v in table.vision_prefill.items()}
    save(args.out, device, gemm_rows, picked)
    sys.argv = [sys.argv[0], "--out", args.out]
    vision.main()


if __name__ == "__main__":
    main()

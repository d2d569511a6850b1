"""Tune the W4A16 GEMV entry of this GPU's table in one run: the sweep of benchmarks/quant_linear.py (--sweep),
its picks (`pick_gemv`) put into this process's W4A16_CONFIGS, then the engine's decode steps with them
(benchmarks/quant_decode.py). Prints the entry to commit.

    python -m benchmarks.quant_gemv_tune [--out DIR] [--formats fp16,w4a16-g128]
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from benchmarks import quant_decode
from benchmarks.quant_linear import pick_gemv, run_sweep, sweep_markdown
from benchmarks.report import device_header, result_stem, results_parser, save_results


def main() -> None:
    from vlchat.kernels.device import get_device_info
    from vlchat.kernels.ops import quant_linear

    parser = results_parser(__doc__)
    parser.add_argument("--formats", default="fp16,w4a16-g128")
    args = parser.parse_args()
    device = get_device_info()
    res = {**device_header(device), "group": 128, **run_sweep(128)}
    res["picked"] = pick_gemv(res["rows"])
    save_results(result_stem(args.out, "quant_linear_sweep", device.name), res, sweep_markdown)
    print(sweep_markdown(res))
    arch = max(c for c in quant_linear.W4A16_CONFIGS if c <= device.capability)
    picked = res["picked"]
    quant_linear.W4A16_CONFIGS[arch] = dataclasses.replace(
        quant_linear.W4A16_CONFIGS[arch],
        gemv_cores=quant_linear.W4GemvConfig(**picked["gemv_cores"]),
        gemv_dot=quant_linear.W4GemvConfig(**picked["gemv_dot"]),
        dot_rows=picked["dot_rows"],
        gemv_pairs=quant_linear.W4GemvConfig(**picked["gemv_pairs"]) if picked["gemv_pairs"] else None,
    )
    print(f"entry {arch}: {quant_linear.W4A16_CONFIGS[arch]}", flush=True)
    with open(os.path.join(args.out, "picked.json"), "w") as f:
        json.dump({"arch": arch, **picked}, f)
    sys.argv = [sys.argv[0], "--out", args.out, "--formats", args.formats]
    quant_decode.main()


if __name__ == "__main__":
    main()

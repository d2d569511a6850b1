"""Engine start-up on a GPU: how long a large model's engine takes to be ready, and what capturing decode CUDA graphs
per context bucket costs against one plan per batch bucket.

    python -m benchmarks.engine_startup [--out DIR]

Model: the llama3-8b shape (random weights filled on the GPU, bf16), up to 256 sequences (20 batch buckets). For
max_model_len 4k, 32k and 128k, the time from `LLM(...)` to a ready engine, the part of it spent capturing decode
graphs, and the graph count, for three ways to start:
- `per context`: the product, one graph per batch bucket and distinct plan over the context buckets;
- `one plan`: the context buckets collapsed to max_model_len (one graph per batch bucket, planned at the bound, as
  before the per-context plans);
- `eager`: `enforce_eager`, no graphs.
The first start runs in a fresh Triton cache (it compiles every kernel the start runs); the rest find it warm.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time

import torch

from benchmarks.random_model import SHAPES, random_weights, write_config_dir
from benchmarks.report import result_stem, results_parser, save_results, versions
from vlchat.llm.engine import model_runner

SHAPE = "llama3-8b"
MAX_NUM_SEQS = 256
LENGTHS = (4096, 32768, 131072)
MODES = ("per context", "one plan", "eager")


def start(model_dir: str, max_model_len: int, mode: str) -> dict:
    """One engine start: seconds to ready, seconds capturing graphs, graph count; the engine closed after."""
    from vlchat.llm import LLM

    buckets = model_runner.context_buckets
    if mode == "one plan":
        model_runner.context_buckets = lambda n: [n]
    try:
        t0 = time.perf_counter()
        with random_weights():
            llm = LLM(model_dir, dtype="bfloat16", device="cuda", max_num_seqs=MAX_NUM_SEQS,
                      max_model_len=max_model_len, enforce_eager=mode == "eager")  # fmt: skip
        torch.cuda.synchronize()
        ready = time.perf_counter() - t0
    finally:
        model_runner.context_buckets = buckets
    graphs = llm.engine.runner.graphs
    row = {"max_model_len": max_model_len, "mode": mode, "ready_s": ready,
           "capture_s": graphs.capture_s if graphs else 0.0,
           "graphs": graphs.count if graphs else 0}  # fmt: skip
    llm.close()
    del llm, graphs
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    args = results_parser(__doc__).parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("engine_startup measures CUDA graph capture: it needs a GPU")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="vlchat-triton-cache-")  # the first start compiles
    model_dir = write_config_dir(os.path.join(tempfile.mkdtemp(prefix="vlchat-startup-"), "model"), SHAPES[SHAPE])
    res = {"device": torch.cuda.get_device_name(), **versions(), "shape": SHAPE, "max_num_seqs": MAX_NUM_SEQS,
           "rows": []}  # fmt: skip
    stem = result_stem(args.out, "engine_startup", res["device"])
    runs = [(32768, "per context", True)] + [(n, mode, False) for n in LENGTHS for mode in MODES]
    for max_model_len, mode, cold in runs:
        row = start(model_dir, max_model_len, mode)
        row["triton_cache"] = "cold" if cold else "warm"
        res["rows"].append(row)
        save_results(stem, res)
        print(f"{max_model_len} {mode} ({row['triton_cache']}): ready in {row['ready_s']:.1f} s, "
              f"{row['graphs']} graphs in {row['capture_s']:.1f} s", flush=True)  # fmt: skip
    save_results(stem, res, markdown)


def markdown(res: dict) -> str:
    lines = [f"# Engine start-up on {res['device']}", "",
             f"{res['date']}; torch {res['torch']}, triton {res['triton']}, python {res['python']}. {res['shape']} "
             f"shape (random weights, bf16), up to {res['max_num_seqs']} sequences; benchmarks/engine_startup.py "
             "says what each mode runs.", "",
             "| max_model_len | mode | Triton cache | ready s | graph capture s | graphs | s per graph |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        per = f"{r['capture_s'] / r['graphs']:.3f}" if r["graphs"] else "-"
        lines.append(f"| {r['max_model_len']} | {r['mode']} | {r['triton_cache']} | {r['ready_s']:.1f} | "
                     f"{r['capture_s']:.1f} | {r['graphs']} | {per} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

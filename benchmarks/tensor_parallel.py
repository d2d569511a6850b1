"""Tensor-parallel decode at batch 1: the engine's step at TP=1 and TP=2 against the step/2 + all-reduce floor.

    python -m benchmarks.tensor_parallel [--shape vicuna-13b] [--dtype bfloat16] [--out DIR] [--tiny]

One sequence (a 512-token prompt) decoding on a random-weight model of `--shape` (load_format="dummy"), CUDA
graphs on: the median wall time of `engine.step()` over 200 steady decode steps, as a client sees it (the
scheduler, the step message to the workers, the ranks' graph replays with their all-reduces, the tokens back).
The floor: each decode step runs 2 all-reduces per layer of a [1, hidden] tensor; their time is measured on
two ranks alone as one CUDA graph of the 2 x layers all-reduces (NCCL, NVLink multicast off). The target
(issue 50): TP=2 step <= 1.15 x (TP=1 step / 2 + floor). Serving throughput is benchmarks/serving.py with
--tensor-parallel-size (docs/TENSOR_PARALLEL.md). `--tiny`: a 2-layer 256-wide model on two gloo CPU ranks,
a check that the script runs (its times mean nothing).

Writes tensor_parallel_<device>.json and .md under --out and prints the table.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time

import torch

from benchmarks import random_model
from benchmarks.report import result_stem, results_parser, versions
from benchmarks.runtime import sync

STEPS = 200
TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=8, vocab_size=1000, max_position_embeddings=4096)  # fmt: skip


def decode_step_ms(model_dir: str, tp: int, dtype: str, device: str, steps: int) -> float:
    from vlchat.llm import LLM, SamplingParams

    llm = LLM(model_dir, dtype=dtype, device=device, tensor_parallel_size=tp, load_format="dummy",
              max_num_seqs=8, max_model_len=4096, cache_fraction=0.5)  # fmt: skip
    try:
        engine = llm.engine
        prompt = [(7 * i) % 900 + 2 for i in range(512)]
        engine.add_request("b1", prompt, SamplingParams(max_tokens=steps + 64, ignore_eos=True, temperature=0.0))
        for _ in range(32):  # prefill, then decode steps replaying the graph
            engine.step()
        times = []
        for _ in range(steps):
            sync()
            t0 = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    finally:
        llm.close()


def _all_reduce_rank(rank: int, world: int, port: int, hidden: int, calls: int, dtype, result) -> None:
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    x = torch.ones(1, hidden, dtype=dtype, device="cuda" if cuda else "cpu")
    dist.all_reduce(x)  # the communicator exists before capture
    if cuda:
        from benchmarks.gpu_timing import graph_time_us

        # both ranks replay the graph the same number of times: unequal counts of collectives would hang
        per_call = graph_time_us([lambda: dist.all_reduce(x)], reps=30, min_calls=calls)
    else:
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(x)
        per_call = (time.perf_counter() - t0) / calls * 1e6
    if rank == 0:
        result.put(per_call * calls / 1e3)  # ms per step
    dist.destroy_process_group()


def all_reduce_floor_ms(hidden: int, layers: int, dtype) -> float:
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    procs = [ctx.Process(target=_all_reduce_rank, args=(r, 2, port, hidden, 2 * layers, dtype, result))
             for r in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    floor = result.get(timeout=600)
    for p in procs:
        p.join()
    return floor


def main() -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--shape", default="vicuna-13b", choices=sorted(random_model.SHAPES))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="a CPU check of the script (2 gloo ranks, a tiny model)")
    args = ap.parse_args()
    tiny = args.tiny or not torch.cuda.is_available()
    fields = TINY if tiny else dict(random_model.SHAPES[args.shape])
    device, dtype = ("cpu", "float32") if tiny else ("cuda", args.dtype)
    steps = 20 if tiny else STEPS
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_model.write_config_dir(tmp, fields, dtype=dtype)
        tp1 = decode_step_ms(model_dir, 1, dtype, device, steps)
        gc.collect()  # the TP=1 model's memory goes back before the workers size their KV pools
        torch.cuda.empty_cache() if device == "cuda" else None
        tp2 = decode_step_ms(model_dir, 2, dtype, device, steps)
    floor = all_reduce_floor_ms(fields["hidden_size"], fields["num_hidden_layers"], getattr(torch, dtype))
    bound = tp1 / 2 + floor
    name = "cpu (tiny check)" if tiny else torch.cuda.get_device_name()
    res = {"device": name, **versions(), "shape": "tiny" if tiny else args.shape, "dtype": dtype,
           "batch": 1, "prompt_tokens": 512, "steps": steps, "tp1_step_ms": tp1, "tp2_step_ms": tp2,
           "all_reduce_floor_ms": floor, "bound_ms": bound, "tp2_over_bound": tp2 / bound,
           "target": "tp2_over_bound <= 1.15"}  # fmt: skip
    md = (f"# Tensor-parallel decode, batch 1 ({res['shape']}, {dtype})\n\n"
          f"{name}; {res['date']}, torch {res['torch']}\n\n"
          "| TP=1 step | TP=2 step | all-reduce floor (2 x layers) | TP=1/2 + floor | TP=2 / that |\n"
          "|---|---|---|---|---|\n"
          f"| {tp1:.3f} ms | {tp2:.3f} ms | {floor:.3f} ms | {bound:.3f} ms | {tp2 / bound:.3f} (target <= 1.15) |\n"
          )  # fmt: skip
    print(md)
    stem = result_stem(args.out, "tensor_parallel" + ("_tiny" if tiny else ""), name.split(" (")[0])
    os.makedirs(args.out, exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(res, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(md)


if __name__ == "__main__":
    main()

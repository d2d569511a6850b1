"""Where an engine step's time goes: GPU kernel time vs host time, from torch.profiler.

Used by `benchmarks/serving.py --profile-batch N`: pure decode steps at a batch of N
(CUDA graphs) and steps that also prefill a 256-token chunk of a newly arrived request.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import random_model, workloads


def _profiled_steps(engine, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync()
        wall = (time.perf_counter() - t0) / steps
    events = prof.key_averages()
    kernel_ms = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / steps / 1e3
    top = sorted((e for e in events if e.self_device_time_total > 0), key=lambda e: e.self_device_time_total,
                 reverse=True)[:10]  # fmt: skip
    host = sorted((e for e in events if e.device_type.name == "CPU"), key=lambda e: e.self_cpu_time_total,
                  reverse=True)[:10]  # fmt: skip
    return {
        "step_ms": wall * 1e3, "gpu_kernel_ms": kernel_ms, "host_overhead_ms": wall * 1e3 - kernel_ms,
        "top_kernels": [{"name": e.key[:90], "ms_per_step": e.self_device_time_total / steps / 1e3} for e in top],
        "top_host_ops": [{"name": e.key[:90], "ms_per_step": e.self_cpu_time_total / steps / 1e3} for e in host],
    }  # fmt: skip


def profile_decode_step(model_dir, args, batch: int, context: int = 512, steps: int = 20) -> dict:
    """Where a step's time goes at `batch` running sequences: GPU kernel time vs the rest (host work:
    scheduling, batch building, launches, sampling, detokenizing), from torch.profiler. Two cases: pure
    decode steps (CUDA graphs) and steps that also prefill a 256-token chunk of a newly arrived request
    (eager), which is what most serving steps look like under continuous arrivals."""
    from llm import LLM, SamplingParams

    random = contextlib.nullcontext() if args.model else random_model.random_weights()
    with random:
        llm = LLM(str(model_dir), dtype=args.dtype, max_num_seqs=batch + 1, enforce_eager=args.enforce_eager,
                  max_num_batched_tokens=args.max_num_batched_tokens)  # fmt: skip
    engine = llm.engine
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    reqs = workloads.sharegpt_like_v1(batch + steps, vocab, seed=1, special_ids=(0, 1))
    params = SamplingParams(max_tokens=1024, ignore_eos=True, temperature=0.0)
    for i, r in enumerate(reqs[:batch]):
        engine.add_request(f"p{i}", (r.prompt_token_ids * 8)[:context], params, stream=True)
    for _ in range(50):  # all prefills done, decoding
        engine.step()
    result = {"batch": batch, "context": context, "decode": _profiled_steps(engine, steps)}
    mixed = []
    for i, r in enumerate(reqs[batch:]):
        engine.add_request(f"m{i}", (r.prompt_token_ids * 8)[:256], SamplingParams(max_tokens=1), stream=True)
        mixed.append(_profiled_steps(engine, 1))
    result["decode_plus_prefill_256"] = {
        "step_ms": statistics.median(m["step_ms"] for m in mixed),
        "gpu_kernel_ms": statistics.median(m["gpu_kernel_ms"] for m in mixed),
        "host_overhead_ms": statistics.median(m["host_overhead_ms"] for m in mixed),
        "top_host_ops": mixed[len(mixed) // 2]["top_host_ops"],
    }
    result.update({k: result["decode"][k] for k in ("step_ms", "gpu_kernel_ms", "host_overhead_ms")})
    llm.engine.close()
    return result

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
from benchmarks.runtime import sync


def _profiled_steps(engine, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

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


def host_cases(device: str = "cuda", cache_memo: bool = True) -> dict:
    """Calls of each kernel wrapper (and two torch ops for scale) on tiny inputs, where the GPU work is negligible
    and a loop of calls runs at the host's launch rate: what an eager step pays per op. The decode and prefill
    calls are as the engine makes them: a planned config and split count, and (`cache_memo`) the caches'
    descriptor memo."""
    import vlchat.kernels.attention as attn
    import vlchat.kernels.ops as ops
    from vlchat.kernels.attention import plan

    dt = torch.float16 if device == "cuda" else torch.float32
    t, h, kvh, d, page = 8, 32, 32, 128, 16
    x = torch.randn(t, 4096, device=device, dtype=dt)
    w = torch.ones(4096, device=device, dtype=dt)
    q = torch.randn(t, h, d, device=device, dtype=dt)
    k = torch.randn(t, kvh, d, device=device, dtype=dt)
    kc = torch.zeros(64, page, kvh, d, device=device, dtype=dt)
    vc = torch.zeros_like(kc)
    slots = torch.arange(t, device=device)
    tables = torch.arange(t, device=device, dtype=torch.int32).view(t, 1)
    lens = torch.full((t,), 1, device=device, dtype=torch.int32)
    cu = torch.arange(t + 1, device=device, dtype=torch.int32)
    cache = torch.randn(4096, d, device=device, dtype=torch.float32)
    pos = torch.arange(t, device=device)
    gate_up = torch.randn(t, 2 * 4096, device=device, dtype=dt)
    wmat = torch.randn(4096, 4096, device=device, dtype=dt)
    memo: dict | None = {} if cache_memo else None
    planned = {s: plan.decode_plan(q, kc, tables, attn.device_for(q), s)[1] for s in (1, 4)}

    def decode(splits):
        return lambda: attn.paged_decode_attention(
            q, kc, vc, tables, lens, 0.1, num_splits=splits, config=planned[splits], cache_memo=memo
        )

    return {
        "torch add": lambda: x + x,
        "torch linear 4096x4096": lambda: torch.nn.functional.linear(x, wmat),
        "rms_norm + residual": lambda: ops.rms_norm(x, w, 1e-5, x),
        "rotary q,k": lambda: ops.apply_rotary(q, k, pos, cache),
        "silu_and_mul": lambda: ops.silu_and_mul(gate_up),
        "write_kv_cache": lambda: attn.write_kv_cache(k, k, kc, vc, slots),
        "decode (1 split)": decode(1),
        "decode (4 splits + reduce)": decode(4),
        "prefill": lambda: attn.paged_prefill_attention(q, kc, vc, tables, cu, lens, 0.1, 1, k=k, v=k, cache_memo=memo),
    }


def host_us(fn, calls: int) -> float:
    """Host microseconds per call of `fn` in a loop of `calls` (after a warm-up), the GPU drained before and after."""
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    sync()
    return host / calls * 1e6


def host_costs(device: str = "cuda", calls: int = 300) -> dict:
    """Host microseconds per call of each of `host_cases`."""
    return {name: host_us(fn, calls) for name, fn in host_cases(device).items()}


def python_profile(engine, steps: int, before_step, top: int = 30) -> list[dict]:
    """cProfile of `steps` engine steps (`before_step(i)` runs first, unprofiled): the functions with the most
    own (tottime) host time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    for i in range(steps):
        before_step(i)
        prof.enable()
        engine.step()
        sync()
        prof.disable()
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return [{"function": f"{Path(f).name}:{line}:{name}", "calls_per_step": nc / steps,
             "own_ms_per_step": tt / steps * 1e3, "cum_ms_per_step": ct / steps * 1e3}
            for (f, line, name), (_, nc, tt, ct, _) in rows]  # fmt: skip


def profile_decode_step(model_dir, args, batch: int, context: int = 512, steps: int = 20) -> dict:
    """Where a step's time goes at `batch` running sequences: GPU kernel time vs the rest (host work:
    scheduling, batch building, launches, sampling, detokenizing), from torch.profiler. Two cases: pure
    decode steps (CUDA graphs) and steps that also prefill a 256-token chunk of a newly arrived request
    (piecewise graphs, or eager with args.piecewise_graph_tokens 0), which is what most serving steps look like
    under continuous arrivals."""
    from vlchat.llm import LLM, SamplingParams

    random = contextlib.nullcontext() if args.model else random_model.random_weights()
    with random:
        llm = LLM(str(model_dir), dtype=args.dtype, max_num_seqs=batch + 1, enforce_eager=args.enforce_eager,
                  piecewise_graph_tokens=getattr(args, "piecewise_graph_tokens", 0),
                  prefill_delay_steps=0,  # the mixed-step profile prefills each arrival in its own step
                  max_num_batched_tokens=args.max_num_batched_tokens)  # fmt: skip
    engine = llm.engine
    config = json.loads((Path(model_dir) / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]  # a VLM's language model: text-only steps
    reqs = workloads.sharegpt_like_v1(batch + steps, vocab, seed=1, special_ids=(0, 1))
    params = SamplingParams(max_tokens=1024, ignore_eos=True, temperature=0.0)
    for i, r in enumerate(reqs[:batch]):
        engine.add_request(f"p{i}", (r.prompt_token_ids * 8)[:context], params, stream=True)
    for _ in range(50):  # all prefills done, decoding
        engine.step()
    result = {"batch": batch, "context": context, "decode": _profiled_steps(engine, steps)}

    def arrive(tag: str, i: int) -> None:  # a new request: its 256-token prompt prefills in the next step
        prompt = (reqs[batch + i].prompt_token_ids * 8)[:256]
        engine.add_request(f"{tag}{i}", prompt, SamplingParams(max_tokens=1), stream=True)

    mixed = []
    for i in range(steps):
        arrive("m", i)
        mixed.append(_profiled_steps(engine, 1))
    unprofiled = []
    for i in range(steps):  # the same kind of step without the profiler's per-op cost
        arrive("u", i)
        sync()
        t0 = time.perf_counter()
        engine.step()
        sync()
        unprofiled.append((time.perf_counter() - t0) * 1e3)
    result["decode_plus_prefill_256_unprofiled_ms"] = statistics.median(unprofiled)
    result["decode_plus_prefill_256_python"] = python_profile(engine, steps, lambda i: arrive("c", i))
    result["host_us_per_call"] = host_costs("cuda" if torch.cuda.is_available() else "cpu")
    result["decode_plus_prefill_256"] = {
        "step_ms": statistics.median(m["step_ms"] for m in mixed),
        "gpu_kernel_ms": statistics.median(m["gpu_kernel_ms"] for m in mixed),
        "host_overhead_ms": statistics.median(m["host_overhead_ms"] for m in mixed),
        "top_host_ops": mixed[len(mixed) // 2]["top_host_ops"],
    }
    result.update({k: result["decode"][k] for k in ("step_ms", "gpu_kernel_ms", "host_overhead_ms")})
    llm.engine.close()
    return result

"""How the GPU benchmarks time kernels: CUDA-graph replays of a list of calls, and the ceilings they are held to:
the copy bandwidth and the time to only read a call's bytes (benchmarks/attention.py, decode_floor.py,
decode_bandwidth.py, long_context.py)."""

from __future__ import annotations

import math
import statistics

import torch
import triton
import triton.language as tl

from vlchat.kernels.attention.pdl import launch_next_then_wait, pdl_options

# (elements per CTA, warps) of the read floor: each CTA's loads issued at once
READ_TILES = ((65536, 16), (32768, 8), (16384, 4), (8192, 4))


def interleaved_us(calls: dict, rounds: int) -> dict:
    """graph_time_us of each entry of `calls` (a key to a list of calls), in turn, `rounds` times over: the key to
    its `rounds` timings. Interleaving spreads the GPU's changing state over every entry alike."""
    times = {key: [] for key in calls}
    for _ in range(rounds):
        for key, fns in calls.items():
            times[key].append(graph_time_us(fns))
    return times


def interleaved_medians(calls: dict, rounds: int) -> dict:
    """interleaved_us of `calls`, each key's median."""
    return {key: statistics.median(times) for key, times in interleaved_us(calls, rounds).items()}


def interleaved_timings(rounds: int, script: str, statistic: str = "median") -> str:
    """How a kernel sweep's report says its times were taken (interleaved_us), naming the script that
    says what each column runs."""
    return (
        f"the {statistic} of {rounds} interleaved CUDA-graph timings of back-to-back calls, L2 defeated "
        f"(benchmarks/{script} says what each column runs)."
    )


def graph_time_us(fns, reps=None, min_calls=16):
    """Median microseconds per call of fns (a list of calls run in turn, repeated to at least `min_calls`),
    replayed as one CUDA graph. Several calls per replay keep the graph's launch latency (the GPU waits on the
    host between the start event and the first kernel, ~15 us) out of the per-call time, as in a decode step
    where every layer's attention runs back to back."""
    fns = list(fns) * math.ceil(min_calls / len(fns))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:  # warm-up: compile, allocate
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    once = start.elapsed_time(end)
    reps = reps or max(3, min(50, int(30 / max(once, 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    times.sort()
    return times[len(times) // 2] * 1e3 / len(fns)


def copy_bandwidth_gbs():
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3) / 1e9  # bytes read + written


@triton.jit
def _read_kernel(x_ptr, out_ptr, N: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    launch_next_then_wait(PDL)
    x = tl.load(x_ptr + pid.to(tl.int64) * N + tl.arange(0, N))
    tl.store(out_ptr + pid, tl.sum(x.to(tl.float32), 0))


def read_floor_us(numel: int, sets: int, pdl: bool) -> float:
    """Best time over READ_TILES to read `numel` fp16 elements (one call per L2-defeating copy)."""
    x = torch.randn(sets, numel, device="cuda", dtype=torch.float16)
    out = torch.empty(numel // min(n for n, _ in READ_TILES), device="cuda")
    best = math.inf
    for n, warps in READ_TILES:
        ctas = numel // n

        def call(s, ctas=ctas, n=n, warps=warps):
            _read_kernel[(ctas,)](x[s], out, N=n, PDL=pdl, num_warps=warps, **pdl_options(pdl))

        best = min(best, graph_time_us([lambda s=s: call(s) for s in range(sets)]))
    return best

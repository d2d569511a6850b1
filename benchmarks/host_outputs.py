"""Host time the engine spends on a step's outputs, on the CPU: reporting them (detokenizing, building outputs) for
streamed and unstreamed requests, and handing them to an asyncio server (one wake-up per output, as before, against
one per event loop, `llm.engine.async_engine.deliver`).

Both run while the GPU computes the next step, so at large batches they bound the step rate of a small model
(batch 128 on an H200 is host-bound, README). Tiny random Llama with a byte-level BPE tokenizer, fp32 on the CPU
with one torch thread; only the host work is timed. Medians of interleaved rounds.

    python -m benchmarks.host_outputs            # batch 128, 256 tokens, 3 rounds
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import threading
import time

from benchmarks.report import cpu_name, render_results, result_stem, results_parser, save_results, versions
from vlchat.llm.config import EngineConfig
from vlchat.llm.engine import request
from vlchat.llm.engine.async_engine import deliver
from vlchat.llm.engine.engine import LLMEngine
from vlchat.llm.sampling_params import SamplingParams

# Reporting modes: (requests streamed, tokens an unstreamed completion queues before detokenizing them). One token
# is the peer: what every request cost before unstreamed ones were deferred (llm/engine/request.DEFERRED_TOKENS).
REPORT_MODES = {"streamed": (True, None), "unstreamed, every step": (False, 1), "unstreamed": (False, None)}


def report_ms(model_dir: str, batch: int, max_tokens: int, stream: bool, deferred: int | None = None):
    """(ms of `_report` summed over a whole generation of `batch` requests, steps it took, ms of its longest
    step); `deferred` overrides DEFERRED_TOKENS for this run."""
    kept = request.DEFERRED_TOKENS
    request.DEFERRED_TOKENS = deferred or kept  # before the requests: each reads it for its first burst
    config = EngineConfig(model_dir, device="cpu", dtype="float32")
    config.scheduler.max_num_seqs = batch
    engine = LLMEngine(config)
    try:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=0)
        for i in range(batch):
            engine.add_request(f"r{i}", "Hello world! How are you today?", params, stream=stream)
        real, spent, steps = engine._report, [], 0

        def timed():
            start = time.perf_counter()
            out = real()
            spent.append(time.perf_counter() - start)
            return out

        engine._report = timed
        while engine.has_unfinished():
            engine.step()
            steps += 1
    finally:
        request.DEFERRED_TOKENS = kept
        engine.close()
    return sum(spent) * 1e3, steps, max(spent) * 1e3


def _per_output(streams: dict, items) -> None:
    """The peer: what the engine thread did before, one call_soon_threadsafe per output."""
    for request_id, item in items:
        loop, queue = streams[request_id]
        loop.call_soon_threadsafe(queue.put_nowait, item)


def delivery_us(batch: int, steps: int, batched: bool) -> float:
    """Median us the engine thread spends handing one step's `batch` outputs to an event loop that reads them."""

    async def run() -> float:
        loop = asyncio.get_running_loop()
        streams = {f"r{i}": (loop, asyncio.Queue()) for i in range(batch)}
        hand = deliver if batched else _per_output
        times: list[float] = []

        def engine_thread():
            for step in range(steps):
                start = time.perf_counter()
                hand(streams, [(rid, step) for rid in streams])
                times.append(time.perf_counter() - start)
                time.sleep(0.0005)  # the next step's compute

        async def read(queue):
            for _ in range(steps):
                await queue.get()

        thread = threading.Thread(target=engine_thread)
        thread.start()
        await asyncio.gather(*(read(q) for _, q in streams.values()))
        thread.join()
        return statistics.median(times) * 1e6

    return asyncio.run(run())


def measure(batch: int = 128, max_tokens: int = 256, rounds: int = 3, delivery_steps: int = 300) -> dict:
    import torch

    from tests.llm.tiny import make_tiny_llama

    torch.set_num_threads(1)
    model_dir = str(make_tiny_llama(tempfile.mkdtemp()))
    report = {mode: [] for mode in REPORT_MODES}
    longest = {mode: [] for mode in REPORT_MODES}
    delivery = {"per_output": [], "per_loop": []}
    steps = 0
    for _ in range(rounds):  # interleaved
        for mode, (stream, deferred) in REPORT_MODES.items():
            ms, steps, longest_ms = report_ms(model_dir, batch, max_tokens, stream, deferred)
            report[mode].append(ms)
            longest[mode].append(longest_ms)
        for mode in delivery:
            delivery[mode].append(delivery_us(batch, delivery_steps, batched=mode == "per_loop"))
    return {"batch": batch, "max_tokens": max_tokens, "rounds": rounds, "steps": steps, "report_ms": report,
            "longest_step_ms": longest, "delivery_us": delivery}  # fmt: skip


def markdown(res: dict) -> str:
    med = {k: statistics.median(v) for k, v in res["report_ms"].items()}
    top = {k: statistics.median(v) for k, v in res["longest_step_ms"].items()}
    dmed = {k: statistics.median(v) for k, v in res["delivery_us"].items()}
    steps, batch = res["steps"], res["batch"]
    lines = [
        f"Host time on a step's outputs, CPU ({res['device']}; one torch thread); {res['date']}, python "
        f"{res['python']}, torch {res['torch']}. Batch {batch}, {res['max_tokens']} tokens per request "
        f"({steps} steps), medians of {res['rounds']} interleaved rounds.",
        "",
        "Reporting (detokenizing, building outputs), us per step over the generation, and its longest step:",
        "",
        "| requests | us per step | / unstreamed, every step | longest step, us |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {mode} | {med[mode] * 1e3 / steps:.0f} | {med[mode] / med['unstreamed, every step']:.2f}x | "
            f"{top[mode] * 1e3:.0f} |"
            for mode in med
        ),  # fmt: skip
        "",
        "`unstreamed, every step` is the peer: unstreamed requests as they were detokenized before (every step);",
        "`unstreamed` detokenizes in 32-token bursts, staggered over the requests, and at the end (the longest step",
        "holds the last burst of requests that end together). Streamed requests also build an output per step.",
        "",
        f"Handing a step's {batch} outputs to an asyncio event loop that reads them, us on the engine thread:",
        "",
        "| how | us per step | / a wake-up per output |",
        "| --- | ---: | ---: |",
        f"| a wake-up per output (the peer, before) | {dmed['per_output']:.0f} | 1.000x |",
        f"| one wake-up per loop (`deliver`) | {dmed['per_loop']:.0f} | {dmed['per_loop'] / dmed['per_output']:.3f}x |",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = results_parser(__doc__)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    device = f"{cpu_name()}, {os.cpu_count()} cores"
    res = {"device": device, **versions(), **measure(args.batch, args.max_tokens, args.rounds)}
    stem = result_stem(args.out, "host_outputs", "cpu")
    save_results(stem, res)
    render_results(stem, res, markdown)


if __name__ == "__main__":
    main()

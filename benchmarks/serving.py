"""Serving benchmark: request throughput and latency under load.

Drives vlchat's engine in-process (`--backend vlchat`), a running `vlchat serve`
over its OpenAI API with streaming (`--backend openai --base-url ...`), or
transformers on the same workload (`--backend transformers`, the peer: its continuous
batching for text, its batched `generate` with images). Several backends in one run
share the workload.

    python -m benchmarks.serving --shape llama2-7b --num-prompts 1000 --concurrency 128 \
        --backend vlchat transformers --out benchmarks/results/serving-llama2-7b

With `--images N` every request carries N images of drawn sizes (a VLM shape such as
llava-1.5-7b or qwen2.5-vl-7b, see benchmarks/random_vlm.py); the vlchat backend also
reports image preprocessing time (and how much of it ran on the engine thread) and the
vision tower's share of engine step time (benchmarks/serving_images.py).

Prints a table of req/s, input and output tok/s, TTFT/TPOT/ITL mean/median/p99, and
writes <out>.json, <out>.md and <out>.png (latency percentiles and throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import time
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks import random_model, random_vlm, workloads
from benchmarks.report import versions
from benchmarks.serving_images import (
    EngineProbe,
    bench_transformers_generate,
    data_url,
    hf_vlm,
    image_messages,
    image_table,
    prompt_text,
)
from benchmarks.serving_metrics import RequestRecord, summarize, table
from benchmarks.step_profile import profile_decode_step


async def _run_requests(requests, arrivals, concurrency, one_request) -> tuple[list, float]:
    sem = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(requests), desc="requests", unit="req", mininterval=2.0)
    start = time.perf_counter()

    async def task(i, req):
        await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
        async with sem:
            rec = RequestRecord(prompt_len=req.prompt_len, send_time=time.perf_counter())
            try:
                await one_request(i, req, rec)
            except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
                rec.ok, rec.error = False, f"{type(e).__name__}: {e}"[:300]
            bar.update(1)
            return rec

    records = await asyncio.gather(*(task(i, r) for i, r in enumerate(requests)))
    duration = time.perf_counter() - start
    bar.close()
    return list(records), duration


def bench_vlchat(model_dir, requests, arrivals, args) -> tuple[list, float, dict]:
    from vlchat.llm import AsyncEngine, SamplingParams

    # random weights (load_format="dummy") are drawn by each tensor-parallel worker, where a patch of this
    # process's loader would not reach
    engine = AsyncEngine.from_options(str(model_dir), dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                                      max_num_batched_tokens=args.max_num_batched_tokens,
                                      enforce_eager=args.enforce_eager, prefill_delay_steps=args.prefill_delay_steps,
                                      piecewise_graph_tokens=args.piecewise_graph_tokens,
                                      tensor_parallel_size=args.tensor_parallel_size, quantization=args.quantization,
                                      kv_cache_dtype=args.kv_cache_dtype,
                                      load_format="auto" if args.model else "dummy")  # fmt: skip
    probe = EngineProbe(engine) if args.images else None
    peak = [0]  # the most sequences the scheduler ran at once, seen as tokens arrived

    async def one(i, req, rec):
        params = SamplingParams(max_tokens=req.output_len, ignore_eos=True, temperature=0.0)
        prompt = req.prompt_token_ids
        if req.images:  # the images are cut here, as a client would send them; the engine preprocesses them
            prompt = image_messages(req, [im.pil() for im in req.images])
        seen = 0
        async for out in engine.generate(f"bench-{i}", prompt, params):
            if not seen and req.images:
                rec.prompt_len = len(out.prompt_token_ids)  # with the image placeholder tokens
            n = seen + len(out.outputs[0].delta_token_ids)  # the cumulative list would be sliced on every read
            peak[0] = max(peak[0], len(engine.engine.scheduler.running))
            if n > seen:
                rec.token_times.append(time.perf_counter())
                rec.chunk_tokens.append(n - seen)
                seen = n
        rec.output_len = seen

    async def main():
        # warm-up: a few requests outside the timed run (kernels compile, graphs capture)
        warm = [workloads.BenchRequest(r.prompt_token_ids, 8) for r in requests[:4]]
        if args.images:  # other images than the run's, so the prefix cache does not serve the run's first ones
            warm = workloads.with_images(warm, args.images, args.image_min_side, args.image_max_side, args.seed + 7)
        await _run_requests(warm, [0.0] * len(warm), 4, one)
        if probe is not None:
            probe.reset()
        return await _run_requests(requests, arrivals, args.concurrency, one)

    records, duration = asyncio.run(main())
    info = {"kv_blocks_free_after": engine.num_free_blocks(), "kv_cache_tokens": engine.kv_cache_tokens,
            "kv_cache_dtype": args.kv_cache_dtype, "max_running_seqs": peak[0]}  # fmt: skip
    if probe is not None:
        info["images"] = probe.summary()
        probe.detach()  # its wrappers and the engine reference each other: the engine's memory goes with it
    engine.shutdown()
    return records, duration, info


def bench_openai(base_url, requests, arrivals, args) -> tuple[list, float, dict]:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    async def main():
        limits = httpx.Limits(max_connections=args.concurrency + 8)
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=3600, limits=limits) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]

            async def one(i, req, rec):
                content = prompt_text(req)
                if req.images:
                    urls = await asyncio.to_thread(lambda: [data_url(im.pil()) for im in req.images])
                    content = [*({"type": "image_url", "image_url": {"url": u}} for u in urls),
                               {"type": "text", "text": content}]  # fmt: skip
                body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": True,
                        "max_tokens": req.output_len, "ignore_eos": True, "temperature": 0.0,
                        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
                async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                    if resp.status_code != 200:
                        raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
                    async for line in resp.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        before = rec.output_len
                        if chunk.get("usage"):  # every chunk's, where the server keeps continuous usage stats
                            rec.output_len = chunk["usage"]["completion_tokens"]
                            rec.prompt_len = chunk["usage"]["prompt_tokens"]
                        if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                            rec.token_times.append(time.perf_counter())
                            # a chunk may carry several tokens (a server catching up); one where it says nothing
                            rec.chunk_tokens.append(max(1, rec.output_len - before))

            return await _run_requests(requests, arrivals, args.concurrency, one)

    records, duration = asyncio.run(main())
    return records, duration, {"base_url": base_url}


def bench_transformers(model, requests, args) -> tuple[list, float, dict]:
    """transformers' continuous batching: per-request max_new_tokens, EOS disabled."""
    import inspect

    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max(r.output_len for r in requests), do_sample=False,
                           eos_token_id=-1, pad_token_id=0)  # fmt: skip
    records = []
    with model.continuous_batching_context_manager(generation_config=gen) as manager:
        accepts = inspect.signature(manager.add_request).parameters
        start = time.perf_counter()
        by_id = {}
        for i, req in enumerate(requests):
            kwargs = {"request_id": f"r{i}", "max_new_tokens": req.output_len}
            if "streaming" in accepts:
                kwargs["streaming"] = True
            if "eos_token_id" in accepts:
                kwargs["eos_token_id"] = -1
            rec = RequestRecord(prompt_len=req.prompt_len, send_time=start)
            by_id[kwargs["request_id"]] = rec
            records.append(rec)
            manager.add_request(req.prompt_token_ids, **kwargs)
        finished = 0
        bar = tqdm(total=len(requests), desc="transformers", unit="req", mininterval=2.0)
        while finished < len(requests):
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    break
                continue
            rec = by_id[result.request_id]
            n = len(result.generated_tokens)
            if n > rec.output_len:
                rec.token_times.append(time.perf_counter())
                rec.chunk_tokens.append(n - rec.output_len)
                rec.output_len = n
            if result.is_finished():
                finished += 1
                bar.update(1)
        duration = time.perf_counter() - start
        bar.close()
    for rec in records:
        if not rec.token_times:
            rec.ok, rec.error = False, "no result"
    return records, duration, {"note": "all requests submitted at t=0; the manager schedules them"}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = list(results)
    for name in names:
        s = results[name]
        axes[0].plot(["mean", "median", "p99"], [s["ttft_ms"][k] or 0 for k in ("mean", "median", "p99")],
                     marker="o", label=f"{name} TTFT")  # fmt: skip
        axes[0].plot(["mean", "median", "p99"], [s["tpot_ms"][k] or 0 for k in ("mean", "median", "p99")],
                     marker="s", linestyle="--", label=f"{name} TPOT")  # fmt: skip
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms")
    axes[0].set_title("latency")
    axes[0].legend(fontsize=7)
    axes[1].bar(names, [results[n]["request_throughput"] for n in names], color="tab:blue")
    axes[1].set_ylabel("requests / s")
    axes[1].set_title("throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _text_vocab(args, model_dir) -> int:
    if args.shape in random_vlm.SHAPES and not args.model:
        return random_vlm.text_vocab(args.shape)
    if model_dir is None:
        return 32000
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return config.get("vocab_size") or config["text_config"]["vocab_size"]


def environment() -> dict:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return {"device": dev, **versions(transformers=True)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", nargs="+", default=["vlchat"], choices=["vlchat", "openai", "transformers"])
    p.add_argument("--base-url", default="http://127.0.0.1:7860")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", help="model directory (default: a random-weight --shape model)")
    p.add_argument("--shape", default="llama2-7b", choices=sorted(random_model.SHAPES) + sorted(random_vlm.SHAPES))
    p.add_argument("--num-layers", type=int, default=None, help="override the shape's layer count (smoke runs)")
    p.add_argument("--vision-layers", type=int, default=None, help="override a VLM shape's vision tower depth")
    p.add_argument("--model-dir", default=None, help="where the shape's config is written (default /tmp/...)")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--dataset", help="ShareGPT json; default: the built-in sharegpt-like-v1 workload")
    p.add_argument("--images", type=int, default=0, help="images per request (a VLM shape or model)")
    p.add_argument("--image-min-side", type=int, default=336, help="image sides are drawn from [min, max] px")
    p.add_argument("--image-max-side", type=int, default=1344)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument(
        "--peer-num-prompts",
        type=int,
        default=None,
        help="run the transformers peer on the first N prompts only (it is ~10x slower)",
    )
    p.add_argument("--peer-batch", type=int, default=16, help="batch size of transformers' generate with images")
    p.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (inf: all)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vlchat backend: GPUs the model is sharded over")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--piecewise-graph-tokens", type=int, default=0,
                   help="prefill/mixed steps up to this many tokens replay graphs in pieces (0: eager, the default)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "int8", "int4"])
    p.add_argument("--quantization", choices=("fp8",), default=None, help="vlchat: quantize the model at load")
    p.add_argument("--prefill-delay-steps", type=int, default=None,
                   help="SchedulerConfig.prefill_delay_steps (default: the engine's; 0 admits at once)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile-batch", type=int, default=0, help="also profile engine steps at this batch")
    p.add_argument("--profile-only", action="store_true", help="skip the load test, only profile")
    p.add_argument("--out", default=None, help="results path prefix (writes .json, .md, .png)")
    args = p.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = Path(args.model) if args.model else None
    vlm = args.shape in random_vlm.SHAPES
    if args.images and not (vlm or args.model or args.backend == ["openai"]):
        p.error(f"--images needs a VLM: --shape {' or '.join(sorted(random_vlm.SHAPES))}, or --model")
    if model_dir is None and "openai" not in args.backend:
        out_dir = args.model_dir or f"/tmp/vlchat-bench-{args.shape}"
        if vlm:
            model_dir = Path(random_vlm.write_config_dir(out_dir, args.shape, args.num_layers, args.vision_layers,
                                                         dtype=args.dtype))  # fmt: skip
        else:
            fields = dict(random_model.SHAPES[args.shape])
            if args.num_layers is not None:
                fields["num_hidden_layers"] = args.num_layers
            model_dir = Path(random_model.write_config_dir(out_dir, fields, dtype=args.dtype))
    if args.dataset:
        from transformers import AutoTokenizer

        requests = workloads.from_sharegpt_file(
            args.dataset, args.num_prompts, AutoTokenizer.from_pretrained(model_dir)
        )
    else:
        vocab = _text_vocab(args, model_dir)
        requests = workloads.sharegpt_like_v1(args.num_prompts, vocab, seed=args.seed, special_ids=(0, 1))
    if args.images:
        requests = workloads.with_images(requests, args.images, args.image_min_side, args.image_max_side, args.seed)
    arrivals = workloads.arrival_times(len(requests), args.request_rate, seed=args.seed)

    results, extra = {}, {}
    for backend in [] if args.profile_only else args.backend:
        if backend == "vlchat":
            records, duration, info = bench_vlchat(model_dir, requests, arrivals, args)
        elif backend == "openai":
            records, duration, info = bench_openai(args.base_url, requests, arrivals, args)
        else:
            subset = requests[: args.peer_num_prompts] if args.peer_num_prompts else requests
            if args.images:
                hf_model, processor = hf_vlm(args.model, model_dir, dtype, device)
                records, duration, info = bench_transformers_generate(hf_model, processor, subset, args.peer_batch)
            else:
                if args.model:
                    from transformers import AutoModelForCausalLM

                    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
                else:
                    hf_model = random_model.hf_random_model(model_dir, dtype, device)
                records, duration, info = bench_transformers(hf_model, subset, args)
            info["num_prompts"] = len(subset)
            del hf_model
        results[backend] = summarize(records, duration)
        extra[backend] = info
        print(f"{backend}: {results[backend]['request_throughput']:.2f} req/s in {duration:.1f} s", flush=True)
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    if args.profile_only:
        results = {}
    if args.profile_batch:
        try:
            prof = profile_decode_step(model_dir, args, args.profile_batch)
        except Exception as e:  # noqa: BLE001 - the throughput results above still stand
            prof = {"error": f"{type(e).__name__}: {e}", "batch": args.profile_batch, "step_ms": 0.0,
                    "gpu_kernel_ms": 0.0, "host_overhead_ms": 0.0}  # fmt: skip
        extra["decode_step_profile"] = prof
        print(json.dumps(prof, indent=1)[:6000], flush=True)
    report = {"environment": environment(), "workload": {
        "name": args.dataset or "sharegpt-like-v1", "num_prompts": len(requests), "concurrency": args.concurrency,
        "request_rate": args.request_rate, "shape": args.shape, "num_layers": args.num_layers, "dtype": args.dtype,
        "tensor_parallel_size": args.tensor_parallel_size,
        "images_per_request": args.images, "image_sides": [args.image_min_side, args.image_max_side] if args.images
        else None, "vision_layers": args.vision_layers,
        "mean_prompt_len": sum(r.prompt_len for r in requests) / len(requests),
        "mean_output_len": sum(r.output_len for r in requests) / len(requests)},
        "results": results, "backend_info": extra}  # fmt: skip
    md = table(results)
    if "images" in extra.get("vlchat", {}):
        md += "\n\n" + image_table(extra["vlchat"]["images"])
    print(md)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        path = lambda ext: out.parent / (out.name + ext)  # noqa: E731 - with_suffix would cut "llava-1.5-7b" at ".5"
        path(".json").write_text(json.dumps(report, indent=2))
        env = report["environment"]
        header = (f"# Serving benchmark\n\n{env['device']}, torch {env['torch']}, triton {env['triton']}, "
                  f"transformers {env['transformers']}, {env['date']}\n\n"
                  f"Workload: {json.dumps(report['workload'])}\n\n{engine_line(extra.get('vlchat'))}")  # fmt: skip
        path(".md").write_text(header + md + "\n")
        plot(results, path(".png"))


def engine_line(info: dict | None) -> str:
    """The report's line on the vlchat engine's KV cache (empty without a vlchat run)."""
    if not info:
        return ""
    return (f"vlchat engine: {info['kv_cache_dtype']} KV cache of {info['kv_cache_tokens']:,} tokens, at most "
            f"{info['max_running_seqs']} sequences running at once\n\n")


if __name__ == "__main__":
    main()

"""The engine on a GPU: greedy agreement with transformers and with itself, and decode speed.

    PYTHONPATH=. python benchmarks/engine.py [--out DIR] [--tiny]

Model: the "llama-1b" random-weight shape of benchmarks/random_model.py (hidden 2048,
16 layers, 32/8 heads, vocab 32000). For fp16 and bf16, eight prompts of different
lengths, 16 greedy tokens each, compared as whole sequences (and by the length of
the common prefix) between: transformers (sdpa, KV cache) and the engine in one
batch; the engine one prompt at a time; with prefix-cache hits; with chunked
prefill (64-token budget); with a KV pool so small that sequences are preempted;
and with CUDA graphs off. Random weights give flat logits, so bf16/fp16 rounding
differences between implementations (or batch shapes) can flip a near-tie; the
tables report how many sequences agree rather than asserting.
Speed (bf16, CUDA graphs): decode steps per second at batch 1, 32 and 128 with
128-token prompts, eager vs graphs, against transformers' decode step (sdpa,
dynamic cache) and the HBM floor (weights + KV bytes read per step / 4.8 TB/s); each
column the median of 5 rounds taken in turn (one engine instance throughout).
`--tiny` runs the same script on the CPU with a tiny model (fp32) to check it.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import tempfile
import time
import traceback

import torch

from benchmarks.random_model import build
from benchmarks.report import save_results
from benchmarks.runtime import sync, tiny_or_gpu_args
from vlchat.kernels import dispatch
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.config import SchedulerConfig
from vlchat.llm.engine.block_manager import BlockManager
from vlchat.llm.engine.scheduler import Scheduler

HBM_BYTES_PER_S = 4.8e12  # H200
PROMPT_LENS = [5, 17, 33, 48, 64, 97, 130, 200]
NEW_TOKENS = 16
MAX_MODEL_LEN = 2048


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    common = []
    for x, y in zip(a, b, strict=True):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        common.append(n)
    return {"identical": sum(x == y for x, y in zip(a, b, strict=True)), "of": len(a), "common_prefix": common}


@torch.inference_mode()
def hf_greedy(model, ids: list[int], steps: int, device) -> tuple[list[int], float]:
    """transformers' greedy tokens (KV cache) and the log-prob of its first token."""
    out = model(torch.tensor([ids], device=device), use_cache=True)
    logits = out.logits[0, -1].float()
    first_lp = torch.log_softmax(logits, -1).max().item()
    tokens = [int(logits.argmax())]
    past = out.past_key_values
    for _ in range(steps - 1):
        out = model(torch.tensor([[tokens[-1]]], device=device), past_key_values=past, use_cache=True)
        past = out.past_key_values
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens, first_lp


def reconfigure(llm: LLM, num_blocks: int | None = None, budget: int | None = None, prefix: bool = True) -> None:
    """Give the loaded engine a fresh block manager / scheduler (same weights and KV tensors)."""
    e = llm.engine
    e.block_manager = BlockManager(
        num_blocks or e.runner.num_blocks, e.config.cache.block_size, prefix, e.block_manager.run_blocks
    )
    cfg = SchedulerConfig(max_num_seqs=e.config.scheduler.max_num_seqs,
                          max_num_batched_tokens=budget or e.config.scheduler.max_num_batched_tokens)  # fmt: skip
    e.scheduler = Scheduler(cfg, e.block_manager)


def run_correctness(llm: LLM, hf, ps: list[list[int]], device) -> dict:
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    ref = [hf_greedy(hf, p, NEW_TOKENS, device) for p in ps]
    ref_tokens = [r[0] for r in ref]
    reconfigure(llm, prefix=False)
    batch = llm.generate(ps, greedy)
    toks = [o.token_ids for o in batch]
    lp_err = max(abs(next(iter(o.outputs[0].logprobs[0].values())) - r[1]) for o, r in zip(batch, ref, strict=True))
    rows = {"transformers vs engine batch": agreement(ref_tokens, toks)}
    rows["one at a time vs batch"] = agreement([llm.generate([p], greedy)[0].token_ids for p in ps], toks)
    reconfigure(llm, prefix=True)
    llm.generate(ps, greedy)
    hits = llm.generate(ps, greedy)
    rows["prefix-cache hits vs batch"] = agreement([o.token_ids for o in hits], toks)
    rows["prefix-cache hits vs batch"]["cached_tokens"] = sum(o.num_cached_tokens for o in hits)
    reconfigure(llm, budget=64, prefix=False)
    rows["chunked prefill (64) vs batch"] = agreement([o.token_ids for o in llm.generate(ps, greedy)], toks)
    need = max(-(-(len(p) + NEW_TOKENS) // llm.config.cache.block_size) for p in ps)
    reconfigure(llm, num_blocks=need + 8, prefix=False)
    rows["tiny KV pool (preemption) vs batch"] = agreement([o.token_ids for o in llm.generate(ps, greedy)], toks)
    rows["tiny KV pool (preemption) vs batch"]["preemptions"] = llm.engine.scheduler.num_preemptions
    reconfigure(llm, prefix=False)
    graphs, llm.engine.runner.graphs = llm.engine.runner.graphs, None
    eager = [o.token_ids for o in llm.generate(ps, greedy)]
    llm.engine.runner.graphs = graphs
    rows["CUDA graphs off vs on"] = agreement(eager, toks) if graphs is not None else "no graphs (CPU)"
    return {"first_token_logprob_abs_err": lp_err, "comparisons": rows}


def decode_steps_per_s(llm: LLM, batch: int, prompt_len: int, steps: int, vocab: int) -> float:
    engine = llm.engine
    reconfigure(llm, prefix=False)
    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0, max_tokens=steps + 64, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"bench-{batch}-{i}", torch.randint(2, vocab, (prompt_len,), generator=g).tolist(), params)
    while any(s.num_output_tokens == 0 for r in engine.requests.values() for s in r.seqs):
        engine.step()
    for _ in range(3):
        engine.step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    rate = steps / (time.perf_counter() - t0)
    for request_id in list(engine.requests):
        engine.abort(request_id)
    return rate


@torch.inference_mode()
def hf_decode_steps_per_s(hf, batch: int, prompt_len: int, steps: int, vocab: int, device) -> float:
    ids = torch.randint(2, vocab, (batch, prompt_len), device=device)
    out = hf(ids, use_cache=True)
    past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(3):
        out = hf(tok, past_key_values=past, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        out = hf(tok, past_key_values=past, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    return steps / (time.perf_counter() - t0)


def decode_rates(
    llm: LLM, hf, batch: int, steps: int, rounds: int, dtype, weight_bytes: int, device, kv_bytes: int | None = None
) -> dict:
    """One speed row: the engine with CUDA graphs, the engine eager and transformers, measured in turn `rounds`
    times over (each a fresh batch of 128-token prompts and `steps` timed steps); each column is the median of its
    rounds, so a passing change of the GPU's or the host's state moves every column alike. The HBM floor reads the
    weights and `kv_bytes` per step (default: every layer's K/V at the run's mean context)."""
    runs = {"graphs": [], "eager": [], "transformers": []}
    cfg = hf.config
    for _ in range(rounds):
        runs["graphs"].append(decode_steps_per_s(llm, batch, 128, steps, cfg.vocab_size))
        saved, llm.engine.runner.graphs = llm.engine.runner.graphs, None
        try:
            runs["eager"].append(decode_steps_per_s(llm, batch, 128, steps, cfg.vocab_size))
        finally:
            llm.engine.runner.graphs = saved
        runs["transformers"].append(hf_decode_steps_per_s(hf, batch, 128, steps, cfg.vocab_size, device))
    graphs, eager, peer = (statistics.median(runs[k]) for k in ("graphs", "eager", "transformers"))
    kv = batch * (128 + steps // 2) * kv_bytes_per_token(cfg, dtype) if kv_bytes is None else kv_bytes
    floor = HBM_BYTES_PER_S / (weight_bytes + kv)
    return {"batch": batch, "graphs_steps_s": graphs, "eager_steps_s": eager, "transformers_steps_s": peer,
            "hbm_floor_steps_s": floor, "tokens_s": graphs * batch, "vs_transformers": graphs / peer,
            "of_hbm_floor": graphs / floor, "graphs_runs": [round(r, 1) for r in runs["graphs"]]}  # fmt: skip


def kv_bytes_per_token(cfg, dtype) -> int:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def free(*objs) -> None:
    for o in objs:
        if isinstance(o, LLM):
            o.engine.close()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    args, tiny, device = tiny_or_gpu_args()
    from transformers import AutoModelForCausalLM

    work = tempfile.mkdtemp(prefix="vlchat-engine-bench-")
    overrides = dict(num_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512) if tiny else {}  # fmt: skip
    model_dir = str(build("llama-1b", os.path.join(work, "model"), torch.bfloat16, device.type, **overrides))
    dtypes = [torch.float32] if tiny else [torch.float16, torch.bfloat16]
    batches, steps, rounds = ([1, 8], 5, 2) if tiny else ([1, 32, 128], 64, 5)
    stem = os.path.join(args.out, "engine_tiny" if tiny else "engine")
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": _version("triton"),
            "transformers": _version("transformers"),
        },  # fmt: skip
        "model": ("llama-1b shape (random weights)" if not tiny else "tiny llama (CPU check)")
        + f", max_model_len {MAX_MODEL_LEN}",
        "correctness": {},
    }
    bench_llm = None
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        last = dtype == dtypes[-1]
        options = dict(max_num_seqs=max(batches), cache_fraction=0.5) if last else dict(max_num_seqs=8, num_blocks=2048)
        options["max_model_len"] = MAX_MODEL_LEN  # bounds the decode split count the CUDA graphs are captured with
        t0 = time.perf_counter()
        llm = LLM(model_dir, dtype=name, device=device.type, **options)
        load_s = time.perf_counter() - t0
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device).eval()
        vocab = hf.config.vocab_size
        try:
            entry = run_correctness(llm, hf, prompts(vocab), device)
        except Exception as e:  # noqa: BLE001 - report it and go on to the speed runs
            traceback.print_exc()
            entry = {"error": repr(e), "comparisons": {}, "first_token_logprob_abs_err": float("nan")}
        entry["engine_start_s"] = round(load_s, 1)
        entry["kv_blocks"] = llm.engine.runner.num_blocks
        entry["cuda_graphs"] = llm.engine.runner.graphs is not None
        entry["kernels"] = {op: dispatch.choose(op, dtype) for op in dispatch.registered_ops()}
        result["correctness"][name] = entry
        save_results(stem, result, markdown)
        print(f"{name}: correctness done in {time.perf_counter() - t0:.0f} s", flush=True)
        if last:
            bench_llm, hf_bench, bench_dtype = llm, hf, dtype
        else:
            free(llm, hf)
            del llm, hf
    weight_bytes = sum(p.numel() * p.element_size() for p in hf_bench.parameters())
    speed = []
    for batch in batches:
        try:
            row = decode_rates(bench_llm, hf_bench, batch, steps, rounds, bench_dtype, weight_bytes, device)
        except Exception:  # noqa: BLE001 - keep the rows measured so far
            traceback.print_exc()
            break
        speed.append(row)
        print(f"batch {batch}: {row['graphs_steps_s']:.1f} steps/s with graphs (runs {row['graphs_runs']}), "
              f"{row['eager_steps_s']:.1f} eager, {row['transformers_steps_s']:.1f} transformers",
              flush=True)  # fmt: skip
    result["decode"] = {"dtype": str(bench_dtype).removeprefix("torch."), "prompt_len": 128, "steps": steps,
                        "rounds": rounds, "weight_bytes": weight_bytes, "rows": speed}  # fmt: skip
    save_results(stem, result, markdown)


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "absent"


def markdown(result: dict) -> str:
    lines = [f"# Engine on {result['device']}", "",
             f"{result['date']}; {result['model']}; " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
             "", "## Greedy agreement (8 prompts x 16 tokens)", "",
             "| dtype | comparison | identical | common prefix per prompt |", "| --- | --- | --- | --- |"]  # fmt: skip
    for dtype, entry in result["correctness"].items():
        for what, row in entry["comparisons"].items():
            if isinstance(row, str):
                lines.append(f"| {dtype} | {what} | {row} | |")
            else:
                extra = "".join(f"; {k} {row[k]}" for k in ("cached_tokens", "preemptions") if k in row)
                lines.append(f"| {dtype} | {what} | {row['identical']}/{row['of']}{extra} | {row['common_prefix']} |")
    lines += ["", "| dtype | first-token logprob abs err vs transformers | KV blocks | CUDA graphs | kernels |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for dtype, e in result["correctness"].items():
        kernels = ", ".join(f"{k}={v}" for k, v in e["kernels"].items())
        lines.append(
            f"| {dtype} | {e['first_token_logprob_abs_err']:.2e} | {e['kv_blocks']} | {e['cuda_graphs']} | {kernels} |"
        )
    d = result.get("decode", {"dtype": "-", "prompt_len": "-", "steps": "-", "rows": []})
    rounds = f", medians of {d['rounds']} interleaved rounds" if "rounds" in d else ""
    lines += ["", f"## Decode steps/s ({d['dtype']}, prompt {d['prompt_len']}, {d['steps']} timed steps{rounds})", "",
              "| batch | graphs | eager | transformers | HBM floor | tokens/s | vs transformers | of floor "
              "| graph runs |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in d["rows"]:
        lines.append(f"| {r['batch']} | {r['graphs_steps_s']:.1f} | {r['eager_steps_s']:.1f} | "
                     f"{r['transformers_steps_s']:.1f} | {r['hbm_floor_steps_s']:.0f} | {r['tokens_s']:.0f} | "
                     f"{r['vs_transformers']:.2f}x | {r['of_hbm_floor']:.0%} | "
                     f"{r.get('graphs_runs', '')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

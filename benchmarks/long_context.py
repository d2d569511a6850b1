"""Long context on a GPU: Llama-3.1-8B shape (GQA 32/8, llama3 RoPE to 131072), random bf16 weights.

    PYTHONPATH=. python benchmarks/long_context.py [--out DIR] [--smoke] [--render RESULTS.json]

Through the engine (`LLM`, batch 1, CUDA graphs on, chunked prefill with a token
budget of CHUNK_BUDGET per step): prefill time of 32k and 128k prompts (time to
the first token), decode ms/token at those contexts (median step), and the
activation peak above the resting memory (weights + KV pool). transformers
(sdpa, its own KV cache) runs the same shapes in the same process where it fits.
The paged decode attention kernel at 128k context is timed alone (CUDA-graph
replays) against the KV-read floor: K+V bytes / device-to-device copy bandwidth
measured in the same run. Weights are random (throughput does not depend on
them): the benchmark replaces `llm.weights.load_weights` with a random fill, so
no 16 GB checkpoint is written. `--smoke` runs a tiny shape (also on a CPU) to
check the script. Writes long_context_<device>.json and .md under --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time

import torch

from benchmarks.random_model import SHAPES, random_weights, write_config_dir
from benchmarks.report import render_results, result_stem, save_results, versions
from benchmarks.runtime import sync
from vlchat.kernels.device import get_device_info

CHUNK_BUDGET = 8192  # prefill tokens per engine step (max_num_batched_tokens)
DECODE_STEPS = 32
BLOCK = 16
LLAMA31 = dict(SHAPES["llama3-8b"], rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})  # fmt: skip
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=512, max_position_embeddings=1024, rope_theta=500000.0)  # fmt: skip


def _mem():
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def _peak_since_reset():
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0


def _reset_peak():
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _prompt(length: int, vocab: int) -> list[int]:
    return torch.randint(2, vocab, (length,), generator=torch.Generator().manual_seed(length)).tolist()


def run_engine(model_dir: str, contexts: list[int], vocab: int, device: str, budget: int) -> dict:
    from vlchat.llm import LLM, SamplingParams

    max_len = max(contexts)
    with random_weights():
        engine = LLM(model_dir, dtype="bfloat16", device=device, max_num_seqs=1, max_num_batched_tokens=budget,
                     num_blocks=max_len // BLOCK + 8, enable_prefix_caching=False)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_STEPS, ignore_eos=True)
    warm = min(2 * budget + 37, max_len - DECODE_STEPS)  # compiles the prefill (with a prefix) and decode kernels
    engine.generate([_prompt(warm, vocab)], params)
    resting = _mem()
    rows = []
    for ctx in contexts:
        prompt_len = ctx - DECODE_STEPS
        _reset_peak()
        engine.engine.add_request(f"ctx{ctx}", _prompt(prompt_len, vocab), params)
        step_s, first_token_s, start = [], None, time.perf_counter()
        while engine.engine.has_unfinished():
            t0 = time.perf_counter()
            outs = engine.engine.step()  # returns sampled ids on the host: synchronised
            t1 = time.perf_counter()
            if first_token_s is None and outs:
                first_token_s = t1 - start
            elif outs:
                step_s.append(t1 - t0)
        rows.append({
            "context": ctx, "prompt_tokens": prompt_len, "prefill_s": first_token_s,
            "prefill_tok_s": prompt_len / first_token_s, "decode_ms": 1e3 * statistics.median(step_s),
            "decode_steps": len(step_s), "activation_peak_gib": (_peak_since_reset() - resting) / 2**30,
        })  # fmt: skip
        print(f"engine ctx={ctx}: {rows[-1]}", flush=True)
    result = {"resting_gib": resting / 2**30, "chunk_budget": budget, "rows": rows}
    engine.engine.close()
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def run_transformers(fields: dict, contexts: list[int], device: str) -> dict:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**fields, bos_token_id=0, eos_token_id=1, rms_norm_eps=1e-5)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16).eval()
    resting = _mem()
    rows = []
    for ctx in contexts:
        prompt_len = ctx - DECODE_STEPS
        ids = torch.tensor([_prompt(prompt_len, config.vocab_size)], device=device)
        _reset_peak()
        try:
            with torch.no_grad():
                sync()
                t0 = time.perf_counter()
                out = model(ids, use_cache=True, logits_to_keep=1)
                token = out.logits[:, -1:].argmax(-1)
                sync()
                prefill_s = time.perf_counter() - t0
                past, step_s = out.past_key_values, []
                del out
                for _ in range(DECODE_STEPS - 1):
                    t0 = time.perf_counter()
                    out = model(token, past_key_values=past, use_cache=True)
                    token = out.logits[:, -1:].argmax(-1)
                    sync()
                    step_s.append(time.perf_counter() - t0)
                    past = out.past_key_values
            rows.append({
                "context": ctx, "prompt_tokens": prompt_len, "prefill_s": prefill_s,
                "prefill_tok_s": prompt_len / prefill_s, "decode_ms": 1e3 * statistics.median(step_s),
                "activation_peak_gib": (_peak_since_reset() - resting) / 2**30,
            })  # fmt: skip
        except torch.cuda.OutOfMemoryError as e:
            rows.append({"context": ctx, "error": f"out of memory: {str(e)[:120]}"})
        past = out = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(f"transformers ctx={ctx}: {rows[-1]}", flush=True)
    del model
    gc.collect()
    return {"resting_gib": resting / 2**30, "rows": rows}


def decode_attention_vs_floor(ctx: int, q_heads: int, kv_heads: int, head_dim: int = 128) -> dict:
    """The paged decode kernel at batch 1 and `ctx` keys, against K+V bytes over the measured copy bandwidth."""
    from benchmarks.gpu_timing import copy_bandwidth_gbs, graph_time_us
    from vlchat.kernels.attention import paged_decode_attention

    dtype = torch.bfloat16
    blocks = ctx // BLOCK
    k_cache = torch.randn(blocks, BLOCK, kv_heads, head_dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(blocks, device="cuda", dtype=torch.int32)[None]  # shuffled blocks, like a real pool
    seq_lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    q = torch.randn(1, q_heads, head_dim, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    memo = {}  # the layer's cache memo (descriptors, tile-stealing counters)
    us = graph_time_us(
        [lambda: paged_decode_attention(q, k_cache, v_cache, table, seq_lens, head_dim**-0.5, out=out, cache_memo=memo)]
    )
    kv_bytes = 2 * ctx * kv_heads * head_dim * dtype.itemsize
    copy_gbs = copy_bandwidth_gbs()
    floor_us = kv_bytes / (copy_gbs * 1e3)
    return {"context": ctx, "kv_mib": kv_bytes / 2**20, "kernel_us": us, "copy_gbs": copy_gbs,
            "floor_us": floor_us, "ratio_to_floor": us / floor_us, "target_ratio": 1.15}  # fmt: skip


def kernel_check(fields: dict, tokens: int = 4096, device: str = "cuda") -> dict:
    """The decoder ops' Triton kernels at this shape against their torch references (max abs error, bf16)."""
    from vlchat.kernels import dispatch
    from vlchat.kernels.ops.activation import SILU
    from vlchat.kernels.ops.rms_norm import OP as RMS_NORM
    from vlchat.kernels.ops.rotary import OP as ROTARY

    dtype, hidden, heads, kv_heads = torch.bfloat16, fields["hidden_size"], fields["num_attention_heads"], 8
    head_dim = hidden // heads
    x, res = (
        torch.randn(tokens, hidden, device=device, dtype=dtype),
        torch.randn(tokens, hidden, device=device, dtype=dtype),
    )
    w = torch.rand(hidden, device=device, dtype=dtype)
    gate_up = torch.randn(tokens, 2 * fields["intermediate_size"], device=device, dtype=dtype)
    q = torch.randn(tokens, heads, head_dim, device=device, dtype=dtype)
    k = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=dtype)
    positions = torch.randint(0, 131072, (tokens,), device=device)
    freqs = torch.arange(131072, device=device).float()[:, None] * (
        1e-4 ** torch.linspace(0, 1, head_dim // 2, device=device)
    )
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    cases = {
        "rms_norm+residual": (RMS_NORM, (x, w, 1e-5, res), lambda o: o[0]),
        "silu_and_mul": (SILU, (gate_up,), lambda o: o),
        "apply_rotary": (ROTARY, (q, k, positions, cache), lambda o: torch.cat((o[0], o[1]), 1)),
    }
    out = {}
    for name, (op, args, pick) in cases.items():
        if device == "cuda":
            assert dispatch.choose(op, dtype) == "triton", f"{op} does not run on Triton here"
        got = pick(dispatch.get_impl(op, dtype, backend="triton")(*args)).float()
        fp32_args = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
        want = pick(dispatch.get_impl(op, torch.float32, backend="torch")(*fp32_args))
        out[name] = float((got - want).abs().max() / want.abs().max())
    return out


def decode_floor_ms(fields: dict, ctx: int, copy_gbs: float) -> float:
    """One decode token reads every weight but the embedding table once, plus all K and V: bytes / copy bandwidth."""
    h, inter, layers, vocab = (
        fields["hidden_size"],
        fields["intermediate_size"],
        fields["num_hidden_layers"],
        fields["vocab_size"],
    )
    kv_dim = h // fields["num_attention_heads"] * fields["num_key_value_heads"]
    per_layer = h * (h + 2 * kv_dim) + h * h + 3 * h * inter
    weight_bytes = 2 * (layers * per_layer + vocab * h)  # bf16; the LM head, not the embedding lookup
    kv_bytes = 2 * 2 * layers * kv_dim * ctx
    return (weight_bytes + kv_bytes) / (copy_gbs * 1e6)


def markdown(res: dict) -> str:
    lines = [
        f"# Long context: {res['shape']}, bf16, random weights, batch 1",
        "",
        f"{res['device']} ({res['arch']}), torch {res['torch']}, triton {res['triton']}, "
        f"transformers {res['transformers_version']}, {res['date']}. Engine: chunked prefill with a budget of "
        f"{res['chunk_budget']} tokens per step, CUDA graphs for decode. Decode: median of {DECODE_STEPS - 1} steps.",
        "",
        "| context | engine prefill s | tok/s | transformers prefill s | ratio | engine decode ms/tok "
        "| transformers decode ms/tok | ratio | engine activation peak GiB | transformers activation peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    hf = {r["context"]: r for r in res.get("transformers", {}).get("rows", [])}
    for r in res["engine"]["rows"]:
        h = hf.get(r["context"], {})
        if "prefill_s" in h:
            hf_cells = (f"{h['prefill_s']:.2f} | {h['prefill_s'] / r['prefill_s']:.2f}x", f"{h['decode_ms']:.2f} | "
                        f"{h['decode_ms'] / r['decode_ms']:.2f}x", f"{h['activation_peak_gib']:.2f}")  # fmt: skip
        else:
            hf_cells = (f"{h.get('error', 'not run')} | -", "- | -", "-")
        lines.append(
            f"| {r['context']} | {r['prefill_s']:.2f} | {r['prefill_tok_s']:.0f} | {hf_cells[0]} | "
            f"{r['decode_ms']:.2f} | {hf_cells[1]} | {r['activation_peak_gib']:.2f} | {hf_cells[2]} |"
        )
    lines.append("")
    lines.append(
        "Ratios are transformers time / engine time (above 1: the engine is faster). The transformers "
        "peak includes its KV cache, which grows during the forward (4 GiB at 32k, 16 GiB at 128k); the "
        "engine's KV pool is allocated up front and is part of its resting memory."
    )
    lines.append(f"Resting memory (weights + KV pool + graphs): engine {res['engine']['resting_gib']:.1f} GiB.")
    peaks = ", ".join(f"{r['activation_peak_gib']:.2f} GiB at {r['context']}" for r in res["engine"]["rows"])
    lines.append(f"Chunked prefill: with a budget of {res['engine']['chunk_budget']} tokens per step the engine's "
                 f"activation peak is {peaks}: set by the budget, not by the prompt length.")  # fmt: skip
    if "kernel_check_rel_err" in res:
        errs = ", ".join(f"{k} {v:.1e}" for k, v in res["kernel_check_rel_err"].items())
        lines.append(f"Decoder ops (Triton, bf16) against their fp32 references, max error / max value: {errs}.")
    a = res.get("decode_attention")
    if a and "smoke" not in res["shape"]:
        floors = [(r["context"], r["decode_ms"], decode_floor_ms(LLAMA31, r["context"], a["copy_gbs"]))
                  for r in res["engine"]["rows"]]  # fmt: skip
        cells = "; ".join(f"{c}: {ms:.2f} ms vs {f:.2f} ms ({ms / f:.2f}x)" for c, ms, f in floors)
        lines.append(f"Engine decode step against its HBM floor (all weights but the embedding + all K/V, read once "
                     f"at the copy bandwidth): {cells}.")  # fmt: skip
    if a:
        lines += [
            "",
            f"Paged decode attention alone at {a['context']} keys (32/8 heads, head_dim 128, one layer): "
            f"{a['kernel_us']:.1f} us against a KV-read floor of {a['floor_us']:.1f} us "
            f"({a['kv_mib']:.0f} MiB at the measured copy bandwidth {a['copy_gbs']:.0f} GB/s): "
            f"{a['ratio_to_floor']:.3f}x the floor (target <= {a['target_ratio']}x: "
            f"{'met' if a['ratio_to_floor'] <= a['target_ratio'] else 'missed'}).",
        ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--smoke", action="store_true", help="tiny shape and contexts: checks the script")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--render", metavar="JSON", help="only rewrite the Markdown next to a results JSON")
    args = parser.parse_args()
    if args.render:
        with open(args.render) as f:
            result = json.load(f)
        render_results(args.render.removesuffix(".json"), result, markdown)
        return
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = get_device_info()
    fields = SMOKE if args.smoke else LLAMA31
    contexts = [256, 512] if args.smoke else [32768, 131072]
    res = {"shape": "tiny (smoke)" if args.smoke else "Llama-3.1-8B (32 layers, hidden 4096, GQA 32/8)",
           "device": info.name, "arch": info.arch, **versions(), "transformers_version": transformers.__version__,
           "chunk_budget": 128 if args.smoke else CHUNK_BUDGET, "decode_steps": DECODE_STEPS}  # fmt: skip
    stem = result_stem(args.out, "long_context", info.name)
    if device == "cuda":
        res["kernel_check_rel_err"] = kernel_check(fields)
        print(f"decoder ops, Triton vs fp32 reference (max abs err / max abs): {res['kernel_check_rel_err']}")
        res["decode_attention"] = decode_attention_vs_floor(contexts[-1], fields["num_attention_heads"],
                                                            fields["num_key_value_heads"])  # fmt: skip
        print(f"decode attention: {res['decode_attention']}", flush=True)
        torch.cuda.empty_cache()
        save_results(stem, res)
    with tempfile.TemporaryDirectory() as model_dir:
        write_config_dir(model_dir, fields)
        res["engine"] = run_engine(model_dir, contexts, fields["vocab_size"], device, res["chunk_budget"])
    save_results(stem, res)
    if not args.skip_transformers:
        res["transformers"] = run_transformers(fields, contexts, device)
    save_results(stem, res, markdown)


if __name__ == "__main__":
    main()

"""A million tokens of context on one GPU: Llama-3-8B shape (bf16, random weights) with a quantized KV cache.

    python -m benchmarks.million_context [--out DIR] [--kv-cache-dtype fp8] [--context N] [--prefill N] [--smoke]

Through the engine (`LLM`, batch 1, max_model_len = --context, the pool sized from free memory as `vlchat serve`
sizes it, CUDA graphs on):

- start: the engine starts at max_model_len --context (the pool must hold it) and its pool's tokens;
- prefill: a prompt of --prefill tokens (chunked, CHUNK_BUDGET tokens per step), time to the first token, tok/s,
  and against the FLOP floor: the prompt's causal attention FLOPs (4 * layers * q_heads * head_dim * n^2 / 2) plus
  its GEMM FLOPs (2 * parameters but the embedding * n) at the bf16 GEMM rate measured in the same run;
- decode at --context tokens: the model runner's decode step (a CUDA-graph replay) over a sequence whose first
  --context - 1 rows are already in the pool (zeros: the time does not depend on their values), median of
  DECODE_STEPS steps, against its HBM floor: every weight but the embedding plus every K/V byte of the context
  (scales included), read once at the copy bandwidth measured in the same run;
- capacity: the most tokens this pool's bytes hold per cache format (one sequence may take them all).

`--smoke` runs a tiny shape on the CPU (contexts of a few hundred tokens) to check the script. Writes
million_context_<device>.json and .md under --out.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time

import torch

from benchmarks.random_model import SHAPES, random_weights, write_config_dir
from benchmarks.report import cpu_name, result_stem, results_parser, save_results, versions, versions_line
from vlchat.kernels.attention import kv_quant

CHUNK_BUDGET = 8192
DECODE_STEPS = 16
FIELDS = dict(SHAPES["llama3-8b"])  # max_model_len overrides its positions (llm/rope.py extends the tables)
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=512, max_position_embeddings=1024, rope_theta=500000.0)  # fmt: skip


def gemm_tflops(device: str) -> float:
    """bf16 GEMM rate (8192^3) on the GPU, TFLOP/s; on the CPU fp32 at 1024^3."""
    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    t0 = time.perf_counter()
    reps = 20 if device == "cuda" else 2
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def weight_bytes(fields: dict) -> int:
    """Bytes of every bf16 weight one decode step reads (all but the embedding table; the LM head untied)."""
    return 2 * (non_embedding_params(fields) + fields["vocab_size"] * fields["hidden_size"])


def non_embedding_params(fields: dict) -> int:
    h, inter, layers = fields["hidden_size"], fields["intermediate_size"], fields["num_hidden_layers"]
    kv_dim = h // fields["num_attention_heads"] * fields["num_key_value_heads"]
    return layers * (h * (h + 2 * kv_dim) + h * h + 3 * h * inter)


def kv_bytes_per_token(fields: dict, kv_cache_dtype: str) -> int:
    head_dim = fields["hidden_size"] // fields["num_attention_heads"]
    per_layer = kv_quant.bytes_per_token(kv_cache_dtype, fields["num_key_value_heads"], head_dim, torch.bfloat16)
    return fields["num_hidden_layers"] * per_layer


def prefill_flops(fields: dict, n: int) -> tuple[float, float]:
    """(causal attention FLOPs, GEMM FLOPs) of a prompt of n tokens (module doc)."""
    head_dim = fields["hidden_size"] // fields["num_attention_heads"]
    attn = 4.0 * fields["num_hidden_layers"] * fields["num_attention_heads"] * head_dim * n * n / 2
    gemm = 2.0 * (non_embedding_params(fields) + fields["vocab_size"] * fields["hidden_size"] / n) * n
    return attn, gemm


def capacity(pool_bytes: int, fields: dict) -> dict:
    """The most tokens `pool_bytes` of KV cache hold, per format."""
    return {name: pool_bytes // kv_bytes_per_token(fields, name) for name in kv_quant.KV_CACHE_DTYPES}


def time_prefill(llm, prompt_len: int, vocab: int) -> float:
    """Seconds to the first token of a prompt of `prompt_len` random tokens."""
    from vlchat.llm import SamplingParams

    prompt = torch.randint(2, vocab, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engine = llm.engine
    engine.add_request("prefill", prompt, params)
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def time_decode(llm, context: int, steps: int = DECODE_STEPS) -> list[float]:
    """Seconds per decode step of one sequence holding `context` tokens (its first context - 1 rows taken as
    written), through the model runner as the engine launches a step."""
    from vlchat.llm import SamplingParams
    from vlchat.llm.engine.sequence import Sequence
    from vlchat.llm.inputs import MultiModalPrompt

    runner = llm.engine.runner
    bs = runner.block_size
    blocks = math.ceil((context + steps) / bs)
    if blocks > runner.num_blocks:
        raise SystemExit(f"the pool holds {runner.num_blocks * bs} tokens, fewer than {context + steps}")
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    seq = Sequence("decode", MultiModalPrompt([0] * context), params, bs)
    seq.block_table = list(range(blocks))
    times = []
    for _ in range(steps):
        seq.num_computed_tokens, seq.num_new_tokens = seq.num_tokens - 1, 1
        t0 = time.perf_counter()
        out = runner.launch([seq]).result()  # the sampled token on the host: synchronised
        times.append(time.perf_counter() - t0)
        seq.append_token(out.token_ids[0])
    return times


def markdown(res: dict) -> str:
    d, p = res["decode"], res["prefill"]
    lines = [
        f"# A million-token context on {res['device']}: {res['shape']}, {res['kv_cache_dtype']} KV cache", "",
        f"{versions_line(res)}. bf16 weights (random), batch 1, chunked prefill of {res['chunk_budget']} tokens "
        f"per step, CUDA-graph decode. The engine started with max_model_len {res['context']:,}: KV pool of "
        f"{res['pool_tokens']:,} tokens ({res['pool_gib']:.1f} GiB).", "",
        "| measure | value | floor | of floor |",
        "|---|---|---|---|",
        f"| decode at {res['context']:,} tokens, ms/token | {d['ms']:.2f} | {d['floor_ms']:.2f} "
        f"(weights {d['weight_gib']:.1f} GiB + KV {d['kv_gib']:.1f} GiB at {res['copy_gbs']:.0f} GB/s) | "
        f"{d['ms'] / d['floor_ms']:.2f}x |",
        f"| prefill of {p['tokens']:,} tokens, s | {p['s']:.1f} ({p['tokens'] / p['s']:,.0f} tok/s) | "
        f"{p['floor_s']:.1f} (attention {p['attn_tflop']:.0f} + GEMM {p['gemm_tflop']:.0f} TFLOP at "
        f"{res['gemm_tflops']:.0f} TFLOP/s) | {p['floor_s'] / p['s']:.2f} of the FLOP rate |",
        "", "Capacity of this pool, one sequence: " + ", ".join(
            f"{name} {tokens:,} tokens" for name, tokens in res["capacity"].items()) + ".",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks.gpu_timing import copy_bandwidth_gbs
    from vlchat.llm import LLM

    ap = results_parser(__doc__)
    ap.add_argument("--kv-cache-dtype", default="fp8", choices=list(kv_quant.KV_CACHE_DTYPES))
    ap.add_argument("--context", type=int, default=1 << 20)
    ap.add_argument("--prefill", type=int, default=1 << 19)
    ap.add_argument("--smoke", action="store_true", help="tiny shape and contexts on the CPU: checks the script")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    fields = SMOKE if args.smoke else FIELDS
    context, prefill = (512, 256) if args.smoke else (args.context, args.prefill)
    budget = 64 if args.smoke else CHUNK_BUDGET
    options = {"cpu_cache_gb": 0.05} if args.smoke else {}
    with tempfile.TemporaryDirectory() as model_dir:
        write_config_dir(model_dir, fields)
        with random_weights():
            llm = LLM(model_dir, dtype="bfloat16", device=device, max_num_seqs=1, max_num_batched_tokens=budget,
                      max_model_len=context, kv_cache_dtype=args.kv_cache_dtype, enable_prefix_caching=False,
                      **options)  # fmt: skip
    runner = llm.engine.runner
    pool_bytes = runner.num_blocks * runner.block_bytes()
    name = cpu_name() if args.smoke else torch.cuda.get_device_name()
    res = {"device": name, **versions(), "shape": "tiny (smoke)" if args.smoke else "Llama-3-8B (32 layers, GQA 32/8)",
           "kv_cache_dtype": args.kv_cache_dtype, "context": context, "chunk_budget": budget,
           "pool_tokens": llm.engine.kv_cache_tokens, "pool_gib": pool_bytes / 2**30,
           "capacity": capacity(pool_bytes, fields),
           "copy_gbs": 1e3 if args.smoke else copy_bandwidth_gbs(), "gemm_tflops": gemm_tflops(device)}  # fmt: skip
    stem = result_stem(args.out, f"million_context_{args.kv_cache_dtype}", name)
    print(f"engine started: {res['pool_tokens']:,} tokens of KV; capacity {res['capacity']}", flush=True)
    steps = time_decode(llm, context - DECODE_STEPS)
    kv = context * kv_bytes_per_token(fields, args.kv_cache_dtype)
    floor_ms = (weight_bytes(fields) + kv) / (res["copy_gbs"] * 1e6)
    res["decode"] = {"ms": 1e3 * statistics.median(steps), "floor_ms": floor_ms, "steps": len(steps),
                     "weight_gib": weight_bytes(fields) / 2**30, "kv_gib": kv / 2**30}  # fmt: skip
    print(f"decode: {res['decode']}", flush=True)
    save_results(stem, res)
    seconds = time_prefill(llm, prefill, fields["vocab_size"])
    attn, gemm = prefill_flops(fields, prefill)
    res["prefill"] = {"tokens": prefill, "s": seconds, "attn_tflop": attn / 1e12, "gemm_tflop": gemm / 1e12,
                      "floor_s": (attn + gemm) / (res["gemm_tflops"] * 1e12)}  # fmt: skip
    llm.close()
    save_results(stem, res, markdown)


if __name__ == "__main__":
    main()

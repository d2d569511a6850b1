"""Gemma 3 270M on a GPU: bf16 decode tokens/s at batch 1 and 64, vlchat vs transformers in the same run.

    PYTHONPATH=. python benchmarks/gemma3.py [--out DIR] [--tiny]

Model: the Gemma 3 270M configuration (18 layers, 15 sliding-window of 512 and 3 global, hidden 640,
4 query / 1 KV heads of 256, vocab 262144, tied head) with RANDOM weights: the real checkpoint is a
240 MB GGUF, too big to travel to the GPU machine, and throughput does not depend on weight values
when generation lengths are fixed. Greedy agreement with transformers on a few prompts is reported
(random weights give flat logits, so bf16 near-ties can flip; the CPU tests check exact agreement
in fp32 on the real weights). Speed: decode steps/s after a 128-token prompt, 64 timed steps, with
CUDA graphs and eager, against transformers (sdpa, its own cache) and the HBM floor
(weights + KV read per step / 4.8 TB/s); each column the median of ROUNDS rounds taken in turn (a single
measurement of these host-bound steps moved by up to 40% between runs on one H200). `--tiny` checks the script
on the CPU with a tiny config.
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile
import time

import torch

from benchmarks.engine import (
    _version,
    agreement,
    decode_rates,
    hf_greedy,
    reconfigure,
)
from benchmarks.random_model import word_level_tokenizer
from benchmarks.report import result_stem, save_results
from benchmarks.runtime import tiny_or_gpu_args
from vlchat.llm import LLM, SamplingParams

GEMMA3_270M = dict(
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
    max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=16)  # fmt: skip
PROMPT_LEN, NEW_TOKENS = 128, 16  # decode_rates times steps after prompts of 128 tokens
ROUNDS = 5  # each speed column is the median of this many rounds, taken in turn (benchmarks.engine.decode_rates)
VERSIONED = ("torch", "triton", "transformers")


def build(out_dir: str, fields: dict, dtype: torch.dtype, device: str):
    """Save a random Gemma3ForCausalLM (HF directory + word-level tokenizer); return (dir, transformers model)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**fields, bos_token_id=0, eos_token_id=1, pad_token_id=1,
                              torch_dtype=str(dtype).removeprefix("torch."))  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = Gemma3ForCausalLM(config).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() == 2 else p.normal_(0.0, 0.1)  # norms are (1 + w)
    model.save_pretrained(out_dir)
    word_level_tokenizer(config.vocab_size).save_pretrained(out_dir)
    model.config._attn_implementation = "sdpa"
    return out_dir, model.eval()


def kv_bytes(cfg, batch: int, length: int, dtype) -> int:
    """K/V bytes one decode step reads: global layers the whole context, sliding layers their window."""
    per_token_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * torch.empty(0, dtype=dtype).element_size()
    return (
        batch
        * per_token_layer
        * sum(length if kind == "full_attention" else min(length, cfg.sliding_window) for kind in cfg.layer_types)
    )


def main() -> None:
    args, tiny, device = tiny_or_gpu_args()
    dtype = torch.float32 if tiny else torch.bfloat16
    batches, steps, rounds = ([1, 4], 5, 2) if tiny else ([1, 64], 64, ROUNDS)
    t_start = time.perf_counter()
    model_dir, hf = build(tempfile.mkdtemp(prefix="vlchat-gemma3-"), TINY if tiny else GEMMA3_270M, dtype, device.type)
    cfg = hf.config
    llm = LLM(model_dir, dtype=str(dtype).removeprefix("torch."), device=device.type,
              max_num_seqs=max(batches), max_model_len=1024, cache_fraction=0.3)  # fmt: skip
    start_s = time.perf_counter() - t_start

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, cfg.vocab_size, (n,), generator=g).tolist() for n in (7, 33, 100, 600)]
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    reconfigure(llm, prefix=False)
    ours = [o.token_ids for o in llm.generate(prompts, greedy)]
    ref = [hf_greedy(hf, p, NEW_TOKENS, device)[0] for p in prompts]
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": dict(python=platform.python_version(), **{m: _version(m) for m in VERSIONED}),
        "model": ("Gemma 3 270M config" if not tiny else "tiny Gemma 3 config (CPU check)")
        + ", RANDOM weights (the real GGUF does not travel to the GPU machine)",
        "dtype": str(dtype).removeprefix("torch."),
        "engine_start_s": round(start_s, 1),
        "kv_blocks": llm.engine.runner.num_blocks,
        "cuda_graphs": llm.engine.runner.graphs is not None,
        "greedy_vs_transformers": agreement(ref, ours) | {"prompt_lens": [len(p) for p in prompts]},
        "rounds": rounds,
        "rows": [],
    }
    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())  # the tied head is read once more
    weight_bytes += hf.lm_head.weight.numel() * hf.lm_head.weight.element_size()
    for batch in batches:
        kv = kv_bytes(cfg, batch, PROMPT_LEN + steps, dtype)  # sliding layers read their window only
        row = decode_rates(llm, hf, batch, steps, rounds, dtype, weight_bytes, device, kv_bytes=kv)
        row["transformers_tokens_s"] = row["transformers_steps_s"] * batch
        result["rows"].append(row)
        print(
            f"batch {batch}: {row['graphs_steps_s']:.0f} steps/s graphs {row['graphs_runs']}, "
            f"{row['eager_steps_s']:.0f} eager, {row['transformers_steps_s']:.0f} transformers",
            flush=True,
        )
    stem = os.path.join(args.out, "gemma3_tiny") if tiny else result_stem(args.out, "gemma3", result["device"])
    save_results(stem, result, markdown)


def markdown(result: dict) -> str:
    agree = result["greedy_vs_transformers"]
    lines = [
        f"# Gemma 3 270M decode on {result['device']}", "",
        f"{result['date']}; {result['model']}; {result['dtype']}; "
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), "",
        f"Engine start {result['engine_start_s']} s (build + load + CUDA graphs), {result['kv_blocks']} KV blocks. "
        f"Greedy {NEW_TOKENS} tokens vs transformers on prompts of {agree['prompt_lens']} tokens: "
        f"{agree['identical']}/{agree['of']} identical, common prefixes {agree['common_prefix']} "
        "(random weights: flat logits, bf16 near-ties).", "",
        f"Decode after a {PROMPT_LEN}-token prompt" + (f", medians of {result['rounds']} interleaved rounds (graph "
        "runs in the last column)" if "rounds" in result else "") + ":", "",
        "| batch | vlchat steps/s (graphs) | eager | transformers | vlchat tokens/s | transformers tokens/s "
        "| vs transformers | HBM floor steps/s | of floor | graph runs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for r in result["rows"]:
        lines.append(
            f"| {r['batch']} | {r['graphs_steps_s']:.0f} | {r['eager_steps_s']:.0f} | {r['transformers_steps_s']:.0f} "
            f"| {r['tokens_s']:.0f} | {r['transformers_tokens_s']:.0f} | {r['vs_transformers']:.2f}x "
            f"| {r['hbm_floor_steps_s']:.0f} | {r['of_hbm_floor']:.0%} | {r.get('graphs_runs', '-')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

"""Throughput with grammar-constrained requests in the batch against the same batch unconstrained.

    python -m benchmarks.structured_output [--out DIR] [--tiny]

Model: the "llama2-7b" random-weight shape (benchmarks/random_model.py) with a 32000-token byte-level BPE tokenizer
(so that JSON and regex text can be written in it), bf16, CUDA graphs, async scheduling. Workload: 128 concurrent
requests (max_num_seqs 128) of 128 prompt tokens, 256 new tokens each, temperature 1, seeded. Three batches, timed
in turn for 3 rounds (median):
- unconstrained: all 128 requests free;
- regex half: 64 of them constrained to `[a-z ]+` (a grammar that never ends by itself, so every request runs its
  256 tokens and the batches compare at equal work);
- json half: 64 of them constrained to a receipt JSON schema (they end when their JSON is complete; throughput
  is tokens per second over the tokens generated).
EOS gets a logit bias of -100 in every batch, so that random weights do not end requests early. The issue's target
is the regex-half throughput within 10% of unconstrained. `--tiny` checks the script on the CPU with a tiny model.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch

from benchmarks.grammar_overhead import SCHEMA
from benchmarks.random_model import SHAPES, random_weights, write_config_dir
from benchmarks.report import cpu_name, result_stem, save_results, versions
from benchmarks.runtime import sync, tiny_or_gpu_args
from vlchat.llm import LLM, SamplingParams, StructuredOutputParams

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=1024, max_position_embeddings=1024, rope_theta=10000.0)  # fmt: skip
ROUNDS = 3


def batches(concurrency: int, new_tokens: int, eos: int) -> dict[str, list[SamplingParams]]:
    def params(i: int, spec: StructuredOutputParams | None) -> SamplingParams:
        return SamplingParams(temperature=1.0, seed=i, max_tokens=new_tokens, logit_bias={eos: -100.0},
                              structured_output=spec)  # fmt: skip

    regex, schema = StructuredOutputParams(regex="[a-z ]+"), StructuredOutputParams(json_schema=SCHEMA)
    return {
        "unconstrained": [params(i, None) for i in range(concurrency)],
        "regex half": [params(i, regex if i % 2 else None) for i in range(concurrency)],
        "json half": [params(i, schema if i % 2 else None) for i in range(concurrency)],
    }


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, int]:
    sync()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync()
    return time.perf_counter() - t0, sum(len(o.token_ids) for o in outs)


def markdown(res: dict) -> str:
    lines = [f"# Structured output throughput ({res['device']}, {res['shape']})", "",
             f"{res['date']}; torch {res['torch']}, triton {res.get('triton')}, llguidance {res['llguidance']}; "
             f"{res['concurrency']} concurrent requests, {res['prompt_len']} prompt tokens, {res['new_tokens']} new "
             "tokens (median of rounds)", "",
             "| batch | tokens | seconds | tokens/s | vs unconstrained |", "|---|---|---|---|---|"]  # fmt: skip
    base = next(r["tokens_per_s"] for r in res["rows"] if r["batch"] == "unconstrained")
    for r in res["rows"]:
        lines.append(f"| {r['batch']} | {r['tokens']} | {r['seconds']:.3f} | {r['tokens_per_s']:.0f} | "
                     f"{r['tokens_per_s'] / base:.3f}x |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    from importlib.metadata import version

    args, tiny, device = tiny_or_gpu_args()
    shape = "tiny" if tiny else "llama2-7b"
    fields = TINY if tiny else SHAPES[shape]
    concurrency, new_tokens, prompt_len = (8, 16, 16) if tiny else (128, 256, 128)
    model_dir = write_config_dir(os.path.join(tempfile.mkdtemp(prefix="vlchat-so-"), "model"), fields,
                                 dtype="float32" if tiny else "bfloat16", tokenizer="byte-bpe")  # fmt: skip
    with random_weights():
        llm = LLM(model_dir, dtype="float32" if tiny else "bfloat16", device=device.type, max_num_seqs=concurrency,
                  max_model_len=1024 if tiny else 2048)  # fmt: skip
    eos = llm.tokenizer.eos_token_id
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, fields["vocab_size"], (prompt_len,), generator=g).tolist() for _ in range(concurrency)]
    work = batches(concurrency, new_tokens, eos)
    for params in work.values():  # warm-up: graphs, Triton, llguidance's token tables
        run(llm, prompts, params)
    times: dict[str, list[tuple[float, int]]] = {name: [] for name in work}
    for _ in range(ROUNDS):
        for name, params in work.items():
            times[name].append(run(llm, prompts, params))
    rows = []
    for name, runs in times.items():
        seconds = statistics.median(t for t, _ in runs)
        tokens = int(statistics.median(n for _, n in runs))
        rows.append({"batch": name, "tokens": tokens, "seconds": seconds,
                     "tokens_per_s": statistics.median(n / t for t, n in runs)})  # fmt: skip
    dev = cpu_name() if tiny else torch.cuda.get_device_name()
    res = {"device": dev, "shape": shape, **versions(), "llguidance": version("llguidance"),
           "concurrency": concurrency, "prompt_len": prompt_len, "new_tokens": new_tokens,
           "async_scheduling": llm.engine.async_scheduling, "rows": rows}  # fmt: skip
    save_results(result_stem(args.out, "structured_output", "cpu-tiny" if tiny else dev), res, markdown)
    llm.close()


if __name__ == "__main__":
    main()

"""Host cost per decode step of grammar-constrained rows: xgrammar against llguidance.

Per step, for `constrained` rows of a batch: fill the next-token bitmask of every constrained row, then advance
each row's matcher by one token (a random allowed one; a row whose grammar completes starts over). That is the
host work the engine adds per step for structured output (the mask is applied on the device afterwards). The
tokenizer is a 32000-token byte-level BPE (Llama-2's vocabulary size, benchmarks/random_model.byte_bpe_tokenizer).

    python -m benchmarks.grammar_overhead --batch 128 --constrained 64 --steps 200

prints a table and writes benchmarks/results/grammar_overhead_<device>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.random_model import byte_bpe_tokenizer

SCHEMA = {  # a receipt: what structured output from an image typically asks for
    "type": "object",
    "properties": {
        "merchant": {"type": "string"},
        "date": {"type": "string"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["name", "qty", "price"]}},
        "total": {"type": "number"},
        "paid": {"type": "boolean"},
    },
    "required": ["merchant", "date", "items", "total", "paid"],
}  # fmt: skip


def _pick(bitmask_row: np.ndarray, vocab: int, rng: np.random.Generator) -> int:
    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")[:vocab]
    allowed = np.flatnonzero(bits)
    return int(rng.choice(allowed))


def run_xgrammar(tok, n: int, steps: int, eos: int) -> list[float]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[eos])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(n)]
    batch = xgr.BatchGrammarMatcher()
    bitmask = xgr.allocate_token_bitmask(n, len(tok))
    rng, times = np.random.default_rng(0), []
    for _ in range(steps):
        t0 = time.perf_counter()
        batch.batch_fill_next_token_bitmask(matchers, bitmask)
        fill = time.perf_counter() - t0
        picks = [_pick(bitmask[i].numpy(), len(tok), rng) for i in range(n)]
        t1 = time.perf_counter()
        for m, t in zip(matchers, picks, strict=True):
            assert m.accept_token(t)
            if m.is_terminated():
                m.reset()
        times.append(fill + time.perf_counter() - t1)
    return times


def run_llguidance(tok, n: int, steps: int, eos: int) -> list[float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok), eos_token=eos)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(SCHEMA), defaults={"whitespace_flexible": False}
    )
    matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(n)]
    executor = llguidance.LLExecutor()
    bitmask = lt.allocate_token_bitmask(n, len(tok))
    rng, times = np.random.default_rng(0), []
    for _ in range(steps):
        t0 = time.perf_counter()
        lt.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        fill = time.perf_counter() - t0
        picks = [_pick(bitmask[i].numpy(), len(tok), rng) for i in range(n)]
        t1 = time.perf_counter()
        for m, t in zip(matchers, picks, strict=True):
            assert m.consume_token(t), m.get_error()
            if m.is_stopped():
                m.reset()
        times.append(fill + time.perf_counter() - t1)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--constrained", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    tok = byte_bpe_tokenizer(args.vocab)
    eos = tok.eos_token_id
    rows = []
    for name, fn in (("xgrammar", run_xgrammar), ("llguidance", run_llguidance)):
        fn(tok, args.constrained, 10, eos)  # warm-up: compilation and thread pools
        times = fn(tok, args.constrained, args.steps, eos)
        rows.append({"library": name, "median_ms": 1e3 * statistics.median(times),
                     "p90_ms": 1e3 * float(np.percentile(times, 90)),
                     "mean_ms": 1e3 * statistics.fmean(times)})  # fmt: skip
    versions = {"torch": torch.__version__}
    for lib in ("xgrammar", "llguidance"):
        try:
            from importlib.metadata import version

            versions[lib] = version(lib)
        except Exception:  # noqa: BLE001 - the table still names the others
            versions[lib] = "unknown"
    device = f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"
    print(f"host cost per step, {args.constrained} constrained rows of {args.batch}, vocab {args.vocab}, {device}")
    print(f"{'library':<12} {'median ms':>10} {'p90 ms':>10} {'mean ms':>10}")
    for r in rows:
        print(f"{r['library']:<12} {r['median_ms']:>10.3f} {r['p90_ms']:>10.3f} {r['mean_ms']:>10.3f}")
    out = Path(__file__).parent / "results" / "grammar_overhead_cpu.json"
    out.write_text(json.dumps({"benchmark": "grammar_overhead", "device": device, "versions": versions,
                               "date": datetime.date.today().isoformat(), "args": vars(args), "rows": rows},
                              indent=2) + "\n")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

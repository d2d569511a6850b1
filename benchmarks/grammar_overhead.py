"""Host cost per decode step of grammar-constrained rows: xgrammar against llguidance.

Per step, for `constrained` rows of a batch: fill the next-token bitmask of every constrained row, then advance
each row's matcher by one token (a random allowed one; a row whose grammar completes starts over). That is the
host work the engine adds per step for structured output (the mask is applied on the device afterwards). The
tokenizer is a 32000-token byte-level BPE (Llama-2's vocabulary size, benchmarks/random_model.byte_bpe_tokenizer).

    python -m benchmarks.grammar_overhead --batch 128 --constrained 64 --steps 200

prints a table and writes benchmarks/results/grammar_overhead_cpu.{json,md} (the host's CPU named inside).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.random_model import byte_bpe_tokenizer
from benchmarks.report import cpu_name, results_parser, save_results

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


ROUNDS = 3


def _pick(bitmask_row: np.ndarray, vocab: int, rng: np.random.Generator) -> int:
    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")[:vocab]
    allowed = np.flatnonzero(bits)
    return int(rng.choice(allowed))


def _fresh_schemas(k: int) -> list[str]:
    """`k` different texts of the receipt schema (a compiler's cache cannot answer them)."""
    return [json.dumps({**SCHEMA, "description": f"receipt {i}"}) for i in range(k)]


def first_mask_xgrammar(tok, eos: int, k: int) -> list[float]:
    """Seconds from a new schema to its first mask (what a request with a schema not seen before waits)."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    bitmask, times = xgr.allocate_token_bitmask(1, len(tok)), []
    for schema in _fresh_schemas(k):
        t0 = time.perf_counter()
        xgr.GrammarMatcher(compiler.compile_json_schema(schema, any_whitespace=False)).fill_next_token_bitmask(bitmask)
        times.append(time.perf_counter() - t0)
    return times


def first_mask_llguidance(tok, eos: int, k: int) -> list[float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok), eos_token=eos)
    bitmask, times = lt.allocate_token_bitmask(1, len(tok)), []
    for schema in _fresh_schemas(k):
        t0 = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        lt.fill_next_token_bitmask(llguidance.LLMatcher(lltok, grammar), bitmask)
        times.append(time.perf_counter() - t0)
    return times


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
    parser = results_parser(__doc__)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--constrained", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    tok = byte_bpe_tokenizer(args.vocab)
    eos = tok.eos_token_id
    libraries = {"xgrammar": run_xgrammar, "llguidance": run_llguidance}
    samples: dict[str, list[float]] = {name: [] for name in libraries}
    for fn in libraries.values():
        fn(tok, args.constrained, 10, eos)  # warm-up: compilation and thread pools
    for _ in range(ROUNDS):  # the libraries in turn, so that a busy spell of the host hits both
        for name, fn in libraries.items():
            samples[name] += fn(tok, args.constrained, args.steps // ROUNDS, eos)
    first = {"xgrammar": first_mask_xgrammar(tok, eos, 5), "llguidance": first_mask_llguidance(tok, eos, 5)}
    rows = []
    for name, times in samples.items():
        rows.append({"library": name, "first_mask_ms": 1e3 * statistics.median(first[name]),
                     "median_ms": 1e3 * statistics.median(times),
                     "p90_ms": 1e3 * float(np.percentile(times, 90)),
                     "mean_ms": 1e3 * statistics.fmean(times)})  # fmt: skip
    from importlib.metadata import version

    device = f"{cpu_name()} ({os.cpu_count()} CPUs)"
    res = {"benchmark": "grammar_overhead", "device": device, "date": datetime.datetime.now(datetime.timezone.utc)
           .isoformat(timespec="seconds"), "torch": torch.__version__, "xgrammar": version("xgrammar"),
           "llguidance": version("llguidance"), **vars(args), "rows": rows}  # fmt: skip
    save_results(Path(args.out) / "grammar_overhead_cpu", res, markdown)


def markdown(res: dict) -> str:
    lines = [f"# Grammar mask host cost per step ({res['device']})", "",
             f"{res['date']}; torch {res['torch']}, xgrammar {res['xgrammar']}, llguidance {res['llguidance']}; "
             f"{res['constrained']} constrained rows of {res['batch']}, vocabulary {res['vocab']}, "
             f"{res['steps']} steps",
             "", "per step: filling the constrained rows' masks and advancing their matchers; first mask: a new "
             "schema to its first mask (median of 5 schemas)", "",
             "| library | step median ms | step p90 ms | step mean ms | first mask ms |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        lines.append(f"| {r['library']} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} | {r['mean_ms']:.3f} | "
                     f"{r['first_mask_ms']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

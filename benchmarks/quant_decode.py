"""Decode steps per second of a quantized Llama 2 7B against fp16, through the engine (CUDA graphs).

    python -m benchmarks.quant_decode [--out DIR] [--tiny] [--formats fp16,w4a16-g128,w4a16-g128-cores,fp8]

One random-weight Llama 2 7B shape (benchmarks/random_model.py; no checkpoint is written) served as fp16, as a
GPTQ 4-bit checkpoint (group 128, asymmetric: the W4A16 kernel; `w4a16-g128-cores` the same with one row on the
CUDA-core GEMV instead of the half2 pairs kernel, the path bf16 takes) and quantized to FP8 at load (W8A8, where the
GPU has FP8 tensor cores). For each, decode steps per second at batch 1 and 16 with 128-token prompts
(benchmarks/engine.py's decode_steps_per_s: the engine's own steps, timed after the prefill), each the median of
--rounds rounds, and the weight-read floor of a step (the format's weight bytes at the copy bandwidth; KV reads
are left out). Writes quant_decode_<device>.json and .md under --out. `--tiny`: a CPU check with a tiny shape;
`--formats`: a subset of FORMATS (fp16 always runs: the ratios are against it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import tempfile
from dataclasses import replace

import torch

from benchmarks.engine import decode_steps_per_s
from benchmarks.quant_linear import model_bytes
from benchmarks.random_model import SHAPES, write_config_dir
from benchmarks.report import result_stem, save_results, versions, versions_line
from benchmarks.runtime import tiny_or_gpu_args
from vlchat.llm import LLM

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": False}
FORMATS = {  # name: (quantization_config written to config.json, quantization at load, memory-model format)
    "fp16": (None, None, "fp16"),
    "w4a16-g128": (GPTQ, None, "w4a16-g128"),
    "w4a16-g128-cores": (GPTQ, None, "w4a16-g128"),  # without the W4A16 table's gemv_pairs
    "fp8": (None, "fp8", "fp8"),
}
BATCHES = (1, 16)
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=512, max_position_embeddings=512)  # fmt: skip


def fp8_runs() -> bool:
    from vlchat.kernels import dispatch
    from vlchat.kernels.device import get_device_info
    from vlchat.kernels.ops.fp8_linear import OP

    return dispatch.choose(OP, torch.float16, get_device_info()) == "triton"


def bench_format(name: str, model_dir: str, quantization, device: str, rounds: int, steps: int, vocab: int) -> dict:
    llm = LLM(model_dir, dtype="float16" if device == "cuda" else "float32", device=device, load_format="dummy",
              max_num_seqs=max(BATCHES), max_model_len=512, quantization=quantization)  # fmt: skip
    try:
        rates = {b: [decode_steps_per_s(llm, b, 128, steps, vocab) for _ in range(rounds)] for b in BATCHES}
    finally:
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return {"format": name, **{f"batch{b}_steps_per_s": statistics.median(r) for b, r in rates.items()}}


def markdown(res: dict) -> str:
    base = next(r for r in res["rows"] if r["format"] == "fp16")
    lines = [
        f"# Quantized decode steps ({res['model']}) on {res['device']}", "",
        f"{versions_line(res)}; engine with CUDA graphs, 128-token prompts, median of {res['rounds']} rounds; "
        f"weight floor = weight bytes / {res['copy_gbs']:.0f} GB/s (benchmarks/quant_decode.py).", "",
        "| format | weights GB | batch 1 steps/s | vs fp16 | of weight floor | batch 16 steps/s | vs fp16 |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        floor = res["copy_gbs"] * 1e9 / (r["weights_gb"] * 1e9)  # steps/s if a step only read the weights
        lines.append(
            f"| {r['format']} | {r['weights_gb']:.2f} | {r['batch1_steps_per_s']:.1f} | "
            f"{r['batch1_steps_per_s'] / base['batch1_steps_per_s']:.2f}x | {r['batch1_steps_per_s'] / floor:.2f} | "
            f"{r['batch16_steps_per_s']:.1f} | {r['batch16_steps_per_s'] / base['batch16_steps_per_s']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap_args, tiny, device = tiny_or_gpu_args(
        lambda ap: ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of FORMATS")
    )
    wanted = {"fp16", *ap_args.formats.split(",")}
    if wanted - set(FORMATS):
        raise SystemExit(f"unknown formats {sorted(wanted - set(FORMATS))}; choose from {list(FORMATS)}")
    fields = dict(SHAPES["llama2-7b"], **(TINY if tiny else {}))
    rounds, steps = (1, 4) if tiny else (5, 64)
    work = tempfile.mkdtemp(prefix="vlchat-quant-decode-")
    res = {
        "device": torch.cuda.get_device_name() if not tiny else "cpu", **versions(), "rounds": rounds,
        "model": "tiny llama (CPU check)" if tiny else "Llama 2 7B shape, random weights",
        "copy_gbs": 1.0 if tiny else _copy_gbs(), "rows": [],
    }  # fmt: skip
    for name, (quant_config, quantization, memory_format) in FORMATS.items():
        if name not in wanted:
            continue
        if quantization == "fp8" and not tiny and not fp8_runs():
            print(f"{name}: skipped (no FP8 tensor cores here)")
            continue
        model_dir = write_config_dir(os.path.join(work, name), fields, dtype="float16")
        if quant_config:
            _add_quantization_config(model_dir, quant_config)
        with _without_pairs(name.endswith("-cores")):
            row = bench_format(name, model_dir, quantization, device.type, rounds, steps, fields["vocab_size"])
        row["weights_gb"] = model_bytes("7B", memory_format) / 1e9 if not tiny else 1.0
        res["rows"].append(row)
        print(row, flush=True)
    save_results(result_stem(ap_args.out, "quant_decode_tiny" if tiny else "quant_decode", res["device"]), res,
                 markdown)  # fmt: skip


@contextlib.contextmanager
def _without_pairs(active: bool):
    """With `active`, the W4A16 tables without their one-row pairs config (the CUDA-core GEMV takes one row)."""
    from vlchat.kernels.ops import quant_linear

    kept = dict(quant_linear.W4A16_CONFIGS)
    if active:
        quant_linear.W4A16_CONFIGS.update({a: replace(c, gemv_pairs=None) for a, c in kept.items()})
    try:
        yield
    finally:
        quant_linear.W4A16_CONFIGS.update(kept)


def _add_quantization_config(model_dir: str, quant_config: dict) -> None:
    import json

    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["quantization_config"] = quant_config
    with open(path, "w") as f:
        json.dump(config, f)


def _copy_gbs() -> float:
    from benchmarks.gpu_timing import copy_bandwidth_gbs

    return copy_bandwidth_gbs()


if __name__ == "__main__":
    main()

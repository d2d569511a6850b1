"""Host time of an eager kernel call: Triton's `kernel[grid]` against kernels/launch.py's direct launch.

Each kernel wrapper is called in a loop on tiny inputs (benchmarks/step_profile.py `host_cases`: the GPU work is
negligible, so the loop runs at the host's rate), once as before kernels/launch.py (every launch through
`kernel[grid]`, the caches' TMA descriptors built on every call) and once as the engine calls now (direct launches
of the compiled variants, the caches' descriptors kept by their owner). Median of interleaved rounds. An eager
engine step (one that prefills) makes these calls once per layer.

With `--engine`, also whole engine steps as the serving profile measures them (benchmarks/step_profile.py): a
random-weight llama2-7b decoding 128 sequences at about 512 keys plus one new 256-token prompt's prefill (an eager
step), unprofiled, direct launches on and off in turn within one engine (the caches' descriptors kept in both).
"""

from __future__ import annotations

import statistics
import time

from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from benchmarks.runtime import sync
from benchmarks.step_profile import host_cases, host_us
from vlchat.kernels import settings
from vlchat.kernels.device import get_device_info

# the kernel calls of one decoder layer in an eager step with decode rows and a prefill (llm/layers)
LAYER_CALLS = {"rms_norm + residual": 2, "rotary q,k": 1, "write_kv_cache": 1, "decode (1 split)": 1, "prefill": 1,
               "silu_and_mul": 1}  # fmt: skip


def measure(device: str, rounds: int, calls: int) -> list[dict]:
    """Per case: the median over `rounds` of host us per call before and now, the two measured in turn."""
    before_cases, now_cases = host_cases(device, cache_memo=False), host_cases(device, cache_memo=True)
    samples: dict[str, dict[str, list[float]]] = {name: {"before": [], "now": []} for name in now_cases}
    for _ in range(rounds):
        for name in now_cases:
            with settings.launching_directly(False):
                samples[name]["before"].append(host_us(before_cases[name], calls))
            with settings.launching_directly(True):
                samples[name]["now"].append(host_us(now_cases[name], calls))
    return [
        {"case": name, "before_us": statistics.median(s["before"]), "now_us": statistics.median(s["now"]),
         "before_all": s["before"], "now_all": s["now"]}
        for name, s in samples.items()
    ]  # fmt: skip


def engine_steps(rounds: int, batch: int = 128) -> dict:
    """Median ms of a mixed step (decode `batch` + one 256-token prefill) with direct launches on and off."""
    from pathlib import Path

    from benchmarks import random_model, workloads
    from vlchat.llm import LLM, SamplingParams

    fields = dict(random_model.SHAPES["llama2-7b"])
    model_dir = Path(random_model.write_config_dir("/tmp/vlchat-launch-model", fields, dtype="float16"))
    with random_model.random_weights():
        llm = LLM(str(model_dir), dtype="float16", max_num_seqs=batch + 1, prefill_delay_steps=0)
    engine = llm.engine
    reqs = workloads.sharegpt_like_v1(batch + 2 * rounds, fields["vocab_size"], seed=1, special_ids=(0, 1))
    params = SamplingParams(max_tokens=1024, ignore_eos=True, temperature=0.0)
    for i, r in enumerate(reqs[:batch]):
        engine.add_request(f"p{i}", (r.prompt_token_ids * 8)[:512], params, stream=True)
    for _ in range(50):  # every prompt prefilled, all decoding
        engine.step()
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for i in range(2 * rounds):
            direct = i % 2 == 0
            prompt = (reqs[batch + i].prompt_token_ids * 8)[:256]
            engine.add_request(f"m{i}", prompt, SamplingParams(max_tokens=1), stream=True)
            with settings.launching_directly(direct):
                sync()
                t0 = time.perf_counter()
                engine.step()  # the decode batch and the new prompt's prefill
                sync()
                if i >= 4:  # the first two of each kind warm up
                    times[direct].append((time.perf_counter() - t0) * 1e3)
                engine.step()  # a decode step (the one-token request leaves)
    finally:
        engine.close()
    return {"batch": batch, "direct_ms": statistics.median(times[True]),
            "kernel_grid_ms": statistics.median(times[False]), "direct_all": times[True],
            "kernel_grid_all": times[False]}  # fmt: skip


def markdown(res: dict) -> str:
    lines = [
        f"# Host time of eager kernel calls on {res['device']}'s host",
        "",
        f"{versions_line(res)}. {res['calls']} calls per measurement, median of {res['rounds']} interleaved rounds "
        "(benchmarks/launch.py says what each column runs).",
        "",
        "| call | kernel[grid], descriptors every call: us | direct launch, kept descriptors: us | saved us | ratio |",
        "|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['case']} | {r['before_us']:.1f} | {r['now_us']:.1f} | {r['before_us'] - r['now_us']:.1f} | "
            f"{r['before_us'] / r['now_us']:.2f}x |"
        )
    by_case = {r["case"]: r for r in res["rows"]}
    layer = [(name, LAYER_CALLS[name]) for name in LAYER_CALLS if name in by_case]
    before = sum(by_case[name]["before_us"] * n for name, n in layer)
    now = sum(by_case[name]["now_us"] * n for name, n in layer)
    calls = ", ".join(f"{n}x {name}" for name, n in layer)
    lines += [
        "",
        f"A layer of an eager step that decodes and prefills ({calls}): {before:.0f} us of host time before, "
        f"{now:.0f} us now; the GEMMs' and other torch ops' time aside.",
    ]
    if "engine" in res:
        e = res["engine"]
        lines += [
            "",
            f"Engine steps (`--engine`: llama2-7b, random weights, {e['batch']} sequences decoding at ~512 keys plus "
            f"one 256-token prefill, eager, median of {len(e['direct_all'])}): {e['kernel_grid_ms']:.2f} ms with every "
            f"launch through kernel[grid], {e['direct_ms']:.2f} ms with direct launches "
            f"({e['kernel_grid_ms'] / e['direct_ms']:.3f}x).",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = results_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--engine", action="store_true", help="also time whole eager engine steps (a GPU, ~1 min)")
    args = parser.parse_args()
    device = get_device_info()
    where = "cuda" if device.is_cuda else "cpu"
    res = {**device_header(device), "rounds": args.rounds, "calls": args.calls}
    res["rows"] = measure(where, args.rounds, args.calls)
    if args.engine:
        res["engine"] = engine_steps(2 * args.rounds)
    save_results(result_stem(args.out, "launch", device.name), res, markdown)


if __name__ == "__main__":
    main()

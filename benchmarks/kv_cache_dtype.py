"""Decode attention over fp16, fp8, int8 and int4 KV caches, from 128k keys down to a serving step's 512: time,
the bytes each actually reads, and that against copy bandwidth.

    python -m benchmarks.kv_cache_dtype [--out DIR] [--rounds N] [--sweep [--sweep-formats F..] [--sweep-rows R..]]

Rows (q heads, KV heads, batch, keys): Llama-3-8B's 32/8 at batch 1 and 4, MHA 32/32 at batch 1 and GQA 32/8 at
batch 32 over 8k keys, and the serving load's decode step (Llama-2-7B's MHA at batch 128 and 256 over 512
keys); head_dim 128, 16-token pages in shuffled order, KV copies enough to defeat the L2. Each
cache format runs what the engine runs for it: fp16 the plan's kernel (on sm_90 the Gluon decode) and, beside it,
the plan's Triton-only choice ("fp16 triton"); fp8, int8 and int4 the Triton kernel (kernels/attention/kv_quant.py),
planned by plan.decode_plan over the quantized cache. Times are the median of --rounds interleaved CUDA-graph
timings of back-to-back calls (gpu_timing.interleaved_medians).

Bytes read per call: the K and V codes of every key (2 bytes per element in fp16, 1 in fp8 and int8, half in
int4), int8's and int4's float32 scale and zero point per key and KV head, and the query and output rows.
GB/s = bytes / time; "of copy" = GB/s against the device's copy bandwidth (gpu_timing.copy_bandwidth_gbs: bytes
read + written by a 1 GiB device-to-device copy, per second). Writes kv_cache_dtype_<device>.json and .md under --out.

--sweep instead times the Triton decode over fp8 and int8 caches with each config of SWEEP_GRID (keys per tile,
warps, stages; the plan's split count) at SWEEP_ROWS, beside the fp16 plan's kernel, fastest first: the candidates
for the arch table's quantized decode configs. Writes kv_cache_dtype_sweep_<device>.json and .md.
"""

from __future__ import annotations

import math

import torch

from vlchat.kernels.attention import kv_quant

ROWS = [(32, 8, 1, 131072), (32, 8, 4, 131072), (32, 32, 1, 131072), (32, 8, 32, 8192), (32, 32, 128, 512),
        (32, 32, 256, 512)]  # fmt: skip
HEAD_DIM, PAGE = 128, 16
FORMATS = ("fp16", "fp16 triton", "fp8", "int8", "int4")
L2_DEFEAT = 256 << 20  # KV bytes over all copies at least this much (several times any L2)
ROUNDS = 5
SWEEP_ROWS = [(32, 32, 128, 512), (32, 8, 1, 131072)]
SWEEP_FORMATS = ("fp8", "int8")


def bytes_read(fmt: str, q_heads: int, kv_heads: int, batch: int, keys: int, head_dim: int = HEAD_DIM) -> int:
    """Bytes one decode call reads and writes of its operands (module doc): K/V codes (+ int8 scales), q and out."""
    name = "auto" if fmt.startswith("fp16") else fmt
    kv = batch * keys * kv_quant.bytes_per_token(name, kv_heads, head_dim, torch.float16)
    return kv + 2 * batch * q_heads * head_dim * 2


def quantized_inputs(fmt: str, q_heads: int, kv_heads: int, batch: int, keys: int, device, head_dim: int = HEAD_DIM,
                     page: int = PAGE, sets: int | None = None):  # fmt: skip
    """(q, k_cache, v_cache, k_scale, v_scale, tables [sets, batch, pages], seq_lens) with random fp16 K/V stored
    in `fmt` (fp16 as is), in shuffled pages; `sets` block-table sets over disjoint blocks (default: enough to
    defeat the L2)."""
    per_set = batch * keys * kv_quant.bytes_per_token("auto", kv_heads, head_dim, torch.float16)
    sets = sets or max(1, min(16, math.ceil(L2_DEFEAT / per_set)))
    num_blocks = sets * batch * (keys // page)
    name = "auto" if fmt.startswith("fp16") else fmt
    k_cache, v_cache, k_scale, v_scale = kv_quant.allocate(
        name, num_blocks, page, kv_heads, head_dim, torch.float16, device
    )  # fmt: skip
    rows = num_blocks * page
    step = max(1, (64 << 20) // (kv_heads * head_dim * 2))  # quantized 64 MB of fp16 rows at a time
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        slots = torch.arange(start, stop, device=device)
        for cache, scale in ((k_cache, k_scale), (v_cache, v_scale)):
            x = torch.randn(stop - start, kv_heads, head_dim, device=device, dtype=torch.float16)
            kv_quant.write_rows(x, cache, scale, slots)
    tables = torch.randperm(num_blocks, device=device).to(torch.int32).view(sets, batch, keys // page)
    seq_lens = torch.full((batch,), keys, dtype=torch.int32, device=device)
    q = torch.randn(batch, q_heads, head_dim, device=device, dtype=torch.float16)
    return q, k_cache, v_cache, k_scale, v_scale, tables, seq_lens


def decode_calls(fmt: str, inputs, device, config=None):
    """One decode call per block-table set, with the plan the engine would take for this format (fp16 triton:
    the plan without the Gluon kernels; `config` given: that config at the plan's split count), and (splits,
    config) of the calls."""
    from vlchat.kernels.attention import decode, plan

    q, k_cache, v_cache, k_scale, v_scale, tables, seq_lens = inputs
    splits, planned = plan.decode_plan(q, k_cache, tables[0], device, gluon=fmt != "fp16 triton")
    config = config or planned
    out = torch.empty_like(q)
    memo: dict = {}
    scale = q.shape[-1] ** -0.5
    calls = [
        lambda t=t: decode.paged_decode_attention(
            q,
            k_cache,
            v_cache,
            t,
            seq_lens,
            scale,
            None,
            splits,
            out,
            config=config,
            cache_memo=memo,
            k_scale=k_scale,
            v_scale=v_scale,
        )  # fmt: skip
        for t in tables
    ]
    return calls, splits, config


def sweep_grid():
    from vlchat.kernels.attention.configs import DecodeConfig

    return [DecodeConfig(n, w, st, 1) for n in (64, 128, 256) for w in (4, 8) for st in (2, 3, 4, 6)]


def sweep(device, rounds: int, rows=SWEEP_ROWS, formats=SWEEP_FORMATS, grid=None) -> list[dict]:
    """Each format of `formats` at each row of `rows` with every config of `grid` (default sweep_grid()) at the
    plan's split count, timed interleaved with the fp16 plan's kernel; a config that does not compile or fit
    records its error. Rows fastest first within each (row, format)."""
    from benchmarks.attention_report import config_name
    from benchmarks.gpu_timing import interleaved_medians

    out_rows = []
    for shape in rows:
        for fmt in formats:
            inputs = quantized_inputs(fmt, *shape, "cuda")
            base, splits, base_config = decode_calls(fmt, inputs, device)
            calls, errors = {"plan": base}, {}
            for config in grid or sweep_grid():
                fns, _, _ = decode_calls(fmt, inputs, device, config)
                try:
                    fns[0]()
                    calls[config_name(config, splits)] = fns
                except Exception as e:  # noqa: BLE001 - a config that cannot compile or fit is a result
                    errors[config_name(config, splits)] = f"{type(e).__name__}"
            times = interleaved_medians(calls, rounds)
            nbytes = bytes_read(fmt, *shape)
            found = [{"shape": list(shape), "cache": fmt, "config": key if key != "plan" else
                      f"plan {config_name(base_config, splits)}", "splits": splits, "us": us, "bytes": nbytes}
                     for key, us in times.items()]  # fmt: skip
            found.sort(key=lambda r: r["us"])
            out_rows += found
            out_rows += [{"shape": list(shape), "cache": fmt, "config": k, "error": e} for k, e in errors.items()]
            del inputs, calls
            torch.cuda.empty_cache()
    return out_rows


def sweep_markdown(res: dict) -> str:
    from benchmarks.report import versions_line

    lines = [f"# Quantized KV decode configs on {res['device']}", "",
             f"{versions_line(res)}. Head_dim {HEAD_DIM}; median of {res['rounds']} interleaved CUDA-graph timings; "
             f"copy bandwidth {res['copy_gbs']:.0f} GB/s. Fastest five per row and format.", "",
             "| q/kv heads | batch | keys | cache | config | splits | us | of copy |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    shown: dict = {}
    for r in res["sweep"]:
        key = (tuple(r["shape"]), r["cache"])
        shown[key] = shown.get(key, 0) + 1
        if "us" in r and (shown[key] <= 5 or r["config"].startswith("plan")):
            q_heads, kv_heads, batch, keys = r["shape"]
            gbs = r["bytes"] / (r["us"] * 1e-6) / 1e9
            lines.append(f"| {q_heads}/{kv_heads} | {batch} | {keys} | {r['cache']} | {r['config']} | {r['splits']} | "
                         f"{r['us']:.1f} | {gbs / res['copy_gbs']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def markdown(res: dict) -> str:
    from benchmarks.report import versions_line

    lines = [
        f"# Decode attention over quantized KV caches on {res['device']}", "",
        f"{versions_line(res)}. Head_dim {HEAD_DIM}, pages of {PAGE} (shuffled), L2 defeated; median of "
        f"{res['rounds']} interleaved CUDA-graph timings (benchmarks/kv_cache_dtype.py says what each row runs). "
        f"Copy bandwidth {res['copy_gbs']:.0f} GB/s (read + written).", "",
        "| q/kv heads | batch | keys | cache | kernel | splits | us | MB read | GB/s | of copy | vs fp16 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        base = next(x["us"] for x in res["rows"] if x["shape"] == r["shape"] and x["cache"] == "fp16")
        q_heads, kv_heads, batch, keys = r["shape"]
        gbs = r["bytes"] / (r["us"] * 1e-6) / 1e9
        lines.append(
            f"| {q_heads}/{kv_heads} | {batch} | {keys} | {r['cache']} | {r['config']} | {r['splits']} | "
            f"{r['us']:.1f} | {r['bytes'] / 2**20:.1f} | {gbs:.0f} | {gbs / res['copy_gbs']:.2f} | "
            f"{base / r['us']:.2f}x |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks.attention_report import config_name
    from benchmarks.gpu_timing import copy_bandwidth_gbs, interleaved_medians
    from benchmarks.report import device_header, result_stem, results_parser, save_results
    from vlchat.kernels.device import get_device_info

    ap = results_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--sweep", action="store_true", help="time the quantized decode over a grid of configs")
    ap.add_argument("--sweep-formats", nargs="+", default=list(SWEEP_FORMATS), choices=FORMATS[2:])
    ap.add_argument("--sweep-rows", nargs="+", default=None, metavar="Q/KV/BATCH/KEYS",
                    help="the sweep's rows (default: SWEEP_ROWS), e.g. 32/32/128/512")
    args = ap.parse_args()
    device = get_device_info()
    if args.sweep:
        res = {**device_header(device), "rounds": args.rounds, "copy_gbs": copy_bandwidth_gbs()}
        rows = [tuple(int(v) for v in r.split("/")) for r in args.sweep_rows] if args.sweep_rows else SWEEP_ROWS
        res["sweep"] = sweep(device, args.rounds, rows, args.sweep_formats)
        save_results(result_stem(args.out, "kv_cache_dtype_sweep", device.name), res, sweep_markdown)
        print(sweep_markdown(res), flush=True)
        return
    res = {**device_header(device), "rounds": args.rounds, "copy_gbs": copy_bandwidth_gbs(), "rows": []}
    for shape in ROWS:
        calls, meta, inputs = {}, {}, {}
        for fmt in FORMATS:
            storage = "fp16" if fmt.startswith("fp16") else fmt  # both fp16 rows read the same caches
            if storage not in inputs:
                inputs[storage] = quantized_inputs(storage, *shape, "cuda")
            calls[fmt], splits, config = decode_calls(fmt, inputs[storage], device)
            meta[fmt] = (splits, config_name(config, splits))
        times = interleaved_medians(calls, args.rounds)
        for fmt in FORMATS:
            splits, name = meta[fmt]
            res["rows"].append({"shape": list(shape), "cache": fmt, "config": name, "splits": splits,
                                "us": times[fmt], "bytes": bytes_read(fmt, *shape)})  # fmt: skip
        del calls, inputs
        torch.cuda.empty_cache()
    save_results(result_stem(args.out, "kv_cache_dtype", device.name), res, markdown)


if __name__ == "__main__":
    main()

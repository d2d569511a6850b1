"""What reading a paged cache costs before any math: the Gluon decode's own loader alone, against the whole decode,
on the paged cache and on contiguous per-head K/V (sm_90 only).

    python -m benchmarks.paged_read [--out DIR]

MHA (32/32 heads, head_dim 128, fp16) at batch 1 and L = CONTEXTS, the plan's config and split count for the paged
cache on every row (so every method runs the same grid of CTAs and tiles). Methods, CUDA-graph replays of
back-to-back calls, the median of ROUNDS interleaved measurements:

- read, paged: `decode_ws`'s loader warp issuing every tile's TMA boxes into the config's ring, with a consumer
  that frees each buffer as soon as it lands (no products, no output): the cache as the grid lays it out,
  [blocks, 16 tokens, heads, head_dim] with shuffled pages;
- decode, paged: the whole kernel (and the split merge) on the same cache: the product's call;
- read / decode, contiguous: the same two on a cache of 32 one-head sequences, each head's pages in order, so
  that each CTA's keys are one contiguous stream (SDPA's read pattern) at the same grid;
- SDPA on contiguous K/V [1, heads, L, head_dim];
- the read floor (gpu_timing.read_floor_us: a kernel that only reads the same bytes with plain loads).

Per method the least-squares line through its times against the KV bytes (decode_bandwidth.line_cells): the slope
as a streaming rate, the intercept as a fixed cost. Writes paged_read_<device>.json and .md under --out and prints
the tables.
"""

from __future__ import annotations

import torch

from benchmarks.attention import HEAD_DIM, decode_inputs, gluon_decode_device, sdpa_calls
from benchmarks.attention_report import config_name
from benchmarks.decode_bandwidth import line_cells
from benchmarks.gpu_timing import interleaved_medians, read_floor_us
from benchmarks.report import device_header, result_stem, results_parser, save_results, versions_line
from vlchat.kernels.attention import decode, decode_ws, plan
from vlchat.kernels.attention.configs import WsDecodeConfig
from vlchat.kernels.attention.gluon_sm90 import gl, gluon, mbarrier
from vlchat.kernels.attention.pdl import dependent_launch, pdl_options

HEADS = 32
CONTEXTS = [32768, 65536, 131072, 262144]
ROUNDS = 5
METHODS = ["read floor", "sdpa", "read, contiguous", "decode, contiguous", "read, paged", "decode, paged"]

if gluon is not None:

    @gluon.jit
    def _free_on_arrival(bars, lens_ptr, window, b, split, num_splits, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                         HALF_KEYS: gl.constexpr):  # fmt: skip
        """The consumer of a read: waits for each stage's K and V and frees them at once, in the decode's order."""
        q_ready, k_ready, v_ready, k_empty, v_empty = bars
        _, lo, hi, n, _ = decode_ws._span(lens_ptr, b, split, num_splits, window, BLOCK_N, HALF_KEYS)
        mbarrier.wait(q_ready.index(0), 0)
        for j in range(n):
            s = j % STAGES
            phase = (j // STAGES) & 1
            mbarrier.wait(k_ready.index(s), phase)
            mbarrier.arrive(k_empty.index(s), count=1)
            mbarrier.wait(v_ready.index(s), phase)
            mbarrier.arrive(v_empty.index(s), count=1)

    @gluon.jit
    def _read_kernel(q_desc, kc_desc, vc_desc, tables_ptr, lens_ptr, window, num_splits, stride_tb,
                     GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     PAGE: gl.constexpr, LANES: gl.constexpr, PDL: gl.constexpr, HALF_KEYS: gl.constexpr):  # fmt: skip
        """decode_ws's grid, shared memory and loader, with _free_on_arrival for its consumer."""
        kvh = gl.program_id(0)
        b = gl.program_id(1)
        split = gl.program_id(2)
        q_smem, k_smem, v_smem = decode_ws.ring_buffers(q_desc, kc_desc, vc_desc, STAGES, BLOCK_N, HEAD_DIM)
        bars = decode_ws.ring_barriers(STAGES)
        gl.warp_specialize([
            (_free_on_arrival, (bars, lens_ptr, window, b, split, num_splits, BLOCK_N, STAGES, HALF_KEYS)),
            (decode_ws._loader, (q_desc, kc_desc, vc_desc, tables_ptr, lens_ptr, stride_tb, window, q_smem, k_smem,
                                 v_smem, bars, b, kvh, split, num_splits, GROUP, BLOCK_N, STAGES, PAGE, LANES, PDL,
                                 HALF_KEYS, 1)),  # one KV head per CTA
        ], [1], [24])  # fmt: skip


def read_call(q, k_cache, v_cache, tables, lens, splits, config, pdl):
    """One read of a decode call's tiles (decode_ws.launch's grid and compile-time arguments)."""
    batch, q_heads, head_dim = q.shape
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    q_desc, kc_desc, vc_desc = decode_ws.descriptors(q, k_cache, v_cache, config.block_n)
    consts = decode_ws.constexprs(q_heads, kv_heads, head_dim, page, config, splits, pdl)
    consts = {k: consts[k] for k in ("GROUP", "HEAD_DIM", "BLOCK_N", "STAGES", "PAGE", "LANES", "PDL", "HALF_KEYS")}
    return lambda: _read_kernel[(kv_heads, batch, splits)](
        q_desc, kc_desc, vc_desc, tables, lens, decode_ws.NO_WINDOW, splits, tables.stride(0), **consts,
        **pdl_options(pdl), **decode_ws.launch_options(config),
    )  # fmt: skip


def contiguous_cache(q, k_cache, v_cache, ctx):
    """The same call as 32 one-head sequences whose pages are in order: (q, k, v, block table, lengths)."""
    batch, heads, head_dim = q.shape
    page = k_cache.shape[1]

    def per_head(cache):
        return cache.permute(2, 0, 1, 3).contiguous().view(-1, page, 1, head_dim)

    k, v = per_head(k_cache), per_head(v_cache)
    tables = torch.arange(k.shape[0], device="cuda", dtype=torch.int32).view(heads, -1)
    lens = torch.full((heads,), ctx, device="cuda", dtype=torch.int32)
    return q.reshape(heads, 1, head_dim), k, v, tables, lens


def bench_context(ctx, device, pdl: bool) -> dict:
    q, k_cache, v_cache, perm, lens, kv_bytes = decode_inputs(torch.float16, HEADS, HEADS, 1, ctx)
    assert perm.shape[0] == 1, "rows of one KV copy (>= 256 MB)"
    tables = perm[0]
    splits, config = plan.decode_plan(q, k_cache, tables, device)
    assert isinstance(config, WsDecodeConfig), "the plan's Gluon config"
    cq, ck, cv, ctables, clens = contiguous_cache(q, k_cache, v_cache, ctx)
    scale = HEAD_DIM**-0.5

    def decode_call(q, k, v, t, n):
        out, memo = torch.empty_like(q), {}
        return lambda: decode.paged_decode_attention(
            q, k, v, t, n, scale, None, splits, out, config=config, cache_memo=memo
        )

    calls = {
        "sdpa": sdpa_calls(q, HEADS, ctx, 1),
        "read, contiguous": [read_call(cq, ck, cv, ctables, clens, splits, config, pdl)],
        "decode, contiguous": [decode_call(cq, ck, cv, ctables, clens)],
        "read, paged": [read_call(q, k_cache, v_cache, tables, lens, splits, config, pdl)],
        "decode, paged": [decode_call(q, k_cache, v_cache, tables, lens)],
    }
    us = interleaved_medians(calls, ROUNDS)
    del calls, k_cache, v_cache, ck, cv
    torch.cuda.empty_cache()
    us["read floor"] = read_floor_us(kv_bytes // 2, 1, pdl)
    return {"ctx": ctx, "kv_gb": kv_bytes / 1e9, "plan": f"{config_name(config, splits)} S={splits}", "us": us}


def markdown(res: dict) -> str:
    points = res["points"]
    cells = line_cells(points, METHODS)
    lines = [
        f"# Reading a paged cache before any math on {res['device']}", "",
        f"{versions_line(res)}; programmatic dependent launch: {res['pdl']}. MHA {HEADS}/{HEADS}, head_dim "
        f"{HEAD_DIM}, fp16, batch 1; every method on the grid of the paged cache's plan ("
        + ", ".join(f"{p['ctx'] // 1024}k: {p['plan']}" for p in points)
        + f"); medians of {res['rounds']} interleaved measurements (benchmarks/paged_read.py says what each method "
        "runs).", "",
        "| method | " + " | ".join(f"L={p['ctx'] // 1024}k us" for p in points)
        + " | GB/s | share of read floor rate | fixed cost us |",
        "|" + "---|" * (4 + len(points)),
    ]  # fmt: skip
    for m in METHODS:
        name = "SDPA" if m == "sdpa" else m
        times = " | ".join(f"{p['us'][m]:.1f}" for p in points)
        lines.append(f"| {name} | {times} | {cells[m]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = results_parser(__doc__).parse_args()
    device = gluon_decode_device(group=1)
    pdl = dependent_launch(device)
    res = {**device_header(device), "pdl": pdl, "rounds": ROUNDS}
    res["points"] = [bench_context(ctx, device, pdl) for ctx in CONTEXTS]
    save_results(result_stem(args.out, "paged_read", device.name), res, markdown)


if __name__ == "__main__":
    main()

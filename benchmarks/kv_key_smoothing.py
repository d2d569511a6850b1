"""Key layouts for an int4/int8 KV cache, simulated in plain torch on real weights (Gemma 3 270M Q4_K_M GGUF)
before any kernel is written: what subtracting a per-sequence key mean (and other per-sequence transforms) does to
the int4 error.

    python -m benchmarks.kv_key_smoothing [--out DIR] [--kl-tokens N] [--variants a,b,...] [--formats int4,int8]

Each variant replaces the attention layer's K (and V) rows by what a cache of that layout would give back, then
runs on the unquantized fp32 cache (the same computation the engine's quantized cache does: every key is read back
as stored, the chunk's own too). Smoothing subtracts from every key of a sequence a mean m per layer and KV head,
taken at the sequence's first write into its first block (the rows written there: the prompt's first
`block_size` tokens, or all of the first chunk with "chunk"): q . (k - m) = q . k - q . m shifts all of a query's
scores by the same amount, so softmax and the attention output are unchanged and only the stored rows differ.
Variants (VARIANTS): the mean over the first block ("smooth"), without the first token ("smooth1"), over the whole
first chunk ("smooth-chunk"), or the first token's key alone ("smooth0", what the engine does: for a sequence that
starts with BOS it is one constant per layer, llm/layers/attention.py set_key_offsets); "scaled"/"qscaled" also
divide each key dimension by a per-sequence scale s (the first block's spread, or sqrt(key RMS / query RMS) per
dimension) and multiply the queries by it (q * s . (k - m) / s = q . (k - m)); "v-smooth"/"v-smooth0" store values
less their first-block mean / first row and add it back to the output (the softmax weights sum to 1);
"base-rows" stores rows 1.. of each block as differences from the block's first row as stored (branch kvq2);
"sink-exact" keeps position 0's K and V rows unquantized (how much the attention sink's error weighs).
Page-wise key grids ("page-kivi", "page-online"; keys not rotated, values as in the other rows): each key dimension
gets its own scale and zero over the rows of one block (KIVI's key layout). "page-kivi" keeps a block's keys exact
until the block is full, then quantizes all its rows at once (KIVI's unquantized residual); "page-online" has no
exact residual: every write widens the block's per-dimension range to cover the new rows and re-quantizes the
rows already stored onto the widened grid (what a write kernel could do in place). With "+sink" position 0's
K and V rows are kept exact and its key stays out of its block's range (for sequences that start with BOS that row
is one constant per layer, as the key offset is).

Greedy and KL are measured as in benchmarks/kv_cache_fidelity.py (same prompts, text and chunking), against the
unquantized cache of the same run. Writes kv_key_smoothing_<cpu>.json and .md under --out.
"""

from __future__ import annotations

import contextlib

import torch

from benchmarks.kv_cache_fidelity import PROMPTS, first_difference, gemma_path, greedy_tokens, prose_tokens
from benchmarks.report import cpu_name, result_stem, results_parser, save_results, versions, versions_line

BLOCK = 16  # the engine's block size

# name -> (key transform, value transform, base rows[, position 0 kept exact]) (module doc); value "none": unquantized
VARIANTS = {
    "rowwise": ("rowwise", "rowwise", False),
    "smooth": ("smooth", "rowwise", False),
    "smooth-chunk": ("smooth-chunk", "rowwise", False),
    "base-rows": ("rowwise", "rowwise", True),
    "smooth+base-rows": ("smooth", "rowwise", True),
    "scaled": ("scaled", "rowwise", False),
    "qscaled": ("qscaled", "rowwise", False),
    "smooth1": ("smooth1", "rowwise", False),
    "sink-exact": ("rowwise", "rowwise", False, True),
    "smooth+sink-exact": ("smooth", "rowwise", False, True),
    "smooth0": ("smooth0", "rowwise", False),
    "smooth0+v-smooth0": ("smooth0", "smooth0", False),
    "qscaled1": ("qscaled1", "rowwise", False),
    "smooth+v-smooth": ("smooth", "smooth", False),
    "smooth, keys only": ("smooth", "none", False),
    "rowwise, keys only": ("rowwise", "none", False),
    "page-kivi": ("page-kivi", "rowwise", False),
    "page-online": ("page-online", "rowwise", False),
    "page-kivi+sink": ("page-kivi", "rowwise", False, True),
    "page-online+sink": ("page-online", "rowwise", False, True),
    "page-online+sink keys-only": ("page-online", "none", False, True),
}


def fake_quant(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x [..., d] as a per-row int8/int4 cache (kv_quant's grid) gives it back, in float32."""
    from vlchat.kernels.attention import kv_quant

    codes, sz = kv_quant.quantize_int(x, fmt)
    return kv_quant.dequantize(codes, sz, torch.float32, fmt)


class Layout:
    """The per-layer state of one simulated cache layout: each sequence's key mean/scale (by the physical id of
    its first block) and, with base rows, each block's stored base row."""

    def __init__(self, fmt: str, key: str, value: str, base_rows: bool, sink: bool = False) -> None:
        self.fmt, self.key, self.value, self.base_rows, self.sink = fmt, key, value, base_rows, sink
        self.stats: dict = {}  # (layer, first block id) -> (m, s) [kv_heads, d]
        self.bases: dict = {}  # (layer, kind) -> [blocks, kv_heads, d] stored base rows
        self.pages: dict = {}  # (layer, block) -> page-wise key state (page_keys)

    def page_keys(self, layer, x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, exact=()) -> torch.Tensor:
        """Keys x [tokens, kv_heads, d] as a page-wise per-dimension grid gives them back; rows stored earlier in
        a block that this write re-quantizes are rewritten in `cache` [blocks, BLOCK, kv_heads, d] (module doc);
        rows `exact` (indices into x) stay out of their block's grid."""
        from vlchat.kernels.attention.kv_quant import LEVELS

        levels = LEVELS[self.fmt]
        out = x.clone()
        slots = slots.tolist()
        by_block: dict = {}
        for i, slot in enumerate(slots):
            if slot >= 0 and i not in exact:
                by_block.setdefault(slot // BLOCK, []).append((slot % BLOCK, i))
        for block, entries in by_block.items():
            state = self.pages.get((layer, block))
            if state is None or entries[0][0] == 0 or entries[0][0] in state["rows"]:  # a fresh (or reused) block
                state = self.pages[(layer, block)] = {"rows": {}, "lo": None, "hi": None, "first": entries[0][0]}
            rows = state["rows"]  # offset in block -> exact row
            for j, i in entries:
                rows[j] = x[i]
            exact = torch.stack([rows[j] for j in sorted(rows)])  # [n, heads, d]
            if self.key == "page-kivi":
                if len(rows) < BLOCK - state["first"]:
                    continue  # the residual stays exact until the block is full
                lo, hi = exact.amin(0), exact.amax(0)
            else:
                lo, hi = exact.amin(0), exact.amax(0)
                if state["lo"] is not None:
                    lo, hi = torch.minimum(lo, state["lo"]), torch.maximum(hi, state["hi"])
                state["lo"], state["hi"] = lo, hi
            scale = ((hi - lo) / levels).clamp_min(1e-12)

            new = {j for j, _ in entries}
            for j in sorted(rows):
                if self.key == "page-online" and j not in new:  # stored as quantized before; widened grid
                    rows[j] = _grid(rows[j], lo, scale, levels)
                    cache[block, j] = rows[j]
                elif self.key == "page-kivi" and j not in new:
                    cache[block, j] = _grid(rows[j], lo, scale, levels)
            for j, i in entries:
                out[i] = _grid(x[i], lo, scale, levels)
                if self.key == "page-online":
                    rows[j] = out[i]
        return out

    def rows(self, layer, x: torch.Tensor, slots: torch.Tensor, kind: str, fmt_of) -> torch.Tensor:
        """Rows x [tokens, kv_heads, d] (already transformed) as stored by a per-row grid, with base rows where
        the layout has them."""
        if not self.base_rows:
            return fake_quant(x, fmt_of)
        key = (layer, kind)
        if key not in self.bases:
            self.bases[key] = torch.zeros(8192, *x.shape[1:])
        bases = self.bases[key]
        out = torch.empty_like(x)
        first = slots % BLOCK == 0
        out[first] = fake_quant(x[first], fmt_of)
        bases[slots[first] // BLOCK] = out[first]
        rest = ~first
        b = bases[slots[rest] // BLOCK]
        out[rest] = fake_quant(x[rest] - b, fmt_of) + b
        return out


def _grid(v: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor, levels: int) -> torch.Tensor:
    """v on the per-dimension grid lo + scale * [0, levels]."""
    return lo + torch.floor((v - lo) / scale + 0.5).clamp(0, levels) * scale


def sequences(ctx, tokens: int):
    """(row range, position of its first row, first block id) of each sequence of the step."""
    lens = ctx.seq_lens.tolist()
    first = ctx.block_tables[:, 0].tolist()
    if ctx.is_prefill:
        cu = ctx.cu_seqlens_q.tolist()
    else:
        cu = list(range(tokens + 1))
    return [(cu[i], cu[i + 1], lens[i] - (cu[i + 1] - cu[i]), first[i]) for i in range(len(lens))]


@contextlib.contextmanager
def simulated(layout: Layout):
    """Inside it, every attention layer stores the K/V rows `layout` gives back (on an unquantized cache)."""
    from vlchat.kernels.attention import kv_quant
    from vlchat.llm.engine.context import get_context
    from vlchat.llm.layers.attention import Attention

    forward = Attention.forward

    def patched(self, q, k, v):
        ctx = get_context()
        if ctx is None or self.kv_cache is None:
            return forward(self, q, k, v)
        d = self.head_dim
        h = kv_quant.rotation(d).to(k.dtype)
        inv_n = 1.0 / kv_quant.hadamard_block(d)
        k32, q32 = k.float(), q.clone()
        kq = torch.empty_like(k32)
        group = q.shape[1] // k.shape[1]
        v32 = v.float()
        vm = torch.zeros_like(v32)
        sink = []  # rows of position 0, kept exact with layout.sink
        for lo, hi, start, block0 in sequences(ctx, k.shape[0]):
            if hi == lo:
                continue
            rows = k32[lo:hi]
            if start == 0:  # the sequence's first write: its statistics
                n = hi - lo if layout.key == "smooth-chunk" else min(BLOCK, hi - lo)
                skip = 1 if layout.key.endswith("1") and n > 1 else 0  # without the first token (the sink)
                m = rows[0] if layout.key == "smooth0" else rows[skip:n].mean(0)
                s = None
                if layout.key == "scaled":
                    s = (rows[:n] - m).abs().amax(0).clamp_min(1e-6)
                elif layout.key.startswith("qscaled"):
                    rk = (rows[skip:n] - m).pow(2).mean(0).sqrt()
                    rq = q[lo + skip : lo + n].float().view(n - skip, -1, group, d).pow(2).mean((0, 2)).sqrt()
                    s = (rk.clamp_min(1e-6) / rq.clamp_min(1e-6)).sqrt()
                mv = v32[lo] if layout.value == "smooth0" else v32[lo : lo + n].mean(0)
                layout.stats[(id(self), block0)] = (m, s, mv)
            m, s, mv = layout.stats[(id(self), block0)]
            if layout.key != "rowwise" and not layout.key.startswith("page"):
                rows = rows - m
                if s is not None:
                    rows = rows / s
                    q32[lo:hi] = (q[lo:hi].view(hi - lo, -1, group, d) * s[None, :, None, :]).view(hi - lo, -1, d)
            kq[lo:hi] = rows
            if layout.value.startswith("smooth"):
                vm[lo:hi] = mv
            if start == 0 and layout.sink:
                sink.append(lo)
        if layout.key.startswith("page"):
            kr = layout.page_keys(id(self), kq, ctx.slot_mapping, self.kv_cache[0], set(sink))
        else:
            kr = layout.rows(id(self), kq @ h, ctx.slot_mapping, "k", layout.fmt) @ h * inv_n
        kr[sink] = kq[sink]
        vr = v
        if layout.value != "none":  # values less their mean, the mean added back (softmax weights sum to 1)
            vr = layout.rows(id(self), (v32 - vm) @ h, ctx.slot_mapping, "v", layout.fmt) @ h * inv_n + vm
            vr[sink] = v32[sink]
            vr = vr.to(v.dtype)
        return forward(self, q32, kr.to(k.dtype), vr)

    Attention.forward = patched
    try:
        yield
    finally:
        Attention.forward = forward


@torch.inference_mode()
def mean_kl(model, token_ids, layouts: dict, chunk: int = 256) -> dict:
    """{name: {"kl", "top1"}} of each layout against the unquantized cache, as kv_cache_fidelity.mean_kl."""
    import math

    from vlchat.kernels.attention import kv_quant
    from vlchat.llm.engine.context import AttentionMetadata, use_context
    from vlchat.llm.layers.attention import Attention

    layers = [m for m in model.modules() if isinstance(m, Attention)]
    n = len(token_ids)
    blocks = math.ceil(n / BLOCK)
    caches = {name: [kv_quant.allocate("auto", blocks, BLOCK, a.num_kv_heads, a.head_dim, torch.float32, "cpu")
                     for a in layers] for name in ("ref", *layouts)}  # fmt: skip
    table = torch.arange(blocks, dtype=torch.int32).view(1, -1)
    ids = torch.tensor(token_ids)
    kl = dict.fromkeys(layouts, 0.0)
    top1 = dict.fromkeys(layouts, 0)
    for lo in range(0, n - 1, chunk):
        hi = min(lo + chunk, n - 1)
        meta = AttentionMetadata(is_prefill=True, slot_mapping=torch.arange(lo, hi), block_tables=table,
                                 seq_lens=torch.tensor([hi], dtype=torch.int32),
                                 cu_seqlens_q=torch.tensor([0, hi - lo], dtype=torch.int32), max_seqlen_q=hi - lo,
                                 max_seqlen_k=hi)  # fmt: skip
        logp = {}
        for name, per_layer in caches.items():
            for layer, (kc, vc, _, _) in zip(layers, per_layer, strict=True):
                layer.kv_scales = (None, None)
                layer.kv_cache = (kc, vc)
            with use_context(meta), simulated(layouts[name]) if name != "ref" else contextlib.nullcontext():
                hidden = model(ids[lo:hi], torch.arange(lo, hi))
            logp[name] = torch.log_softmax(model.compute_logits(hidden).float(), dim=-1)
        ref = logp.pop("ref")
        for name, lq in logp.items():
            kl[name] += float((ref.exp() * (ref - lq)).sum())
            top1[name] += int((ref.argmax(-1) == lq.argmax(-1)).sum())
    for layer in layers:
        layer.kv_cache = None
    return {name: {"kl": kl[name] / (n - 1), "top1": top1[name] / (n - 1)} for name in layouts}


def markdown(res: dict) -> str:
    lines = [
        f"# Simulated int4/int8 key layouts, Gemma 3 270M (Q4_K_M GGUF) on {res['device']}", "",
        f"{versions_line(res)}; fp32 compute and cache, the layouts applied in plain torch "
        "(benchmarks/kv_key_smoothing.py).", "",
        f"Greedy: {len(PROMPTS)} prompts x 32 tokens identical to the unquantized cache; KL: mean "
        f"KL(unquantized || layout) over {res['kl_tokens']} tokens of prose, as benchmarks/kv_cache_fidelity.py.", "",
        *([res["note"], ""] if "note" in res else []),
        "| format | layout | identical greedy | first differences | mean KL (nats) | same argmax |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in res["rows"]:  # a row without greedy figures: its greedy pass was not run
        diffs = ", ".join(str(d) for d in row.get("first_differences") or [] if d is not None) or "-"
        same = f"{row['identical']}/{len(PROMPTS)}" if row.get("identical") is not None else "not run"
        lines.append(f"| {row['format']} | {row['layout']} | {same} | {diffs} | "
                     f"{row['kl']:.5f} | {100 * row['top1']:.2f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--kl-tokens", type=int, default=2048)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--formats", default="int4,int8")
    args = ap.parse_args()
    from vlchat.llm.gguf import load_gguf
    from vlchat.llm.weights import load_model

    path = gemma_path()
    names = args.variants.split(",")
    layouts = {(fmt, name): Layout(fmt, *VARIANTS[name]) for fmt in args.formats.split(",") for name in names}
    model = load_model(path, dtype=torch.float32, device="cpu", progress=False)
    text = prose_tokens(load_gguf(path).tokenizer(), args.kl_tokens)
    kls = mean_kl(model, text, {f"{f}/{n}": lay for (f, n), lay in layouts.items()})
    print(kls, flush=True)
    del model
    base = greedy_tokens(path, "auto", "cpu")
    res = {"device": cpu_name(), **versions(), "kl_tokens": len(text), "rows": []}
    for (fmt, name), lay in layouts.items():
        lay.stats.clear()
        lay.bases.clear()
        lay.pages.clear()
        with simulated(lay):
            got = greedy_tokens(path, "auto", "cpu")
        diffs = [first_difference(a, b) for a, b in zip(base, got, strict=True)]
        row = {"format": fmt, "layout": name, "identical": sum(d is None for d in diffs), "first_differences": diffs,
               **kls[f"{fmt}/{name}"]}  # fmt: skip
        res["rows"].append(row)
        print(row, flush=True)
    save_results(result_stem(args.out, "kv_key_smoothing", cpu_name()), res, markdown)


if __name__ == "__main__":
    main()

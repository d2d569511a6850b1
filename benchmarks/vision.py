"""Vision towers on the GPU: images/s of ours vs transformers, and bf16 agreement, in one run.

Towers (random weights, bf16): CLIP ViT-L/336 (LLaVA-1.5's, 577 tokens per image) and the
Qwen2-VL 675M ViT (32 blocks of width 1280) on 448x448 images (1024 patches -> 256 tokens).
Each is timed as transformers runs it (SDPA attention) and as ours runs it, eagerly and
replayed from a CUDA graph (what `embed_multimodal` does on CUDA). The same run checks
ours and transformers in bf16 against transformers in fp32, and a mid-size random LLaVA
and Qwen2-VL end to end (prompt logits, greedy tokens): ours in bf16 against transformers
in bf16 and in fp32.

    python -m benchmarks.vision [--out DIR] [--smoke]

Writes vision_<device>.json and .md under --out and prints the tables.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from benchmarks.report import result_stem, results_parser, save_results, versions, versions_line
from tests.llm.tiny import rel_err

CLIP_L336 = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                 image_size=336, patch_size=14, hidden_act="quick_gelu")  # fmt: skip
QWEN2_VL_VIT = dict(embed_dim=1280, depth=32, num_heads=16, mlp_ratio=4, hidden_size=3584, patch_size=14,
                    temporal_patch_size=2, spatial_merge_size=2, hidden_act="quick_gelu")  # fmt: skip
SMOKE_CLIP = dict(CLIP_L336, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  image_size=56)  # fmt: skip
SMOKE_QWEN = dict(QWEN2_VL_VIT, embed_dim=64, depth=2, num_heads=4, hidden_size=96)


def timed(fn, iters: int) -> float:
    """Median seconds per call (CUDA events on a GPU, wall clock on the CPU)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def flops_of(fn) -> float:
    """Matmul and attention FLOPs of one call, as torch's FLOP counter sees them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


KERNEL_KINDS = (  # (kind, substrings of a kernel's lowercased name), first match wins
    ("gemm", ("gemm", "xmma", "nvjet", "cutlass", "cublas", "wgmma")),
    ("attention", ("attn", "attention", "prefill", "flash")),
    ("norm", ("norm",)),
    ("activation", ("gelu", "silu", "act_and_mul")),
)


def kernel_breakdown(fn) -> dict:
    """GPU kernel time of one call of `fn` by kind (GEMM, attention, norm, activation, other), from torch.profiler
    (as benchmarks/step_profile.py reads it); with the five longest kernels, so a tower's time can be placed
    against its FLOPs. A profiler failure is reported, not raised: the timings stand without it."""
    from torch.profiler import ProfilerActivity, profile

    try:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        events = prof.key_averages()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    kernels = {e.key[:80]: e.self_device_time_total / 1e3 for e in events if e.device_type.name == "CUDA"}
    kinds: dict[str, float] = {}
    for name, ms in kernels.items():
        kind = next((k for k, keys in KERNEL_KINDS if any(key in name.lower() for key in keys)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + ms
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:5]
    return {"ms_by_kind": kinds, "top_kernels_ms": dict(top)}


def gemm_ceiling(device: str) -> float:
    """TFLOP/s of one large bf16 matmul on this device: the ceiling a GEMM-bound tower can approach."""
    n = 8192 if device == "cuda" else 256
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n**3 / timed(lambda: a @ b, 10) / 1e12


def clip_pair(shape: dict, device: str):
    """(transformers CLIPVisionModel fp32, our tower bf16) with the same random weights."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    from vlchat.vision.encoders.clip import ClipVisionConfig, ClipVisionTower

    torch.manual_seed(0)
    config = CLIPVisionConfig(**shape, attn_implementation="sdpa")
    with torch.device(device):
        hf32 = CLIPVisionModel(config).eval()
        ours = ClipVisionTower(ClipVisionConfig.from_hf(config), [-1]).eval()
    ours.load_weights(hf32.state_dict().items())
    return hf32, ours.to(torch.bfloat16)


def qwen_pair(shape: dict, device: str):
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    from vlchat.vision.encoders.qwen_vit import QwenVisionTransformer, QwenViTConfig

    torch.manual_seed(0)
    config = Qwen2VLVisionConfig(**shape)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        hf32 = Qwen2VisionTransformerPretrainedModel._from_config(config).eval()
        ours = QwenVisionTransformer(QwenViTConfig.from_hf(config)).eval()
    ours.load_weights(hf32.state_dict().items())
    return hf32, ours.to(torch.bfloat16)


def compare(batch, iters, hf_call, ours_call, graphs, *graph_inputs, fn) -> dict:
    """images/s of transformers, ours eager and ours replayed from a CUDA graph of `fn(*graph_inputs)` (GPU)."""
    row = {"batch": batch, "hf_img_s": batch / timed(hf_call, iters)}
    row["ours_eager_img_s"] = batch / timed(ours_call, iters)
    if graph_inputs[0].is_cuda:
        graphed = graphs.run(batch, fn, *graph_inputs)
        row["graph_matches_eager"] = rel_err(graphed, ours_call()) < 1e-2
        row["ours_graph_img_s"] = batch / timed(lambda: graphs.run(batch, fn, *graph_inputs), iters)
    return row


@torch.inference_mode()
def bench_clip(shape, batches, device, iters):
    from vlchat.vision.cuda_graphs import GraphCache

    hf32, ours = clip_pair(shape, device)
    rows = []
    pixels = torch.randn(2, 3, shape["image_size"], shape["image_size"], device=device)
    want32 = hf32(pixels).last_hidden_state
    hf = hf32.to(torch.bfloat16)  # in place: the fp32 copy is gone from here on
    err = {"ours_bf16_vs_hf_fp32": rel_err(ours(pixels.bfloat16())[0], want32),
           "hf_bf16_vs_hf_fp32": rel_err(hf(pixels.bfloat16()).last_hidden_state, want32)}  # fmt: skip
    graphs = GraphCache()
    first = lambda p: ours(p)[0]  # noqa: E731
    one = pixels[:1].bfloat16()
    flops = flops_of(lambda: hf(one))
    for batch in batches:
        x = torch.randn(batch, 3, shape["image_size"], shape["image_size"], device=device, dtype=torch.bfloat16)
        rows.append(compare(batch, iters, lambda x=x: hf(x), lambda x=x: first(x), graphs, x, fn=first))
    out = {"errors": err, "rows": rows, "gflop_per_image": flops / 1e9}
    if device == "cuda":
        out["breakdown"] = {"batch": batches[-1], **kernel_breakdown(lambda x=x: first(x))}
    return out


def merged(out) -> torch.Tensor:
    """The merged tokens of a transformers Qwen2-VL tower (a tensor in older versions, an output object in newer)."""
    return out.pooler_output if hasattr(out, "pooler_output") else out


def qwen_inputs(images: int, side: int, patch: int, device: str):
    grid = side // patch
    grid_thw = torch.tensor([[1, grid, grid]] * images, device=device)
    pixels = torch.randn(images * grid * grid, 3 * 2 * patch * patch, device=device)
    return pixels, grid_thw


@torch.inference_mode()
def bench_qwen(shape, batches, side, device, iters):
    import functools

    from vlchat.vision.cuda_graphs import GraphCache

    hf32, ours = qwen_pair(shape, device)
    pixels, grid = qwen_inputs(2, side, shape["patch_size"], device)
    want32 = merged(hf32(pixels, grid_thw=grid))
    hf = hf32.to(torch.bfloat16)  # in place
    err = {"ours_bf16_vs_hf_fp32": rel_err(ours(pixels.bfloat16(), grid), want32),
           "hf_bf16_vs_hf_fp32": rel_err(merged(hf(pixels.bfloat16(), grid_thw=grid)), want32)}  # fmt: skip
    one, one_grid = qwen_inputs(1, side, shape["patch_size"], device)
    flops = flops_of(lambda: hf(one.bfloat16(), grid_thw=one_grid))
    rows = []
    graphs = GraphCache()
    for batch in batches:
        x, g = qwen_inputs(batch, side, shape["patch_size"], device)
        x = x.bfloat16()
        plan = ours.plan(g, x.device)
        encode = functools.partial(ours.encode, max_full=plan.max_full, max_win=plan.max_win)
        rows.append(compare(batch, iters, lambda x=x, g=g: hf(x, grid_thw=g), lambda x=x, g=g: ours(x, g), graphs,
                            x, *plan.tensors(), fn=encode))  # fmt: skip
    out = {"errors": err, "rows": rows, "gflop_per_image": flops / 1e9}
    if device == "cuda":
        out["breakdown"] = {"batch": batches[-1], **kernel_breakdown(lambda x=x, g=g: ours(x, g))}
    return out


def end_to_end(family: str, device: str, smoke: bool) -> dict:
    """A mid-size random VLM in bf16: prompt logits and 8 greedy tokens vs transformers bf16 (and fp32)."""
    from transformers import AutoProcessor

    from tests.vision import references, tiny_vlm
    from vlchat.llm import LLM, SamplingParams

    tmp = Path(tempfile.mkdtemp(prefix=f"vlchat-{family}-"))
    builder = {"llava": tiny_vlm.make_tiny_llava, "qwen2-vl": tiny_vlm.make_tiny_qwen_vl}[family]
    model_dir = builder(tmp, mid=not smoke)
    hf_cls = {"llava": "LlavaForConditionalGeneration", "qwen2-vl": "Qwen2VLForConditionalGeneration"}[family]
    import transformers

    processor = AutoProcessor.from_pretrained(model_dir)
    hf_class = getattr(transformers, hf_cls)
    hf32 = hf_class.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    hf = hf_class.from_pretrained(model_dir, dtype=torch.bfloat16).to(device).eval()
    llm = LLM(str(model_dir), dtype="bfloat16", device=device, num_blocks=256, block_size=16)
    model = llm.engine.runner.model
    convs = references.conversations(lambda seed: references.image(seed, (448, 336)))
    out = {}
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    names = ["one_image", "two_images", "second_turn", "text_only"]
    got = llm.generate([convs[n] for n in names], params)  # one mixed batch

    def generate(reference, inputs):
        try:
            return references.hf_generate(reference, inputs, 8)
        except TypeError:  # transformers versions that compute M-RoPE without mm_token_type_ids
            inputs.pop("mm_token_type_ids", None)
            return references.hf_generate(reference, inputs, 8)

    def agreeing(a, b) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), 8)

    for name, result in zip(names, got, strict=True):
        prompt = type(model).process_prompt(processor, convs[name], {})
        inputs = references.hf_inputs_for(family, prompt, device)
        tokens, logits = generate(hf, inputs)
        tokens32, logits32 = generate(hf32, inputs)
        ours = references.our_prompt_logits(model, prompt, device=device)
        out[name] = {
            "logits_rel_err_vs_hf_bf16": rel_err(ours, logits),
            "greedy_tokens_agreeing": agreeing(tokens, result.token_ids),
            # both bf16 runs against the fp32 reference: is ours as close to it as transformers in bf16?
            "ours_bf16_logits_rel_err_vs_fp32": rel_err(ours, logits32),
            "hf_bf16_logits_rel_err_vs_fp32": rel_err(logits, logits32),
            "ours_bf16_tokens_agreeing_with_fp32": agreeing(tokens32, result.token_ids),
            "hf_bf16_tokens_agreeing_with_fp32": agreeing(tokens32, tokens),
        }
    return out


def markdown(res: dict) -> str:
    nan = float("nan")
    ceiling = res.get("gemm_tflops", nan)
    lines = [f"# Vision towers on {res['device']}", "",
             f"{versions_line(res)}. bf16, random weights; images/s = batch / median forward time.",
             "", f"FLOP ceiling: one large (8192^3 on a GPU) bf16 matmul runs at {ceiling:.0f} TFLOP/s "
             "on this device in the same run; `of ceiling` is the best of ours (eager or graph) in TFLOP/s over it "
             "(FLOPs per image from torch's FLOP counter on the transformers tower).", ""]  # fmt: skip
    for name, title in (("clip", "CLIP ViT-L/336 (577 tokens/image)"), ("qwen", "Qwen2-VL ViT 675M, 448x448 images")):
        part = res.get(name)
        if not part or "rows" not in part:
            lines += [f"## {title}", "", f"failed: {part}", ""]
            continue
        e = part["errors"]
        gflop = part.get("gflop_per_image", nan)
        lines += [f"## {title}", "",
                  f"max rel err vs transformers fp32: ours bf16 {e['ours_bf16_vs_hf_fp32']:.2e}, "
                  f"transformers bf16 {e['hf_bf16_vs_hf_fp32']:.2e}; {gflop:.0f} GFLOP per image", "",
                  "| images | transformers img/s | ours eager img/s | ours CUDA graph img/s | eager x | graph x "
                  "| ours TFLOP/s | of ceiling | ceiling img/s |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in part["rows"]:
            g = r.get("ours_graph_img_s", nan)
            best = max(r["ours_eager_img_s"], g if g == g else 0.0)
            tflops = best * gflop / 1e3
            lines.append(
                f"| {r['batch']} | {r['hf_img_s']:.1f} | {r['ours_eager_img_s']:.1f} | {g:.1f} | "
                f"{r['ours_eager_img_s'] / r['hf_img_s']:.2f}x | {g / r['hf_img_s']:.2f}x | {tflops:.0f} | "
                f"{tflops / ceiling:.2f} | {ceiling * 1e3 / gflop:.0f} |"
            )
        lines.append("")
        if "ms_by_kind" in part.get("breakdown", {}):
            b = part["breakdown"]
            total = sum(b["ms_by_kind"].values())
            kinds = ", ".join(f"{k} {ms:.2f} ms ({ms / total:.0%})" for k, ms in b["ms_by_kind"].items())
            top = "; ".join(f"`{k}` {ms:.2f}" for k, ms in b["top_kernels_ms"].items())
            lines += [f"Kernel time of one eager forward at {b['batch']} images (torch.profiler): {kinds}. "
                      f"Longest kernels (ms): {top}.", ""]  # fmt: skip
    for family in ("llava", "qwen2-vl"):
        part = res.get(f"e2e_{family}")
        lines += [f"## End to end, {family} (mid-size random model, bf16, mixed batch)", ""]
        if not isinstance(part, dict) or "one_image" not in part:
            lines += [f"failed: {part}", ""]
            continue
        lines += ["| conversation | logits rel err: ours bf16 vs transformers bf16 | greedy tokens agreeing (of 8) "
                  "| vs fp32: ours bf16 logits err | transformers bf16 logits err | ours bf16 tokens agreeing "
                  "| transformers bf16 tokens agreeing |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, r in part.items():
            lines.append(
                f"| {name} | {r['logits_rel_err_vs_hf_bf16']:.2e} | {r['greedy_tokens_agreeing']} | "
                f"{r.get('ours_bf16_logits_rel_err_vs_fp32', nan):.2e} | "
                f"{r.get('hf_bf16_logits_rel_err_vs_fp32', nan):.2e} | "
                f"{r.get('ours_bf16_tokens_agreeing_with_fp32', '-')} | "
                f"{r.get('hf_bf16_tokens_agreeing_with_fp32', '-')} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = results_parser()
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check of the script)")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    res = {"device": name, **versions(transformers=True)}
    iters = 3 if args.smoke else 20
    res["gemm_tflops"] = gemm_ceiling(device)
    jobs = {
        "clip": lambda: bench_clip(SMOKE_CLIP if args.smoke else CLIP_L336, [1, 2] if args.smoke else [1, 8, 32],
                                   device, iters),
        "qwen": lambda: bench_qwen(SMOKE_QWEN if args.smoke else QWEN2_VL_VIT, [1, 2] if args.smoke else [1, 4, 8],
                                   56 if args.smoke else 448, device, iters),
        "e2e_llava": lambda: end_to_end("llava", device, args.smoke),
        "e2e_qwen2-vl": lambda: end_to_end("qwen2-vl", device, args.smoke),
    }  # fmt: skip
    stem = result_stem(args.out, "vision", name)
    for key, job in jobs.items():
        t0 = time.time()
        try:
            res[key] = job()
        except Exception as e:  # report and go on: one broken part must not hide the others
            traceback.print_exc()
            res[key] = f"{type(e).__name__}: {e}"
        print(f"[{key}] {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
        save_results(stem, res)  # what is done survives a timeout
        if device == "cuda":
            torch.cuda.empty_cache()
    save_results(stem, res, markdown)


if __name__ == "__main__":
    main()

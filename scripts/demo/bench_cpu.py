"""CPU latency of the demo model through vlchat's engine: first token and answers for one image, first token for three.

    python -m scripts.demo.bench_cpu [--threads 2] [--runs 10]

Every run sends a new scene, so neither the prefix cache nor the image-embedding cache helps. The
same requests through transformers' generate are timed as the peer. Wall time on a shared machine
includes waiting for the cores; the process CPU time (all threads) bounds what the request costs. Results go to
benchmarks/results/demo_cpu_latency.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from datetime import datetime, timezone

import torch
import transformers

from benchmarks.report import cpu_name
from scripts.demo.build import IMAGE_SIZE, MODEL_DIR
from scripts.demo.shapes import random_scene, render

RESULTS_DIR = MODEL_DIR.parents[1] / "benchmarks" / "results"
# case: (question, max new tokens, images per request)
QUESTIONS = {"first_token": ("What color is the circle?", 1, 1), "short_answer": ("What color is the circle?", 32, 1)}
QUESTIONS["describe"] = ("Describe the image.", 64, 1)
QUESTIONS["first_token_3_images"] = ("Describe the images.", 1, 3)


def _messages(question: str, images: list) -> list[dict]:
    parts = [{"type": "image", "image": image} for image in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]


def time_vlchat(llm, requests, question: str, max_tokens: int) -> tuple[list[float], list[float], int]:
    """Wall seconds and process CPU seconds (all threads) per request (a list of images), and the answer's tokens."""
    from vlchat.llm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    times, cpu, tokens = [], [], 0
    for images in requests:
        start, start_cpu = time.perf_counter(), time.process_time()
        out = llm.generate([_messages(question, images)], params)[0]
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        tokens = len(out.token_ids)
    return times, cpu, tokens


def time_transformers(model, processor, requests, question: str, max_tokens: int) -> list[float]:
    times = []
    for images in requests:
        start = time.perf_counter()
        messages = [
            {"role": "user", "content": [*[{"type": "image"}] * len(images), {"type": "text", "text": question}]}
        ]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = processor(images=images, text=[text], return_tensors="pt")
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from vlchat.llm import LLM

    rng = random.Random(7)
    start = time.perf_counter()
    llm = LLM(str(MODEL_DIR), device="cpu")
    load_s = time.perf_counter() - start
    processor = AutoProcessor.from_pretrained(MODEL_DIR)
    model = LlavaForConditionalGeneration.from_pretrained(MODEL_DIR).eval()
    rows = []
    for name, (question, max_tokens, per_request) in QUESTIONS.items():
        warm = [[render(random_scene(rng), IMAGE_SIZE * 3, rng) for _ in range(per_request)] for _ in range(2)]
        images = [
            [render(random_scene(rng), IMAGE_SIZE * 3, rng) for _ in range(per_request)] for _ in range(args.runs)
        ]
        time_vlchat(llm, warm, question, max_tokens)
        ours, ours_cpu, tokens = time_vlchat(llm, images, question, max_tokens)
        time_transformers(model, processor, warm, question, max_tokens)
        peer = time_transformers(model, processor, images, question, max_tokens)
        rows.append(
            {
                "case": name,
                "question": question,
                "tokens": tokens,
                "vlchat_median_s": statistics.median(ours),
                "vlchat_max_s": max(ours),
                "vlchat_cpu_median_s": statistics.median(ours_cpu),
                "transformers_median_s": statistics.median(peer),
                "ratio": statistics.median(peer) / statistics.median(ours),
            }
        )
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_name(),
        "threads": args.threads,
        "runs": args.runs,
        "engine_load_s": load_s,
        "load_average_1m_at_end": os.getloadavg()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "image": f"{IMAGE_SIZE * 3} px PNG-like RGB, resized to {IMAGE_SIZE} px by the processor",
    }
    lines = [
        f"Demo model on CPU ({meta['cpu']}, {args.threads} threads), {args.runs} runs each, new image per run; "
        f"torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}; "
        f"1-minute load average at the end {meta['load_average_1m_at_end']:.1f} (a shared machine)",
        "",
        "| case | tokens | vlchat median (s) | vlchat max (s) | vlchat CPU time, median (s) "
        "| transformers median (s) | transformers / vlchat |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['vlchat_median_s']:.3f} | {r['vlchat_max_s']:.3f} "
            f"| {r['vlchat_cpu_median_s']:.3f} "
            f"| {r['transformers_median_s']:.3f} | {r['ratio']:.2f}x |"
        )
    print("\n".join(lines))
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / "demo_cpu_latency.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        (RESULTS_DIR / "demo_cpu_latency.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

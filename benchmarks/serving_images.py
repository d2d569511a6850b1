"""The serving benchmark with images: request messages, what the engine spends on images, transformers' peer.

`EngineProbe` wraps an `AsyncEngine`'s methods (the benchmark's instance only) to measure:
- image preprocessing (the HF processor through `LLMEngine.normalize_prompt`): calls, seconds, and the
  seconds of it that ran on the engine thread (which then could not step);
- the vision tower's share of engine step time: device time of `embed_multimodal` over device time of the
  engine's step launches (CUDA events around each, read after the run; wall clock on a CPU);
- the engine thread's time per decode-only step while image preprocessing runs in worker threads against
  while none runs (preprocessing threads contend with the engine thread for the GIL): the step's wall time and
  the host time of its launch (building the inputs and queuing the forward; waits on the device only where
  something syncs), also as the median ratio of each busy step to the quiet steps of the same batch size.

`bench_transformers_generate` is the peer: transformers' `generate` on batches of the same requests with
their images (every row runs to the batch's longest completion; tokens timed by a streamer).
"""

from __future__ import annotations

import base64
import io
import threading
import time

import numpy as np
import torch

from benchmarks.random_vlm import hf_random_vlm
from benchmarks.serving_metrics import RequestRecord

ENGINE_THREAD = "vlchat-engine"  # AsyncEngine's step-loop thread


def prompt_text(req) -> str:
    """The request's prompt as words of the benchmark models' word-level tokenizer (one token each)."""
    return req.prompt_text or " ".join(f"t{t}" for t in req.prompt_token_ids)


def image_messages(req, images: list) -> list[dict]:
    """One user message: the request's images, then its text."""
    parts = [{"type": "image", "image": image} for image in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": prompt_text(req)}]}]


def data_url(image) -> str:
    """A PIL image as a JPEG data: URL (what an OpenAI API client sends)."""
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def hf_vlm(real_weights: bool, model_dir, dtype, device):
    """(transformers' model, its processor) for `model_dir`: its checkpoint, or random weights for a shape's."""
    if not real_weights:
        return hf_random_vlm(model_dir, dtype, device)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.padding_side = "left"
    return model, processor


def image_table(summary: dict) -> str:
    """Markdown: what vlchat's engine spent on images (EngineProbe.summary)."""
    pre, vis, steps = summary["preprocess"], summary["vision"], summary["decode_step_wall_ms"]
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    rows = [
        ("image preprocessing calls / total s", f"{pre['calls']} / {pre['total_s']:.2f}"),
        ("preprocessing median / p99 ms", f"{fmt(pre['median_ms'], '.1f')} / {fmt(pre['p99_ms'], '.1f')}"),
        ("preprocessing s on the engine thread", f"{pre['on_engine_thread_s']:.3f} (threads: "
                                                 f"{', '.join(pre['threads'])})"),
        ("images encoded", str(vis["images_encoded"])),
        ("vision tower ms / engine step ms", f"{vis['tower_ms']:.0f} / {vis['step_ms']:.0f}"),
        ("vision tower share of step time", fmt(vis["share_of_step_time"], ".3f")),
    ]  # fmt: skip
    for key, label in (("with_preprocessing", "while preprocessing"), ("without_preprocessing", "otherwise")):
        s = steps[key]
        rows.append((f"decode step wall / launch ms {label} (steps, median batch)",
                     f"{fmt(s['median_ms'], '.2f')} / {fmt(s['median_launch_ms'], '.2f')} ({s['steps']}, "
                     f"{fmt(s['median_batch'], '.0f')})"))  # fmt: skip
    same = steps["same_batch"]
    ratios = f"{fmt(same['wall_ratio'], '.2f')} / {fmt(same['launch_ratio'], '.2f')} ({same['steps']})"
    rows.append(("decode step wall / launch while preprocessing over the same batch otherwise (steps)", ratios))
    return "\n".join(["| vlchat engine, images | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


class _Timer:
    """Device time of a region: CUDA events on the current stream (read after a synchronize), else wall time."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.spans: list = []

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, begun) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.spans.append((begun, end))
        else:
            self.spans.append(time.perf_counter() - begun)

    def total_ms(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return float(sum(a.elapsed_time(b) for a, b in self.spans))
        return 1e3 * float(sum(self.spans))


def _median(values) -> float | None:
    return float(np.median(values)) if len(values) else None


def _same_batch_ratios(decode: list[tuple[float, bool, int, float]]) -> dict:
    """Median over decode steps taken while preprocessing ran of (their wall / launch time) over the median of
    the quiet steps of the same batch size: the slowdown itself, where the plain medians also differ in batch."""
    quiet: dict[int, list] = {}
    for wall, busy, batch, launch in decode:
        if not busy:
            quiet.setdefault(batch, []).append((wall, launch))
    base = {b: (np.median([w for w, _ in rows]), np.median([h for _, h in rows])) for b, rows in quiet.items()}
    matched = [(w / base[b][0], h / base[b][1]) for w, busy, b, h in decode if busy and b in base]
    return {"steps": len(matched), "wall_ratio": _median([w for w, _ in matched]),
            "launch_ratio": _median([h for _, h in matched])}  # fmt: skip


class EngineProbe:
    def __init__(self, async_engine) -> None:
        engine = async_engine.engine
        self._lock = threading.Lock()
        self.reset()
        real_normalize, real_step = engine.normalize_prompt, engine.step
        real_launch, real_embed = engine.runner.launch, engine.runner.model.embed_multimodal

        def normalize_prompt(prompt, mm_options=None):
            if not isinstance(prompt, list):  # a ready MultiModalPrompt (add_request) or text: nothing to preprocess
                return real_normalize(prompt, mm_options)
            with self._lock:
                self._active += 1
                self._started += 1
            t0 = time.perf_counter()
            try:
                return real_normalize(prompt, mm_options)
            finally:
                seconds = time.perf_counter() - t0
                with self._lock:
                    self._active -= 1
                    self.preprocess.append((threading.current_thread().name, seconds))

        def step():
            with self._lock:
                busy, started = self._active > 0, self._started
            self._decode_only = None
            t0 = time.perf_counter()
            out = real_step()
            wall = time.perf_counter() - t0
            with self._lock:
                busy = busy or self._active > 0 or self._started != started
            if self._decode_only is not None:
                self.steps.append((wall, busy, self._decode_only, self._launch_s))
            return out

        def launch(seqs, *args, **kwargs):
            self._decode_only = all(s.num_new_tokens == 1 for s in seqs) and len(seqs)
            begun, t0 = self.step_time.start(), time.perf_counter()
            try:
                return real_launch(seqs, *args, **kwargs)
            finally:
                self._launch_s = time.perf_counter() - t0
                self.step_time.stop(begun)

        def embed_multimodal(datas):
            begun = self.vision_time.start()
            try:
                return real_embed(datas)
            finally:
                self.vision_time.stop(begun)
                self.images += len(datas)

        engine.normalize_prompt, engine.step = normalize_prompt, step
        engine.runner.launch, engine.runner.model.embed_multimodal = launch, embed_multimodal
        self._engine = engine

    def detach(self) -> None:
        """Give the engine its own methods back."""
        engine, self._engine = self._engine, None
        del engine.normalize_prompt, engine.step, engine.runner.launch, engine.runner.model.embed_multimodal

    def reset(self) -> None:
        """Forget what was measured (the warm-up's)."""
        with self._lock:
            self.preprocess: list[tuple[str, float]] = []  # (thread name, seconds) per processor call
            # (wall s, preprocessing in flight, batch or 0, launch host s)
            self.steps: list[tuple[float, bool, int, float]] = []
            self._active = self._started = 0
        self._decode_only, self._launch_s = None, 0.0
        self.step_time, self.vision_time, self.images = _Timer(), _Timer(), 0

    def summary(self) -> dict:
        seconds = [s for _, s in self.preprocess]
        on_engine = sum(s for name, s in self.preprocess if name == ENGINE_THREAD)
        step_ms, vision_ms = self.step_time.total_ms(), self.vision_time.total_ms()
        decode = [step for step in self.steps if step[2]]
        split = {}
        for key, busy in (("with_preprocessing", True), ("without_preprocessing", False)):
            rows = [(w, b, h) for w, bz, b, h in decode if bz == busy]
            split[key] = {"steps": len(rows), "median_ms": _median([1e3 * w for w, _, _ in rows]),
                          "median_launch_ms": _median([1e3 * h for _, _, h in rows]),
                          "median_batch": _median([b for _, b, _ in rows])}  # fmt: skip
        split["same_batch"] = _same_batch_ratios(decode)
        return {
            "preprocess": {
                "calls": len(seconds),
                "total_s": float(sum(seconds)),
                "median_ms": _median([1e3 * s for s in seconds]),
                "p99_ms": float(np.percentile(seconds, 99) * 1e3) if seconds else None,
                "on_engine_thread_s": on_engine,
                "threads": sorted({name for name, _ in self.preprocess}),
            },  # fmt: skip
            "vision": {
                "images_encoded": self.images,
                "tower_ms": vision_ms,
                "step_ms": step_ms,
                "share_of_step_time": vision_ms / step_ms if step_ms else None,
                "steps": len(self.step_time.spans),
            },  # fmt: skip
            "decode_step_wall_ms": split,
        }


class _StepTimes:
    """A `generate` streamer: the time of every generated token (the first `put` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        pass


def bench_transformers_generate(model, processor, requests, batch_size: int) -> tuple[list, float, dict]:
    """transformers' generate on batches of `batch_size` requests with their images; all sent at t=0."""
    device, dtype = model.device, model.dtype
    records = [RequestRecord(prompt_len=r.prompt_len, send_time=0.0) for r in requests]
    start = time.perf_counter()
    for rec in records:
        rec.send_time = start
    for lo in range(0, len(requests), batch_size):
        batch = requests[lo : lo + batch_size]
        texts = [processor.apply_chat_template(image_messages(r, [None] * len(r.images)), tokenize=False,
                                               add_generation_prompt=True) for r in batch]  # fmt: skip
        images = [[im.pil() for im in r.images] for r in batch]
        inputs = processor(text=texts, images=images, padding=True, return_tensors="pt")
        inputs = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
        new = max(r.output_len for r in batch)
        streamer = _StepTimes()
        with torch.inference_mode():
            model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False, streamer=streamer,
                           pad_token_id=processor.tokenizer.pad_token_id)  # fmt: skip
        prompt_lens = inputs["attention_mask"].sum(-1).tolist()
        for rec, req, n in zip(records[lo : lo + batch_size], batch, prompt_lens, strict=True):
            rec.prompt_len = int(n)
            rec.token_times = streamer.times[: req.output_len]
            rec.chunk_tokens = [1] * len(rec.token_times)
            rec.output_len = len(rec.token_times)
            if rec.output_len < req.output_len:
                rec.ok, rec.error = False, f"generate stopped after {rec.output_len} of {req.output_len} tokens"
    duration = time.perf_counter() - start
    info = {"note": f"generate on batches of {batch_size}, all requests sent at t=0; each batch runs to its "
                    "longest completion", "batch_size": batch_size}  # fmt: skip
    return records, duration, info

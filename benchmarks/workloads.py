"""Request workloads for the serving benchmark.

`sharegpt-like-v1`: prompt and completion lengths drawn from log-normal laws
(sigma 1.0; medians exp(ln 248 - 0.5) and exp(ln 232 - 0.5), so the means are
248 and 232 tokens, like ShareGPT's), clipped to [4, 1024], random token ids,
EOS ignored so each completion has exactly its drawn length. Seeded.
A ShareGPT json file (list of {"conversations": [{"from", "value"}, ...]}) can be
used instead: first human turn as prompt, first model turn's length as output.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class DrawnImage:
    """A `width` x `height` window at (`left`, `top`) of a seeded noise canvas: distinct windows are distinct
    images (the prefix cache never matches them), and a request's images are cut only when it is sent."""

    width: int
    height: int
    left: int
    top: int
    seed: int

    def pil(self):
        from PIL import Image

        canvas = _noise_canvas(self.seed)
        return Image.fromarray(canvas[self.top : self.top + self.height, self.left : self.left + self.width].copy())


@dataclass(slots=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int
    prompt_text: str | None = None
    images: list[DrawnImage] = field(default_factory=list)  # the image workload's, in prompt order
    extra: dict = field(default_factory=dict)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def _lognormal_lengths(rng: np.random.Generator, n: int, mean: float, lo: int, hi: int) -> np.ndarray:
    sigma = 1.0
    mu = math.log(mean) - sigma**2 / 2  # median exp(mu) = exp(ln mean - 0.5)
    return np.clip(np.round(rng.lognormal(mu, sigma, size=n)), lo, hi).astype(int)


def sharegpt_like_v1(num_prompts: int, vocab_size: int, seed: int = 0, special_ids: tuple[int, ...] = ()) -> list:
    rng = np.random.default_rng(seed)
    prompt_lens = _lognormal_lengths(rng, num_prompts, 248.0, 4, 1024)
    output_lens = _lognormal_lengths(rng, num_prompts, 232.0, 4, 1024)
    banned = set(special_ids)
    out = []
    for p, o in zip(prompt_lens, output_lens, strict=True):
        ids = rng.integers(0, vocab_size, size=int(p))
        ids = [int(t) if int(t) not in banned else (int(t) + 1) % vocab_size for t in ids]
        out.append(BenchRequest(prompt_token_ids=ids, output_len=int(o)))
    return out


def from_sharegpt_file(path: str, num_prompts: int, tokenizer, seed: int = 0) -> list:
    with open(path) as f:
        data = json.load(f)
    rng = np.random.default_rng(seed)
    rng.shuffle(data)
    out = []
    for conv in data:
        turns = conv.get("conversations", [])
        if len(turns) < 2:
            continue
        prompt, answer = turns[0]["value"], turns[1]["value"]
        p_ids = tokenizer(prompt).input_ids
        o_len = len(tokenizer(answer).input_ids)
        if len(p_ids) < 4 or o_len < 4 or len(p_ids) > 1024 or len(p_ids) + o_len > 2048:
            continue
        out.append(BenchRequest(prompt_token_ids=p_ids, output_len=o_len, prompt_text=prompt))
        if len(out) == num_prompts:
            break
    return out


_CANVAS_SIDE = 2048
_canvases: dict[int, np.ndarray] = {}


def _noise_canvas(seed: int) -> np.ndarray:
    if seed not in _canvases:
        rng = np.random.default_rng(seed + 3)
        _canvases[seed] = rng.integers(0, 256, size=(_CANVAS_SIDE, _CANVAS_SIDE, 3), dtype=np.uint8)
    return _canvases[seed]


def with_images(requests: list, per_request: int = 1, min_side: int = 336, max_side: int = 1344,
                seed: int = 0) -> list:  # fmt: skip
    """The image workload: `per_request` random-content images per request, each side drawn uniformly from
    [min_side, max_side] pixels (independently, so aspect ratios vary), cut from a noise canvas at a random spot."""
    if not 1 <= min_side <= max_side <= _CANVAS_SIDE:
        raise ValueError(f"image sides must satisfy 1 <= min_side <= max_side <= {_CANVAS_SIDE}")
    rng = np.random.default_rng(seed + 1)
    for r in requests:
        r.images = []
        for _ in range(per_request):
            w, h = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
            left, top = int(rng.integers(0, _CANVAS_SIDE - w + 1)), int(rng.integers(0, _CANVAS_SIDE - h + 1))
            r.images.append(DrawnImage(w, h, left, top, seed))
    return requests


def arrival_times(num: int, request_rate: float, seed: int = 0) -> np.ndarray:
    """Seconds after start at which each request is sent: Poisson arrivals, or all at 0 for rate inf."""
    if math.isinf(request_rate):
        return np.zeros(num)
    rng = np.random.default_rng(seed + 2)
    return np.cumsum(rng.exponential(1.0 / request_rate, size=num))

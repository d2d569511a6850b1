"""Train the demo model from scratch on fresh synthetic dialogues, then evaluate it on held-out scenes.

    python -m scripts.demo.train --out DIR            # the real run (one H200, about 6 minutes)
    python -m scripts.demo.train --out DIR --tiny     # a few CPU steps: checks the whole path end to end

The layout (config, tokenizer, processor) is read from assets/demo-model, so the trained weights fit
the files shipped there. Weights, loss curve and evaluation land in DIR; `scripts.demo.publish`
copies them into assets/ and docs/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoProcessor, LlavaForConditionalGeneration

from scripts.demo.build import CLIP_MEAN, CLIP_STD, MODEL_DIR, shard_state_dict
from scripts.demo.data import IGNORE, DialogueStream, normalize_images
from scripts.demo.evaluate import answer_with_transformers, eval_items, markdown_table, score


@dataclass(slots=True)
class TrainConfig:
    steps: int = 12000
    batch_size: int = 384
    lr: float = 1e-3
    min_lr: float = 2e-5
    warmup: int = 300
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    data_seed: int = 1
    workers: int = 14
    time_budget_s: float = 300.0  # training stops here at the latest (the eval and saving follow)
    eval_scenes: int = 500
    log_every: int = 50
    device: str = "cuda"

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1 or self.warmup < 0:
            raise ValueError("steps and batch_size must be positive, warmup non-negative")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError("need 0 < min_lr <= lr")


def learning_rate(cfg: TrainConfig, step: int, elapsed_s: float) -> float:
    """Linear warmup, then cosine decay over the steps or the time budget, whichever runs out first."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, max((step - cfg.warmup) / max(1, cfg.steps - cfg.warmup), elapsed_s / cfg.time_budget_s))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=cfg.device.startswith("cuda"))


def _identity(batch):
    return batch


def train(cfg: TrainConfig, log) -> tuple[LlavaForConditionalGeneration, list[tuple[int, float]], dict]:
    torch.manual_seed(cfg.seed)
    config = AutoConfig.from_pretrained(MODEL_DIR)
    model = LlavaForConditionalGeneration(config).float().to(cfg.device).train()
    optimizer = make_optimizer(model, cfg)
    stream = DialogueStream(str(MODEL_DIR / "tokenizer.json"), cfg.batch_size, cfg.data_seed)
    # Worker batches travel through /dev/shm as tensors, or pickled through a pipe where shm is small.
    big_shm = os.path.exists("/dev/shm") and shutil.disk_usage("/dev/shm").free > 8 * 2**30
    log(f"/dev/shm large: {big_shm}")
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=None,
        num_workers=cfg.workers,
        collate_fn=torch.utils.data.default_convert if big_shm else _identity,
        pin_memory=cfg.device.startswith("cuda") and big_shm,
        prefetch_factor=4 if cfg.workers else None,
    )
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if cfg.device.startswith("cuda")
        else torch.autocast("cpu", enabled=False)
    )
    losses: list[tuple[int, float]] = []
    pending: list[torch.Tensor] = []
    start, tokens, step = time.perf_counter(), 0, 0
    for step, batch in enumerate(loader):
        if step >= cfg.steps:
            break
        lr = learning_rate(cfg, step, time.perf_counter() - start)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = {k: torch.as_tensor(v).to(cfg.device, non_blocking=True) for k, v in batch.items()}
        input_ids, labels = batch["input_ids"], batch["labels"]  # [B, L] each
        images = batch["images"]  # [n, H, W, 3] uint8
        pixel_values = normalize_images(images, CLIP_MEAN, CLIP_STD) if images.shape[0] else None
        with amp:
            logits = model(input_ids=input_ids, pixel_values=pixel_values).logits  # [B, L, vocab]
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        pending.append(loss.detach())
        tokens += input_ids.numel()
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            mean = torch.stack(pending).mean().item()
            losses.append((step + 1, mean))
            pending.clear()
            elapsed = time.perf_counter() - start
            log(f"step {step + 1:5d}  loss {mean:.4f}  lr {lr:.2e}  {elapsed:6.1f} s")
            if elapsed > cfg.time_budget_s:
                log(f"time budget reached after {step + 1} of {cfg.steps} steps")
                step += 1
                break
    elapsed = time.perf_counter() - start
    stats = {"steps_done": min(step, cfg.steps), "train_s": elapsed, "tokens": tokens, "tokens_per_s": tokens / elapsed}
    return model.eval(), losses, stats


def plot_losses(losses: list[tuple[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot([s for s, _ in losses], [v for _, v in losses])
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("answer-token cross-entropy")
    ax.set_title("vlchat demo model: training loss")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true", help="a few CPU steps with a tiny batch")
    for name in ("steps", "batch_size", "workers", "eval_scenes"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int)
    parser.add_argument("--time-budget-s", type=float)
    args = parser.parse_args()
    overrides = dict(steps=4, batch_size=8, workers=2, eval_scenes=3, device="cpu", log_every=2) if args.tiny else {}
    for name in ("steps", "batch_size", "workers", "eval_scenes", "time_budget_s"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    cfg = TrainConfig(**overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "log.txt", "w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    device_name = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else "cpu"
    log(f"config {asdict(cfg)}; torch {torch.__version__}; transformers {transformers.__version__}; {device_name}")
    model, losses, stats = train(cfg, log)
    with torch.no_grad():  # evaluate what ships: fp16-stored weights, served in fp32
        for p in model.parameters():
            p.copy_(p.half().float())
    for i, shard in enumerate(shards := shard_state_dict(model), 1):
        save_file(shard, out / f"model-{i:05d}-of-{len(shards):05d}.safetensors", {"format": "pt"})
    plot_losses(losses, out / "loss.png")
    results = {"config": asdict(cfg), "device": device_name, "stats": stats, "losses": losses}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    log(json.dumps(stats))
    processor = AutoProcessor.from_pretrained(MODEL_DIR)
    items = eval_items(cfg.eval_scenes)
    t0 = time.perf_counter()
    answers = answer_with_transformers(model, processor, items)
    stats["eval_s"] = time.perf_counter() - t0
    results["eval"] = table = score(items, answers)
    pairs = zip(items, answers, strict=True)
    results["wrong"] = [
        (i.qtype, i.messages[-1]["content"], i.expected, a) for i, a in pairs if a.strip() != i.expected
    ]
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    log(f"eval {stats['eval_s']:.1f} s; {len(results['wrong'])} wrong answers")
    log(markdown_table(table))


if __name__ == "__main__":
    main()

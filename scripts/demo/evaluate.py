"""Accuracy of the demo model on fresh held-out scenes, per question type.

    python -m scripts.demo.evaluate                      # through vlchat's engine (llm.LLM), on assets/demo-model
    python -m scripts.demo.evaluate --backend transformers

Scenes come from a seed the training never uses; every scene is asked one question of each image
type, one follow-up (a second turn after a gold first answer) and one text-only message; then, from
a second seed, one question about all of two or three images sent together ("multi"), one about one
of them ("multi_one") and a follow-up in the third turn after two gold turns ("followup3"). An answer
counts when it equals the templated answer exactly (surrounding whitespace ignored).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from PIL import Image

from scripts.demo.build import IMAGE_SIZE, MODEL_DIR
from scripts.demo.conversation import IMAGE_TYPES, QUESTION_TYPES, ask, follow_up, text_only_turn
from scripts.demo.multi import MultiDialogue, deep_follow_ups
from scripts.demo.shapes import random_scene, render

EVAL_SEED = 20261130  # training draws from seeds below 100_000
EVAL_TYPES = (*QUESTION_TYPES, "multi", "multi_one", "followup3")
# a three-image description is about 110 tokens: the budget must not cut a right answer short
MAX_NEW_TOKENS = 192


@dataclass(slots=True)
class EvalItem:
    qtype: str
    messages: list[dict]  # OpenAI-style; image parts are {"type": "image"}, in the order of `images`
    images: list[Image.Image]
    expected: str


def _user(text: str, num_images: int) -> dict:
    parts = [{"type": "image"}] * int(num_images)
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def eval_items(num_scenes: int = 500, seed: int = EVAL_SEED) -> list[EvalItem]:
    rng = random.Random(seed)
    items = []
    for _ in range(num_scenes):
        scene = random_scene(rng)
        scale = rng.choice((1, 1, 2, 3))
        image = render(scene, IMAGE_SIZE * scale, rng)
        for qtype in IMAGE_TYPES:
            turn = ask(scene, qtype, rng)
            items.append(EvalItem(qtype, [_user(turn.question, 1)], [image], turn.answer))
        while (
            second := follow_up(scene, first := ask(scene, rng.choice(("color", "exists", "where")), rng), rng)
        ) is None:
            pass
        history = [_user(first.question, 1), _assistant(first.answer)]
        items.append(EvalItem("followup", [*history, _user(second.question, 0)], [image], second.answer))
        text = text_only_turn(rng)
        items.append(EvalItem("text", [_user(text.question, 0)], [], text.answer))
    return items + several_image_items(num_scenes, seed + 1)


def several_image_items(num_scenes: int, seed: int) -> list[EvalItem]:
    """Per scene: two or three images with one question about all and one about one; a third-turn follow-up."""
    rng = random.Random(seed)
    items = []
    for _ in range(num_scenes):
        scenes = [random_scene(rng) for _ in range(rng.randint(2, 3))]
        scale = rng.choice((1, 1, 2, 3))
        images = [render(scene, IMAGE_SIZE * scale, rng) for scene in scenes]
        talk = MultiDialogue(scenes, rng)
        for qtype, turn in (("multi", talk.every()), ("multi_one", talk.one())):
            items.append(EvalItem(qtype, [_user(turn.question, len(images))], images, turn.answer))
        first, second, third = deep_follow_ups(scenes[0], rng, 3)
        history = [_user(first.question, 1), _assistant(first.answer), _user(second.question, 0),
                   _assistant(second.answer)]  # fmt: skip
        items.append(EvalItem("followup3", [*history, _user(third.question, 0)], images[:1], third.answer))
    return items


def score(items: list[EvalItem], answers: list[str]) -> dict[str, dict[str, float]]:
    right, total = defaultdict(int), defaultdict(int)
    for item, answer in zip(items, answers, strict=True):
        total[item.qtype] += 1
        right[item.qtype] += answer.strip() == item.expected
    table = {
        t: {"correct": right[t], "total": total[t], "accuracy": right[t] / total[t]} for t in EVAL_TYPES if total[t]
    }
    n, r = sum(total.values()), sum(right.values())
    table["overall"] = {"correct": r, "total": n, "accuracy": r / n}
    return table


def markdown_table(table: dict[str, dict[str, float]]) -> str:
    lines = ["| question type | correct | total | accuracy |", "| --- | ---: | ---: | ---: |"]
    for name, row in table.items():
        lines.append(f"| {name} | {row['correct']} | {row['total']} | {100 * row['accuracy']:.1f}% |")
    return "\n".join(lines)


@torch.no_grad()
def answer_with_transformers(model, processor, items: list[EvalItem], batch_size: int = 512) -> list[str]:
    """Greedy answers from transformers' generate, batched with left padding (sorted by length)."""
    device = next(model.parameters()).device
    processor.tokenizer.padding_side = "left"
    texts = [processor.apply_chat_template(item.messages, add_generation_prompt=True) for item in items]
    order = sorted(range(len(items)), key=lambda i: (not items[i].images, len(texts[i])))
    answers = [""] * len(items)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        for with_image in (True, False):
            idx = [i for i in chunk if bool(items[i].images) == with_image]
            if not idx:
                continue
            images = [image for i in idx for image in items[i].images] if with_image else None
            batch = processor(images=images, text=[texts[i] for i in idx], padding=True, return_tensors="pt")
            batch = {k: v.to(device) for k, v in batch.items()}
            out = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
            for i, ids in zip(idx, out[:, batch["input_ids"].shape[1] :], strict=True):
                answers[i] = processor.tokenizer.decode(ids, skip_special_tokens=True)
    return answers


def with_images(item: EvalItem) -> list[dict]:
    """The item's messages with its PIL images in the {"type": "image"} parts, in order, as vlchat takes them."""
    images, messages = iter(item.images), []
    for message in item.messages:
        content = message["content"]
        if not isinstance(content, str):
            content = [{**p, "image": next(images)} if p["type"] == "image" else p for p in content]
        messages.append({**message, "content": content})
    return messages


def answer_with_vlchat(llm, items: list[EvalItem], chunk: int = 256) -> list[str]:
    """Greedy answers from vlchat's engine (`llm.LLM`)."""
    from vlchat.llm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    answers = []
    for start in range(0, len(items), chunk):
        outputs = llm.generate([with_images(item) for item in items[start : start + chunk]], params)
        answers += [out.text for out in outputs]
    return answers


def evaluate_transformers(model_dir: str, items: list[EvalItem], device: str) -> list[str]:
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    processor = AutoProcessor.from_pretrained(model_dir)
    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    return answer_with_transformers(model, processor, items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(MODEL_DIR))
    parser.add_argument("--scenes", type=int, default=500)
    parser.add_argument("--seed", type=int, default=EVAL_SEED)
    parser.add_argument("--backend", choices=("vlchat", "transformers"), default="vlchat")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", help="also write the table as JSON here")
    args = parser.parse_args()
    items = eval_items(args.scenes, args.seed)
    start = time.perf_counter()
    if args.backend == "transformers":
        answers = evaluate_transformers(args.model, items, args.device)
    else:
        from vlchat.llm import LLM

        answers = answer_with_vlchat(LLM(args.model, device=args.device), items)
    table = score(items, answers)
    print(f"{len(items)} questions on {args.scenes} scenes in {time.perf_counter() - start:.1f} s ({args.backend})")
    print(markdown_table(table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=2)


if __name__ == "__main__":
    main()

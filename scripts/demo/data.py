"""Training batches for the demo model: endless fresh scenes and dialogues, encoded like the chat template.

`encode_dialogue` produces exactly the token ids the LLaVA processor produces for the same messages
(tests/vision/test_demo_data.py checks this), with labels on the assistant answers only.
"""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np
import torch
from tokenizers import Tokenizer

from scripts.demo.build import IMAGE_SIZE, NUM_IMAGE_TOKENS
from scripts.demo.conversation import Turn, random_dialogue, text_only_turn
from scripts.demo.multi import deep_follow_ups, multi_dialogue
from scripts.demo.shapes import random_scene, render_for_model
from scripts.demo.tokenizer import ASSISTANT, BOS, END, IMAGE, USER

IGNORE = -100


class DialogueEncoder:
    """Token ids and labels of a dialogue, rendered as the chat template renders it."""

    def __init__(self, tokenizer_file: str):
        self.tokenizer = Tokenizer.from_file(tokenizer_file)
        ids = {t: self.tokenizer.token_to_id(t) for t in (BOS, END, USER, ASSISTANT, IMAGE)}
        self.bos, self.end, self.user, self.assistant, self.image = (ids[t] for t in (BOS, END, USER, ASSISTANT, IMAGE))
        self._encode = lru_cache(maxsize=65536)(self._encode_uncached)

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, turns: list[Turn], image_turn: int | None, num_images: int = 1) -> tuple[list[int], list[int]]:
        """Returns (input_ids, labels); labels are IGNORE except on answers and their end token.

        The `num_images` images come before the text of turn `image_turn`."""
        ids, labels = [self.bos], [IGNORE]
        for i, turn in enumerate(turns):
            prompt = [self.user] + [self.image] * (NUM_IMAGE_TOKENS * num_images if i == image_turn else 0)
            prompt += [*self._encode(turn.question), self.end, self.assistant]
            answer = [*self._encode(turn.answer), self.end]
            ids += prompt + answer
            labels += [IGNORE] * len(prompt) + answer
        return ids, labels


def random_sample(rng: random.Random) -> tuple[list[Turn], int | None, list]:
    """(turns, index of the turn that carries the images or None, the PIL images in order).

    Mix: 5% no image, 25% two or three images in one message, 10% one image with follow-ups three
    turns deep, the rest one image; a greeting comes first in 4% of the conversations with images.
    """
    r = rng.random()
    if r < 0.05:
        return [text_only_turn(rng) for _ in range(rng.randint(1, 2))], None, []
    if r < 0.30:
        scenes = [random_scene(rng) for _ in range(rng.randint(2, 3))]
        turns = multi_dialogue(scenes, rng)
    else:
        scenes = [random_scene(rng)]
        turns = deep_follow_ups(scenes[0], rng, rng.randint(2, 4)) if r < 0.40 else random_dialogue(scenes[0], rng)
    images = [render_for_model(scene, rng, IMAGE_SIZE) for scene in scenes]
    if rng.random() < 0.04:  # a greeting first, the images with the second message
        return [text_only_turn(rng), *turns], 1, images
    return turns, 0, images


class DialogueStream(torch.utils.data.IterableDataset):
    """Endless batches; worker w of a DataLoader draws from seed * 1000 + w, so runs are reproducible."""

    def __init__(self, tokenizer_file: str, batch_size: int, seed: int):
        self.tokenizer_file, self.batch_size, self.seed = tokenizer_file, batch_size, seed

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        rng = random.Random(self.seed * 1000 + (info.id if info else 0))
        encoder = DialogueEncoder(self.tokenizer_file)
        while True:  # numpy crosses the worker pipe by pickle; tensors would need /dev/shm (see train.py)
            yield {k: v.numpy() for k, v in make_batch(encoder, rng, self.batch_size).items()}


def make_batch(encoder: DialogueEncoder, rng: random.Random, batch_size: int) -> dict[str, torch.Tensor]:
    rows, images = [], []
    for _ in range(batch_size):
        turns, image_turn, sample_images = random_sample(rng)
        rows.append(encoder.encode(turns, image_turn, len(sample_images)))
        images += [np.asarray(image, dtype=np.uint8) for image in sample_images]
    length = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((batch_size, length), encoder.tokenizer.token_to_id("<pad>"), dtype=torch.long)
    labels = torch.full((batch_size, length), IGNORE, dtype=torch.long)
    for b, (ids, lab) in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        labels[b, : len(ids)] = torch.tensor(lab)
    pixels = (
        torch.from_numpy(np.stack(images)) if images else torch.zeros(0, IMAGE_SIZE, IMAGE_SIZE, 3, dtype=torch.uint8)
    )
    return {"input_ids": input_ids, "labels": labels, "images": pixels}  # images: [n_images, H, W, 3] uint8


def normalize_images(images: torch.Tensor, mean: list[float], std: list[float]) -> torch.Tensor:
    """[n, H, W, 3] uint8 -> [n, 3, H, W] float, as the CLIP image processor rescales and normalizes."""
    x = images.permute(0, 3, 1, 2).float() / 255.0
    m = torch.tensor(mean, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, device=x.device).view(1, 3, 1, 1)
    return (x - m) / s

"""The demo model's data: scenes obey the issue's rules, answers follow the scene, and the training
encoding is token-for-token what the shipped processor produces for the same chat."""

import random

import numpy as np
import pytest
from transformers import AutoProcessor

from scripts.demo.build import IMAGE_SIZE, MODEL_DIR, NUM_IMAGE_TOKENS
from scripts.demo.conversation import (
    CAPABILITIES,
    answer_color,
    answer_count,
    answer_describe,
    answer_exists,
    answer_shapes,
    answer_where,
    random_dialogue,
    text_only_turn,
)
from scripts.demo.data import IGNORE, DialogueEncoder, make_batch, normalize_images
from scripts.demo.shapes import COLORS, Scene, Shape, random_scene, render

SCENE = Scene(
    (
        Shape("circle", "red", 0, 0.17, 0.16, 0.24),
        Shape("square", "orange", 4, 0.52, 0.49, 0.22),
        Shape("circle", "blue", 8, 0.82, 0.83, 0.26),
    ),
    (240, 240, 240),
)


@pytest.fixture(scope="module")
def processor():
    return AutoProcessor.from_pretrained(MODEL_DIR)


def test_random_scenes_follow_the_rules():
    rng = random.Random(0)
    counts = set()
    for _ in range(500):
        scene = random_scene(rng)
        counts.add(len(scene.shapes))
        boxes = [(s.cx - s.size / 2, s.cy - s.size / 2, s.cx + s.size / 2, s.cy + s.size / 2) for s in scene.shapes]
        for shape, (x0, y0, x1, y1) in zip(scene.shapes, boxes, strict=True):
            assert shape.size >= 1 / 6
            row, col = divmod(shape.cell, 3)
            assert col / 3 <= x0 < x1 <= (col + 1) / 3 and row / 3 <= y0 < y1 <= (row + 1) / 3  # inside its cell
        assert len({s.cell for s in scene.shapes}) == len(scene.shapes)  # so no two boxes overlap
        assert len({(s.color, s.kind) for s in scene.shapes}) == len(scene.shapes)
        assert min(scene.background) >= 222
    assert counts == {1, 2, 3}


def test_render_draws_each_shape_in_its_colour():
    image = np.asarray(render(SCENE, 336)).astype(int)
    for shape in SCENE.shapes:
        assert tuple(image[int(shape.cy * 336), int(shape.cx * 336)]) == COLORS[shape.color]
    assert tuple(image[5, 330]) == SCENE.background  # the empty top-right cell
    triangle = np.asarray(render(Scene((Shape("triangle", "green", 4, 0.5, 0.5, 0.3),), (240,) * 3), 300))
    assert tuple(triangle[60, 60]) == (240,) * 3 and tuple(triangle[190, 150]) == COLORS["green"]
    assert tuple(triangle[106, 106]) == (240,) * 3  # top-left corner of the box lies outside a triangle


def test_answers_follow_the_scene():
    assert answer_count(SCENE) == "There are three shapes."
    assert answer_color(SCENE, "square") == "The square is orange."
    assert answer_color(SCENE, "circle") == "The circles are red and blue."
    assert answer_color(SCENE, "triangle") == "There is no triangle in the image."
    assert answer_shapes(SCENE) == "I see a red circle, an orange square and a blue circle."
    assert answer_describe(SCENE) == (
        "The image shows three shapes on a light background: a red circle at the top left, "
        "an orange square in the center and a blue circle at the bottom right."
    )
    assert answer_exists(SCENE, "orange", "square") == "Yes, there is an orange square."
    assert answer_exists(SCENE, "red", "square") == "No, there is no red square."
    assert answer_where(SCENE, "blue", "circle") == "The blue circle is at the bottom right."
    assert answer_where(SCENE, None, "square") == "The square is in the center."
    assert answer_where(SCENE, None, "circle") == (
        "The red circle is at the top left and the blue circle is at the bottom right."
    )
    assert answer_where(SCENE, "green", "circle") == "There is no green circle in the image."


def test_training_encoding_matches_the_processor(processor):
    rng = random.Random(3)
    encoder = DialogueEncoder(str(MODEL_DIR / "tokenizer.json"))
    for _ in range(5):
        scene = random_scene(rng)
        turns = [text_only_turn(rng), *random_dialogue(scene, rng)]
        messages = []
        for i, turn in enumerate(turns):
            parts = [{"type": "image"}] if i == 1 else []
            messages.append({"role": "user", "content": [*parts, {"type": "text", "text": turn.question}]})
            messages.append({"role": "assistant", "content": turn.answer})
        text = processor.apply_chat_template(messages)
        expected = processor(images=[render(scene, IMAGE_SIZE)], text=[text])["input_ids"][0]
        ids, labels = encoder.encode(turns, image_turn=1)
        assert list(expected) == ids
        assert ids.count(processor.tokenizer.convert_tokens_to_ids("<image>")) == NUM_IMAGE_TOKENS
        answers = [i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE]
        assert processor.tokenizer.decode(answers) == "<|end|>".join(t.answer for t in turns) + "<|end|>"
    assert turns[0].answer == CAPABILITIES


def test_training_pixels_match_the_processor(processor):
    encoder = DialogueEncoder(str(MODEL_DIR / "tokenizer.json"))
    batch = make_batch(encoder, random.Random(1), 4)
    assert batch["input_ids"].shape == batch["labels"].shape and batch["images"].shape[1:] == (
        IMAGE_SIZE,
        IMAGE_SIZE,
        3,
    )
    ip = processor.image_processor
    ours = normalize_images(batch["images"], ip.image_mean, ip.image_std)
    theirs = processor.image_processor(images=list(batch["images"].numpy()), return_tensors="pt")["pixel_values"]
    assert (ours - theirs).abs().max() < 1e-5


def test_several_images_encode_as_the_processor_does(processor):
    from scripts.demo.multi import multi_dialogue

    rng = random.Random(7)
    encoder = DialogueEncoder(str(MODEL_DIR / "tokenizer.json"))
    for count in (2, 3):
        scenes = [random_scene(rng) for _ in range(count)]
        turns = multi_dialogue(scenes, rng)
        messages = []
        for i, turn in enumerate(turns):
            parts = [{"type": "image"}] * (count if i == 0 else 0)
            messages.append({"role": "user", "content": [*parts, {"type": "text", "text": turn.question}]})
            messages.append({"role": "assistant", "content": turn.answer})
        text = processor.apply_chat_template(messages)
        expected = processor(images=[render(s, IMAGE_SIZE) for s in scenes], text=[text])["input_ids"][0]
        ids, _ = encoder.encode(turns, image_turn=0, num_images=count)
        assert list(expected) == ids
        assert ids.count(processor.tokenizer.convert_tokens_to_ids("<image>")) == NUM_IMAGE_TOKENS * count


def test_answers_about_several_images_name_each_image():
    from scripts.demo.multi import MultiDialogue, about, deep_follow_ups

    other = Scene((Shape("triangle", "green", 2, 0.8, 0.2, 0.2),), (240, 240, 240))
    assert about(answer_count(SCENE), 1) == "In the second image, there are three shapes."
    assert about(answer_shapes(other), 0) == "In the first image, I see a green triangle."
    assert about(answer_color(other, "circle"), 0) == "In the first image, there is no circle."
    assert about(answer_describe(other), 2).startswith("The third image shows one shape on a light background")
    rng = random.Random(0)
    talk = MultiDialogue([SCENE, other], rng)
    every = talk.every()
    assert every.answer.count("first image") == 1 and every.answer.count("second image") == 1
    one = talk.one(index=1, qtype="where")
    assert one.question.endswith("second image?") or "second image" in one.question
    assert one.answer.startswith("In the second image, ")
    turns = deep_follow_ups(SCENE, rng, 3)
    assert [t.kind for t in turns][1:] == ["followup", "followup"]


def test_training_batches_mix_no_one_and_several_images():
    from scripts.demo.data import random_sample

    rng = random.Random(2)
    counts = [len(random_sample(rng)[2]) for _ in range(400)]
    assert {0, 1, 2, 3} <= set(counts)

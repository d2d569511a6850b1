"""The shipped demo model (assets/demo-model): transformers' LlavaForConditionalGeneration and vlchat's
engine give the same greedy tokens, and those tokens are the right answers about the example images."""

import numpy as np
import pytest
from PIL import Image
from transformers import AutoProcessor, LlavaForConditionalGeneration

from scripts.demo.build import MODEL_DIR
from scripts.demo.conversation import CAPABILITIES, answer_color, answer_describe, answer_exists, answer_where
from scripts.demo.examples import EXAMPLES, EXAMPLES_DIR
from scripts.demo.shapes import render
from vlchat.llm import LLM, SamplingParams

MAX_TOKENS = 64


def _user(text, image=None):
    parts = [{"type": "image", "image": image}] if image is not None else []
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def _cases():
    three, circles, one = (Image.open(EXAMPLES_DIR / f"{n}.png") for n in ("three-shapes", "two-circles", "one-shape"))
    s3, s2, s1 = EXAMPLES["three-shapes"], EXAMPLES["two-circles"], EXAMPLES["one-shape"]
    return [
        ([_user("Describe the image.", three)], answer_describe(s3)),
        (
            [
                _user("What color is the circle?", circles),
                {"role": "assistant", "content": answer_color(s2, "circle")},
                _user("Where is the yellow circle?"),
            ],
            answer_where(s2, "yellow", "circle"),
        ),
        ([_user("Is there an orange square?", one)], answer_exists(s1, "orange", "square")),
        ([{"role": "system", "content": "You are helpful."}, _user("Hello!")], CAPABILITIES),
    ]


@pytest.fixture(scope="module")
def transformers_answers():
    processor = AutoProcessor.from_pretrained(MODEL_DIR)
    model = LlavaForConditionalGeneration.from_pretrained(MODEL_DIR).eval()
    answers = []
    for messages, _ in _cases():
        images = [p["image"] for m in messages if isinstance(m["content"], list) for p in m["content"] if "image" in p]
        plain = [
            {**m, "content": [{"type": p["type"], "text": p.get("text")} for p in m["content"]]}
            if isinstance(m["content"], list)
            else m
            for m in messages
        ]
        text = processor.apply_chat_template(plain, add_generation_prompt=True)
        inputs = processor(images=images or None, text=[text], return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)
        answers.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    return processor.tokenizer, answers


def test_examples_are_the_documented_scenes():
    for name, scene in EXAMPLES.items():
        shipped = np.asarray(Image.open(EXAMPLES_DIR / f"{name}.png").convert("RGB"))
        assert np.array_equal(shipped, np.asarray(render(scene, shipped.shape[0]))), name


def test_vlchat_and_transformers_give_the_same_right_answers(transformers_answers):
    tokenizer, expected_ids = transformers_answers
    llm = LLM(str(MODEL_DIR), dtype="float32", device="cpu")
    cases = _cases()
    outputs = llm.generate([messages for messages, _ in cases], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    for (_, answer), ids, out in zip(cases, expected_ids, outputs, strict=True):
        assert list(out.token_ids) == ids  # both end with the <|end|> token
        assert out.text == answer
        assert tokenizer.decode(ids, skip_special_tokens=True) == answer
        assert out.finish_reason == "stop"

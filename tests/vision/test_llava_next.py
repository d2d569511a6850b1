"""LLaVA-NeXT (anyres tiles, unpadding, image_newline) end to end against transformers, fp32 on CPU."""

import pytest
from transformers import LlavaNextForConditionalGeneration

from tests.vision import vlm_checks as checks
from tests.vision.references import image, our_prompt_logits, rel_err
from tests.vision.tiny_vlm import make_tiny_llava_next

LLAVA_NEXT = checks.FamilyChecks(LlavaNextForConditionalGeneration, "llava-next")
model_dir, family, llm = checks.module_fixtures(LLAVA_NEXT, make_tiny_llava_next)


@pytest.mark.parametrize("name", ["one_image", "two_images", "second_turn"])
def test_prompt_logits_match_transformers(family, name):
    checks.check_logits(LLAVA_NEXT, family, name)


def test_batch_of_text_and_image_requests_matches_transformers(family, llm):
    checks.check_llm_batch(LLAVA_NEXT, family, llm)


@pytest.mark.parametrize("size", [(45, 30), (30, 50)], ids=["wide-unpad-rows", "tall-unpad-columns"])
def test_unpadded_odd_aspect_images_match_transformers(family, size):
    processor, ours, _ = family
    conv = [{"role": "user", "content": [{"type": "image", "image": image(5, size)}, {"type": "text", "text": "Hi"}]}]
    prompt, _, expected = LLAVA_NEXT.reference(family, conv)
    assert prompt.images[0].data["pixel_values"].shape[0] > 1
    assert rel_err(our_prompt_logits(ours, prompt), expected) < checks.RTOL

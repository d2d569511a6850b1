"""InternVL (HF-native: InternViT, pixel shuffle, Qwen2 decoder) end to end against transformers, fp32 on CPU."""

import pytest
from transformers import InternVLForConditionalGeneration

from tests.vision import vlm_checks as checks
from tests.vision.tiny_vlm import make_tiny_internvl

INTERNVL = checks.FamilyChecks(InternVLForConditionalGeneration, "internvl")
model_dir, family, llm = checks.module_fixtures(INTERNVL, make_tiny_internvl)


@pytest.mark.parametrize("name", ["one_image", "two_images", "second_turn"])
def test_prompt_logits_match_transformers(family, name):
    checks.check_logits(INTERNVL, family, name)


def test_tiles_per_image_follow_the_image_shape(family):
    processor, ours, _ = family
    prompt = INTERNVL.reference(family, checks.conversations(checks.image)["two_images"])[0]
    assert [i.data["pixel_values"].shape[0] for i in prompt.images] == [i.length // 4 for i in prompt.images]
    assert prompt.images[0].length > 4  # the 56x28 test images are cut into two tiles and a thumbnail


def test_batch_of_text_and_image_requests_matches_transformers(family, llm):
    checks.check_llm_batch(INTERNVL, family, llm)


def test_different_images_never_share_cached_blocks(family, llm):
    checks.check_prefix_cache_separates_images(INTERNVL, family, llm)

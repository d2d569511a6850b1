"""LLaVA-NeXT (anyres tiles, unpadding, image_newline) end to end against transformers, fp32 on CPU."""

import pytest
from transformers import LlavaNextForConditionalGeneration

from llm import LLM
from tests.vision import vlm_checks as checks
from tests.vision.references import hf_inputs_for
from tests.vision.tiny_vlm import make_tiny_llava_next


class LlavaNext(checks.FamilyChecks):
    hf_class = LlavaNextForConditionalGeneration

    @staticmethod
    def hf_inputs(prompt):
        return hf_inputs_for("llava-next", prompt)


LLAVA_NEXT = LlavaNext()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llava_next(tmp_path_factory.mktemp("llava-next"))


@pytest.fixture(scope="module")
def family(model_dir):
    return LLAVA_NEXT.setup_family(model_dir)


@pytest.mark.parametrize("name", ["one_image", "two_images", "second_turn"])
def test_prompt_logits_match_transformers(family, name):
    checks.check_logits(LLAVA_NEXT, family, name)


def test_batch_of_text_and_image_requests_matches_transformers(family, model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_blocks=128, block_size=8)
    checks.check_llm_batch(LLAVA_NEXT, family, llm)


@pytest.mark.parametrize("size", [(45, 30), (30, 50)], ids=["wide-unpad-rows", "tall-unpad-columns"])
def test_unpadded_odd_aspect_images_match_transformers(family, size):
    from tests.vision.references import image, our_prompt_logits, rel_err

    processor, ours, _ = family
    conv = [{"role": "user", "content": [{"type": "image", "image": image(5, size)}, {"type": "text", "text": "Hi"}]}]
    prompt, _, expected = LLAVA_NEXT.reference(family, conv)
    assert prompt.images[0].data["pixel_values"].shape[0] > 1
    assert rel_err(our_prompt_logits(ours, prompt), expected) < checks.RTOL

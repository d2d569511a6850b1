"""Qwen2-VL and Qwen2.5-VL end to end against transformers (M-RoPE, window attention), fp32 on CPU."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration

from llm.weights import load_model
from tests.vision import vlm_checks as checks
from tests.vision.references import conversations, image, our_prompt_logits, rel_err
from tests.vision.tiny_vlm import make_tiny_qwen_vl


@pytest.fixture(scope="module", params=["2", "2.5"], ids=["qwen2-vl", "qwen2.5-vl"])
def setup(request, tmp_path_factory):
    hf_class = Qwen2VLForConditionalGeneration if request.param == "2" else Qwen2_5_VLForConditionalGeneration
    checks_ = checks.FamilyChecks(hf_class, "qwen")
    model_dir = make_tiny_qwen_vl(tmp_path_factory.mktemp("qwen"), request.param)
    family = checks_.setup_family(model_dir)
    llm = checks.family_llm(model_dir)
    return checks_, family, llm


@pytest.mark.parametrize("name", ["one_image", "two_images", "second_turn"])
def test_prompt_logits_match_transformers(setup, name):
    checks_, family, _ = setup
    checks.check_logits(checks_, family, name)


def test_batch_of_text_and_image_requests_matches_transformers(setup):
    checks.check_llm_batch(*setup)


def test_different_images_never_share_cached_blocks(setup):
    checks.check_prefix_cache_separates_images(*setup)


def test_image_embeddings_are_cached_by_content(setup):
    checks.check_embeddings_cached(setup[2])


def test_image_limit_per_request(setup):
    checks.check_image_limit(setup[2])


def test_max_pixels_per_request_bounds_image_tokens(setup):
    checks_, family, _ = setup
    processor, ours, _ = family
    conv = conversations(image)["one_image"]
    full = type(ours).process_prompt(processor, conv, {})
    small = type(ours).process_prompt(processor, conv, {"max_pixels": 16 * 16})
    assert small.images[0].length < full.images[0].length
    assert small.images[0].length * 4 * 4 * 4 <= 16 * 16
    assert small.images[0].hash != full.images[0].hash


def test_transformers5_layout_loads(setup, tmp_path):
    """model.language_model.* / model.visual.* (transformers >= 5) load like model.* / visual.*."""
    checks_, family, llm = setup
    processor, ours, _ = family
    dst = tmp_path / "new"

    def rename(k):
        return "model." + k if k.startswith("visual.") else k.replace("model.", "model.language_model.", 1)

    checks.relayout(Path(llm.config.model), dst, rename)
    prompt = type(ours).process_prompt(processor, conversations(image)["one_image"], {})
    relaid = load_model(dst, dtype=torch.float32, progress=False)
    assert rel_err(our_prompt_logits(relaid, prompt), our_prompt_logits(ours, prompt)) < 1e-6


def test_tie_follows_transformers_when_the_checkpoint_has_its_own_head(setup, tmp_path):
    """tie_word_embeddings=true with a separate, different lm_head in the file: transformers unties; so do we."""
    checks_, family, llm = setup
    processor, ours, _ = family
    dst = tmp_path / "tied"
    shutil.copytree(llm.config.model, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    relaid = load_model(dst, dtype=torch.float32, progress=False)
    assert not relaid.language_model.spec.tie_word_embeddings
    prompt = type(ours).process_prompt(processor, conversations(image)["one_image"], {})
    hf = checks_.hf_class.from_pretrained(dst, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(**checks_.hf_inputs(prompt)).logits[0]
    assert rel_err(our_prompt_logits(relaid, prompt), expected) < checks.RTOL

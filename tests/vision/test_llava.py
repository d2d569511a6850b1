"""LLaVA-1.5 (CLIP tower, Llama decoder) end to end against transformers, fp32 on CPU."""

import pytest
import torch
from transformers import LlavaForConditionalGeneration

from tests.images import data_url, encode
from tests.vision import vlm_checks as checks
from tests.vision.references import image, our_prompt_logits, rel_err
from tests.vision.tiny_vlm import make_tiny_llava
from vlchat.llm.errors import WeightMismatchError
from vlchat.llm.weights import load_model

LLAVA = checks.FamilyChecks(LlavaForConditionalGeneration, "llava")
model_dir, family, llm = checks.module_fixtures(LLAVA, make_tiny_llava)


@pytest.mark.parametrize("name", ["one_image", "two_images", "second_turn"])
def test_prompt_logits_match_transformers(family, name):
    checks.check_logits(LLAVA, family, name)


def test_batch_of_text_and_image_requests_matches_transformers(family, llm):
    checks.check_llm_batch(LLAVA, family, llm)


def test_different_images_never_share_cached_blocks(family, llm):
    checks.check_prefix_cache_separates_images(LLAVA, family, llm)


def test_image_embeddings_are_cached_by_content(llm):
    checks.check_embeddings_cached(llm)


def test_image_limit_per_request(llm):
    checks.check_image_limit(llm)


def test_image_parts_as_path_bytes_and_data_url(family, llm, tmp_path):
    png = encode(image(1))
    path = tmp_path / "one.png"
    path.write_bytes(png)
    parts = [
        {"type": "image", "image": str(path)},
        {"type": "image", "image": png},
        {"type": "image_url", "image_url": {"url": data_url(png)}},
    ]
    text = {"type": "text", "text": "What is this?"}
    outs = llm.generate([[{"role": "user", "content": [p, text]}] for p in parts], checks.GREEDY)
    expected = LLAVA.reference(family, [{"role": "user", "content": [{"type": "image", "image": image(1)}, text]}])[1]
    assert all(list(o.token_ids) == expected for o in outs)


def test_every_checkpoint_layout_loads(family, model_dir, tmp_path):
    """transformers 5 names (model.language_model.*, lm_head) and vision_tower.vision_model.* load the same."""

    def new_layout(k):
        k = k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head", "lm_head")
        k = k.replace("vision_tower.", "model.vision_tower.vision_model.")
        return k.replace("multi_modal_projector.", "model.multi_modal_projector.")

    checks.relayout(model_dir, tmp_path / "new", new_layout)
    processor, ours, _ = family
    prompt = type(ours).process_prompt(processor, checks.conversations(image)["one_image"], {})
    relaid = load_model(tmp_path / "new", dtype=torch.float32, progress=False)
    assert rel_err(our_prompt_logits(relaid, prompt), our_prompt_logits(ours, prompt)) < 1e-6
    checks.relayout(model_dir, tmp_path / "bad", lambda k: k.replace("multi_modal_projector.", "mm_proj."))
    with pytest.raises(WeightMismatchError, match="mm_proj.linear_1.weight"):
        load_model(tmp_path / "bad", dtype=torch.float32, progress=False)


def test_siglip_tower_with_full_feature_strategy(tmp_path):
    """LLaVA over a SigLIP tower (no CLS, vision_feature_select_strategy="full")."""
    siglip = checks.FamilyChecks(LlavaForConditionalGeneration, "llava")
    family = siglip.setup_family(make_tiny_llava(tmp_path, tower="siglip"))
    checks.check_logits(siglip, family, "one_image")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prompt_logits_helper_runs_on_the_gpu(model_dir, family):
    """our_prompt_logits(device="cuda"), benchmarks.vision's end-to-end check, keeps every tensor on the GPU
    and gives the CPU model's logits."""
    processor, ours, _ = family
    prompt = type(ours).process_prompt(processor, checks.conversations(image)["one_image"], {})
    on_gpu = load_model(model_dir, dtype=torch.float32, device="cuda", progress=False)
    got = our_prompt_logits(on_gpu, prompt, device="cuda")
    assert got.is_cuda and rel_err(got.cpu(), our_prompt_logits(ours, prompt)) < 1e-3

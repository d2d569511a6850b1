"""Qwen2-VL and Qwen2.5-VL end to end against transformers (M-RoPE, window attention), fp32 on CPU."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration

from tests.vision import vlm_checks as checks
from tests.vision.references import conversations, image, our_prompt_logits, rel_err
from tests.vision.tiny_vlm import make_tiny_qwen_vl
from vlchat.llm import SamplingParams
from vlchat.llm.weights import load_model


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


def test_graph_decode_step_packs_mrope_positions_padded_to_the_bucket(setup):
    # M-RoPE decode rows: the graphs' static positions are [3, bucket] (cuda_graphs.static_inputs); a step of 2
    # image conversations padded to bucket 4 lands there as an eager step sees it, the padded columns zero
    from vlchat.llm.engine.cuda_graphs import DecodeGraphs

    llm = setup[2]
    engine, runner = llm.engine, llm.engine.runner
    assert runner.uses_mrope
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, name in enumerate(["one_image", "second_turn"]):
        engine.add_request(f"mrope-{i}", conversations(image)[name], params)
    for _ in range(4):
        engine.step()
    seqs = engine.scheduler.schedule()
    assert [s.num_new_tokens for s in seqs] == [1, 1]
    ids, pos, meta, _ = runner._prepare(seqs)
    runner.graphs = DecodeGraphs([4], {}, DecodeGraphs.static_buffers(4, runner.max_blocks + 8, True, runner.device))
    try:
        runner._prepare(seqs, bucket=4)
        s_ids, s_pos, s_slots, s_lens = DecodeGraphs.static_inputs(runner.graphs.buf, 4, True)
    finally:
        runner.graphs = None
    assert pos.shape == (3, 2) and s_pos.shape == (3, 4)
    assert torch.equal(s_pos[:, :2], pos) and not s_pos[:, 2:].any()
    assert torch.equal(s_ids[:2], ids) and s_slots.tolist() == meta.slot_mapping.tolist() + [-1, -1]
    assert s_lens.tolist() == meta.seq_lens.tolist() + [0, 0]
    while engine.has_unfinished():  # leave the shared engine idle for the other tests
        engine.step()

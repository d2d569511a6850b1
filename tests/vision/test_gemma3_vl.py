"""Gemma3ForConditionalGeneration (SigLIP tower, pooled projector, Gemma 3 decoder) against transformers.

A tiny random model with a real Gemma3Processor (28px images, 7px patches pooled to 4 tokens per
image) and a decoder whose sliding window (8) is shorter than the prompts, fp32 on CPU. The image
tokens attend to each other bidirectionally in transformers; the prompt logits must agree within
1e-4, and must not agree when our bidirectional fix-up is switched off (the test can fail).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.vision.references import conversations, image, our_prompt_logits, rel_err
from tests.vision.tiny_vlm import template
from vlchat.llm import LLM, SamplingParams

RTOL = 1e-4
NEW_TOKENS = 8
IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}


def _tokenizer():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from tests.llm.tiny import _tokenizer_json

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(320)), bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", model_specific_special_tokens=IMAGE_TOKENS, **IMAGE_TOKENS,
    )  # fmt: skip


def make_tiny_gemma3_vl(out: Path) -> Path:
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )  # fmt: skip

    tok = _tokenizer()
    text = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
        max_position_embeddings=512, layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                  "sliding_attention"],
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=28, patch_size=7, hidden_act="gelu_pytorch_tanh")  # fmt: skip
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in IMAGE_TOKENS.items()}
    config = Gemma3Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
        image_token_id=ids["image_token"], boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or p.dim() == 1:
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.02 if "embed_tokens" in name else 0.3)
        model.lm_head.weight[list(ids.values())] = 0.0  # never emit image tokens (tied: their embeddings too)
    model.save_pretrained(out)
    image_processor = Gemma3ImageProcessor(size={"height": 28, "width": 28}, do_pan_and_scan=False)
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tok, image_seq_length=4,
                                chat_template=template("<start_of_image>"))  # fmt: skip
    processor.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    from vlchat.llm.weights import load_model

    model_dir = make_tiny_gemma3_vl(tmp_path_factory.mktemp("gemma3-vl"))
    processor = AutoProcessor.from_pretrained(model_dir)
    ours = load_model(model_dir, dtype=torch.float32, progress=False)
    hf = Gemma3ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_dir, processor, ours, hf


def _hf_inputs(prompt, image_token_id: int) -> dict:
    ids = torch.tensor([prompt.token_ids])
    inputs = {"input_ids": ids, "token_type_ids": (ids == image_token_id).long()}
    if prompt.images:
        inputs["pixel_values"] = torch.cat([i.data["pixel_values"] for i in prompt.images])
    return inputs


@torch.no_grad()
def _hf_greedy(hf, inputs: dict, steps: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens (full recompute, token types extended with text) and its prompt logits."""
    inputs = dict(inputs)
    tokens, prompt_logits = [], None
    for _ in range(steps):
        logits = hf(**inputs).logits[0]
        prompt_logits = logits if prompt_logits is None else prompt_logits
        tokens.append(int(logits[-1].argmax()))
        new = torch.tensor([[tokens[-1]]])
        inputs["input_ids"] = torch.cat([inputs["input_ids"], new], 1)
        inputs["token_type_ids"] = torch.cat([inputs["token_type_ids"], torch.zeros_like(new)], 1)
    return tokens, prompt_logits


def _prompt(family, name: str):
    _, processor, ours, _ = family
    return type(ours).process_prompt(processor, conversations(image)[name], {})


@pytest.mark.parametrize("name", ["one_image", "two_images", "second_turn"])
def test_prompt_logits_match_transformers(family, name):
    _, _, ours, hf = family
    prompt = _prompt(family, name)
    assert [i.length for i in prompt.images] == [4] * len(prompt.images) and len(prompt.token_ids) > 8
    _, expected = _hf_greedy(hf, _hf_inputs(prompt, ours.image_token_id), 1)
    assert rel_err(our_prompt_logits(ours, prompt), expected) < RTOL


def test_image_tokens_attend_bidirectionally(family, monkeypatch):
    """Without the bidirectional rows (plain causal attention over the image) the logits move away."""
    _, _, ours, hf = family
    prompt = _prompt(family, "one_image")
    _, expected = _hf_greedy(hf, _hf_inputs(prompt, ours.image_token_id), 1)
    monkeypatch.setattr(type(ours), "_find_runs", lambda self, ids, pos: [])
    assert rel_err(our_prompt_logits(ours, prompt), expected) > 1e-3


def test_engine_greedy_matches_transformers(family):
    model_dir, _, ours, hf = family
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_blocks=64, block_size=8)
    names = ["one_image", "text_only", "two_images"]
    outs = llm.generate([conversations(image)[n] for n in names], SamplingParams(temperature=0, max_tokens=NEW_TOKENS,
                                                                                  ignore_eos=True))  # fmt: skip
    for name, out in zip(names, outs, strict=True):
        expected, _ = _hf_greedy(hf, _hf_inputs(_prompt(family, name), ours.image_token_id), NEW_TOKENS)
        assert list(out.token_ids) == expected, name
    assert len(set(expected)) > 2, "the reference continuation should not be degenerate"

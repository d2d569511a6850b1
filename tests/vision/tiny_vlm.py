"""Tiny random-weight vision-language models with real HF processors, written offline for tests.

Each `make_*` writes a Hugging Face model directory (config, safetensors, processor
with tokenizer and chat template) that both transformers and vlchat load, and returns it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.llm.tiny import make_tokenizer, tiny_llama_config

VLM_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% else %}{{ IMAGE }}{% endif %}"
    "{% endfor %}{% endif %}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def template(image_text: str) -> str:
    return VLM_TEMPLATE.replace("{{ IMAGE }}", image_text)


def _scale_weights(model, seed: int, never_emit: list[int]) -> None:
    """Larger than transformers' init so greedy decoding does not collapse into one token.

    The LM head rows of `never_emit` (image placeholder tokens) are zeroed: their logit 0 stays
    below the maximum, since transformers refuses a sequence whose placeholders outnumber its images.
    """
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # 0.15 for the tiny shapes; fan-in scaled for the mid-size benchmark models
                p.normal_(0.0, 0.3 if "embed_tokens" in name else min(0.15, 2.0 / p[0].numel() ** 0.5))
            elif "norm" in name or "lambda" in name:
                p.add_(torch.randn_like(p) * 0.05)
            else:
                p.normal_(0.0, 0.05)
        model.lm_head.weight[never_emit] = 0.0


# The GPU benchmark's end-to-end models: real tower shapes, a small decoder.
MID_TEXT = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                num_key_value_heads=8, max_position_embeddings=4096)  # fmt: skip
MID_CLIP = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                image_size=336, patch_size=14)  # fmt: skip


def make_tiny_llava(tmp_path: str | Path, seed: int = 0, tower: str = "clip", mid: bool = False) -> Path:
    """LLaVA with a 28px CLIP/SigLIP tower (7px patches) and a Llama decoder; `mid`: CLIP-L/336, 1024-wide."""
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    out = Path(tmp_path) / f"{'mid' if mid else 'tiny'}-llava-{tower}"
    if (out / "config.json").exists():
        return out
    tok = make_tokenizer()
    vision = dict(
        model_type=f"{tower}_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, image_size=28, patch_size=7,
        hidden_act="quick_gelu" if tower == "clip" else "gelu_pytorch_tanh",
    )  # fmt: skip
    vision.update(MID_CLIP if mid else {})
    side, patch = vision["image_size"], vision["patch_size"]
    config = LlavaConfig(
        vision_config=vision,
        text_config=tiny_llama_config(**(MID_TEXT if mid else {})).to_dict(),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default" if tower == "clip" else "full",
        tie_word_embeddings=False,
    )
    model = LlavaForConditionalGeneration(config)
    _scale_weights(model, seed, [config.image_token_id])
    model.save_pretrained(out, safe_serialization=True)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side}),
        tokenizer=tok,
        patch_size=patch,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        num_additional_image_tokens=1 if tower == "clip" else 0,
        chat_template=template("<image>\n"),
    )
    processor.save_pretrained(out)
    return out


QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def make_tiny_qwen_vl(tmp_path: str | Path, version: str = "2", seed: int = 0, mid: bool = False) -> Path:
    """Qwen2-VL (version "2") or Qwen2.5-VL ("2.5") with 4px patches, 2x2 merge and a Qwen2 decoder.

    `mid`: 14px patches, 8 ViT blocks of width 1280 (the 675M tower's), a 1024-wide decoder.
    """
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )  # fmt: skip

    out = Path(tmp_path) / f"{'mid' if mid else 'tiny'}-qwen{version}-vl"
    if (out / "config.json").exists():
        return out
    tok = make_tokenizer()
    tok.add_tokens(QWEN_TOKENS, special_tokens=True)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_TOKENS}
    text = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    if mid:
        text.update(MID_TEXT, rope_parameters={**text["rope_parameters"], "mrope_section": [8, 12, 12]})
    patch = 14 if mid else 4
    vision = dict(depth=8 if mid else 2, num_heads=16 if mid else 2, patch_size=patch, temporal_patch_size=2,
                  spatial_merge_size=2)  # fmt: skip
    if version == "2":
        vision.update(embed_dim=1280 if mid else 32, hidden_size=text["hidden_size"], mlp_ratio=4 if mid else 2,
                      hidden_act="quick_gelu")  # fmt: skip
        config_cls, model_cls = Qwen2VLConfig, Qwen2VLForConditionalGeneration
    else:
        vision.update(hidden_size=32, intermediate_size=48, out_hidden_size=text["hidden_size"], window_size=16,
                      fullatt_block_indexes=[1], hidden_act="silu")  # fmt: skip
        config_cls, model_cls = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    config = config_cls(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
    )  # fmt: skip
    model = model_cls(config)
    _scale_weights(model, seed, list(ids.values()))
    model.save_pretrained(out, safe_serialization=True)
    unit = 2 * patch
    pixels = dict(min_pixels=unit**2, max_pixels=36 * unit**2, patch_size=patch, temporal_patch_size=2,
                  merge_size=2)  # fmt: skip
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        video_processor=Qwen2VLVideoProcessor(**pixels),
        tokenizer=tok,
        chat_template=template("<|vision_start|><|image_pad|><|vision_end|>"),
    )
    processor.save_pretrained(out)
    return out


INTERNVL_TOKENS = {
    "start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}  # fmt: skip


def make_tiny_internvl(tmp_path: str | Path, seed: int = 0) -> Path:
    """InternVL with 28px tiles (up to 4 + thumbnail), 7px patches, 2x2 pixel shuffle, a Qwen2 decoder."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
        PreTrainedTokenizerFast,
    )  # fmt: skip

    out = Path(tmp_path) / "tiny-internvl"
    if (out / "config.json").exists():
        return out
    base = make_tokenizer()
    base.add_tokens(list(INTERNVL_TOKENS.values()), special_tokens=True)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        extra_special_tokens=INTERNVL_TOKENS,
    )  # fmt: skip
    text = dict(
        model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=[28, 28],
        patch_size=[7, 7], use_qk_norm=False, attention_bias=True, use_mean_pooling=True,
    )  # fmt: skip
    config = InternVLConfig(
        vision_config=vision, text_config=text, image_token_id=tok.context_image_token_id, image_seq_length=4,
        vision_feature_layer=-1, tie_word_embeddings=False,
    )  # fmt: skip
    model = InternVLForConditionalGeneration(config)
    _scale_weights(model, seed, [tok.convert_tokens_to_ids(t) for t in INTERNVL_TOKENS.values()])
    model.save_pretrained(out, safe_serialization=True)
    tiles = dict(size={"height": 28, "width": 28})
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(**tiles, crop_to_patches=True, min_patches=1, max_patches=4),
        video_processor=InternVLVideoProcessor(**tiles),
        tokenizer=tok,
        image_seq_length=4,
        chat_template=template("<IMG_CONTEXT>\n"),
    )
    processor.save_pretrained(out)
    return out


def make_tiny_llava_next(tmp_path: str | Path, seed: int = 0) -> Path:
    """LLaVA-NeXT: a 28px CLIP tower (7px patches), anyres pinpoints of 1x2, 2x1 and 2x2 tiles, a Llama decoder."""
    from transformers import (
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    out = Path(tmp_path) / "tiny-llava-next"
    if (out / "config.json").exists():
        return out
    tok = make_tokenizer()
    pinpoints = [[28, 56], [56, 28], [56, 56]]
    vision = dict(
        model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, image_size=28, patch_size=7, hidden_act="quick_gelu",
    )  # fmt: skip
    config = LlavaNextConfig(
        vision_config=vision, text_config=tiny_llama_config().to_dict(), image_grid_pinpoints=pinpoints,
        image_token_id=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlavaNextForConditionalGeneration(config)
    _scale_weights(model, seed, [config.image_token_id])
    model.save_pretrained(out, safe_serialization=True)
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(
            size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, image_grid_pinpoints=pinpoints
        ),
        tokenizer=tok,
        patch_size=7,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=template("<image>\n"),
    )
    processor.save_pretrained(out)
    return out

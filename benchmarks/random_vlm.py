"""Random-weight vision-language model directories at real shapes, for the serving benchmark with images.

Like `random_model` for text shapes: a directory with config.json and the model's real Hugging Face
processor (image processor, a word-level tokenizer whose `t<id>` words are token ids, the image
placeholder tokens, a chat template) but no weights; vlchat fills its parameters inside
`random_model.random_weights()` and `hf_random_vlm` builds transformers' model from the config.

Shapes: LLaVA-1.5-7B (CLIP ViT-L/336, 576 tokens per image, a Llama-2-7B decoder) and Qwen2.5-VL-7B
(its 32-block ViT with window attention at native resolution, 4 pixels -> 1 token per 28x28 patch,
a Qwen2-7B decoder with M-RoPE); the `-smoke` shapes keep each family's processor and token counts
(Qwen's capped at 64 per image) around widths a CPU runs in seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from benchmarks.random_model import _random_fill, word_level_tokenizer

_LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # fmt: skip
_CLIP_L336 = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                  image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu")  # fmt: skip
_QWEN2_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                  "mrope_section": [16, 24, 24]})  # fmt: skip
_QWEN25_VIT = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                   fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu")  # fmt: skip
_SMOKE_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=4096)  # fmt: skip

SHAPES = {
    # name: family, words in the tokenizer (before the special tokens), text and vision config fields
    "llava-1.5-7b": dict(family="llava", words=32000, text=_LLAMA2_7B, vision=_CLIP_L336),
    "qwen2.5-vl-7b": dict(
        family="qwen2.5-vl", words=151643, text=_QWEN2_7B, vision=_QWEN25_VIT, max_pixels=12845056
    ),  # fmt: skip
    "llava-smoke": dict(
        family="llava",
        words=1024,
        text=dict(_SMOKE_TEXT, rms_norm_eps=1e-5),
        vision=dict(_CLIP_L336, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
    ),  # fmt: skip
    "qwen2.5-vl-smoke": dict(
        family="qwen2.5-vl",
        words=1024,
        max_pixels=64 * 28 * 28,
        text=dict(
            _SMOKE_TEXT,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        ),
        vision=dict(
            _QWEN25_VIT,
            depth=2,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            out_hidden_size=64,
            fullatt_block_indexes=[1],
        ),
    ),  # fmt: skip
}

_IMAGE_TEXT = {"llava": "<image>\n", "qwen2.5-vl": "<|vision_start|><|image_pad|><|vision_end|>\n"}
_SPECIALS = {
    "llava": ["<image>", "<pad>"],
    "qwen2.5-vl": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<pad>"],
}


def chat_template(image_text: str) -> str:
    return (
        "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% else %}" + image_text.replace(
            "\n", " ") + "{% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )  # fmt: skip


def text_vocab(shape: str) -> int:
    """Token ids below this are plain `t<id>` words (0 and 1 are BOS and EOS): what prompts are drawn from."""
    return SHAPES[shape]["words"]


def write_config_dir(path: str | os.PathLike, shape: str, num_layers: int | None = None,
                     vision_layers: int | None = None, dtype: str = "bfloat16") -> str:  # fmt: skip
    """A model directory for `shape` with config.json and the processor but no weights.

    `num_layers` / `vision_layers` override the decoder's / the vision tower's depth (smoke runs).
    """
    spec = SHAPES[shape]
    family = spec["family"]
    tok = word_level_tokenizer(spec["words"])
    tok.add_tokens(_SPECIALS[family], special_tokens=True)
    tok.pad_token = "<pad>"
    tok.padding_side = "left"
    ids = {t: tok.convert_tokens_to_ids(t) for t in _SPECIALS[family]}
    template = chat_template(_IMAGE_TEXT[family])
    text = dict(spec["text"], vocab_size=len(tok), bos_token_id=0, eos_token_id=1, pad_token_id=ids["<pad>"])
    if num_layers is not None:
        text["num_hidden_layers"] = num_layers
    vision = dict(spec["vision"])
    depth_key = "num_hidden_layers" if family == "llava" else "depth"
    if vision_layers is not None:
        vision[depth_key] = vision_layers
        if family == "qwen2.5-vl":  # the last block attends to the whole image, as in the full tower
            vision["fullatt_block_indexes"] = [i for i in vision["fullatt_block_indexes"] if i < vision_layers] or [
                vision_layers - 1]  # fmt: skip
    if family == "llava":
        config, processor = _llava(text, vision, ids, tok, template)
    else:
        config, processor = _qwen25_vl(text, vision, ids, tok, template, spec["max_pixels"])
    config.dtype = dtype
    config.save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)


def _llava(text, vision, ids, tok, template):
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaProcessor

    config = LlavaConfig(
        vision_config=dict(vision, model_type="clip_vision_model"), text_config=dict(text, model_type="llama"),
        image_token_id=ids["<image>"], vision_feature_layer=-2, vision_feature_select_strategy="default",
        projector_hidden_act="gelu", tie_word_embeddings=False, architectures=["LlavaForConditionalGeneration"],
    )  # fmt: skip
    side = vision["image_size"]
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side}),
        tokenizer=tok, patch_size=vision["patch_size"], vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=template,
    )  # fmt: skip
    return config, processor


def _qwen25_vl(text, vision, ids, tok, template, max_pixels):
    from transformers import Qwen2_5_VLConfig, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
        architectures=["Qwen2_5_VLForConditionalGeneration"],
    )  # fmt: skip
    pixels = dict(min_pixels=56 * 56, max_pixels=max_pixels, patch_size=vision["patch_size"],
                  temporal_patch_size=vision["temporal_patch_size"],
                  merge_size=vision["spatial_merge_size"])  # fmt: skip
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels), video_processor=Qwen2VLVideoProcessor(**pixels),
        tokenizer=tok, chat_template=template,
    )  # fmt: skip
    return config, processor


def hf_random_vlm(model_dir: str | os.PathLike, dtype: torch.dtype, device: str):
    """(transformers' model for a `write_config_dir` directory, randomly filled on `device`; its processor)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    _random_fill(model, Path(model_dir))
    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.padding_side = "left"
    return model.eval(), processor

"""The demo model's architecture and how it is written to disk (assets/demo-model/).

LLaVA layout: a small CLIP vision tower (112 px, 14 px patches: 64 image tokens), a two-layer MLP
projector and a small Llama decoder. About 8.5 M parameters; stored in fp16 (lossless upcast to the
fp32 the config asks for, which is what a CPU serves fastest).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

from scripts.demo.tokenizer import IMAGE, train_tokenizer

IMAGE_SIZE = 112
PATCH_SIZE = 14
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # 64: the CLS row is dropped ("default" strategy)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "demo-model"
MAX_SHARD_BYTES = 15 * 2**20  # files coming back from the training machine are capped at 16 MiB


def build_config(tokenizer: PreTrainedTokenizerFast) -> LlavaConfig:
    vision = CLIPVisionConfig(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        num_channels=3,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        image_seq_length=NUM_IMAGE_TOKENS,
        multimodal_projector_bias=True,
        tie_word_embeddings=False,
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    config.dtype = torch.float32
    return config


def build_processor(tokenizer: PreTrainedTokenizerFast) -> LlavaProcessor:
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_resize=True,
        do_center_crop=True,
        do_rescale=True,
        do_normalize=True,
        do_convert_rgb=True,
        image_mean=list(CLIP_MEAN),
        image_std=list(CLIP_STD),
        resample=3,  # bicubic
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=tokenizer.chat_template,
        image_token=IMAGE,
        num_additional_image_tokens=1,
    )


def build_untrained(seed: int = 0) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    tokenizer = train_tokenizer()
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(build_config(tokenizer)).float().eval()
    return model, build_processor(tokenizer)


def shard_state_dict(model: torch.nn.Module, dtype: torch.dtype = torch.float16) -> list[dict[str, torch.Tensor]]:
    """HF-named tensors (as save_pretrained names them) split into shards of at most MAX_SHARD_BYTES."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu", dtype).contiguous()
        if size + t.numel() * t.element_size() > MAX_SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.numel() * t.element_size()
    return shards


def save_model(
    model: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    out_dir: Path,
    info: dict,
    single_file: bool = True,
) -> None:
    """Write config, processor/tokenizer files, vlchat.json and the weights (one file, or <=15 MiB shards)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    (out_dir / "vlchat.json").write_text(json.dumps(info, indent=2) + "\n")
    shards = shard_state_dict(model)
    if single_file:
        save_file({k: v for shard in shards for k, v in shard.items()}, out_dir / "model.safetensors", {"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out_dir / name, {"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    index = {"metadata": {}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def main() -> None:
    model, processor = build_untrained()
    info = {
        "name": "vlchat-demo",
        "trained": False,
        "note": "random weights: same layout, tokenizer and processor as the trained demo model that replaces it",
    }
    save_model(model, processor, MODEL_DIR, info)
    print(f"wrote an untrained demo model to {MODEL_DIR}")


if __name__ == "__main__":
    main()

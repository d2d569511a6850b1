"""Qwen2-VL and Qwen2.5-VL: native-resolution ViT with a patch merger, Qwen2 decoder with M-RoPE.

Every image becomes grid_t * (grid_h / 2) * (grid_w / 2) tokens; the processor's
`min_pixels`/`max_pixels` (per request, through mm_options) bound that budget.
"""

from __future__ import annotations

import functools

import torch

from vlchat.llm.engine.transfer import tensor_to_device
from vlchat.llm.rope import rope_parameters_from_config
from vlchat.llm.weights import WeightRule
from vlchat.vision.encoders.qwen_vit import QwenVisionTransformer, QwenViTConfig
from vlchat.vision.models.base import VisionLanguageModel
from vlchat.vision.mrope import MRotaryEmbedding, mrope_positions

# transformers >= 5 writes model.language_model.*, model.visual.*, lm_head.*; earlier versions
# model.{layers,embed_tokens,norm}.*, visual.*, lm_head.*.
QWEN_VL_LAYOUT = [
    WeightRule(r"^model\.language_model\.", "language_model.model."),
    WeightRule(r"^model\.visual\.", "visual."),
    WeightRule(r"^model\.(?=(layers|embed_tokens|norm)\.)", "language_model.model."),
    WeightRule(r"^lm_head\.", "language_model.lm_head."),
]


def mrope_section(text_config) -> list[int]:
    for params in (rope_parameters_from_config(text_config), getattr(text_config, "rope_parameters", None),
                   getattr(text_config, "rope_scaling", None)):  # fmt: skip
        if isinstance(params, dict) and params.get("mrope_section"):
            return list(params["mrope_section"])
    return [16, 24, 24]  # transformers' default


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    uses_mrope = True
    graph_min_uses = 2  # native resolution: capture only image sizes that recur

    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        self.visual = QwenVisionTransformer(QwenViTConfig.from_hf(hf_config.vision_config))
        spec = self.language_model.spec
        text = hf_config.get_text_config()
        rotary = MRotaryEmbedding(spec.head_dim, spec.max_position, spec.rope_parameters, mrope_section(text), dtype)
        for layer in self.language_model.model.layers:
            layer.self_attn.rotary_emb = rotary
        self.weight_mapping = self.build_weight_mapping(QWEN_VL_LAYOUT, self.visual.weight_rules())

    def embed_multimodal(self, datas: list[dict]) -> list[torch.Tensor]:
        device = self.visual.patch_embed.proj.weight.device
        pixels = tensor_to_device(torch.cat([d["pixel_values"] for d in datas]), device)
        grids = torch.cat([d["image_grid_thw"] for d in datas])
        plan = self.visual.plan(grids, device)
        encode = functools.partial(self.visual.encode, max_full=plan.max_full, max_win=plan.max_win)
        key = tuple(map(tuple, grids.tolist()))
        merged = self.run_vision(key, encode, pixels, *plan.tensors())  # [all image tokens, hidden]
        sizes = (grids.prod(-1) // self.visual.cfg.spatial_merge_size**2).tolist()
        return list(merged.split(sizes))

    @classmethod
    def split_images(cls, processor, outputs, num_images: int, token_ids: list[int], placeholder: int):
        if num_images == 0:
            return [], []
        grids = outputs["image_grid_thw"]
        patches = grids.prod(-1).tolist()
        pixels = outputs["pixel_values"].split(patches)
        merge = processor.image_processor.merge_size
        datas = [{"pixel_values": pixels[i], "image_grid_thw": grids[i : i + 1]} for i in range(num_images)]
        return datas, [p // merge**2 for p in patches]

    @classmethod
    def finish_prompt(cls, processor, prompt):
        merge = processor.image_processor.merge_size
        prompt.mrope_positions, prompt.mrope_delta = mrope_positions(len(prompt.token_ids), prompt.images, merge)
        return prompt


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """Qwen2.5-VL: the same model around an RMSNorm/SwiGLU tower with window attention."""

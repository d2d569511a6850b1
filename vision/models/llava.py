"""LLaVA-1.5 (LlavaForConditionalGeneration): a CLIP or SigLIP tower, an MLP projector, the engine's decoder.

Image features are the tower's hidden states at `vision_feature_layer` (several
layers are concatenated), without the CLS row under the "default" strategy.
"""

from __future__ import annotations

import torch

from vlchat.llm.engine.transfer import tensor_to_device
from vlchat.llm.weights import WeightRule
from vlchat.vision.encoders.clip import ClipVisionConfig, ClipVisionTower
from vlchat.vision.models.base import VisionLanguageModel
from vlchat.vision.projectors import MultiModalProjector

# transformers >= 5 writes model.{language_model,vision_tower,multi_modal_projector}.* and lm_head.*;
# earlier versions language_model.{model,lm_head}.*, vision_tower.vision_model.*, multi_modal_projector.*.
LLAVA_LAYOUT = [
    WeightRule(r"^model\.language_model\.", "language_model.model."),
    WeightRule(r"^lm_head\.", "language_model.lm_head."),
    WeightRule(r"^model\.(vision_tower|multi_modal_projector|image_newline)", r"\1"),
]


def feature_layers(hf_config) -> list[int]:
    layer = hf_config.vision_feature_layer
    return [layer] if isinstance(layer, int) else list(layer)


class LlavaForConditionalGeneration(VisionLanguageModel):
    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        vision = hf_config.vision_config
        layers = feature_layers(hf_config)
        self.vision_tower = ClipVisionTower(ClipVisionConfig.from_hf(vision), layers)
        self.select_strategy = hf_config.vision_feature_select_strategy
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy must be default or full, got {self.select_strategy!r}")
        self.multi_modal_projector = MultiModalProjector(
            vision.hidden_size * len(layers),
            hf_config.get_text_config().hidden_size,
            hf_config.projector_hidden_act,
            bias=getattr(hf_config, "multimodal_projector_bias", True),
        )
        self.weight_mapping = self.build_weight_mapping(LLAVA_LAYOUT, self.vision_tower.weight_rules())

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values: [tiles, C, H, W] -> projected features [tiles, tokens per tile, hidden]."""
        feats = torch.cat(self.vision_tower(pixel_values), dim=-1)  # [tiles, seq, d * layers]
        if self.select_strategy == "default":
            feats = feats[:, 1:]  # the CLS row (transformers drops the first row whatever the tower)
        return self.multi_modal_projector(feats)

    def embed_multimodal(self, datas: list[dict]) -> list[torch.Tensor]:
        pixels = torch.cat([d["pixel_values"] for d in datas])
        pixels = tensor_to_device(pixels, self.vision_tower.embeddings.patch_embedding.weight.device)
        feats = self.run_vision(tuple(pixels.shape), self.image_features, pixels)  # [images, tokens, hidden]
        return list(feats.unbind(0))

    @classmethod
    def split_images(cls, processor, outputs, num_images: int, token_ids: list[int], placeholder: int):
        if num_images == 0:
            return [], []
        pixels = outputs["pixel_values"]
        per_image = sum(t == placeholder for t in token_ids) // num_images
        return [{"pixel_values": pixels[i : i + 1]} for i in range(num_images)], [per_image] * num_images

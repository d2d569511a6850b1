"""InternVL (HF-native InternVLForConditionalGeneration): InternViT, pixel shuffle, LayerNorm-MLP projector.

The processor cuts an image into up to `max_patches` tiles (plus a thumbnail); each
tile gives `image_seq_length` tokens after the 2x2 pixel shuffle. An image's tiles
are one contiguous run of placeholders between <img> and </img>.
"""

from __future__ import annotations

import torch

from vlchat.llm.engine.transfer import tensor_to_device
from vlchat.vision.encoders.intern_vit import InternViT, InternViTConfig, pixel_shuffle
from vlchat.vision.models.base import VisionLanguageModel
from vlchat.vision.models.llava import LLAVA_LAYOUT
from vlchat.vision.processing import image_runs
from vlchat.vision.projectors import MultiModalProjector


class InternVLForConditionalGeneration(VisionLanguageModel):
    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        if not isinstance(hf_config.vision_feature_layer, int):
            raise ValueError("InternVL with several vision feature layers is not supported")
        self.vision_tower = InternViT(InternViTConfig.from_hf(hf_config.vision_config), hf_config.vision_feature_layer)
        self.select_strategy = hf_config.vision_feature_select_strategy
        self.scale = float(hf_config.downsample_ratio)
        folded = hf_config.vision_config.hidden_size * int(1 / self.scale) ** 2
        self.multi_modal_projector = MultiModalProjector(
            folded, hf_config.get_text_config().hidden_size, hf_config.projector_hidden_act, norm=True
        )
        self.weight_mapping = self.build_weight_mapping(LLAVA_LAYOUT, self.vision_tower.weight_rules())

    def tile_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values: [tiles, C, H, W] -> [tiles, tokens per tile, hidden]."""
        feats = self.vision_tower(pixel_values)  # [tiles, 1 + patches, d]
        if self.select_strategy == "default":
            feats = feats[:, 1:]
        tiles, patches, d = feats.shape
        side = int(patches**0.5)
        folded = pixel_shuffle(feats.reshape(tiles, side, side, d), self.scale)
        return self.multi_modal_projector(folded.reshape(tiles, -1, folded.shape[-1]))

    def embed_multimodal(self, datas: list[dict]) -> list[torch.Tensor]:
        device = self.vision_tower.projection.weight.device
        pixels = tensor_to_device(torch.cat([d["pixel_values"] for d in datas]), device)
        feats = self.run_vision(tuple(pixels.shape), self.tile_features, pixels)  # [all tiles, tokens, hidden]
        per_image = feats.split([d["pixel_values"].shape[0] for d in datas])
        return [f.reshape(-1, f.shape[-1]) for f in per_image]

    @classmethod
    def split_images(cls, processor, outputs, num_images: int, token_ids: list[int], placeholder: int):
        if num_images == 0:
            return [], []
        runs = image_runs(token_ids, placeholder, num_images, "do not type image tokens in text")
        tiles = [r // processor.image_seq_length for r in runs]
        pixels = outputs["pixel_values"].split(tiles)
        return [{"pixel_values": p} for p in pixels], runs

"""LLaVA-NeXT (LlavaNextForConditionalGeneration): LLaVA with anyres tiling.

The processor resizes each image to the best of `image_grid_pinpoints` and cuts it
into tower-sized tiles, plus one downscaled base tile. The tiles' features are laid
back out as one feature map, the padding the resize added is cut off ("unpadding"),
an `image_newline` row ends every feature row, and the base tile's features lead.
"""

from __future__ import annotations

import torch
from torch import nn

from vlchat.llm.engine.transfer import tensor_to_device
from vlchat.vision.models.llava import LlavaForConditionalGeneration
from vlchat.vision.processing import image_runs


def select_best_resolution(size: tuple[int, int], pinpoints: list) -> tuple[int, int]:
    """The (height, width) pinpoint that keeps the most of an image of `size` (h, w), wasting the least."""
    h, w = size
    best, best_fit, best_waste = None, -1, float("inf")
    for ph, pw in pinpoints:
        scale = min(pw / w, ph / h)
        dh, dw = int(h * scale), int(w * scale)
        fit = min(dw * dh, w * h)
        waste = pw * ph - fit
        if fit > best_fit or (fit == best_fit and waste < best_waste):
            best, best_fit, best_waste = (ph, pw), fit, waste
    return best


def unpad(features: torch.Tensor, original: tuple[int, int]) -> torch.Tensor:
    """features: [C, H, W] of a padded resize of an image of `original` (h, w) size -> the unpadded part."""
    oh, ow = original
    _, h, w = features.shape
    if ow / oh > w / h:
        new_h = int(round(oh * (w / ow), 7))
        pad = (h - new_h) // 2
        return features[:, pad : h - pad, :]
    new_w = int(round(ow * (h / oh), 7))
    pad = (w - new_w) // 2
    return features[:, :, pad : w - pad]


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        self.image_newline = nn.Parameter(torch.empty(hf_config.get_text_config().hidden_size))
        self.pinpoints = [tuple(p) for p in hf_config.image_grid_pinpoints]
        self.tile_size = hf_config.vision_config.image_size

    def pack(self, tiles: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """tiles: [1 + grid tiles, tokens per tile, hidden] -> [image tokens, hidden]."""
        base, rest = tiles[0], tiles[1:]
        if rest.shape[0] == 0:
            return torch.cat([base, self.image_newline[None].to(base.dtype)])
        side = self.tile_size // self.vision_tower.cfg.patch_size
        ph, pw = select_best_resolution(image_size, self.pinpoints)
        rows, cols = ph // self.tile_size, pw // self.tile_size
        fmap = rest.view(rows, cols, side, side, -1).permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)  # [d, H, W]
        fmap = unpad(fmap, image_size)
        newline = self.image_newline[:, None, None].expand(-1, fmap.shape[1], 1).to(fmap.dtype)
        fmap = torch.cat([fmap, newline], dim=-1)  # [d, H, W + 1]
        return torch.cat([base, fmap.flatten(1, 2).t()])

    def embed_multimodal(self, datas: list[dict]) -> list[torch.Tensor]:
        pixels = torch.cat([d["pixel_values"] for d in datas])
        pixels = tensor_to_device(pixels, self.image_newline.device)
        feats = self.run_vision(tuple(pixels.shape), self.image_features, pixels)  # [all tiles, tokens, hidden]
        per_image = feats.split([d["pixel_values"].shape[0] for d in datas])
        return [self.pack(f, tuple(d["image_sizes"].view(-1).tolist())) for f, d in zip(per_image, datas, strict=True)]

    @classmethod
    def split_images(cls, processor, outputs, num_images: int, token_ids: list[int], placeholder: int):
        if num_images == 0:
            return [], []
        runs = image_runs(token_ids, placeholder, num_images, "put text between images")
        ip = processor.image_processor
        tile = ip.crop_size["height"] if isinstance(ip.crop_size, dict) else ip.crop_size.height
        pinpoints = [tuple(p) for p in ip.image_grid_pinpoints]
        datas = []
        for pixels, size in zip(outputs["pixel_values"], outputs["image_sizes"], strict=True):
            h, w = select_best_resolution(tuple(size.tolist()), pinpoints)
            count = 1 + (h // tile) * (w // tile)
            datas.append({"pixel_values": pixels[:count], "image_sizes": size.view(1, 2)})
        return datas, runs

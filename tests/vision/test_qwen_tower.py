"""Qwen2-VL and Qwen2.5-VL vision towers against transformers (same weights, fp32, 1e-4)."""

import pytest
import torch
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from vlchat.vision.encoders.qwen_vit import QwenVisionTransformer, QwenViTConfig

GRIDS = [[1, 6, 10], [1, 4, 4], [2, 2, 6]]  # odd window remainders, a small image, two frames


def _hf(version):
    common = dict(depth=3, num_heads=2, patch_size=4, temporal_patch_size=2, spatial_merge_size=2, hidden_act="silu")
    if version == "2":
        cfg = Qwen2VLVisionConfig(embed_dim=32, hidden_size=24, mlp_ratio=2, **{**common, "hidden_act": "quick_gelu"})
        return Qwen2VisionTransformerPretrainedModel._from_config(cfg).eval()
    cfg = Qwen2_5_VLVisionConfig(
        hidden_size=32, intermediate_size=48, out_hidden_size=24, window_size=16, fullatt_block_indexes=[1], **common
    )
    return Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg).eval()


@pytest.mark.parametrize("version", ["2", "2.5"])
def test_tower_matches_transformers(version):
    torch.manual_seed(0)
    hf = _hf(version)
    with torch.no_grad():
        for p in hf.parameters():  # HF leaves norms at one and biases at zero; make them count
            p.add_(torch.randn_like(p) * 0.05)
    ours = QwenVisionTransformer(QwenViTConfig.from_hf(hf.config)).eval()
    ours.load_weights(hf.state_dict().items())
    grid = torch.tensor(GRIDS)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4)
    with torch.no_grad():
        want = hf(pixels, grid_thw=grid).pooler_output
        got = ours(pixels, grid)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

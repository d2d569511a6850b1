"""InternViT + pixel shuffle + projector against transformers' InternVLModel.get_image_features (fp32, 1e-4)."""

import pytest
import torch
from transformers import InternVLConfig, InternVLModel

from vlchat.vision.encoders.intern_vit import InternViT, InternViTConfig, pixel_shuffle
from vlchat.vision.projectors import MultiModalProjector


def _perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)


@pytest.mark.parametrize(
    "vision",
    [
        dict(use_qk_norm=False, attention_bias=True, use_mean_pooling=True, norm_type="layer_norm"),
        dict(use_qk_norm=True, attention_bias=False, use_mean_pooling=False, norm_type="rms_norm"),
    ],
    ids=["300m-like", "6b-like"],
)
@pytest.mark.parametrize("feature_layer", [-1, -2])
def test_image_features_match_transformers(vision, feature_layer):
    torch.manual_seed(0)
    cfg = InternVLConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=[28, 28],
            patch_size=[7, 7],
            **vision,
        ),
        text_config=dict(
            model_type="qwen2",
            hidden_size=24,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=64,
        ),
        vision_feature_layer=feature_layer,
    )
    hf = InternVLModel(cfg).eval()
    _perturb(hf)
    tower = InternViT(InternViTConfig.from_hf(cfg.vision_config), feature_layer).eval()
    tower.load_weights(
        (n.removeprefix("vision_tower."), t) for n, t in hf.state_dict().items() if n.startswith("vision_tower.")
    )
    proj = MultiModalProjector(32 * 4, 24, cfg.projector_hidden_act, norm=True).eval()
    proj.load_weights(
        (n.removeprefix("multi_modal_projector."), t)
        for n, t in hf.state_dict().items()
        if n.startswith("multi_modal_projector.")
    )
    pixels = torch.randn(3, 3, 28, 28)
    with torch.no_grad():
        want = hf.get_image_features(pixel_values=pixels).pooler_output
        feats = tower(pixels)[:, 1:]  # drop CLS
        got = proj(pixel_shuffle(feats.reshape(3, 4, 4, -1), 0.5).reshape(3, -1, 32 * 4))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

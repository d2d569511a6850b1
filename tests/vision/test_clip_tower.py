"""CLIP and SigLIP towers against transformers (same weights, fp32, 1e-4)."""

import pytest
import torch
from transformers import CLIPVisionConfig, CLIPVisionModel, SiglipVisionConfig, SiglipVisionModel

from vlchat.llm.errors import WeightMismatchError
from vlchat.vision.encoders.clip import ClipVisionConfig, ClipVisionTower

SHAPE = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=28, patch_size=7
)


def _hf(kind):
    if kind == "clip":
        return CLIPVisionModel(CLIPVisionConfig(**SHAPE, hidden_act="quick_gelu")).eval()
    return SiglipVisionModel(SiglipVisionConfig(**SHAPE, hidden_act="gelu_pytorch_tanh")).eval()


@pytest.mark.parametrize("kind", ["clip", "siglip"])
@pytest.mark.parametrize("layers", [[-2], [-1], [0, 1, -1]], ids=["penultimate", "last", "several"])
def test_tower_matches_transformers(kind, layers):
    torch.manual_seed(0)
    hf = _hf(kind)
    ours = ClipVisionTower(ClipVisionConfig.from_hf(hf.config), layers).eval()
    ours.load_weights(hf.state_dict().items())
    pixels = torch.randn(3, 3, 28, 28)
    with torch.no_grad():
        want = hf(pixels, output_hidden_states=True).hidden_states
        got = ours(pixels)
    for layer, g in zip(layers, got, strict=True):
        torch.testing.assert_close(g, want[layer], rtol=1e-4, atol=1e-4)


def test_prefixed_names_load_and_bad_names_fail():
    hf = _hf("clip")
    ours = ClipVisionTower(ClipVisionConfig.from_hf(hf.config), [-2])
    ours.load_weights((f"vision_model.{n}", t) for n, t in hf.state_dict().items())
    with pytest.raises(WeightMismatchError, match="unexpected.*bogus"):
        ours.load_weights([*hf.state_dict().items(), ("bogus.weight", torch.zeros(1))])
    with pytest.raises(WeightMismatchError, match="missing.*pre_layrnorm"):
        ours.load_weights((n, t) for n, t in hf.state_dict().items() if "pre_layrnorm" not in n)

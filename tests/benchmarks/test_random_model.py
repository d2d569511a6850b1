"""Random weights for quantized benchmark models (GPU-free): every quantized parameter gets values its kernel
reads as a sane weight, so the logits stay finite."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.random_model import random_weights
from tests.llm.paged import PagedCache
from tests.llm.test_models import PROMPT
from vlchat.llm.weights import load_model


def _config_dir(tmp_path, quantization_config=None):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256).to_dict()  # fmt: skip
    config.update(architectures=["LlamaForCausalLM"], dtype="float32")
    if quantization_config:
        config["quantization_config"] = quantization_config
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    "quantization_config, quantization",
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False}, None),
        (None, "fp8"),
    ],
    ids=["gptq-act-order", "fp8-at-load"],
)
def test_quantized_random_models_give_finite_logits(tmp_path, quantization_config, quantization):
    with random_weights():
        model = load_model(_config_dir(tmp_path, quantization_config), progress=False, quantization=quantization)
    down = model.model.layers[0].mlp.down_proj
    if quantization_config:
        assert int(down.zeros.max()) <= 15 and torch.equal(down.g_idx, torch.arange(256, dtype=torch.int32) // 32)
        assert len(down.qweight.unique()) > 1
    else:
        assert torch.all(down.weight_scale > 0) and down.weight.float().abs().max() <= 448
    logits = PagedCache(model).step(model, [(0, PROMPT)])
    assert torch.isfinite(logits).all() and logits.std() > 0

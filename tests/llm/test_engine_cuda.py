"""The engine on an sm_90 GPU: eager decode steps run the kernel plan their CUDA graphs were captured with.

The runner plans decode attention's (split count, kernel config) per batch bucket and context bucket (the step's
longest sequence, cuda_graphs.context_buckets) and hands both to every step; a bucket's graphs are captured per
distinct plan. An eager step's block table is only as wide as its longest sequence; planned from it, a one-wave
count would no longer be the one-CTA Gluon config's own and the step would run another config (the Gluon kernel at
two CTAs per SM, or the Triton kernel). Skipped without an sm_90 GPU (the CPU suite checks the hand-over in
tests/llm/test_layers.py and the bucketing in tests/llm/test_cuda_graphs.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.kernels.attention_helpers import needs_sm90
from tests.llm.tiny import make_tiny_llama
from vlchat.kernels.attention import decode_ws
from vlchat.kernels.attention.configs import WsDecodeConfig
from vlchat.llm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# A tenth of the free GPU memory for the KV cache, not the default 0.9: test workers share the GPU (pytest -n)
CACHE = {"cache_fraction": 0.1}
PROMPTS = [[5, 17, 33, 2, 90, 41], [7] * 40]


@pytest.fixture
def launched(monkeypatch) -> list:
    """(split count, config) of every Gluon decode launched from Python (graph replays launch none)."""
    calls, real = [], decode_ws.launch

    def recording_launch(*args):
        calls.append((args[7], args[11]))
        return real(*args)

    monkeypatch.setattr(decode_ws, "launch", recording_launch)
    return calls


@needs_sm90
def test_eager_and_graph_decode_run_the_same_gluon_plan(tmp_path, launched, caplog):
    # head_dim 128, 2 KV heads, an 8k context: one sequence is planned onto the Gluon kernel with 64 splits, the
    # two prompts decoding together (4 units) with 32
    model_dir = make_tiny_llama(tmp_path, head_dim=128, max_position_embeddings=8192)
    results = {}
    longest = len(PROMPTS[1]) + GREEDY.max_tokens  # 52 keys: the 512-key context bucket
    for eager in (True, False):
        with caplog.at_level(logging.INFO, logger="vlchat.llm.engine.cuda_graphs"):
            llm = LLM(str(model_dir), dtype="float16", device="cuda", enforce_eager=eager, **CACHE)
        runner = llm.engine.runner
        plans = [runner.decode_plan(batch) for batch in (1, 2)]  # at max_model_len
        assert all(isinstance(config, WsDecodeConfig) for _, config in plans), plans
        assert [count for count, _ in plans] == [64, 32]
        short = runner.decode_plan(2, longest)
        assert short == runner.decode_plan(2, 512) and short[0] < 32  # 32 splits of 512 keys: under a tile each
        assert (runner.graphs is None) == eager  # the graph run replays captured graphs
        if not eager:  # one graph per distinct plan over the context buckets, the shortest holding 512 keys
            assert len(runner.graphs.graphs[2]) > 1 and runner.graphs.graphs[2][0][0] >= 512
            count = sum(map(len, runner.graphs.graphs.values()))
            assert f"captured {count} decode CUDA graphs" in caplog.text  # start-up says what it spent
        launched.clear()
        results[eager] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        if eager:  # every decode layer call (graph replays launch nothing from Python)
            assert launched and set(launched) == {short}, launched  # the plan of the step's context bucket
        llm.close()
    assert results[True] == results[False]


@needs_sm90
def test_many_short_sequences_decode_on_packed_kv_heads_in_graphs_and_eagerly(tmp_path, launched):
    # 8 KV heads of 128 dims, an 8k context, 128 sequences of under 512 keys: their context bucket's plan packs 4
    # KV heads per CTA (one wave of 256 CTAs); at max_model_len the same batch is planned unpacked
    model_dir = make_tiny_llama(
        tmp_path, head_dim=128, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192
    )
    prompts = [[(7 * i + j) % 90 + 3 for j in range(5 + (37 * i) % 300)] for i in range(128)]
    results = {}
    for eager in (True, False):
        llm = LLM(str(model_dir), dtype="float16", device="cuda", enforce_eager=eager, **CACHE, max_num_seqs=128)
        runner = llm.engine.runner
        assert runner.decode_plan(128, 400)[1].pack_heads == 4
        assert runner.decode_plan(128)[1].pack_heads == 1
        launched.clear()
        results[eager] = [o.token_ids for o in llm.generate(prompts, GREEDY)]
        if eager:
            packs = {config.pack_heads for _, config in launched}
            assert 4 in packs, packs  # the steps with all 128 sequences decoding
        llm.close()
    assert results[True] == results[False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_steps_of_padded_buckets_match_eager_steps(tmp_path):
    # 7 sequences finishing one after another: decode steps of 7..1 rows replay the graphs of buckets 8, 4, 2 and 1
    # with padded rows, their inputs packed into the graphs' static buffers (async scheduling: each row's input
    # token comes from the previous step on the device); fp32, so eager and graph GEMMs agree on every token
    model_dir = make_tiny_llama(tmp_path)
    prompts = [[(11 * i + j) % 90 + 3 for j in range(3 + 9 * i)] for i in range(7)]
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True) for i in range(7)]
    results = {}
    for eager in (True, False):
        llm = LLM(str(model_dir), dtype="float32", device="cuda", enforce_eager=eager, **CACHE, max_num_seqs=8)
        assert (llm.engine.runner.graphs is None) == eager and llm.engine.async_scheduling
        results[eager] = [o.token_ids for o in llm.generate(prompts, params)]
        llm.close()
    assert [len(t) for t in results[False]] == [6 + 3 * i for i in range(7)]
    assert results[True] == results[False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_prefill_and_mixed_steps_replayed_in_pieces_match_eager_steps(tmp_path, kv_cache_dtype):
    # a 64-token budget: prompts of up to 150 tokens are prefilled in chunks beside the decodes of the others
    # (mixed steps), chunks reading a cached prefix; every such step of up to 64 tokens replays the pieces of its
    # token bucket (llm/engine/piecewise.py) with each layer's attention run eagerly between them; fp32, so the
    # tokens equal the eager engine's. int8: the cache's rotation runs inside the eager attention
    model_dir = make_tiny_llama(tmp_path)
    prompts = [[(7 * i + 3 * j) % 90 + 3 for j in range(5 + 29 * i)] for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=5 + 2 * i, ignore_eos=True) for i in range(6)]
    options = dict(dtype="float32", device="cuda", max_num_seqs=8, max_num_batched_tokens=64, prefill_delay_steps=0,
                   kv_cache_dtype=kv_cache_dtype, **CACHE)  # fmt: skip
    results, piece_steps = {}, []
    for eager in (True, False):
        llm = LLM(str(model_dir), enforce_eager=eager, piecewise_graph_tokens=64, **options)
        pieces = llm.engine.runner.pieces
        assert (pieces is None) == eager
        if not eager:
            assert pieces.buckets == [32, 64]
            pieces.run = lambda ids, pos, run=pieces.run: piece_steps.append(len(ids)) or run(ids, pos)
        results[eager] = [o.token_ids for o in llm.generate(prompts, params)]
        llm.close()
    assert len(piece_steps) >= 4 and any(n % 32 for n in piece_steps)  # padded buckets among them
    assert results[True] == results[False]

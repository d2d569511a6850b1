"""The engine on an sm_90 GPU: eager decode steps run the kernel plan their CUDA graphs were captured with.

The runner plans decode attention's (split count, kernel config) once per batch bucket at max_model_len
and hands both to every step. An eager step's block table is only as wide as its longest sequence; planned
from it, a one-wave count would no longer be the one-CTA Gluon config's own and the step would run another
config (the Gluon kernel at two CTAs per SM, or the Triton kernel). Skipped without an sm_90 GPU (the CPU suite
checks the hand-over in tests/llm/test_layers.py)."""

from __future__ import annotations

from kernels.attention import decode_ws
from kernels.attention.configs import WsDecodeConfig
from llm import LLM, SamplingParams
from tests.kernels.attention_helpers import needs_sm90
from tests.llm.tiny import make_tiny_llama

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 17, 33, 2, 90, 41], [7] * 40]


@needs_sm90
def test_eager_and_graph_decode_run_the_same_gluon_plan(tmp_path, monkeypatch):
    # head_dim 128, 2 KV heads, an 8k context: one sequence is planned onto the Gluon kernel with 64 splits, the
    # two prompts decoding together (4 units) with 32
    model_dir = make_tiny_llama(tmp_path, head_dim=128, max_position_embeddings=8192)
    launched = []
    real = decode_ws.launch

    def recording_launch(*args):
        launched.append((args[7], args[11]))  # the split count and the config
        return real(*args)

    monkeypatch.setattr(decode_ws, "launch", recording_launch)
    results = {}
    for eager in (True, False):
        llm = LLM(str(model_dir), dtype="float16", device="cuda", enforce_eager=eager)
        plans = [llm.engine.runner.decode_plan(batch) for batch in (1, 2)]
        assert all(isinstance(config, WsDecodeConfig) for _, config in plans), plans
        assert [count for count, _ in plans] == [64, 32]
        assert (llm.engine.runner.graphs is None) == eager  # the graph run replays captured graphs
        launched.clear()
        results[eager] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        if eager:  # every decode layer call (graph replays launch nothing from Python)
            assert launched and set(launched) == {plans[1]}, launched  # (32, the planned config)
        llm.close()
    assert results[True] == results[False]

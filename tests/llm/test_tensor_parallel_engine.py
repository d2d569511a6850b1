"""The engine with tensor_parallel_size > 1 (worker processes on gloo, fp32 CPU) against the same engine in one process.

Greedy tokens must be identical and the top-5 logprobs of every generated token within 1e-4 (and
seeded sampling draws the same tokens), through the whole engine: scheduler, step messages, worker
mirrors, async scheduling (each step launched before the last one's tokens are back), paged KV pools per rank,
a KV pool small enough that sequences are preempted and recomputed (their block tables
replaced), fp8 and int4 KV caches (each rank quantizing the KV heads it holds), and a VLM
whose replicated vision tower feeds the sharded decoder (tp=4 over a decoder with 2 KV heads: each KV head on two ranks; tp=2 with the workers started by two
torchrun "nodes" on loopback, as on two machines). Then the failure paths: head counts
that do not split are refused before any worker starts, and a killed worker makes the next
step raise WorkerDiedError instead of hanging.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys

import pytest

from tests.images import encode
from tests.llm.tiny import make_tiny_llama
from tests.vision.references import image
from tests.vision.tiny_vlm import make_tiny_llava
from vlchat.llm import LLM, AsyncEngine, SamplingParams
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.errors import TensorParallelError, WorkerDiedError

ATOL = 1e-4
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
TEXT_PROMPTS = ["Hello world", "The quick brown fox jumps", "Once upon a time there was", "0123456789 + - *"]
ENGINE = dict(device="cpu", num_blocks=12, block_size=4, max_num_seqs=4)  # small enough that a sequence is preempted
# the text engine launches each step before the previous one's tokens reach the host, as on GPUs: decode rows
# read their input token on each rank's device, and rank 0 answers a step once the next one is queued
ASYNC = dict(async_scheduling=True)
SEEDED = SamplingParams(temperature=0.8, seed=3, max_tokens=8, ignore_eos=True)


def _generate(model_dir, prompts, tp: int, params=PARAMS, **engine):
    llm = LLM(str(model_dir), tensor_parallel_size=tp, **{**ENGINE, **engine})
    try:
        return llm.generate(prompts, params)
    finally:
        llm.close()


def _assert_same(got, expected, atol: float = ATOL) -> None:
    for g, e in zip(got, expected, strict=True):
        assert list(g.token_ids) == list(e.token_ids)
        for step_g, step_e in zip(g.outputs[0].logprobs, e.outputs[0].logprobs, strict=True):
            assert step_g.keys() == step_e.keys()
            assert max(abs(step_g[t] - step_e[t]) for t in step_e) < atol


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tp-llama"))


@pytest.fixture(scope="module")
def text_llm(llama_dir):
    llm = LLM(str(llama_dir), tensor_parallel_size=2, **ENGINE, **ASYNC)
    yield llm
    llm.close()


# the sampler options of the OpenAI API run on every rank from the parameters each worker mirrors
SHAPED = SamplingParams(temperature=0.8, seed=5, max_tokens=8, min_tokens=6, presence_penalty=0.7,
                        frequency_penalty=0.4, repetition_penalty=1.3, logit_bias={7: 3.0, 11: -50.0},
                        stop_token_ids=[13], logprobs=3)  # fmt: skip


def test_penalties_bias_and_logprobs_at_tp2_match_one_process(llama_dir, text_llm):
    expected = _generate(llama_dir, TEXT_PROMPTS, tp=1, params=SHAPED, **ASYNC)
    _assert_same(text_llm.generate(TEXT_PROMPTS, SHAPED), expected)


def test_structured_output_at_tp2_is_refused_by_name(text_llm):
    from vlchat.llm import StructuredOutputParams
    from vlchat.llm.errors import InvalidRequestError

    params = SamplingParams(max_tokens=8, structured_output=StructuredOutputParams(regex="[a-z]+"))
    with pytest.raises(InvalidRequestError, match="tensor parallelism"):
        text_llm.generate(["Hello"], params)


def test_text_tp2_matches_one_process(llama_dir, text_llm, monkeypatch):
    expected = _generate(llama_dir, TEXT_PROMPTS, tp=1, **ASYNC)
    preempted = []
    recompute = Sequence.reset_for_recompute
    monkeypatch.setattr(Sequence, "reset_for_recompute", lambda seq: (preempted.append(seq), recompute(seq)))
    _assert_same(text_llm.generate(TEXT_PROMPTS, PARAMS), expected)
    assert preempted  # a sequence's block table was replaced and sent whole
    _assert_same(text_llm.generate(TEXT_PROMPTS[::-1], PARAMS), expected[::-1])  # the workers dropped the finished
    seeded = _generate(llama_dir, TEXT_PROMPTS, tp=1, params=SEEDED, **ASYNC)  # every rank draws the same tokens
    assert [o.token_ids for o in text_llm.generate(TEXT_PROMPTS, SEEDED)] == [o.token_ids for o in seeded]


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int4"])
def test_quantized_cache_tp2_matches_one_process(llama_dir, kv_cache_dtype):
    """Each rank quantizes the KV heads it holds (int4: per token and head, as int8): the same tokens as one
    process, preemption included. A rank's sliced k/v projection may round differently in the last bit from the
    whole one, and a value on a rounding boundary then lands on the neighbouring code (an int4 step is 1/15 of the
    row's range, an e4m3 step 1/8 of the value), which moves a logprob by a few 1e-3: logprobs are held to 2e-2."""
    expected = _generate(llama_dir, TEXT_PROMPTS, tp=1, kv_cache_dtype=kv_cache_dtype)
    got = _generate(llama_dir, TEXT_PROMPTS, tp=2, kv_cache_dtype=kv_cache_dtype)
    _assert_same(got, expected, atol=2e-2)


QUESTION = {"type": "text", "text": "What is this?"}
VLM_PROMPTS = [
    [{"role": "user", "content": [{"type": "image", "image": encode(image(1))}, QUESTION]}],
    [{"role": "user", "content": "Describe the picture, please."}],
    [{"role": "user", "content": [{"type": "image", "image": encode(image(2))}, QUESTION]}],
]


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("tp-llava"))


@pytest.fixture(scope="module")
def llava_expected(llava_dir):
    return _generate(llava_dir, VLM_PROMPTS, tp=1)


def test_vlm_tp4_matches_one_process(llava_dir, llava_expected):
    _assert_same(_generate(llava_dir, VLM_PROMPTS, tp=4), llava_expected)


@pytest.mark.timeout(300)  # torchrun's agents must not outlive a failure
def test_vlm_tp2_over_two_torchrun_nodes_on_loopback(llava_dir, llava_expected, tmp_path):
    """Two torchrun agents, one worker each, rendezvous on 127.0.0.1 as two machines would; the engine waits
    for them at --tp-listen. Closing the engine ends the workers, and torchrun with them."""
    authkey, port, rdzv = secrets.token_hex(16), _free_port(), _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv}", "--rdzv-id", "loopback",
           "--local-addr", "127.0.0.1", "-m", "vlchat.llm.engine.worker", "--connect", f"127.0.0.1:{port}"]  # fmt: skip
    env = {**os.environ, "VLCHAT_TP_AUTHKEY": authkey, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(cmd, env=env, cwd=tmp_path) for _ in range(2)]
    try:
        llm = LLM(str(llava_dir), tensor_parallel_size=2, tp_listen=f"127.0.0.1:{port}", tp_authkey=authkey, **ENGINE)
        try:
            _assert_same(llm.generate(VLM_PROMPTS, PARAMS), llava_expected)
        finally:
            llm.close()
        assert [node.wait(timeout=120) for node in nodes] == [0, 0]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_heads_that_do_not_split_are_refused_before_workers_start(llama_dir):
    with pytest.raises(TensorParallelError, match="num_attention_heads=4 is not divisible by tensor_parallel_size=3"):
        LLM(str(llama_dir), tensor_parallel_size=3, **ENGINE)


@pytest.mark.timeout(120)  # guards the property under test: a dead worker must not leave the engine waiting
def test_killed_worker_stops_the_engine(text_llm):
    """Runs last in this module: it stops the shared engine."""
    engine = AsyncEngine(text_llm.engine)

    async def generate(request_id: str) -> None:
        async for _ in engine.generate(request_id, TEXT_PROMPTS[0], PARAMS):
            pass

    try:
        os.kill(text_llm.engine.runner.procs[1].pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match="rank 1"):
            asyncio.run(generate("a"))
        assert engine.errored  # GET /health answers 503
        with pytest.raises(WorkerDiedError):  # every later request fails at once
            asyncio.run(generate("b"))
        with pytest.raises(WorkerDiedError):
            text_llm.generate(TEXT_PROMPTS[:1], PARAMS)
        assert not text_llm.engine.runner.procs  # the surviving worker was stopped too
    finally:
        engine.shutdown()

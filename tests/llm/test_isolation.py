"""One request whose step fails fails alone: the others in its batch finish exactly as in a run without it."""

from __future__ import annotations

import asyncio

import pytest

from tests.llm.tiny import make_tiny_llama
from vlchat.llm import LLM, AsyncEngine, EngineConfig, SamplingParams
from vlchat.llm.errors import RequestFailedError

NUM_BLOCKS = 128
PROMPTS = ["Hi", "The quick brown fox", "Hello world! How are you?", "café 😀", "Once upon a time"]


def stream_params(i: int) -> SamplingParams:
    """Greedy, seeded top-p/top-k sampling and a seeded n=2 request, so that retried rows must draw the same."""
    kinds = [
        dict(temperature=0),
        dict(temperature=1.0, top_p=0.9, seed=100 + i),
        dict(temperature=0.8, top_k=20, seed=200 + i),
        dict(temperature=1.0, seed=300 + i, n=2),
    ]
    return SamplingParams(max_tokens=16, ignore_eos=True, **kinds[i % len(kinds)])


def poison() -> SamplingParams:
    # validation refuses top_k >= 2**63; set afterwards it reaches the sampler, whose device integers overflow
    params = SamplingParams(temperature=1.0, top_p=0.5, max_tokens=16, ignore_eos=True)
    params.top_k = 2**63
    return params


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("isolation"))


@pytest.fixture(scope="module")
def engine(model_dir):
    config = EngineConfig.from_options(str(model_dir), dtype="float32", device="cpu", num_blocks=NUM_BLOCKS,
                                       block_size=4)  # fmt: skip
    engine = AsyncEngine.from_config(config)
    yield engine
    engine.shutdown()


async def run(engine, request_id, prompt, params):
    final = None
    async for out in engine.generate(request_id, prompt, params):
        final = out
    return [(c.index, c.token_ids, c.text) for c in sorted(final.outputs, key=lambda c: c.index)]


async def test_a_poison_request_among_20_streams_fails_alone(engine):
    streams = [(PROMPTS[i % len(PROMPTS)], stream_params(i)) for i in range(20)]
    clean = await asyncio.wait_for(
        asyncio.gather(*(run(engine, f"clean-{i}", p, sp) for i, (p, sp) in enumerate(streams))), 120
    )
    tasks = [run(engine, "poison", PROMPTS[0], poison())]
    tasks += [run(engine, f"mixed-{i}", p, sp) for i, (p, sp) in enumerate(streams)]
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120)
    assert isinstance(results[0], RequestFailedError), results[0]
    assert "OverflowError" in str(results[0]) or "Overflow" in str(results[0])
    assert results[1:] == clean
    assert engine.num_free_blocks() == NUM_BLOCKS and not engine.engine.requests


async def test_the_engine_serves_on_after_a_poison_request(engine):
    with pytest.raises(RequestFailedError, match="other requests are not affected"):
        await asyncio.wait_for(run(engine, "poison-alone", PROMPTS[1], poison()), 60)
    again = await asyncio.wait_for(run(engine, "after", PROMPTS[1], stream_params(0)), 60)
    assert len(again[0][1]) == 16
    assert engine.num_free_blocks() == NUM_BLOCKS


def test_offline_generate_names_the_failed_request(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_blocks=NUM_BLOCKS, block_size=4)
    with pytest.raises(RequestFailedError, match="llm-1"):
        llm.generate(PROMPTS[:3], [stream_params(0), poison(), stream_params(1)])
    assert llm.engine.num_free_blocks() == NUM_BLOCKS and not llm.engine.requests

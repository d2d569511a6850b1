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


REGEX = "[a-z]{1,6}( [a-z]{1,6}){0,3}"


def test_grammar_rows_under_async_scheduling_survive_a_poison_request(model_dir, monkeypatch):
    """With async scheduling a batch with grammar rows samples only after the token in flight reached their matchers;
    when that sampling fails the step reruns in parts, and the grammar rows still draw what they drew without it.
    The engine is stepped here (not the AsyncEngine's thread) so the step the poison joins is chosen, not raced."""
    import re

    from vlchat.llm import StructuredOutputParams
    from vlchat.llm.engine import engine as engine_module

    rerun_with_grammars = []
    isolated = engine_module.launch_isolated

    def spy(runner, seqs, error):
        rerun_with_grammars.append(any(s.grammar is not None for s in seqs))
        return isolated(runner, seqs, error)

    monkeypatch.setattr(engine_module, "launch_isolated", spy)
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_blocks=NUM_BLOCKS, block_size=4, async_scheduling=True)
    engine = llm.engine
    constrained = SamplingParams(temperature=1.0, seed=7, max_tokens=24,
                                 structured_output=StructuredOutputParams(regex=REGEX))  # fmt: skip
    streams = [(PROMPTS[i % len(PROMPTS)], constrained if i % 2 else stream_params(i)) for i in range(6)]

    def finish(poison_step: int | None) -> tuple[list, list]:
        for i, (prompt, params) in enumerate(streams):
            engine.add_request(f"s{poison_step}-{i}", prompt, params, stream=False)
        final, failures, steps = {}, [], 0
        while engine.has_unfinished():
            if steps == poison_step:  # joins the others' decoding: its step's sampling is the deferred one
                engine.add_request(f"poison-{poison_step}", PROMPTS[0], poison(), stream=False)
            final.update({out.request_id: out for out in engine.step() if out.finished})
            failures += engine.take_failures()
            steps += 1
        outputs = [final[f"s{poison_step}-{i}"].outputs for i in range(len(streams))]
        return [[(c.index, c.token_ids, c.text) for c in sorted(o, key=lambda c: c.index)] for o in outputs], failures

    try:
        clean, failures = finish(None)
        assert not failures
        for i, result in enumerate(clean):
            if i % 2:
                assert re.fullmatch(REGEX, result[0][2]) or len(result[0][1]) == 24, result
        exercised = {}
        for poison_step in range(1, 5):
            rerun_with_grammars.clear()
            results, failures = finish(poison_step)
            exercised[poison_step] = any(rerun_with_grammars)
            assert [f.request_id for f in failures] == [f"poison-{poison_step}"], failures
            assert results == clean, poison_step
            assert engine.num_free_blocks() == NUM_BLOCKS and not engine.requests
        assert all(exercised.values()), exercised  # each poison failed in a step whose grammar rows were rerun
    finally:
        llm.close()

"""AsyncEngine: streamed deltas add up to the offline result; concurrency; abort and disconnect free blocks."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.llm.tiny import make_tiny_llama
from vlchat.llm import LLM, AsyncEngine, EngineConfig, SamplingParams
from vlchat.llm.detokenizer import IncrementalDetokenizer
from vlchat.llm.engine.async_engine import deliver, merge_outputs
from vlchat.llm.errors import InvalidRequestError, PromptTooLongError
from vlchat.llm.outputs import CompletionOutput, RequestOutput

NUM_BLOCKS = 64
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = ["Hi", "The quick brown fox", "Hello world! How are you?", "café 😀"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("async"))


@pytest.fixture(scope="module")
def engine(model_dir):
    config = EngineConfig.from_options(
        str(model_dir), dtype="float32", device="cpu", num_blocks=NUM_BLOCKS, block_size=4
    )
    engine = AsyncEngine.from_config(config)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def offline(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_blocks=NUM_BLOCKS, block_size=4)
    return llm.generate(PROMPTS, GREEDY)


async def collect(engine, request_id, prompt, params=GREEDY):
    outs = [out async for out in engine.generate(request_id, prompt, params)]
    return outs


async def test_concurrent_streams_equal_offline_generation(engine, offline):
    results = await asyncio.gather(*(collect(engine, f"c{i}", p) for i, p in enumerate(PROMPTS)))
    for outs, ref in zip(results, offline, strict=True):
        final = outs[-1]
        assert final.finished and final.token_ids == ref.token_ids and final.text == ref.text
        assert not any(o.finished for o in outs[:-1])
        assert "".join(o.outputs[0].delta_text for o in outs) == ref.text
        assert sum((o.outputs[0].delta_token_ids for o in outs), []) == ref.token_ids
    assert engine.num_free_blocks() == NUM_BLOCKS


async def test_an_unstreamed_request_yields_its_final_output_only(engine, offline):
    outs = [out async for out in engine.generate("whole", PROMPTS[3], GREEDY, stream=False)]
    assert len(outs) == 1 and outs[0].finished
    assert (outs[0].token_ids, outs[0].text) == (offline[3].token_ids, offline[3].text)
    assert engine.num_free_blocks() == NUM_BLOCKS


async def test_abort_ends_the_stream_and_frees_blocks_at_once(engine):
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    stream = engine.generate("long", "The quick brown fox", long)
    first = await stream.__anext__()
    assert not first.finished and engine.num_free_blocks() < NUM_BLOCKS
    await engine.abort("long")
    assert engine.num_free_blocks() == NUM_BLOCKS
    rest = [out async for out in stream]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert len(rest[-1].token_ids) < 200


async def test_leaving_the_stream_early_aborts_the_request(engine):
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    stream = engine.generate("gone", "Hello world!", long)
    async for _ in stream:
        break
    await stream.aclose()  # what a server does when the client disconnects
    assert engine.num_free_blocks() == NUM_BLOCKS and not engine.engine.has_unfinished()
    again = await collect(engine, "gone", "Hi")  # the id is free again
    assert again[-1].finished


async def test_errors_reach_the_caller_and_leave_the_engine_serving(engine):
    with pytest.raises(PromptTooLongError):
        await collect(engine, "too-long", [5] * 600, SamplingParams(max_tokens=8))
    with pytest.raises(InvalidRequestError, match="empty"):
        await collect(engine, "empty", "")
    outs = await collect(engine, "after", "Hi")
    assert outs[-1].finished and engine.max_model_len == 512 and engine.model_name == "tiny-llama"


async def test_the_event_loop_stays_responsive_while_generating(engine):
    ticks = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await collect(engine, "busy", "The quick brown fox", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    done.set()
    await task
    assert ticks > 24  # the loop ran other work between (and during) engine steps


def test_a_step_wakes_each_event_loop_once_and_skips_closed_loops_and_unknown_ids():
    loops = [asyncio.new_event_loop() for _ in range(2)]
    wakeups = []
    for loop in loops:
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, real=real, loop=loop: (wakeups.append(loop), real(*a))[1]
    queues = {f"r{i}": asyncio.Queue() for i in range(5)}
    streams = {rid: (loops[i % 2], q) for i, (rid, q) in enumerate(queues.items())}
    items = [(rid, f"{rid}-out{j}") for j in range(2) for rid in queues] + [("gone", "dropped")]
    deliver(streams, items)
    assert sorted(map(id, wakeups)) == sorted(map(id, loops))  # one wake-up per loop for 10 outputs
    for loop in loops:
        loop.run_until_complete(asyncio.sleep(0))
    assert {rid: [q.get_nowait() for _ in range(q.qsize())] for rid, q in queues.items()} == {
        rid: [f"{rid}-out0", f"{rid}-out1"] for rid in queues
    }
    loops[0].close()
    deliver(streams, items)  # the open loop still gets its outputs; the closed one's are dropped, not raised
    loops[1].run_until_complete(asyncio.sleep(0))
    assert [queues[rid].qsize() for rid in queues] == [0, 2, 0, 2, 0]
    loops[1].close()


async def test_a_reader_that_falls_behind_gets_the_queued_outputs_merged(engine, offline):
    # the event loop blocked while the engine thread runs several steps: the next read catches up in one output
    # whose deltas join those of the steps it missed; the deltas still add up to the offline result
    stream = engine.generate("behind", PROMPTS[1], GREEDY)
    outs = [await stream.__anext__()]
    seq = engine.engine.requests["behind"].seqs[0]
    start, seen = time.monotonic(), seq.num_output_tokens
    while seq.num_output_tokens < seen + 4 and time.monotonic() - start < 30:
        time.sleep(0.01)  # blocks the loop (the engine thread keeps stepping and queueing)
    outs += [out async for out in stream]
    assert max(len(o.outputs[0].delta_token_ids) for o in outs) > 1 and len(outs) < len(offline[1].token_ids)
    assert sum((o.outputs[0].delta_token_ids for o in outs), []) == offline[1].token_ids
    assert "".join(o.outputs[0].delta_text for o in outs) == offline[1].text and outs[-1].finished


def test_merged_outputs_join_the_deltas_of_each_completion():
    def output(deltas, finished=False):
        completions = [CompletionOutput(i, delta_text=text, delta_token_ids=ids) for i, (text, ids) in deltas]
        return RequestOutput("r", [1], completions, finished)

    merged = merge_outputs(output([(0, ("ab", [1])), (1, ("x", [7]))]), output([(1, ("y", [8])), (0, ("c", [2]))]))
    assert [(c.index, c.delta_text, c.delta_token_ids) for c in merged.outputs] == [
        (1, "xy", [7, 8]),
        (0, "abc", [1, 2]),
    ]


async def test_a_step_that_fails_ends_its_requests_with_an_error_and_the_engine_serves_on(engine, offline, monkeypatch):
    # the step fails while detokenizing; the abort that ends its requests detokenizes too, and must not fail again
    # (that killed the engine thread: every request then hung)
    def broken(self, token_id, check_stop=True):
        raise ValueError("a token this tokenizer cannot decode")

    monkeypatch.setattr(IncrementalDetokenizer, "add_token", broken)
    with pytest.raises(RuntimeError, match="failed while generating"):
        await asyncio.wait_for(collect(engine, "broken", PROMPTS[0]), 60)
    monkeypatch.undo()
    outs = await asyncio.wait_for(collect(engine, "after", PROMPTS[0]), 60)
    assert outs[-1].token_ids == offline[0].token_ids and outs[-1].text == offline[0].text
    assert engine.num_free_blocks() == NUM_BLOCKS

"""Memory pressure: a KV pool far smaller than the load needs. Requests are preempted and resumed,
and the greedy answers streamed through the server equal those of an unconstrained engine.

32 concurrent streams of ~13 prompt + 40 new tokens need ~130 blocks of 16 tokens at once; the
pool has 10 (each request alone fits). Preemption frees a sequence's blocks and recomputes it
later; what its client already received must not be sent again, and nothing may change.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.app.live import start_engine, start_server
from tests.reliability.checks import wait_idle
from tests.reliability.conftest import AUTH
from vlchat.app.model_choice import ModelChoice

POOL_BLOCKS = 10
NEW_TOKENS = 40
PROMPTS = [f"Request {i}: tell me about block {i * 7 % 13}." for i in range(32)]


@pytest.fixture(scope="module")
def small_pool(text_model_dir):
    engine = start_engine(text_model_dir, dtype="float32", device="cpu", max_model_len=128, num_blocks=POOL_BLOCKS,
                          block_size=16, max_num_seqs=32)  # fmt: skip
    server = start_server(engine, ModelChoice(str(text_model_dir), "tiny-llama"), with_ui=False)
    yield engine, server
    server.stop()
    engine.shutdown()


async def stream_all(url: str, prompts: list[str], abort_after: dict | None = None, headers=None) -> list[tuple]:
    """Stream every prompt at once; returns (concatenated deltas, last chunk with usage) per prompt."""
    abort_after = abort_after or {}

    async def one(client, i, prompt):
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": NEW_TOKENS, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        text, last, events = "", {}, 0
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                last, events = json.loads(line[6:]), events + 1
                assert "error" not in last, last
                text += "".join(c["delta"].get("content") or "" for c in last["choices"])
                if events == abort_after.get(i):
                    break
        return text, last

    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(one(client, i, p) for i, p in enumerate(prompts)))


def test_preempted_greedy_streams_equal_an_unconstrained_run(small_pool, text_server, text_engine):
    engine, server = small_pool
    needed = sum(-(-(len(engine.tokenizer.encode(p)) + 10 + NEW_TOKENS) // 16) for p in PROMPTS)
    assert needed > 10 * POOL_BLOCKS  # the load needs an order of magnitude more KV than the pool has
    before = engine.engine.scheduler.num_preemptions

    constrained = asyncio.run(stream_all(server.url, PROMPTS))
    preemptions = engine.engine.scheduler.num_preemptions - before
    assert preemptions > 0, "the small pool never preempted"
    unconstrained_before = text_engine.engine.scheduler.num_preemptions
    reference = asyncio.run(stream_all(text_server.url, PROMPTS, headers=AUTH))  # a pool of 512 blocks
    assert text_engine.engine.scheduler.num_preemptions == unconstrained_before
    for (text, last), (ref_text, ref_last) in zip(constrained, reference, strict=True):
        assert last["usage"]["completion_tokens"] == ref_last["usage"]["completion_tokens"] == NEW_TOKENS
        assert text == ref_text  # same tokens, and no delta sent twice
    wait_idle(engine)
    print(f"\nmemory pressure: {len(PROMPTS)} streams, {needed} blocks needed, {POOL_BLOCKS} in the pool, "
          f"{preemptions} preemptions")  # fmt: skip


def test_aborts_while_preempted_or_waiting_free_every_block(small_pool):
    engine, server = small_pool
    abort_after = {i: 1 + i % 3 for i in range(0, len(PROMPTS), 3)}  # a third of the clients leave early
    results = asyncio.run(stream_all(server.url, PROMPTS, abort_after))
    for i, (_, last) in enumerate(results):
        if i not in abort_after:
            assert last["usage"]["completion_tokens"] == NEW_TOKENS
    wait_idle(engine)
    assert engine.num_free_blocks() == POOL_BLOCKS

"""A bounded disconnect soak on the demo model: 20 concurrent /v1/chat/completions streams, a random fifth of
whose clients hang up mid-stream.

The clients that hang up ask for many tokens (they would run for many seconds if not aborted), the others
for a few. Afterwards: every remaining stream finished normally with the text a one-at-a-time greedy run
gives, exactly the hung-up streams were aborted, and the engine runs and queues nothing with as many KV
blocks free as before.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from tests.app.live import AbortRecorder, demo_choice, start_server, wait_engine_idle
from tests.reliability.test_soak import body

STREAMS = 20
HANG_UPS = STREAMS // 5
MAX_TOKENS = 12
LONG = 600  # what a client that hangs up asks for
PROMPTS = ["Hello! Who are you?", "What can you do?", "Tell me a story.", "How many shapes are there?"]


async def stream(client: httpx.AsyncClient, url: str, payload: dict, hang_up_after: int | None) -> dict:
    """One streamed request; with hang_up_after, the connection is closed after that many content events."""
    result = {"status": None, "ids": set(), "text": "", "finish": None, "usage": None, "done": False}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=payload) as response:
        result["status"] = response.status_code
        contents = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                result["done"] = True
                break
            event = json.loads(data)
            result["ids"].add(event["id"])
            result["usage"] = event.get("usage") or result["usage"]
            for choice in event["choices"]:
                delta = choice["delta"].get("content") or ""
                result["text"] += delta
                result["finish"] = choice["finish_reason"] or result["finish"]
                contents += bool(delta)
            if hang_up_after is not None and contents >= hang_up_after:
                break  # leaving the block closes the connection mid-stream
    return result


@pytest.fixture
def soak_server(demo_engine):
    recorded = AbortRecorder(demo_engine)
    server = start_server(recorded, demo_choice())
    yield server, recorded
    server.stop()


async def test_a_fifth_of_20_streams_hang_up_and_the_rest_finish_untouched(soak_server, demo_engine):
    server, recorded = soak_server
    rng = random.Random(45)
    async with httpx.AsyncClient(timeout=120) as client:
        reference = {}
        for prompt in PROMPTS:  # one at a time: the greedy text each prompt must give
            alone = await stream(client, server.url, body(prompt, MAX_TOKENS), None)
            assert alone["finish"] == "length" and alone["done"], alone
            reference[prompt] = alone["text"]
        await asyncio.to_thread(wait_engine_idle, demo_engine)
        idle_free = demo_engine.num_free_blocks()

        hang_ups = dict.fromkeys(rng.sample(range(STREAMS), HANG_UPS))
        for i in hang_ups:
            hang_ups[i] = rng.randint(1, 3)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(STREAMS)]
        results = await asyncio.gather(*(
            stream(client, server.url, body(prompts[i], LONG if i in hang_ups else MAX_TOKENS), hang_ups.get(i))
            for i in range(STREAMS)
        ))  # fmt: skip

    assert [r["status"] for r in results] == [200] * STREAMS
    assert all(len(r["ids"]) == 1 for r in results)
    for i, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        if i in hang_ups:
            assert not result["done"] and result["text"] and result["finish"] is None, (i, result)
            assert reference[prompt].startswith(result["text"]) or result["text"].startswith(reference[prompt])
        else:
            assert result["done"] and result["finish"] == "length", (i, result)
            assert result["usage"]["completion_tokens"] == MAX_TOKENS, (i, result)
            assert result["text"] == reference[prompt], (i, result["text"], reference[prompt])

    await asyncio.to_thread(wait_engine_idle, demo_engine, idle_free)
    hung_up_ids = {next(iter(results[i]["ids"])) for i in hang_ups}
    assert set(recorded.aborted) == hung_up_ids  # the hung-up streams were aborted, and only they

"""Soak: 1,000 streamed requests at concurrency 128 against a live server (tiny model, CPU), some aborted at random.

None lost (every request gets an answer or was aborted by its own client), none duplicated
(1,000 distinct ids, every finished stream's text equal to the greedy reference of its prompt,
no delta twice), no 5xx and no in-band error, and afterwards every KV block free, the engine
empty and the process RSS back near its level after a warm-up round.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time

import httpx
import numpy as np
import psutil
from PIL import Image

from tests.images import data_url, encode
from tests.reliability.checks import assert_healthy, http, wait_idle
from tests.reliability.conftest import AUTH

NUM_REQUESTS = 1000
CONCURRENCY = 128
MAX_TOKENS = 8
ABORT_FRACTION = 0.1
WARMUP = 128
RSS_SLACK_MB = 64  # allocator noise; a leak of 64 KB per request would already exceed it
PROMPTS = [
    "Hello! How are you today?",
    "The quick brown fox",
    "Describe the picture, please.",
    "Once upon a time",
    "0123456789",
    "café 😀 naïve",
    "Paged attention stores keys and values.",
    "Why is the sky blue?",
]


def body(prompt: str, max_tokens: int = MAX_TOKENS) -> dict:
    """A greedy streamed chat request that runs to max_tokens, usage in its last event."""
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def one(client: httpx.AsyncClient, url: str, key: str, payload: dict, abort_after: int | None) -> dict:
    """Stream one request; with abort_after, close the connection after that many events (role chunk first)."""
    result = {"prompt": key, "ids": set(), "text": "", "finish": None, "usage": None, "done": False, "errors": []}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=payload, headers=AUTH) as response:
        result["status"] = response.status_code
        if response.status_code != 200:
            result["errors"].append((await response.aread()).decode(errors="replace"))
            return result
        events = 0
        async for line in response.aiter_lines():
            if not line:
                continue
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                result["done"] = True
                break
            event = json.loads(payload)
            if "error" in event:
                result["errors"].append(event["error"])
                continue
            events += 1
            result["ids"].add(event["id"])
            result["usage"] = event.get("usage") or result["usage"]
            for choice in event["choices"]:
                result["text"] += choice["delta"].get("content") or ""
                result["finish"] = choice["finish_reason"] or result["finish"]
            if abort_after is not None and events >= abort_after:
                result["aborted"] = True
                break
    return result


async def run_load(url: str, plan: list[tuple], engine, concurrency: int = CONCURRENCY) -> tuple[list[dict], int]:
    """Run (key, body, abort_after) requests, `concurrency` at a time; returns the results and the peak load."""
    limit = asyncio.Semaphore(concurrency)
    peak = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)

    async def bounded(client, key, payload, abort_after):
        nonlocal peak
        async with limit:
            peak = max(peak, len(engine.engine.requests))
            return await one(client, url, key, payload, abort_after)

    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        results = await asyncio.gather(*(bounded(client, *item) for item in plan), return_exceptions=True)
    return results, peak


def rss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def test_soak_1000_streams_at_concurrency_128(text_server, text_engine, record_property):
    wait_idle(text_engine)
    baseline_blocks = text_engine.num_free_blocks()
    reference = {}
    for prompt in PROMPTS:
        answer = http.post(
            f"{text_server.url}/v1/chat/completions", json={**body(prompt), "stream": False}, headers=AUTH
        )
        reference[prompt] = answer.json()["choices"][0]["message"]["content"]
    rng = random.Random(0)
    warmup = [(p, body(p), None) for p in (rng.choice(PROMPTS) for _ in range(WARMUP))]
    asyncio.run(run_load(text_server.url, warmup, text_engine))
    wait_idle(text_engine)
    rss_before = rss_mb()

    plan = [(p, body(p), rng.randint(1, 2) if rng.random() < ABORT_FRACTION else None)
            for p in (rng.choice(PROMPTS) for _ in range(NUM_REQUESTS))]  # fmt: skip
    start = time.monotonic()
    results, peak = asyncio.run(run_load(text_server.url, plan, text_engine))
    seconds = time.monotonic() - start

    crashed = [r for r in results if isinstance(r, BaseException)]
    assert not crashed, crashed[:3]
    assert len(results) == NUM_REQUESTS  # none lost: every request came back
    assert all(r["status"] == 200 for r in results), {r["status"] for r in results}  # no 4xx/5xx
    assert not [r["errors"] for r in results if r["errors"]]  # no in-band error
    ids = [r["ids"] for r in results]
    assert all(len(i) == 1 for i in ids) and len(set().union(*ids)) == NUM_REQUESTS  # one id per stream, all distinct
    aborted = [r for r in results if r.get("aborted")]
    finished = [r for r in results if not r.get("aborted")]
    assert len(aborted) == sum(a is not None for _, _, a in plan)
    for r in finished:
        assert r["done"] and r["finish"] == "length" and r["usage"]["completion_tokens"] == MAX_TOKENS, r
        assert r["text"] == reference[r["prompt"]], r  # no lost, repeated or foreign delta
    for r in aborted:
        assert reference[r["prompt"]].startswith(r["text"]), r

    wait_idle(text_engine)
    assert text_engine.num_free_blocks() == baseline_blocks
    assert not text_engine._streams, "per-request streams left in the async engine"
    rss_after = rss_mb()
    figures = {
        "requests": NUM_REQUESTS, "aborted": len(aborted), "seconds": round(seconds, 1),
        "requests_per_s": round(NUM_REQUESTS / seconds, 1), "peak_running": peak,
        "rss_before_mb": round(rss_before), "rss_after_mb": round(rss_after),
    }  # fmt: skip
    record_property("soak", figures)
    print(f"\nsoak: {figures}")
    assert peak >= CONCURRENCY // 2, f"the load never reached concurrency (peak {peak} requests in the engine)"
    assert rss_after - rss_before < RSS_SLACK_MB, figures
    assert_healthy(text_server, text_engine)


def test_soak_with_distinct_images(vlm_server, vlm_engine):
    """200 streams, each with its own image, 32 at a time, some hung up: nothing lost, nothing kept."""
    wait_idle(vlm_engine)
    rng = random.Random(1)

    def image_body(seed: int) -> dict:
        pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
        content = [{"type": "image_url", "image_url": {"url": data_url(encode(Image.fromarray(pixels)))}},
                   {"type": "text", "text": "What is in the picture?"}]  # fmt: skip
        return {**body(""), "messages": [{"role": "user", "content": content}], "max_tokens": 4}

    warmup = [(f"w{i}", image_body(10_000 + i), None) for i in range(100)]  # allocator pools settle first
    asyncio.run(run_load(vlm_server.url, warmup, vlm_engine, concurrency=32))
    wait_idle(vlm_engine)
    rss_before = rss_mb()
    plan = [(f"i{i}", image_body(i), 1 if rng.random() < ABORT_FRACTION else None) for i in range(200)]
    results, peak = asyncio.run(run_load(vlm_server.url, plan, vlm_engine, concurrency=32))
    assert not [r for r in results if isinstance(r, BaseException)]
    assert all(r["status"] == 200 and not r["errors"] for r in results), [r for r in results if r["errors"]][:2]
    assert len(set().union(*(r["ids"] for r in results))) == len(plan)
    for r in results:
        if not r.get("aborted"):
            assert r["done"] and r["finish"] == "length" and r["usage"]["completion_tokens"] == 4, r
    wait_idle(vlm_engine)
    cached = len(vlm_engine.engine.runner._mm_cache)
    rss_after = rss_mb()
    print(f"\nimage soak: 200 requests, peak {peak} in the engine, {cached} image embeddings cached, "
          f"RSS {rss_before:.0f} -> {rss_after:.0f} MB")  # fmt: skip
    assert peak >= 16 and cached <= 32
    assert rss_after - rss_before < 1.5 * RSS_SLACK_MB  # pixel buffers settle slower; 0.5 MB a request would show

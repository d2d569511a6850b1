"""The OpenAI-compatible API over a live server and a real engine (tiny random text model)."""

import asyncio
import json
import time

import httpx
import pytest
from openai import OpenAI
from PIL import Image

from tests.app.conftest import LONG_CONTEXT
from tests.images import data_url
from vlchat.app.client import AsyncClient, Client, ClientError
from vlchat.app.model_choice import EXAMPLES

HELLO = [{"role": "user", "content": "Hello! How are you today?"}]


def test_health_and_models(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny-llava" and health["untrained"] is True
    models = httpx.get(f"{server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-llava"] and models["data"][0]["max_model_len"] == LONG_CONTEXT
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert client.models.retrieve("tiny-llava").id == "tiny-llava"
    assert httpx.get(f"{server.url}/v1/models/gpt-4").json()["error"]["code"] == "model_not_found"


def test_openai_package_stream_matches_non_stream(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    full = client.chat.completions.create(model="tiny-llava", messages=HELLO, max_tokens=12, temperature=0)
    choice = full.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert full.usage.completion_tokens == 12 or choice.finish_reason == "stop"
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model="tiny-llava", messages=HELLO, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_continuous_usage_stats_count_the_tokens_of_every_chunk(server):
    # the vLLM extension the serving benchmark reads: a chunk may carry several tokens when the server catches up
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="tiny-llava", messages=HELLO, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    counts = [c.usage.completion_tokens for c in chunks if c.choices and c.choices[0].delta.content]
    assert counts and counts == sorted(counts) and 0 < counts[0] and counts[-1] <= 12
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in chunks if c.choices and c.usage)
    assert chunks[-1].usage.completion_tokens == 12
    chunks = list(
        client.chat.completions.create(
            model="tiny-llava", messages=HELLO, max_tokens=12, temperature=0.9, seed=3, stream=True, n=2,
            stream_options={"continuous_usage_stats": True}, extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    per_choice = {i: [c.usage.completion_tokens for c in chunks if c.choices and c.choices[0].index == i and c.usage]
                  for i in (0, 1)}  # fmt: skip
    assert all(counts == sorted(counts) and counts[-1] == 12 for counts in per_choice.values()), per_choice


def test_openai_package_with_an_image(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    image_url = data_url((EXAMPLES / "one-shape.png").read_bytes())
    content = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": "What is this?"}]
    messages = [{"role": "user", "content": content}]
    full = client.chat.completions.create(model="tiny-llava", messages=messages, max_tokens=8, temperature=0)
    question = [{"role": "user", "content": "What is this?"}]
    text_only = client.chat.completions.create(model="tiny-llava", messages=question, max_tokens=8, temperature=0)
    assert full.usage.prompt_tokens > text_only.usage.prompt_tokens  # the image's placeholder tokens
    assert full.choices[0].message.content
    stream = client.chat.completions.create(model="tiny-llava", messages=messages, max_tokens=8, temperature=0,
                                            stream=True)  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == full.choices[0].message.content


def test_stop_strings_n_and_seed(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    extra = {"ignore_eos": True}
    text = (
        client.chat.completions.create(
            model="tiny-llava", messages=HELLO, max_tokens=24, temperature=0, extra_body=extra
        )
        .choices[0]
        .message.content
    )
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = client.chat.completions.create(
        model="tiny-llava", messages=HELLO, max_tokens=24, temperature=0, stop=[stop], extra_body=extra
    ).choices[0]
    assert cut.finish_reason == "stop" and text.startswith(cut.message.content) and stop not in cut.message.content
    sampled = dict(messages=HELLO, max_completion_tokens=16, temperature=1.0, top_p=0.9, seed=7, n=2,
                   extra_body={"top_k": 50, "min_p": 0.01, "repetition_penalty": 1.1, **extra})  # fmt: skip
    first = client.chat.completions.create(model="tiny-llava", **sampled)
    again = client.chat.completions.create(model="tiny-llava", **sampled)
    assert [c.index for c in first.choices] == [0, 1] and first.usage.completion_tokens == 32
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]


def test_app_client_sync_and_async(server):
    with Client(server.url) as client:
        assert client.models() == ["tiny-llava"]
        answer = client.chat("Hello! How are you today?", max_tokens=10, temperature=0)
        assert "".join(client.chat("Hello! How are you today?", stream=True, max_tokens=10, temperature=0)) == answer

    async def run():
        async with AsyncClient(server.url) as client:
            text = await client.chat("Hello! How are you today?", max_tokens=10, temperature=0)
            pieces = [d async for d in await client.chat("Hello! How are you today?", stream=True, max_tokens=10,
                                                          temperature=0)]  # fmt: skip
            return text, "".join(pieces)

    assert asyncio.run(run()) == (answer, answer)


def test_app_client_images_of_every_kind(server):
    path = EXAMPLES / "two-shapes.png"
    with Client(server.url) as client:
        for image in (path, str(path), Image.open(path), path.read_bytes()):
            assert client.chat("What is this?", images=[image], max_tokens=3)
        with pytest.raises(ClientError, match="403.*allow-remote-images"):
            client.chat("What is this?", images=["http://127.0.0.1:9/x.png"])


def test_client_disconnect_aborts_the_request(server, tiny_engine):
    baseline = tiny_engine.num_free_blocks()
    body = {"messages": HELLO, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data:")
        assert tiny_engine.num_free_blocks() < baseline  # the request holds KV blocks while it runs
    deadline = time.monotonic() + 10
    while tiny_engine.num_free_blocks() != baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tiny_engine.num_free_blocks() == baseline


def test_non_streaming_request_is_aborted_when_the_client_leaves(server, tiny_engine):
    baseline = tiny_engine.num_free_blocks()
    body = {"messages": HELLO, "max_tokens": LONG_CONTEXT - 100, "ignore_eos": True}  # many seconds of work
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
    assert tiny_engine.num_free_blocks() < baseline  # still generating when the client gave up
    deadline = time.monotonic() + 3  # far less than the whole answer takes
    while tiny_engine.num_free_blocks() != baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tiny_engine.num_free_blocks() == baseline


def test_sse_framing(server):
    body = {"messages": HELLO, "max_tokens": 4, "stream": True}
    raw = httpx.post(f"{server.url}/v1/chat/completions", json=body).text
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"


@pytest.mark.parametrize("prompt_words", [LONG_CONTEXT + 10], ids=["prompt-over-context"])
def test_prompt_longer_than_the_context_is_a_400(server, prompt_words):
    body = {"messages": [{"role": "user", "content": "hello " * prompt_words}], "max_tokens": 8}
    for stream in (False, True):
        response = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": stream})
        assert response.status_code == 400, response.text
        assert "context" in response.json()["error"]["message"]

"""A client that disconnects mid-stream, and Stop in the UI, abort the request within one engine step.

The engine generates in its own thread while the server (or the UI handler) streams; when the
consumer goes away, the abort must reach the engine before the step after the one in flight, and
every KV block must be free again (`num_free_blocks()` back to its baseline).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx

from tests.reliability.checks import assert_healthy, wait_idle
from tests.reliability.conftest import AUTH
from vlchat.app.settings import ServerConfig
from vlchat.app.ui import make_respond

LONG = {"max_tokens": 200, "ignore_eos": True, "temperature": 0}
# Tokens a request may still gain after its consumer left: the step in flight when the abort was queued,
# plus one more where the OS schedules the engine thread before the server's event loop.
MAX_TOKENS_AFTER_LEAVING = 2


def _gone(engine, request_id: str, timeout_s: float = 10.0) -> float:
    """Seconds until the engine dropped `request_id`."""
    start = time.monotonic()
    while request_id in engine.engine.requests and time.monotonic() - start < timeout_s:
        time.sleep(0.0005)
    assert request_id not in engine.engine.requests, f"{request_id} still runs {timeout_s} s after its client left"
    return time.monotonic() - start


def test_client_disconnect_mid_stream_aborts_within_a_step(text_server, text_engine):
    wait_idle(text_engine)
    baseline = text_engine.num_free_blocks()
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}], "stream": True, **LONG}
    for chunks_read in (1, 3, 8):
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", f"{text_server.url}/v1/chat/completions", json=body, headers=AUTH) as response:
                lines = response.iter_lines()
                request_id = json.loads(next(lines).removeprefix("data: "))["id"]
                request = text_engine.engine.requests[request_id]
                for _ in range(chunks_read):
                    next(lines)
                assert text_engine.num_free_blocks() < baseline  # the request holds KV blocks while it streams
                at_close = request.seqs[0].num_output_tokens
        _gone(text_engine, request_id)
        seq = request.seqs[0]
        assert seq.finish_reason == "abort" and seq.num_output_tokens < LONG["max_tokens"]
        assert seq.num_output_tokens - at_close <= MAX_TOKENS_AFTER_LEAVING, (at_close, seq.num_output_tokens)
        wait_idle(text_engine)
        assert text_engine.num_free_blocks() == baseline
    assert_healthy(text_server, text_engine)


def test_ui_stop_aborts_within_a_step_and_frees_blocks_at_once(text_engine):
    """Gradio's Stop cancels the task iterating the chat function; the engine request ends with it."""
    wait_idle(text_engine)
    baseline = text_engine.num_free_blocks()
    respond = make_respond(text_engine, ServerConfig(sampling_defaults={"ignore_eos": True}))

    async def run_and_stop(texts_before_stop: int) -> tuple[int, object]:
        shown = asyncio.Event()
        texts: list[str] = []

        async def consume():
            async for text in respond({"text": "Tell me a long story.", "files": []}, [], "", 0.0, 1.0, 200):
                texts.append(text)
                if len(texts) >= texts_before_stop:
                    shown.set()

        task = asyncio.ensure_future(consume())
        await asyncio.wait_for(shown.wait(), timeout=30)
        (request_id,) = [r for r in text_engine.engine.requests if r.startswith("ui-")]
        request = text_engine.engine.requests[request_id]
        at_stop = request.seqs[0].num_output_tokens
        task.cancel()  # what the Stop button does
        await asyncio.gather(task, return_exceptions=True)
        # No polling: when the cancelled handler returns, the abort has run and the blocks are free.
        assert request_id not in text_engine.engine.requests
        assert text_engine.num_free_blocks() == baseline
        return request.seqs[0].num_output_tokens - at_stop, request.seqs[0]

    for texts_before_stop in (1, 4):
        extra, seq = asyncio.run(run_and_stop(texts_before_stop))
        assert seq.finish_reason == "abort" and seq.num_output_tokens < 200
        assert extra <= MAX_TOKENS_AFTER_LEAVING, extra
    wait_idle(text_engine)


def _send_and_hang_up(url: str, body: dict) -> None:
    """Send one request over a raw socket and close it at once, before any byte of the answer arrives."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: {AUTH['Authorization']}\r\nContent-Length: {len(payload)}\r\n\r\n")  # fmt: skip
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + payload)


def test_leaving_before_the_response_starts_aborts(text_server, text_engine):
    """A client that hangs up before the first byte (its prompt still in prefill) leaves nothing behind.

    Streamed or not, the request stops within a step or two of its start, long before its tokens are done.
    """
    wait_idle(text_engine)
    seen, done = {}, threading.Event()

    def watch():  # records every request the engine holds meanwhile
        while not done.is_set():
            seen.update(text_engine.engine.requests)
            time.sleep(0.0002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    prompt = "The quick brown fox jumps over the lazy dog. " * 5  # ~170 prompt tokens
    cases = ((True, 60, prompt), (True, 60, prompt), (False, 200, "Hello"))
    for taken, (stream, max_tokens, content) in enumerate(cases, start=1):
        body = {
            "messages": [{"role": "user", "content": content}],
            "stream": stream,
            **{**LONG, "max_tokens": max_tokens},
        }
        _send_and_hang_up(text_server.url, body)
        deadline = time.monotonic() + 10
        while stream and len(seen) < taken and time.monotonic() < deadline:  # a stream has its first token
            time.sleep(0.001)  # before its response (and disconnect listener) starts, so the engine holds it
        time.sleep(0.05)
        wait_idle(text_engine)
    done.set()
    watcher.join()
    finished = {k: (r.seqs[0].finish_reason, r.seqs[0].num_output_tokens) for k, r in seen.items()}
    # The non-streamed request may be aborted between two engine commands, before the watcher sees it;
    # if it is seen, it must have stopped as early (0.2 s of polling used to let ~70 tokens through).
    assert len(finished) >= 2 and all(reason == "abort" for reason, _ in finished.values()), finished
    assert all(tokens <= 1 + MAX_TOKENS_AFTER_LEAVING for _, tokens in finished.values()), finished
    assert_healthy(text_server, text_engine)

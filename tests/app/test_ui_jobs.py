"""UI jobs nobody reads are stopped in the engine, and a full UI queue answers "busy" (app/ui_jobs.py).

The demo model with `ignore_eos` as the server's default: a 900-token answer takes many seconds on a
CPU, so a job that is not stopped would still be running (and never aborted) when these tests look.
"""

from __future__ import annotations

import httpx
import pytest

from tests.app.live import AbortRecorder, demo_choice, start_server, wait_engine_idle, wait_until

MAX_NEW = 900
READER_WAIT_S = 2.0  # the server's ui_result_wait_s in these tests


@pytest.fixture
def recorded(demo_engine):
    return AbortRecorder(demo_engine)


def post_chat(server, text: str = "Tell me about the image.") -> httpx.Response:
    data = [{"text": text, "files": []}, "", 0.0, 1.0, MAX_NEW, []]
    return httpx.post(f"{server.url}/gradio_api/call/chat", json={"data": data}, timeout=30)


def result_url(server, posted: httpx.Response) -> str:
    assert posted.status_code == 200, posted.text
    return f"{server.url}/gradio_api/call/chat/{posted.json()['event_id']}"


def ui_server(engine, **config):
    return start_server(engine, demo_choice(), sampling_defaults={"ignore_eos": True}, ui_result_wait_s=READER_WAIT_S,
                        **config)  # fmt: skip


def test_a_posted_job_whose_results_nobody_reads_is_aborted(recorded, demo_engine):
    server = ui_server(recorded)
    try:
        posted = post_chat(server)  # httpx.post's connection closes here; the result stream is never asked for
        result_url(server, posted)
        (aborted,) = wait_until(lambda: recorded.aborted, 60, "the unread job to be aborted")
        assert aborted.startswith("ui-")
        wait_engine_idle(demo_engine)
    finally:
        server.stop()


def test_a_job_whose_reader_leaves_is_aborted(recorded, demo_engine):
    server = ui_server(recorded)
    try:
        with httpx.stream("GET", result_url(server, post_chat(server)), timeout=60) as stream:
            events = (line for line in stream.iter_lines() if line.startswith("event:"))
            assert next(e for e in events if e != "event: heartbeat") == "event: generating"
        wait_until(lambda: recorded.aborted, 60, "the job to be aborted once its reader left")
        wait_engine_idle(demo_engine)
    finally:
        server.stop()


def test_a_full_ui_queue_answers_busy(recorded, demo_engine):
    """One chat generating, one waiting (the queue's bound): the next is refused at once with a busy answer."""
    server = ui_server(recorded, ui_concurrency=1, ui_queue_size=1)
    try:
        with httpx.stream("GET", result_url(server, post_chat(server)), timeout=60):
            wait_until(lambda: demo_engine.engine.requests, 60, "the first chat to generate")
            waiting = post_chat(server, "second")
            assert waiting.status_code == 200, waiting.text
            refused = post_chat(server, "third")
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "server_busy" and "busy" in error["message"] and "queue is full" in error["message"]
            assert refused.headers["Retry-After"].isdigit()
        # the first chat's reader left and the waiting one is never read: both stop
        wait_until(lambda: len(recorded.aborted) == 2, 60, "both accepted chats to be aborted")
        wait_engine_idle(demo_engine)
    finally:
        server.stop()

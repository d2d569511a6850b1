"""/tokenize and /detokenize within the same bounds as a chat request: text that cannot fit the context is refused by
its length before the tokenizer sees it, and neither route answers with more than a context's worth of tokens."""

from __future__ import annotations

import httpx
import pytest

from tests.app.live import start_server
from tests.app.test_api_openai import HERMES_TEMPLATE

HELLO = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def limits(tiny_engine) -> tuple[int, int]:
    """(characters no prompt text may exceed, max_model_len)."""
    return tiny_engine.engine.max_prompt_chars, tiny_engine.max_model_len


@pytest.fixture(scope="module")
def tool_server(tiny_engine, tiny_choice):
    server = start_server(tiny_engine, tiny_choice, with_ui=False, chat_template=HERMES_TEMPLATE)
    yield server
    server.stop()


def _call(messages: list[dict], arguments: str) -> list[dict]:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}]
    return [*messages, {"role": "assistant", "content": None, "tool_calls": calls}]


def _tool(description: str) -> dict:
    return {"type": "function", "function": {"name": "f", "description": description, "parameters": {"type": "object"}}}


def _refused_by_length(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "characters" in error["message"], error


def test_tokenize_refuses_text_longer_than_any_prompt_that_fits(server, limits):
    bound, _ = limits
    too_long = "x" * (bound + 1)
    _refused_by_length(httpx.post(f"{server.url}/tokenize", json={"prompt": too_long}))
    _refused_by_length(httpx.post(f"{server.url}/tokenize", json={"prompt": too_long, "add_special_tokens": False}))
    _refused_by_length(httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": too_long}]}))


@pytest.mark.parametrize("route", ["/tokenize", "/v1/chat/completions"])
@pytest.mark.parametrize("where", ["tool-call-arguments", "tool-description"])
def test_tool_text_counts_towards_the_length_bound(tool_server, limits, route, where):
    """Tool-call arguments in the history and the tools' definitions are rendered into the prompt as well: text there
    counts as text in a message does."""
    bound, _ = limits
    huge = "y" * (bound + 1)
    if where == "tool-call-arguments":
        body = {"messages": _call(HELLO, '{"a": "' + huge + '"}')}
    else:
        body = {"messages": HELLO, "tools": [_tool(huge)]}
    if route != "/tokenize":
        body["max_tokens"] = 1
    _refused_by_length(httpx.post(f"{tool_server.url}{route}", json=body))


def test_tokenize_counts_up_to_the_context_and_refuses_beyond_it(server, limits):
    """Under the character bound the text is tokenized; a prompt of more tokens than the context holds is a 400 that
    says how many (vLLM answers with the whole list; here an answer never holds more than a context's tokens)."""
    bound, max_len = limits
    fits = httpx.post(f"{server.url}/tokenize", json={"prompt": "hello world " * 100}).json()
    assert fits["count"] == len(fits["tokens"]) < max_len and fits["max_model_len"] == max_len
    text = "hello world " * (max_len // 2)
    assert len(text) <= bound
    over = httpx.post(f"{server.url}/tokenize", json={"prompt": text})
    assert over.status_code == 400, over.text[:300]
    error = over.json()["error"]
    assert error["code"] == "context_length_exceeded" and str(max_len) in error["message"], error
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": text}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "context_length_exceeded", chat.text[:300]


def test_tokenize_refuses_text_that_is_not_unicode(server):
    r = httpx.post(f"{server.url}/tokenize", content=b'{"prompt": "a\\ud800b"}',
                   headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text[:300]


def test_detokenize_takes_at_most_a_context_of_tokens(server, limits):
    _, max_len = limits
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "hello", "add_special_tokens": False}).json()["tokens"]
    ok = httpx.post(f"{server.url}/detokenize", json={"tokens": (ids * max_len)[:max_len]})
    assert ok.status_code == 200 and ok.json()["prompt"].startswith("hello")
    over = httpx.post(f"{server.url}/detokenize", json={"tokens": ids * (max_len + 1)})
    assert over.status_code == 400 and over.json()["error"]["param"] == "tokens", over.text[:300]
    assert str(max_len) in over.json()["error"]["message"]

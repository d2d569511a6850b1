"""Fuzzing: schemathesis generates requests from the server's OpenAPI schema for /v1 (valid and invalid
bodies) and sends them in process (ASGI). No request may get a 5xx; every 4xx is an OpenAI-style error,
every stream ends with [DONE] and no in-band error.

Bounded for CI: a fixed number of examples per operation and generation mode, derandomized, and a
tiny model with a 64-token context so that accepted requests finish in milliseconds. (The strategies
are driven by Hypothesis directly: schemathesis' lazy pytest fixture does not run under pytest 9.)
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.app.live import start_engine
from tests.reliability.checks import ERROR_FIELDS, wait_idle
from tests.reliability.conftest import API_KEY, AUTH
from vlchat.app.model_choice import ModelChoice
from vlchat.app.server import build_app
from vlchat.app.settings import MediaLimits, ServerConfig

EXAMPLES = {"positive": 60, "negative": 40, "accepted": 60}  # POST /v1/chat/completions; 10 for the others
MODES = {"positive": GenerationMode.POSITIVE, "negative": GenerationMode.NEGATIVE, "accepted": GenerationMode.POSITIVE}


def integral(value):
    """JSON Schema counts 5.0 as an integer and the generator uses that; the server's fields take 5."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral(v) for v in value]
    return value


def accepted(case):
    """A valid body nudged past the rules the schema cannot state, so that it reaches the engine."""
    body = case.body = integral(case.body)
    if case.path == "/v1/chat/completions" and isinstance(body, dict):
        body.pop("model", None)
        for message in body.get("messages") or []:
            if message.get("content") is None or message.get("role") != "user":
                message["content"] = message.get("content") if isinstance(message.get("content"), str) else "hi"
            # tool messages need the id of a call, tool_calls an assistant: pairings the schema cannot state
            message.pop("tool_calls", None)
            if message.get("role") == "tool":
                message["role"] = "user"
        # tools need a template that renders them, constraints a valid schema/regex/grammar, token ids the
        # vocabulary, top_logprobs logprobs, min_tokens room under max_tokens
        for name in ("tools", "tool_choice", "response_format", "structured_outputs", "logit_bias", "stop_token_ids",
                     "min_tokens"):
            body.pop(name, None)
        if not body.get("logprobs"):
            body.pop("top_logprobs", None)
        for name in ("max_tokens", "max_completion_tokens"):
            if body.get(name) is not None:
                body[name] = min(body[name], 8)
        body["n"] = min(body.get("n", 1), 2)
        if isinstance(body.get("stop"), list):
            body["stop"] = [stop for stop in body["stop"] if stop][:8]
        if body.get("stop") in ("", []):
            body.pop("stop")
    return case


@pytest.fixture(scope="module")
def fuzz_engine(text_model_dir):
    engine = start_engine(text_model_dir, dtype="float32", device="cpu", max_model_len=64, num_blocks=128)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def api_schema(fuzz_engine):
    config = ServerConfig(api_key=API_KEY, media=MediaLimits(max_images_per_request=2), max_request_bytes=200_000,
                          allowed_hosts=("testserver",))  # the host name of the in-process ASGI client
    app = build_app(config, fuzz_engine, ModelChoice(fuzz_engine.config.model, "tiny-llama"), with_ui=False)
    return schemathesis.openapi.from_asgi("/v1/openapi.json", app, headers=AUTH)  # the schema needs the key too


def check(case) -> int:
    response = case.call(headers=AUTH)
    assert response.status_code < 500, (case.body, response.text[:500])
    if response.status_code >= 400:
        error = json.loads(response.text)["error"]
        assert set(error) == ERROR_FIELDS and error["message"], error
    elif "text/event-stream" in response.headers.get("content-type", ""):
        events = [e for e in response.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events), response.text[:500]
    return response.status_code


@pytest.mark.parametrize("mode", list(EXAMPLES))
def test_schema_fuzzing_gives_no_5xx(api_schema, fuzz_engine, mode):
    operations = [op for op in (r.ok() for r in api_schema.get_all_operations()) if op.path.startswith("/v1/")]
    assert {"GET /v1/models", "POST /v1/chat/completions"} <= {f"{op.method.upper()} {op.path}" for op in operations}
    statuses: dict[str, Counter] = {}
    start = time.monotonic()
    for operation in operations:
        seen = statuses.setdefault(f"{operation.method.upper()} {operation.path}", Counter())
        strategy = operation.as_strategy(MODES[mode])

        examples = EXAMPLES[mode] if operation.path == "/v1/chat/completions" else 10

        @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=strategy.map(accepted) if mode == "accepted" else strategy)
        def fuzz(case):
            seen[check(case)] += 1  # noqa: B023 - run at once, inside this iteration

        try:
            fuzz()
        except Unsatisfiable:  # no input to make invalid (GET /v1/models has no parameters)
            assert mode == "negative" and not seen
    print(f"\nfuzz {mode}: {time.monotonic() - start:.1f} s, "
          f"{ {k: dict(sorted(v.items())) for k, v in statuses.items()} }")  # fmt: skip
    chat = statuses["POST /v1/chat/completions"]
    assert sum(chat.values()) >= EXAMPLES[mode] // 2, chat  # the examples did run
    if mode == "negative":
        assert sum(n for s, n in chat.items() if 400 <= s < 500) > 0
    if mode == "accepted":  # most schema-valid bodies break a rule the schema cannot state; these reach the engine
        assert chat[200] >= EXAMPLES[mode] // 2, chat
    wait_idle(fuzz_engine)

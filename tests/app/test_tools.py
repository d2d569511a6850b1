"""Tool-call formats: parsing each family's text, the held-back content tail while streaming, the family chosen by the
chat template, and forced-call grammars that accept exactly the calls a family writes (checked with llguidance on
the tiny tokenizer)."""

from __future__ import annotations

import json

import pytest

from tests.llm.tiny import make_tokenizer
from vlchat.app.api.protocol import NamedToolChoice, Tool
from vlchat.app.api.tools import FORMATS, ParsedCall, forced_grammar, tool_format
from vlchat.llm.engine.grammar import GrammarCompiler
from vlchat.llm.sampling_params import StructuredOutputParams

WEATHER = Tool.model_validate({"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})  # fmt: skip
TIME = Tool.model_validate({"type": "function", "function": {"name": "get_time"}})


@pytest.mark.parametrize(
    "family, text, content, calls",
    [
        ("hermes", 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         "Let me look.", [ParsedCall("get_weather", '{"city": "Paris"}')]),
        ("hermes", '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": '
         '{"x": 1}}</tool_call>', None, [ParsedCall("a", "{}"), ParsedCall("b", '{"x": 1}')]),
        ("hermes", "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
        ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None,
         [ParsedCall("get_weather", '{"city": "Oslo"}')]),
        ("llama3", '<|python_tag|>{"name": "a", "parameters": {"s": "x;y"}}; {"name": "b", "parameters": {}}', None,
         [ParsedCall("a", '{"s": "x;y"}'), ParsedCall("b", "{}")]),
        ("llama3", "The answer is 4.", "The answer is 4.", []),
        ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', None, [ParsedCall("get_time", "{}")]),
        ("mistral", '[{"name": "get_time", "arguments": {"zone": "UTC"}}]', None,
         [ParsedCall("get_time", '{"zone": "UTC"}')]),  # the marker is a special token the text may not show
        ("mistral", "[1, 2]", "[1, 2]", []),
    ],
    ids=["hermes-content", "hermes-two", "hermes-bad", "llama3", "llama3-two", "llama3-text", "mistral",
         "mistral-no-marker", "mistral-text"],
)  # fmt: skip
def test_parse(family, text, content, calls):
    assert FORMATS[family].parse(text) == (content, calls)


def test_streamed_content_stops_before_a_possible_marker():
    hermes = FORMATS["hermes"]
    assert hermes.content_end("Hello") == 5
    assert hermes.content_end("Hello <tool") == 6  # "<tool" may become "<tool_call>"
    assert hermes.content_end("Hello <tool_call>{") == 6
    assert hermes.content_end("a < b") == 5
    assert FORMATS["llama3"].content_end('{"na') == 0 and FORMATS["llama3"].content_end("Sure") == 4


def test_the_template_picks_the_family():
    assert tool_format("{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert tool_format("[TOOL_CALLS]").name == "mistral"
    assert tool_format("<|python_tag|>{{ tools }}").name == "llama3"
    assert tool_format("{{ messages }}") is None and tool_format(None) is None


@pytest.fixture(scope="module")
def compiler():
    tok = make_tokenizer()
    return tok, GrammarCompiler(tok, len(tok), [tok.eos_token_id])


def _accepts(compiler, grammar: str, text: str) -> bool:
    tok, gc = compiler
    matcher = gc.matcher(StructuredOutputParams(grammar=grammar))
    return all(matcher.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) and matcher.is_accepting()


@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral"])
def test_forced_grammars_accept_the_family_calls_and_nothing_else(compiler, family):
    fmt = FORMATS[family]
    key = fmt.args_key
    one = {"name": "get_weather", key: {"city": "Rome"}}
    texts = {
        "hermes": f"<tool_call>\n{json.dumps(one, separators=(',', ':'))}\n</tool_call>",
        "llama3": json.dumps(one, separators=(",", ":")),
        "mistral": "[TOOL_CALLS]" + json.dumps([one], separators=(",", ":")),
    }
    grammar = forced_grammar(fmt, [WEATHER, TIME], "required", True, {})
    assert _accepts(compiler, grammar, texts[family])
    assert not _accepts(compiler, grammar, "Sure, here you go.")
    assert not _accepts(compiler, grammar, texts[family].replace(':{', ': {'))  # compact JSON: no room to ramble
    wrong_args = texts[family].replace('"city"', '"town"')
    assert not _accepts(compiler, grammar, wrong_args)
    named = forced_grammar(fmt, [WEATHER, TIME], NamedToolChoice.model_validate(
        {"type": "function", "function": {"name": "get_time"}}), True, {})  # fmt: skip
    assert not _accepts(compiler, named, texts[family])


def test_call_ids_suit_each_family():
    calls = [ParsedCall("a", "{}"), ParsedCall("b", "{}")]
    mistral = FORMATS["mistral"].openai_calls(calls)
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in mistral)  # what Mistral templates accept
    hermes = FORMATS["hermes"].openai_calls(calls, start=1, indexed=True)
    assert [c["index"] for c in hermes] == [1] and hermes[0]["id"].startswith("call_")
    assert len({c["id"] for c in FORMATS["llama3"].openai_calls(calls)}) == 2

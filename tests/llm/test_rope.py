"""llm/rope.py against transformers: inv_freq, attention scaling, cos/sin tables, length updates, config reading."""

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from vlchat.llm.rope import (
    RotaryEmbedding,
    compute_inv_freq,
    extend_rope_tables,
    get_rope,
    max_model_len_from_config,
    rope_parameters_from_config,
    update_rope_for_length,
)

HEAD_DIM = 16
HALF = HEAD_DIM // 2


def _longrope(short_scale, long_scale, **extra):
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + short_scale * i for i in range(HALF)],
        "long_factor": [1.0 + long_scale * i for i in range(HALF)],
        "original_max_position_embeddings": 128,
        **extra,
    }


# (rope_parameters, max_position_embeddings); every case also runs with rope_theta 10000 and 500000
CASES = {
    "default": ({"rope_type": "default"}, 128),
    "linear-2": ({"rope_type": "linear", "factor": 2.0}, 128),
    "linear-4": ({"rope_type": "linear", "factor": 4.0}, 128),
    "dynamic-2": ({"rope_type": "dynamic", "factor": 2.0}, 128),
    "dynamic-3.5": ({"rope_type": "dynamic", "factor": 3.5}, 128),
    "yarn-4": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}, 512),
    "yarn-16-beta": (
        {"rope_type": "yarn", "factor": 16.0, "beta_fast": 16, "beta_slow": 2, "original_max_position_embeddings": 128},
        2048,
    ),
    "yarn-mscale": (
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 64,
        },
        2560,
    ),
    "yarn-mscale-unequal": (
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "original_max_position_embeddings": 128,
        },
        1024,
    ),
    "yarn-no-truncate": (
        {"rope_type": "yarn", "factor": 4.0, "truncate": False, "original_max_position_embeddings": 128},
        512,
    ),
    "yarn-attention-factor": (
        {"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.9, "original_max_position_embeddings": 128},
        512,
    ),
    "llama3-8": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
        1024,
    ),
    "llama3-32": (
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 256,
        },
        8192,
    ),
    "longrope": (_longrope(0.1, 0.5), 1024),
    "longrope-factor": (_longrope(0.05, 1.0, factor=4.0), 2048),
}


def _config(rope_parameters, max_pos, theta, **extra):
    params = {**rope_parameters, "rope_theta": theta}
    return LlamaConfig(
        hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM, max_position_embeddings=max_pos,
        rope_parameters=params, **extra,
    )  # fmt: skip


def _transformers_cos_sin(rotary, length):
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(length)[None])
    return cos[0, :, :HALF], sin[0, :, :HALF]  # each [length, HEAD_DIM / 2]


@pytest.mark.parametrize("theta", [10000.0, 500000.0], ids=["theta1e4", "theta5e5"])
@pytest.mark.parametrize("case", list(CASES))
def test_inv_freq_scaling_and_table_match_transformers(case, theta):
    rope_parameters, max_pos = CASES[case]
    cfg = _config(rope_parameters, max_pos, theta)
    params = rope_parameters_from_config(cfg)
    kind = params["rope_type"]
    want_inv, want_scaling = (
        LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
        if kind == "default"
        else ROPE_INIT_FUNCTIONS[kind](cfg)
    )
    got_inv, got_scaling = compute_inv_freq(params, HEAD_DIM, HEAD_DIM)
    assert torch.equal(got_inv, want_inv)
    assert got_scaling == want_scaling
    rope = RotaryEmbedding(HEAD_DIM, HEAD_DIM, max_pos, params, torch.float32)
    cos, sin = _transformers_cos_sin(LlamaRotaryEmbedding(cfg), 100)  # within the original length
    assert torch.equal(rope.cos_sin_cache[:100, :HALF], cos)
    assert torch.equal(rope.cos_sin_cache[:100, HALF:], sin)


@pytest.mark.parametrize("kind", ["dynamic-2", "dynamic-3.5", "longrope"])
def test_length_updates_follow_transformers_across_the_switch(kind):
    rope_parameters, max_pos = CASES[kind]
    cfg = _config(rope_parameters, max_pos, 10000.0)
    rotary = LlamaRotaryEmbedding(cfg)
    model = torch.nn.Sequential(
        RotaryEmbedding(HEAD_DIM, HEAD_DIM, 1024, rope_parameters_from_config(cfg), torch.float32)
    )
    switched = False
    # around the switch at 128: grow, hold, grow again, fall back under it, cross again
    for length in [100, 128, 129, 300, 200, 301, 700, 150, 127, 50, 129, 128, 800]:
        update_rope_for_length(model, length)
        cos, sin = _transformers_cos_sin(rotary, length)
        table = model[0].cos_sin_cache[:length]
        assert torch.equal(table[:, :HALF], cos), f"cos differs at length {length}"
        assert torch.equal(table[:, HALF:], sin), f"sin differs at length {length}"
        switched |= not torch.equal(model[0].inv_freq, model[0].original_inv_freq)
    assert switched  # the scaled frequencies were in use for some lengths


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_forward_rotates_like_transformers(is_neox):
    cfg = _config(CASES["yarn-4"][0], 512, 10000.0)
    rope = get_rope(HEAD_DIM, None, 512, rope_parameters_from_config(cfg), torch.float32, is_neox=is_neox)
    positions = torch.tensor([0, 5, 130, 511])
    q, k = torch.randn(4, 4, HEAD_DIM), torch.randn(4, 2, HEAD_DIM)
    got_q, got_k = rope(positions, q.flatten(1), k)  # q flattened to [tokens, heads * head_dim]
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions[None])
    if is_neox:
        want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        want_q, want_k = want_q[0].transpose(0, 1), want_k[0].transpose(0, 1)
    else:  # interleaved pairs: the same rotation on the de-interleaved channels
        perm = torch.cat((torch.arange(0, HEAD_DIM, 2), torch.arange(1, HEAD_DIM, 2)))
        inv = torch.argsort(perm)
        want_q, want_k = apply_rotary_pos_emb(
            q[..., perm].transpose(0, 1)[None], k[..., perm].transpose(0, 1)[None], cos, sin
        )
        want_q, want_k = want_q[0].transpose(0, 1)[..., inv], want_k[0].transpose(0, 1)[..., inv]
    assert got_q.shape == (4, 4 * HEAD_DIM)
    torch.testing.assert_close(got_q.view(4, 4, HEAD_DIM), want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k, want_k, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["linear", "default", "proportional"])
def test_partial_rotary_factor(kind):
    params = {"rope_type": kind, "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "factor": 2.0}
    cfg = LlamaConfig(
        hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM, max_position_embeddings=64, rope_parameters=params
    )
    rope = get_rope(HEAD_DIM, None, 64, rope_parameters_from_config(cfg), torch.float32)
    want_fn = ROPE_INIT_FUNCTIONS["linear" if kind == "default" else kind]
    want = want_fn(cfg)[0] * (2.0 if kind == "default" else 1.0)  # default = linear without the division
    torch.testing.assert_close(rope.inv_freq, want, rtol=1e-7, atol=0)
    assert rope.rotary_dim == (HEAD_DIM if kind == "proportional" else HEAD_DIM // 2)


def test_legacy_rope_scaling_and_config_json_dicts():
    # DeepSeek-Coder style config.json: legacy keys, read as a plain dict
    legacy = {"max_position_embeddings": 16384, "rope_theta": 100000, "rope_scaling": {"type": "linear", "factor": 4.0}}
    params = rope_parameters_from_config(legacy)
    assert params["rope_type"] == "linear" and params["factor"] == 4.0 and params["rope_theta"] == 100000
    assert max_model_len_from_config(legacy) == 65536
    phi3 = {
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 256,
        "rope_scaling": {"type": "su", **_longrope(0.1, 0.5)},
    }
    params = rope_parameters_from_config(phi3)
    assert params["rope_type"] == "longrope" and params["original_max_position_embeddings"] == 256  # top level wins
    assert params["rope_theta"] == 10000.0
    assert max_model_len_from_config(phi3) == 4096
    assert rope_parameters_from_config({"max_position_embeddings": 8})["rope_type"] == "default"


def test_per_layer_type_parameters_gemma3():
    cfg = Gemma3TextConfig(
        hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM, num_hidden_layers=2, max_position_embeddings=1024,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    )  # fmt: skip
    both = rope_parameters_from_config(cfg)
    assert set(both) == {"full_attention", "sliding_attention"}
    full = rope_parameters_from_config(cfg, "full_attention")
    assert full["rope_type"] == "linear" and full["factor"] == 8.0 and full["rope_theta"] == 1_000_000.0
    assert rope_parameters_from_config(cfg, "sliding_attention")["rope_theta"] == 10_000.0
    assert max_model_len_from_config(cfg) == 1024  # Gemma 3 states the extended length already
    want, _ = ROPE_INIT_FUNCTIONS["linear"](cfg, layer_type="full_attention")
    assert torch.equal(compute_inv_freq(full, HEAD_DIM, HEAD_DIM)[0], want)
    with pytest.raises(ValueError, match="layer type"):
        rope_parameters_from_config(cfg, "chunked_attention")


@pytest.mark.parametrize(
    "case,want",
    [("default", 128), ("linear-4", 512), ("dynamic-2", 256), ("yarn-4", 512), ("llama3-8", 1024), ("longrope", 1024)],
)
def test_max_model_len(case, want):
    rope_parameters, max_pos = CASES[case]
    assert max_model_len_from_config(_config(rope_parameters, max_pos, 10000.0)) == want


def test_static_ropes_are_shared_and_dynamic_ones_are_not():
    static = rope_parameters_from_config(_config(CASES["llama3-8"][0], 1024, 10000.0))
    assert get_rope(HEAD_DIM, HEAD_DIM, 256, static, torch.float32) is get_rope(
        HEAD_DIM, HEAD_DIM, 256, static, torch.float32
    )
    dynamic = rope_parameters_from_config(_config(CASES["dynamic-2"][0], 128, 10000.0))
    assert get_rope(HEAD_DIM, HEAD_DIM, 256, dynamic, torch.float32) is not get_rope(
        HEAD_DIM, HEAD_DIM, 256, dynamic, torch.float32
    )


def test_unknown_type_is_rejected():
    with pytest.raises(ValueError, match="unsupported RoPE type"):
        rope_parameters_from_config({"max_position_embeddings": 8, "rope_scaling": {"type": "xpos"}})


@pytest.mark.parametrize("case", ["yarn-4", "dynamic-2"])
def test_extend_grows_the_table_with_the_same_rows(case):
    params = rope_parameters_from_config(_config(CASES[case][0], CASES[case][1], 10000.0))
    model = torch.nn.Sequential(RotaryEmbedding(HEAD_DIM, HEAD_DIM, 64, params, torch.float32))
    before = model[0].cos_sin_cache.clone()
    extend_rope_tables(model, 300)
    assert model[0].cos_sin_cache.shape == (300, HEAD_DIM)
    assert torch.equal(model[0].cos_sin_cache[:64], before)
    assert torch.equal(
        model[0].cos_sin_cache, RotaryEmbedding(HEAD_DIM, HEAD_DIM, 300, params, torch.float32).cos_sin_cache
    )


def test_inv_freq_ignores_the_callers_device_context_and_default_dtype():
    params = rope_parameters_from_config(_config(CASES["dynamic-2"][0], 128, 10000.0))
    want = compute_inv_freq(params, HEAD_DIM, HEAD_DIM, seq_len=300)[0]
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.bfloat16)  # as the model loader does while building a bf16 model
        with torch.device("meta"):
            got = compute_inv_freq(params, HEAD_DIM, HEAD_DIM, seq_len=300)[0]
    finally:
        torch.set_default_dtype(previous)
    assert got.device.type == "cpu" and got.dtype == torch.float32
    assert torch.equal(got, want)

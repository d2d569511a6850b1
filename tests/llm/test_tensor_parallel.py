"""Tensor-parallel decoders against the single-process model: every text family at 2 and 4 gloo ranks.

Same checkpoint, same prompt, fp32 on CPU: each rank loads its shard (llm/parallel.py)
and runs a paged prefill, 8 greedy decode steps and a mixed chunked-prefill/decode step.
Every rank's greedy tokens must be identical to the single process's and its logits
within 1e-4 (max abs error relative to the largest logit). The shapes cover KV heads
split (2 KV heads over 2 ranks), replicated (2 over 4, 1 over 2 and 4), a vocabulary
that does not divide by the ranks (131), tied heads, biases, q/k norms and InternLM2's
packed wqkv. Layer-level sharding rules are checked in one process.
"""

from __future__ import annotations

import pytest
import torch

from tests.llm.test_models import COMMON, PROMPT, _config, _randomize, _rewrite_as_internlm2
from tests.llm.tiny import rel_err
from tests.llm.tp_ranks import decoder_outputs, run_ranks
from vlchat.llm.config import EngineConfig
from vlchat.llm.errors import InvalidRequestError, TensorParallelError
from vlchat.llm.layers.embedding import LMHead, VocabEmbedding
from vlchat.llm.layers.linear import QKVLinear
from vlchat.llm.parallel import TPGroup

RTOL = 1e-4
NEW_TOKENS = 8


def _save(model, tmp_path_factory, name: str):
    out = tmp_path_factory.mktemp(name)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    import transformers as tf

    dirs = {}
    for family in ("llama", "mistral", "qwen2", "qwen3", "internlm2"):
        config = _config(family)
        model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _randomize(model, seed=len(family))
        dirs[family] = _save(model, tmp_path_factory, family)
        if family == "internlm2":
            _rewrite_as_internlm2(dirs[family], config)
    mqa = tf.LlamaConfig(**{**COMMON, "vocab_size": 131, "num_key_value_heads": 1})
    model = tf.AutoModelForCausalLM.from_config(mqa, dtype=torch.float32)
    _randomize(model, seed=3)
    dirs["llama-mqa-vocab131"] = _save(model, tmp_path_factory, "mqa")
    gemma = tf.Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=20, max_position_embeddings=256,
        sliding_window=6, layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True,
        final_logit_softcapping=3.0,
    )  # fmt: skip
    model = tf.Gemma3ForCausalLM(gemma)
    _randomize(model, seed=7)
    dirs["gemma3"] = _save(model, tmp_path_factory, "gemma3")
    return {name: str(path) for name, path in dirs.items()}


@pytest.fixture(scope="module")
def single(checkpoints):
    return decoder_outputs(checkpoints, PROMPT, NEW_TOKENS)


@pytest.mark.parametrize("world_size", [2, 4], ids=["tp2", "tp4"])
def test_every_family_matches_one_process(world_size, checkpoints, single):
    ranks = run_ranks(world_size, decoder_outputs, checkpoints, PROMPT, NEW_TOKENS)
    for rank, outputs in enumerate(ranks):
        for name, (logits, tokens, mixed) in outputs.items():
            ref_logits, ref_tokens, ref_mixed = single[name]
            where = f"{name} rank {rank}/{world_size}"
            assert tokens == ref_tokens, where
            assert logits.shape == ref_logits.shape, where
            assert rel_err(logits, ref_logits) < RTOL, where
            assert rel_err(mixed, ref_mixed) < RTOL, where


def test_qkv_rows_of_each_rank():
    # 8 query heads, 2 KV heads, head_dim 1: row i of each checkpoint piece holds the value i
    q, k, v = torch.arange(8.0)[:, None], torch.arange(2.0)[:, None] + 100, torch.arange(2.0)[:, None] + 200
    for tp, expect_q, expect_kv in [
        (TPGroup(1, 2), [4, 5, 6, 7], [1]),  # KV heads split: rank 1 holds the second
        (TPGroup(3, 4), [6, 7], [1]),  # replicated: ranks 2 and 3 share the second
        (TPGroup(1, 4), [2, 3], [0]),
    ]:
        layer = QKVLinear(1, 1, 8, 2, tp=tp)
        for piece, tensor in zip("qkv", (q, k, v), strict=True):
            layer.weight.weight_loader(layer.weight, tensor, piece)
        rows = layer.weight[:, 0].tolist()
        assert rows == expect_q + [100 + h for h in expect_kv] + [200 + h for h in expect_kv], tp


def test_vocab_slices_pad_the_last_rank():
    weight = torch.arange(10.0)[:, None]  # vocabulary of 10 over 4 ranks: 3 rows each, 2 of them padding
    emb, head = VocabEmbedding(10, 1, tp=TPGroup(3, 4)), LMHead(10, 1, tp=TPGroup(3, 4))
    for layer in (emb, head):
        layer.weight.weight_loader(layer.weight, weight)
        assert layer.weight[:, 0].tolist() == [9.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
        (dict(tensor_parallel_size=2, tp_listen="nohost"), "tp_listen must be HOST:PORT"),
        (dict(tensor_parallel_size=2, tp_listen="0.0.0.0:29600"), "tp_listen needs tp_authkey"),
        (dict(tensor_parallel_size=1, tp_listen="0.0.0.0:29600", tp_authkey="00"), "needs tensor_parallel_size > 1"),
        (dict(tensor_parallel_size=2, tp_authkey="xyz"), "tp_authkey must be hex"),
        (dict(load_format="pt"), "load_format must be one of"),
    ],
    ids=["size", "listen-format", "listen-key", "listen-size", "key-hex", "load-format"],
)
def test_bad_parallel_options_are_refused(options, message, tmp_path):
    with pytest.raises(InvalidRequestError, match=message):
        EngineConfig.from_options(str(tmp_path), **options)


@pytest.mark.parametrize(
    "heads, kv_heads, size, what",
    [(6, 2, 4, "num_attention_heads=6"), (8, 3, 2, "num_key_value_heads=3"), (8, 6, 4, "num_key_value_heads=6")],
    ids=["heads", "kv-split", "kv-replicate"],
)
def test_heads_that_do_not_split_are_refused(heads, kv_heads, size, what):
    with pytest.raises(TensorParallelError, match=what):
        QKVLinear(8, 1, heads, kv_heads, tp=TPGroup(0, size))

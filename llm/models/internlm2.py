"""InternLM2: the Llama decoder under other names, with q/k/v packed per KV group in `wqkv`.

Checkpoint layout (no transformers class exists; names from the reference code):
`model.tok_embeddings`, `layers.N.attention.wqkv/wo`, `feed_forward.w1/w3/w2`
(gate/up/down), `attention_norm`, `ffn_norm`, `model.norm`, `output`. `wqkv` rows
are grouped by KV head: for each of the `kv_heads` groups, its `heads / kv_heads`
query heads, then its key head, then its value head, each `head_dim` rows.
"""

from __future__ import annotations

import torch
from torch import nn

from vlchat.llm.models.llama import LlamaForCausalLM
from vlchat.llm.quantization import UnsupportedQuantizationError
from vlchat.llm.weights import ALL_SHARDS, WeightRule


def unpack_wqkv(packed: torch.Tensor, num_kv_heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """InternLM2's grouped `wqkv` rows (weight or bias) -> the (q, k, v) pieces, each heads in order."""
    rows = packed.shape[0]
    group = rows // (num_kv_heads * head_dim) - 2  # query heads per KV head
    if group < 1 or rows != num_kv_heads * (group + 2) * head_dim:
        raise ValueError(f"wqkv has {rows} rows, not a multiple of {num_kv_heads} KV groups of {head_dim}-row heads")
    grouped = packed.view(num_kv_heads, group + 2, head_dim, *packed.shape[1:])  # [kv_heads, group + 2, d, ...]
    q = grouped[:, :group].reshape(-1, *packed.shape[1:])
    k = grouped[:, group].reshape(-1, *packed.shape[1:])
    v = grouped[:, group + 1].reshape(-1, *packed.shape[1:])
    return q, k, v


def load_wqkv(param: nn.Parameter, packed: torch.Tensor, num_kv_heads: int, head_dim: int) -> None:
    """Fill the fused q/k/v parameter (this rank's heads of it) from a packed `wqkv` tensor."""
    for piece, tensor in zip("qkv", unpack_wqkv(packed, num_kv_heads, head_dim), strict=True):
        param.weight_loader(param, tensor, piece)


class InternLM2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def spec_overrides(cls, hf_config) -> dict:
        bias = bool(getattr(hf_config, "bias", False))
        return {"qkv_bias": bias, "o_bias": bias, "mlp_bias": False}

    @classmethod
    def checkpoint_rules(cls, hf_config) -> list[WeightRule]:
        if getattr(hf_config, "quantization_config", None) is not None:  # wqkv's grouped rows are packed codes
            raise UnsupportedQuantizationError("a quantized InternLM2 checkpoint (its packed wqkv) is not supported")
        num_heads = hf_config.num_attention_heads
        num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
        head_dim = hf_config.hidden_size // num_heads

        def load(param, packed):
            load_wqkv(param, packed, num_kv_heads, head_dim)

        return [
            WeightRule(r"(^|\.)tok_embeddings\.", r"\1embed_tokens."),
            WeightRule(r"\.attention\.wqkv\.", ".self_attn.qkv_proj.", shard=ALL_SHARDS, loader=load),
            WeightRule(r"\.attention\.wo\.", ".self_attn.o_proj."),
            WeightRule(r"\.feed_forward\.w1\.", ".mlp.gate_up_proj.", shard=0),
            WeightRule(r"\.feed_forward\.w3\.", ".mlp.gate_up_proj.", shard=1),
            WeightRule(r"\.feed_forward\.w2\.", ".mlp.down_proj."),
            WeightRule(r"\.attention_norm\.", ".input_layernorm."),
            WeightRule(r"\.ffn_norm\.", ".post_attention_layernorm."),
            WeightRule(r"^output\.", "lm_head."),
        ]

"""Gemma 3 text decoder (Gemma3ForCausalLM; also the language model inside Gemma3ForConditionalGeneration).

What differs from the Llama decoder it reuses (attention with q/k RMSNorm, gated MLP):
- layers interleave sliding-window and global attention (`layer_types`, `sliding_window`), and the
  two kinds use different RoPE parameters (`rope_parameters[layer_type]`: base 10k locally, 1M
  globally, possibly scaled);
- four RMSNorms per layer (before and after attention, before and after the MLP), all `(1 + w)`;
- GeGLU MLP with tanh-approximated GELU;
- embeddings multiplied by sqrt(hidden_size), rounded to the model dtype first as transformers does;
- attention scale `query_pre_attn_scalar ** -0.5`; optional final-logit soft-capping.

KV cache of sliding layers: every layer keeps the K/V of every position (the engine has one block
table per sequence, shared by all layers); sliding layers simply never read blocks that left their
window (the attention kernels skip them). Simple, and prefix caching and preemption work unchanged,
at a memory cost: for the 270M model (15 of 18 layers sliding, window 512, 1 KV head of 256) a
32k-token sequence holds 18 KiB/token in bf16 = 576 MiB, where trimming sliding layers to their
window would hold ~104 MiB. Per-layer-group block tables would recover it; at chat lengths
(a few thousand tokens) the difference is small.
"""

from __future__ import annotations

import torch
from torch import nn

from vlchat.llm.layers.embedding import LMHead, VocabEmbedding
from vlchat.llm.layers.norm import RMSNorm
from vlchat.llm.models.llama import (
    DecoderSpec,
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    _cfg,
    decoder_weight_rules,
    embedding_quant,
)
from vlchat.llm.rope import get_rope, rope_parameters_from_config


def _layer_types(hf_config) -> list[str]:
    types = getattr(hf_config, "layer_types", None)
    if types:
        return list(types)
    pattern = _cfg(hf_config, "sliding_window_pattern", "_sliding_window_pattern", default=6)
    kinds = ("sliding_attention", "full_attention")
    return [kinds[(i + 1) % pattern == 0] for i in range(hf_config.num_hidden_layers)]


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec, layer_idx: int, rotary_emb: nn.Module) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(spec, layer_idx, rotary_emb)
        self.mlp = LlamaMLP(spec)
        norm = lambda: RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.norm_weight_offset)  # noqa: E731
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()

    def forward(self, positions, hidden, residual):
        # hidden, residual: [tokens, hidden]; each pre-norm fuses the residual add before it
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        hidden = self.post_feedforward_layernorm(self.mlp(hidden))
        return hidden, residual


class Gemma3Model(LlamaModel):
    """Llama's forward over Gemma layers, each with the RoPE of its layer type."""

    def __init__(self, spec: DecoderSpec, layer_types: list[str], dtype: torch.dtype) -> None:
        nn.Module.__init__(self)
        ropes = {
            kind: get_rope(spec.head_dim, spec.rotary_dim, spec.max_position, spec.rope_parameters[kind], dtype)
            for kind in sorted(set(layer_types))
        }
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size, scale=spec.hidden_size**0.5, tp=spec.tp,
                                           quant=embedding_quant(spec))  # fmt: skip
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(spec, i, ropes[kind]) for i, kind in enumerate(layer_types)
        )  # fmt: skip
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.norm_weight_offset)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 text models (270M, 1B; the text part of 4B/12B/27B). See the module docstring."""

    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        nn.Module.__init__(self)
        hf_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        self.spec = self.spec_from_config(hf_config)
        self.model = Gemma3Model(self.spec, _layer_types(hf_config), dtype)
        softcap = _cfg(hf_config, "final_logit_softcapping", default=0.0)
        self.lm_head = LMHead(self.spec.vocab_size, self.spec.hidden_size, softcap=softcap, tp=self.spec.tp,
                              quant=embedding_quant(self.spec))  # fmt: skip
        if self.spec.tie_word_embeddings:  # Gemma ties the head to the embedding
            self.lm_head.tie(self.model.embed_tokens)
        self.weight_mapping = decoder_weight_rules(self.spec.tie_word_embeddings, quant=self.spec.quant)

    @classmethod
    def spec_overrides(cls, hf_config) -> dict:
        layer_types = _layer_types(hf_config)
        return {
            "hidden_act": _cfg(hf_config, "hidden_activation", "hidden_act", default="gelu_pytorch_tanh"),
            "qk_norm": True,
            "norm_weight_offset": 1.0,
            "attn_scale": _cfg(hf_config, "query_pre_attn_scalar", default=hf_config.head_dim) ** -0.5,
            # transformers' Gemma3Attention does not apply `attn_logit_softcapping` (Gemma 2 did; Gemma 3
            # checkpoints set it to None), so neither do we
            "attn_softcap": 0.0,
            "sliding_windows": [hf_config.sliding_window if t == "sliding_attention" else None for t in layer_types],
            "rope_parameters": {kind: rope_parameters_from_config(hf_config, kind) for kind in set(layer_types)},
            "tie_word_embeddings": bool(_cfg(hf_config, "tie_word_embeddings", default=True)),
        }

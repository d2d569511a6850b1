"""Llama-style decoders: Llama 2/3/3.1 (GQA), Vicuna, Mistral (sliding window).

The decoder is written once here with the switches other families need
(`DecoderSpec`: q/k/v and o biases, q/k RMSNorm, per-layer sliding windows,
tied embeddings). Qwen2, Qwen3 and InternLM2 subclass `LlamaForCausalLM` and only
say how their config maps onto the spec and how their checkpoint names map onto
ours (`weight_mapping`).

Under tensor parallelism (`spec.tp`, llm/parallel.py) the decoder is Megatron's:
q/k/v and gate/up column-parallel, o and down row-parallel (one all-reduce each),
embedding and head vocab-parallel; the norms are replicated, and each rank's
`Attention` sees its own query and KV heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vlchat.llm.errors import ModelLoadError
from vlchat.llm.layers.activation import get_act_and_mul
from vlchat.llm.layers.attention import Attention
from vlchat.llm.layers.embedding import LMHead, VocabEmbedding
from vlchat.llm.layers.linear import MergedLinear, QKVLinear, RowParallelLinear
from vlchat.llm.layers.norm import RMSNorm
from vlchat.llm.parallel import SINGLE, TPGroup, tp_group
from vlchat.llm.quantization import QuantConfig, quant_config_from_hf
from vlchat.llm.rope import get_rope, max_model_len_from_config, rope_parameters_from_config
from vlchat.llm.weights import WeightRule


@dataclass(slots=True)
class DecoderSpec:
    """Everything the decoder's shape depends on, read from an HF config by each family."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    rope_parameters: dict
    rotary_dim: int = 0  # 0 = head_dim
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    sliding_windows: list[int | None] = field(default_factory=list)  # per layer; [] = none
    attn_scale: float = 0.0  # 0 = head_dim ** -0.5
    attn_softcap: float = 0.0  # > 0: scores capped with softcap * tanh(score / softcap)
    norm_weight_offset: float = 0.0  # 1.0: Gemma's (1 + weight) RMSNorms
    tp: TPGroup = SINGLE  # this process's tensor-parallel rank and group size
    quant: QuantConfig | None = None  # quantized projections (llm/quantization.py); None = 16-bit

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}"
            )
        self.rotary_dim = self.rotary_dim or self.head_dim
        self.attn_scale = self.attn_scale or self.head_dim**-0.5
        if not self.sliding_windows:
            self.sliding_windows = [None] * self.num_layers
        if len(self.sliding_windows) != self.num_layers:
            raise ModelLoadError(f"{len(self.sliding_windows)} sliding windows for {self.num_layers} layers")


def _cfg(hf_config, *names, default=None):
    """The first of `names` the config has with a non-None value."""
    for name in names:
        value = getattr(hf_config, name, None)
        if value is not None:
            return value
    return default


def windows_from_layer_types(hf_config) -> list[int | None]:
    """Per-layer sliding windows from `layer_types` ("sliding_attention" layers get `sliding_window`)."""
    layer_types = getattr(hf_config, "layer_types", None)
    window = getattr(hf_config, "sliding_window", None)
    if not layer_types or window is None:
        return []
    return [window if t == "sliding_attention" else None for t in layer_types]


def embedding_quant(spec: DecoderSpec):
    """The quantization config of the embedding and head: only one that keeps them quantized (GGUF blocks)."""
    return spec.quant if getattr(spec.quant, "embeddings", False) else None


def decoder_weight_rules(
    tied_head: bool, extra: list[WeightRule] = (), quant: QuantConfig | None = None
) -> list[WeightRule]:
    """Checkpoint rules of the decoder: `extra` (a family's renames), then HF's separate q/k/v and
    gate/up tensors into our fused linears; with a tied head a saved copy of it is dropped; a 4-bit
    checkpoint's tensor names are renamed onto the quantized layers' parameters."""
    rules = [WeightRule(r"^(model\.)?lm_head\.weight$", None)] if tied_head else []
    return (
        rules
        + list(extra)
        + (quant.checkpoint_rules() if quant is not None else [])
        + [
            WeightRule(r"rotary_emb\.inv_freq$", None),
            WeightRule(r"\.q_proj\.", ".qkv_proj.", shard="q"),
            WeightRule(r"\.k_proj\.", ".qkv_proj.", shard="k"),
            WeightRule(r"\.v_proj\.", ".qkv_proj.", shard="v"),
            WeightRule(r"\.gate_proj\.", ".gate_up_proj.", shard=0),
            WeightRule(r"\.up_proj\.", ".gate_up_proj.", shard=1),
        ]
    )


class LlamaAttention(nn.Module):
    def __init__(self, spec: DecoderSpec, layer_idx: int, rotary_emb: nn.Module) -> None:
        super().__init__()
        self.qkv_proj = QKVLinear(
            spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.qkv_bias, spec.tp, spec.quant
        )  # this rank's heads
        self.q_size = self.qkv_proj.q_size
        self.o_proj = RowParallelLinear(
            spec.num_heads * spec.head_dim, spec.hidden_size, spec.o_bias, spec.tp, spec.quant
        )
        norm_args = (spec.head_dim, spec.rms_norm_eps, spec.norm_weight_offset)
        self.q_norm = RMSNorm(*norm_args) if spec.qk_norm else None
        self.k_norm = RMSNorm(*norm_args) if spec.qk_norm else None
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            self.qkv_proj.num_heads, spec.head_dim, spec.attn_scale, self.qkv_proj.num_kv_heads,
            spec.sliding_windows[layer_idx], spec.attn_softcap,
        )  # fmt: skip

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [tokens, hidden] -> [tokens, hidden]
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))  # [tokens, heads | kv_heads, head_dim]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v)  # [tokens, heads, head_dim]
        return self.o_proj(out.reshape(-1, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        inter = spec.intermediate_size
        self.gate_up_proj = MergedLinear(spec.hidden_size, [inter, inter], spec.mlp_bias, spec.tp, spec.quant)
        self.act_fn = get_act_and_mul(spec.hidden_act)
        self.down_proj = RowParallelLinear(inter, spec.hidden_size, spec.mlp_bias, spec.tp, spec.quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [tokens, hidden] -> [tokens, 2 * inter / tp] -> [tokens, inter / tp] -> [tokens, hidden]
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec, layer_idx: int, rotary_emb: nn.Module) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(spec, layer_idx, rotary_emb)
        self.mlp = LlamaMLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.norm_weight_offset)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.norm_weight_offset)

    def forward(self, positions, hidden, residual):
        # the residual stream is carried separately so each norm fuses the add before it
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, spec: DecoderSpec, dtype: torch.dtype) -> None:
        super().__init__()
        rotary_emb = get_rope(spec.head_dim, spec.rotary_dim, spec.max_position, spec.rope_parameters, dtype)
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size, tp=spec.tp, quant=embedding_quant(spec))
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, i, rotary_emb) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.norm_weight_offset)

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # [tokens, hidden]
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """Llama 2/3/3.1 and Vicuna. Subclasses override `spec_overrides` and `checkpoint_rules`."""

    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        super().__init__()
        self.spec = self.spec_from_config(hf_config)
        self.model = LlamaModel(self.spec, dtype)
        self.lm_head = LMHead(self.spec.vocab_size, self.spec.hidden_size, tp=self.spec.tp,
                              quant=embedding_quant(self.spec))  # fmt: skip
        if self.spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)
        self.weight_mapping = decoder_weight_rules(
            self.spec.tie_word_embeddings, self.checkpoint_rules(hf_config), self.spec.quant
        )

    @classmethod
    def spec_from_config(cls, hf_config) -> DecoderSpec:
        num_heads = hf_config.num_attention_heads
        head_dim = _cfg(hf_config, "head_dim", default=hf_config.hidden_size // num_heads)
        fields = dict(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=_cfg(hf_config, "num_key_value_heads", default=num_heads),
            head_dim=head_dim,
            rms_norm_eps=_cfg(hf_config, "rms_norm_eps", default=1e-6),
            max_position=max_model_len_from_config(hf_config),
            rope_parameters=rope_parameters_from_config(hf_config),
            rotary_dim=int(head_dim * _cfg(hf_config, "partial_rotary_factor", default=1.0)),
            hidden_act=_cfg(hf_config, "hidden_act", default="silu"),
            qkv_bias=bool(_cfg(hf_config, "attention_bias", default=False)),
            o_bias=bool(_cfg(hf_config, "attention_bias", default=False)),
            mlp_bias=bool(_cfg(hf_config, "mlp_bias", default=False)),
            tie_word_embeddings=bool(_cfg(hf_config, "tie_word_embeddings", default=False)),
            tp=tp_group(),
            quant=quant_config_from_hf(hf_config),
        )
        fields.update(cls.spec_overrides(hf_config))
        return DecoderSpec(**fields)

    @classmethod
    def spec_overrides(cls, hf_config) -> dict:
        return {}

    @classmethod
    def checkpoint_rules(cls, hf_config) -> list[WeightRule]:
        """Family-specific renames applied before the shared q/k/v and gate/up rules."""
        return []

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        # input_ids: [tokens]; positions: [tokens] (or [3, tokens] for M-RoPE) -> [tokens, hidden]
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [rows, hidden] -> [rows, vocab] fp32
        return self.lm_head(hidden)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama with a sliding window on every layer (`sliding_window`, None = full attention)."""

    @classmethod
    def spec_overrides(cls, hf_config) -> dict:
        window = getattr(hf_config, "sliding_window", None)
        return {"sliding_windows": windows_from_layer_types(hf_config) or [window] * hf_config.num_hidden_layers}

"""Qwen3: the Llama decoder with RMSNorm on each q and k head (before RoPE), optional biases."""

from __future__ import annotations

from vlchat.llm.models.llama import LlamaForCausalLM, windows_from_layer_types


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def spec_overrides(cls, hf_config) -> dict:
        return {"qk_norm": True, "sliding_windows": windows_from_layer_types(hf_config)}

"""Qwen2 / Qwen2.5: the Llama decoder with biases on q/k/v (not o) and per-layer sliding windows."""

from __future__ import annotations

from vlchat.llm.models.llama import LlamaForCausalLM, windows_from_layer_types


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def spec_overrides(cls, hf_config) -> dict:
        return {"qkv_bias": True, "o_bias": False, "sliding_windows": windows_from_layer_types(hf_config)}

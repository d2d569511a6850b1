"""HF `architectures` string -> model class, as "module:Class" imported on first use.

Strings keep llm/ free of imports from vision/: a multimodal model in vision/
is listed here by name and imported only when a checkpoint asks for it.
"""

from __future__ import annotations

import importlib

from vlchat.llm.errors import UnsupportedModelError

_MODELS: dict[str, str] = {
    "LlamaForCausalLM": "vlchat.llm.models.llama:LlamaForCausalLM",
    "LLaMAForCausalLM": "vlchat.llm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "vlchat.llm.models.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": "vlchat.llm.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "vlchat.llm.models.qwen3:Qwen3ForCausalLM",
    "InternLM2ForCausalLM": "vlchat.llm.models.internlm2:InternLM2ForCausalLM",
    "Gemma3ForCausalLM": "vlchat.llm.models.gemma3:Gemma3ForCausalLM",
    # vision-language models (vision/)
    "LlavaForConditionalGeneration": "vlchat.vision.models.llava:LlavaForConditionalGeneration",
    "Gemma3ForConditionalGeneration": "vlchat.vision.models.gemma3_vl:Gemma3ForConditionalGeneration",
    "LlavaNextForConditionalGeneration": "vlchat.vision.models.llava_next:LlavaNextForConditionalGeneration",
    "Qwen2VLForConditionalGeneration": "vlchat.vision.models.qwen2_vl:Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration": "vlchat.vision.models.qwen2_vl:Qwen2_5_VLForConditionalGeneration",
    "InternVLForConditionalGeneration": "vlchat.vision.models.internvl:InternVLForConditionalGeneration",
}


def register_model(architecture: str, target: str) -> None:
    """Map `architecture` to `"package.module:Class"` (replacing an earlier entry)."""
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:Class', got {target!r}")
    _MODELS[architecture] = target


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def _import(target: str) -> type:
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def get_model_class(hf_config) -> type:
    """The class for the first of the config's `architectures` that vlchat implements."""
    architectures = getattr(hf_config, "architectures", None) or []
    for arch in architectures:
        if arch in _MODELS:
            return _import(_MODELS[arch])
    raise UnsupportedModelError(f"model architecture {architectures or None!r}", supported_architectures())

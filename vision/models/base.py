"""What every vision-language model shares: the engine's decoder, weight-name layouts, prompt processing.

A family subclasses `VisionLanguageModel` and provides its vision modules,
`embed_multimodal` (one [image_tokens, hidden] tensor per image), `split_images`
(the processor's batch outputs -> one data dict and placeholder count per image) and
the checkpoint layouts it accepts (rules passed to `build_weight_mapping`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from vlchat.llm.errors import UnsupportedModelError
from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.models.registry import get_model_class
from vlchat.llm.weights import WeightRule, checkpoint_files
from vlchat.vision.cuda_graphs import GraphCache, can_graph
from vlchat.vision.processing import image_token_id, place_images, run_processor

# Text configs inside VLM configs often carry no `architectures`; their model_type names the decoder.
_DECODERS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2_vl_text": "Qwen2ForCausalLM",
    "qwen2_5_vl_text": "Qwen2ForCausalLM",
    "qwen2_vl": "Qwen2ForCausalLM",
    "qwen2_5_vl": "Qwen2ForCausalLM",
}


_HEADS = ("lm_head.weight", "language_model.lm_head.weight")
_EMBEDS = ("model.language_model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
           "model.embed_tokens.weight")  # fmt: skip


def _checkpoint_tensor(files: list[Path], names: tuple[str, ...]) -> torch.Tensor | None:
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in names:
                if name in f.keys():
                    return f.get_tensor(name)
    return None


def tie_word_embeddings(hf_config) -> bool:
    """Tie the LM head to the embedding as transformers does: when the config asks for it, unless the
    checkpoint (the config's directory) holds a head that differs from the embedding."""
    tie = bool(getattr(hf_config, "tie_word_embeddings", False))
    model_dir = Path(getattr(hf_config, "_name_or_path", "") or "")
    if not tie or not model_dir.is_dir():
        return tie
    try:
        files = [f for f in checkpoint_files(model_dir) if f.suffix == ".safetensors"]
    except Exception:  # no weights next to the config: nothing to compare
        return tie
    head = _checkpoint_tensor(files, _HEADS)
    if head is None:
        return True
    embed = _checkpoint_tensor(files, _EMBEDS)
    return embed is not None and torch.equal(head, embed)


def build_decoder(hf_config, dtype: torch.dtype) -> nn.Module:
    """The engine's causal LM for the VLM's text config (tied embeddings as transformers decides)."""
    text = copy.deepcopy(hf_config.get_text_config())
    quantization = getattr(hf_config, "quantization_config", None)
    if quantization is not None and getattr(text, "quantization_config", None) is None:
        text.quantization_config = quantization  # a VLM checkpoint's scheme covers its decoder; towers stay 16-bit
    text.tie_word_embeddings = tie_word_embeddings(hf_config)
    arch = _DECODERS.get(getattr(text, "model_type", ""))
    if arch is not None:
        text.architectures = [arch]
    elif not getattr(text, "architectures", None):
        raise UnsupportedModelError(f"text model type {text.model_type!r}", sorted(_DECODERS))
    return get_model_class(text)(text, dtype)


class VisionLanguageModel(nn.Module):
    is_multimodal = True
    uses_mrope = False
    graph_min_uses = 1  # see GraphCache; towers of many input sizes raise it

    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        super().__init__()
        self.hf_config = hf_config
        self.language_model = build_decoder(hf_config, dtype)
        self.image_token_id = int(hf_config.image_token_id)
        self.use_vision_graphs = True  # on CUDA, replay the vision forward from CUDA graphs
        self.vision_graphs = GraphCache(min_uses=self.graph_min_uses)

    def run_vision(self, key, fn, *inputs: torch.Tensor) -> torch.Tensor:
        """`fn(*inputs)`, replayed from a CUDA graph captured for `key` where that is possible."""
        if self.use_vision_graphs and can_graph(inputs[0]):
            return self.vision_graphs.run(key, fn, *inputs)
        return fn(*inputs)

    # -- decoder ------------------------------------------------------------

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        return self.language_model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.get_input_embeddings(input_ids)

    # -- weights ------------------------------------------------------------

    def build_weight_mapping(self, layout: list[WeightRule], vision: list[WeightRule]) -> list[WeightRule]:
        """Layout renames (every HF layout -> ours), then vision renames, then the decoder's own rules.

        A name no layout rule knows stays unmatched, and loading fails naming it (WeightMismatchError).
        """
        decoder = [r for r in self.language_model.weight_mapping if "lm_head" not in r.pattern]
        tied = []
        if self.language_model.spec.tie_word_embeddings:
            tied = [WeightRule(r"^language_model\.lm_head\.weight$", None)]
        return [*layout, *tied, *vision, *decoder]

    # -- prompts ------------------------------------------------------------

    @classmethod
    def process_prompt(cls, processor, messages: list[Mapping], mm_options: Mapping) -> MultiModalPrompt:
        token_ids, outputs, text, num_images = run_processor(processor, messages, mm_options)
        placeholder = cls.placeholder_id(processor)
        datas, lengths = cls.split_images(processor, outputs, num_images, token_ids, placeholder)
        items = place_images(token_ids, placeholder, datas, lengths)
        prompt = MultiModalPrompt(token_ids=token_ids, images=items, text=text)
        return cls.finish_prompt(processor, prompt)

    @classmethod
    def placeholder_id(cls, processor) -> int:
        """The token id whose rows image embeddings replace."""
        return image_token_id(processor)

    @classmethod
    def split_images(cls, processor, outputs, num_images: int, token_ids: list[int], placeholder: int):
        raise NotImplementedError

    @classmethod
    def finish_prompt(cls, processor, prompt: MultiModalPrompt) -> MultiModalPrompt:
        return prompt

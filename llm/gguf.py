"""GGUF checkpoints: one file holding the config, the tokenizer and (quantized) weights.

`load_gguf(path)` turns a GGUF file into what a Hugging Face model directory would give:
a transformers config (`.config`), a tokenizer with its chat template (`.tokenizer()`), and the
weights under Hugging Face parameter names, dequantized to the serving dtype (`.weights(dtype)`).
The model classes and their `weight_mapping` then load it like any safetensors checkpoint.

Everything follows transformers' own GGUF loader (`modeling_gguf_pytorch_utils.load_gguf_checkpoint`)
so that both load the same numbers: its metadata -> config tables, its per-architecture tensor
processors (Llama's q/k row permutation, Gemma's `norm - 1`), its GGUF -> HF tensor-name map, and
gguf-py's numpy dequantizers, with the cast to the serving dtype after dequantization.
Deliberate additions: the special-token ids come from the file's tokenizer metadata; a file without
a chat template gets the family's stock template (Gemma 3 files from llama.cpp have none), with
`<end_of_turn>` added to Gemma's stop tokens as the Hugging Face checkpoints do; and Qwen3's KV-head
count, norm epsilon and head size are read (transformers' table omits them).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from importlib.resources import files

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

from vlchat.kernels.ops.gguf_dequant import BLOCKS
from vlchat.llm.errors import ModelLoadError
from vlchat.llm.gguf_reader import GGUFFile

# GGUF architecture (after transformers' renames) -> (HF model_type, HF architectures string)
SUPPORTED_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
}
_STOCK_CHAT_TEMPLATES = {"gemma3": "gemma3.jinja"}
_EXTRA_STOP_TOKENS = {"gemma3": ["<end_of_turn>"]}
# keys transformers' table lacks for an architecture (its Qwen3 GGUF config would keep the class defaults)
_MISSING_CONFIG_KEYS = {
    "qwen3": {
        "attention.head_count_kv": "num_key_value_heads",
        "attention.layer_norm_rms_epsilon": "rms_norm_eps",
        "attention.key_length": "head_dim",
    },
}
_SPECIAL_TOKEN_IDS = {
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "padding_token_id": "pad_token_id",
}


class UnsupportedGGUFError(ModelLoadError):
    """The GGUF file holds an architecture or a quantization type vlchat cannot load."""


def load_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Parse a GGUF file's metadata (no tensor is read) and build its config; cached per file version."""
    path = os.path.abspath(path)
    try:
        stat = os.stat(path)
    except OSError:
        raise ModelLoadError(f"GGUF file {path} does not exist; pass the path of a .gguf file") from None
    return _load_cached(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime_ns: int, size: int) -> GGUFCheckpoint:
    return GGUFCheckpoint(path)


class GGUFCheckpoint:
    """A GGUF file seen as a Hugging Face checkpoint. See the module docstring."""

    def __init__(self, path: str) -> None:
        if not os.path.isfile(path):
            raise ModelLoadError(f"GGUF file {path} does not exist; pass the path of a .gguf file")
        self.file = GGUFFile(path)
        self.path = path
        self.gguf_architecture = _hf_architecture_name(self.file)
        self._config_dict = _config_dict(self.file, self.gguf_architecture)
        self.config: PretrainedConfig = AutoConfig.for_model(**self._config_dict)
        self.config.architectures = [SUPPORTED_ARCHITECTURES[self.gguf_architecture][1]]
        # the file's blocks are no serving dtype; "auto" then serves bf16 on a GPU (the engine takes fp32 on CPU)
        self.config.dtype = "bfloat16"
        self._check_tensor_types()
        self._tokenizer = None

    def tokenizer(self):
        """The tokenizer transformers builds from this file, with a chat template (built once, then shared)."""
        if self._tokenizer is None:
            self._tokenizer = self._build_tokenizer()
        return self._tokenizer

    def _build_tokenizer(self):
        from transformers import AutoTokenizer
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

        directory, name = os.path.split(os.path.abspath(self.path))
        class_name = TOKENIZER_MAPPING_NAMES.get(self.config.model_type)
        if isinstance(class_name, (tuple, list)):  # older transformers: (slow, fast)
            class_name = class_name[-1] or class_name[0]
        tokenizer_class = tokenizer_class_from_name(class_name) if class_name else None
        if tokenizer_class is None:
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        else:  # skips AutoTokenizer's second, slow pass over the file for the config
            tokenizer = tokenizer_class.from_pretrained(directory, gguf_file=name)
        if not tokenizer.chat_template and self.file.architecture in _STOCK_CHAT_TEMPLATES:
            template = files("vlchat.llm").joinpath("chat_templates", _STOCK_CHAT_TEMPLATES[self.file.architecture])
            tokenizer.chat_template = template.read_text(encoding="utf-8")
        return tokenizer

    def weights(self, dtype: torch.dtype = torch.float32, keep=None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield `(hf_parameter_name, tensor)` for every tensor the HF model has, dequantized, cast to dtype.

        `keep(hf_name)` True: a tensor of a type with a kernel (kernels/ops/gguf_dequant.py) is yielded as its
        raw blocks instead, uint8 [rows, row bytes] with `ggml_type` set, its rows reordered as the processor
        reorders the dequantized rows (Llama's q/k permutation)."""
        with torch.device("meta"):
            hf_model = AutoModelForCausalLM.from_config(self.config)
        processor_class = TENSOR_PROCESSORS.get(self.file.architecture, TensorProcessor)
        processor = processor_class(config=dict(self._config_dict))
        name_map = get_gguf_hf_weights_map(hf_model, processor)
        parsed = {"tensors": {}}
        for gguf_name, info in self.file.tensors.items():
            if keep is not None and info.ggml_type in BLOCKS and len(info.shape) == 2:
                kept = self._blocks(gguf_name, info, processor, name_map, keep)
                if kept is not None:
                    yield kept
                    continue
            values = dequantize(self.file.raw(gguf_name), GGMLQuantizationType(info.ggml_type))
            result = processor.process(
                weights=values, name=gguf_name, tensor_key_mapping=name_map, parsed_parameters=parsed
            )
            if result.name is None or result.name not in name_map:
                continue  # e.g. llama.cpp's precomputed `rope_freqs`, which transformers ignores as well
            yield name_map[result.name], torch.from_numpy(np.array(result.weights, dtype=np.float32)).to(dtype)

    def _blocks(self, gguf_name, info, processor, name_map, keep) -> tuple[str, torch.Tensor] | None:
        """(hf name, blocks) of a tensor kept quantized, or None to dequantize it: the processor's effect on the
        tensor is found by running it on the row indices, and only a reordering of rows is applied to blocks."""
        rows = info.shape[0]
        index = np.arange(rows, dtype=np.float32).reshape(rows, 1)
        try:
            result = processor.process(weights=index, name=gguf_name, tensor_key_mapping=name_map,
                                       parsed_parameters={"tensors": {}})  # fmt: skip
        except (ValueError, IndexError):
            return None
        if result.name is None or result.name not in name_map or not keep(name_map[result.name]):
            return None
        order = np.asarray(result.weights).reshape(-1)
        if order.shape != (rows,) or not np.array_equal(np.sort(order), index[:, 0]):
            return None
        blocks = torch.from_numpy(np.ascontiguousarray(self.file.raw(gguf_name)[order.astype(np.int64)]))
        blocks.ggml_type = int(info.ggml_type)
        return name_map[result.name], blocks

    def _check_tensor_types(self) -> None:
        """Fail before any dequantization when a tensor type has no dequantizer."""
        for ggml_type in sorted({info.ggml_type for info in self.file.tensors.values()}):
            if _can_dequantize(ggml_type):
                continue
            names = [n for n, info in self.file.tensors.items() if info.ggml_type == ggml_type]
            label = GGMLQuantizationType(ggml_type).name if ggml_type in _KNOWN_TYPES else f"id {ggml_type}"
            raise UnsupportedGGUFError(
                f"{self.path} stores {len(names)} tensors (e.g. {names[0]}) as ggml type {label}, which cannot "
                "be dequantized here; re-quantize the model to a common type (Q4_K_M, Q5_K_M, Q8_0, F16)"
            )


def _hf_architecture_name(file: GGUFFile) -> str:
    architecture = file.architecture
    # llama.cpp writes Mistral as llama; transformers maps it back only for a file named exactly "mistral"
    # (a name like "Mistral 7B v0.3" stays llama, which avoids MistralConfig's default 4096-token window)
    if architecture == "llama" and file.metadata.get("general.name") == "mistral":
        architecture = "mistral"
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedGGUFError(
            f"{file.path} holds a GGUF model of architecture {file.architecture!r}, which vlchat cannot serve; "
            f"supported GGUF architectures: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    return architecture


def _config_dict(file: GGUFFile, architecture: str) -> dict:
    """The HF config as transformers derives it from the metadata, plus the file's special-token ids."""
    metadata = file.metadata
    config = {"tie_word_embeddings": "output.weight" not in file.tensors}
    config.update(GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture, {}))
    renames = {**GGUF_CONFIG_MAPPING[architecture], **_MISSING_CONFIG_KEYS.get(architecture, {})}
    for key, value in metadata.items():
        prefix, _, rest = key.partition(".")
        if prefix == file.architecture and renames.get(rest):
            config[renames[rest]] = value
    if "general.name" in metadata:
        config["_name_or_path"] = metadata["general.name"]
    tokens = metadata.get("tokenizer.ggml.tokens", [])
    if "vocab_size" not in config and tokens:
        config["vocab_size"] = len(tokens)
    for gguf_key, config_key in _SPECIAL_TOKEN_IDS.items():
        if f"tokenizer.ggml.{gguf_key}" in metadata:
            config[config_key] = metadata[f"tokenizer.ggml.{gguf_key}"]
    extra_stops = [tokens.index(t) for t in _EXTRA_STOP_TOKENS.get(architecture, []) if t in tokens]
    if extra_stops and "eos_token_id" in config:
        config["eos_token_id"] = [config["eos_token_id"], *extra_stops]
    config["model_type"] = SUPPORTED_ARCHITECTURES[architecture][0]
    return config


_KNOWN_TYPES = {int(t) for t in GGMLQuantizationType}


def _can_dequantize(ggml_type: int) -> bool:
    if ggml_type not in _KNOWN_TYPES:
        return False
    qtype = GGMLQuantizationType(ggml_type)
    try:
        _, block_bytes = GGML_QUANT_SIZES[qtype]
        dequantize(np.zeros((1, block_bytes), dtype=np.uint8), qtype)
    except (KeyError, NotImplementedError):
        return False
    return True

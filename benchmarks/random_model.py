"""Random-weight Hugging Face model directories at real model shapes, for GPU benchmarks.

Throughput does not depend on weight values when generation lengths are fixed, so
benchmarks build a model of the right shape with random weights, save it as an HF
directory (config.json, safetensors, a word-level tokenizer covering the vocab)
and load it into both vlchat and transformers.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

from vlchat.llm.weights import fill_random

SHAPES = {
    # name: (LlamaConfig fields)
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rope_theta=10000.0),
    "vicuna-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                       num_key_value_heads=40, vocab_size=32000, max_position_embeddings=4096, rope_theta=10000.0),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                      rope_theta=500000.0),
    "llama2-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, rope_theta=10000.0),
    "qwen2.5-72b": dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, vocab_size=152064, max_position_embeddings=32768,
                        rope_theta=1000000.0),  # its layout as a Llama (no q/k/v biases; same FLOPs within 0.1%)
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000, max_position_embeddings=8192, rope_theta=500000.0),
}  # fmt: skip


def word_level_tokenizer(vocab_size: int):
    """A tokenizer with exactly `vocab_size` tokens (`<s>`, `</s>`, then `t2`, `t3`, ...), built offline.

    Text of `t<id>` words encodes to exactly those ids (other words to `t2`); `t2` is no special token,
    which would split it out of `t25`, `t2048`, ...
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1}
    vocab.update({f"t{i}": i for i in range(2, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    return fast


def byte_bpe_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE tokenizer with exactly `vocab_size` tokens (`<s>`, `</s>`, the 256 bytes, then merges of
    random pairs of earlier tokens), built offline: any text encodes, so grammars (JSON, regex) have tokens to use,
    which the word-level tokenizer's `t123` words do not offer."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<s>": 0, "</s>": 1}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    common = [pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(c)[0][0] for c in
              'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 {}[]":,.-_']  # fmt: skip
    pieces, merges, rng = list(common), [], random.Random(seed)
    while len(vocab) < vocab_size:
        a, b = rng.choice(pieces), rng.choice(common if rng.random() < 0.5 else pieces)
        if a + b in vocab or len(a + b) > 12:
            continue
        vocab[a + b] = len(vocab)
        merges.append((a, b))
        pieces.append(a + b)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    return fast


def build(
    shape: str,
    out_dir: str | os.PathLike,
    dtype: torch.dtype = torch.float16,
    device: str = "cuda",
    num_layers: int | None = None,
    return_model: bool = False,
    **overrides,
):
    """Write a random `shape` model to `out_dir` (skipped when it is there); optionally return the HF model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(SHAPES[shape])
    if num_layers is not None:
        fields["num_hidden_layers"] = num_layers
    fields.update(overrides)
    config = LlamaConfig(**fields, bos_token_id=0, eos_token_id=1, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         torch_dtype=str(dtype).removeprefix("torch."))  # fmt: skip
    out = Path(out_dir)
    model = None
    if return_model or not (out / "config.json").exists():
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM(config).to(dtype)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.02)
                else:
                    p.fill_(1.0)
        if not (out / "config.json").exists():
            model.save_pretrained(out, max_shard_size="5GB")
            word_level_tokenizer(config.vocab_size).save_pretrained(out)
            (out / "vlchat_bench.json").write_text(json.dumps({"shape": shape, "random_weights": True}))
    return (out, model) if return_model else out


def write_config_dir(path: str | os.PathLike, fields: dict, dtype: str = "bfloat16", tokenizer: str = "word") -> str:
    """A model directory with config.json and a tokenizer ("word": `word_level_tokenizer`, "byte-bpe":
    `byte_bpe_tokenizer`) but no weights (use with `random_weights`)."""
    from transformers import LlamaConfig

    config = LlamaConfig(**fields, bos_token_id=0, eos_token_id=1, rms_norm_eps=1e-5, torch_dtype=dtype,
                         architectures=["LlamaForCausalLM"])  # fmt: skip
    config.save_pretrained(path)
    make = byte_bpe_tokenizer if tokenizer == "byte-bpe" else word_level_tokenizer
    make(config.vocab_size).save_pretrained(path)
    return str(path)


def _random_fill(model, model_dir, rules=None, progress=True):
    """`load_weights`' stand-in: vlchat's `fill_random` from the current generator (quantized parameters too)."""
    fill_random(model, seed=None)


@contextlib.contextmanager
def random_weights():
    """Inside it, vlchat's loader fills parameters randomly instead of reading a checkpoint (big shapes
    build in seconds instead of writing and reading tens of GB)."""
    import vlchat.llm.weights as weights

    real = weights.load_weights
    weights.load_weights = _random_fill
    try:
        yield
    finally:
        weights.load_weights = real


def hf_random_model(model_dir: str | os.PathLike, dtype: torch.dtype, device: str):
    """transformers' model for a weightless `write_config_dir` directory, randomly filled on `device`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    _random_fill(model, model_dir)
    return model.eval()

"""Tiny random-weight models with a real tokenizer, built offline for tests.

`make_tiny_llama(tmp_path)` writes a Hugging Face model directory (config.json,
model.safetensors, tokenizer files with a chat template) that both transformers
and vlchat load. The tokenizer is a byte-level BPE trained here on a few
sentences, so any text encodes and decodes losslessly.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "A vision-language model answers questions about images.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Once upon a time there was a small engine that could.",
    "0123456789 + - * / = ( ) [ ] { } < > | : ; , . ! ? ' \"",
    "user assistant system: describe the picture, please.",
    "Ünïcödé façade naïve café — 日本語のテキスト 😀",
]

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<image>"]


@functools.cache
def _tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok.to_str()


def make_tokenizer(vocab_size: int = 320):
    """A byte-level BPE `PreTrainedTokenizerFast` with BOS added and a chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size)),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_llama_config(**overrides):
    """A LlamaConfig with GQA (4 query heads, 2 KV heads), small enough for CPU tests."""
    from transformers import LlamaConfig

    tok = make_tokenizer()
    fields = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def make_tiny_llama(tmp_path: str | Path, seed: int = 0, **config_overrides) -> Path:
    """Write a random-weight tiny Llama with tokenizer + chat template to `tmp_path/tiny-llama`; return the dir.

    The weights are scaled up from transformers' default init so that greedy
    decoding does not collapse into one repeated token (the tests want varied output).
    """
    from transformers import LlamaForCausalLM

    out = Path(tmp_path) / "tiny-llama"
    if (out / "config.json").exists():
        return out
    config = tiny_llama_config(**config_overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3 if "embed" in name else 0.15)
    model.save_pretrained(out, safe_serialization=True)
    make_tokenizer().save_pretrained(out)
    return out


def load_hf_model(model_dir: str | Path):
    """The transformers reference model for `model_dir`, fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest magnitude of the reference `b` (in fp32)."""
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max())


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by the transformers model, recomputing the full sequence each step (no EOS stop)."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt_ids) :]

"""The demo model's tokenizer: byte-level BPE trained on the generated conversations, plus the chat template.

Byte-level BPE means any text (not only the training vocabulary) encodes and decodes losslessly;
the words the model knows become single tokens.
"""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from scripts.demo.conversation import (
    CAPABILITIES,
    FILLER_WORDS,
    GREETINGS,
    OFF_TOPIC,
    THANKS,
    YOU_ARE_WELCOME,
    random_dialogue,
)
from scripts.demo.shapes import random_scene

PAD, BOS, END, USER, ASSISTANT, IMAGE = "<pad>", "<s>", "<|end|>", "<|user|>", "<|assistant|>", "<image>"
SPECIAL_TOKENS = (PAD, BOS, END, USER, ASSISTANT, IMAGE)
VOCAB_SIZE = 640
TOKENIZER_SEED = 1234

# System messages are dropped: the model was never trained on them. Images render as one <image>
# placeholder that the processor expands to one token per image patch.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def corpus(num_dialogues: int = 20000, seed: int = TOKENIZER_SEED) -> list[str]:
    rng = random.Random(seed)
    texts = [CAPABILITIES, OFF_TOPIC, YOU_ARE_WELCOME, *GREETINGS, *THANKS, " ".join(FILLER_WORDS)]
    for _ in range(num_dialogues):
        for turn in random_dialogue(random_scene(rng), rng):
            texts += [turn.question, turn.answer]
    return texts


def train_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT, IMAGE],
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast

"""The model's own tokenizer (transformers `AutoTokenizer`), its chat template and its stop tokens."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from vlchat.llm.config import is_gguf_file
from vlchat.llm.errors import InvalidRequestError, ModelLoadError


def load_tokenizer(model_dir: str | Path):
    """The Hugging Face tokenizer saved in `model_dir` (fast if available); no hub access, no remote code."""
    from transformers import AutoTokenizer

    if is_gguf_file(model_dir):  # the vocabulary and chat template live in the file's metadata
        from vlchat.llm.gguf import load_gguf  # the gguf package is imported only for GGUF checkpoints

        return load_gguf(model_dir).tokenizer()
    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(
            f"cannot load a tokenizer from {model_dir} ({e}); the directory needs tokenizer.json or the "
            "tokenizer files transformers saves with the model"
        ) from e


def stop_token_ids(tokenizer, model_dir: str | Path | None = None, hf_config=None) -> list[int]:
    """Token ids that end generation: eos ids of generation_config.json, config.json and the tokenizer."""
    ids: list[int] = []

    def add(value) -> None:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)

    if model_dir is not None:
        gen_path = Path(model_dir) / "generation_config.json"
        if gen_path.is_file():
            add(json.loads(gen_path.read_text()).get("eos_token_id"))
    if hf_config is not None:
        add(getattr(hf_config, "eos_token_id", None))
    add(getattr(tokenizer, "eos_token_id", None))
    return ids


def _flatten_text_parts(message: Mapping) -> dict:
    content = message.get("content")
    if isinstance(content, list):
        if any(part.get("type") != "text" for part in content):
            raise InvalidRequestError("this model reads text only; remove the image parts from the messages")
        content = "".join(part.get("text", "") for part in content)
    return {**message, "content": content}


def template_options(options: Mapping | None) -> dict:
    """The chat-template arguments of a request's prompt options: `tools` (OpenAI-style function definitions, which
    templates that take tools render) and `chat_template` (a Jinja template used instead of the model's)."""
    options = options or {}
    return {k: options[k] for k in ("tools", "chat_template") if options.get(k) is not None}


def apply_chat_template(
    tokenizer, messages: list[Mapping], add_generation_prompt: bool = True, **template: object
) -> list[int]:
    """Token ids of an OpenAI-style conversation rendered by the model's chat template.

    Content given as a list of text parts is joined into one string for templates
    that only take strings. The rendered text is tokenized without adding BOS again
    (templates write their own). `template`: see `template_options`.
    """
    if getattr(tokenizer, "chat_template", None) is None and not template.get("chat_template"):
        raise InvalidRequestError("this model's tokenizer has no chat template; send a plain text prompt instead")
    if not messages:
        raise InvalidRequestError("messages must not be empty")
    try:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=False, **template
        )
    except Exception:  # a template that cannot iterate over content parts
        flat = [_flatten_text_parts(m) for m in messages]
        text = tokenizer.apply_chat_template(
            flat, add_generation_prompt=add_generation_prompt, tokenize=False, **template
        )
    return list(tokenizer.encode(text, add_special_tokens=False))

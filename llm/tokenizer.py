"""The model's own tokenizer (transformers `AutoTokenizer`), its chat template and its stop tokens."""

from __future__ import annotations

import json
import re
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
    messages = [dict(m) for m in messages]
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             **template)  # fmt: skip
    except Exception:  # a template that cannot iterate over content parts
        messages = [_flatten_text_parts(m) for m in messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             **template)  # fmt: skip
    markers = typed_control_tokens(tokenizer, messages)
    if not markers:  # the common case: nothing typed can be mistaken for a control token
        return list(tokenizer.encode(text, add_special_tokens=False))
    segments = _split_content(tokenizer, messages, text, add_generation_prompt, template)
    if segments is None:
        raise InvalidRequestError(
            f"the messages contain {markers[0]!r}, a control token of this model's chat format, and this model's "
            "template cannot keep it apart from its own; remove it from the text"
        )
    ids: list[int] = []
    for segment, typed in segments:  # typed text: its control-token strings are plain text, never markers
        ids.extend(tokenizer.encode(segment, add_special_tokens=False, split_special_tokens=typed))
    return ids


_SENTINEL = re.compile("\ue000(\\d+)\ue001")  # private-use characters: no template or tokenizer treats them specially


def control_token_strings(tokenizer) -> list[str]:
    """The strings the tokenizer turns into special (control) tokens when they appear in text."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    strings = {t.content for t in decoder.values() if getattr(t, "special", False)}
    strings.update(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted((s for s in strings if s), key=len, reverse=True)


def typed_control_tokens(tokenizer, messages: list[Mapping]) -> list[str]:
    """The control-token strings that appear in the text of `messages` (longest first)."""
    texts = _content_texts(messages)
    return [t for t in control_token_strings(tokenizer) if any(t in text for text in texts)]


def _content_texts(messages: list[Mapping]) -> list[str]:
    """Every text a message carries, in order: string contents and the text of text parts."""
    texts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return texts


def _with_sentinels(messages: list[dict]) -> list[dict]:
    """`messages` with text i replaced by the sentinel "\ue000i\ue001"."""
    counter = iter(range(1 << 30))
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            content = f"\ue000{next(counter)}\ue001"
        elif isinstance(content, list):
            content = [{**p, "text": f"\ue000{next(counter)}\ue001"}
                       if isinstance(p, Mapping) and p.get("type") == "text" else p for p in content]  # fmt: skip
        out.append({**message, "content": content})
    return out


def _split_content(tokenizer, messages: list[dict], text: str, add_generation_prompt: bool, template: dict):
    """`text` (the rendered conversation) cut into (segment, typed) pairs: the template's own text, and the text the
    messages brought. The template is rendered again with a sentinel in place of each text; the template text between
    sentinels is found in `text` in order, each message text spanning at least its stripped length (templates may
    trim it), so a typed copy of the template's markers cannot be taken for them. None where that fails."""
    texts = _content_texts(messages)
    marked = tokenizer.apply_chat_template(_with_sentinels(messages), add_generation_prompt=add_generation_prompt,
                                           tokenize=False, **template)  # fmt: skip
    parts = _SENTINEL.split(marked)  # [template, index, template, index, ..., template]
    if not text.startswith(parts[0]) or not text.endswith(parts[-1]):
        return None
    segments, pos = [(parts[0], False)], len(parts[0])
    for k in range(1, len(parts), 2):
        typed, following = texts[int(parts[k])], parts[k + 1]
        earliest = pos + len(typed.strip())
        if k + 1 == len(parts) - 1:
            end = len(text) - len(following)
        elif following:
            end = text.find(following, earliest)
        else:
            end = pos + len(typed) if text.startswith(typed, pos) else -1
        if end < earliest:
            return None
        segments += [(text[pos:end], True), (following, False)]
        pos = end + len(following)
    if pos != len(text):
        return None
    return [(segment, typed) for segment, typed in segments if segment]

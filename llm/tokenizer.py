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
    marked, marked_tools, texts = _mark_typed_text(messages, template.get("tools"))
    controls = control_token_strings(tokenizer)
    _refuse_controls_in_identifiers(controls, marked, marked_tools)
    markers = [t for t in controls if any(t in text for text in texts)]
    if not markers:  # the common case: nothing typed can be mistaken for a control token
        return list(tokenizer.encode(text, add_special_tokens=False))
    marked_template = {**template, "tools": marked_tools} if marked_tools is not None else template
    segments = _split_content(tokenizer, marked, texts, text, add_generation_prompt, marked_template)
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


def typed_control_tokens(tokenizer, messages: list[Mapping], tools: object = None) -> list[str]:
    """The control-token strings that appear in what the client wrote (longest first): the messages' text, tool calls
    (names, ids, arguments), tool-call ids and names of tool results, and the tools' definitions."""
    marked, marked_tools, texts = _mark_typed_text(messages, tools)
    texts += _identifier_strings(marked, marked_tools)
    return [t for t in control_token_strings(tokenizer) if any(t in text for text in texts)]


def _mark_typed_text(messages: list[Mapping], tools: object) -> tuple[list[dict], object, list[str]]:
    """(messages, tools, texts): each free text the client wrote replaced by the sentinel "\ue000i\ue001", texts[i]
    being that text. Free text: string contents and text parts (tool results included), every key and string of a
    tool call's arguments (or the arguments themselves where they are a string, not JSON), and tool descriptions."""
    texts: list[str] = []

    def mark(text: str) -> str:
        if not text:  # nothing to keep apart; a template may test it (`{% if t.description %}`)
            return text
        texts.append(text)
        return f"\ue000{len(texts) - 1}\ue001"

    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = mark(content)
        elif isinstance(content, list):
            message["content"] = [_mark_part(p, mark) for p in content]
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [_mark_call(c, mark) for c in message["tool_calls"]]
        out.append(message)
    if isinstance(tools, list):
        tools = [_mark_descriptions(t, mark) for t in tools]
    return out, tools, texts


def _mark_part(part, mark):
    if isinstance(part, Mapping) and part.get("type") == "text":
        return {**part, "text": mark(part.get("text", ""))}
    return part


def _mark_call(call, mark):
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or "arguments" not in function:
        return call
    return {**call, "function": {**function, "arguments": _mark_json(function["arguments"], mark)}}


_MAX_MARK_DEPTH = 64  # deeper strings stay unmarked: checked as identifiers are (refused if they hold a control token)


def _mark_json(value, mark, depth: int = 0):
    if depth > _MAX_MARK_DEPTH:
        return value
    if isinstance(value, str):
        return mark(value)
    if isinstance(value, Mapping):
        return {mark(k) if isinstance(k, str) else k: _mark_json(v, mark, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_mark_json(v, mark, depth + 1) for v in value]
    return value


def _mark_descriptions(value, mark, depth: int = 0):
    """`value` (a tool definition) with every string under a "description" key marked (the rest is structure the
    template may read: names, types, schema keywords)."""
    if depth > _MAX_MARK_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {k: mark(v) if k == "description" and isinstance(v, str) else _mark_descriptions(v, mark, depth + 1)
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_mark_descriptions(v, mark, depth + 1) for v in value]
    return value


def _identifier_strings(marked: list[dict], marked_tools: object) -> list[str]:
    """The strings the client wrote that are not marked text: tool-call names and ids, tool-call ids and names of
    messages, and the tools' names and schemas."""
    return json_strings([marked_tools, *([m.get("tool_calls"), m.get("tool_call_id"), m.get("name")] for m in marked)])


def json_strings(value: object) -> list[str]:
    """The strings (keys and values) in nested JSON-like data; iterative, so nesting depth costs no recursion."""
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Mapping):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            stack += item
    return out


def _refuse_controls_in_identifiers(controls: list[str], marked: list[dict], marked_tools: object) -> None:
    """Names, ids and schemas are not text to split: a control token there is refused."""
    strings = _identifier_strings(marked, marked_tools)
    joined = "\0".join(strings)  # one search per control token (Llama 3 has 256 of them)
    found = next((c for c in controls if c in joined), None)
    if found is not None:
        string = next(s for s in strings if found in s)
        raise InvalidRequestError(
            f"{string[:80]!r} contains {found!r}, a control token of this model's chat format; tool and function "
            "names, call ids and tool schemas may not contain it"
        )


def _split_content(tokenizer, marked: list[dict], texts: list[str], text: str, add_generation_prompt: bool,
                   template: dict):  # fmt: skip
    """`text` (the rendered conversation) cut into (segment, typed) pairs: the template's own text, and the text the
    client wrote. The template is rendered again with a sentinel in place of each text (`marked`); each typed text is
    found where the template put it, as written, trimmed, or escaped by `tojson`, when the template's next text
    follows it there; otherwise the template text is searched for past the typed text's stripped length (templates
    that rewrite it), refused where the typed text would span more than it has characters (a longer rendering, such
    as an escape not tried here, could hold a typed copy of the template text, found first). None where that fails."""
    rendered = tokenizer.apply_chat_template(marked, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             **template)  # fmt: skip
    parts = _SENTINEL.split(rendered)  # [template, index, template, index, ..., template]
    if not text.startswith(parts[0]) or not text.endswith(parts[-1]):
        return None
    segments, pos = [(parts[0], False)], len(parts[0])
    for k in range(1, len(parts), 2):
        typed, following = texts[int(parts[k])], parts[k + 1]
        last = k + 1 == len(parts) - 1
        end = _typed_end(text, pos, typed, following, last)
        if end is None:
            return None
        segments += [(text[pos:end], True), (following, False)]
        pos = end + len(following)
    if pos != len(text):
        return None
    return [(segment, typed) for segment, typed in segments if segment]


def _typed_end(text: str, pos: int, typed: str, following: str, last: bool) -> int | None:
    """Where the typed text that starts at `pos` ends, `following` (the template's next text) coming right after."""
    if last:
        end = len(text) - len(following)
        return end if end >= pos + len(typed.strip()) else None
    for form in dict.fromkeys((typed, typed.strip(), *(json.dumps(t, ensure_ascii=a)[1:-1] for t in
                                                     (typed, typed.strip()) for a in (False, True)))):  # fmt: skip
        if text.startswith(form, pos) and text.startswith(following, pos + len(form)):
            return pos + len(form)
    earliest, latest = pos + len(typed.strip()), pos + len(typed)
    end = text.find(following, earliest, latest + len(following)) if following else -1
    return end if earliest <= end <= latest else None

"""Tool calls: how each model family writes them (chosen by its chat template), parsing them out of the answer
(whole or as it streams), and the grammar that forces them for tool_choice "required" or a named function.

Families (the markers their chat templates teach the model):
- hermes (Qwen2.5, Qwen3 and other Hermes-style templates): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
  </tool_call>`, one block per call, text around them is content.
- llama3 (Llama 3.1/3.2/3.3 JSON tool calling): the whole answer is `{"name": ..., "parameters": {...}}`
  (after `<|python_tag|>` where the model writes it), calls separated by `;`.
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from vlchat.app.api.protocol import NamedToolChoice, Tool


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text

    def to_openai(self, index: int | None = None, call_id: str | None = None) -> dict:
        call = {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}  # fmt: skip
        return call if index is None else {"index": index, **call}


# JSON without free whitespace: llguidance reads this at the top of each %json schema
_COMPACT = {"whitespace_flexible": False}


def _one_of(schemas: list[dict]) -> dict:
    return {"anyOf": schemas, "x-guidance": _COMPACT} if len(schemas) > 1 else schemas[0]


def _call(obj, args_key: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    return ParsedCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


class ToolFormat:
    name = ""
    markers: tuple[str, ...] = ()  # text that starts a tool call (content stops streaming there)

    def new_id(self) -> str:
        """An id for a call the model made (the client sends it back with the call's result)."""
        return f"call_{uuid.uuid4().hex[:24]}"

    def openai_calls(self, calls: list[ParsedCall], start: int = 0, indexed: bool = False) -> list[dict]:
        """calls[start:] as OpenAI tool calls (`indexed`: as stream deltas, with their index in the answer)."""
        return [c.to_openai(k if indexed else None, self.new_id()) for k, c in enumerate(calls) if k >= start]

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content, calls) of a whole answer; text that does not parse as calls stays content."""
        raise NotImplementedError

    def grammar(self, schemas: list[dict], parallel: bool, special_ids: dict[str, int]) -> str:
        """A Lark grammar (llguidance) whose sentences are one or more calls of the given call-object schemas."""
        raise NotImplementedError

    def call_schema(self, tool: Tool) -> dict:
        params = tool.function.parameters or {"type": "object"}
        return {"type": "object", "properties": {"name": {"const": tool.function.name}, self.args_key: params},
                "required": ["name", self.args_key], "additionalProperties": False,
                "x-guidance": _COMPACT}  # fmt: skip

    args_key = "arguments"

    def complete_calls(self, text: str) -> list[ParsedCall]:
        """The calls of a growing answer whose text is complete already (streamed before the answer ends)."""
        return []

    def content_end(self, text: str) -> int:
        """How much of a growing answer is content for sure: up to the first marker, less a tail that could
        still grow into one."""
        cut = min((i for i in (text.find(m) for m in self.markers) if i >= 0), default=len(text))
        for m in self.markers:
            for k in range(min(len(m) - 1, cut), 0, -1):
                if text[:cut].endswith(m[:k]):
                    return cut - k
        return cut


class Hermes(ToolFormat):
    name = "hermes"
    markers = ("<tool_call>",)
    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def parse(self, text):
        calls, rest = [], text
        for m in self._block.finditer(text):
            try:
                call = _call(json.loads(m.group(1)), self.args_key)
            except json.JSONDecodeError:
                call = None
            if call is not None:
                calls.append(call)
                rest = rest.replace(m.group(0), "", 1)
        content = rest.strip() if calls else text
        return (content or None), calls

    def complete_calls(self, text):
        return self.parse(text)[1]  # a block counts once its </tool_call> is there

    def grammar(self, schemas, parallel, special_ids):
        body = json.dumps(_one_of(schemas))
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
        return f'{start}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\nbody: %json {body}'


class Llama3(ToolFormat):
    name = "llama3"
    markers = ("<|python_tag|>", "{")
    args_key = "parameters"

    def parse(self, text):
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text or None, []
        calls = []
        for piece in _split_top_level(body, ";"):
            try:
                call = _call(json.loads(piece), self.args_key)
            except json.JSONDecodeError:
                return text, []
            if call is None:
                return text, []
            calls.append(call)
        return None, calls

    def grammar(self, schemas, parallel, special_ids):
        body = json.dumps(_one_of(schemas))
        start = 'start: call (";" call)*' if parallel else "start: call"
        return f"{start}\ncall: %json {body}"

    def content_end(self, text):
        return 0 if text.lstrip()[:1] in ("{", "<", "") else len(text)


class Mistral(ToolFormat):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)

    def new_id(self) -> str:
        return uuid.uuid4().hex[:9]  # Mistral's chat templates refuse ids that are not 9 alphanumerics

    def parse(self, text):
        head, sep, body = text.partition("[TOOL_CALLS]")
        if not sep:
            head, body = "", text if text.lstrip().startswith('[{"name"') else ""
        try:
            items = json.loads(body) if body.strip() else None
        except json.JSONDecodeError:
            items = None
        items = [items] if isinstance(items, dict) else items
        calls = [c for c in (_call(i, self.args_key) for i in items or []) if c is not None]
        if not calls:
            return text or None, []
        return head.strip() or None, calls

    def grammar(self, schemas, parallel, special_ids):
        array = {"type": "array", "items": _one_of(schemas), "minItems": 1, "x-guidance": _COMPACT}
        if not parallel:
            array["maxItems"] = 1
        marker = f"<[{special_ids['[TOOL_CALLS]']}]>" if "[TOOL_CALLS]" in special_ids else '"[TOOL_CALLS]"'
        return f"start: {marker} calls\ncalls: %json {json.dumps(array)}"


FORMATS = {f.name: f for f in (Hermes(), Llama3(), Mistral())}


def tool_format(chat_template: str | None) -> ToolFormat | None:
    """The family whose markers the template writes; None when it renders no tool calls."""
    template = chat_template or ""
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<|python_tag|>" in template or ("ipython" in template and "tools" in template):
        return FORMATS["llama3"]
    return None


def forced_grammar(fmt: ToolFormat, tools: list[Tool], choice, parallel: bool, special_ids: dict[str, int]) -> str:
    """The grammar for tool_choice "required" (any of the tools) or a named function (that one, once)."""
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == choice.function.name]
        parallel = False
    return fmt.grammar([fmt.call_schema(t) for t in tools], parallel, special_ids)


def _split_top_level(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside JSON strings and brackets."""
    parts, depth, start, in_str, escape = [], 0, 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def template_message(message: dict) -> dict:
    """An OpenAI message as chat templates take it: tool-call arguments as objects (templates `tojson` them)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for c in calls:
        fn = dict(c["function"])
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except (json.JSONDecodeError, TypeError, RecursionError):  # not JSON (or nested past the parser): as given
            pass
        out.append({**c, "function": fn})
    return {**message, "tool_calls": out}

"""The engine's per-token logprobs ({token id: logprob}, sampled token first) in the OpenAI response shapes."""

from __future__ import annotations

import re


def _top(entry: dict[int, float], n: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:n]


class TokenTexts:
    """Token id -> its text (decoded alone, so a piece of a multi-byte character reads as U+FFFD) and its bytes
    (exact: byte-level BPE pieces and SentencePiece <0xNN> byte tokens map back to their bytes), cached."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}
        self._bytes: dict[int, bytes] = {}
        self._byte_level = _byte_level_map(tokenizer)

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode([token_id])
        return text

    def bytes(self, token_id: int) -> bytes:
        raw = self._bytes.get(token_id)
        if raw is None:
            raw = self._bytes[token_id] = self._token_bytes(token_id)
        return raw

    def _token_bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        special = token_id in getattr(self.tokenizer, "all_special_ids", ())
        if isinstance(piece, str) and not special:
            if self._byte_level is not None and all(ch in self._byte_level for ch in piece):
                return bytes(self._byte_level[ch] for ch in piece)
            match = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
            if match:
                return bytes([int(match.group(1), 16)])
        return self(token_id).encode("utf-8")


def _byte_level_map(tokenizer) -> dict[str, int] | None:
    """GPT-2's printable-character -> byte table where the tokenizer decodes byte-level pieces, else None."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None or "ByteLevel" not in repr(decoder):
        return None
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def chat_logprobs(texts: TokenTexts, token_ids: list[int], entries: list[dict[int, float]], top_n: int) -> dict:
    """{"content": [{token, logprob, bytes, top_logprobs}]}: one item per generated token."""

    def item(tid: int, lp: float) -> dict:
        text = texts(tid)
        return {"token": text, "logprob": lp, "bytes": list(texts.bytes(tid))}

    content = []
    for tid, entry in zip(token_ids, entries, strict=False):
        content.append({**item(tid, entry[tid]), "top_logprobs": [item(t, lp) for t, lp in _top(entry, top_n)]})
    return {"content": content}


def completion_logprobs(texts: TokenTexts, token_ids: list[int], entries: list[dict[int, float]], top_n: int,
                        offset: int = 0) -> dict:  # fmt: skip
    """The legacy completions shape: tokens, token_logprobs, top_logprobs (a dict per token), text_offset."""
    tokens, offsets = [], []
    for tid in token_ids[: len(entries)]:
        offsets.append(offset)
        tokens.append(texts(tid))
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [entry[tid] for tid, entry in zip(token_ids, entries, strict=False)],
        "top_logprobs": [{texts(t): lp for t, lp in _top(entry, top_n)} for entry in entries],
        "text_offset": offsets,
    }

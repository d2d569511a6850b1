"""The engine's per-token logprobs ({token id: logprob}, sampled token first) in the OpenAI response shapes."""

from __future__ import annotations


def _top(entry: dict[int, float], n: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:n]


class TokenTexts:
    """Token id -> its text (decoded alone, so a piece of a multi-byte character reads as U+FFFD), cached."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode([token_id])
        return text


def chat_logprobs(texts: TokenTexts, token_ids: list[int], entries: list[dict[int, float]], top_n: int) -> dict:
    """{"content": [{token, logprob, bytes, top_logprobs}]}: one item per generated token."""

    def item(tid: int, lp: float) -> dict:
        text = texts(tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

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

"""Incremental detokenization that never emits a partial UTF-8 character.

Decoding token by token breaks multi-byte characters and the spacing rules of
some tokenizers; decoding the whole output every step is quadratic. Like vLLM,
each step decodes a short window: tokens [prefix, read) were already emitted, so
the new text is decode(tokens[prefix:]) minus decode(tokens[prefix:read]); while
it ends in U+FFFD (an incomplete byte sequence) nothing is emitted.
"""

from __future__ import annotations

_WINDOW = 6  # tokens of left context kept so the tokenizer's spacing rules see a word boundary


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # the Rust tokenizer decodes the same text without transformers' per-call Python overhead
        backend = getattr(tokenizer, "_tokenizer", None)
        plain = not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._fast = backend.decode if backend is not None and plain and hasattr(backend, "decode") else None
        self.ids: list[int] = list(prompt_ids[-_WINDOW:])
        self.prefix = 0
        self.read = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        if self._fast is not None:
            return self._fast(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def step(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        new = after[len(before) :]
        self.prefix, self.read = max(0, len(self.ids) - _WINDOW), len(self.ids)
        if self.prefix > 4 * _WINDOW:  # keep the id list short
            drop = self.prefix
            self.ids, self.prefix, self.read = self.ids[drop:], 0, self.read - drop
        return new

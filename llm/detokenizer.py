"""Incremental detokenization: token ids in, text deltas out, never a broken character.

Decoding token by token is wrong in two ways: a multi-byte character split over
two byte-level tokens decodes to U+FFFD halves, and SentencePiece drops the
leading space of a word that starts a decode. So each step decodes a short
window, the tokens since the last released text plus the few before them, and
releases only the new text, and only once it no longer ends in U+FFFD (or
the pending bytes cannot be one character any more).

With a fast (Rust-backed) tokenizer the window is kept by `tokenizers.decoders.DecodeStream`, the same
algorithm in Rust with the window's prefix text cached between releases: one call per token instead of two
decodes from Python (less host time per token: docs/PERF.md#engine-and-host). The window offsets are mirrored
here, so a forced release (below), an unexpected decode, the end of generation and pickling all go through the
Python window; after a forced release and after unpickling, a stream restarts from the offsets (after a failed
decode none does, and after the end of generation no token comes).

Stop strings: text that could be the start of a stop string is held back until
it either completes the stop string (generation stops; the text ends before it,
or after it with `include_stop_str_in_output`) or stops matching it.
"""

from __future__ import annotations

from collections.abc import Sequence

try:  # tokenizers >= 0.22: a DecodeStream may start from context ids
    from tokenizers.decoders import DecodeStream
except ImportError:  # an older tokenizers: the Python window only
    DecodeStream = None

# Prompt tokens kept as left context of the first decode window.
PROMPT_CONTEXT = 6
REPLACEMENT_CHAR = "\ufffd"
# A UTF-8 character has at most 4 bytes, so at most 4 tokens: a U+FFFD still open after that
# many pending tokens is an invalid byte sequence (an untrained model), released as is.
MAX_CHAR_TOKENS = 4


class IncrementalDetokenizer:
    """Turns one sequence's generated tokens into text, one delta per call.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with `decode(ids, skip_special_tokens=...)`).
        prompt_token_ids: the prompt, whose last tokens give the first output token its context.
        stop: stop strings.
        include_stop_str_in_output: keep the matched stop string at the end of the text.
        skip_special_tokens: leave special tokens (BOS, EOS, ...) out of the text.
    """

    def __init__(
        self,
        tokenizer,
        prompt_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = [s for s in stop if s]
        self._longest_stop = max(map(len, self.stop), default=0)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._ids = list(prompt_token_ids)[-PROMPT_CONTEXT:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._text = ""  # decoded so far, released or held back
        self._released = 0  # chars of _text handed out
        self.stop_string: str | None = None  # the stop string that ended the text, if any
        self._stream_ok = True  # until a DecodeStream fails
        self._attach_backend()

    def _attach_backend(self) -> None:
        """The Rust `tokenizers.Tokenizer` of a fast tokenizer whose decode needs no Python cleanup, and a
        DecodeStream over it where one can start."""
        backend = getattr(self.tokenizer, "_tokenizer", None)
        plain = not getattr(self.tokenizer, "clean_up_tokenization_spaces", False)
        self._backend = backend if plain and callable(getattr(backend, "decode", None)) else None
        self._stream_ok = self._stream_ok and self._backend is not None and DecodeStream is not None
        self._stream = self._new_stream()

    def _new_stream(self):
        """A DecodeStream whose window is this detokenizer's: context ids[prefix:read], then the pending ids (none
        pending after a release). None without a fast tokenizer or a DecodeStream that takes context ids, after a
        stream failed, and while the context's text ends in U+FFFD: a DecodeStream started from such a context
        releases that character again (the window path runs until its next release, then a stream restarts)."""
        if not self._stream_ok:
            return None
        context = self._ids[self._prefix_offset : self._read_offset]
        if self._decode(context).endswith(REPLACEMENT_CHAR):
            return None
        try:
            stream = DecodeStream(ids=context, skip_special_tokens=self.skip_special_tokens)
            for token_id in self._ids[self._read_offset :]:  # they released nothing before, and do not now
                stream.step(self._backend, token_id)
        except (TypeError, ValueError, RuntimeError, OverflowError):  # a DecodeStream without `ids`, odd ids
            self._stream_ok = False
            return None
        return stream

    def __getstate__(self) -> dict:
        # a DecodeStream does not pickle: a copy restarts one from the mirrored offsets
        return {k: v for k, v in self.__dict__.items() if k not in ("_stream", "_backend")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach_backend()

    @property
    def text(self) -> str:
        """The text released so far."""
        return self.released_text(self._released)

    @property
    def num_released(self) -> int:
        """Characters of text released so far; the released text never changes, it only grows."""
        return self._released

    def released_text(self, end: int, start: int = 0) -> str:
        """Characters [start, end) of the released text (end <= num_released at any earlier time)."""
        return self._text[start:end]

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:  # same text, without transformers' per-call Python overhead
            return self._backend.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _window(self) -> tuple[str, str]:
        """The text of the window's context ids[prefix:read] and of the whole window ids[prefix:]."""
        context = self._decode(self._ids[self._prefix_offset : self._read_offset])
        return context, self._decode(self._ids[self._prefix_offset :])

    def _take(self, text: str) -> None:
        """Append released-to-be text; the window moves on: its context is now the ids read last time."""
        self._text += text
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)

    def add_token(self, token_id: int, check_stop: bool = True) -> str:
        """Add one generated token; return the newly released text ("" while a character or stop match is open).

        `check_stop=False` (e.g. before min_tokens) does not end on a stop string but still holds back its start.
        """
        if self.stop_string is not None:
            return ""
        token_id = int(token_id)
        ids = self._ids
        ids.append(token_id)
        if self._stream is not None:  # the engine's path, once per token of every running sequence: kept lean
            try:
                piece = self._stream.step(self._backend, token_id)
            except Exception:  # noqa: BLE001 - e.g. a decode that no longer starts with its prefix: the window
                self._stream, self._stream_ok = None, False
            else:
                if piece is not None:  # the same release as the window's below, offsets moved alike
                    self._take(piece)
                    if not self.stop:  # nothing is held back: the piece is the release
                        self._released = len(self._text)
                        return piece
                    return self._release(check_stop, final=False)
                if len(ids) - self._read_offset < MAX_CHAR_TOKENS:  # an open character, or no new text
                    return self._release(check_stop, final=False) if self.stop else ""
        prefix_text, new_text = self._window()
        open_char = new_text.endswith(REPLACEMENT_CHAR) and len(self._ids) - self._read_offset < MAX_CHAR_TOKENS
        if len(new_text) > len(prefix_text) and not open_char:
            self._take(new_text[len(prefix_text) :])
            if self._stream_ok:  # the window released (what a stream held back, invalid bytes): a stream again
                self._stream = self._new_stream()
        return self._release(check_stop, final=False)

    def flush(self) -> str:
        """At the end of generation: release whatever is still held back (an unfinished character too)."""
        if self.stopped:
            return ""
        prefix_text, new_text = self._window()
        self._take(new_text[len(prefix_text) :])
        self._prefix_offset = self._read_offset
        return self._release(check_stop=True, final=True)

    def _release(self, check_stop: bool, final: bool) -> str:
        start = self._released
        end = len(self._text)
        if self.stop:
            if check_stop:
                found = self._find_stop()
                if found is not None:
                    index, stop = found
                    self.stop_string = stop
                    cut = max(start, index + (len(stop) if self.include_stop_str_in_output else 0))
                    self._text = self._text[:cut]
                    self._released = cut
                    return self._text[start:cut]
            if not final:
                end = max(start, end - self._partial_stop_len())
        self._released = end
        return self._text[start:end]

    def _find_stop(self) -> tuple[int, str] | None:
        search_from = max(0, self._released - self._longest_stop + 1)
        best: tuple[int, str] | None = None
        for stop in self.stop:
            index = self._text.find(stop, search_from)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _partial_stop_len(self) -> int:
        """Length of the longest end of the text that is a proper prefix of a stop string."""
        unreleased = self._text[self._released :]
        best = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(unreleased)), best, -1):
                if unreleased.endswith(stop[:n]):
                    best = n
                    break
        return best

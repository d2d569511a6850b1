"""Grammar-constrained decoding with llguidance: one matcher per constrained sequence, masks filled on the host.

Each constrained sequence owns an `LLMatcher` that has consumed exactly its output tokens. Before a step samples,
`BitmaskFiller.fill` writes one row of allowed tokens (a bit per token id, int32 words) per constrained row into a host
buffer, all rows in parallel in llguidance's thread pool; the sampler copies it to the device and masks only those
rows there, so unconstrained rows of the batch wait for nothing. After the token arrives, `advance` feeds it to the
matcher. When the grammar can take no further token, EOS is the only allowed token and the sequence ends.

llguidance was chosen over xgrammar by benchmarks/grammar_overhead.py (64 constrained rows of 128, a 32000-token
vocabulary, benchmarks/results/grammar_overhead_cpu.md): per step the two cost about the same on the shared 2-core
host measured (median 2.7 vs 1.9 ms, mean 3.7 vs 4.8 ms, p90 9.4 vs 11.1 ms), but a schema not seen before reaches
its first mask in 1.2 ms against 18.9 ms, since llguidance builds masks lazily instead of compiling each schema
first: that time is added to the first token of every request with a new schema.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict

import torch

from vlchat.llm.errors import InvalidRequestError
from vlchat.llm.sampling_params import StructuredOutputParams

_GRAMMAR_CACHE = 256  # grammar strings kept by constraint

# Any JSON object: what response_format {"type": "json_object"} asks for
JSON_OBJECT_SCHEMA = {"type": "object"}


def bitmask_words(vocab_size: int) -> int:
    return -(-vocab_size // 32)


class GrammarCompiler:
    """Turns `StructuredOutputParams` into matchers for one tokenizer. Built lazily: the llguidance tokenizer
    (a scan of the whole vocabulary) is made at the first constrained request. Thread-safe: AsyncEngine checks and
    caches a request's grammar in a worker thread while the engine thread makes matchers."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._lltok = None
        self._grammars: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def _tokenizer(self):
        with self._lock:
            if self._lltok is None:
                import llguidance.hf

                eos = self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids
                self._lltok = llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=self.vocab_size, eos_token=eos)
            return self._lltok

    def grammar(self, spec: StructuredOutputParams) -> str:
        """The llguidance grammar of `spec`, checked; raises InvalidRequestError naming what is wrong."""
        key = spec.key()
        with self._lock:
            cached = self._grammars.get(key)
            if cached is not None:
                self._grammars.move_to_end(key)
                return cached
        from llguidance import LLMatcher

        # JSON without free whitespace: a model cannot fill the text with newlines and spaces forever
        defaults = {"whitespace_flexible": False}
        try:
            if spec.json_schema is not None or spec.json_object:
                schema = spec.json_schema if spec.json_schema is not None else JSON_OBJECT_SCHEMA
                grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=defaults)
            elif spec.regex is not None:
                grammar = LLMatcher.grammar_from_regex(spec.regex)
            elif spec.choice is not None:
                grammar = LLMatcher.grammar_from_regex("|".join(f"({re.escape(c)})" for c in spec.choice))
            else:
                grammar = LLMatcher.grammar_from_lark(spec.grammar)
        except Exception as exc:  # noqa: BLE001 - llguidance raises plain exceptions for bad input
            raise InvalidRequestError(f"the structured output constraint is invalid: {exc}") from None
        error = LLMatcher.validate_grammar(grammar, self._tokenizer())
        if error:
            raise InvalidRequestError(f"the structured output constraint is invalid: {error.strip()}")
        with self._lock:
            self._grammars[key] = grammar
            while len(self._grammars) > _GRAMMAR_CACHE:
                self._grammars.popitem(last=False)
        return grammar

    def matcher(self, spec: StructuredOutputParams):
        from llguidance import LLMatcher

        matcher = LLMatcher(self._tokenizer(), self.grammar(spec))
        if matcher.is_error():
            raise InvalidRequestError(f"the structured output constraint is invalid: {matcher.get_error()}")
        return matcher



class BitmaskFiller:
    """Fills the masks of a step's constrained rows in llguidance's thread pool (made at first use)."""

    def __init__(self) -> None:
        self._executor = None

    def fill(self, matchers: list, out: torch.Tensor) -> None:
        """Row i of `out` ([len(matchers), bitmask_words] int32, host) := the tokens matchers[i] allows next.
        A failed matcher allows every token (its sequence has ended; the token is dropped)."""
        import llguidance
        import llguidance.torch as lt

        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        live = []
        for i, m in enumerate(matchers):
            if m.is_error():
                out[i].fill_(-1)
            else:
                live.append((m, i))
        if live:
            lt.fill_next_token_bitmask_par(self._executor, live, out)


def advance(matcher, token_id: int) -> bool:
    """Feed one sampled token to the matcher; False when the grammar rejects it (the mask should have prevented
    that: only a row whose logits were all masked or NaN gets there)."""
    return bool(matcher.consume_token(token_id))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 bitmask -> [rows, vocab_size] bool, on the bitmask's device (bit j of word w is
    token 32 * w + j)."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [rows, words, 32]
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()

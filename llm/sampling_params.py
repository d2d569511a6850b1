"""Per-request sampling parameters, validated on construction."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from vlchat.llm.errors import InvalidRequestError

MAX_LOGPROBS = 20
MAX_N = 1024  # completions per request
MAX_INT32 = 2**31 - 1  # top_k and token ids travel as device integers
MAX_SEED = 2**64 - 1
GREEDY_BELOW = 1e-5  # temperatures under this are greedy
MAX_LOGIT_BIAS = 100.0  # |bias| at most, as in the OpenAI API

_INTS = ("n", "top_k", "min_tokens")
_OPTIONAL_INTS = ("seed", "max_tokens", "logprobs")
_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
_BOOLS = ("ignore_eos", "skip_special_tokens")


@dataclass(frozen=True, slots=True)
class StructuredOutputParams:
    """A constraint on the text of a completion: exactly one of the fields is set.

    The sampler masks every token that cannot continue a text of the constraint (llm/engine/grammar.py), so a
    completion that ends with "stop" is a whole match; one cut by max_tokens is a prefix of one.

    Args:
        json_schema: the text is JSON valid against this schema (a dict).
        json_object: the text is any JSON object.
        regex: the text matches this regular expression (whole match).
        choice: the text is one of these strings.
        grammar: the text is a sentence of this Lark grammar (llguidance's dialect).
    """

    json_schema: dict | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [name for name in ("json_schema", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise InvalidRequestError(
                "structured output takes exactly one of json_schema, json_object, regex, choice, grammar; "
                f"got {', '.join(given) or 'none'}"
            )
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise InvalidRequestError("structured output json_schema must be a JSON object (a dict)")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise InvalidRequestError("structured output choice must be a non-empty list of non-empty strings")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequestError(f"structured output {name} must be a non-empty string")

    def key(self) -> str:
        """A string that is equal for equal constraints (the compiled-grammar cache key)."""
        return json.dumps([self.json_schema, self.json_object, self.regex, self.choice, self.grammar], sort_keys=True)


@dataclass(slots=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    Args:
        n: completions per prompt.
        temperature: 0 is greedy; otherwise logits are divided by it.
        top_k: keep the k most likely tokens (-1 or 0: all).
        top_p: keep the smallest set of tokens whose probability reaches top_p.
        min_p: drop tokens whose probability is below min_p times the most likely one's.
        repetition_penalty: > 1 discourages tokens seen in the prompt or output (1: off).
        presence_penalty: subtracted from the logit of every token already generated.
        frequency_penalty: subtracted once per occurrence of a token already generated.
        seed: makes sampling reproducible for this request (completion i uses seed + i).
        max_tokens: tokens to generate at most; None: up to the context length.
        min_tokens: EOS and stop token ids are masked until this many tokens exist.
        stop: strings that end the completion (not included in the text).
        stop_token_ids: token ids that end the completion (in addition to EOS).
        ignore_eos: keep generating after EOS.
        logprobs: return the log-probability of each sampled token and of the top `logprobs`
            alternatives (0: only the sampled token's); None: no logprobs.
        skip_special_tokens: leave special tokens out of the text.
        logit_bias: token id -> value in [-100, 100] added to that token's logit before sampling.
        structured_output: constrain the text to a JSON schema, JSON object, regex, choice or grammar.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] = field(default_factory=dict)
    structured_output: StructuredOutputParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [] if self.stop is None else self.stop
        self.stop_token_ids = [] if self.stop_token_ids is None else self.stop_token_ids
        _check_types(self)
        self.stop = [s for s in self.stop if s]
        self.stop_token_ids = list(self.stop_token_ids)
        if self.top_k == 0:
            self.top_k = -1
        checks = [
            (1 <= self.n <= MAX_N, f"n must be in [1, {MAX_N}], got {self.n}"),
            (0.0 <= self.temperature < math.inf, f"temperature must be a finite number >= 0, got {self.temperature}"),
            (self.top_k == -1 or 1 <= self.top_k <= MAX_INT32,
             f"top_k must be -1 (off) or in [1, {MAX_INT32}], got {self.top_k}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (0.0 < self.repetition_penalty < math.inf,
             f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}"),
            (-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (self.seed is None or 0 <= self.seed <= MAX_SEED, f"seed must be in [0, {MAX_SEED}], got {self.seed}"),
            (self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
             f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}"),
            (all(0 <= t <= MAX_INT32 for t in self.stop_token_ids),
             f"stop_token_ids must be token ids in [0, {MAX_INT32}]"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise InvalidRequestError(message)
        self._check_bias_and_structure()

    def _check_bias_and_structure(self) -> None:
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise InvalidRequestError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
        self.logit_bias = dict(self.logit_bias or {})
        for token, bias in self.logit_bias.items():
            if not _is_int(token) or not 0 <= token <= MAX_INT32:
                raise InvalidRequestError(f"logit_bias keys must be token ids in [0, {MAX_INT32}], got {token!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not abs(bias) <= MAX_LOGIT_BIAS:
                raise InvalidRequestError(
                    f"logit_bias values must lie in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias!r} for {token}"
                )
        if self.structured_output is None:
            return
        if not isinstance(self.structured_output, StructuredOutputParams):
            raise InvalidRequestError("structured_output must be a StructuredOutputParams")
        # the grammar ends the text with EOS: a request that hides or ignores EOS could never finish it
        if self.ignore_eos:
            raise InvalidRequestError("ignore_eos cannot be combined with structured output (the grammar ends on EOS)")
        if self.min_tokens:
            raise InvalidRequestError("min_tokens cannot be combined with structured output (the grammar decides "
                                      "where the text ends)")  # fmt: skip

    @property
    def greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW pick the most likely token: dividing logits by them overflows."""
        return self.temperature < GREEDY_BELOW

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_types(p: SamplingParams) -> None:
    """Every field has its type (bools are not numbers here): range checks and the sampler rely on it."""
    for name in _INTS + _OPTIONAL_INTS:
        value = getattr(p, name)
        if not (_is_int(value) or (value is None and name in _OPTIONAL_INTS)):
            raise InvalidRequestError(f"{name} must be an integer, got {value!r}")
    for name in _FLOATS:
        value = getattr(p, name)
        if not (_is_int(value) or isinstance(value, float)):
            raise InvalidRequestError(f"{name} must be a number, got {value!r}")
    for name in _BOOLS:
        if not isinstance(getattr(p, name), bool):
            raise InvalidRequestError(f"{name} must be true or false, got {getattr(p, name)!r}")
    if not isinstance(p.stop, (list, tuple)) or not all(isinstance(s, str) for s in p.stop):
        raise InvalidRequestError(f"stop must be a string or a list of strings, got {p.stop!r}")
    if not isinstance(p.stop_token_ids, (list, tuple)) or not all(_is_int(t) for t in p.stop_token_ids):
        raise InvalidRequestError(f"stop_token_ids must be a list of integers, got {p.stop_token_ids!r}")

"""What the engine returns: one `RequestOutput` per request, one `CompletionOutput` per completion (n)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# One entry per generated token: {token_id: logprob} with the sampled token first, then the top-n.
TokenLogprobs = dict[int, float]


class CompletionOutput:
    """One completion of a request.

    `text`/`token_ids`/`logprobs` are cumulative; `delta_text`/`delta_token_ids` hold what
    is new since the previous output of the same request (streaming).
    `finish_reason` is None while running, then "stop" (EOS, a stop token id or a stop
    string), "length" (max_tokens or the context length) or "abort".

    The engine builds one per running completion and step, with the cumulative fields as views
    (`CompletionOutput.view`): each is sliced from the completion's growing state when first
    read, so a step costs the same at token 4000 as at token 4. The fields are read-only.
    """

    __slots__ = ("index", "finish_reason", "stop_reason", "delta_text", "delta_token_ids", "_text", "_token_ids",
                 "_logprobs", "_lazy")  # fmt: skip

    def __init__(
        self,
        index: int,
        text: str = "",
        token_ids: list[int] | None = None,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
        logprobs: list[TokenLogprobs] | None = None,
        delta_text: str = "",
        delta_token_ids: list[int] | None = None,
    ) -> None:
        self.index = index
        self._text = text
        self._token_ids = [] if token_ids is None else token_ids
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self._logprobs = logprobs
        self.delta_text = delta_text
        self.delta_token_ids = [] if delta_token_ids is None else delta_token_ids
        self._lazy: tuple | None = None

    @classmethod
    def view(
        cls,
        index: int,
        text: tuple[Callable[[int], str], int],
        tokens: tuple[list, int, int],
        logprobs: tuple[list, int] | None,
        finish_reason: str | None,
        stop_reason: str | int | None,
        delta_text: str,
        delta_token_ids: list[int],
    ) -> CompletionOutput:
        """The cumulative fields as views read on first use: `text` is `text[0](text[1])` (the first text[1]
        characters), `token_ids` is `tokens[0][tokens[1] : tokens[2]]`, `logprobs` is `logprobs[0][: logprobs[1]]`.
        The sources may grow afterwards but must not change below those ends."""
        out = cls.__new__(cls)  # the engine's per-step path: the fields set once, here
        out.index, out.finish_reason, out.stop_reason = index, finish_reason, stop_reason
        out.delta_text, out.delta_token_ids = delta_text, delta_token_ids
        out._text = out._token_ids = out._logprobs = None
        out._lazy = (text, tokens, logprobs)
        return out

    def _materialize(self) -> None:
        (text, end), (tokens, lo, hi), logprobs = self._lazy
        self._text, self._token_ids = text(end), tokens[lo:hi]
        self._logprobs = None if logprobs is None else logprobs[0][: logprobs[1]]
        self._lazy = None

    @property
    def text(self) -> str:
        if self._lazy is not None:
            self._materialize()
        return self._text

    @property
    def token_ids(self) -> list[int]:
        if self._lazy is not None:
            self._materialize()
        return self._token_ids

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        if self._lazy is not None:
            self._materialize()
        return self._logprobs

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _fields(self) -> tuple:
        return (self.index, self.text, self.token_ids, self.finish_reason, self.stop_reason, self.logprobs,
                self.delta_text, self.delta_token_ids)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompletionOutput) and self._fields() == other._fields()

    __hash__ = None  # mutable, like the dataclass it replaces

    def __reduce__(self):
        """Pickled and copied with its fields read (a view would take the detokenizer and its tokenizer along)."""
        return type(self), self._fields()

    def __repr__(self) -> str:
        names = ("index", "text", "token_ids", "finish_reason", "stop_reason", "logprobs", "delta_text",
                 "delta_token_ids")  # fmt: skip
        return "CompletionOutput(" + ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True)) + ")"


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """When a request arrived, got its first token and finished (time.monotonic() seconds)."""

    arrival_time: float
    first_token_time: float | None
    finished_time: float

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float:
        return self.finished_time - self.arrival_time


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's load: sequences running and waiting, KV cache blocks in use (0..1), preemptions
    so far."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_preemptions: int


@dataclass(slots=True)
class RequestOutput:
    """The state of one request after an engine step (or at the end, from `LLM.generate`)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt: str | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None  # on the finished output only

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

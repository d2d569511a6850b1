"""What the engine returns: one `RequestOutput` per request, one `CompletionOutput` per completion (n)."""

from __future__ import annotations

from dataclasses import dataclass, field

# One entry per generated token: {token_id: logprob} with the sampled token first, then the top-n.
TokenLogprobs = dict[int, float]


@dataclass(slots=True)
class CompletionOutput:
    """One completion of a request.

    `text`/`token_ids`/`logprobs` are cumulative; `delta_text`/`delta_token_ids` hold what
    is new since the previous output of the same request (streaming).
    `finish_reason` is None while running, then "stop" (EOS, a stop token id or a stop
    string), "length" (max_tokens or the context length) or "abort".
    """

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprobs] | None = None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """The state of one request after an engine step (or at the end, from `LLM.generate`)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt: str | None = None
    num_cached_tokens: int = 0

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

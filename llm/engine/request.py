"""One request: its n sequences, their text and stop conditions, and the outputs it reports.

Stop rules, checked after each new token (stop ids, EOS and stop strings only
once `min_tokens` tokens exist): a stop token id or EOS (unless ignore_eos) ends
with "stop"; a stop string ends with "stop" and the text is cut before it;
max_tokens or the context length ends with "length". The detokenizer
(llm/detokenizer.py) holds back text that could still grow into a stop string
and never releases a partial UTF-8 character.
"""

from __future__ import annotations

import time

from vlchat.llm.detokenizer import IncrementalDetokenizer
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from vlchat.llm.sampling_params import SamplingParams

# Tokens an unstreamed completion without stop strings queues before it detokenizes them (Completion.deferred)
DEFERRED_TOKENS = 32


class Completion:
    """One sequence's text (through the incremental detokenizer) and how much of it was already reported."""

    def __init__(self, seq: Sequence, tokenizer, stream: bool = True) -> None:
        self.seq = seq
        params = seq.params
        # Not streamed and no stop string to look for: no step needs the text, so the tokens are detokenized in
        # bursts of DEFERRED_TOKENS (the detokenizer stays in cache: less host time, benchmarks/host_outputs.py and
        # docs/PERF.md#engine-and-host) and at the end. The first burst comes after 1..DEFERRED_TOKENS
        # tokens, by sequence id, so requests added together burst on different steps instead of all on one
        self.deferred = not stream and not any(params.stop)
        self.burst_at = 1 + seq.seq_id % DEFERRED_TOKENS
        self.detokenizer = IncrementalDetokenizer(
            tokenizer, seq.token_ids[: seq.num_prompt_tokens], stop=params.stop,
            skip_special_tokens=params.skip_special_tokens,
        )  # fmt: skip
        self.sent_text = 0
        self.sent_tokens = 0
        self.queued: list[tuple[int, bool]] = []  # (token id, may stop) appended but not detokenized yet
        self.flushed = False

    def append(self, token_id: int, eos_token_ids: set[int], max_model_len: int) -> None:
        """The cheap stop checks, right after sampling: stop ids, EOS, max_tokens, context length.
        The token's text and stop strings wait for `detokenize` (run while the next step computes)."""
        seq, params = self.seq, self.seq.params
        may_stop = seq.num_output_tokens >= params.min_tokens
        if may_stop and token_id in params.stop_token_ids:
            seq.finish("stop", token_id)  # the stop token's text is not part of the answer
        elif may_stop and token_id in eos_token_ids and not params.ignore_eos:
            seq.finish("stop", None)
        else:
            self.queued.append((token_id, may_stop))
            if (seq.max_tokens is not None and seq.num_output_tokens >= seq.max_tokens) or len(seq) >= max_model_len:
                seq.finish("length")

    def detokenize(self) -> bool:
        """Turn the appended tokens into text and check stop strings; True if a stop string ended the
        sequence here (it may already be scheduled for one more token, which the engine drops)."""
        seq, detokenizer, queued = self.seq, self.detokenizer, self.queued
        was_running = not seq.is_finished
        if was_running and self.deferred:
            if len(queued) < self.burst_at:
                return False
            self.burst_at = DEFERRED_TOKENS
        for token_id, may_stop in queued:
            detokenizer.add_token(token_id, may_stop)
            if detokenizer.stop_string is not None:
                seq.finish("stop", detokenizer.stop_string)  # a stop string wins over "length"
                break
        queued.clear()
        if seq.is_finished and not self.flushed:
            detokenizer.flush()  # release text held back for a stop string that never completed
            self.flushed = True
        return was_running and seq.is_finished

    def output(self, delta: bool) -> CompletionOutput:
        """This completion's output; only what is new since the last one is copied here (the cumulative fields are
        views of the growing text and tokens, llm/outputs.CompletionOutput.view)."""
        seq, detok = self.seq, self.detokenizer
        token_ids, released, prompt = seq.token_ids, detok.num_released, seq.num_prompt_tokens
        tokens = len(token_ids)
        out = CompletionOutput.view(  # by position: this runs for every running completion at every step
            seq.index,
            (detok.released_text, released),
            (token_ids, prompt, tokens),
            (seq.logprobs, len(seq.logprobs)) if seq.params.logprobs is not None else None,
            seq.finish_reason,
            seq.stop_reason,
            detok.released_text(released, self.sent_text) if delta else "",
            token_ids[prompt + self.sent_tokens : tokens] if delta else [],
        )
        self.sent_text, self.sent_tokens = released, tokens - prompt
        return out


class Request:
    def __init__(
        self,
        request_id: str,
        prompt: MultiModalPrompt,
        params: SamplingParams,
        seqs: list[Sequence],
        tokenizer,
        stream: bool = True,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.seqs = seqs
        self.stream = stream
        self.pending: list[Sequence] = []  # completions not handed to the scheduler yet (n > 1)
        self.completions = [Completion(s, tokenizer, stream) for s in seqs]
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None  # set by the engine when the first token is collected

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def output(self, delta: bool = True, finished: bool | None = None) -> RequestOutput:
        prompt = self.prompt
        finished = self.finished if finished is None else finished
        metrics = RequestMetrics(self.arrival_time, self.first_token_time, time.monotonic()) if finished else None
        return RequestOutput(  # request_id, prompt_token_ids, outputs, finished, prompt, num_cached_tokens, metrics
            self.request_id,
            prompt.token_ids,
            [c.output(delta) for c in self.completions],
            finished,
            prompt.text,
            self.seqs[0].num_cached_prompt_tokens,
            metrics,
        )

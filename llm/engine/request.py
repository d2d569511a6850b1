"""One request: its n sequences, their text and stop conditions, and the outputs it reports.

Stop rules, checked after each new token (EOS and stop ids only once
`min_tokens` tokens exist): a stop token id or EOS (unless ignore_eos) ends with
"stop"; a stop string ends with "stop" and the text is cut before it; max_tokens
or the context length ends with "length". Streamed text holds back a tail that
could still grow into a stop string, and never emits a partial UTF-8 character.
"""

from __future__ import annotations

from llm.engine.detokenizer import IncrementalDetokenizer
from llm.engine.sequence import Sequence
from llm.inputs import MultiModalPrompt
from llm.outputs import CompletionOutput, RequestOutput
from llm.sampling_params import SamplingParams


class Completion:
    """Text state of one sequence: the decoded text and how much of it was already reported."""

    def __init__(self, seq: Sequence, tokenizer) -> None:
        self.seq = seq
        self.detokenizer = IncrementalDetokenizer(tokenizer, seq.token_ids[: seq.num_prompt_tokens],
                                                  seq.params.skip_special_tokens)  # fmt: skip
        self.text = ""
        self.sent_text = 0
        self.sent_tokens = 0

    def add_token(self, token_id: int, eos_token_ids: set[int], max_model_len: int) -> None:
        seq, params = self.seq, self.seq.params
        piece = self.detokenizer.step(token_id)
        n_out = seq.num_output_tokens
        if n_out >= params.min_tokens:
            if token_id in params.stop_token_ids:
                seq.finish("stop", token_id)  # the stop token's text is not part of the answer
                return
            if token_id in eos_token_ids and not params.ignore_eos:
                seq.finish("stop", None)
                return
        self.text += piece
        if n_out >= params.min_tokens:
            if params.stop and self._cut_at_stop_string(len(piece)):
                return
        if (seq.max_tokens is not None and n_out >= seq.max_tokens) or len(seq) >= max_model_len:
            seq.finish("length")

    def _cut_at_stop_string(self, new_chars: int) -> bool:
        # only the new text (plus a stop string's length of the old) can hold a new match
        lookback = max(len(s) for s in self.seq.params.stop) + new_chars
        start = max(0, len(self.text) - lookback)
        hits = [(self.text.find(s, start), s) for s in self.seq.params.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            return False
        i, s = min(hits)
        self.text = self.text[:i]
        self.seq.finish("stop", s)
        return True

    def visible_text(self) -> str:
        """Text safe to report: when still running, minus a tail that may be the start of a stop string."""
        if self.seq.is_finished or not self.seq.params.stop:
            return self.text
        hold = 0
        for s in self.seq.params.stop:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        return self.text[: len(self.text) - hold]

    def output(self, delta: bool) -> CompletionOutput:
        seq = self.seq
        text = self.visible_text()
        token_ids = seq.output_token_ids
        out = CompletionOutput(
            index=seq.index,
            text=text,
            token_ids=token_ids,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
            delta_text=text[self.sent_text :] if delta else "",
            delta_token_ids=token_ids[self.sent_tokens :] if delta else [],
        )
        self.sent_text, self.sent_tokens = len(text), len(token_ids)
        return out


class Request:
    def __init__(
        self,
        request_id: str,
        prompt: MultiModalPrompt,
        params: SamplingParams,
        seqs: list[Sequence],
        tokenizer,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.seqs = seqs
        self.completions = [Completion(s, tokenizer) for s in seqs]

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def output(self, delta: bool = True) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt.token_ids),
            outputs=[c.output(delta) for c in self.completions],
            finished=self.finished,
            prompt=self.prompt.text,
            num_cached_tokens=self.seqs[0].num_cached_prompt_tokens,
        )

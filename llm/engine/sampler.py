"""Next-token selection for a batch of rows, vectorized over the batch.

Order per row: penalties (repetition over prompt + output, presence and frequency
over the output), logit_bias, min_tokens masking of EOS/stop ids, the grammar mask of
structured-output rows (tokens the row's grammar cannot take next), then either argmax
(temperature 0) or temperature, top-k, top-p, min-p and a draw. The draw is
argmax(probs / E) with E ~ Exp(1), which samples from probs; rows with a seed take
E from their own generator, seeded afresh for each token from (seed, completion index,
position), so a step that is retried (llm/engine/isolation.py) or a sequence that is
recomputed draws the same token again; the other rows take E from the engine's generator. Logprobs are those of
the model's distribution (log-softmax of the raw logits), sampled token first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlchat.llm.engine.grammar import BitmaskFiller, bitmask_words, unpack_bitmask
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.engine.transfer import padded_rows, to_device


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


class Sampler:
    def __init__(self, eos_token_ids: list[int], vocab_size: int, device: torch.device, seed: int = 0) -> None:
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = vocab_size
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.bitmasks = BitmaskFiller()

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        return self.sample(logits, seqs).result()

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> PendingSample:
        """Queue the sampling of one token per row on the device; `.result()` waits for it."""
        # logits: [rows, vocab] fp32, one row per sequence of `seqs`
        logits = logits[:, : self.vocab_size].float()
        params = [s.params for s in seqs]
        want_logprobs = any(p.logprobs is not None for p in params)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        if any(p.uses_penalties for p in params):
            logits = self._apply_penalties(logits.clone(), seqs)
        if any(p.logit_bias for p in params):
            logits = self._apply_logit_bias(logits, seqs)
        logits = self._mask_early_stops(logits, seqs)
        if any(s.grammar is not None for s in seqs):
            logits = self._apply_grammars(logits, seqs)
        tokens = logits.argmax(dim=-1)
        if not all(p.greedy for p in params):
            greedy = to_device([p.greedy for p in params], torch.bool, logits.device)
            tokens = torch.where(greedy, tokens, self._draw(logits, seqs))
        return PendingSample(tokens, raw_logprobs, params)

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows, vocab = logits.shape
        dev = logits.device
        # [rows, max_out], pad = vocab
        # the rows from each sequence's int32 copy of its tokens: reading the lists costs O(tokens) per step on the host
        tokens = [s.token_array() for s in seqs]
        out_ids = to_device(padded_rows([t[s.num_prompt_tokens :] for t, s in zip(tokens, seqs, strict=True)], vocab),
                            torch.long, dev)  # fmt: skip
        ones = torch.ones_like(out_ids, dtype=torch.float)
        counts = torch.zeros(rows, vocab + 1, device=dev).scatter_add_(1, out_ids, ones)[:, :vocab]  # [rows, vocab]
        prompts = padded_rows([t[: s.num_prompt_tokens] for t, s in zip(tokens, seqs, strict=True)], vocab)
        prompt_ids = to_device(prompts, torch.long, dev)
        seen = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=dev).scatter_(1, prompt_ids, True)[:, :vocab]
        seen |= counts > 0
        rep = to_device([s.params.repetition_penalty for s in seqs], torch.float, dev).unsqueeze(1)
        pres = to_device([s.params.presence_penalty for s in seqs], torch.float, dev).unsqueeze(1)
        freq = to_device([s.params.frequency_penalty for s in seqs], torch.float, dev).unsqueeze(1)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
        return logits - freq * counts - pres * (counts > 0).float()

    @staticmethod
    def _apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        dev = logits.device
        rows, tokens, values = [], [], []
        for i, s in enumerate(seqs):
            for token, bias in s.params.logit_bias.items():
                rows.append(i)
                tokens.append(token)
                values.append(bias)
        index = (to_device(rows, torch.long, dev), to_device(tokens, torch.long, dev))
        return logits.index_put(index, to_device(values, torch.float, dev), accumulate=True)

    def _apply_grammars(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """-inf on the tokens each constrained row's grammar cannot take next; the other rows are not touched
        (only the constrained rows' masks travel to the device)."""
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
        words = bitmask_words(logits.shape[1])
        host = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=logits.is_cuda)
        self.bitmasks.fill([seqs[i].grammar for i in rows], host)
        allowed = unpack_bitmask(host.to(logits.device, non_blocking=True), logits.shape[1])  # [len(rows), vocab]
        index = to_device(rows, torch.long, logits.device)
        masked = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))
        return logits.index_copy(0, index, masked)

    def _mask_early_stops(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        early = [i for i, s in enumerate(seqs) if s.num_output_tokens < s.params.min_tokens]
        if not early:
            return logits
        logits = logits.clone()
        for i in early:
            stops = set(seqs[i].params.stop_token_ids)
            if not seqs[i].params.ignore_eos:
                stops.update(self.eos_token_ids)
            ids = [t for t in stops if t < logits.shape[1]]
            if ids:
                logits[i, to_device(ids, torch.long, logits.device)] = float("-inf")
        return logits

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows, vocab = logits.shape
        dev = logits.device
        params = [s.params for s in seqs]
        temp = to_device([p.temperature if p.temperature > 0 else 1.0 for p in params], torch.float, dev)
        logits = logits / temp.unsqueeze(1)
        top_k = [p.top_k if p.top_k > 0 else vocab for p in params]
        top_p = [p.top_p for p in params]
        if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
            logits = self._top_k_top_p(logits, top_k, top_p)
        probs = torch.softmax(logits, dim=-1)  # [rows, vocab]
        if any(p.min_p > 0 for p in params):  # decided on the host: no device sync
            min_p = to_device([p.min_p for p in params], torch.float, dev)
            probs = probs.masked_fill(probs < min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True), 0.0)
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, seq in enumerate(seqs):
            if seq.params.seed is not None:
                if seq.generator is None or seq.generator.device != dev:
                    seq.generator = torch.Generator(device=dev)
                seq.generator.manual_seed(row_seed(seq.params.seed, seq.index, seq.num_output_tokens + seq.num_pending))
                noise[i].exponential_(generator=seq.generator)
        return (probs / noise).argmax(dim=-1)

    @staticmethod
    def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
        rows, vocab = logits.shape
        dev = logits.device
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # [rows, vocab]
        ranks = torch.arange(vocab, device=dev).unsqueeze(0)
        sorted_logits = sorted_logits.masked_fill(
            ranks >= to_device(top_k, torch.long, dev).unsqueeze(1), float("-inf")
        )
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability mass ranked above each token
        p = to_device(top_p, torch.float, dev).unsqueeze(1)
        drop = (before >= p) & (p < 1.0)  # top_p = 1 keeps all (rounding can push the cumsum to 1 early)
        drop[:, 0] = False  # the most likely token always stays
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def row_seed(seed: int, index: int, position: int) -> int:
    """The 64-bit generator seed of one seeded row's draw (splitmix64 of its seed, completion index and position)."""
    x = (seed + index * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return x ^ (x >> 31)


class PendingSample:
    """Sampled tokens still on the device: the engine does host work while the GPU finishes.

    Everything the host will read (token ids; with logprobs, the chosen token's and the top-n) is
    computed and copied to pinned host memory here, behind one event: `result()` waits for this
    step only. A plain `.tolist()` there would queue its copy behind whatever was launched since,
    and with async scheduling that is the whole next step.
    """

    def __init__(self, tokens: torch.Tensor | None, raw_logprobs: torch.Tensor | None, params: list) -> None:
        self.tokens, self.params = tokens, params  # `tokens` stays on the device: the next step may read it
        self._host: list[torch.Tensor] = []
        self._event = None
        if tokens is None:
            return
        device_parts = [tokens]
        if raw_logprobs is not None:
            top_n = max(p.logprobs or 0 for p in params)
            top_vals, top_ids = raw_logprobs.topk(top_n, dim=-1)  # [rows, top_n]
            device_parts += [raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1), top_vals, top_ids]
        if tokens.is_cuda:
            self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in device_parts]
            for host, dev in zip(self._host, device_parts, strict=True):
                host.copy_(dev, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = device_parts

    def done(self) -> bool:
        """The tokens (and logprobs) are on the host: `result()` will not wait."""
        return self._event is None or self._event.query()

    def result(self) -> SamplerOutput:
        if self.tokens is None:
            return SamplerOutput([], [])
        if self._event is not None:
            self._event.synchronize()  # this step's copies only
        token_list = self._host[0].tolist()
        if len(self._host) == 1:
            return SamplerOutput(token_list, [None] * len(self.params))
        chosen, top_vals, top_ids = (t.tolist() for t in self._host[1:])
        return SamplerOutput(token_list, _logprobs(token_list, chosen, top_vals, top_ids, self.params))


def _logprobs(token_list: list[int], chosen: list[float], top_vals: list, top_ids: list, params) -> list:
    out: list[dict[int, float] | None] = []
    for i, p in enumerate(params):
        if p.logprobs is None:
            out.append(None)
            continue
        entry = {token_list[i]: chosen[i]}
        for tid, val in zip(top_ids[i][: p.logprobs], top_vals[i][: p.logprobs], strict=True):
            entry.setdefault(tid, val)
        out.append(entry)
    return out

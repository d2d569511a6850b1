"""Continuous batching policy: which sequences run this step, and how many tokens each brings.

Plain Python, no tensors. Each step has a token budget (`max_num_batched_tokens`):
1. running sequences first, oldest first: a decoding sequence brings 1 token, a
   sequence in the middle of a chunked prefill brings the rest of its prompt up to
   what is left of the budget. When the KV pool has no block for a sequence, the
   newest running sequence is preempted (blocks freed, recomputed later from its
   tokens; greedy output does not change), until the sequence fits or is itself
   the one preempted;
2. then waiting sequences (preempted ones first, then arrivals in order), while the
   budget, `max_num_seqs` and free blocks allow; a cached prefix is reused and the
   rest of the prompt is chunked into what is left of the budget.
Prefill chunks and decodes share one forward pass.

Prefill hold (`prefill_delay_steps` > 0): when step 1 scheduled only decodes, waiting
sequences are admitted only once the oldest has waited that many steps or together
they bring `prefill_batch_tokens` tokens, so that several prompts share one (eager,
slower) mixed step instead of each turning a graph-replayed decode step into one.
With nothing decoding, or a prefill already in the step, they are admitted at once.
"""

from __future__ import annotations

from collections import deque

from vlchat.llm.config import SchedulerConfig
from vlchat.llm.engine.block_manager import BlockManager
from vlchat.llm.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked_prefill = config.enable_chunked_prefill
        self.prefill_delay_steps = config.prefill_delay_steps or 0  # None: left to the engine, which sets it
        self.prefill_batch_tokens = config.prefill_batch_tokens or max(1, self.max_num_batched_tokens // 4)
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_steps = 0

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        seq.waiting_since = self.num_steps

    def _hold_prefills(self, scheduled: list[Sequence]) -> bool:
        """True when this step decodes only and the waiting prompts should wait for company (module doc)."""
        if not self.prefill_delay_steps or not scheduled or any(s.num_new_tokens > 1 for s in scheduled):
            return False
        oldest = min(s.waiting_since for s in self.waiting)
        if self.num_steps - oldest >= self.prefill_delay_steps:
            return False
        tokens = 0
        for s in self.waiting:
            tokens += len(s) - s.num_computed_tokens
            if tokens >= self.prefill_batch_tokens:
                return False
        return True

    def schedule(self) -> list[Sequence]:
        """Pick this step's sequences and set their `num_new_tokens` (and blocks)."""
        self.num_steps += 1
        budget = self.max_num_batched_tokens
        scheduled: list[Sequence] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_pending and not self._can_run_ahead(seq):
                i += 1
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            target = seq.num_computed_tokens + num_new
            while not self.block_manager.can_allocate(seq, target):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                break
            self.block_manager.allocate(seq, target)
            seq.num_new_tokens = num_new
            scheduled.append(seq)
            budget -= num_new
            i += 1
        hold = bool(self.waiting) and self._hold_prefills(scheduled)
        while self.waiting and not (preempted or hold) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_pending:
                break  # preempted with a token in flight: admitted once it arrives
            prefix = self.block_manager.match_prefix(seq)
            num_computed = len(prefix) * self.block_manager.block_size
            remaining = len(seq) - num_computed
            if remaining > budget and not self.chunked_prefill:
                break
            num_new = min(remaining, budget)
            if not self.block_manager.can_allocate(seq, num_computed + num_new, prefix):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq, num_computed + num_new, prefix)
            if seq.num_output_tokens == 0:
                seq.num_cached_prompt_tokens = num_computed
            seq.status = SequenceStatus.RUNNING
            seq.num_new_tokens = num_new
            self.running.append(seq)
            scheduled.append(seq)
            budget -= num_new
        # one-token sequences (decodes) first: attention runs them on the split-k decode kernel
        scheduled.sort(key=lambda s: s.num_new_tokens > 1)
        return scheduled

    @staticmethod
    def _can_run_ahead(seq: Sequence) -> bool:
        """A sequence whose last token is still on the device may run its next step now, unless that token
        surely ends it (max_tokens) or its sampling reads the output history (penalties, min_tokens)."""
        sampled = seq.num_output_tokens + seq.num_pending
        if seq.max_tokens is not None and sampled >= seq.max_tokens:
            return False
        return not (seq.params.uses_penalties or sampled <= seq.params.min_tokens)

    def update(self, scheduled: list[Sequence]) -> None:
        """After the forward pass: the scheduled tokens' K/V is in the cache."""
        for seq in scheduled:
            if seq.is_finished:
                continue  # ended (aborted, stopped) while its step was in flight; its blocks are freed
            seq.num_computed_tokens += seq.num_new_tokens
            seq.num_new_tokens = 0
            self.block_manager.cache_full_blocks(seq)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        seq.waiting_since = self.num_steps
        self.num_preemptions += 1

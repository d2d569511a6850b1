"""What the scheduler and tensor-parallel workers send each other, and the workers' copies of the sequences.

Each worker keeps a `SequenceMirror`: a `Sequence` per running sequence id that,
when a step arrives, equals the scheduler's sequence at the moment it launched
that step (tokens, block table, progress), so every worker's `ModelRunner` builds
the same batch and samples the same tokens as one process would. A `StepMessage`
carries only what changed: a sequence's prompt and sampling parameters once, then
the tokens and blocks appended since (the whole table after a preemption replaced
it), and the ids of sequences that finished since the last step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.sampling_params import SamplingParams


@dataclass(slots=True)
class SeqInit:
    request_id: str
    prompt: MultiModalPrompt
    params: SamplingParams
    index: int
    max_tokens: int | None


@dataclass(slots=True)
class SeqDelta:
    seq_id: int
    init: SeqInit | None  # the first step that schedules the sequence
    tokens: list[int]  # appended to token_ids since the last step that scheduled it
    blocks: list[int]  # appended to block_table, or the whole table when table_reset
    table_reset: bool
    num_computed_tokens: int
    num_new_tokens: int
    num_pending: int


@dataclass(slots=True)
class StepMessage:
    rows: list[SeqDelta]
    finished: list[int] = field(default_factory=list)  # sequence ids the workers drop


class _Sent:
    __slots__ = ("seq", "tokens", "table", "blocks")

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.tokens = seq.num_prompt_tokens  # token_ids entries the workers have
        self.table: list[int] | None = None  # the block_table list the workers copied...
        self.blocks = 0  # ...and how many of its entries


class StepEncoder:
    """Scheduler side: the StepMessage of each launched step (it remembers what each worker has)."""

    def __init__(self) -> None:
        self._sent: dict[int, _Sent] = {}

    def encode(self, seqs: list[Sequence]) -> StepMessage:
        finished = [sid for sid, sent in self._sent.items() if sent.seq.is_finished]
        for sid in finished:
            del self._sent[sid]
        return StepMessage([self._delta(seq) for seq in seqs], finished)

    def _delta(self, seq: Sequence) -> SeqDelta:
        sent = self._sent.get(seq.seq_id)
        init = None
        if sent is None:
            sent = self._sent[seq.seq_id] = _Sent(seq)
            init = SeqInit(seq.request_id, seq.prompt, seq.params, seq.index, seq.max_tokens)
        tokens = seq.token_ids[sent.tokens :]
        sent.tokens = len(seq.token_ids)
        table = seq.block_table
        reset = table is not sent.table or len(table) < sent.blocks  # a preemption gives the sequence a new list
        blocks = list(table) if reset else table[sent.blocks :]
        sent.table, sent.blocks = table, len(table)
        return SeqDelta(seq.seq_id, init, tokens, blocks, reset, seq.num_computed_tokens, seq.num_new_tokens,
                        seq.num_pending)  # fmt: skip


class SequenceMirror:
    """Worker side: applies a StepMessage to its sequences and returns the step's, in the scheduler's order."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.seqs: dict[int, Sequence] = {}

    def apply(self, message: StepMessage) -> list[Sequence]:
        for sid in message.finished:
            self.seqs.pop(sid, None)
        out = []
        for row in message.rows:
            if row.init is not None:
                i = row.init
                seq = Sequence(i.request_id, i.prompt, i.params, self.block_size, i.index, i.max_tokens)
                seq.seq_id = row.seq_id
                self.seqs[row.seq_id] = seq
            seq = self.seqs[row.seq_id]
            seq.token_ids.extend(row.tokens)
            if row.table_reset:
                seq.block_table = list(row.blocks)
            else:
                seq.block_table.extend(row.blocks)
            seq.num_computed_tokens, seq.num_new_tokens = row.num_computed_tokens, row.num_new_tokens
            seq.num_pending = row.num_pending
            out.append(seq)
        return out


@dataclass(slots=True)
class RunnerInfo:
    """What the scheduler needs to know of a rank's runner (all ranks agree on num_blocks)."""

    device_type: str
    dtype: torch.dtype
    num_blocks: int
    block_nbytes: int  # one KV block of one layer's keys on this rank
    graphs: bool
    rope_tracks_length: bool

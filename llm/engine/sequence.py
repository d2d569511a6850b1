"""One sequence being generated: its tokens, KV blocks, progress and sampling state.

A request with n completions owns n sequences (`index` 0..n-1); they share the
prompt's KV blocks through the prefix cache. Plain Python, no device tensors.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import struct

import numpy as np
import torch

from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.sampling_params import SamplingParams


class GrowingListCopy:
    """An int32 array copy of a list that only grows by appends or is replaced by another list (a sequence's tokens
    and block table), kept up to date by copying only what was appended since the last call: per-step batch tables
    built from the lists themselves cost O(context) per sequence and step (milliseconds at batch 128:
    docs/PERF.md#engine-and-host)."""

    __slots__ = ("array", "src", "synced")

    def __init__(self) -> None:
        self.array = np.empty(0, dtype=np.int32)
        self.src: list[int] | None = None  # the list copied
        self.synced = 0  # how many of its entries the array holds

    def of(self, values: list[int]) -> np.ndarray:
        """The array of `values` (a view that later calls may overwrite: copy it before `values` changes)."""
        n = len(values)
        if values is not self.src or n < self.synced:
            self.src, self.synced = values, 0
        if n > self.array.shape[0]:
            grown = np.empty(max(16, 2 * n), dtype=np.int32)
            grown[: self.synced] = self.array[: self.synced]
            self.array = grown
        if n > self.synced:
            self.array[self.synced : n] = values[self.synced : n]
            self.synced = n
        return self.array[:n]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    _ids = itertools.count()

    def __init__(
        self,
        request_id: str,
        prompt: MultiModalPrompt,
        params: SamplingParams,
        block_size: int,
        index: int = 0,
        max_tokens: int | None = None,
    ) -> None:
        self.seq_id = next(Sequence._ids)
        self.request_id = request_id
        self.index = index
        self.prompt = prompt
        self.params = params
        self.block_size = block_size
        self.max_tokens = max_tokens if max_tokens is not None else params.max_tokens
        self.token_ids: list[int] = list(prompt.token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0  # tokens whose K/V is in the cache
        self.num_cached_prompt_tokens = 0  # of those, how many came from the prefix cache
        self.num_new_tokens = 0  # tokens scheduled this step
        # tokens sampled by launched steps that have not reached the host yet: 0 or 1 between steps, 2 for the
        # moment between launching a step ahead (async scheduling) and collecting the previous step's token
        self.num_pending = 0
        self.waiting_since = 0  # the scheduler's step count when it last entered the waiting queue
        self.num_hashed_blocks = 0  # leading blocks registered in the prefix cache
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.logprobs: list[dict[int, float]] = []
        self.generator: torch.Generator | None = None  # the sampler creates it for seeded requests
        # llguidance matcher of a structured-output request (llm/engine/grammar.py): it has consumed the output tokens
        self.grammar = None
        self._block_hashes: list[bytes] = []
        self._table_copy = GrowingListCopy()  # block_table_array
        self._token_copy = GrowingListCopy()  # token_array

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens of the sequence including the one still on the device (async scheduling)."""
        return len(self.token_ids) + self.num_pending

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_blocks_needed(self) -> int:
        """Blocks that hold the K/V of every token after this step's tokens are computed."""
        return -(-(self.num_computed_tokens + self.num_new_tokens) // self.block_size)

    @property
    def samples_this_step(self) -> bool:
        """The scheduled tokens reach the end of the sequence, so its last row yields a new token."""
        return self.num_computed_tokens + self.num_new_tokens == self.num_tokens

    def append_token(self, token_id: int, logprobs: dict[int, float] | None = None) -> None:
        self.token_ids.append(token_id)
        self.num_pending = max(0, self.num_pending - 1)
        if logprobs is not None:
            self.logprobs.append(logprobs)

    def block_table_array(self) -> np.ndarray:
        """`block_table` as an int32 array (the runner's batch tables): a step's tables cost the same at 100k tokens
        as at 100 (llm/engine/transfer.padded_rows copies the rows). A view that later calls may overwrite."""
        return self._table_copy.of(self.block_table)

    def token_array(self) -> np.ndarray:
        """`token_ids` (prompt and output) as an int32 array (the sampler's penalty tables), like block_table_array."""
        return self._token_copy.of(self.token_ids)

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def block_hash(self, i: int) -> bytes:
        """Chained content hash of full block i: previous block's hash, its token ids, its images."""
        while len(self._block_hashes) <= i:
            j = len(self._block_hashes)
            lo, hi = j * self.block_size, (j + 1) * self.block_size
            assert hi <= len(self.token_ids), "only full blocks have a hash"
            h = hashlib.blake2b(self._block_hashes[-1] if j else b"", digest_size=16)
            h.update(struct.pack(f"<{self.block_size}q", *self.token_ids[lo:hi]))
            for item in self.prompt.images:
                if item.offset < hi and item.end > lo:
                    h.update(item.hash.encode())
                    h.update(struct.pack("<q", item.offset))
            self._block_hashes.append(h.digest())
        return self._block_hashes[i]

    def reset_for_recompute(self) -> None:
        """After preemption: drop the KV state; the tokens (prompt + output so far) are recomputed later."""
        self.status = SequenceStatus.WAITING
        self.block_table = []
        self.num_computed_tokens = 0
        self.num_new_tokens = 0
        self.num_hashed_blocks = 0

"""The per-step attention metadata that every attention layer reads.

Owner: the model runner builds one `AttentionMetadata` per forward step, calls
`set_context(meta)` before `model(input_ids, positions)` and `reset_context()`
after it. `llm/layers/attention.py` reads it with `get_context()`. Keeping the
batch description out of the forward signature is what keeps
`model(input_ids, positions)` capturable in a CUDA graph: under capture the
runner sets a metadata object whose tensors are the graph's static buffers.

Device: every tensor lives on the model's device (GPU, or CPU for tests);
the plain ints and bools are host values.

Two kinds of step:
- prefill (`is_prefill=True`): any step in which some sequence brings more than
  one new token (first prefill, a chunk of a chunked prefill, a prefill after a
  prefix-cache hit, or such chunks mixed with decodes). Uses `cu_seqlens_q`,
  `max_seqlen_q`, `seq_lens`, `block_tables`. The scheduler puts one-token
  sequences first; the first `num_decode_seqs` of them go through
  `paged_decode_attention` (split-k over their KV) and the rest through
  `paged_prefill_attention` (whose query tiles would be 1/16 full for a decode row).
- decode (`is_prefill=False`): every sequence brings exactly one token.
  Uses `seq_lens`, `block_tables`, `num_splits`, `decode_config` through `paged_decode_attention`.

In both, the new tokens' K/V are first written into the paged cache at
`slot_mapping`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from vlchat.kernels.attention.configs import DecodeConfig, WsDecodeConfig

# (split count, kernel config) of decode attention, as kernels.attention.plan.decode_plan returns it
DecodePlan = tuple[int | None, DecodeConfig | WsDecodeConfig | None]


@dataclass(slots=True)
class AttentionMetadata:
    """What attention needs to know about one forward step (see the module docstring).

    Args:
        is_prefill: True when any sequence brings more than one token this step.
        slot_mapping: [tokens] int64, slot = block_id * block_size + offset of each new token's K/V;
            a negative slot is skipped (padding rows of a CUDA graph batch).
        block_tables: [batch, max_blocks] int32, the physical blocks of each sequence (pad with -1 or 0).
        seq_lens: [batch] int32, KV length of each sequence after this step (cached prefix + new tokens).
        cu_seqlens_q: [batch + 1] int32, prefix sums of new tokens per sequence (prefill only).
        max_seqlen_q: the largest number of new tokens of one sequence (prefill only).
        max_seqlen_k: the largest `seq_lens` value (host int; kernels may use it to size their grid).
        num_splits: split-k count of the decode rows (all rows of a decode step, the leading one-token rows of
            a mixed step); None lets the kernel choose (fix it under CUDA graphs).
        decode_config: the kernel config `num_splits` was planned for (kernels.attention.plan.decode_plan);
            None lets the kernel derive it from the split count and the block table.
        num_decode_seqs: in a prefill step, how many leading sequences bring exactly one token.
    """

    is_prefill: bool
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor | None = None
    max_seqlen_q: int = 1
    max_seqlen_k: int = 0
    num_splits: int | None = None
    decode_config: DecodeConfig | WsDecodeConfig | None = None
    num_decode_seqs: int = 0
    # derived in __post_init__ for a mixed step: the prefill sequences' cu_seqlens_q (rebased to 0), seq_lens
    # and block tables, as fresh tensors: a slice at an odd row would give the kernels a pointer of another
    # alignment, and Triton compiles a new variant for it in the middle of serving
    prefill_cu_seqlens_q: torch.Tensor | None = None
    prefill_seq_lens: torch.Tensor | None = None
    prefill_block_tables: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.slot_mapping.dim() != 1:
            raise ValueError(f"slot_mapping must be [tokens], got shape {tuple(self.slot_mapping.shape)}")
        if self.block_tables.dim() != 2:
            raise ValueError(f"block_tables must be [batch, max_blocks], got shape {tuple(self.block_tables.shape)}")
        if self.seq_lens.dim() != 1 or self.seq_lens.shape[0] != self.block_tables.shape[0]:
            raise ValueError("seq_lens must be [batch] with the same batch as block_tables")
        if self.is_prefill:
            if self.cu_seqlens_q is None or self.cu_seqlens_q.shape[0] != self.seq_lens.shape[0] + 1:
                raise ValueError("a prefill step needs cu_seqlens_q of shape [batch + 1]")
            if self.max_seqlen_q < 1:
                raise ValueError("max_seqlen_q must be >= 1 for a prefill step")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits must be None or >= 1, got {self.num_splits}")
        if not 0 <= self.num_decode_seqs <= self.batch_size or (self.num_decode_seqs and not self.is_prefill):
            raise ValueError(f"num_decode_seqs={self.num_decode_seqs} must be in [0, batch] and only in a prefill step")
        if self.num_decode_seqs == self.batch_size:
            self.num_decode_seqs = 0  # all one-token rows: nothing to split (the step could have been a decode)
        if self.num_decode_seqs:
            nd = self.num_decode_seqs
            self.prefill_cu_seqlens_q = self.cu_seqlens_q[nd:] - nd
            self.prefill_seq_lens = self.seq_lens[nd:].clone()
            self.prefill_block_tables = self.block_tables[nd:].clone()

    @property
    def batch_size(self) -> int:
        return self.seq_lens.shape[0]


class _ContextHolder:
    """Holds the metadata of the step being run; one per process."""

    __slots__ = ("metadata",)

    def __init__(self) -> None:
        self.metadata: AttentionMetadata | None = None


_HOLDER = _ContextHolder()


def set_context(metadata: AttentionMetadata) -> None:
    _HOLDER.metadata = metadata


def get_context() -> AttentionMetadata | None:
    """The metadata of the current step, or None outside a runner step (e.g. a profiling pass)."""
    return _HOLDER.metadata


def reset_context() -> None:
    _HOLDER.metadata = None


@contextmanager
def use_context(metadata: AttentionMetadata) -> Iterator[AttentionMetadata]:
    """Set the metadata for the duration of a `with` block and reset it afterwards."""
    set_context(metadata)
    try:
        yield metadata
    finally:
        reset_context()

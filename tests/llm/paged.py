"""A minimal hand-driven paged KV cache for model tests: no scheduler, no engine.

`PagedCache(model)` gives every attention layer a `(k_cache, v_cache)` pair,
hands out blocks per sequence (in descending order, so tables are not the
identity), and `step(model, batch)` runs one forward over `[(seq_id, new_ids)]`
with the `AttentionMetadata` the model runner would build, returning the
logits of every new token. `check_chunked_prefill_then_decode` runs the
chunked-prefill-then-decode check the decoder families share on it.
"""

from __future__ import annotations

import torch

from tests.llm.tiny import rel_err
from vlchat.llm.engine.context import AttentionMetadata, use_context
from vlchat.llm.engine.transfer import padded_rows
from vlchat.llm.layers.attention import Attention


class PagedCache:
    def __init__(self, model, num_blocks: int = 64, block_size: int = 4, dtype=torch.float32) -> None:
        self.block_size = block_size
        for layer in attention_layers(model):
            shape = (num_blocks, block_size, layer.num_kv_heads, layer.head_dim)
            layer.kv_cache = (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
        self.free = list(range(num_blocks))
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def _slots(self, seq_id: int, count: int) -> list[int]:
        table = self.tables.setdefault(seq_id, [])
        start = self.lens.get(seq_id, 0)
        slots = []
        for pos in range(start, start + count):
            if pos // self.block_size >= len(table):
                table.append(self.free.pop())
            slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
        self.lens[seq_id] = start + count
        return slots

    def metadata(self, batch: list[tuple[int, list[int]]]) -> tuple[AttentionMetadata, torch.Tensor]:
        positions, slots, cu = [], [], [0]
        for seq_id, new_ids in batch:
            start = self.lens.get(seq_id, 0)
            positions += range(start, start + len(new_ids))
            slots += self._slots(seq_id, len(new_ids))
            cu.append(cu[-1] + len(new_ids))
        seq_lens = [self.lens[s] for s, _ in batch]
        is_prefill = any(len(ids) > 1 for _, ids in batch)
        meta = AttentionMetadata(
            is_prefill=is_prefill,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            # torch.tensor, not from_numpy: it follows a `with torch.device(...)` block as the other fields do
            block_tables=torch.tensor(padded_rows([self.tables[s] for s, _ in batch])),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
            max_seqlen_q=max(len(ids) for _, ids in batch),
            max_seqlen_k=max(seq_lens),
        )
        return meta, torch.tensor(positions, dtype=torch.int64)

    @torch.no_grad()
    def step(self, model, batch: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Logits [new tokens, vocab] of one forward over the new tokens of each sequence in `batch`."""
        meta, positions = self.metadata(batch)
        input_ids = torch.tensor([t for _, ids in batch for t in ids], dtype=torch.int64)
        with use_context(meta):
            hidden = model(input_ids, positions)
        return model.compute_logits(hidden)

    def greedy(self, model, seq_id: int, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Prefill `prompt`, then decode one token per step; the argmax tokens."""
        out = [int(self.step(model, [(seq_id, prompt)])[-1].argmax())]
        while len(out) < max_new_tokens:
            out.append(int(self.step(model, [(seq_id, [out[-1]])])[-1].argmax()))
        return out


@torch.no_grad()
def check_chunked_prefill_then_decode(model, hf, prompt: list[int], rtol: float, name: str) -> None:
    """One step holds a sequence's second prefill chunk (over its cached first chunk) and another's whole
    prompt, the next a pure decode step of both; each sequence's last logits match transformers'."""

    def hf_last(ids):
        return hf(torch.tensor([ids])).logits[0, -1]

    a, b, first_chunk = prompt, prompt[::-1][:13], 7
    cache = PagedCache(model)
    cache.step(model, [(0, a[:first_chunk])])
    logits = cache.step(model, [(0, a[first_chunk:]), (1, b)])  # [len(a) - first_chunk + len(b), vocab]
    last_a = len(a) - first_chunk - 1
    assert rel_err(logits[last_a], hf_last(a)) < rtol, name
    assert rel_err(logits[-1], hf_last(b)) < rtol, name
    next_a, next_b = int(logits[last_a].argmax()), int(logits[-1].argmax())
    decoded = cache.step(model, [(0, [next_a]), (1, [next_b])])
    assert rel_err(decoded[0], hf_last(a + [next_a])) < rtol, name
    assert rel_err(decoded[1], hf_last(b + [next_b])) < rtol, name


def attention_layers(model) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]

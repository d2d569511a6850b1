"""The attention layer's prefill step: with decodes riding along, the decode rows run on the decode kernel and
the rest on the prefill kernel, equal to running every row through the prefill kernel; and the prefill kernel
reading the chunk's own K/V rows (the prefix from the pages) agrees with the pages-only reference."""

import dataclasses

import pytest
import torch

from tests.kernels.attention_helpers import DEV
from vlchat.kernels import settings
from vlchat.llm.engine.context import AttentionMetadata, use_context
from vlchat.llm.engine.transfer import padded_rows
from vlchat.llm.layers.attention import Attention


def _step(num_decodes: int, prompt_lens: list[int], window: int | None, seed: int):
    g = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim, bs, blocks = 4, 2, 32, 4, 64
    attn = Attention(heads, dim, dim**-0.5, kv_heads, sliding_window=window)
    shape = (blocks, bs, kv_heads, dim)
    attn.kv_cache = (torch.randn(shape, generator=g).to(DEV), torch.randn(shape, generator=g).to(DEV))
    order = torch.randperm(blocks, generator=g).tolist()
    decode_lens = torch.randint(1, 20, (num_decodes,), generator=g).tolist()
    # decodes bring 1 token after a cached context; prefills bring their prompt after a cached prefix
    q_lens = [1] * num_decodes + prompt_lens
    seq_lens = [n + 1 for n in decode_lens] + [p + 3 for p in prompt_lens]
    tables, slots, cu = [], [], [0]
    for q_len, n in zip(q_lens, seq_lens, strict=True):
        table = [order.pop() for _ in range(-(-n // bs))]
        tables.append(table)
        slots += [table[p // bs] * bs + p % bs for p in range(n - q_len, n)]
        cu.append(cu[-1] + q_len)
    tokens = cu[-1]
    q, k, v = (torch.randn(tokens, h, dim, generator=g).to(DEV) for h in (heads, kv_heads, kv_heads))
    meta = AttentionMetadata(
        is_prefill=True,
        slot_mapping=torch.tensor(slots, device=DEV),
        block_tables=torch.from_numpy(padded_rows(tables)).to(DEV),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEV),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=DEV),
        max_seqlen_q=max(q_lens),
        max_seqlen_k=max(seq_lens),
        num_decode_seqs=num_decodes,
    )
    return attn, meta, q, k, v


def _run(attn, meta, q, k, v, backend):
    cache = tuple(c.clone() for c in attn.kv_cache)
    attn.kv_cache = cache
    with settings.forced(backend), use_context(meta):
        return attn(q, k, v)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("num_decodes,prompt_lens,window", [(3, [5], None), (5, [2, 9], None), (4, [7], 5)],
                         ids=["3dec-1pre", "5dec-2pre", "window"])  # fmt: skip
def test_mixed_step_equals_all_rows_through_prefill(backend, num_decodes, prompt_lens, window):
    attn, meta, q, k, v = _step(num_decodes, prompt_lens, window, seed=num_decodes)
    assert meta.prefill_cu_seqlens_q.tolist()[0] == 0
    mixed = _run(attn, meta, q, k, v, backend)
    attn_all = dataclasses.replace(meta, num_decode_seqs=0, prefill_cu_seqlens_q=None)
    whole = _run(attn, attn_all, q, k, v, backend)
    torch.testing.assert_close(mixed, whole, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_decodes,prompt_lens,window", [(0, [5, 11], None), (3, [9], None), (2, [7], 5)],
                         ids=["2pre", "3dec-1pre", "window"])  # fmt: skip
def test_triton_prefill_from_fresh_rows_matches_the_reference(num_decodes, prompt_lens, window):
    """The layer hands the prefill kernel the chunk's own K/V rows (prefix from pages); the torch reference
    reads every key from the pages: the two agree."""
    attn, meta, q, k, v = _step(num_decodes, prompt_lens, window, seed=7 + num_decodes)
    ours = _run(attn, meta, q, k, v, "triton")
    ref = _run(attn, meta, q, k, v, "torch")
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_num_decode_seqs_is_validated():
    attn, meta, *_ = _step(2, [4], None, seed=0)
    with pytest.raises(ValueError, match="num_decode_seqs"):
        dataclasses.replace(meta, num_decode_seqs=9)
    with pytest.raises(ValueError, match="num_decode_seqs"):
        dataclasses.replace(meta, is_prefill=False, num_decode_seqs=1)

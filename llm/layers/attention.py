"""The attention core of a decoder layer: write the new K/V into the paged cache, attend.

It reads the step's `AttentionMetadata` (llm/engine/context.py) and its own
`kv_cache`, a `(k_cache, v_cache)` pair of `[num_blocks, block_size, kv_heads,
head_dim]` tensors that the model runner assigns after allocating the cache,
with `kv_scales` (k_scale, v_scale) where the cache is quantized
(kernels/attention/kv_quant.py: fp8 per-tensor scales, int8/int4 per-token scale/zero tensors).
With an int8 or int4 cache, q, k and v are rotated by a Hadamard matrix before
the write and the kernels and the output rotated back (`kv_quant.rotation`); an
int4 cache stores every key less the layer's `key_offset` (`set_key_offsets`).

Without metadata or without a cache (a profiling or warm-up pass before the
cache exists) the batch is attended to contiguously, causally, with no cache
written: one sequence when there is no metadata, else the sequences of
`cu_seqlens_q` (which must then have no cached prefix). Sliding window and
softcap are ignored on that path; it exists to size memory, not to serve.
"""

from __future__ import annotations

import torch
from torch import nn

from vlchat.kernels.attention import (
    kv_quant,
    paged_decode_attention,
    paged_prefill_attention,
    varlen_attention,
    write_kv_cache,
)
from vlchat.llm.engine.context import get_context


class Attention(nn.Module):
    """Causal attention over the paged KV cache.

    Args:
        num_heads: query heads; num_kv_heads: key/value heads (GQA when fewer).
        head_dim: size of one head; scale: score multiplier (usually head_dim ** -0.5).
        sliding_window: None, or W: a query at position p sees keys at positions > p - W.
        softcap: > 0 caps scores with softcap * tanh(score / softcap).
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        softcap: float = 0.0,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window or None
        self.softcap = softcap
        self._kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self.kv_scales: tuple = (None, None)  # the cache's (k_scale, v_scale) as its format takes them
        # an FP8 cache's per-tensor (k_scale, v_scale) given by the checkpoint (weights.load_tensors); None: 1.0
        self.checkpoint_fp8_scales: list[float | None] = [None, None]
        self._rotation: dict = {}  # dtype -> the int8/int4 caches' row rotation (kv_quant.rotation); else empty
        self._key_offset: torch.Tensor | None = None  # [kv_heads, head_dim] float32, unrotated (set_key_offsets)
        self._rotated_offset: dict = {}  # dtype -> key_offset rotated as an int4 cache stores keys; else empty
        self._cache_memo: dict = {}  # what kernels keep per cache (TMA descriptors, stealing counters), emptied with it

    @property
    def kv_cache(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._kv_cache

    @kv_cache.setter
    def kv_cache(self, caches: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self._kv_cache = caches
        self._cache_memo = {}
        self._rotation = {}
        if caches is not None and kv_quant.cache_format(caches[0], self.head_dim) in kv_quant.LEVELS:
            h = kv_quant.rotation(self.head_dim, caches[0].device)
            # made here in every float dtype, so that no step (a CUDA-graph capture included) allocates it
            self._rotation = {dtype: h.to(dtype) for dtype in (torch.float32, torch.float16, torch.bfloat16)}
        self._rotate_offset()

    @property
    def key_offset(self) -> torch.Tensor | None:
        return self._key_offset

    @key_offset.setter
    def key_offset(self, offset: torch.Tensor | None) -> None:
        if offset is not None and tuple(offset.shape) != (self.num_kv_heads, self.head_dim):
            raise ValueError(f"key_offset must be [kv_heads, head_dim] = {(self.num_kv_heads, self.head_dim)}, "
                             f"got {tuple(offset.shape)}")  # fmt: skip
        self._key_offset = None if offset is None else offset.detach().float().clone()
        self._rotate_offset()

    def _rotate_offset(self) -> None:
        self._rotated_offset = {}
        caches, offset = self._kv_cache, self._key_offset
        if offset is not None and caches is not None and kv_quant.cache_format(caches[0], self.head_dim) == "int4":
            off = offset.to(self._rotation[torch.float32].device) @ self._rotation[torch.float32]
            self._rotated_offset = {dtype: off.to(dtype) for dtype in self._rotation}

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim] -> [tokens, heads, head_dim]
        ctx = get_context()
        if ctx is None or self.kv_cache is None:
            return self._contiguous(q, k, v, ctx)
        if not self._rotation:
            return self._paged(q, k, v, ctx)
        # int8/int4 caches store rows rotated by H (kv_quant.rotation): q @ H / n . k @ H = q . k, and the output
        # of the rotated values comes back through H / n. Keys are stored less the offset m: q . (k - m) shifts all
        # of a query's scores by q . m, which softmax cancels (set_key_offsets)
        h = self._rotation[q.dtype]
        inv_n = 1.0 / kv_quant.hadamard_block(self.head_dim)
        k = k @ h
        if self._rotated_offset:
            k = k - self._rotated_offset[q.dtype]
        return self._paged((q @ h) * inv_n, k, v @ h, ctx) @ h * inv_n

    def _paged(self, q, k, v, ctx) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache
        k_scale, v_scale = self.kv_scales
        write_kv_cache(k, v, k_cache, v_cache, ctx.slot_mapping, k_scale, v_scale)
        if ctx.is_prefill and ctx.num_decode_seqs:
            return self._mixed(q, k, v, k_cache, v_cache, ctx)
        if ctx.is_prefill:  # the chunk's keys from k/v as they are (_rows), the cached prefix from the pages
            rows_k, rows_v = _rows(k, v, k_cache)
            return paged_prefill_attention(
                q, k_cache, v_cache, ctx.block_tables, ctx.cu_seqlens_q, ctx.seq_lens, self.scale,
                ctx.max_seqlen_q, causal=True, sliding_window=self.sliding_window, softcap=self.softcap, k=rows_k,
                v=rows_v, cache_memo=self._cache_memo, k_scale=k_scale, v_scale=v_scale,
            )  # fmt: skip
        return paged_decode_attention(
            q, k_cache, v_cache, ctx.block_tables, ctx.seq_lens, self.scale,
            sliding_window=self.sliding_window, num_splits=ctx.num_splits, softcap=self.softcap,
            config=ctx.decode_config, cache_memo=self._cache_memo, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip

    def _mixed(self, q, k, v, k_cache, v_cache, ctx) -> torch.Tensor:
        """Decode rows (the first num_decode_seqs, one token each) on the split-k decode kernel, the
        prefill rows on the prefill kernel."""
        nd = ctx.num_decode_seqs
        k_scale, v_scale = self.kv_scales
        rows_k, rows_v = _rows(k[nd:], v[nd:], k_cache)
        out = torch.empty_like(q)  # [tokens, heads, head_dim]
        paged_decode_attention(
            q[:nd], k_cache, v_cache, ctx.block_tables[:nd], ctx.seq_lens[:nd], self.scale,
            sliding_window=self.sliding_window, num_splits=ctx.num_splits, softcap=self.softcap, out=out[:nd],
            config=ctx.decode_config, cache_memo=self._cache_memo, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        out[nd:] = paged_prefill_attention(
            q[nd:], k_cache, v_cache, ctx.prefill_block_tables, ctx.prefill_cu_seqlens_q, ctx.prefill_seq_lens,
            self.scale, ctx.max_seqlen_q, causal=True, sliding_window=self.sliding_window, softcap=self.softcap,
            k=rows_k, v=rows_v, cache_memo=self._cache_memo, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        return out

    def _contiguous(self, q, k, v, ctx) -> torch.Tensor:
        if ctx is not None and ctx.cu_seqlens_q is not None:
            cu_seqlens, max_seqlen = ctx.cu_seqlens_q, ctx.max_seqlen_q
        else:
            tokens = q.shape[0]
            cu_seqlens = torch.tensor([0, tokens], dtype=torch.int32, device=q.device)
            max_seqlen = tokens
        return varlen_attention(q, k, v, cu_seqlens, max_seqlen, self.scale, causal=True)


@torch.inference_mode()
def set_key_offsets(model: nn.Module, token_id: int, mrope: bool = False) -> None:
    """Make the key of `token_id` alone at position 0 (a sequence's usual first token: BOS) each attention layer's
    `key_offset`, which an int4 cache subtracts from every key before storing it. Keys of real models share
    a large per-dimension offset (Gemma 3's first-token key holds most of it) that a per-row grid otherwise spends
    its levels on; the offset is one constant per layer and KV head, so every score of a query moves by the same
    q . m and attention is unchanged in exact arithmetic, and the stored bytes depend on no other sequence
    (prefix caching, preemption and CUDA graphs need nothing). A softcapped layer keeps no offset: tanh does not
    commute with the shift. int8 caches store keys as they are: their error is already at the level where near-tied
    logits decide greedy tokens, and with the offset they kept fewer (docs/KV_CACHE.md). Runs one forward without a
    cache."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    keys = {}

    def record(mod, args):  # args: (q, k, v); returns None, so the call goes on unchanged
        keys[mod] = args[1][0]

    hooks = [a.register_forward_pre_hook(record) for a in layers]
    try:
        positions = torch.zeros((3, 1) if mrope else (1,), dtype=torch.long, device=device)
        model(torch.tensor([token_id], device=device), positions)
    finally:
        for hook in hooks:
            hook.remove()
    for a in layers:
        a.key_offset = None if a.softcap else keys[a]


def _rows(k, v, k_cache):
    """The chunk's own K/V rows for the prefill kernel to read instead of their pages, or (None, None) where the
    cache is quantized: every key is then read back from the cache, as stored, so a token's attention is the same
    whether its keys were written this step, by an earlier chunk, by a prefix-cache hit or before a preemption."""
    return (k, v) if k_cache.dtype == k.dtype else (None, None)

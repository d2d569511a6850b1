"""Attention ops: paged decode (split-k), paged prefill/extend, varlen (vision), KV write.

Each public function dispatches through `kernels.dispatch` to our kernels (Triton;
on sm_90 the Gluon kernels of `prefill_ws.py`/`decode_ws.py` where their configs
and `supports` allow, else Triton) or the torch reference (`reference.py`) for
the tensor's device and dtype. A forced `triton` backend means these kernels.
Signatures and shapes: docs/INTERFACES.md.
"""

from __future__ import annotations

from vlchat.kernels import dispatch
from vlchat.kernels.attention import reference
from vlchat.kernels.device import device_for

WRITE_KV = "attention.write_kv_cache"
DECODE = "attention.paged_decode"
PREFILL = "attention.paged_prefill"
VARLEN = "attention.varlen"

try:
    from vlchat.kernels.attention import decode, kv_write, prefill, varlen
except ImportError:  # no triton installed: the references serve every op
    decode = kv_write = prefill = varlen = None

dispatch.register(WRITE_KV, reference.write_kv_cache, kv_write and kv_write.write_kv_cache)
dispatch.register(DECODE, reference.paged_decode_attention, decode and decode.paged_decode_attention)
dispatch.register(PREFILL, reference.paged_prefill_attention, prefill and prefill.paged_prefill_attention)
dispatch.register(VARLEN, reference.varlen_attention, varlen and varlen.varlen_attention)


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    """k_scale, v_scale: a quantized cache's scales, as its format takes them (kv_quant.py)."""
    impl = dispatch.get_impl(WRITE_KV, k.dtype, device_for(k_cache))
    return impl(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_decode_attention(
    q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window=None, num_splits=None, out=None, softcap=0.0,
    config=None, cache_memo=None, k_scale=None, v_scale=None,
):  # fmt: skip
    """config: the kernel config `num_splits` was planned for (plan.decode_plan), else the kernel plans.
    cache_memo: a dict the caches' owner keeps with them and empties when it replaces them (decode.py).
    k_scale, v_scale: a quantized cache's scales (kv_quant.py)."""
    impl = dispatch.get_impl(DECODE, q.dtype, device_for(q))
    return impl(
        q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, num_splits, out, softcap, config=config,
        cache_memo=cache_memo, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip


def paged_prefill_attention(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, max_seqlen_q, causal=True,
    sliding_window=None, softcap=0.0, k=None, v=None, cache_memo=None, k_scale=None, v_scale=None,
):  # fmt: skip
    """k, v: optionally the chunk's own rows (just written to the cache), read instead of their pages.
    cache_memo: as paged_decode_attention's. k_scale, v_scale: a quantized cache's scales (kv_quant.py)."""
    impl = dispatch.get_impl(PREFILL, q.dtype, device_for(q))
    return impl(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, max_seqlen_q, causal, sliding_window,
        softcap, k, v, cache_memo=cache_memo, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip


def varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale, causal=False):
    impl = dispatch.get_impl(VARLEN, q.dtype, device_for(q))
    return impl(q, k, v, cu_seqlens, max_seqlen, scale, causal)


__all__ = ["write_kv_cache", "paged_decode_attention", "paged_prefill_attention", "varlen_attention", "device_for"]

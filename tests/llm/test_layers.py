"""Decoder layers against explicit torch formulas (fp32, CPU).

The attention layer is driven through the per-step metadata exactly as the
model runner drives it (a chunked prefill, a mixed prefill step, a decode step)
and compared with softmax attention over each sequence's full history written
out by hand, for plain, sliding-window and soft-capped attention with GQA.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.llm.paged import PagedCache
from vlchat.kernels import settings
from vlchat.kernels.attention.configs import DecodeConfig
from vlchat.kernels.device import TritonMode, device_for
from vlchat.llm.engine.context import AttentionMetadata, use_context
from vlchat.llm.errors import UnsupportedModelError
from vlchat.llm.layers.activation import get_act_and_mul
from vlchat.llm.layers.attention import Attention
from vlchat.llm.layers.embedding import LMHead, VocabEmbedding
from vlchat.llm.layers.linear import MergedLinear, QKVLinear
from vlchat.llm.layers.norm import RMSNorm

ATOL = 1e-5
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8


def naive_attention(q, k, v, scale, sliding_window=None, softcap=0.0):
    """Causal attention of one whole sequence: q [n, heads, d], k/v [n, kv_heads, d] -> [n, heads, d]."""
    n = q.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    pos = torch.arange(n)
    visible = pos[None, :] <= pos[:, None]
    if sliding_window:
        visible &= pos[None, :] > pos[:, None] - sliding_window
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


class _OneLayer(torch.nn.Module):
    """Feeds precomputed q/k/v rows (selected by input ids) through one Attention, as a model would."""

    def __init__(self, attn: Attention, q, k, v) -> None:
        super().__init__()
        self.attn, self.q, self.k, self.v = attn, q, k, v

    def forward(self, rows, positions):
        return self.attn(self.q[rows], self.k[rows], self.v[rows])

    def compute_logits(self, out):
        return out


@pytest.mark.parametrize(
    "sliding_window,softcap", [(None, 0.0), (5, 0.0), (None, 2.0)], ids=["plain", "window5", "softcap2"]
)
def test_paged_attention_steps_match_naive(sliding_window, softcap):
    torch.manual_seed(0)
    lens = [14, 9]  # sequence 0 is prefilled in two chunks (6 + 7), decoded once; sequence 1 whole, decoded once
    total = sum(lens)
    q = torch.randn(total, HEADS, HEAD_DIM)
    k = torch.randn(total, KV_HEADS, HEAD_DIM)
    v = torch.randn(total, KV_HEADS, HEAD_DIM)
    scale = HEAD_DIM**-0.5
    layer = _OneLayer(Attention(HEADS, HEAD_DIM, scale, KV_HEADS, sliding_window, softcap), q, k, v)
    cache = PagedCache(layer, num_blocks=16, block_size=4)
    a = list(range(lens[0]))  # row ids of sequence 0
    b = list(range(lens[0], total))
    out_chunk1 = cache.step(layer, [(0, a[:6])])
    out_mixed = cache.step(layer, [(0, a[6:13]), (1, b[:8])])  # prefill: a chunk over a cached prefix + a prompt
    out_decode = cache.step(layer, [(0, a[13:]), (1, b[8:])])  # decode: one token each
    ref_a = naive_attention(q[a], k[a], v[a], scale, sliding_window, softcap)
    ref_b = naive_attention(q[b], k[b], v[b], scale, sliding_window, softcap)
    torch.testing.assert_close(out_chunk1, ref_a[:6], atol=ATOL, rtol=0)
    torch.testing.assert_close(out_mixed, torch.cat([ref_a[6:13], ref_b[:8]]), atol=ATOL, rtol=0)
    torch.testing.assert_close(out_decode, torch.stack([ref_a[13], ref_b[8]]), atol=ATOL, rtol=0)


@pytest.mark.skipif(device_for(torch.empty(0)).triton is not TritonMode.INTERPRETED, reason="CPU tensors: interpreter")
def test_a_decode_step_runs_the_kernel_config_of_its_metadata(monkeypatch):
    """The engine plans (split count, config) once per batch bucket; a step passes both, and the kernel runs
    that config rather than re-planning from the step's own (narrower) block table."""
    from vlchat.kernels.attention import decode  # needs triton

    launched, real = [], decode._decode_kernel

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((grid[2], kwargs["BLOCK_N"]))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(decode, "_decode_kernel", Recorder())
    torch.manual_seed(3)
    q, k, v = torch.randn(12, HEADS, HEAD_DIM), torch.randn(12, KV_HEADS, HEAD_DIM), torch.randn(12, KV_HEADS, HEAD_DIM)
    layer = _OneLayer(Attention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS), q, k, v)
    cache = PagedCache(layer, num_blocks=8, block_size=4)
    cache.step(layer, [(0, list(range(11)))])
    meta, positions = cache.metadata([(0, [11])])
    meta.num_splits, meta.decode_config = 3, DecodeConfig(block_n=16, num_warps=4, num_stages=1, ctas_per_sm=1)
    with settings.forced("triton"), use_context(meta):
        out = layer(torch.tensor([11]), positions)
    assert launched == [(3, 16)]  # the table's own config for this call has 64-key tiles
    torch.testing.assert_close(out[0], naive_attention(q, k, v, HEAD_DIM**-0.5)[11], atol=ATOL, rtol=0)


def test_the_layer_hands_the_kernels_its_cache_memo_and_empties_it_with_a_new_cache(monkeypatch):
    """The kernels keep the caches' TMA descriptors in the layer's memo (they hold the caches): a new cache must
    not find the old one's."""
    import vlchat.llm.layers.attention as layer_module

    seen = []

    def decode(*args, cache_memo=None, **kwargs):
        seen.append(cache_memo)
        cache_memo["descriptor"] = args[1]  # what a kernel would keep
        return torch.zeros_like(args[0])

    monkeypatch.setattr(layer_module, "paged_decode_attention", decode)
    monkeypatch.setattr(layer_module, "write_kv_cache", lambda *args: None)
    attn = Attention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS)
    q, k = torch.randn(1, HEADS, HEAD_DIM), torch.randn(1, KV_HEADS, HEAD_DIM)
    first = (torch.zeros(4, 4, KV_HEADS, HEAD_DIM), torch.zeros(4, 4, KV_HEADS, HEAD_DIM))
    meta = AttentionMetadata(
        is_prefill=False, slot_mapping=torch.tensor([0]), seq_lens=torch.tensor([1], dtype=torch.int32),
        block_tables=torch.zeros(1, 1, dtype=torch.int32),
    )  # fmt: skip
    attn.kv_cache = first
    with use_context(meta):
        attn(q, k, k)
        attn(q, k, k)
    assert seen[0] is seen[1] and seen[0]["descriptor"] is first[0]
    attn.kv_cache = (torch.zeros_like(first[0]), torch.zeros_like(first[1]))
    with use_context(meta):
        attn(q, k, k)
    assert seen[2] is not seen[0] and seen[2]["descriptor"] is attn.kv_cache[0]
    attn.kv_cache = None
    assert attn.kv_cache is None and attn._cache_memo == {}


def test_attention_without_context_or_cache_is_causal_per_sequence():
    torch.manual_seed(1)
    q, k, v = torch.randn(10, HEADS, HEAD_DIM), torch.randn(10, KV_HEADS, HEAD_DIM), torch.randn(10, KV_HEADS, HEAD_DIM)
    attn = Attention(HEADS, HEAD_DIM, 0.3, KV_HEADS)
    torch.testing.assert_close(attn(q, k, v), naive_attention(q, k, v, 0.3), atol=ATOL, rtol=0)
    meta = AttentionMetadata(  # a profiling pass: metadata for two prompts, no cache allocated yet
        is_prefill=True,
        slot_mapping=torch.full((10,), -1),
        block_tables=torch.zeros(2, 1, dtype=torch.int32),
        seq_lens=torch.tensor([4, 6], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 4, 10], dtype=torch.int32),
        max_seqlen_q=6,
    )
    with use_context(meta):
        out = attn(q, k, v)
    expected = torch.cat([naive_attention(q[:4], k[:4], v[:4], 0.3), naive_attention(q[4:], k[4:], v[4:], 0.3)])
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


def test_metadata_rejects_inconsistent_steps():
    common = dict(slot_mapping=torch.zeros(3, dtype=torch.int64), block_tables=torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="prefill step needs cu_seqlens_q"):
        AttentionMetadata(is_prefill=True, seq_lens=torch.ones(3, dtype=torch.int32), **common)
    with pytest.raises(ValueError, match="same batch as block_tables"):
        AttentionMetadata(is_prefill=False, seq_lens=torch.ones(2, dtype=torch.int32), **common)
    with pytest.raises(ValueError, match="num_splits"):
        AttentionMetadata(is_prefill=False, seq_lens=torch.ones(3, dtype=torch.int32), num_splits=0, **common)


def test_qkv_and_merged_linear_place_each_piece():
    torch.manual_seed(2)
    hidden = 16
    wq, wk, wv = torch.randn(HEADS * HEAD_DIM, hidden), torch.randn(KV_HEADS * HEAD_DIM, hidden), torch.randn(16, 16)
    bq, bk, bv = torch.randn(32), torch.randn(16), torch.randn(16)
    qkv = QKVLinear(hidden, HEAD_DIM, HEADS, KV_HEADS, bias=True)
    assert qkv.weight.shards == ("q", "k", "v")
    for shard, w, b in (("v", wv, bv), ("q", wq, bq), ("k", wk, bk)):  # any order
        qkv.weight.weight_loader(qkv.weight, w, shard)
        qkv.bias.weight_loader(qkv.bias, b, shard)
    x = torch.randn(5, hidden)
    q, k, v = qkv.split(qkv(x))
    torch.testing.assert_close(q, F.linear(x, wq, bq).view(5, HEADS, HEAD_DIM))
    torch.testing.assert_close(k, F.linear(x, wk, bk).view(5, KV_HEADS, HEAD_DIM))
    torch.testing.assert_close(v, F.linear(x, wv, bv).view(5, KV_HEADS, HEAD_DIM))
    with pytest.raises(ValueError, match=r"piece 'k'.*checkpoint \(8, 16\) vs model \(16, 16\)"):
        qkv.weight.weight_loader(qkv.weight, torch.zeros(8, hidden), "k")

    gate, up = torch.randn(24, hidden), torch.randn(24, hidden)
    gate_up = MergedLinear(hidden, [24, 24])
    gate_up.weight.weight_loader(gate_up.weight, up, 1)
    gate_up.weight.weight_loader(gate_up.weight, gate, 0)
    act = get_act_and_mul("silu")
    torch.testing.assert_close(act(gate_up(x)), F.silu(x @ gate.T) * (x @ up.T))


def test_gelu_tanh_and_unknown_activation():
    x = torch.randn(3, 8)
    torch.testing.assert_close(get_act_and_mul("gelu_pytorch_tanh")(x), F.gelu(x[:, :4], approximate="tanh") * x[:, 4:])
    with pytest.raises(UnsupportedModelError, match="hidden_act='relu2' is not supported; supported: gelu"):
        get_act_and_mul("relu2")


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["llama", "gemma-offset"])
def test_rms_norm_with_fused_residual(offset):
    torch.manual_seed(3)
    norm = RMSNorm(16, eps=1e-6, weight_offset=offset)
    norm.weight.copy_(torch.randn(16))
    x, residual = torch.randn(4, 16), torch.randn(4, 16)
    s = x + residual
    expected = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * (norm.weight + offset)
    out, new_residual = norm(x, residual)
    torch.testing.assert_close(new_residual, s)
    torch.testing.assert_close(out, expected)
    heads = torch.randn(4, 3, 16)  # q/k norms: any leading shape, normalised per head
    torch.testing.assert_close(norm(heads)[:, 1], norm(heads[:, 1].contiguous()))


def test_embedding_scale_and_tied_softcapped_head():
    torch.manual_seed(4)
    emb = VocabEmbedding(10, 8, scale=8**0.5)
    emb.weight.copy_(torch.randn(10, 8))
    ids = torch.tensor([3, 0, 9])
    torch.testing.assert_close(emb(ids), emb.weight[ids] * 8**0.5)
    half = VocabEmbedding(10, 8, scale=8**0.5).to(torch.bfloat16)  # the normaliser is rounded to bf16 first
    half.weight.copy_(emb.weight)
    assert torch.equal(half(ids), half.weight[ids] * torch.tensor(8**0.5, dtype=torch.bfloat16))
    head = LMHead(10, 8, softcap=5.0)
    head.tie(emb)
    assert head.weight.data_ptr() == emb.weight.data_ptr()
    hidden = torch.randn(2, 8, dtype=torch.float32) * 10
    logits = head(hidden)
    torch.testing.assert_close(logits, 5.0 * torch.tanh(hidden @ emb.weight.T / 5.0))
    assert logits.abs().max() <= 5.0
    assert LMHead(10, 8).to(torch.bfloat16)(hidden.bfloat16()).dtype == torch.float32


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_integer_caches_hold_rotated_rows_and_the_layer_rotates_back(fmt):
    """K/V rows with an outlier dimension (as real models' keys have): the cache holds the rows rotated by the
    Hadamard matrix, the layer's output is attention over the unrotated rows, and its error is well under that of
    the same per-row grid over the raw rows (the outlier stretching every row's range)."""
    from vlchat.kernels.attention import kv_quant

    torch.manual_seed(0)
    n, head_dim = 24, 64
    q = torch.randn(n, HEADS, head_dim)
    k = torch.randn(n, KV_HEADS, head_dim)
    v = torch.randn(n, KV_HEADS, head_dim)
    k[..., 5] *= 30.0
    v[..., 9] *= 30.0
    scale = head_dim**-0.5
    layer = _OneLayer(Attention(HEADS, head_dim, scale, KV_HEADS), q, k, v)
    cache = PagedCache(layer, num_blocks=8, block_size=4)
    k_cache, v_cache, ks, vs = kv_quant.allocate(fmt, 8, 4, KV_HEADS, head_dim, torch.float32, "cpu")
    layer.attn.kv_scales = (ks, vs)
    layer.attn.kv_cache = (k_cache, v_cache)
    rows = list(range(n))
    out = torch.cat([cache.step(layer, [(0, rows[:10])]), cache.step(layer, [(0, rows[10:])])])
    ref = naive_attention(q, k, v, scale)

    table = cache.tables[0]
    stored = kv_quant.dequantize(k_cache[table], ks[table], fmt=fmt).reshape(-1, KV_HEADS, head_dim)[:n]
    h = kv_quant.rotation(head_dim)
    step = (k @ h).amax(-1, keepdim=True) - (k @ h).amin(-1, keepdim=True)
    assert ((stored - k @ h).abs() <= step / kv_quant.LEVELS[fmt] / 2 + 1e-4).all()  # rotated, then quantized

    def raw_grid(x):
        codes, sz = kv_quant.quantize_int(x, fmt)
        return kv_quant.dequantize(codes, sz, fmt=fmt)

    rotated_err = (out - ref).norm() / ref.norm()
    raw_err = (naive_attention(q, raw_grid(k), raw_grid(v), scale) - ref).norm() / ref.norm()
    assert rotated_err < 0.5 * raw_err
    assert rotated_err < {"int8": 0.01, "int4": 0.2}[fmt]


@pytest.mark.parametrize("sliding_window", [None, 7], ids=["full", "window7"])
def test_an_int4_cache_stores_keys_less_the_key_offset_and_attention_is_unchanged(sliding_window):
    """Keys sharing a large per-dimension offset (as real models' do): with the first key as the layer's key_offset
    an int4 cache holds each key less it (the first row exactly zero), the output is still attention over the keys
    as they are (every score of a query moves by q . m), and its error is well under that of the same cache without
    the offset, whose per-row grid spends its levels on the shared offset. An int8 cache ignores the offset."""
    from vlchat.kernels.attention import kv_quant
    from vlchat.llm.layers.attention import set_key_offsets

    fmt = "int4"
    torch.manual_seed(1)
    n, head_dim = 24, 64
    q = torch.randn(n, HEADS, head_dim)
    k = 6.0 * torch.randn(1, KV_HEADS, head_dim) + torch.randn(n, KV_HEADS, head_dim)
    v = torch.randn(n, KV_HEADS, head_dim)
    scale = head_dim**-0.5
    ref = naive_attention(q, k, v, scale, sliding_window)
    outs = {}
    for offset in (False, True):
        layer = _OneLayer(Attention(HEADS, head_dim, scale, KV_HEADS, sliding_window=sliding_window), q, k, v)
        if offset:
            set_key_offsets(layer, 0)  # token 0: row 0 of q/k/v
            torch.testing.assert_close(layer.attn.key_offset, k[0])
        cache = PagedCache(layer, num_blocks=8, block_size=4)
        k_cache, v_cache, ks, vs = kv_quant.allocate(fmt, 8, 4, KV_HEADS, head_dim, torch.float32, "cpu")
        layer.attn.kv_scales = (ks, vs)
        layer.attn.kv_cache = (k_cache, v_cache)
        rows = list(range(n))
        outs[offset] = torch.cat([cache.step(layer, [(0, rows[:10])]), cache.step(layer, [(0, rows[10:])])])
    table = cache.tables[0]
    stored = kv_quant.dequantize(k_cache[table], ks[table], fmt=fmt).reshape(-1, KV_HEADS, head_dim)[:n]
    want = (k - k[0]) @ kv_quant.rotation(head_dim)
    step = want.amax(-1, keepdim=True) - want.amin(-1, keepdim=True)
    assert ((stored - want).abs() <= step / kv_quant.LEVELS[fmt] / 2 + 1e-4).all()
    assert (stored[0] == 0).all()
    err = {offset: float((out - ref).norm() / ref.norm()) for offset, out in outs.items()}
    assert err[True] < 0.5 * err[False], err
    assert err[True] < 0.2, err

    layer = _OneLayer(Attention(HEADS, head_dim, scale, KV_HEADS), q, k, v)
    set_key_offsets(layer, 0)
    cache = PagedCache(layer, num_blocks=8, block_size=4)
    k_cache, v_cache, ks, vs = kv_quant.allocate("int8", 8, 4, KV_HEADS, head_dim, torch.float32, "cpu")
    layer.attn.kv_scales = (ks, vs)
    layer.attn.kv_cache = (k_cache, v_cache)
    cache.step(layer, [(0, list(range(n)))])
    stored = kv_quant.dequantize(k_cache[cache.tables[0]], ks[cache.tables[0]]).reshape(-1, KV_HEADS, head_dim)[:n]
    kh = k @ kv_quant.rotation(head_dim)
    assert ((stored - kh).abs() <= (kh.amax(-1, keepdim=True) - kh.amin(-1, keepdim=True)) / 510 + 1e-4).all()


def test_set_key_offsets_takes_the_token_s_key_at_position_0_and_skips_softcapped_layers():
    from vlchat.llm.layers.attention import set_key_offsets

    torch.manual_seed(2)
    q, k, v = torch.randn(5, HEADS, HEAD_DIM), torch.randn(5, KV_HEADS, HEAD_DIM), torch.randn(5, KV_HEADS, HEAD_DIM)
    plain = _OneLayer(Attention(HEADS, HEAD_DIM, 1.0, KV_HEADS), q, k, v)
    set_key_offsets(plain, 3)
    torch.testing.assert_close(plain.attn.key_offset, k[3])
    capped = _OneLayer(Attention(HEADS, HEAD_DIM, 1.0, KV_HEADS, softcap=2.0), q, k, v)
    set_key_offsets(capped, 3)
    assert capped.attn.key_offset is None

"""Rotary: the Triton kernel (interpreted on CPU) against the torch reference, and the reference against transformers."""

import pytest
import torch

from tests.kernels.attention_helpers import DEV
from vlchat.kernels import dispatch
from vlchat.kernels.ops import apply_rotary
from vlchat.kernels.ops.rotary import OP, apply_rotary_reference

TOLS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _cache(max_pos, rot, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq  # [max_pos, rot / 2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@pytest.mark.parametrize("dtype", list(TOLS), ids=str)
@pytest.mark.parametrize("head_dim,rot", [(16, 16), (24, 8), (20, 20)], ids=["full", "partial", "non_pow2"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_triton_matches_reference(dtype, head_dim, rot, is_neox):
    tokens = 7
    q = torch.randn(tokens, 5, head_dim, device=DEV).to(dtype)
    k = torch.randn(tokens, 2, head_dim, device=DEV).to(dtype)
    positions = torch.randint(0, 64, (tokens,), device=DEV)
    cache = _cache(64, rot).to(DEV)
    got_q, got_k = dispatch.get_impl(OP, dtype, backend="triton")(q, k, positions, cache, rot, is_neox)
    want_q, want_k = apply_rotary_reference(q.float(), k.float(), positions, cache, rot, is_neox)
    torch.testing.assert_close(got_q.float(), want_q, rtol=TOLS[dtype], atol=TOLS[dtype])
    torch.testing.assert_close(got_k.float(), want_k, rtol=TOLS[dtype], atol=TOLS[dtype])
    assert torch.equal(got_q[..., rot:], q[..., rot:])  # pass-through channels untouched


def test_one_launch_rotates_q_and_k_over_several_head_blocks_each():
    # head_dim 128: 16 heads per program, so 40 q heads take 3 blocks and 20 k heads 2 (the last of each partial)
    q = torch.randn(3, 40, 128, device=DEV)
    k = torch.randn(3, 20, 128, device=DEV)
    positions = torch.tensor([0, 5, 63], device=DEV)
    cache = _cache(64, 128).to(DEV)
    got = dispatch.get_impl(OP, torch.float32, backend="triton")(q, k, positions, cache)
    want = apply_rotary_reference(q, k, positions, cache)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_triton_reads_strided_views_of_a_fused_qkv():
    qkv = torch.randn(6, (4 + 2 + 2) * 16, device=DEV)
    q = qkv[:, : 4 * 16].view(6, 4, 16)
    k = qkv[:, 4 * 16 : 6 * 16].view(6, 2, 16)
    positions = torch.arange(6, device=DEV) + 3
    cache = _cache(16, 16).to(DEV)
    got = dispatch.get_impl(OP, torch.float32, backend="triton")(q, k, positions, cache)
    want = apply_rotary_reference(q, k, positions, cache)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_triton_reads_k_of_another_head_stride_and_a_cache_of_wider_rows():
    """k's heads 32 apart (every other slot of a [t, h, 2, d] buffer) while q's are 16; the cos/sin cache a
    column slice of a wider table (row stride 24, not 16)."""
    q = torch.randn(5, 4, 16, device=DEV)
    k = torch.randn(5, 2, 2, 16, device=DEV)[:, :, 0]
    assert k.stride(1) == 32 and q.stride(1) == 16
    cache = torch.cat((_cache(16, 16), torch.randn(16, 8)), dim=-1).to(DEV)[:, :16]
    positions = torch.tensor([0, 3, 7, 1, 15], device=DEV)
    got = dispatch.get_impl(OP, torch.float32, backend="triton")(q, k, positions, cache)
    want = apply_rotary_reference(q, k, positions, cache)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_reference_neox_matches_transformers_llama():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    positions = torch.tensor([0, 3, 9, 10, 31])
    cache = _cache(32, 16)
    cos, sin = cache[positions].chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]  # [1, tokens, head_dim]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    got_q, got_k = apply_rotary(q, k, positions, cache)
    assert torch.equal(got_q, want_q[0].transpose(0, 1))
    assert torch.equal(got_k, want_k[0].transpose(0, 1))


def test_reference_gptj_matches_transformers_gptj():
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

    q = torch.randn(5, 4, 16)
    positions = torch.tensor([0, 1, 2, 17, 30])
    cache = _cache(32, 8)
    sin, cos = cache[positions].chunk(2, dim=-1)[::-1]
    want = torch.cat((apply_rotary_pos_emb(q[None, :, :, :8], sin[None], cos[None])[0], q[..., 8:]), -1)
    got_q, _ = apply_rotary(q, q[:, :1], positions, cache, rotary_dim=8, is_neox=False)
    torch.testing.assert_close(got_q, want, rtol=1e-6, atol=1e-6)


def test_rejects_cache_width_mismatch():
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary(torch.randn(2, 1, 16), torch.randn(2, 1, 16), torch.arange(2), _cache(4, 16), rotary_dim=8)


def test_rejects_an_odd_rotary_dim():
    with pytest.raises(ValueError, match="must be even"):
        apply_rotary(torch.randn(2, 1, 16), torch.randn(2, 1, 16), torch.arange(2), _cache(4, 7), rotary_dim=7)

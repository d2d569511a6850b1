"""Triton KV write against the torch reference: exact copies, skipped negative slots, untouched other slots."""

import pytest
import torch

from tests.kernels.attention_helpers import DEV, DTYPES
from vlchat.kernels.attention import kv_write, reference


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_heads,head_dim,page", [(2, 80, 16), (1, 128, 32), (8, 64, 16)], ids=str)
def test_kv_write_matches_reference(kv_heads, head_dim, page, dtype):
    num_blocks = 6
    tokens = 9
    k = torch.randn(tokens, kv_heads, head_dim, device=DEV).to(dtype)
    v = torch.randn(tokens, kv_heads, head_dim, device=DEV).to(dtype)
    slots = torch.randperm(num_blocks * page, device=DEV)[:tokens]
    slots[3] = -1  # padding token: skipped
    caches = [torch.randn(num_blocks, page, kv_heads, head_dim, device=DEV).to(dtype) for _ in range(2)]
    expected = [c.clone() for c in caches]
    kv_write.write_kv_cache(k, v, caches[0], caches[1], slots)
    reference.write_kv_cache(k, v, expected[0], expected[1], slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_kv_write_from_strided_rows():
    """k/v sliced out of a fused qkv projection (non-contiguous token stride) are written correctly."""
    qkv = torch.randn(5, 3, 2, 64, device=DEV, dtype=torch.float16)
    k, v = qkv[:, 1], qkv[:, 2]
    k_cache = torch.zeros(2, 16, 2, 64, device=DEV, dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    kv_write.write_kv_cache(k, v, k_cache, v_cache, torch.arange(5, device=DEV) * 3)
    assert torch.equal(k_cache.view(-1, 2, 64)[::3][:5], k) and torch.equal(v_cache.view(-1, 2, 64)[::3][:5], v)


def test_kv_write_of_k_and_v_in_different_layouts_and_five_heads():
    """As the engine writes them: k contiguous (the rotary's output), v a view into the fused qkv rows; 5 KV heads
    (not a power of two: the kernel's head block is 8, and the 3 extra heads must not spill into the next slot)."""
    tokens, heads, dim, page = 6, 5, 64, 16
    qkv = torch.randn(tokens, 3 * heads * dim, device=DEV, dtype=torch.float16)
    k = qkv[:, heads * dim : 2 * heads * dim].reshape(tokens, heads, dim).contiguous()
    v = qkv[:, 2 * heads * dim :].view(tokens, heads, dim)
    assert k.stride(0) != v.stride(0)
    caches = [torch.randn(3, page, heads, dim, device=DEV, dtype=torch.float16) for _ in range(2)]
    expected = [c.clone() for c in caches]
    slots = torch.tensor([0, 1, 2, 17, 18, 40], device=DEV)  # neighbouring slots: a spill would overwrite one
    kv_write.write_kv_cache(k, v, caches[0], caches[1], slots)
    reference.write_kv_cache(k, v, expected[0], expected[1], slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])

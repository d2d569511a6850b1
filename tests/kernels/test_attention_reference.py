"""The torch reference against an independent per-sequence SDPA formulation with explicit masks (float64)."""

import pytest
import torch
import torch.nn.functional as F

from vlchat.kernels.attention import reference as ref

TOL = 1e-10  # float64 against float64


def _sdpa(q, k, v, q_pos, scale, causal, window=None, softcap=0.0):
    """q [n, hq, d] at absolute positions q_pos [n]; k/v [s, hkv, d]; explicit scores for softcap."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1).transpose(0, 1)
    v = v.repeat_interleave(group, 1).transpose(0, 1)
    qt = q.transpose(0, 1)
    k_pos = torch.arange(k.shape[1])
    mask = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool)
    if causal:
        mask &= k_pos[None, :] <= q_pos[:, None]
        if window:
            mask &= k_pos[None, :] > q_pos[:, None] - window
    if softcap:
        s = torch.tanh(qt @ k.transpose(1, 2) * scale / softcap) * softcap
        return (torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v).transpose(0, 1)
    return F.scaled_dot_product_attention(qt, k, v, attn_mask=mask, scale=scale).transpose(0, 1)


def _paged(lens, block_size, kv_heads, d, extra_blocks=3):
    need = sum((n + block_size - 1) // block_size for n in lens)
    nb = need + extra_blocks
    kc = torch.randn(nb, block_size, kv_heads, d, dtype=torch.float64)
    vc = torch.randn_like(kc)
    perm = torch.randperm(nb)  # non-contiguous tables
    width = max((n + block_size - 1) // block_size for n in lens) + 1
    tables = torch.full((len(lens), width), 10_000, dtype=torch.int32)  # garbage past the end
    at = 0
    for i, n in enumerate(lens):
        used = (n + block_size - 1) // block_size
        tables[i, :used] = perm[at : at + used].int()
        at += used
    return kc, vc, tables


def _rows(cache, table, n):
    return cache[table[: (n + cache.shape[1] - 1) // cache.shape[1]].long()].flatten(0, 1)[:n]


@pytest.mark.parametrize("window,softcap", [(None, 0.0), (7, 0.0), (None, 5.0)], ids=["plain", "window7", "softcap5"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
def test_decode_matches_sdpa(heads, window, softcap):
    hq, hkv = heads
    lens = [1, 15, 16, 17, 40]
    kc, vc, tables = _paged(lens, 16, hkv, 32)
    q = torch.randn(len(lens), hq, 32, dtype=torch.float64)
    out = ref.paged_decode_attention(
        q, kc, vc, tables, torch.tensor(lens, dtype=torch.int32), 0.2, window, None, None, softcap
    )
    for b, n in enumerate(lens):
        want = _sdpa(
            q[b : b + 1],
            _rows(kc, tables[b], n),
            _rows(vc, tables[b], n),
            torch.tensor([n - 1]),
            0.2,
            True,
            window,
            softcap,
        )
        torch.testing.assert_close(out[b : b + 1], want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize(
    "causal,window,softcap",
    [(True, None, 0.0), (True, 5, 0.0), (False, None, 0.0), (True, None, 4.0)],
    ids=["causal", "window5", "full", "softcap4"],
)
def test_prefill_with_cached_prefix_matches_sdpa(causal, window, softcap):
    lens, new = [9, 33, 4], [3, 33, 1]  # prefix 6 + 3 new; 33 fresh; prefix 3 + 1 new
    kc, vc, tables = _paged(lens, 8, 2, 16)
    cu = torch.tensor([0, 3, 36, 37], dtype=torch.int32)
    q = torch.randn(37, 4, 16, dtype=torch.float64)
    out = ref.paged_prefill_attention(
        q, kc, vc, tables, cu, torch.tensor(lens, dtype=torch.int32), 0.3, 33, causal, window, softcap
    )
    for b, n in enumerate(lens):
        lo, hi = int(cu[b]), int(cu[b + 1])
        q_pos = torch.arange(n - new[b], n)
        k_rows, v_rows = _rows(kc, tables[b], n), _rows(vc, tables[b], n)
        want = _sdpa(q[lo:hi], k_rows, v_rows, q_pos, 0.3, causal, window, softcap)
        torch.testing.assert_close(out[lo:hi], want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_and_empty_rows(causal):
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    q, k, v = (torch.randn(12, h, 16, dtype=torch.float64) for h in (4, 1, 1))
    out = ref.varlen_attention(q, k, v, cu, 7, 0.25, causal=causal)
    for lo, hi in [(0, 5), (5, 12)]:
        q_pos = torch.arange(hi - lo)
        want = _sdpa(q[lo:hi], k[lo:hi], v[lo:hi], q_pos, 0.25, causal)
        torch.testing.assert_close(out[lo:hi], want, rtol=TOL, atol=TOL)
    # a decode row with no visible key (length 0) is zero, not NaN
    kc, vc, tables = _paged([4], 4, 1, 16)
    zero = ref.paged_decode_attention(q[:1], kc, vc, tables, torch.tensor([0], dtype=torch.int32), 0.25)
    assert torch.equal(zero, torch.zeros_like(zero))


def test_write_kv_cache_skips_negative_slots():
    kc = torch.zeros(3, 4, 2, 8)
    vc = torch.zeros_like(kc)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    ref.write_kv_cache(k, v, kc, vc, torch.tensor([5, -1, 11]))
    torch.testing.assert_close(kc[1, 1], k[0])
    torch.testing.assert_close(vc[2, 3], v[2])
    assert int((kc != 0).any(-1).any(-1).sum()) == 2


@pytest.mark.parametrize("window", [None, 7], ids=["plain", "window7"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1)], ids=["mha", "gqa4", "mqa"])
def test_cpu_fp32_decode_path_matches_the_float64_reference(heads, window):
    # fp32 on the CPU takes the per-sequence SDPA path (the serving path there); float64 the vectorized one
    hq, hkv = heads
    lens = [0, 1, 15, 16, 17, 40]
    kc, vc, tables = _paged(lens, 16, hkv, 32)
    q = torch.randn(len(lens), hq, 32, dtype=torch.float64)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    want = ref.paged_decode_attention(q, kc, vc, tables, seq_lens, 0.2, window)
    out = torch.full((len(lens), hq, 32), float("nan"))
    got = ref.paged_decode_attention(q.float(), kc.float(), vc.float(), tables, seq_lens, 0.2, window, out=out)
    assert got is out and torch.equal(out[0], torch.zeros_like(out[0]))  # no key: zeros, never NaN
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal,window", [(True, None), (True, 5), (False, None)], ids=["causal", "window5", "full"])
def test_cpu_fp32_prefill_and_varlen_paths_match_the_float64_reference(causal, window):
    # fp32 on the CPU calls SDPA per sequence (the serving path there); float64 computes the scores explicitly
    lens = [9, 33, 4]
    kc, vc, tables = _paged(lens, 8, 2, 16)
    cu = torch.tensor([0, 3, 36, 37], dtype=torch.int32)  # prefixes of 6, 0 and 3 keys
    q = torch.randn(37, 4, 16, dtype=torch.float64)
    args = (tables, cu, torch.tensor(lens, dtype=torch.int32), 0.3, 33, causal, window)
    want = ref.paged_prefill_attention(q, kc, vc, *args)
    got = ref.paged_prefill_attention(q.float(), kc.float(), vc.float(), *args)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    k, v = kc.flatten(0, 1)[:37], vc.flatten(0, 1)[:37]
    want = ref.varlen_attention(q, k, v, cu, 33, 0.3, causal)
    got = ref.varlen_attention(q.float(), k.float(), v.float(), cu, 33, 0.3, causal)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)

"""Triton paged prefill/extend and varlen (vision) attention against the float64 torch reference."""

import pytest
import torch

from tests.kernels.attention_helpers import (
    ARCHS,
    DEV,
    DTYPES,
    ON_GPU,
    assert_close,
    chunk_rows,
    make_paged,
    poisoned_like,
    sim_device,
)
from vlchat.kernels.attention import prefill, reference, varlen
from vlchat.kernels.attention.configs import TABLES, PrefillConfig

# CPU: 16x16 tiles so tiny sequences still span several query and key tiles; GPU: the device's own table.
SMALL = None if ON_GPU else PrefillConfig(16, 16, 4, 1)
KV_HEADS = 8 if ON_GPU else 2


def _batch(page):
    """(kv_len, new tokens): fresh, one new token after a prefix, a chunk after a prefix, page - 1 fresh."""
    if ON_GPU:
        return [(700, 700), (3 * page + 1, 1), (2100, 1000), (page - 1, page - 1)]
    return [(5, 5), (page + 1, 1), (2 * page + 3, page + 2), (page - 1, page - 1)]


def _run(group, head_dim, dtype, page, causal=True, window=None, softcap=0.0, device=None, config=SMALL, rows=False):
    pairs = _batch(page)
    lens = [kv for kv, _ in pairs]
    kv_heads = KV_HEADS if ON_GPU or group < 8 else 1
    k_cache, v_cache, tables = make_paged(lens, page, kv_heads, head_dim, dtype)
    new = [n for _, n in pairs]
    cu = torch.tensor([0] + new, device=DEV).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(sum(new), kv_heads * group, head_dim, device=DEV).to(dtype)
    out = poisoned_like(q)
    args = (tables, cu, seq_lens, head_dim**-0.5, max(new), causal, window, softcap)
    kv = (chunk_rows(k_cache, tables, pairs), chunk_rows(v_cache, tables, pairs)) if rows else (None, None)
    prefill.paged_prefill_attention(q, k_cache, v_cache, *args, *kv, device=device, config=config, out=out)
    ref = reference.paged_prefill_attention(q.double(), k_cache.double(), v_cache.double(), *args)
    return out, ref


CASES = [  # group, head_dim, page, dtype on CPU
    (1, 64, 16, torch.float16),
    (4, 80, 16, torch.float32),
    (8, 128, 32, torch.float16),
    (4, 128, 16, torch.float32),
]
PARAMS = [(*case[:3], dtype) for case in CASES for dtype in DTYPES] if ON_GPU else CASES


@pytest.mark.parametrize("group,head_dim,page,dtype", PARAMS, ids=str)
def test_prefill_with_prefix_matches_reference(group, head_dim, page, dtype):
    out, ref = _run(group, head_dim, dtype, page)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize(
    "causal,window,softcap",
    [(True, 7, 0.0), (True, 40, 0.0), (True, None, 3.0), (False, None, 0.0)],
    ids=["window7", "window40", "softcap3", "non-causal"],
)
def test_prefill_window_softcap_noncausal(causal, window, softcap):
    out, ref = _run(4, 64, torch.float16, 16, causal, window, softcap)
    assert_close(out, ref, torch.float16)


# The chunk's keys from its own rows (the prefix from the pages), through pointers and through TMA descriptors
# (the interpreter runs descriptors too; fp32 and padded head dims fall back to pointers inside the launch).
ROW_CONFIGS = {"rows": PrefillConfig(16, 16, 4, 1), "tma": PrefillConfig(16, 16, 4, 1, tma=True)}


@pytest.mark.parametrize("source", ["rows", "tma"])
@pytest.mark.parametrize("group,head_dim,page,dtype", PARAMS, ids=str)
def test_prefill_chunk_rows_match_reference(group, head_dim, page, dtype, source):
    config = TABLES["sm_90"].prefill_config(head_dim, dtype) if ON_GPU and source == "tma" else ROW_CONFIGS[source]
    out, ref = _run(group, head_dim, dtype, page, config=config, rows=True)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("source", ["rows", "tma"])
@pytest.mark.parametrize(
    "causal,window,softcap",
    [(True, 7, 0.0), (True, 40, 0.0), (True, None, 3.0)],
    ids=["window7", "window40", "softcap3"],
)
def test_prefill_chunk_rows_window_softcap(causal, window, softcap, source):
    out, ref = _run(4, 64, torch.float16, 16, causal, window, softcap, config=ROW_CONFIGS[source], rows=True)
    assert_close(out, ref, torch.float16)


def test_tma_descriptors_only_where_they_can_run():
    tma = ROW_CONFIGS["tma"]
    rows = torch.zeros(40, 2, 64, dtype=torch.float16, device=DEV)
    assert prefill._tma_descriptors(rows, rows, rows, tma) is not None
    assert prefill._tma_descriptors(rows, rows, rows, ROW_CONFIGS["rows"]) is None  # the config does not ask
    assert prefill._tma_descriptors(rows.float(), rows.float(), rows.float(), tma) is None  # fp32: ieee pointer path
    padded = torch.zeros(40, 2, 80, dtype=torch.float16, device=DEV)
    assert prefill._tma_descriptors(padded, padded, padded, tma) is None  # would read the next head's columns
    tiny = torch.zeros(40, 2, 8, dtype=torch.float16, device=DEV)
    assert prefill._tma_descriptors(tiny, tiny, tiny, tma) is None  # 8 columns: tl.dot takes K >= 16 (tiny towers)
    strided = torch.zeros(40, 2, 72, dtype=torch.float16, device=DEV)[:, :, :64]
    assert prefill._tma_descriptors(strided, strided, strided, tma) is None  # heads not adjacent in a row


def test_prefill_rejects_mismatched_rows():
    q = torch.zeros(4, 2, 16, device=DEV)
    cache = torch.zeros(2, 16, 1, 16, device=DEV)
    i32 = torch.zeros(2, dtype=torch.int32, device=DEV)
    args = (i32.view(1, 2), torch.tensor([0, 4], dtype=torch.int32, device=DEV), i32[:1] + 4, 0.25, 4)
    with pytest.raises(ValueError, match="both k and v"):
        prefill.paged_prefill_attention(q, cache, cache, *args, k=torch.zeros(4, 1, 16, device=DEV))
    with pytest.raises(ValueError, match="rows of the chunk"):
        rows = torch.zeros(3, 1, 16, device=DEV)
        prefill.paged_prefill_attention(q, cache, cache, *args, k=rows, v=rows)


# On CPU the interpreter ignores warps and stages, so only the archs with their own block sizes run there.
@pytest.mark.parametrize("arch", list(ARCHS) if ON_GPU else ["sm_70", "sm_75"], ids=str)
def test_prefill_every_arch_config_runs_here(arch):
    out, ref = _run(4, 128, torch.float16, 16, device=sim_device(ARCHS[arch]), config=TABLES[arch].prefill_config(128))
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize("source", ["rows", "tma"])
@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float16), (80, torch.float32), (128, torch.float16)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_matches_reference(head_dim, dtype, causal, source):
    lens = [1, 17, 64] if not ON_GPU else [1, 257, 1024, 4096]  # one image per sequence
    cu = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
    heads, kv_heads = (4, 4) if head_dim != 128 else (4, 2)
    q = torch.randn(sum(lens), heads, head_dim, device=DEV).to(dtype)
    k = torch.randn(sum(lens), kv_heads, head_dim, device=DEV).to(dtype)
    v = torch.randn(sum(lens), kv_heads, head_dim, device=DEV).to(dtype)
    out = poisoned_like(q)
    config = (
        ROW_CONFIGS[source]
        if not ON_GPU
        else TABLES["sm_90" if source == "tma" else "sm_80"].prefill_config(head_dim, dtype)
    )
    varlen.varlen_attention(q, k, v, cu, max(lens), head_dim**-0.5, causal, config=config, out=out)
    ref = reference.varlen_attention(q.double(), k.double(), v.double(), cu, max(lens), head_dim**-0.5, causal)
    assert_close(out, ref, dtype)


def test_varlen_pads_a_head_dim_under_16_for_the_dot(monkeypatch):
    """A compiled tl.dot needs K >= 16: a tiny vision tower's head_dim of 8 runs with 16 columns, 8 masked (this
    failed to compile on the GPU with BLOCK_D 8), and matches the reference."""
    blocks = []
    launch = prefill.launch_compiled
    monkeypatch.setattr(prefill, "launch_compiled", lambda *a, **kw: blocks.append(kw["BLOCK_D"]) or launch(*a, **kw))
    lens = [3, 20]
    cu = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(sum(lens), 4, 8, device=DEV, dtype=torch.float16) for _ in range(3))
    out = varlen.varlen_attention(q, k, v, cu, max(lens), 8**-0.5, False, config=SMALL or PrefillConfig(64, 64, 4, 2))
    ref = reference.varlen_attention(q.double(), k.double(), v.double(), cu, max(lens), 8**-0.5, False)
    assert blocks == [16]
    assert_close(out, ref, torch.float16)


def test_head_split_takes_two_power_of_two_blocks_where_they_sum_to_the_head():
    assert [prefill.head_split(d) for d in (80, 96, 48, 64, 128, 8, 72, 112, 40)] == [
        (64, 16), (64, 32), (32, 16), (64, 0), (128, 0), (16, 0), (128, 0), (128, 0), (64, 0),
    ]  # fmt: skip


@pytest.mark.parametrize("head_dim", [80, 96, 48], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_runs_a_split_head_unpadded(monkeypatch, head_dim, causal):
    """Qwen2-VL's head_dim 80 runs as 64 + 16 columns (no padded tensor-core work) and matches the reference."""
    blocks = []
    launch = prefill.launch_compiled
    monkeypatch.setattr(
        prefill, "launch_compiled", lambda *a, **kw: blocks.append((kw["BLOCK_D"], kw["SPLIT"])) or launch(*a, **kw)
    )
    lens = [5, 33]
    cu = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(sum(lens), 4, head_dim, device=DEV, dtype=torch.float16) for _ in range(3))
    out = poisoned_like(q)
    varlen.varlen_attention(q, k, v, cu, max(lens), head_dim**-0.5, causal, config=ROW_CONFIGS["rows"], out=out)
    ref = reference.varlen_attention(q.double(), k.double(), v.double(), cu, max(lens), head_dim**-0.5, causal)
    assert blocks == [(prefill.head_split(head_dim)[0], True)]
    assert_close(out, ref, torch.float16)


def test_paged_prefill_of_a_split_head_with_prefix_and_rows():
    """head_dim 96 (64 + 32) through the pages and through the chunk's rows, GQA, fp16."""
    for rows in (False, True):
        out, ref = _run(2, 96, torch.float16, 16, config=ROW_CONFIGS["rows"], rows=rows)
        assert_close(out, ref, torch.float16)

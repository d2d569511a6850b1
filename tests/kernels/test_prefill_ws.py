"""The warp-specialized sm_90 prefill (Gluon) against the float64 torch reference, and when it is chosen.

The kernel runs on an sm_90 GPU only (Gluon has no interpreter); its choice (`prefill.ws_plan`) is checked
everywhere."""

import pytest
import torch

from tests.kernels.attention_helpers import (
    DEV,
    SM90,
    assert_close,
    chunk_rows,
    make_paged,
    needs_sm90,
    poisoned_like,
    sim_device,
)
from vlchat.kernels.attention import prefill, prefill_ws, reference, varlen
from vlchat.kernels.attention.configs import TABLES, PrefillConfig, WsPrefillConfig


def test_only_sm90_has_a_warp_specialized_config():
    for arch, table in TABLES.items():
        for head_dim in (64, 80, 128, 256):
            for dtype in (torch.float16, torch.bfloat16, torch.float32):
                for window in (False, True):
                    config = table.prefill_ws_config(head_dim, dtype, window)
                    expected = arch == "sm_90" and head_dim in (64, 128, 256) and dtype != torch.float32
                    assert (config is not None) == expected, (arch, head_dim, dtype, window)
                    assert config is None or isinstance(config, WsPrefillConfig)


def test_ws_configs_fit_shared_memory():
    """Every sm_90 warp-specialized prefill config, with its scratch (1 KB), fits the 227 KB a block may use; at
    head_dim 256 two stages of 128-key tiles would not (hence 64-key tiles there)."""
    table = TABLES["sm_90"]
    for configs in (table.prefill_ws, table.prefill_ws_window):
        for head_dim, config in configs.items():
            assert prefill_ws.smem_bytes(config, head_dim, 2) + 1024 <= table.smem_kb * 1024, (head_dim, config)
    assert prefill_ws.smem_bytes(WsPrefillConfig(128, 2), 256, 2) > table.smem_kb * 1024


def test_ws_plan_keeps_triton_outside_the_kernels_scope():
    q = torch.zeros(8, 4, 128, dtype=torch.float16, device=DEV)
    k = torch.zeros(8, 2, 128, dtype=torch.float16, device=DEV)
    cache = torch.zeros(4, 16, 2, 128, dtype=torch.float16, device=DEV)
    args = (q, k, k, cache, cache)
    # a config passed in asks for the Triton kernel; softcap is outside the Gluon kernel; a window takes its config
    assert prefill.ws_plan(*args, True, None, 0.0, None, PrefillConfig(64, 64, 4, 2)) is None
    assert (prefill.ws_plan(*args, True, 128, 0.0, None, None) == TABLES["sm_90"].prefill_ws_window[128]) == SM90
    assert prefill.ws_plan(*args, True, None, 30.0, None, None) is None
    assert prefill.ws_plan(q, None, None, cache, cache, True, None, 0.0, None, None) is None  # no chunk rows to TMA
    assert (
        prefill.ws_plan(q.float(), k.float(), k.float(), cache.float(), cache.float(), True, None, 0.0, None, None)
        is None
    )
    odd = torch.zeros(8, 4, 80, dtype=torch.float16, device=DEV)
    assert prefill.ws_plan(odd, odd[:, :2], odd[:, :2], None, None, False, None, 0.0, None, None) is None
    strided = torch.zeros(8, 4, 160, dtype=torch.float16, device=DEV)[:, :, :128]  # heads not adjacent
    assert prefill.ws_plan(strided, k, k, cache, cache, True, None, 0.0, None, None) is None
    strided_v = torch.zeros(4, 16, 2, 256, dtype=torch.float16, device=DEV)[..., :128]  # v pages not contiguous
    assert prefill.ws_plan(q, k, k, cache, strided_v, True, None, 0.0, None, None) is None
    assert (prefill.ws_plan(*args, True, None, 0.0, None, None) is not None) == SM90


def test_non_causal_varlen_takes_the_tables_vision_config(monkeypatch):
    """The vision towers' attention (non-causal varlen) runs the Triton kernel with the arch table's vision_prefill
    config where it has one (sm_90 at head_dim 64 and 80); causal calls, other heads and archs keep the prefill's
    own choice."""
    launched = []
    monkeypatch.setattr(varlen, "launch", lambda *a: launched.append(("triton", a[-1])) or a[5])
    monkeypatch.setattr(varlen.prefill_ws, "launch", lambda *a: launched.append(("gluon", a[-1])) or a[5])
    monkeypatch.setattr(varlen, "ws_plan", lambda *a: None if a[-1] is not None else WsPrefillConfig(128, 3))
    sm90, sm80 = sim_device((9, 0)), sim_device((8, 0))
    for head_dim in (64, 80, 128):
        q = torch.zeros(8, 2, head_dim, dtype=torch.bfloat16)
        cu = torch.tensor([0, 8], dtype=torch.int32)
        for device, causal in ((sm90, False), (sm90, True), (sm80, False)):
            varlen.varlen_attention(q, q, q, cu, 8, 1.0, causal, device=device)
    vision = [TABLES["sm_90"].vision_prefill_config(d, torch.bfloat16) for d in (64, 80)]
    assert None not in vision and TABLES["sm_80"].vision_prefill_config(64, torch.bfloat16) is None
    gluon = ("gluon", WsPrefillConfig(128, 3))
    # head_dim 128 has no vision entry: the Gluon kernel as for text
    assert launched == [("triton", vision[0]), gluon, gluon, ("triton", vision[1]), gluon, gluon, gluon, gluon, gluon]


def _paged_case(page, group, head_dim, dtype, window=None, config=None):
    """(out, reference) of a ragged paged prefill through the Gluon kernel (with `config`: that config, launched
    directly; else the one the dispatch picks)."""
    torch.manual_seed(0)
    kv_heads = 2
    lens, new = [kv for kv, _ in PAIRS], [n for _, n in PAIRS]
    k_cache, v_cache, tables = make_paged(lens, page, kv_heads, head_dim, dtype)
    cu = torch.tensor([0] + new, device=DEV).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(sum(new), kv_heads * group, head_dim, device=DEV).to(dtype)
    k, v = chunk_rows(k_cache, tables, PAIRS), chunk_rows(v_cache, tables, PAIRS)
    args = (tables, cu, seq_lens, head_dim**-0.5, max(new), True, window, 0.0)
    assert prefill.ws_plan(q, k, v, k_cache, v_cache, True, window, 0.0, None, None) is not None
    out = poisoned_like(q)
    if config is None:
        prefill.paged_prefill_attention(q, k_cache, v_cache, *args, k, v, out=out)
    else:
        prefill_ws.launch(q, k, v, k_cache, v_cache, out, cu, seq_lens, tables, *args[3:7], config)
    return out, reference.paged_prefill_attention(q.double(), k_cache.double(), v_cache.double(), *args)


# (kv_len, new tokens) per sequence: fresh ones of every length class around the 64-row warpgroup and 128-key
# tile, chunks after prefixes that end mid-page, mid-tile, on a tile edge, and one-token rows after a prefix
PAIRS = [(1, 1), (63, 63), (129, 129), (700, 700), (2100, 1000), (300, 1), (128 + 77, 77), (256 + 128, 128)]


@needs_sm90
@pytest.mark.parametrize("page", [16, 32, 64])
@pytest.mark.parametrize("group,head_dim", [(1, 64), (4, 128), (8, 128), (2, 256)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_paged_prefill_matches_reference(page, group, head_dim, dtype):
    out, ref = _paged_case(page, group, head_dim, dtype)
    assert_close(out, ref, dtype)


@needs_sm90
@pytest.mark.parametrize("window", [1, 7, 100, 1000])  # 1: each row sees itself only; 1000: past most prefixes
@pytest.mark.parametrize("head_dim,page", [(64, 16), (128, 32), (256, 64)], ids=str)
def test_sliding_window_matches_reference(window, head_dim, page):
    out, ref = _paged_case(page, 4, head_dim, torch.bfloat16, window)
    assert_close(out, ref, torch.bfloat16)


@needs_sm90
@pytest.mark.parametrize("early_k_release", [False, True], ids=["release_after_pv", "early_k"])
@pytest.mark.parametrize("head_dim,config", [(128, (128, 3)), (128, (64, 4)), (256, (64, 2))], ids=str)
@pytest.mark.parametrize("window", [None, 100])
def test_both_k_release_points_match_reference(early_k_release, head_dim, config, window):
    """Either release of a stage's K (after its QK product, or with V after PV), whichever one the table holds
    for the head_dim: with cached prefixes (pages looked up once for K and V), windows and ragged rows."""
    ws = WsPrefillConfig(*config, early_k_release=early_k_release)
    out, ref = _paged_case(16, 4, head_dim, torch.bfloat16, window, ws)
    assert_close(out, ref, torch.bfloat16)


@needs_sm90
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_matches_reference(head_dim, causal):
    torch.manual_seed(0)
    lens = [1, 64, 65, 257, 1024, 4096]  # one image (or text sequence) each
    cu = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
    q = torch.randn(sum(lens), 8, head_dim, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(sum(lens), 8, head_dim, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(sum(lens), 8, head_dim, device=DEV, dtype=torch.bfloat16)
    assert prefill.ws_plan(q, k, v, None, None, causal, None, 0.0, None, None) is not None
    out = poisoned_like(q)
    varlen.varlen_attention(q, k, v, cu, max(lens), head_dim**-0.5, causal, out=out)
    ref = reference.varlen_attention(q.double(), k.double(), v.double(), cu, max(lens), head_dim**-0.5, causal)
    assert_close(out, ref, torch.bfloat16)


@needs_sm90
def test_strided_query_view_from_a_fused_projection():
    """q/k/v as views of one [tokens, (heads + 2 kv_heads) * head_dim] projection, as a fused QKV layer gives."""
    torch.manual_seed(0)
    tokens, heads, kv_heads, head_dim = 999, 8, 2, 128
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, device=DEV, dtype=torch.float16)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    cu = torch.tensor([0, 400, tokens], dtype=torch.int32, device=DEV)
    assert prefill.ws_plan(q, k, v, None, None, True, None, 0.0, None, None) is not None
    out = varlen.varlen_attention(q, k, v, cu, 599, head_dim**-0.5, True)
    ref = reference.varlen_attention(q.double(), k.double(), v.double(), cu, 599, head_dim**-0.5, True)
    assert_close(out, ref, torch.float16)

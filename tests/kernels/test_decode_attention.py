"""Paged decode (split-k) against the float64 torch reference.

CPU: tiny shapes under TRITON_INTERPRET=1. GPU: the same cases at real sizes.
"""

import pytest
import torch

from tests.kernels.attention_helpers import (
    ARCHS,
    DEV,
    DTYPES,
    ON_GPU,
    assert_close,
    decode_case,
    make_paged,
    sim_device,
)
from vlchat.kernels.attention import decode
from vlchat.kernels.attention.configs import TABLES

KV_HEADS = 8 if ON_GPU else 2


def _lens(page):
    # 1, page - 1, page, page + 1 and a ragged longer one (much longer on a GPU)
    return [1, page - 1, page, page + 1, 4133 if ON_GPU else 2 * page + 5]


def _run(group, head_dim, dtype, splits, page, window=None, softcap=0.0, device=None, config=None, lens=None):
    kv_heads = KV_HEADS if ON_GPU or group < 8 else 1
    lens = lens or _lens(page)
    return decode_case(lens, page, kv_heads * group, kv_heads, head_dim, dtype, window, splits, config, softcap, device)


CASES = [  # group (GQA ratio), head_dim, splits, page, dtype on CPU (a GPU runs every dtype)
    (1, 64, 1, 16, torch.float32),
    (4, 80, 3, 16, torch.float16),
    (8, 128, 9, 16, torch.float16),  # more splits than chunks: empty splits
    (4, 128, 7, 32, torch.float32),
    (1, 80, None, 16, torch.float32),  # the heuristic's choice
    (8, 64, 2, 64, torch.float16),
    (4, 96, 4, 16, torch.float16),
    (2, 256, 2, 16, torch.float32),
]
PARAMS = [(*case[:4], dtype) for case in CASES for dtype in DTYPES] if ON_GPU else CASES


@pytest.mark.parametrize("group,head_dim,splits,page,dtype", PARAMS, ids=str)
def test_decode_matches_reference(group, head_dim, splits, page, dtype):
    out, ref = _run(group, head_dim, dtype, splits, page)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize(
    "window,softcap,splits",
    [(5, 0.0, 3), (40, 0.0, 1), (None, 2.0, 4), (20, 30.0, 2)],
    ids=["window5", "window40", "softcap2", "window20-softcap30"],
)
def test_decode_window_and_softcap(window, softcap, splits):
    out, ref = _run(4, 64, torch.float16, splits, 16, window, softcap)
    assert_close(out, ref, torch.float16)


# On CPU the interpreter ignores warps and stages: one arch per distinct block_n (sm_86..sm_90 share sm_80's).
@pytest.mark.parametrize("arch", list(ARCHS) if ON_GPU else ["sm_70", "sm_80"], ids=str)
def test_decode_every_arch_config_runs_here(arch):
    """Each arch's decode config (block_n, warps, stages) computes the right thing on this device."""
    device = sim_device(ARCHS[arch])
    config = TABLES[arch].decode_config(128)
    out, ref = _run(4, 128, torch.float16, None, 16, device=device, config=config)
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_sm90_shallow_and_deep_configs_run_here(head_dim):
    """sm_90's Triton decode configs at each head_dim it keys (on a GPU through their real pipelines)."""
    device, table = sim_device(ARCHS["sm_90"]), TABLES["sm_90"]
    for config in (table.decode_config(head_dim), table.decode_deep_config(head_dim)):
        out, ref = _run(4, head_dim, torch.float16, 3, 16, device=device, config=config)
        assert_close(out, ref, torch.float16)


def test_a_one_wave_grid_runs_its_planned_config():
    """One sequence's KV heads on as many SMs: the plan's one-wave config computes the right thing (on a GPU the
    case test_split_heuristic plans, with its KV_HEADS; on an sm_90 GPU through the kernel planned)."""
    device = sim_device((9, 0), sm_count=KV_HEADS)  # one CTA per SM with one split
    out, ref = _run(4, 128, torch.float16, None, 16, device=device, lens=[1100])
    assert_close(out, ref, torch.float16)


def test_decode_empty_sequence_is_zero_not_nan():
    out, ref = _run(4, 64, torch.float32, 3, 16, lens=[0, 5, 0])
    assert_close(out, ref, torch.float32)
    assert torch.equal(out[0], torch.zeros_like(out[0]))


def test_decode_rejects_mismatched_inputs():
    k_cache, v_cache, tables = make_paged([4], 16, 2, 64, torch.float16)
    q = torch.randn(1, 4, 64, device=DEV, dtype=torch.float16)
    with pytest.raises(TypeError, match="int32"):
        decode.paged_decode_attention(q, k_cache, v_cache, tables.long(), torch.tensor([4], device=DEV), 0.1)
    with pytest.raises(ValueError, match="head_dim"):
        decode.paged_decode_attention(q[..., :32], k_cache, v_cache, tables, torch.tensor([4], dtype=torch.int32), 0.1)

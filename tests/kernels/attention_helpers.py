"""Shared builders for the kernel tests: the test device (DEV, also for the ops tests), paged caches,
tolerances, simulated devices."""

from __future__ import annotations

import os

import pytest
import torch

from vlchat.kernels.attention import decode, gluon_sm90, reference
from vlchat.kernels.device import DeviceInfo, TritonMode

ON_GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if ON_GPU else "cpu")
# the Gluon kernels (prefill_ws, decode_ws) run on an sm_90 GPU only: Gluon has no interpreter
SM90 = ON_GPU and torch.cuda.get_device_capability()[0] == 9 and gluon_sm90.gluon is not None
needs_sm90 = pytest.mark.skipif(not SM90, reason="the Gluon kernels need an sm_90 GPU")
# the Triton 3.x interpreter computes tl.dot on bf16 operands wrongly: bf16 kernels are checked on a GPU only
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else [])

# (max abs error, relative Frobenius error) against the float64 reference on inputs rounded to the dtype.
# fp16/bf16 lose precision where P is rounded for the P@V dot and in the output rounding; fp32 runs ieee dots.
TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (4e-3, 2e-3), torch.bfloat16: (3e-2, 1.6e-2)}

ARCHS = {"sm_70": (7, 0), "sm_75": (7, 5), "sm_80": (8, 0), "sm_86": (8, 6), "sm_89": (8, 9), "sm_90": (9, 0)}


def sim_device(capability: tuple[int, int], sm_count: int = 80, mode: TritonMode | None = None) -> DeviceInfo:
    """A DeviceInfo of another GPU arch; by default in the Triton mode that can run here."""
    if mode is None:
        interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        mode = TritonMode.INTERPRETED if (interp or not ON_GPU) else TritonMode.COMPILED
    return DeviceInfo("cuda", f"sim-{capability}", capability, sm_count, 96 << 10, 16 << 30, capability >= (8, 0), mode)


def plan_inputs(batch, ctx, q_heads=32, kv_heads=8, head_dim=128, dtype=torch.float16, page=16):
    """(q, k_cache, block_tables) on the meta device: what decode's planning reads (shapes and dtype, the block
    table's width as the context bound), with no memory behind them."""
    q = torch.empty(batch, q_heads, head_dim, dtype=dtype, device="meta")
    k_cache = torch.empty(1, page, kv_heads, head_dim, dtype=dtype, device="meta")
    return q, k_cache, torch.empty(batch, ctx // page, dtype=torch.int32, device="meta")


def make_paged(lens, page, kv_heads, head_dim, dtype, extra_blocks=3):
    """Random K/V caches and a block table with shuffled (non-contiguous) blocks and -1 past each end."""
    need = [(n + page - 1) // page for n in lens]
    num_blocks = sum(need) + extra_blocks
    k_cache = torch.randn(num_blocks, page, kv_heads, head_dim, device=DEV).to(dtype)
    v_cache = torch.randn(num_blocks, page, kv_heads, head_dim, device=DEV).to(dtype)
    perm = torch.randperm(num_blocks, device=DEV).to(torch.int32)
    tables = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32, device=DEV)
    at = 0
    for i, used in enumerate(need):
        tables[i, :used] = perm[at : at + used]
        at += used
    return k_cache, v_cache, tables


def chunk_rows(cache, tables, pairs):
    """The rows of each sequence's new tokens, read back from its pages (pairs: (kv_len, new tokens) per
    sequence): what the engine just wrote."""
    rows = [reference._gather_paged(cache, tables[i], kv)[kv - n :] for i, (kv, n) in enumerate(pairs)]
    return torch.cat(rows).contiguous()


def decode_case(lens, page, q_heads, kv_heads, head_dim, dtype, window, splits, config, softcap=0.0, device=None,
                q=None):  # fmt: skip
    """(out, float64 reference) of paged decode over random caches holding `lens` keys (shuffled pages); the
    output is poisoned first. `q` (default random) may be a strided view."""
    k_cache, v_cache, tables = make_paged(lens, page, kv_heads, head_dim, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    if q is None:
        q = torch.randn(len(lens), q_heads, head_dim, device=DEV).to(dtype)
    out = poisoned_like(q)
    scale = head_dim**-0.5
    decode.paged_decode_attention(
        q, k_cache, v_cache, tables, seq_lens, scale, window, splits, out, softcap, device=device, config=config
    )
    ref = reference.paged_decode_attention(
        q.double(), k_cache.double(), v_cache.double(), tables, seq_lens, scale, window, None, None, softcap
    )
    return out, ref


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(out).any(), "NaN in the output (unwritten or masked-out rows?)"
    atol, rel = TOL[dtype]
    diff = (out.double() - ref.double()).abs()
    err_rel = float(diff.norm() / ref.double().norm().clamp_min(1e-30))
    assert float(diff.max()) <= atol, f"max abs error {float(diff.max()):.3g} > {atol} ({dtype})"
    assert err_rel <= rel, f"relative error {err_rel:.3g} > {rel} ({dtype})"

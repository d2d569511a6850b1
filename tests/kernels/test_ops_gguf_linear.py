"""The GGUF product: the fused Triton kernel (interpreted on CPU, tiny shapes; 4096-wide on a GPU) against
float64 products of gguf-py's dequantized weight (rounded to the activation dtype, as the kernel rounds its
tile), over every kept type, decode row counts and an N that is no multiple of the tile; the prefill path
and the dispatch's reference; input checks."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import dequantize

from tests.kernels.attention_helpers import DEV, ON_GPU
from tests.kernels.test_ops_gguf_dequant import TYPES, random_blocks
from vlchat.kernels.ops.gguf_linear import GEMV_MAX_ROWS, _triton_impl, gguf_gemv_triton, gguf_linear
from vlchat.kernels.ops.quant_linear import split_counters

TOLS = {torch.float32: 1e-5, torch.float16: 2e-3}
N, K = (4096 + 40, 4096) if ON_GPU else (40, 512)


def _expected(x: torch.Tensor, blocks, qtype) -> torch.Tensor:
    w = torch.from_numpy(dequantize(blocks, qtype).copy()).to(x.dtype)
    return x.cpu().double() @ w.double().T


@pytest.mark.parametrize("splits", [1, 2], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("rows", [1, 5, GEMV_MAX_ROWS], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_fused_kernel_matches_the_dequantized_product(qtype, dtype, rows, splits):
    """One K slice, or two whose partials the last to finish adds (the split counters end at zero)."""
    blocks = random_blocks(N, K, qtype, seed=3)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).to(dtype)
    want = _expected(x, blocks, qtype)
    got = gguf_gemv_triton(x.to(DEV), torch.from_numpy(blocks).to(DEV), int(qtype), splits=splits if not ON_GPU
                           else None).cpu().double()  # fmt: skip
    assert float((got - want).abs().max() / want.abs().max()) < TOLS[dtype]
    assert not split_counters(torch.device(DEV), 8).any()


def test_prefill_rows_and_fp32_logits():
    """More rows than the GEMV takes dequantize, then multiply; out_dtype gives fp32 (the LM head's logits)."""
    blocks = random_blocks(N, K, Q.Q6_K, seed=4)
    x = torch.randn(GEMV_MAX_ROWS + 3, K, dtype=torch.float16)
    want = _expected(x, blocks, Q.Q6_K)
    got = _triton_impl(x.to(DEV), torch.from_numpy(blocks).to(DEV), int(Q.Q6_K), torch.float32)
    assert got.dtype == torch.float32
    assert float((got.cpu().double() - want).abs().max() / want.abs().max()) < TOLS[torch.float16]
    head = gguf_gemv_triton(x[:2].to(DEV), torch.from_numpy(blocks).to(DEV), int(Q.Q6_K), torch.float32)
    assert head.dtype == torch.float32 and float((head.cpu().double() - want[:2]).abs().max()) < 1e-2


def test_reference_and_checks():
    blocks = random_blocks(8, 256, Q.Q4_K, seed=5)
    x = torch.randn(3, 256)
    got = gguf_linear(x, torch.from_numpy(blocks), int(Q.Q4_K))
    w = torch.from_numpy(dequantize(blocks, Q.Q4_K).copy())
    if not ON_GPU:  # the CPU runs the reference: F.linear on gguf-py's floats
        assert torch.equal(got, torch.nn.functional.linear(x, w))
    with pytest.raises(ValueError, match="no GGUF product"):
        gguf_linear(x, torch.from_numpy(blocks), int(Q.Q4_0))
    with pytest.raises(ValueError, match=r"Q4_K blocks uint8 \[N, K / 256 \* 144\]"):
        gguf_linear(x[:, :128], torch.from_numpy(blocks), int(Q.Q4_K))


@pytest.mark.parametrize("splits", [1, 2], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0], ids=lambda q: q.name)
def test_a_k_that_ends_inside_a_step(qtype, splits):
    """The GEMV steps over eight 32-element blocks at a time: with 11 blocks a row (Gemma 3 270M's 640-wide rows
    are 20) the last step's blocks past the row read block 0 against zeroed x columns."""
    k = 352
    blocks = random_blocks(N, k, qtype, seed=6)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(6))
    want = _expected(x, blocks, qtype)
    got = gguf_gemv_triton(x.to(DEV), torch.from_numpy(blocks).to(DEV), int(qtype), splits=splits).cpu().double()
    assert float((got - want).abs().max() / want.abs().max()) < TOLS[torch.float32]

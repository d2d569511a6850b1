"""Gated activations: Triton kernels (interpreted on CPU) against the torch references and transformers' activations."""

import pytest
import torch

from tests.kernels.attention_helpers import DEV
from vlchat.kernels import dispatch
from vlchat.kernels.ops import gelu_tanh_and_mul, quick_gelu, silu_and_mul
from vlchat.kernels.ops.activation import (
    GELU_TANH,
    QUICK_GELU,
    SILU,
    gelu_tanh_and_mul_reference,
    quick_gelu_reference,
    silu_and_mul_reference,
)

TOLS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
OPS = {"silu": (SILU, silu_and_mul_reference), "gelu_tanh": (GELU_TANH, gelu_tanh_and_mul_reference)}


@pytest.mark.parametrize("dtype", list(TOLS), ids=str)
@pytest.mark.parametrize("inter", [8, 1030], ids=lambda n: f"inter{n}")  # 1030 spans two kernel blocks
@pytest.mark.parametrize("act", list(OPS))
def test_triton_matches_reference(dtype, inter, act):
    name, reference = OPS[act]
    x = (torch.randn(3, 2 * inter, device=DEV) * 4).to(dtype)  # wide range: tanh saturates, silu's exp overflows
    got = dispatch.get_impl(name, dtype, backend="triton")(x)
    want = reference(x.float())
    torch.testing.assert_close(got.float(), want, rtol=TOLS[dtype], atol=TOLS[dtype])


@pytest.mark.parametrize("act", list(OPS))
def test_triton_reads_rows_of_a_wider_buffer(act):
    name, reference = OPS[act]
    x = torch.randn(3, 2 * 40 + 24, device=DEV)[:, 8 : 8 + 2 * 40]  # row stride 104, not 2 * inter
    got = dispatch.get_impl(name, torch.float32, backend="triton")(x)
    torch.testing.assert_close(got, reference(x), rtol=1e-5, atol=1e-5)


def test_references_match_transformers_activations():
    from transformers.activations import ACT2FN

    x = torch.randn(4, 64)
    gate, up = x.chunk(2, dim=-1)
    assert torch.equal(silu_and_mul(x), ACT2FN["silu"](gate) * up)
    assert torch.equal(gelu_tanh_and_mul(x), ACT2FN["gelu_pytorch_tanh"](gate) * up)


@pytest.mark.parametrize("dtype", list(TOLS), ids=str)
@pytest.mark.parametrize("shape", [(3, 8), (2, 5, 411)], ids=str)  # 4110 elements span five kernel blocks
def test_quick_gelu_matches_reference(dtype, shape):
    x = (torch.randn(shape, device=DEV) * 30).to(dtype)  # wide range: the exp overflows for large -x
    got = dispatch.get_impl(QUICK_GELU, dtype, backend="triton")(x)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), quick_gelu_reference(x.float()), rtol=TOLS[dtype], atol=TOLS[dtype])


def test_quick_gelu_of_a_strided_view_leaves_its_input():
    base = torch.randn(6, 10, device=DEV)
    x = base[:, 2:9]  # not contiguous
    before = base.clone()
    got = dispatch.get_impl(QUICK_GELU, torch.float32, backend="triton")(x)
    torch.testing.assert_close(got, quick_gelu_reference(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(base, before)


def test_quick_gelu_reference_matches_transformers():
    from transformers.activations import ACT2FN

    x = torch.randn(4, 64)
    assert torch.equal(quick_gelu(x), ACT2FN["quick_gelu"](x))


def test_rejects_odd_width():
    with pytest.raises(ValueError, match="2 \\* inter"):
        silu_and_mul(torch.randn(2, 7))

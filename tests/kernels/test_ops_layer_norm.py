"""LayerNorm with a fused residual add: the Triton kernel (interpreted on CPU) against the torch reference, and the
vision blocks' add_norm against the unfused form."""

import pytest
import torch
from torch import nn

from tests.kernels.attention_helpers import DEV
from vlchat.kernels import dispatch
from vlchat.kernels.ops import layer_norm
from vlchat.kernels.ops.layer_norm import OP, layer_norm_reference
from vlchat.vision.layers import RMSNorm, add_norm

TOLS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", list(TOLS), ids=str)
@pytest.mark.parametrize("hidden", [64, 100], ids=lambda h: f"hidden{h}")  # 100: masked columns in the stats
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_triton_matches_reference(dtype, hidden, residual):
    x = (torch.randn(5, hidden, device=DEV) * 3 + 2).to(dtype)  # a mean far from 0: the centring matters
    w = (torch.rand(hidden, device=DEV) + 0.5).to(dtype)
    b = torch.randn(hidden, device=DEV).to(dtype)
    res = torch.randn(5, hidden, device=DEV).to(dtype) if residual else None
    got = dispatch.get_impl(OP, dtype, backend="triton")(x, w, b, 1e-5, res)
    want = layer_norm_reference(x, w, b, 1e-5, res)
    if residual:
        torch.testing.assert_close(got[1].float(), want[1].float(), rtol=TOLS[dtype] / 2, atol=0)
        got, want = got[0], want[0]
    torch.testing.assert_close(got.float(), want.float(), rtol=TOLS[dtype], atol=TOLS[dtype])


def test_triton_reads_strided_rows_and_leaves_its_inputs():
    x = torch.randn(4, 128, device=DEV)[:, :64]  # row stride 128
    res = torch.randn(4, 96, device=DEV)[:, 16:80]
    w, b = torch.rand(64, device=DEV), torch.randn(64, device=DEV)
    before = (x.clone(), res.clone())
    got, new_res = dispatch.get_impl(OP, torch.float32, backend="triton")(x, w, b, 1e-6, res)
    want, want_res = layer_norm_reference(x, w, b, 1e-6, res)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_res, want_res)
    assert torch.equal(x, before[0]) and torch.equal(res, before[1])


def test_reference_is_torchs_layer_norm():
    norm = nn.LayerNorm(32, eps=1e-6)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x, res = torch.randn(3, 32), torch.randn(3, 32)
    assert torch.equal(layer_norm(x, norm.weight, norm.bias, norm.eps), norm(x))
    out, new_res = layer_norm(x, norm.weight, norm.bias, norm.eps, res)
    assert torch.equal(new_res, x + res) and torch.equal(out, norm(x + res))


@pytest.mark.parametrize("make", [lambda: nn.LayerNorm(48, eps=1e-6), lambda: RMSNorm(48), lambda: nn.Identity()],
                         ids=["layer_norm", "rms_norm", "other"])  # fmt: skip
def test_add_norm_is_the_add_then_the_norm(make):
    norm = make()
    for p in norm.parameters():
        nn.init.normal_(p)
    x, res = torch.randn(5, 48, dtype=torch.bfloat16), torch.randn(5, 48, dtype=torch.bfloat16)
    norm = norm.to(torch.bfloat16)
    out, new_res = add_norm(norm, x, res)
    assert torch.equal(new_res, x + res)
    assert torch.equal(out, norm(x + res))
    out, stream = add_norm(norm, x)  # no residual: the norm alone, the stream unchanged
    assert stream is x and torch.equal(out, norm(x))


def test_rejects_mismatched_shapes():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight and bias"):
        layer_norm(x, torch.ones(8), torch.zeros(7), 1e-5)
    with pytest.raises(ValueError, match="residual shape"):
        layer_norm(x, torch.ones(8), torch.zeros(8), 1e-5, torch.randn(2, 9))


@pytest.mark.parametrize("dtype", list(TOLS), ids=str)
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_layer_scaled_residual_add_matches_reference(dtype, kind):
    """x_scale * x + residual (InternViT's layer scale), each op rounded as torch's, then the norm."""
    from vlchat.kernels.ops.rms_norm import OP as RMS_OP
    from vlchat.kernels.ops.rms_norm import rms_norm_reference

    x, res = (torch.randn(5, 100, device=DEV).to(dtype) for _ in range(2))
    scale = (torch.rand(100, device=DEV) * 0.2).to(dtype)
    w, b = (torch.rand(100, device=DEV) + 0.5).to(dtype), torch.randn(100, device=DEV).to(dtype)
    if kind == "layer_norm":
        got = dispatch.get_impl(OP, dtype, backend="triton")(x, w, b, 1e-5, res, scale)
        want = layer_norm_reference(x, w, b, 1e-5, res, scale)
    else:
        got = dispatch.get_impl(RMS_OP, dtype, backend="triton")(x, w, 1e-5, res, 0.0, scale)
        want = rms_norm_reference(x, w, 1e-5, res, 0.0, scale)
    torch.testing.assert_close(want[1], scale * x + res)
    # two roundings to the dtype (product, sum): the interpreter's bf16 rounding may differ by an ulp in each
    torch.testing.assert_close(got[1].float(), want[1].float(), rtol=TOLS[dtype], atol=TOLS[dtype])
    torch.testing.assert_close(got[0].float(), want[0].float(), rtol=TOLS[dtype], atol=TOLS[dtype])


def test_add_norm_with_a_layer_scale_is_the_scaled_add_then_the_norm():
    norm = nn.LayerNorm(48, eps=1e-6).to(torch.bfloat16)
    x, res = torch.randn(5, 48, dtype=torch.bfloat16), torch.randn(5, 48, dtype=torch.bfloat16)
    scale = torch.rand(48, dtype=torch.bfloat16)
    out, stream = add_norm(norm, x, res, scale)
    assert torch.equal(stream, res + scale * x) and torch.equal(out, norm(res + scale * x))
    with pytest.raises(ValueError, match="x_scale"):
        layer_norm(x, norm.weight, norm.bias, 1e-6, None, scale)  # a scale without a residual

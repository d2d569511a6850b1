"""RMSNorm: the Triton kernel (interpreted on CPU) against the torch reference, and the reference against transformers."""

import pytest
import torch

from tests.kernels.attention_helpers import DEV
from vlchat.kernels import dispatch, settings
from vlchat.kernels.ops import rms_norm
from vlchat.kernels.ops.rms_norm import OP, rms_norm_reference

# (dtype, tolerance): fp32 kernels agree to rounding; half precision within a few ulps of the output
TOLS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", list(TOLS), ids=str)
@pytest.mark.parametrize("hidden", [64, 100], ids=lambda h: f"hidden{h}")
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["llama", "gemma"])
def test_triton_matches_reference(dtype, hidden, residual, offset):
    x = torch.randn(5, hidden, device=DEV).to(dtype)
    w = (torch.rand(hidden, device=DEV) + 0.5).to(dtype)
    res = torch.randn(5, hidden, device=DEV).to(dtype) if residual else None
    triton_impl = dispatch.get_impl(OP, dtype, backend="triton")
    got = triton_impl(x, w, 1e-6, res, offset)
    want = rms_norm_reference(x, w, 1e-6, res, offset)
    if residual:
        # the same sum, rounded once to the dtype (the interpreter's bf16 rounding may differ by an ulp)
        torch.testing.assert_close(got[1].float(), want[1].float(), rtol=TOLS[dtype] / 2, atol=0)
        got, want = got[0], want[0]
    torch.testing.assert_close(got.float(), want.float(), rtol=TOLS[dtype], atol=TOLS[dtype])


def test_triton_handles_strided_rows():
    x = torch.randn(4, 128, device=DEV)[:, :64]  # row stride 128
    w = torch.rand(64, device=DEV)
    got = dispatch.get_impl(OP, torch.float32, backend="triton")(x, w, 1e-5)
    torch.testing.assert_close(got, rms_norm_reference(x, w, 1e-5), rtol=1e-5, atol=1e-5)


def test_triton_adds_eps_and_reads_a_residual_of_another_layout():
    """A zero row normalises to zeros (eps keeps it finite), a large eps shows in every row, and the residual is
    read with its own row stride (here a slice of a wider buffer, x contiguous)."""
    x = torch.randn(3, 64, device=DEV)
    x[1] = 0.0
    residual = torch.randn(3, 200, device=DEV)[:, 10:74]
    residual[1] = 0.0
    w = torch.rand(64, device=DEV)
    impl = dispatch.get_impl(OP, torch.float32, backend="triton")
    for eps in (1e-6, 0.5):
        out, new_res = impl(x, w, eps, residual)
        want, want_res = rms_norm_reference(x, w, eps, residual)
        torch.testing.assert_close(new_res, want_res)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(out[1], torch.zeros(64, device=DEV))


def test_public_function_passes_gemmas_weight_offset():
    x, w = torch.randn(2, 32, device=DEV), torch.randn(32, device=DEV)
    for backend in ("torch", "triton"):
        settings.set_backend(backend)
        try:
            got = rms_norm(x, w, 1e-6, weight_offset=1.0)
        finally:
            settings.set_backend("auto")
        torch.testing.assert_close(got, rms_norm_reference(x, w, 1e-6, weight_offset=1.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_reference_matches_transformers(dtype):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = torch.randn(3, 32).to(dtype)
    llama = LlamaRMSNorm(32, eps=1e-6).to(dtype)
    gemma = GemmaRMSNorm(32, eps=1e-6).to(dtype)
    with torch.no_grad():
        llama.weight.copy_(torch.randn(32))
        gemma.weight.copy_(torch.randn(32))
    assert torch.equal(rms_norm_reference(x, llama.weight, 1e-6), llama(x))
    assert torch.equal(rms_norm_reference(x, gemma.weight, 1e-6, weight_offset=1.0), gemma(x))


def test_public_function_dispatches_to_forced_backend():
    x, w = torch.randn(2, 16, device=DEV), torch.rand(16, device=DEV)
    with settings.forced("triton"):
        assert dispatch.choose(OP, torch.float32) == "triton"
        got = rms_norm(x, w, 1e-6, residual=x)
    torch.testing.assert_close(got[0], rms_norm_reference(x, w, 1e-6, x)[0], rtol=1e-5, atol=1e-5)


def test_rejects_mismatched_weight():
    with pytest.raises(ValueError, match="weight"):
        rms_norm(torch.randn(2, 16), torch.rand(8), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_triton_normalises_the_residual_sum_as_rounded_to_the_dtype(dtype):
    """The decoder's residual stream is stored in the model's dtype: the norm reads the sum after that rounding,
    so it equals the norm of the returned new residual, bit for bit."""
    x = (torch.randn(4, 256, device=DEV) * 3).to(dtype)
    residual = (torch.randn(4, 256, device=DEV) * 3).to(dtype)
    w = torch.rand(256, device=DEV).to(dtype)
    impl = dispatch.get_impl(OP, dtype, backend="triton")
    out, new_res = impl(x, w, 1e-6, residual)
    # the sum itself: torch's rounding (the interpreter emulates bf16 with another rounding: within one step)
    torch.testing.assert_close(new_res, x + residual, rtol=2**-7, atol=0)
    assert torch.equal(out, impl(new_res, w, 1e-6))

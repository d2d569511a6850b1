"""The FP8 (W8A8) op: per-token activation quantization, the fp32 reference against float64 sums of the same FP8
values, dispatch per arch (torch._scaled_mm from sm_89), input checks; on an sm_89+ GPU, _scaled_mm on 7B shapes
against the reference."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.attention_helpers import DEV, ON_GPU, sim_device
from vlchat.kernels import dispatch
from vlchat.kernels.device import TritonMode
from vlchat.kernels.ops.fp8_linear import (
    FP8,
    FP8_MAX,
    OP,
    Fp8GemvConfig,
    fp8_gemv,
    fp8_linear,
    fp8_reference,
    fp8_scaled_mm,
    quantize_rows,
    quantize_rows_triton,
    quantize_weight,
)
from vlchat.kernels.ops.quant_linear import split_counters

FP8_GPU = ON_GPU and torch.cuda.get_device_capability() >= (8, 9)


def test_rows_are_scaled_to_the_fp8_range():
    x = torch.tensor([[1.0, -3.0, 0.5], [0.0, 0.0, 0.0], [1e-3, 2e-3, -4e-3]])
    q, scale = quantize_rows(x)
    assert q.dtype == FP8 and scale.shape == (3, 1) and scale.dtype == torch.float32
    assert q.float().abs().amax(1).tolist() == [FP8_MAX, 0.0, FP8_MAX]
    assert scale[1, 0] == 1.0  # a zero row keeps a finite scale
    back = q.float() * scale
    assert torch.allclose(back, x, rtol=2**-3, atol=0)  # e4m3 keeps 3 mantissa bits


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("rows, k", [(1, 64), (5, 3000), (3, 4096), (2, 20000)], ids=str)
def test_one_launch_row_quantization_equals_the_torch_expression(dtype, rows, k):
    """The Triton row quantization (one launch: rows of up to ROW_BLOCK values in one pass, longer ones in K blocks;
    a zero row) is bitwise quantize_rows."""
    torch.manual_seed(k)
    x = (torch.randn(rows, k) * torch.logspace(-3, 2, rows)[:, None]).to(dtype).to(DEV)
    x[rows // 2] = 0
    q, scale = quantize_rows_triton(x)
    ref_q, ref_scale = quantize_rows(x)
    assert torch.equal(scale, ref_scale)
    if ON_GPU:
        assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    else:  # Triton's interpreter rounds ties away from zero and drops a rounded-up mantissa's carry into the
        # exponent, and flushes subnormals, when it converts to fp8: one e4m3 step or a halved value off the GPU
        got, want = q.float(), ref_q.float()
        assert torch.all(((got - want).abs() <= want.abs() / 8 + 2**-9) | (2 * got == want))  # 2**-9: a subnormal
        assert (got == want).float().mean() > 0.9


@pytest.mark.parametrize("rows, n, k", [(1, 16, 32), (7, 48, 64), (33, 32, 128)], ids=str)
def test_reference_sums_the_fp8_values_in_fp32(rows, n, k):
    torch.manual_seed(rows)
    x = torch.randn(rows, k)
    w_q, w_scale = quantize_weight(torch.randn(n, k))
    bias = torch.randn(n)
    x_q, x_scale = quantize_rows(x)
    want = (x_q.double() @ w_q.double().T) * x_scale.double() * w_scale.double()[None, :] + bias.double()
    got = fp8_reference(x, w_q, w_scale, bias)
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-6


def test_dispatch_takes_scaled_mm_from_sm_89():
    for cap, runs in (((7, 5), False), ((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True)):
        device = sim_device(cap, mode=TritonMode.COMPILED)
        assert (dispatch.choose(OP, torch.bfloat16 if cap >= (8, 0) else torch.float16, device) == "triton") == runs
    cpu = sim_device((8, 0))
    cpu = type(cpu)("cpu", "cpu", None, 2, 0, 0, True, TritonMode.INTERPRETED)
    assert dispatch.choose(OP, torch.float32, cpu) == "torch"


def test_bad_inputs_are_refused():
    w_q, w_scale = quantize_weight(torch.randn(16, 32))
    x = torch.randn(2, 32)
    with pytest.raises(ValueError, match=r"x \[tokens, K\]"):
        fp8_linear(x[:, :16], w_q, w_scale)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_linear(x, w_q.float(), w_scale)
    with pytest.raises(ValueError, match=r"weight_scale must be \[16\] float32"):
        fp8_linear(x, w_q, w_scale.half())
    with pytest.raises(ValueError, match=r"bias must be \[16\]"):
        fp8_linear(x, w_q, w_scale, torch.randn(3))


@pytest.mark.skipif(not FP8_GPU, reason="FP8 tensor cores need an sm_89+ GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows", [1, 16, 300, 4096], ids=lambda r: f"rows{r}")
def test_scaled_mm_matches_the_reference(dtype, rows):
    torch.manual_seed(rows)
    x = torch.randn(rows, 4096, device=DEV, dtype=dtype)
    w_q, w_scale = quantize_weight(torch.randn(11008, 4096, device=DEV) * 0.02)
    bias = torch.randn(11008, device=DEV, dtype=dtype)
    want = fp8_reference(x, w_q, w_scale, bias).double()
    got = fp8_scaled_mm(x, w_q, w_scale, bias)
    assert got.dtype == dtype and got.shape == (rows, 11008)
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-2  # bf16 output rounding


SMALL = Fp8GemvConfig(32, 32, 4, 1, 2)  # interpreter-sized tiles: several column tiles and K steps


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("rows, n, k, splits", [(1, 64, 128, 1), (5, 80, 200, 3), (16, 48, 96, 2), (40, 32, 64, 2)],
                         ids=str)  # fmt: skip
def test_gemv_sums_the_reference_fp8_products(dtype, rows, n, k, splits):
    """The split-k FP8 GEMV (ragged N and K tiles, one or several K slices, a bias) computes the reference's W8A8
    product: the same FP8 values summed in fp32, scaled, written in x's dtype; the split counters end at zero."""
    torch.manual_seed(rows * n)
    x = torch.randn(rows, k, dtype=dtype).to(DEV)
    w_q, w_scale = quantize_weight(torch.randn(n, k, device=DEV) * 0.05)
    bias = torch.randn(n, dtype=dtype, device=DEV)
    x_q, x_scale = quantize_rows_triton(x)
    want = (x_q.double() @ w_q.double().T) * x_scale.double() * w_scale.double()[None, :] + bias.double()
    got = fp8_gemv(x, w_q, w_scale, bias, config=None if ON_GPU else SMALL, splits=splits)
    assert got.dtype == dtype and got.shape == (rows, n)
    # the output's rounding; on the GPU the FP8 tensor cores' fp32 accumulation keeps fewer bits (Hopper's about 14)
    tol = {torch.float32: 1e-3 if ON_GPU else 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < tol
    assert not split_counters(x.device, 8).any()


def test_gemv_takes_up_to_128_rows_and_empty_products():
    w_q, w_scale = quantize_weight(torch.randn(32, 32, device=DEV))
    with pytest.raises(ValueError, match="at most 128 rows"):
        fp8_gemv(torch.randn(129, 32, device=DEV), w_q, w_scale, config=SMALL)
    assert fp8_gemv(torch.randn(0, 32, device=DEV), w_q, w_scale, config=SMALL).shape == (0, 32)


@pytest.mark.skipif(not FP8_GPU, reason="FP8 tensor cores need an sm_89+ GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 64, 128], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("n, k", [(11008, 4096), (4096, 11008), (1000, 4096)], ids=str)
def test_gpu_paths_match_the_reference_on_7b_shapes(dtype, rows, n, k):
    """What the engine runs on an FP8 GPU (fp8_linear: the GEMV up to GEMV_ROWS rows, _scaled_mm above) and the
    GEMV at every row count it takes, at 7B projections."""
    torch.manual_seed(rows)
    x = torch.randn(rows, k, device=DEV, dtype=dtype)
    w_q, w_scale = quantize_weight(torch.randn(n, k, device=DEV) * 0.02)
    bias = torch.randn(n, device=DEV, dtype=dtype)
    want = fp8_reference(x, w_q, w_scale, bias).double()
    gemv = fp8_gemv(x, w_q, w_scale, bias)
    assert ((gemv.double() - want).abs().max() / want.abs().max()).item() < 1e-2
    got = fp8_linear(x, w_q, w_scale, bias)
    assert got.dtype == dtype and got.shape == (rows, n)
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-2
    assert not split_counters(x.device, 8).any()

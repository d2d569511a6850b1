"""The fused fc1 GEMM + activation (kernels/ops/linear_act.py): the kernel (interpreted on CPU, real shapes on a
GPU) against the activation of an fp32 product, and where linear_act runs it."""

import pytest
import torch

from tests.kernels.attention_helpers import DEV, ON_GPU, sim_device
from vlchat.kernels.ops import linear_act as la

CPU_CONFIG = la.GemmConfig(16, 32, 32, stages=2, warps=4, group_m=2)
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else [])  # interpreter: bf16 dots are wrong
# on a GPU tl.dot takes fp32 operands as TF32, whose 10-bit mantissa is fp16's: fp16's tolerance there
TOLS = {torch.float32: 4e-3 if ON_GPU else 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def exact(x, weight, bias, act):
    """The activation of the fp32 product: what the kernel computes before its one rounding."""
    return la.torch_act(torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float()),
                        act)  # fmt: skip


def operands(m, k, n, dtype, bias=True):
    x = torch.randn(m, k, device=DEV).to(dtype)
    weight = (torch.randn(n, k, device=DEV) / k**0.5).to(dtype)
    b = (torch.randn(n, device=DEV) * 2).to(dtype) if bias else None  # wide range: the activations saturate
    return x, weight, b


@pytest.mark.parametrize("act", la.ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_fp32_product(act, dtype):
    # 40 rows and 48 columns end inside a tile (the descriptors clip the ragged edges); 96 = three K steps
    x, weight, bias = operands(40, 96, 48, dtype)
    got = la.linear_act_triton(x, weight, bias, act, CPU_CONFIG)
    assert got.dtype == dtype and got.shape == (40, 48)
    torch.testing.assert_close(got.float(), exact(x, weight, bias, act), rtol=TOLS[dtype], atol=TOLS[dtype])


def test_kernel_without_bias_and_with_strided_input():
    x, weight, _ = operands(33, 64, 32, torch.float16, bias=False)
    wide = torch.randn(33, 80, device=DEV).half()
    wide[:, 8:72] = x
    got = la.linear_act_triton(wide[:, 8:72], weight, None, "quick_gelu", CPU_CONFIG)
    torch.testing.assert_close(got.float(), exact(x, weight, None, "quick_gelu"), rtol=4e-3, atol=4e-3)


def test_kernel_no_rows():
    x, weight, bias = operands(0, 32, 32, torch.float16)
    assert la.linear_act_triton(x, weight, bias, "gelu", CPU_CONFIG).shape == (0, 32)


@pytest.mark.parametrize("act", la.ACTS)
def test_torch_activations_match_transformers(act):
    from transformers.activations import ACT2FN

    names = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu",
             "relu": "relu", "none": "linear"}  # fmt: skip
    y = torch.randn(4, 64) * 4
    torch.testing.assert_close(la.torch_act(y, act), ACT2FN[names[act]](y), rtol=1e-6, atol=1e-6)


def test_linear_act_unfused_is_the_reference_and_keeps_leading_dims():
    x, weight, bias = operands(6, 32, 16, torch.float32)
    x = x.reshape(2, 3, 32)
    for act in la.ACTS:
        torch.testing.assert_close(la.linear_act(x, weight, bias, act), la.reference(x, weight, bias, act))
    with pytest.raises(ValueError, match="not fused"):
        la.linear_act(x, weight, bias, "tanh")


def test_fused_config_choice(monkeypatch):
    cfg = la.GemmConfig(128, 128, 64, stages=3, warps=8)
    monkeypatch.setitem(la.GEMM_ACT, 9, cfg)
    x = torch.zeros(la.MIN_ROWS, 64, dtype=torch.bfloat16)
    w = torch.zeros(128, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(la, "device_for", lambda t: sim_device((9, 0)))
    assert la.fused_config(x, w) == cfg
    assert la.fused_config(x[:-1], w) is None  # too few rows to fill the GPU
    wide = torch.zeros(la.MIN_ROWS, la.MAX_K + 64, dtype=torch.bfloat16)
    assert la.fused_config(wide, torch.zeros(128, la.MAX_K + 64, dtype=torch.bfloat16)) is None  # K past the measured
    assert la.fused_config(x.float(), w.float()) is None  # 16-bit operands only
    assert la.fused_config(torch.zeros(la.MIN_ROWS, 60, dtype=torch.bfloat16), torch.zeros(128, 60)) is None
    assert la.fused_config(x, torch.zeros(100, 64, dtype=torch.bfloat16)) is None  # output rows not 16-byte
    monkeypatch.setattr(la, "device_for", lambda t: sim_device((8, 0)))
    assert la.fused_config(x, w) is None  # no measured config for sm_80
    monkeypatch.setattr(la, "device_for", lambda t: sim_device((9, 0)))
    monkeypatch.delitem(la.GEMM_ACT, 9)
    assert la.fused_config(x, w) is None


@pytest.mark.skipif(not ON_GPU, reason="real shapes on a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("config", [la.GEMM_ACT[9], la.GemmConfig(128, 256, 64, 3, 8),
                                    la.GemmConfig(64, 128, 64, 4, 4)], ids=str)  # fmt: skip
def test_kernel_real_shapes(dtype, config):
    # CLIP-L/336's fc1 over 4 images (577 tokens each: rows end inside a tile)
    x, weight, bias = operands(4 * 577, 1024, 4096, dtype)
    got = la.linear_act_triton(x, weight, bias, "quick_gelu", config)
    torch.testing.assert_close(got.float(), exact(x, weight, bias, "quick_gelu"), rtol=TOLS[dtype], atol=TOLS[dtype])


def test_the_kernel_compiles_to_tma_and_wgmma_for_sm90():
    from tests.kernels.sm90_ptx import compiled_run

    assert compiled_run("tests.kernels.test_ops_linear_act").split() == ["tma-wgmma-fits"] * 2


def compile_sm90() -> None:
    """PTX of the kernel for sm_90 (ptxas runs) at two tiles of benchmarks/linear_act.py's grid, bf16."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for c in (la.GemmConfig(128, 128, 64, 4, 8), la.GemmConfig(128, 256, 64, 3, 8)):
        sig = {"x_desc": f"tensordesc<bf16[{c.block_m}, {c.block_k}]>",
               "w_desc": f"tensordesc<bf16[{c.block_n}, {c.block_k}]>",
               "out_desc": f"tensordesc<bf16[{c.block_m}, {c.block_n}]>", "bias_ptr": "*bf16", "M": "i32",
               "N": "i32", "K": "i32"}  # fmt: skip
        constexprs = dict(ACT="quick_gelu", HAS_BIAS=True, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                          GROUP_M=c.group_m, STAGES=c.stages)  # fmt: skip
        sig.update(dict.fromkeys(constexprs, "constexpr"))
        src = ASTSource(fn=la._linear_act_kernel, signature=sig, constexprs=constexprs)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": c.warps})
        ptx = kernel.asm["ptx"]
        fits = kernel.metadata.shared <= 227 * 1024
        print(
            f"{'tma' if 'cp.async.bulk.tensor' in ptx else 'no-tma'}-{'wgmma' if 'wgmma.mma_async' in ptx else 'mma'}"
            f"-{'fits' if fits else 'too-big'}",
            flush=True,
        )


if __name__ == "__main__":
    compile_sm90()
